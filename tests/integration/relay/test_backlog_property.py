"""A Hypothesis stateful model of delivery accounting, run against the real database.

The machine drives the real relay functions on one tenant with one pull subscription (a budget
of two attempts, no backoff): tasks end (real result events), fan-out, leases of a random
size, acknowledgements (and repeated ones, and ones with a stale token), failures, lapses (SQL
moves leases into the past: database time decides) with recovery, and an operator's extra
budget for an exhausted delivery — in a random order.

After every step: each delivery's state and attempts agree with the model; the subscription's
backlog equals the model's count of PENDING + LEASED deliveries (a repeated acknowledgement
never decrements it twice); the invariant checker is green for the tenant.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import Any, TypeVar

import attrs
import pymysql
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.platform import credentials
from orbit_common.pulse.workers import QueueRef
from orbit_common.relay import deliveries, model
from tests.conftest import Tenant, make_tenant
from tests.support import relay
from tests.support.invariants import check
from tests.support.lease_fixtures import make_queue

T = TypeVar("T")
BUDGET = 2
# What the whole run exercised: every path of the accounting must be taken at least once.
SEEN: Counter[str] = Counter()
MUST_COVER = frozenset({"acknowledged", "repeated", "failed", "lapsed", "exhausted",
                        "budget_added"})


@attrs.define
class DeliveryModel:
    id: bytes
    state: str = "PENDING"
    attempts_used: int = 0
    max_attempts: int = BUDGET
    token: str | None = None  # the current lease's token
    acked_with: str | None = None


class Accounting(RuleBasedStateMachine):
    def __init__(self, url: DatabaseUrl) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.conn: pymysql.connections.Connection[Any] = connect_sync(url, autocommit=True)
        self.db: Database = self.run(open_database(url, minsize=1, maxsize=2))
        self.tenant: Tenant = self.run(make_tenant(self.db))
        self.who: credentials.Principal = self.run(relay.principal_of(self.db,
                                                                      self.tenant.api_key))
        self.queue: QueueRef = self.run(make_queue(self.db, self.tenant))
        self.run(relay.subscribe(self.db, self.tenant, max_attempts=BUDGET,
                                 backoff_initial_ms=0, backoff_max_ms=0))
        self.produced = 0
        self.fanned = 0
        self.deliveries: dict[bytes, DeliveryModel] = {}

    def run(self, step: Awaitable[T]) -> T:
        return self.loop.run_until_complete(step)

    def teardown(self) -> None:
        try:
            self.run(self.db.close())
            self.run(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
            self.conn.close()

    def in_state(self, state: str) -> list[DeliveryModel]:
        return sorted((d for d in self.deliveries.values() if d.state == state),
                      key=lambda d: d.id)

    def pick(self, data: st.DataObject, state: str) -> DeliveryModel | None:
        found = self.in_state(state)
        if not found:
            return None
        return data.draw(st.sampled_from(found), label=state.lower())

    def after_failure(self, d: DeliveryModel) -> None:
        d.token = None
        d.state = "EXHAUSTED" if d.attempts_used >= d.max_attempts else "PENDING"
        SEEN[d.state.lower() if d.state == "EXHAUSTED" else "retried"] += 1

    # --- rules ---------------------------------------------------------------------------

    @rule(count=st.integers(1, 3))
    def results(self, count: int) -> None:
        self.run(relay.cancelled_results(self.db, self.tenant, self.queue, count))
        self.produced += count

    @precondition(lambda self: self.produced > self.fanned)
    @rule()
    def fan_out(self) -> None:
        created = self.run(relay.fan_out_all(self.db, self.tenant, batch=2))
        assert created == self.produced - self.fanned
        self.fanned = self.produced
        for row in self.run(relay.delivery_rows(self.db, self.tenant)):
            self.deliveries.setdefault(row["id"], DeliveryModel(id=row["id"]))

    @precondition(lambda self: bool(self.in_state("PENDING")))
    @rule(limit=st.integers(1, 4))
    def lease(self, limit: int) -> None:
        leased = self.run(relay.lease(self.db, self.tenant, limit=limit))
        assert len(leased) == min(limit, len(self.in_state("PENDING")))
        for item in leased:
            d = self.deliveries[item.delivery_id]
            assert d.state == "PENDING"
            d.state, d.token = "LEASED", item.token
            d.attempts_used += 1
            assert item.attempt == d.attempts_used == item.payload["attempt"]

    @precondition(lambda self: bool(self.in_state("LEASED")))
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        d = self.pick(data, "LEASED")
        if d is None or d.token is None:
            return
        with pytest.raises(model.DeliveryLeaseLost):  # a stale or forged token first
            self.run(deliveries.acknowledge_delivery(
                self.db, self.who, namespace=self.tenant.namespace, name="sub",
                delivery_id=d.id, token="stale-token"))
        settled = self.run(deliveries.acknowledge_delivery(
            self.db, self.who, namespace=self.tenant.namespace, name="sub", delivery_id=d.id,
            token=d.token))
        assert not settled.repeated
        SEEN["acknowledged"] += 1
        d.state, d.acked_with, d.token = "ACKNOWLEDGED", d.token, None

    @precondition(lambda self: bool(self.in_state("ACKNOWLEDGED")))
    @rule(data=st.data())
    def acknowledge_again(self, data: st.DataObject) -> None:
        d = self.pick(data, "ACKNOWLEDGED")
        if d is None or d.acked_with is None:
            return
        settled = self.run(deliveries.acknowledge_delivery(
            self.db, self.who, namespace=self.tenant.namespace, name="sub", delivery_id=d.id,
            token=d.acked_with))
        assert settled.repeated
        SEEN["repeated"] += 1

    @precondition(lambda self: bool(self.in_state("LEASED")))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        d = self.pick(data, "LEASED")
        if d is None or d.token is None:
            return
        self.run(deliveries.fail_delivery(
            self.db, self.who, namespace=self.tenant.namespace, name="sub", delivery_id=d.id,
            token=d.token, error=deliveries.AttemptError(status_code=500, body="no")))
        SEEN["failed"] += 1
        self.after_failure(d)

    @precondition(lambda self: bool(self.in_state("LEASED")))
    @rule()
    def lapse(self) -> None:
        if not self.in_state("LEASED"):
            return
        self.run(relay.expire_delivery_leases(self.db, self.tenant))
        for _ in range(50):  # the scan is global: other tests' lapsed leases share it
            self.run(self.db.transaction("test.lapse",
                                         lambda cur: deliveries.recover_lapsed(cur, 1000)))
            rows = self.run(relay.delivery_rows(self.db, self.tenant))
            if all(r["state"] != "LEASED" for r in rows):
                break
        for d in self.in_state("LEASED"):
            SEEN["lapsed"] += 1
            self.after_failure(d)

    @precondition(lambda self: bool(self.in_state("EXHAUSTED")))
    @rule(data=st.data(), extra=st.integers(1, 2))
    def add_budget(self, data: st.DataObject, extra: int) -> None:
        d = self.pick(data, "EXHAUSTED")
        if d is None:
            return
        self.run(deliveries.add_budget(self.db, self.who, namespace=self.tenant.namespace,
                                       name="sub", delivery_id=d.id, attempts=extra,
                                       reason="property test"))
        d.state, d.max_attempts = "PENDING", d.max_attempts + extra
        SEEN["budget_added"] += 1

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        rows = {r["id"]: r for r in self.run(relay.delivery_rows(self.db, self.tenant))}
        assert set(rows) == set(self.deliveries)
        for delivery_id, d in self.deliveries.items():
            row = rows[delivery_id]
            assert (row["state"], row["attempts_used"], row["max_attempts"]) == (
                d.state, d.attempts_used, d.max_attempts), d
        backlog = self.run(relay.subscription_row(self.db, self.tenant))["backlog"]
        assert backlog == len(self.in_state("PENDING")) + len(self.in_state("LEASED"))
        assert check(self.conn, [self.tenant.namespace_id]) == []


def test_delivery_accounting_matches_its_model(db_url: DatabaseUrl) -> None:
    SEEN.clear()
    run_state_machine_as_test(
        lambda: Accounting(db_url),
        settings=settings(max_examples=12, stateful_step_count=30, deadline=None,
                          derandomize=True, database=None, print_blob=False,
                          phases=(Phase.explicit, Phase.generate),
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much]),
    )
    assert set(SEEN) >= MUST_COVER, sorted(MUST_COVER - set(SEEN))

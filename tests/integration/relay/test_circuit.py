"""Endpoint circuits (orbit_common/relay/circuit.py): opened by consecutive failures, probed by
one pump once the window passes, closed by a success; targets skip open circuits."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orbit_common.db.pool import Database
from orbit_common.relay import circuit
from orbit_common.relay.circuit import Circuit, CircuitState
from tests.conftest import Tenant
from tests.support import relay
from tests.support.lease_fixtures import make_queue

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
WINDOW = dt.timedelta(minutes=1)


@given(st.lists(st.booleans(), max_size=30), st.integers(1, 5))
def test_the_circuit_opens_after_threshold_failures_and_closes_on_success(
    outcomes: list[bool], threshold: int
) -> None:
    c = Circuit(state=CircuitState.CLOSED, open_until=None, failures=0)
    run = 0
    for ok in outcomes:
        was_closed = c.state is CircuitState.CLOSED
        c = circuit.after(c, ok, NOW, threshold=threshold, open_for=WINDOW)
        run = 0 if ok else run + 1
        assert c.failures == run
        if ok:
            assert c.state is CircuitState.CLOSED
            assert c.open_until is None
        elif was_closed and run < threshold:
            assert c.state is CircuitState.CLOSED
        else:
            assert c.state is CircuitState.OPEN
            assert c.open_until == NOW + WINDOW
            assert not circuit.sendable(c, NOW)
            assert circuit.sendable(c, NOW + WINDOW)


async def _record(db: Database, tenant: Tenant, sub: dict[str, Any], ok: bool) -> Circuit:
    return await db.transaction("test.circuit", lambda cur: circuit.record(
        cur, tenant.namespace_id, sub["id"], ok=ok, threshold=2, open_for=WINDOW))


async def _targets(db: Database, tenant: Tenant) -> set[bytes]:
    rows = await db.read("test.targets", lambda cur: circuit.webhook_targets(cur, 10_000))
    return {r["id"] for r in rows if r["namespace_id"] == tenant.namespace_id}


async def test_record_probe_and_targets(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant, "hook", kind="WEBHOOK",
                          endpoint_url="https://hooks.example.com/x")
    await relay.subscribe(db, tenant, "pull")
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    sub = await relay.subscription_row(db, tenant, "hook")
    assert await _targets(db, tenant) == {sub["id"]}  # the pull one is never a target
    assert (await _record(db, tenant, sub, False)).state is CircuitState.CLOSED
    opened = await _record(db, tenant, sub, False)
    assert opened.state is CircuitState.OPEN
    assert opened.failures == 2
    row = await relay.subscription_row(db, tenant, "hook")
    assert row["circuit_state"] == "OPEN"
    assert row["consecutive_failures"] == 2
    assert await _targets(db, tenant) == set()  # open: not sent to
    assert not await db.transaction("test.probe", lambda cur: circuit.begin_probe(
        cur, tenant.namespace_id, sub["id"], WINDOW))  # the window has not passed

    async def window_passed(cur: Any) -> None:
        await cur.execute("UPDATE orbit_subscriptions SET circuit_open_until ="
                          " UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE namespace_id = %s"
                          " AND id = %s", (tenant.namespace_id, sub["id"]))

    await db.transaction("test.window", window_passed)
    assert await _targets(db, tenant) == {sub["id"]}
    claims = [await db.transaction("test.probe", lambda cur: circuit.begin_probe(
        cur, tenant.namespace_id, sub["id"], WINDOW)) for _ in range(2)]
    assert claims == [True, False]  # one pump probes
    assert (await relay.subscription_row(db, tenant, "hook"))["circuit_state"] == "HALF_OPEN"
    assert await _targets(db, tenant) == set()
    assert (await _record(db, tenant, sub, False)).state is CircuitState.OPEN  # probe failed
    await db.transaction("test.window", window_passed)
    assert await db.transaction("test.probe", lambda cur: circuit.begin_probe(
        cur, tenant.namespace_id, sub["id"], WINDOW))
    closed = await _record(db, tenant, sub, True)
    assert closed == Circuit(state=CircuitState.CLOSED, open_until=None, failures=0)
    assert await _targets(db, tenant) == {sub["id"]}

"""Every kind of transaction at once, for a bounded time: the one lock order (docs/architecture.md)
means no deadlock reaches a caller.

Sixteen kinds run concurrently against two applications (one with claim-time and count limits,
one without), each with a capped queue and a start-limited one, tasks with and without
concurrency keys, short leases and deadlines: submit (single and batch), claim, start, renew,
finish, cancel, review, retry, queue pause, resume and limit changes, application limit changes,
schedule firing, lease recovery and deadline expiry. Refusals a caller is meant to see (4xx:
``queue_full``, ``stale_revision``, ``task_not_reviewable``, …) are fine; a 5xx, a retries-
exhausted answer or a raw driver error is not. The transaction runner re-runs deadlocks and lock
waits internally: those retries are counted and printed, not asserted (they are the runner's
job), and the invariant checker must be green afterwards.

A second test pins the exception the one order removed (a claim locking the application row
before the keys' rows), with the statement-waiting helper instead of load.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
import pymysql
from aiohttp.test_utils import TestClient

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.pulse import leases, resources, schedules
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant, make_tenant
from tests.integration.test_schedule_firing import make_schedule
from tests.support.invariants import check_db
from tests.support.lease_fixtures import (
    add_tasks,
    make_queue,
    open_session,
    set_application_limits,
    set_queue_limits,
)
from tests.support.waiting import statements_waiting, until

DURATION_S = 12.0
KINDS = ("submit", "submit_batch", "claim", "start", "renew", "finish", "cancel", "review",
         "retry", "pause", "resume", "queue_limits", "app_limits", "schedule_fire", "recovery",
         "deadlines", "fan_out", "lease_deliveries", "settle", "delivery_lapse", "add_budget",
         "subscription_state")


def retries() -> Counter[str]:
    """The transaction runner's internal re-runs so far, by transaction and reason."""
    found: Counter[str] = Counter()
    for metric in prometheus_client.REGISTRY.collect():
        if metric.name == "orbit_db_transaction_retries":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    found[f'{sample.labels["transaction"]}:{sample.labels["reason"]}'] += int(
                        sample.value)
    return found


class Load:
    """Counts what each kind did and collects what no caller should ever see."""

    def __init__(self, api: TestClient[Any, Any], db: Database) -> None:
        self.api = api
        self.db = db
        self.done: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.failures: list[str] = []
        self.stop_at = time.monotonic() + DURATION_S
        self.rng = random.Random(20261201)

    def running(self) -> bool:
        return time.monotonic() < self.stop_at and len(self.failures) < 20

    async def call(self, kind: str, op: Callable[[], Awaitable[Any]]) -> Any:
        try:
            out = await op()
        except errors.OrbitError as exc:
            if exc.status >= 500:
                self.failures.append(f"{kind}: {exc.code}: {exc.detail}")
            else:
                self.refused[f"{kind}:{exc.code}"] += 1
            return None
        except Exception as exc:  # a raw driver error reached the caller
            self.failures.append(f"{kind}: {type(exc).__name__}: {exc}")
            return None
        self.done[kind] += 1
        return out

    async def http(self, kind: str, method: str, path: str, tenant: Tenant,
                   body: Any = None) -> Any:
        response = await self.api.request(method, path, json=body, headers=tenant.auth)
        doc = await response.json()
        if response.status >= 500:
            self.failures.append(f"{kind}: HTTP {response.status}: {doc}")
            return None
        if response.status >= 400:
            self.refused[f"{kind}:{doc.get('code')}"] += 1
            return None
        self.done[kind] += 1
        return doc


def ns(tenant: Tenant) -> str:
    return f"/v1/namespaces/{tenant.namespace}"


def task_body(rng: random.Random, queue: str) -> dict[str, Any]:
    body: dict[str, Any] = {"queue": queue, "handler": "noop", "input": {"n": rng.random()},
                            "rerun_safe": rng.random() < 0.5}
    if rng.random() < 0.3:
        body["concurrency_key"] = f"acct-{rng.randrange(6)}"
    if rng.random() < 0.15:
        body["deadline_ms"] = rng.choice([300, 800, 2000])
    return body


async def submitter(load: Load, tenant: Tenant, queues: list[str], batch: bool) -> None:
    while load.running():
        if batch:
            await load.http("submit_batch", "POST", ns(tenant) + "/tasks/batch", tenant, {
                "tasks": [task_body(load.rng, load.rng.choice(queues)) for _ in range(8)]})
        else:
            await load.http("submit", "POST", ns(tenant) + "/tasks", tenant,
                            task_body(load.rng, load.rng.choice(queues)))
        await asyncio.sleep(0.01)


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


async def worker(load: Load, tenant: Tenant, session: Session, queue: QueueRef) -> None:
    db, rng = load.db, load.rng
    while load.running():
        grants = await load.call("claim", lambda: leases.run_claim(
            db, "test.claim", session, queue, 8)) or []
        if not grants:
            await asyncio.sleep(0.02)
            continue
        # Some offers are left to lapse (the recovery scan's work).
        to_start = [g for g in grants if rng.random() < 0.9]
        if not to_start:
            continue
        start_refs = [ref(g) for g in to_start]
        starts = await load.call("start", functools.partial(
            db.transaction, "test.start", functools.partial(
                leases.start, session=session, refs=start_refs))) or []
        running = [g for g, s in zip(to_start, starts, strict=True) if s.approved]
        if running:
            await load.call("renew", functools.partial(
                db.transaction, "test.renew", functools.partial(
                    leases.renew, session=session, refs=[ref(g) for g in running])))
        # Some holders go silent (their leases lapse); the rest report an outcome.
        reports = []
        for g in running:
            if rng.random() < 0.1:
                continue
            outcome = rng.choice(["succeeded", "succeeded", "failed", "unknown"])
            reports.append(FinishReport(
                ref=ref(g), report_id=secrets.token_bytes(8), outcome=outcome,
                result="{}" if outcome == "succeeded" else None,
                error=None if outcome == "succeeded" else {"type": "boom"},
                retryable=outcome == "failed" and rng.random() < 0.5))
        if reports:
            await load.call("finish", functools.partial(
                db.transaction, "test.finish", functools.partial(
                    leases.finish, session=session, reports=reports)))


async def pick(db: Database, tenant: Tenant, states: tuple[str, ...],
               rng: random.Random) -> str | None:
    async def body(cur: Any) -> list[Any]:
        await cur.execute(
            "SELECT LOWER(HEX(t.id)) AS id FROM pulse_tasks t WHERE t.namespace_id = %s AND"
            f" t.state IN ({', '.join(['%s'] * len(states))}) AND NOT EXISTS (SELECT 1 FROM"
            " pulse_tasks s WHERE s.namespace_id = t.namespace_id AND s.retry_of = t.id)"
            " ORDER BY t.updated_at DESC LIMIT 20", (tenant.namespace_id, *states))
        return [r["id"] for r in await cur.fetchall()]

    found = await db.read("test.pick", body)
    return rng.choice(found) if found else None


async def revision_of(db: Database, tenant: Tenant, task: str) -> int:
    """The task's current revision (a review names the revision it judged)."""
    async def body(cur: Any) -> int:
        await cur.execute("SELECT revision FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, bytes.fromhex(task)))
        row = await cur.fetchone()
        return int(row["revision"]) if row else 1

    return await db.read("test.revision", body)


async def intervener(load: Load, tenant: Tenant) -> None:
    db, rng = load.db, load.rng
    while load.running():
        choice = rng.random()
        if choice < 0.4:
            task = await pick(db, tenant, ("WAITING", "LEASED", "RUNNING"), rng)
            if task:
                await load.http("cancel", "POST", f"{ns(tenant)}/tasks/{task}/cancel", tenant,
                                {"reason": "load"})
        elif choice < 0.7:
            task = await pick(db, tenant, ("NEEDS_REVIEW",), rng)
            if task:
                await load.http("review", "POST", f"{ns(tenant)}/tasks/{task}/review", tenant, {
                    "decision": rng.choice(["succeeded", "failed"]), "reason": "load",
                    "evidence_ref": "ticket-1", "execution_ended": True,
                    "revision": await revision_of(db, tenant, task)})
        else:
            task = await pick(db, tenant, ("FAILED", "CANCELLED"), rng)
            if task:
                await load.http("retry", "POST", f"{ns(tenant)}/tasks/{task}/retry", tenant,
                                {"reason": "load", "rerun_confirmed": True})
        await asyncio.sleep(0.02)


async def operator(load: Load, tenant: Tenant, queues: list[str]) -> None:
    rng = load.rng
    while load.running():
        queue = rng.choice(queues)
        choice = rng.random()
        if choice < 0.25:
            await load.http("pause", "POST", f"{ns(tenant)}/queues/{queue}/pause", tenant,
                            {"reason": "load"})
        elif choice < 0.6:
            await load.http("resume", "POST", f"{ns(tenant)}/queues/{queue}/resume", tenant,
                            {"reason": "load"})
        elif choice < 0.8:
            current = await load.api.get(f"{ns(tenant)}/queues/{queue}", headers=tenant.auth)
            revision = (await current.json())["revision"]
            await load.http("queue_limits", "PATCH", f"{ns(tenant)}/queues/{queue}", tenant, {
                "revision": revision,
                "max_concurrent_attempts": rng.choice([None, 4, 8, 16]),
                "max_unfinished_tasks": rng.choice([None, 400, 2000])})
        else:
            path = f"/v1/applications/{tenant.application}/resources"
            current = await load.api.get(path, headers=tenant.auth)
            revision = (await current.json())["revision"]
            await load.http("app_limits", "PATCH", path, tenant, {
                "revision": revision, "reason": "load",
                "max_active_attempts": rng.choice([None, 10, 40]),
                "max_reserved_attempts": rng.choice([None, 8, 30]),
                "max_unfinished_tasks": rng.choice([None, 3000])})
        await asyncio.sleep(0.05)


async def relay_consumer(load: Load, tenant: Tenant) -> None:
    """Result subscriptions on the same tenant: fan-out (while the tasks' endings write the
    stream), leases, batched reports, extra budget and pause/resume (orbit_common/relay)."""
    from orbit_common.relay import deliveries, fanout, subscriptions
    from orbit_common.relay.model import SubscriptionState
    from tests.support import relay

    db = load.db
    await relay.subscribe(db, tenant, max_attempts=2, backoff_initial_ms=0, lease_ms=1000)
    sub = await relay.subscription_row(db, tenant)
    who = await relay.principal_of(db, tenant.api_key)
    while load.running():
        await load.call("fan_out", lambda: db.transaction(
            "test.fan_out", lambda cur: fanout.fan_out_subscription(
                cur, tenant.namespace_id, sub["id"], 50)))
        leased = await load.call("lease_deliveries", lambda: deliveries.lease_deliveries(
            db, who, namespace=tenant.namespace, name="sub", limit=8)) or []
        reports = [deliveries.Report(delivery_id=d.delivery_id, token=d.token,
                                     acknowledged=load.rng.random() < 0.6)
                   for d in leased if load.rng.random() < 0.8]  # the rest lapse
        if reports:
            await load.call("settle", lambda r=reports: db.transaction(
                "test.settle", lambda cur: deliveries.settle(
                    cur, tenant.namespace_id, sub["id"], r)))
        exhausted = await relay.rows(
            db, "SELECT id FROM orbit_deliveries WHERE namespace_id = %s AND state = 'EXHAUSTED'"
            " LIMIT 1", tenant.namespace_id)
        if exhausted:
            await load.call("add_budget", lambda e=exhausted[0]["id"]: deliveries.add_budget(
                db, who, namespace=tenant.namespace, name="sub", delivery_id=e, attempts=1,
                reason="lock order"))
        if load.rng.random() < 0.1:
            for target in (SubscriptionState.PAUSED, SubscriptionState.ACTIVE):
                await load.call("subscription_state", lambda t=target: subscriptions.set_state(
                    db, who, namespace=tenant.namespace, name="sub", target=t))
        await asyncio.sleep(0.02)


async def background(load: Load) -> None:
    from orbit_common.relay import deliveries

    db = load.db
    while load.running():
        await load.call("schedule_fire", lambda: db.transaction(
            "test.fire", lambda cur: schedules.fire_due(cur, 16)))
        await load.call("recovery", lambda: db.transaction(
            "test.recover", lambda cur: leases.recover_expired(cur, 64)))
        await load.call("deadlines", lambda: db.transaction(
            "test.deadlines", lambda cur: leases.expire_waiting(cur, 64)))
        await load.call("delivery_lapse", lambda: db.transaction(
            "test.delivery_lapse", lambda cur: deliveries.recover_lapsed(cur, 64)))
        await asyncio.sleep(0.05)


async def test_every_transaction_kind_at_once_surfaces_no_deadlock(
    db: Database, api: TestClient[Any, Any],
) -> None:
    limited, plain = await make_tenant(db), await make_tenant(db)
    await set_application_limits(db, limited, max_active_attempts=40, max_reserved_attempts=30,
                                 max_unfinished_tasks=3000, max_starts_per_second=300)
    load = Load(api, db)
    jobs = []
    for tenant in (limited, plain):
        capped = await make_queue(db, tenant, name="capped", max_concurrent=8,
                                  offer_lease_ms=600, execution_lease_ms=800, max_attempts=3)
        rated = await make_queue(db, tenant, name="rated", offer_lease_ms=600,
                                 execution_lease_ms=800, max_attempts=3)
        await set_queue_limits(db, tenant, rated.id, max_starts_per_second=150)
        await make_schedule(db, tenant, rated.id, rule={"interval_ms": 1000},
                            since=dt.timedelta(seconds=20), misfire="EACH", grace_ms=3_600_000)
        names = ["capped", "rated"]
        for queue in (capped, rated):
            session = await open_session(db, tenant, [queue], handlers=("noop",))
            jobs += [worker(load, tenant, session, queue) for _ in range(2)]
        jobs += [submitter(load, tenant, names, batch=False),
                 submitter(load, tenant, names, batch=True),
                 intervener(load, tenant), operator(load, tenant, names),
                 relay_consumer(load, tenant)]
    jobs.append(background(load))
    before = retries()
    await asyncio.gather(*jobs)
    retried = retries() - before
    print(f"\nlock-order load: {dict(load.done)}\nrefusals: {dict(load.refused)}\n"
          f"runner retries by transaction and reason: {dict(retried)}")

    assert load.failures == []
    # Every kind ran (a kind that never ran would prove nothing).
    assert {k for k in KINDS if load.done[k] == 0} == set(), dict(load.done)
    violations = await check_db(db, [limited.namespace_id, plain.namespace_id])
    assert violations == []


async def test_a_claim_counting_application_room_waits_for_a_key_release_without_deadlock(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """The former ``application_room`` exception: a claim of an application with claim-time
    limits locked the application row before the keys' rows, so a transaction releasing a key
    (keys, then the application row -- the one order) deadlocked with it. In the one order the
    claim waits on the key row without holding the application row."""
    await set_application_limits(db, tenant, max_active_attempts=10)
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 1, concurrency_key=b"shared")
    session = await open_session(db, tenant, [queue])
    key = resources.key_digest(b"shared")
    holding, go = asyncio.Event(), asyncio.Event()

    async def release_like(cur: Any) -> None:
        await cur.execute("SELECT id FROM pulse_concurrency_limits WHERE namespace_id = %s"
                          " AND key_digest = %s FOR UPDATE", (tenant.namespace_id, key))
        holding.set()
        await go.wait()
        await cur.execute("UPDATE orbit_application_resources SET updated_at = updated_at"
                          " WHERE application_id = %s", (tenant.application_id,))

    before = retries()
    releasing = asyncio.create_task(db.transaction("test.release", release_like))
    await until(holding.is_set, message="the release to hold the key row")
    claiming = asyncio.create_task(leases.run_claim(db, "test.claim", session, queue, 1))
    await until(lambda: statements_waiting(
        sync_conn, "%FROM pulse_concurrency_limits%FOR UPDATE%"),
        message="the claim to wait for the key row")
    go.set()
    await releasing
    assert len(await claiming) == 1
    deadlocks = {k: v for k, v in (retries() - before).items()
                 if k.startswith(("test.release:", "test.claim:"))}
    assert deadlocks == {}

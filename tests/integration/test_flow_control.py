"""Flow control at its edges (orbit_common/pulse/resources.py): limits at N - 1, N and N + 1.

* ``max_unfinished_tasks`` of a queue and of an application, at submit, over HTTP: a refusal is
  ``429`` with a problem document, ``Retry-After`` and nothing written; a batch is refused
  whole; lowering a limit below the usage keeps tasks and grants; room returns as tasks end.
* ``max_concurrent_attempts`` (queue), ``max_active_attempts`` and ``max_reserved_attempts``
  (application) at claim, through the lease kernel.
* The one-second start windows (queue and application) at start approval, waited out on the
  database clock; the counters survive a queue configuration change.
* Interventions and deadlines keep the unfinished counters.

Limits without an API yet are set with direct UPDATEs of the configuration columns. Every test
ends with the invariant checker green for its tenant(s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import attrs
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common import errors
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.platform import commands, credentials
from orbit_common.pulse import interventions, leases
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant, StartOutcome
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant
from tests.integration.api.conftest import assert_problem
from tests.support import held, pulse
from tests.support.invariants import check
from tests.support.lease_fixtures import (
    add_tasks,
    application_counters,
    make_queue,
    open_session,
    queue_counters,
    set_application_limits,
    set_queue_limits,
    task_row,
    wait_db_time_past,
)
from tests.support.waiting import statements_waiting, until

# --- helpers ---------------------------------------------------------------------------------


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


async def claim(db: Database, session: Session, queue: QueueRef, n: int = 10) -> list[Grant]:
    return await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))


async def start(db: Database, tenant: Tenant, grants: Sequence[Grant]) -> list[StartOutcome]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.start",
                                lambda cur: held.start(cur, tenant.namespace_id, refs))


async def finish(db: Database, tenant: Tenant, grant: Grant, outcome: str = "succeeded"
                 ) -> str | None:
    extra: dict[str, Any] = ({"result": "{}"} if outcome == "succeeded"
                             else {"error": {"type": outcome}})
    report = FinishReport(ref=ref(grant), report_id=b"r1", outcome=outcome, **extra)
    (done,) = await db.transaction("test.finish", lambda cur: held.finish(
        cur, tenant.namespace_id, [report]))
    assert done.accepted, done
    return done.task_state


async def run_to_end(db: Database, tenant: Tenant, grants: Sequence[Grant]) -> None:
    assert all(o.approved for o in await start(db, tenant, grants))
    for grant in grants:
        assert await finish(db, tenant, grant) == "SUCCEEDED"


async def who(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


async def sibling(db: Database, tenant: Tenant) -> Tenant:
    """A second namespace of ``tenant``'s application (the same all-access key works there)."""
    created = await commands.create_namespace(
        db, await who(db, tenant), name=f"{tenant.namespace}-b", description="",
        idempotency_key=None)
    assert created.resource_id is not None
    return attrs.evolve(tenant, namespace=created.body["name"],
                        namespace_id=created.resource_id)


async def api_queue(db: Database, tenant: Tenant, name: str = "work") -> QueueRef:
    queue_id = await pulse.create_queue(db, tenant.namespace_id, name)

    async def body(cur: Any) -> bytes:
        await cur.execute("SELECT gate_id FROM pulse_queues WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, queue_id))
        return bytes((await cur.fetchone())["gate_id"])

    return QueueRef(id=queue_id, name=name, gate_id=await db.read("test.gate", body))


async def submit(api: TestClient[Any, Any], tenant: Tenant, count: int = 1, *,
                 queue: str = "work", key: str | None = None) -> Any:
    """POST one task (count 1, optionally with an Idempotency-Key) or a batch of ``count``."""
    headers = {**tenant.auth, **({"Idempotency-Key": key} if key else {})}
    item = {"queue": queue, "handler": "noop"}
    if count == 1:
        return await api.post(f"/v1/namespaces/{tenant.namespace}/tasks", json=item,
                              headers=headers)
    return await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/batch",
                          json={"tasks": [item] * count}, headers=headers)


async def accepted(api: TestClient[Any, Any], tenant: Tenant, count: int = 1,
                   **kw: Any) -> list[str]:
    response = await submit(api, tenant, count, **kw)
    assert response.status == 201, await response.text()
    body = await response.json()
    return [body["id"]] if count == 1 else [t["id"] for t in body["tasks"]]


async def refused(api: TestClient[Any, Any], tenant: Tenant, code: str, count: int = 1,
                  **kw: Any) -> dict[str, Any]:
    response = await submit(api, tenant, count, **kw)
    body = await assert_problem(response, 429, code)
    assert response.headers["Retry-After"] == "1"
    assert body["retry_after_s"] == 1
    return body


def snapshot(conn: pymysql.connections.Connection[Any], *tenants: Tenant) -> dict[str, Any]:
    """What a submission writes, for these namespaces: rows and every counter."""
    found: dict[str, Any] = {}
    with conn.cursor() as cur:
        for tenant in tenants:
            ns = tenant.namespace_id
            for table in ("pulse_tasks", "orbit_events", "orbit_idempotency_keys"):
                # fixed whitelist of table names
                cur.execute(f"SELECT COUNT(*) FROM {table} WHERE namespace_id = %s", (ns,))
                found[f"{tenant.namespace}.{table}"] = cur.fetchone()[0]
            cur.execute("SELECT name, unfinished_tasks, active_attempts, starts_in_window"
                        " FROM pulse_queues WHERE namespace_id = %s ORDER BY name", (ns,))
            found[f"{tenant.namespace}.queues"] = cur.fetchall()
            cur.execute("SELECT unfinished_tasks, active_attempts, reserved_attempts"
                        " FROM orbit_application_resources WHERE application_id = %s",
                        (tenant.application_id,))
            found["application"] = cur.fetchone()
    return found


def green(conn: pymysql.connections.Connection[Any], *tenants: Tenant) -> None:
    assert check(conn, [t.namespace_id for t in tenants]) == []


async def unfinished(db: Database, tenant: Tenant, queue: QueueRef) -> tuple[int, int]:
    """(queue's unfinished_tasks, application's unfinished_tasks)."""
    q = await queue_counters(db, tenant, queue.id)
    a = await application_counters(db, tenant)
    return q["unfinished_tasks"], a["unfinished_tasks"]


# --- max_unfinished_tasks at submit ------------------------------------------------------------


async def test_queue_max_unfinished_tasks_at_its_edges(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await api_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=3)
    await accepted(api, tenant, 2)  # N - 1
    await accepted(api, tenant)  # reaches N
    before = snapshot(sync_conn, tenant)
    body = await refused(api, tenant, "queue_full", key="one-too-many")  # N + 1
    assert (body["queue"], body["limit"], body["unfinished"]) == ("work", 3, 3)
    assert snapshot(sync_conn, tenant) == before  # no task, event, idempotency record, counter
    # The refused key was not recorded: once there is room it is a fresh request.
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=4)
    response = await submit(api, tenant, key="one-too-many")
    assert response.status == 201
    await refused(api, tenant, "queue_full")
    assert await unfinished(db, tenant, queue) == (4, 4)
    green(sync_conn, tenant)


async def test_a_batch_that_would_cross_the_limit_is_refused_whole(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await api_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=5)
    await accepted(api, tenant, 3)
    before = snapshot(sync_conn, tenant)
    body = await refused(api, tenant, "queue_full", 3)
    assert (body["limit"], body["unfinished"]) == (5, 3)
    assert snapshot(sync_conn, tenant) == before
    await accepted(api, tenant, 2)  # exactly to the limit
    await refused(api, tenant, "queue_full", 2)
    assert await unfinished(db, tenant, queue) == (5, 5)
    green(sync_conn, tenant)


async def test_an_idempotent_replay_is_answered_at_a_full_queue(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """A replay writes nothing, so a full queue does not refuse it."""
    queue = await api_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=1)
    first = await submit(api, tenant, key="k1")
    assert first.status == 201
    again = await submit(api, tenant, key="k1")
    assert again.status == 201
    assert (await again.json())["id"] == (await first.json())["id"]
    await refused(api, tenant, "queue_full", key="k2")
    assert await unfinished(db, tenant, queue) == (1, 1)
    green(sync_conn, tenant)


async def test_concurrent_submits_never_pass_the_limit(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await api_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=5)
    responses = await asyncio.gather(*(submit(api, tenant) for _ in range(12)))
    statuses = sorted(r.status for r in responses)
    assert statuses == [201] * 5 + [429] * 7
    assert await unfinished(db, tenant, queue) == (5, 5)
    green(sync_conn, tenant)


async def test_lowering_the_limit_keeps_tasks_and_grants_and_room_returns(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await api_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=5)
    await accepted(api, tenant, 4)
    session = await open_session(db, tenant, [queue])
    first = await claim(db, session, queue, 2)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=2)  # below the usage of 4
    # Nothing is deleted or revoked: the offers start, and claims go on.
    assert all(o.approved for o in await start(db, tenant, first))
    second = await claim(db, session, queue, 10)
    assert len(second) == 2
    assert await unfinished(db, tenant, queue) == (4, 4)
    await refused(api, tenant, "queue_full")
    for grant in first:  # 4 -> 2: at the limit, still full
        assert await finish(db, tenant, grant) == "SUCCEEDED"
    body = await refused(api, tenant, "queue_full")
    assert (body["limit"], body["unfinished"]) == (2, 2)
    await run_to_end(db, tenant, second[:1])  # 2 -> 1: room for one
    await accepted(api, tenant)
    await refused(api, tenant, "queue_full")
    green(sync_conn, tenant)


async def test_application_max_unfinished_tasks_spans_its_namespaces(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    other = await sibling(db, tenant)
    mine, theirs = await api_queue(db, tenant), await api_queue(db, other)
    await set_application_limits(db, tenant, max_unfinished_tasks=3)
    first = await accepted(api, tenant, 2)
    await accepted(api, other)  # N - 1 -> N, in the other namespace
    before = snapshot(sync_conn, tenant, other)
    body = await refused(api, other, "application_quota_exceeded", key="late")
    assert (body["limit"], body["unfinished"]) == (3, 3)
    await refused(api, tenant, "application_quota_exceeded", 2)
    assert snapshot(sync_conn, tenant, other) == before
    # The queue's own limit is checked first when both are full.
    await set_queue_limits(db, other, theirs.id, max_unfinished_tasks=1)
    await refused(api, other, "queue_full")
    await set_queue_limits(db, other, theirs.id, max_unfinished_tasks=None)
    # A cancel in one namespace makes room in the other.
    await interventions.cancel_task(db, await who(db, tenant), namespace=tenant.namespace,
                                    task_id=bytes.fromhex(first[0]), reason="room")
    assert await unfinished(db, tenant, mine) == (1, 2)
    response = await submit(api, other, key="late")
    assert response.status == 201
    await refused(api, other, "application_quota_exceeded")
    assert (await application_counters(db, tenant))["unfinished_tasks"] == 3
    green(sync_conn, tenant, other)


async def test_a_manual_retry_counts_against_the_limits(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await make_queue(db, tenant)
    (failed,) = await add_tasks(db, tenant, queue, max_attempts=1)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue, 1)
    assert all(o.approved for o in await start(db, tenant, [grant]))
    assert await finish(db, tenant, grant, "failed") == "FAILED"
    await add_tasks(db, tenant, queue)
    assert await unfinished(db, tenant, queue) == (1, 1)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=1)
    principal = await who(db, tenant)
    with pytest.raises(errors.QueueFull):
        await interventions.retry_task(db, principal, namespace=tenant.namespace,
                                       task_id=failed, reason="again", rerun_confirmed=True)
    assert (await task_row(db, tenant, failed))["state"] == "FAILED"
    assert await unfinished(db, tenant, queue) == (1, 1)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=2)
    await interventions.retry_task(db, principal, namespace=tenant.namespace, task_id=failed,
                                   reason="again", rerun_confirmed=True)
    assert await unfinished(db, tenant, queue) == (2, 2)
    green(sync_conn, tenant)


# --- limits at claim ---------------------------------------------------------------------------


async def test_queue_max_concurrent_attempts_at_claim(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await make_queue(db, tenant, max_concurrent=3)
    await add_tasks(db, tenant, queue, 8)
    session = await open_session(db, tenant, [queue])
    held = await claim(db, session, queue, 2)  # N - 1 active
    held += await claim(db, session, queue)
    assert len(held) == 3  # the claim of 10 got the one left
    assert await claim(db, session, queue) == []  # N: none
    await set_queue_limits(db, tenant, queue.id, max_concurrent_attempts=4)
    held += await claim(db, session, queue)
    assert len(held) == 4  # N + 1: one more
    await set_queue_limits(db, tenant, queue.id, max_concurrent_attempts=2)  # below the usage
    assert await claim(db, session, queue) == []
    assert all(o.approved for o in await start(db, tenant, held))  # grants stay valid
    for grant in held[:2]:
        assert await finish(db, tenant, grant) == "SUCCEEDED"
    assert await claim(db, session, queue) == []  # 2 active, limit 2
    assert await finish(db, tenant, held[2]) == "SUCCEEDED"
    assert len(await claim(db, session, queue)) == 1
    assert (await queue_counters(db, tenant, queue.id))["active_attempts"] == 2
    green(sync_conn, tenant)


async def test_application_max_active_attempts_across_queues_and_namespaces(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    other = await sibling(db, tenant)
    q1, q2 = await make_queue(db, tenant), await make_queue(db, other)
    await add_tasks(db, tenant, q1, 5)
    await add_tasks(db, other, q2, 5)
    s1, s2 = await open_session(db, tenant, [q1]), await open_session(db, other, [q2])
    await set_application_limits(db, tenant, max_active_attempts=3)
    first = await claim(db, s1, q1, 2)  # N - 1
    (third,) = await claim(db, s2, q2)  # to N, in the other namespace
    assert await claim(db, s1, q1) == []
    assert await claim(db, s2, q2) == []
    # Started attempts still count as active.
    assert all(o.approved for o in await start(db, tenant, first))
    assert all(o.approved for o in await start(db, other, [third]))
    assert await claim(db, s2, q2) == []
    await set_application_limits(db, tenant, max_active_attempts=4)  # N + 1
    assert len(await claim(db, s2, q2)) == 1
    assert await finish(db, tenant, first[0]) == "SUCCEEDED"
    assert len(await claim(db, s2, q2)) == 1
    counters = await application_counters(db, tenant)
    assert (counters["active_attempts"], counters["reserved_attempts"]) == (4, 2)
    green(sync_conn, tenant, other)


async def test_application_max_reserved_attempts_counts_offers_not_yet_started(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 6)
    session = await open_session(db, tenant, [queue])
    await set_application_limits(db, tenant, max_reserved_attempts=2)
    offers = await claim(db, session, queue, 1)
    offers += await claim(db, session, queue)  # N - 1 -> N
    assert len(offers) == 2
    assert await claim(db, session, queue) == []
    assert all(o.approved for o in await start(db, tenant, offers[:1]))  # a start frees one
    more = await claim(db, session, queue)
    assert len(more) == 1
    assert await claim(db, session, queue) == []
    await set_application_limits(db, tenant, max_reserved_attempts=3)  # N + 1
    assert len(await claim(db, session, queue)) == 1
    # Ending an offer frees its reservation too (a cancel withdraws it).
    await interventions.cancel_task(db, await who(db, tenant), namespace=tenant.namespace,
                                    task_id=more[0].task_id, reason="free")
    assert len(await claim(db, session, queue)) == 1
    counters = await application_counters(db, tenant)
    assert (counters["active_attempts"], counters["reserved_attempts"]) == (4, 3)
    green(sync_conn, tenant)


# --- start windows -----------------------------------------------------------------------------


async def test_queue_start_window(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await make_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_starts_per_second=3)
    await add_tasks(db, tenant, queue, 6)
    session = await open_session(db, tenant, [queue])
    offers = await claim(db, session, queue)
    outcomes = await start(db, tenant, offers[:5])  # one transaction: one instant
    assert [o.approved for o in outcomes] == [True] * 3 + [False] * 2
    for late in outcomes[3:]:
        assert late.reason == "start_rate_limited"
        assert late.retry_after_ms is not None
        assert 0 < late.retry_after_ms <= 1001
    for grant in offers[3:5]:  # the offers stay valid: LEASED / OFFERED
        assert (await task_row(db, tenant, grant.task_id))["state"] == "LEASED"
    counters = await queue_counters(db, tenant, queue.id)
    assert counters["starts_in_window"] == 3
    window = counters["start_window_until"]
    # Asked again at once: refused while the window is current (a slow machine may already be
    # past it; then the approval must have opened a new window).
    (again,) = await start(db, tenant, offers[3:4])
    if again.approved:
        assert (await queue_counters(db, tenant, queue.id))["start_window_until"] > window
    else:
        assert again.reason == "start_rate_limited"
        await wait_db_time_past(db, window)
        assert all(o.approved for o in await start(db, tenant, offers[3:4]))
    assert all(o.approved for o in await start(db, tenant, offers[4:6]))
    states = {(await task_row(db, tenant, g.task_id))["state"] for g in offers}
    assert states == {"RUNNING"}
    counters = await queue_counters(db, tenant, queue.id)
    assert 1 <= counters["starts_in_window"] <= 3
    green(sync_conn, tenant)


async def test_application_start_window_spans_queues(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    q1, q2 = await make_queue(db, tenant), await make_queue(db, tenant)
    await add_tasks(db, tenant, q1, 2)
    await add_tasks(db, tenant, q2, 2)
    session = await open_session(db, tenant, [q1, q2])
    await set_application_limits(db, tenant, max_starts_per_second=3)
    await set_queue_limits(db, tenant, q2.id, max_starts_per_second=10)
    offers = await claim(db, session, q1) + await claim(db, session, q2)
    outcomes = await start(db, tenant, offers)
    assert [o.approved for o in outcomes] == [True, True, True, False]
    assert outcomes[3].reason == "start_rate_limited"
    assert outcomes[3].retry_after_ms is not None
    assert outcomes[3].retry_after_ms > 0
    counters = await application_counters(db, tenant)
    assert (counters["starts_in_window"], counters["reserved_attempts"]) == (3, 1)
    assert (await queue_counters(db, tenant, q2.id))["starts_in_window"] == 1
    await wait_db_time_past(db, counters["start_window_until"])
    assert all(o.approved for o in await start(db, tenant, offers[3:]))
    counters = await application_counters(db, tenant)
    assert (counters["starts_in_window"], counters["reserved_attempts"]) == (1, 0)
    green(sync_conn, tenant)


async def test_counters_survive_a_queue_configuration_change(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await api_queue(db, tenant)
    await set_queue_limits(db, tenant, queue.id, max_unfinished_tasks=10,
                           max_starts_per_second=5)
    await accepted(api, tenant, 4)
    session = await open_session(db, tenant, [queue])
    offers = await claim(db, session, queue, 3)
    assert all(o.approved for o in await start(db, tenant, offers[:2]))
    before = await queue_counters(db, tenant, queue.id)
    assert (before["unfinished_tasks"], before["active_attempts"],
            before["starts_in_window"]) == (4, 3, 2)
    url = f"/v1/namespaces/{tenant.namespace}/queues/work"
    response = await api.patch(url, json={"revision": 1, "description": "changed",
                                          "max_concurrent_attempts": 50}, headers=tenant.auth)
    assert response.status == 200, await response.text()
    after = await queue_counters(db, tenant, queue.id)
    assert after == {**before, "max_concurrent_attempts": 50}  # limits set in SQL kept too
    response = await api.patch(url, json={"revision": 2, "max_starts_per_second": 7},
                               headers=tenant.auth)
    assert response.status == 200, await response.text()
    after = await queue_counters(db, tenant, queue.id)
    assert after == {**before, "max_concurrent_attempts": 50, "max_starts_per_second": 7}
    # The window's count still limits: 2 used, 7 allowed, 1 offer left to start.
    assert all(o.approved for o in await start(db, tenant, offers[2:]))
    assert (await queue_counters(db, tenant, queue.id))["starts_in_window"] in (1, 3)
    green(sync_conn, tenant)


# --- interventions and deadlines keep the counters ---------------------------------------------


async def test_interventions_and_deadlines_keep_the_unfinished_counters(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = await make_queue(db, tenant)
    principal = await who(db, tenant)
    session = await open_session(db, tenant, [queue])

    async def counts() -> tuple[int, int, int, int, int]:
        q = await queue_counters(db, tenant, queue.id)
        a = await application_counters(db, tenant)
        assert (a["unfinished_tasks"], a["active_attempts"]) == (q["unfinished_tasks"],
                                                                 q["active_attempts"])
        return (q["unfinished_tasks"], q["active_attempts"], a["reserved_attempts"],
                len(await rows(db, tenant, "WAITING")), len(await rows(db, tenant, "RUNNING")))

    async def cancel(task_id: bytes) -> Any:
        return await interventions.cancel_task(db, principal, namespace=tenant.namespace,
                                               task_id=task_id, reason="test")

    (waiting,) = await add_tasks(db, tenant, queue)
    await cancel(waiting)  # WAITING -> CANCELLED
    assert await counts() == (0, 0, 0, 0, 0)

    (offered,) = await add_tasks(db, tenant, queue, concurrency_key=b"acct")
    (offer,) = await claim(db, session, queue)
    assert await counts() == (1, 1, 1, 0, 0)
    await cancel(offered)  # LEASED -> CANCELLED: the offer is withdrawn, its permit released
    assert await counts() == (0, 0, 0, 0, 0)

    (running,) = await add_tasks(db, tenant, queue)
    (grant,) = await claim(db, session, queue)
    assert all(o.approved for o in await start(db, tenant, [grant]))
    assert await counts() == (1, 1, 0, 0, 1)
    await cancel(running)  # RUNNING: an intent only
    assert await counts() == (1, 1, 0, 0, 1)
    assert await finish(db, tenant, grant, "cancelled") == "CANCELLED"
    assert await counts() == (0, 0, 0, 0, 0)

    (unknown,) = await add_tasks(db, tenant, queue)
    (grant,) = await claim(db, session, queue)
    assert all(o.approved for o in await start(db, tenant, [grant]))
    assert await finish(db, tenant, grant, "unknown") == "NEEDS_REVIEW"
    assert await counts() == (1, 0, 0, 0, 0)  # awaiting review is unfinished
    await interventions.review_task(db, principal, namespace=tenant.namespace, task_id=unknown,
                                    decision="failed", reason="checked", evidence_ref="T-1",
                                    execution_ended=True,
                                    revision=(await task_row(db, tenant, unknown))["revision"])
    assert await counts() == (0, 0, 0, 0, 0)
    await interventions.retry_task(db, principal, namespace=tenant.namespace, task_id=unknown,
                                   reason="again", rerun_confirmed=True)
    assert await counts() == (1, 0, 0, 1, 0)

    (late, uncertain) = await add_tasks(db, tenant, queue, 2, handler="never")

    async def past_deadline(cur: Any) -> None:
        await cur.execute(
            "UPDATE pulse_tasks SET deadline_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND,"
            " effect_uncertain = (id = %s) WHERE namespace_id = %s AND id IN (%s, %s)",
            (uncertain, tenant.namespace_id, late, uncertain))

    await db.transaction("test.deadline", past_deadline)
    assert await counts() == (3, 0, 0, 3, 0)
    assert await db.transaction("test.expire", lambda cur: leases.expire_waiting(cur, 1000)) >= 2
    assert (await task_row(db, tenant, late))["state"] == "FAILED"
    assert (await task_row(db, tenant, uncertain))["state"] == "NEEDS_REVIEW"
    assert await counts() == (2, 0, 0, 1, 0)  # the uncertain one still awaits review
    assert offer.concurrency_token == 1
    green(sync_conn, tenant)


async def rows(db: Database, tenant: Tenant, state: str) -> list[bytes]:
    async def body(cur: Any) -> list[bytes]:
        await cur.execute("SELECT id FROM pulse_tasks WHERE namespace_id = %s AND state = %s",
                          (tenant.namespace_id, state))
        return [r["id"] for r in await cur.fetchall()]

    return await db.read("test.rows", body)


# --- the application's counters start with its first count limit ---------------------------------


async def test_the_first_count_limit_recounts_exactly_while_work_commits(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """Without a count limit an application keeps no counters (its row is only share-locked);
    the change that sets the first one recounts them in its transaction. Two namespaces submit,
    claim, start and finish concurrently while the limit is switched on and off through the
    operator command: every time it is on and the work has stopped, the counters equal a
    recount (the invariant checker), and the work never saw a counter error."""
    from orbit_common.platform.audit import Actor
    from orbit_common.pulse import quotas

    other = await sibling(db, tenant)
    tenants = (tenant, other)
    queues = {t.namespace_id: await make_queue(db, t) for t in tenants}
    sessions = {t.namespace_id: await open_session(db, t, [queues[t.namespace_id]])
                for t in tenants}
    rounds: list[int] = [0, 0]
    stop = asyncio.Event()

    async def churn(index: int, t: Tenant) -> None:
        queue, session = queues[t.namespace_id], sessions[t.namespace_id]
        while not stop.is_set():
            await add_tasks(db, t, queue, 3)
            grants = await claim(db, session, queue, 3)
            outcomes = await start(db, t, grants[:2])
            for grant, outcome in zip(grants, outcomes, strict=False):
                if outcome.approved:
                    await finish(db, t, grant)
            rounds[index] += 1

    async def until_rounds(n: int) -> None:
        target = [r + n for r in rounds]
        await until(lambda: all(r >= g for r, g in zip(rounds, target, strict=True)),
                    timeout=30, message=f"{n} more rounds of each churner")

    async def set_limit(value: int | None) -> dict[str, Any]:
        return await quotas.operator_set(
            db, application=tenant.application, actor=Actor.operator("test"),
            patch=quotas.LimitsPatch(max_unfinished_tasks=value), revision=None, reason="t")

    scope = [t.namespace_id for t in tenants]
    for _ in range(4):
        stop.clear()
        workers = [asyncio.create_task(churn(i, t)) for i, t in enumerate(tenants)]
        await until_rounds(2)
        await set_limit(1_000_000)  # recounted while both namespaces commit
        await until_rounds(3)  # now counted by the work itself
        stop.set()
        await asyncio.gather(*workers)  # a counter error would surface here
        assert check(sync_conn, scope) == []
        counters = await application_counters(db, tenant)
        assert counters["tracked"]
        per_queue = [await queue_counters(db, t, queues[t.namespace_id].id) for t in tenants]
        assert counters["unfinished_tasks"] == sum(q["unfinished_tasks"] for q in per_queue) > 0
        await set_limit(None)  # counters no longer kept: the next round starts from a recount
        assert not (await application_counters(db, tenant))["tracked"]


async def test_a_concurrency_limit_set_while_a_claim_runs_still_holds(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """A claim on a queue without ``max_concurrent_attempts`` reads the queue row without a
    lock and updates its counter at the end. A limit committed in between is caught by the
    guarded counter update: the claim rolls back and runs again under the limit
    (leases.run_claim), instead of granting past it."""
    from tests.support.database import connect_sync

    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 5)
    session = await open_session(db, tenant, [queue])
    blocker = connect_sync(db_url, autocommit=False)
    try:
        with blocker.cursor() as cur:  # the limit change, not yet committed, holds the row
            cur.execute("UPDATE pulse_queues SET max_concurrent_attempts = 2"
                        " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, queue.id))
        claiming = asyncio.create_task(leases.run_claim(db, "test.claim", session, queue, 5))
        # Wait (on the server's process list, not the clock) until the claim's counter update
        # is waiting for the limit change's row lock.
        await until(lambda: not claiming.done() and statements_waiting(
            sync_conn, "UPDATE pulse_queues%active_attempts + 5%"),
            message="the claim's counter update to wait for the queue row")
        assert not claiming.done()
        # The claim's only lock wait is its counter update: it has read the queue row (no
        # limit then) and written its five attempts.
        blocker.commit()
        grants = await claiming
    finally:
        blocker.close()
    assert len(grants) == 2  # re-run under the limit, not five
    counters = await queue_counters(db, tenant, queue.id)
    assert (counters["active_attempts"], counters["max_concurrent_attempts"]) == (2, 2)
    green(sync_conn, tenant)

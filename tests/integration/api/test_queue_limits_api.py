"""Queue flow-control limits over the API: create and PATCH accept them, bad values are problem
documents that write nothing, a configuration change never touches the runtime counters, and
the one-queue GET reports the usage (counters, start window, backlog, oldest waiting age).
"""

from __future__ import annotations

import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.pulse import leases
from orbit_common.pulse.leases import AttemptRef, Grant
from orbit_common.pulse.queues import INT_MAX
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant, unique
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_queues_support import (
    QueueWrites,
    create,
    get,
    get_with_usage,
    qwrites,
    refusals,
    rows,
    url,
)
from tests.support import held, pulse
from tests.support.lease_fixtures import open_session

__all__ = ["qwrites"]

LIMITS = ("max_unfinished_tasks", "max_starts_per_second")
COUNTERS = ("active_attempts", "unfinished_tasks", "start_window_until", "starts_in_window")


async def _patch(api: TestClient[Any, Any], tenant: Tenant, name: str,
                 body: dict[str, Any]) -> dict[str, Any]:
    response = await api.patch(url(tenant.namespace, name), json=body, headers=tenant.auth)
    assert response.status == 200, await response.text()
    result: dict[str, Any] = await response.json()
    return result


async def _submit(api: TestClient[Any, Any], tenant: Tenant, queue: str,
                  **fields: Any) -> Any:
    return await api.post(f"/v1/namespaces/{tenant.namespace}/tasks",
                          json={"queue": queue, "handler": "h", **fields}, headers=tenant.auth)


def _counters(conn: pymysql.connections.Connection[Any], tenant: Tenant,
              name: str) -> dict[str, Any]:
    (row,) = rows(conn, "SELECT active_attempts, unfinished_tasks, start_window_until,"
                        " starts_in_window, revision FROM pulse_queues"
                        " WHERE namespace_id = %s AND name = %s", tenant.namespace_id, name)
    return row


async def _session(db: Database, tenant: Tenant, conn: pymysql.connections.Connection[Any],
                   name: str) -> tuple[Session, QueueRef]:
    (row,) = rows(conn, "SELECT id, gate_id FROM pulse_queues WHERE namespace_id = %s AND"
                        " name = %s", tenant.namespace_id, name)
    queue = QueueRef(id=row["id"], name=name, gate_id=row["gate_id"])
    return await open_session(db, tenant, [queue], handlers=("h",)), queue


async def _claim(db: Database, session: Session, queue: QueueRef, n: int) -> list[Grant]:
    return await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))


async def _start(db: Database, tenant: Tenant, grants: list[Grant]) -> list[Any]:
    refs = [AttemptRef(attempt_id=g.attempt_id, token=g.token, generation=g.generation)
            for g in grants]
    return await db.transaction("test.start",
                                lambda cur: held.start(cur, tenant.namespace_id, refs))


# --- configuration ---------------------------------------------------------------------------


async def test_create_and_patch_set_the_limits_and_null_means_unlimited(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("limits")
    created = await create(api, tenant, name, max_unfinished_tasks=5, max_starts_per_second=2)
    assert (created["max_unfinished_tasks"], created["max_starts_per_second"]) == (5, 2)
    assert "usage" not in created  # only the one-queue GET measures usage
    (row,) = rows(sync_conn, "SELECT max_unfinished_tasks, max_starts_per_second"
                             " FROM pulse_queues WHERE namespace_id = %s AND name = %s",
                  tenant.namespace_id, name)
    assert row == {"max_unfinished_tasks": 5, "max_starts_per_second": 2}

    # null removes one limit; the other, left out, stays.
    updated = await _patch(api, tenant, name, {"revision": 1, "max_unfinished_tasks": None})
    assert (updated["max_unfinished_tasks"], updated["max_starts_per_second"]) == (None, 2)
    assert updated["revision"] == 2
    updated = await _patch(api, tenant, name, {"revision": 2, "max_starts_per_second": INT_MAX})
    assert (updated["max_unfinished_tasks"], updated["max_starts_per_second"]) == (None, INT_MAX)
    # The same values again change nothing and write nothing.
    same = await _patch(api, tenant, name, {"revision": 3, "max_unfinished_tasks": None,
                                            "max_starts_per_second": INT_MAX})
    assert same == updated
    assert await get(api, tenant, name) == updated

    (audit,) = rows(sync_conn, "SELECT before_doc, after_doc FROM orbit_audit_events"
                               " WHERE action = 'queue.update' AND resource_id = %s"
                               " AND resource_revision = 2", bytes.fromhex(created["id"]))
    before, after = json.loads(audit["before_doc"]), json.loads(audit["after_doc"])
    assert (before["max_unfinished_tasks"], after["max_unfinished_tasks"]) == (5, None)


BAD_VALUES = [0, -1, INT_MAX + 1, "5", 1.5, True, [1]]


@pytest.mark.parametrize("value", BAD_VALUES, ids=[repr(v) for v in BAD_VALUES])
@pytest.mark.parametrize("field", LIMITS)
async def test_a_bad_limit_is_a_problem_document_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, field: str, value: Any,
) -> None:
    existing = await create(api, tenant, unique("q"))
    qwrites.reset()
    for method, target, body in (
        ("post", url(tenant.namespace), {"name": unique("new"), field: value}),
        ("patch", url(tenant.namespace, existing["name"]), {"revision": 1, field: value}),
    ):
        response = await getattr(api, method)(target, json=body, headers=tenant.auth)
        problem = await assert_problem(response, 400, "validation_failed")
        assert problem["errors"][0]["path"] == f"$.{field}", problem
    qwrites.assert_unchanged()
    assert await get(api, tenant, existing["name"]) == existing


async def test_every_bad_field_of_a_patch_is_reported_together(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites,
) -> None:
    existing = await create(api, tenant, unique("q"))
    qwrites.reset()
    response = await api.patch(url(tenant.namespace, existing["name"]), headers=tenant.auth,
                               json={"revision": 1, "max_unfinished_tasks": 0,
                                     "max_starts_per_second": -5, "offer_lease_ms": 1})
    problem = await assert_problem(response, 400, "validation_failed")
    assert {e["path"] for e in problem["errors"]} == {
        "$.max_unfinished_tasks", "$.max_starts_per_second", "$.offer_lease_ms"}
    qwrites.assert_unchanged()


# --- counters and usage ------------------------------------------------------------------------


async def test_configuration_changes_never_touch_the_runtime_counters(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("busy")
    await create(api, tenant, name, max_starts_per_second=1000)
    for _ in range(3):
        assert (await _submit(api, tenant, name)).status == 201
    session, queue = await _session(db, tenant, sync_conn, name)
    grants = await _claim(db, session, queue, 2)
    assert len(grants) == 2
    (outcome,) = await _start(db, tenant, grants[:1])
    assert outcome.approved
    before = _counters(sync_conn, tenant, name)
    assert (before["unfinished_tasks"], before["active_attempts"],
            before["starts_in_window"]) == (3, 2, 1)
    assert before["start_window_until"] is not None

    # Every configuration field at once, the limits lowered below the usage.
    await _patch(api, tenant, name, {
        "revision": before["revision"], "description": "lowered", "offer_lease_ms": 5000,
        "execution_lease_ms": 7000, "retry": {"max_attempts": 9, "jitter": "0"},
        "max_concurrent_attempts": 1, "max_unfinished_tasks": 1, "max_starts_per_second": 1})
    after = _counters(sync_conn, tenant, name)
    assert {k: after[k] for k in COUNTERS} == {k: before[k] for k in COUNTERS}
    assert after["revision"] == before["revision"] + 1
    # Lowering a limit deleted nothing and revoked nothing.
    states = rows(sync_conn, "SELECT state FROM pulse_tasks WHERE namespace_id = %s"
                             " AND queue_id = %s", tenant.namespace_id, queue.id)
    assert sorted(r["state"] for r in states) == ["LEASED", "RUNNING", "WAITING"]
    attempts = rows(sync_conn, "SELECT state FROM pulse_attempts WHERE namespace_id = %s"
                               " AND queue_id = %s", tenant.namespace_id, queue.id)
    assert sorted(r["state"] for r in attempts) == ["OFFERED", "RUNNING"]


async def test_a_full_queue_answers_429_with_retry_after_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("full")
    await create(api, tenant, name, max_unfinished_tasks=2)
    assert (await _submit(api, tenant, name)).status == 201
    assert (await _submit(api, tenant, name)).status == 201
    counts = pulse.submit_counts(sync_conn)
    counted = refusals("queue_full")
    response = await _submit(api, tenant, name, business_key="third")
    problem = await assert_problem(response, 429, "queue_full")
    assert int(response.headers["Retry-After"]) >= 1
    assert problem["retry_after_s"] == int(response.headers["Retry-After"])
    assert pulse.submit_counts(sync_conn) == counts
    assert refusals("queue_full") == counted + 1
    # A batch that would pass the limit is refused whole.
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/batch",
                              headers=tenant.auth,
                              json={"tasks": [{"queue": name, "handler": "h"}]})
    await assert_problem(response, 429, "queue_full")
    assert pulse.submit_counts(sync_conn) == counts
    assert _counters(sync_conn, tenant, name)["unfinished_tasks"] == 2
    # Raising the limit admits work again; the counter was never reset.
    current = await get(api, tenant, name)
    await _patch(api, tenant, name, {"revision": current["revision"],
                                     "max_unfinished_tasks": None})
    assert (await _submit(api, tenant, name)).status == 201
    assert _counters(sync_conn, tenant, name)["unfinished_tasks"] == 3


async def test_usage_reports_counters_start_window_and_backlog(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("usage")
    await create(api, tenant, name, max_starts_per_second=10)
    empty = (await get_with_usage(api, tenant, name))["usage"]
    assert {k: v for k, v in empty.items() if k != "measured_at"} == {
        "unfinished_tasks": 0, "active_attempts": 0, "starts_in_window": 0,
        "start_window_until": None, "waiting_tasks": 0, "oldest_waiting_age_ms": 0}

    receipts = []
    for fields in ({"priority": 9}, {}, {"delay_ms": 600_000}, {}):
        response = await _submit(api, tenant, name, **fields)
        assert response.status == 201
        receipts.append(await response.json())
    session, queue = await _session(db, tenant, sync_conn, name)
    # Claim and start the last one (claim order: priority 9 first, so move it out of reach).
    aged, plain, delayed, running = (bytes.fromhex(r["id"]) for r in receipts)
    with sync_conn.cursor() as cur:
        cur.execute("UPDATE pulse_tasks SET available_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
                    " WHERE namespace_id = %s AND id IN (%s, %s)",
                    (tenant.namespace_id, aged, plain))
    (grant,) = await _claim(db, session, queue, 1)
    assert grant.task_id == running
    (outcome,) = await _start(db, tenant, [grant])
    assert outcome.approved
    # The priority-9 task has the earliest dispatch_at but not the oldest available_at: the
    # plain task, due 200 s ago, is the oldest waiting (dispatch_at = available_at - 270 s for
    # priority 9, so the head of the claim order is the aged task).
    with sync_conn.cursor() as cur:
        cur.execute("UPDATE pulse_tasks SET available_at = UTC_TIMESTAMP(6) - INTERVAL 100 SECOND"
                    " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, aged))
        cur.execute("UPDATE pulse_tasks SET available_at = UTC_TIMESTAMP(6) - INTERVAL 200 SECOND"
                    " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, plain))
    body = await get_with_usage(api, tenant, name)
    found = body["usage"]
    assert body["max_starts_per_second"] == 10
    assert found["unfinished_tasks"] == 4
    assert found["active_attempts"] == 1
    assert found["waiting_tasks"] == 2  # the delayed task is not due
    assert 200_000 <= found["oldest_waiting_age_ms"] < 260_000, found
    counters = _counters(sync_conn, tenant, name)
    if found["start_window_until"] is not None:  # read within the start's one-second window
        assert found["starts_in_window"] == 1
        assert found["measured_at"] < found["start_window_until"]
    else:
        assert found["starts_in_window"] == 0
    assert counters["starts_in_window"] == 1
    # Once the window has passed (database time), no start counts, though the row keeps 1.
    with sync_conn.cursor() as cur:
        cur.execute("UPDATE pulse_queues SET start_window_until = UTC_TIMESTAMP(6)"
                    " - INTERVAL 1 SECOND WHERE namespace_id = %s AND id = %s",
                    (tenant.namespace_id, queue.id))
    found = (await get_with_usage(api, tenant, name))["usage"]
    assert (found["starts_in_window"], found["start_window_until"]) == (0, None)
    assert delayed  # still WAITING, not due: counted as unfinished only


async def test_list_and_changes_answer_the_view_without_usage(
    api: TestClient[Any, Any], tenant: Tenant,
) -> None:
    name = unique("plain")
    created = await create(api, tenant, name)
    response = await api.get(url(tenant.namespace), headers=tenant.auth)
    (item,) = [q for q in (await response.json())["items"] if q["name"] == name]
    assert item == created
    response = await api.post(url(tenant.namespace, name, "pause"), json={"reason": "test"},
                              headers=tenant.auth)
    assert "usage" not in await response.json()

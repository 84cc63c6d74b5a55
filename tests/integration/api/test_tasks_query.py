"""GET /v1/namespaces/{namespace}/tasks and a task's detail, attempts, events and late evidence.

Filters (each combination against a direct SQL answer), cursor walks that see every task exactly
once, created-at bounds, byte-exact business keys, cursors bound to their filters, and isolation:
another tenant's tasks, or tasks of a queue the credential may not read, are not found.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from typing import Any
from urllib.parse import quote

import attrs
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.support import pulse
from tests.support.contract import assert_documented


def url(tenant: Tenant, suffix: str = "") -> str:
    return f"/v1/namespaces/{tenant.namespace}/tasks{suffix}"


async def get(api: TestClient[Any, Any], path: str, auth: dict[str, str],
              params: dict[str, Any] | None = None) -> dict[str, Any]:
    response = await api.get(path, headers=auth, params=params or {})
    text = await response.text()
    assert response.status == 200, text
    body: dict[str, Any] = json.loads(text)
    return body


async def walk(api: TestClient[Any, Any], path: str, auth: dict[str, str],
               params: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Every item of a list, page by page; checks that no page is larger than the limit."""
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        page = await get(api, path, auth, {**params, "limit": limit,
                                           **({"cursor": cursor} if cursor else {})})
        assert len(page["items"]) <= limit
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("the cursor walk does not end")


async def submit(api: TestClient[Any, Any], tenant: Tenant, items: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    response = await api.post(url(tenant, "/batch"), json={"tasks": items}, headers=tenant.auth)
    assert response.status == 201, await response.text()
    tasks: list[dict[str, Any]] = (await response.json())["tasks"]
    return tasks


def execute(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, args)


def finish(conn: pymysql.connections.Connection[Any], task_id: str, state: str) -> None:
    """Move a task to a terminal state behind the API's back (the dispatcher's job)."""
    execute(conn, "UPDATE pulse_tasks SET state = %s, completed_at = UTC_TIMESTAMP(6),"
                  " revision = revision + 1 WHERE id = %s", state, bytes.fromhex(task_id))


@attrs.frozen
class World:
    tenant: Tenant
    tasks: list[dict[str, Any]]  # as the list shows them now: newest first


KEYS = ["Key", "key", "Key ", "Key  ", "订单"]


@pytest.fixture
async def world(api: TestClient[Any, Any], tenant: Tenant, db: Database,
                sync_conn: pymysql.connections.Connection[Any]) -> World:
    """Three submissions (so three creation times, with ties inside each batch) over two queues,
    several states and business keys."""
    await pulse.create_queue(db, tenant.namespace_id, "alpha")
    await pulse.create_queue(db, tenant.namespace_id, "beta")
    for round_ in range(3):
        items = [{"queue": "alpha" if n % 3 else "beta", "handler": f"h{round_}-{n}",
                  **({"business_key": KEYS[n % len(KEYS)]} if n % 2 == 0 else {})}
                 for n in range(9)]
        created = await submit(api, tenant, items)
        for n, task in enumerate(created):
            if n % 4 == 1:
                finish(sync_conn, task["id"], "CANCELLED")
            elif n % 4 == 2:
                finish(sync_conn, task["id"], "SUCCEEDED")
    every = await walk(api, url(tenant), tenant.auth, {}, limit=500)
    return World(tenant=tenant, tasks=every)


def expected(world: World, *, queue: str | None = None, state: str | None = None,
             business_key: str | None = None) -> list[str]:
    return [t["id"] for t in world.tasks
            if (queue is None or t["queue"] == queue) and (state is None or t["state"] == state)
            and (business_key is None or t["business_key"] == business_key)]


async def test_the_list_is_newest_first_by_created_at_then_id(
    api: TestClient[Any, Any], world: World, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    assert len(world.tasks) == 27
    with sync_conn.cursor() as cur:
        cur.execute("SELECT LOWER(HEX(id)) FROM pulse_tasks WHERE namespace_id = %s"
                    " ORDER BY created_at DESC, id DESC", (world.tenant.namespace_id,))
        assert [t["id"] for t in world.tasks] == [r[0] for r in cur.fetchall()]
    assert len({t["created_at"] for t in world.tasks}) == 3
    item = world.tasks[0]
    assert {"id", "queue", "handler", "state", "priority", "business_key", "created_at",
            "available_at", "revision", "attempts_used", "effect_uncertain", "outcome_reason",
            "cancel_requested_at", "updated_at", "completed_at"} <= set(item)
    assert "input" not in item


FILTER_VALUES = {
    "queue": [None, "alpha", "beta"],
    "state": [None, "WAITING", "CANCELLED", "SUCCEEDED", "FAILED"],
    "business_key": [None, "Key", "Key ", "订单"],
}


@pytest.mark.parametrize("limit", [1, 4, 500])
async def test_every_filter_combination_walks_every_match_exactly_once(
    api: TestClient[Any, Any], world: World, limit: int,
) -> None:
    for queue, state, key in itertools.product(*FILTER_VALUES.values()):
        if limit == 1 and (queue, state, key).count(None) < 2:
            continue  # one filter at a time is enough for the slowest walk
        params = {k: v for k, v in (("queue", queue), ("state", state),
                                    ("business_key", key)) if v is not None}
        found = await walk(api, url(world.tenant), world.tenant.auth, params, limit)
        ids = [t["id"] for t in found]
        assert ids == expected(world, queue=queue, state=state, business_key=key), params
        assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("key", KEYS)
async def test_business_keys_match_by_exact_bytes(
    api: TestClient[Any, Any], world: World, key: str,
) -> None:
    # Encoded by hand, so the spaces travel as %20 and nothing is normalised on the way.
    page = await get(api, url(world.tenant) + "?business_key=" + quote(key, safe=""),
                     world.tenant.auth)
    assert page["items"]
    assert {t["business_key"] for t in page["items"]} == {key}
    assert [t["id"] for t in page["items"]] == expected(world, business_key=key)


async def test_an_unused_business_key_finds_nothing(
    api: TestClient[Any, Any], world: World,
) -> None:
    for key in ("KEY", "Key   ", " Key", "订"):
        page = await get(api, url(world.tenant), world.tenant.auth, {"business_key": key})
        assert page == {"items": [], "next_cursor": None}


async def test_created_bounds_are_inclusive_below_and_exclusive_above(
    api: TestClient[Any, Any], world: World,
) -> None:
    times = sorted({t["created_at"] for t in world.tasks})
    assert len(times) == 3
    first, middle, last = times

    async def between(**bounds: str) -> list[str]:
        found = await walk(api, url(world.tenant), world.tenant.auth, bounds, limit=4)
        return sorted({t["created_at"] for t in found})

    assert await between(created_after=middle) == [middle, last]
    assert await between(created_before=middle) == [first]
    assert await between(created_after=middle, created_before=last) == [middle]
    assert await between(created_after=middle, created_before=middle) == []
    # Another offset for the same instant is the same bound.
    instant = dt.datetime.fromisoformat(middle).astimezone(dt.timezone(dt.timedelta(hours=-7)))
    assert await between(created_after=instant.isoformat()) == [middle, last]
    assert await between(created_after="0001-01-01T00:00:00Z",
                         created_before="9999-12-31T23:59:59Z") == times


async def test_a_cursor_is_bound_to_its_filters(
    api: TestClient[Any, Any], world: World,
) -> None:
    page = await get(api, url(world.tenant), world.tenant.auth,
                     {"queue": "alpha", "limit": 2})
    cursor = page["next_cursor"]
    assert cursor
    for other in ({}, {"queue": "beta"}, {"queue": "alpha", "state": "WAITING"},
                  {"queue": "alpha", "business_key": "Key"},
                  {"queue": "alpha", "created_after": "2000-01-01T00:00:00Z"},
                  {"queue": "alpha", "created_before": "2999-01-01T00:00:00Z"}):
        response = await api.get(url(world.tenant), headers=world.tenant.auth,
                                 params={**other, "cursor": cursor})
        await assert_problem(response, 400, "invalid_cursor")
    # The same filters (and another limit) continue the walk.
    rest = await get(api, url(world.tenant), world.tenant.auth,
                     {"queue": "alpha", "cursor": cursor, "limit": 500})
    assert [t["id"] for t in page["items"] + rest["items"]] == expected(world, queue="alpha")


async def test_a_tampered_cursor_is_refused(api: TestClient[Any, Any], world: World) -> None:
    page = await get(api, url(world.tenant), world.tenant.auth, {"limit": 2})
    cursor = page["next_cursor"]
    for bad in (cursor[:-2], cursor + "x", cursor[::-1]):
        response = await api.get(url(world.tenant), headers=world.tenant.auth,
                                 params={"cursor": bad})
        await assert_problem(response, 400, "invalid_cursor")


# --- authorization and isolation ----------------------------------------------------------------


async def test_a_reader_limited_to_one_queue_sees_only_that_queue(
    api: TestClient[Any, Any], world: World, db: Database,
) -> None:
    reader = await make_key(db, world.tenant, [{"namespaces": [world.tenant.namespace],
                                                "actions": ["tasks.read"], "queues": ["beta"]}])
    auth = {"Authorization": f"Bearer {reader}"}
    # Rows of other queues are skipped, whatever the page size.
    for limit in (1, 2, 500):
        found = await walk(api, url(world.tenant), auth, {}, limit)
        assert [t["id"] for t in found] == expected(world, queue="beta")
    response = await api.get(url(world.tenant), headers=auth, params={"queue": "alpha"})
    await assert_problem(response, 404, "queue_not_found")
    hidden = next(t for t in world.tasks if t["queue"] == "alpha")
    for suffix in ("", "/attempts", "/events", f"/attempts/{'0' * 32}/evidence"):
        response = await api.get(url(world.tenant, f"/{hidden['id']}{suffix}"), headers=auth)
        await assert_problem(response, 404, "task_not_found")
    visible = next(t for t in world.tasks if t["queue"] == "beta")
    assert (await get(api, url(world.tenant, f"/{visible['id']}"), auth))["id"] == visible["id"]


async def test_a_credential_without_tasks_read_is_forbidden(
    api: TestClient[Any, Any], world: World, db: Database,
) -> None:
    submitter = await make_key(db, world.tenant, [{"namespaces": [world.tenant.namespace],
                                                   "actions": ["tasks.submit"]}])
    auth = {"Authorization": f"Bearer {submitter}"}
    task = world.tasks[0]["id"]
    for path in (url(world.tenant), url(world.tenant, f"/{task}"),
                 url(world.tenant, f"/{task}/events")):
        await assert_problem(await api.get(path, headers=auth), 403, "forbidden")


async def test_another_tenants_tasks_are_not_found_on_every_route(
    api: TestClient[Any, Any], world: World, db: Database,
) -> None:
    other = await make_tenant(db)
    await pulse.create_queue(db, other.namespace_id, "alpha")
    (theirs,) = await submit(api, other, [{"queue": "alpha", "handler": "h"}])
    ours = world.tasks[0]["id"]
    routes = ("", "/attempts", "/events", f"/attempts/{'0' * 32}/evidence")
    for suffix in routes:
        # Their task id in our namespace: no such task (and nothing about it).
        response = await api.get(url(world.tenant, f"/{theirs['id']}{suffix}"),
                                 headers=world.tenant.auth)
        body = await assert_problem(response, 404, "task_not_found")
        assert other.namespace not in json.dumps(body)
        # Our key on their namespace: no such namespace.
        response = await api.get(url(other, f"/{ours}{suffix}"), headers=world.tenant.auth)
        await assert_problem(response, 404, "namespace_not_found")
    await assert_problem(await api.get(url(other), headers=world.tenant.auth), 404,
                         "namespace_not_found")
    # Their list does not show ours and ours does not show theirs.
    mine = await walk(api, url(world.tenant), world.tenant.auth, {}, 500)
    assert theirs["id"] not in {t["id"] for t in mine}
    assert [t["id"] for t in await walk(api, url(other), other.auth, {}, 500)] == [theirs["id"]]


# --- one task: detail, attempts, events, evidence -----------------------------------------------


async def test_the_detail_shows_everything_with_exact_json(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "alpha")
    response = await api.post(url(tenant), data=b'{"queue":"alpha","handler":"h","input":'
                              b'{"x":1.000,"y":-0},"business_key":"B ","deadline_ms":60000}',
                              headers={**tenant.auth, "Content-Type": "application/json"})
    receipt = await response.json()
    execute(sync_conn, "UPDATE pulse_tasks SET state = 'SUCCEEDED', revision = 2,"
                       " completed_at = UTC_TIMESTAMP(6), result = '{\"r\":1E+2}',"
                       " outcome_reason = 'succeeded', attempts_used = 1 WHERE id = %s",
            bytes.fromhex(receipt["id"]))
    response = await api.get(url(tenant, f"/{receipt['id']}"), headers=tenant.auth)
    text = await response.text()
    assert response.status == 200
    assert '"input":{"x":1.000,"y":-0}' in text
    assert '"result":{"r":1E+2}' in text
    detail = json.loads(text)
    for field in ("id", "queue", "handler", "priority", "business_key", "created_at",
                  "available_at", "deadline_at", "start_deadline_at", "rerun_safe"):
        assert detail[field] == receipt[field], field
    assert detail["state"] == "SUCCEEDED"
    assert detail["revision"] == 2
    assert detail["outcome_reason"] == "succeeded"
    assert detail["attempts_used"] == 1
    assert detail["error"] is None
    assert detail["effect_uncertain"] is False
    assert detail["cancel_requested_at"] is None
    assert detail["retry_of"] is None
    assert detail["completed_at"] is not None
    assert detail["retry"] == {"max_attempts": 3, "initial_ms": 1000, "max_ms": 60000,
                               "multiplier": 2, "jitter": 0.2}
    # Decimals are JSON numbers in their shortest spelling, as in the queue (docs/api/README.md).
    assert '"multiplier":2,"jitter":0.2}' in text
    assert_documented("/v1/namespaces/{namespace}/tasks/{task_id}", "get", 200, detail)


async def test_attempts_come_by_generation_without_token_digests(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
) -> None:
    queue_id = await pulse.create_queue(db, tenant.namespace_id, "alpha")
    (task,) = await submit(api, tenant, [{"queue": "alpha", "handler": "h"}])
    task_id = bytes.fromhex(task["id"])
    made = [await pulse.insert_attempt(db, namespace_id=tenant.namespace_id, task_id=task_id,
                                       queue_id=queue_id, generation=g,
                                       state="RUNNING" if g == 5 else "FAILED",
                                       error=None if g == 5 else '{"retry":1.0}')
            for g in (2, 1, 4, 3, 5)]
    attempts = await walk(api, url(tenant, f"/{task['id']}/attempts"), tenant.auth, {}, 2)
    assert [a["generation"] for a in attempts] == [1, 2, 3, 4, 5]
    assert {a["id"] for a in attempts} == {m.hex() for m in made}
    for attempt in attempts:
        assert "token_digest" not in attempt
        # The fencing token is public by design (the resource side compares it); no lease
        # token or digest of one appears.
        assert not any("token" in key for key in attempt if key != "concurrency_token")
    assert attempts[-1]["state"] == "RUNNING"
    assert attempts[-1]["finished_at"] is None
    assert attempts[0]["retryable"] is False
    response = await api.get(url(tenant, f"/{task['id']}/attempts"), headers=tenant.auth)
    assert '"error":{"retry":1.0}' in await response.text()


async def test_events_come_oldest_first(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "alpha")
    (task, other) = await submit(api, tenant, [{"queue": "alpha", "handler": "h"},
                                               {"queue": "alpha", "handler": "h"}])
    for revision in (2, 3, 4):
        execute(sync_conn, "INSERT INTO orbit_events (namespace_id, id, aggregate_type,"
                           " aggregate_id, aggregate_revision, event_type, from_state, to_state,"
                           " payload, occurred_at) VALUES (%s, RANDOM_BYTES(16), 'task', %s, %s,"
                           " 'task.test', 'WAITING', 'WAITING', '{\"v\":2.50}',"
                           " UTC_TIMESTAMP(6) + INTERVAL %s SECOND)",
                tenant.namespace_id, bytes.fromhex(task["id"]), revision, revision)
    events = await walk(api, url(tenant, f"/{task['id']}/events"), tenant.auth, {}, 1)
    assert [(e["type"], e["revision"]) for e in events] == [
        ("task.accepted", 1), ("task.test", 2), ("task.test", 3), ("task.test", 4)]
    assert events[0]["from_state"] is None
    assert events[0]["to_state"] == "WAITING"
    assert events[0]["payload"]["id"] == task["id"]
    response = await api.get(url(tenant, f"/{task['id']}/events"), headers=tenant.auth,
                             params={"limit": 500})
    assert '"payload":{"v":2.50}' in await response.text()
    # The other task's events are its own.
    others = await walk(api, url(tenant, f"/{other['id']}/events"), tenant.auth, {}, 500)
    assert [e["payload"]["id"] for e in others] == [other["id"]]


async def test_late_evidence_of_an_attempt_pages_oldest_first(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
) -> None:
    queue_id = await pulse.create_queue(db, tenant.namespace_id, "alpha")
    (task, other) = await submit(api, tenant, [{"queue": "alpha", "handler": "h"},
                                               {"queue": "alpha", "handler": "h"}])
    attempt = await pulse.insert_attempt(db, namespace_id=tenant.namespace_id,
                                         task_id=bytes.fromhex(task["id"]), queue_id=queue_id,
                                         generation=1)
    evidence = await pulse.insert_evidence(db, namespace_id=tenant.namespace_id,
                                           task_id=bytes.fromhex(task["id"]),
                                           attempt_id=attempt, generation=1, count=5)
    path = url(tenant, f"/{task['id']}/attempts/{attempt.hex()}/evidence")
    found = await walk(api, path, tenant.auth, {}, 2)
    assert [e["id"] for e in found] == [e.hex() for e in evidence]
    assert found[0]["attempt_id"] == attempt.hex()
    assert found[0]["rejected_because"] == "attempt_finished"
    response = await api.get(path, headers=tenant.auth)
    assert '"payload":{"late":1.50}' in await response.text()
    # The attempt belongs to another task: not found through that task.
    response = await api.get(url(tenant, f"/{other['id']}/attempts/{attempt.hex()}/evidence"),
                             headers=tenant.auth)
    await assert_problem(response, 404, "attempt_not_found")
    # An attempt with no late reports has an empty list.
    quiet = await pulse.insert_attempt(db, namespace_id=tenant.namespace_id,
                                       task_id=bytes.fromhex(task["id"]), queue_id=queue_id,
                                       generation=2)
    empty = await get(api, url(tenant, f"/{task['id']}/attempts/{quiet.hex()}/evidence"),
                      tenant.auth)
    assert empty == {"items": [], "next_cursor": None}

"""/v1/namespaces/{namespace}/schedules… against the real database: the API contract.

Create → get → list, publishing with compare-and-set, pause/resume/disable, trigger, backfill
(idempotent), the occurrence ledger and its pages, and every refusal: a stable problem code and
nothing written. Firing semantics (misfire, overlap, versions' backlogs) are tested with the
scheduler itself (tests/integration/test_schedules*.py).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, StaleRevision

from orbit_common.db.pool import Database
from orbit_common.pulse import schedules
from tests.conftest import Tenant, make_key
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.support import pulse
from tests.support.lease_fixtures import db_time, wait_db_time_past

SCHEDULE_TABLES = (
    "pulse_schedules",
    "pulse_schedule_versions",
    "pulse_schedule_occurrences",
    "pulse_tasks",
    "orbit_events",
    "orbit_audit_events",
    "orbit_idempotency_keys",
)
DAILY = {"cron": "0 9 * * *", "timezone": "Europe/London"}
EVERY_SECOND = {"interval_ms": 1000}
TEMPLATE = {"handler": "reports.build", "input": {"day": "today"}}


def url(tenant: Tenant, suffix: str = "") -> str:
    return f"/v1/namespaces/{tenant.namespace}/schedules{suffix}"


def headers(tenant: Tenant, key: str | None = None, api_key: str | None = None
            ) -> dict[str, str]:
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else tenant.auth
    extra = {"Idempotency-Key": key} if key is not None else {}
    return {**auth, "Content-Type": "application/json", **extra}


async def call(api: TestClient[Any, Any], method: str, path: str, tenant: Tenant,
               body: bytes | dict[str, Any] | None = None, *, key: str | None = None,
               api_key: str | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    response = await api.request(method, path, data=data,
                                 headers=headers(tenant, key, api_key))
    return response.status, await response.json()


def create_body(name: str = "nightly", **overrides: Any) -> dict[str, Any]:
    return {"name": name, "queue": "work", "rule": DAILY, "template": TEMPLATE, **overrides}


async def create(api: TestClient[Any, Any], tenant: Tenant, name: str = "nightly",
                 **overrides: Any) -> dict[str, Any]:
    status, body = await call(api, "POST", url(tenant), tenant, create_body(name, **overrides))
    assert status == 201, body
    return dict(body)


def count(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


async def fire(db: Database) -> schedules.FireStats:
    return await db.transaction("test.fire", schedules.fire_due)


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, "work")
    return "work"


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, SCHEDULE_TABLES)


# --- create, get, list ---------------------------------------------------------------------------


async def test_create_then_get_then_list(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    created = await create(api, tenant, misfire_policy="MERGE", overlap_policy="BUFFER_ONE",
                           catchup_window_ms=600_000, grace_ms=5_000)
    assert created["name"] == "nightly"
    assert created["queue"] == "work"
    assert created["state"] == "ACTIVE"
    assert (created["revision"], created["current_version"], created["processing_version"]) == (
        1, 1, 1)
    assert created["next_fire_at"] is not None
    assert created["next_fire_at"] > created["covered_until"]
    (version,) = created["versions"]
    assert version["version"] == 1
    assert version["rule"]["cron"] == "0 9 * * *"
    assert version["rule"]["timezone"] == "Europe/London"
    assert version["rule"]["calendar_version"]  # frozen at publication
    assert version["template"] == TEMPLATE
    assert (version["misfire_policy"], version["overlap_policy"]) == ("MERGE", "BUFFER_ONE")
    assert (version["catchup_window_ms"], version["grace_ms"]) == (600_000, 5_000)
    assert version["effective_from"] == created["created_at"]

    response = await api.get(url(tenant, "/nightly"), headers=tenant.auth)
    assert response.status == 200
    assert await response.json() == created

    await create(api, tenant, "another")
    status, page = await call(api, "GET", url(tenant), tenant)
    assert status == 200
    assert [s["name"] for s in page["items"]] == ["another", "nightly"]
    assert page["next_cursor"] is None
    assert "versions" not in page["items"][0]
    assert count(sync_conn, "SELECT COUNT(*) FROM orbit_audit_events WHERE action = %s"
                 " AND namespace_id = %s", "schedule.created", tenant.namespace_id) == 2


async def test_defaults_of_a_version(api: TestClient[Any, Any], tenant: Tenant,
                                     queue: str) -> None:
    created = await create(api, tenant, rule=EVERY_SECOND)
    version = created["versions"][0]
    assert (version["misfire_policy"], version["overlap_policy"]) == ("SKIP", "ALLOW")
    assert (version["catchup_window_ms"], version["grace_ms"]) == (3_600_000, 60_000)
    assert version["rule"]["interval_ms"] == 1000
    assert version["rule"]["timezone"] == "UTC"


async def test_template_input_keeps_every_number_spelling(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    body = (b'{"name": "exact", "queue": "work", "rule": {"interval_ms": 60000},'
            b' "template": {"handler": "h", "input": {"a": 1.10, "b": 1E+5, "c": -0}}}')
    status, created = await call(api, "POST", url(tenant), tenant, body)
    assert status == 201, created
    with sync_conn.cursor() as cur:
        cur.execute("SELECT template FROM pulse_schedule_versions WHERE namespace_id = %s",
                    (tenant.namespace_id,))
        (stored,) = cur.fetchone()
    assert '"input":{"a":1.10,"b":1E+5,"c":-0}' in stored
    response = await api.get(url(tenant, "/exact"), headers=tenant.auth)
    assert '"input":{"a":1.10,"b":1E+5,"c":-0}' in await response.text()


async def test_list_pages_by_name(api: TestClient[Any, Any], tenant: Tenant, queue: str) -> None:
    for name in ("c", "a", "e", "b", "d"):
        await create(api, tenant, name)
    seen: list[str] = []
    cursor = None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, page = await call(api, "GET", url(tenant, query), tenant)
        assert status == 200, page
        seen += [s["name"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["a", "b", "c", "d", "e"]
    status, page = await call(api, "GET", url(tenant, "?after=b&limit=2"), tenant)
    assert [s["name"] for s in page["items"]] == ["c", "d"]
    status, page = await call(api, "GET", url(tenant, "?limit=2"), tenant)
    response = await api.get(url(tenant, f"?after=zz&cursor={page['next_cursor']}"),
                             headers=tenant.auth)
    await assert_problem(response, 400, "invalid_cursor")


async def test_create_is_idempotent_with_a_key(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    first = await call(api, "POST", url(tenant), tenant, create_body(), key="k-1")
    again = await call(api, "POST", url(tenant), tenant, create_body(), key="k-1")
    assert first == again
    assert first[0] == 201
    changed = await api.post(url(tenant), data=json.dumps(create_body(grace_ms=1)),
                             headers=headers(tenant, "k-1"))
    await assert_problem(changed, 409, "idempotency_conflict")
    assert count(sync_conn, "SELECT COUNT(*) FROM pulse_schedules WHERE namespace_id = %s",
                 tenant.namespace_id) == 1


# --- publish (compare-and-set) ------------------------------------------------------------------


async def test_publish_a_version_with_compare_and_set(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
) -> None:
    await create(api, tenant)
    status, published = await call(api, "POST", url(tenant, "/nightly/versions"), tenant, {
        "revision": 1, "rule": {"cron": "30 6 * * 1-5", "timezone": "Asia/Shanghai"},
        "template": {"handler": "reports.v2"}, "overlap_policy": "SKIP"})
    assert status == 200, published
    assert (published["revision"], published["current_version"]) == (2, 2)
    assert published["processing_version"] == 1  # the scheduler moves it on
    v1, v2 = published["versions"]
    assert v1["rule"]["cron"] == "0 9 * * *"
    assert v2["rule"] == {**v2["rule"], "cron": "30 6 * * 1-5", "timezone": "Asia/Shanghai"}
    assert v2["template"] == {"handler": "reports.v2"}
    assert (v2["overlap_policy"], v2["misfire_policy"]) == ("SKIP", "SKIP")
    assert v2["effective_from"] >= v1["effective_from"]

    watch.reset()
    stale = await api.post(url(tenant, "/nightly/versions"), headers=headers(tenant),
                           data=json.dumps({"revision": 1, "rule": DAILY, "template": TEMPLATE}))
    body = await assert_problem(stale, 409, "stale_revision")
    assert "revision 2" in body["detail"]
    watch.assert_unchanged()


# --- pause, resume, disable ---------------------------------------------------------------------


async def test_pause_resume_and_disable(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], watch: WriteWatch,
) -> None:
    await create(api, tenant)
    status, paused = await call(api, "POST", url(tenant, "/nightly/pause"), tenant,
                                {"reason": "quarter close"})
    assert status == 200, paused
    assert (paused["state"], paused["revision"]) == ("PAUSED", 2)
    status, again = await call(api, "POST", url(tenant, "/nightly/pause"), tenant,
                               {"reason": "still closing"})
    assert (status, again["state"], again["revision"]) == (200, "PAUSED", 2)  # a no-op
    status, resumed = await call(api, "POST", url(tenant, "/nightly/resume"), tenant,
                                 {"reason": "quarter closed"})
    assert (status, resumed["state"], resumed["revision"]) == (200, "ACTIVE", 3)
    assert resumed["check_at"] is not None

    status, disabled = await call(api, "DELETE", url(tenant, "/nightly"), tenant,
                                  {"reason": "replaced"})
    assert status == 200, disabled
    assert (disabled["state"], disabled["revision"]) == ("DISABLED", 4)
    assert disabled["disabled_at"] is not None
    status, again = await call(api, "DELETE", url(tenant, "/nightly"), tenant,
                               {"reason": "replaced"})
    assert (status, again["state"], again["revision"]) == (200, "DISABLED", 4)

    # History is kept: the schedule, its versions, and GET still answer.
    status, got = await call(api, "GET", url(tenant, "/nightly"), tenant)
    assert (status, got["state"], len(got["versions"])) == (200, "DISABLED", 1)
    events = [r[0] for r in _rows(sync_conn, "SELECT action FROM orbit_audit_events WHERE"
                                  " namespace_id = %s AND resource_type = 'schedule'"
                                  " ORDER BY occurred_at, id", tenant.namespace_id)]
    assert sorted(events) == sorted(["schedule.created", "schedule.paused", "schedule.resumed",
                                     "schedule.disabled"])

    watch.reset()
    for method, suffix, body in (
        ("POST", "/nightly/pause", {"reason": "x"}), ("POST", "/nightly/resume", {"reason": "x"}),
        ("POST", "/nightly/trigger", None),
        ("POST", "/nightly/versions", {"revision": 4, "rule": DAILY, "template": TEMPLATE}),
        ("POST", "/nightly/backfill", {"start": "2030-01-01T00:00:00Z",
                                       "end": "2030-01-02T00:00:00Z", "reason": "x"}),
    ):
        response = await api.request(method, url(tenant, suffix), headers=headers(tenant),
                                     data=None if body is None else json.dumps(body))
        await assert_problem(response, 409, "schedule_disabled")
    watch.assert_unchanged()


def _rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any
          ) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


# --- trigger ------------------------------------------------------------------------------------


async def test_trigger_creates_one_task_and_one_trigger_occurrence(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await create(api, tenant)
    status, run = await call(api, "POST", url(tenant, "/nightly/trigger"), tenant, key="t-1")
    assert status == 201, run
    assert (run["schedule"], run["version"]) == ("nightly", 1)
    replay = await call(api, "POST", url(tenant, "/nightly/trigger"), tenant, key="t-1")
    assert replay == (201, run), "the same key answers with the same run"

    status, task = await call(api, "GET", f"/v1/namespaces/{tenant.namespace}/tasks/"
                              f"{run['task_id']}", tenant)
    assert status == 200, task
    assert (task["queue"], task["handler"], task["input"]) == ("work", "reports.build",
                                                               {"day": "today"})
    assert count(sync_conn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                 tenant.namespace_id) == 1

    status, page = await call(api, "GET", url(tenant, "/nightly/occurrences"), tenant)
    assert status == 200, page
    (occurrence,) = page["items"]
    assert (occurrence["source"], occurrence["outcome"], occurrence["task_id"]) == (
        "TRIGGER", "FIRED", run["task_id"])
    assert occurrence["fire_at"] == run["fire_at"]
    status, got = await call(api, "GET", url(tenant, "/nightly"), tenant)
    assert got["last_task_id"] == run["task_id"]

    # Without a key (or with another) a trigger is a new run, even while paused.
    await call(api, "POST", url(tenant, "/nightly/pause"), tenant, {"reason": "x"})
    status, second = await call(api, "POST", url(tenant, "/nightly/trigger"), tenant)
    assert status == 201, second
    assert second["task_id"] != run["task_id"]
    status, page = await call(api, "GET", url(tenant, "/nightly/occurrences"), tenant)
    assert [o["task_id"] for o in page["items"]] == [run["task_id"], second["task_id"]]
    assert count(sync_conn, "SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
                 " AND action = 'schedule.triggered'", tenant.namespace_id) == 2


async def test_trigger_takes_no_fields(api: TestClient[Any, Any], tenant: Tenant, queue: str,
                                       watch: WriteWatch) -> None:
    await create(api, tenant)
    watch.reset()
    response = await api.post(url(tenant, "/nightly/trigger"), headers=headers(tenant),
                              data=json.dumps({"at": "now"}))
    await assert_problem(response, 400, "validation_failed")
    watch.assert_unchanged()
    status, _ = await call(api, "POST", url(tenant, "/nightly/trigger"), tenant, {})
    assert status == 201


# --- backfill -----------------------------------------------------------------------------------


async def _passed(db: Database, seconds: float) -> None:
    """Wait until database time is ``seconds`` later (the scheduler reads database time)."""
    moment = await db_time(db) + dt.timedelta(seconds=seconds)
    await wait_db_time_past(db, moment, timeout=seconds + 10)


async def test_backfill_runs_the_skipped_instants_once(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    # grace 0 and SKIP: every instant the scheduler reaches late is recorded as skipped.
    await create(api, tenant, "skipper", rule=EVERY_SECOND, misfire_policy="SKIP", grace_ms=0)
    await _passed(db, 2.5)
    await fire(db)
    await _passed(db, 1.2)
    await fire(db)
    status, page = await call(api, "GET", url(tenant, "/skipper/occurrences"), tenant)
    skipped = [o for o in page["items"] if o["outcome"] == "SKIPPED"]
    assert skipped, page
    assert all(o["source"] == "RULE" and o["task_id"] is None for o in skipped)
    start, end = skipped[0]["fire_at"], skipped[-1]["covered_until"]
    expected = sum(o["covered_count"] for o in skipped)
    assert expected >= 3

    body = {"start": start, "end": end, "reason": "catch up after the incident"}
    status, result = await call(api, "POST", url(tenant, "/skipper/backfill"), tenant, body)
    assert status == 200, result
    assert len(result["created"]) == expected
    assert result["already_ran"] == 0
    assert [r["fire_at"] for r in result["created"]] == sorted(r["fire_at"]
                                                               for r in result["created"])
    assert result["created"][0]["fire_at"] == start
    tasks_before = count(sync_conn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                         tenant.namespace_id)
    assert tasks_before == expected

    # The same range again: everything already ran, nothing is created.
    status, again = await call(api, "POST", url(tenant, "/skipper/backfill"), tenant,
                               {**body, "reason": "once more"})
    assert status == 200, again
    assert (again["created"], again["already_ran"]) == ([], expected)
    assert count(sync_conn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                 tenant.namespace_id) == tasks_before

    # The ledger now holds a BACKFILL row next to the skipped RULE range.
    status, page = await call(api, "GET", url(tenant, "/skipper/occurrences?limit=500"), tenant)
    backfilled = [o for o in page["items"] if o["source"] == "BACKFILL"]
    assert len(backfilled) == expected
    assert all(o["outcome"] == "FIRED" and o["task_id"] for o in backfilled)


async def test_backfill_leaves_fired_instants_and_the_future_alone(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, db: Database,
) -> None:
    created = await create(api, tenant, "runner", rule=EVERY_SECOND)  # grace 60 s: on time
    await _passed(db, 2.2)
    await fire(db)
    status, page = await call(api, "GET", url(tenant, "/runner/occurrences"), tenant)
    fired = [o for o in page["items"] if o["outcome"] == "FIRED"]
    assert fired, page
    far = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    status, result = await call(api, "POST", url(tenant, "/runner/backfill"), tenant, {
        "start": fired[0]["fire_at"], "end": far, "reason": "check"})
    assert status == 200, result
    assert result["created"] == []
    assert result["already_ran"] == len(fired)
    assert result["searched_until"] < far  # the scheduler's part is not touched
    assert created["covered_until"] < result["searched_until"]


async def test_backfill_refuses_a_range_too_large(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
) -> None:
    await create(api, tenant, "fast", rule=EVERY_SECOND)
    watch.reset()
    response = await api.post(url(tenant, "/fast/backfill"), headers=headers(tenant),
                              data=json.dumps({"start": "2020-01-01T00:00:00Z",
                                               "end": "2020-01-02T00:00:00Z",
                                               "reason": "a whole day of seconds"}))
    body = await assert_problem(response, 400, "range_too_large")
    assert "1000" in body["detail"]
    watch.assert_unchanged()


@pytest.mark.parametrize(("body", "path"), [
    ({"start": "2030-01-01", "end": "2030-01-02T00:00:00Z", "reason": "r"}, "$.start"),
    ({"start": "2030-01-01T00:00:00", "end": "2030-01-02T00:00:00Z", "reason": "r"}, "$.start"),
    ({"start": "2030-01-02T00:00:00Z", "end": "2030-01-01T00:00:00Z", "reason": "r"}, "$.end"),
    ({"start": "2030-01-01T00:00:00Z", "end": "2030-01-01T00:00:00Z", "reason": "r"}, "$.end"),
    ({"start": "0001-01-01T00:00:00Z", "end": "2030-01-01T00:00:00Z", "reason": "r"}, "$.start"),
    ({"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z", "reason": ""}, "$.reason"),
    ({"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z"}, "$.reason"),
    ({"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z", "reason": "r",
      "extra": 1}, "$"),
])
async def test_backfill_validates_its_body(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
    body: dict[str, Any], path: str,
) -> None:
    await create(api, tenant)
    watch.reset()
    response = await api.post(url(tenant, "/nightly/backfill"), headers=headers(tenant),
                              data=json.dumps(body))
    problem = await assert_problem(response, 400, "validation_failed")
    assert path in [e["path"] for e in problem["errors"]], problem
    watch.assert_unchanged()


# --- occurrences ----------------------------------------------------------------------------------


async def test_occurrences_page_through_rows_of_one_instant(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, db: Database,
) -> None:
    await create(api, tenant, "ticks", rule=EVERY_SECOND, grace_ms=0)
    await _passed(db, 2.5)
    await fire(db)
    status, page = await call(api, "GET", url(tenant, "/ticks/occurrences"), tenant)
    (skipped,) = [o for o in page["items"] if o["outcome"] == "SKIPPED"]
    status, _ = await call(api, "POST", url(tenant, "/ticks/backfill"), tenant, {
        "start": skipped["fire_at"], "end": skipped["covered_until"], "reason": "r"})
    assert status == 200
    status, everything = await call(api, "GET", url(tenant, "/ticks/occurrences?limit=500"),
                                    tenant)
    expected = [o["id"] for o in everything["items"]]
    # The BACKFILL row and the RULE row share a fire time: a page of one must not lose either.
    seen: list[str] = []
    cursor = None
    while True:
        query = "?limit=1" + (f"&cursor={cursor}" if cursor else "")
        status, page = await call(api, "GET", url(tenant, "/ticks/occurrences" + query), tenant)
        assert status == 200, page
        seen += [o["id"] for o in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    first = everything["items"][0]
    response = await api.get(url(tenant, "/ticks/occurrences"),
                             params={"after": first["fire_at"]}, headers=tenant.auth)
    later = await response.json()
    assert all(o["fire_at"] > first["fire_at"] for o in later["items"])


@pytest.mark.parametrize("query", ["?after=yesterday", "?after=2030-01-01T00:00:00",
                                   "?limit=0", "?limit=501", "?cursor=nope", "?state=FIRED"])
async def test_occurrence_queries_are_validated(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, query: str,
) -> None:
    await create(api, tenant)
    response = await api.get(url(tenant, "/nightly/occurrences" + query), headers=tenant.auth)
    code = "invalid_cursor" if "cursor" in query else "validation_failed"
    await assert_problem(response, 400, code)


# --- refusals: a stable code and nothing written ------------------------------------------------

BAD_CREATES: list[tuple[dict[str, Any], str, str]] = [
    ({"rule": {"cron": "61 * * * *", "timezone": "UTC"}}, "validation_failed", "$.rule.cron"),
    ({"rule": {"cron": "0 9 * *", "timezone": "UTC"}}, "validation_failed", "$.rule.cron"),
    ({"rule": {"cron": "0 9 * * *"}}, "validation_failed", "$.rule.timezone"),
    ({"rule": {"cron": "0 9 * * *", "timezone": "Mars/Olympus"}}, "validation_failed",
     "$.rule.timezone"),
    ({"rule": {"interval_ms": 10}}, "validation_failed", "$.rule.interval_ms"),
    ({"rule": {"interval_ms": 1000, "cron": "* * * * *"}}, "validation_failed", "$.rule"),
    ({"rule": None}, "validation_failed", "$.rule"),
    ({"misfire_policy": "SOMETIMES"}, "validation_failed", "$.misfire_policy"),
    ({"overlap_policy": "QUEUE"}, "validation_failed", "$.overlap_policy"),
    ({"catchup_window_ms": -1}, "validation_failed", "$.catchup_window_ms"),
    ({"catchup_window_ms": "60000"}, "validation_failed", "$.catchup_window_ms"),
    ({"grace_ms": 10 ** 12}, "validation_failed", "$.grace_ms"),
    ({"template": {"input": {}}}, "validation_failed", "$.template.handler"),
    ({"template": {"handler": "h", "queue": "work"}}, "validation_failed", "$.template.queue"),
    ({"template": {"handler": "h", "delay_ms": 5}}, "validation_failed", "$.template.delay_ms"),
    ({"template": {"handler": "h", "priority": 12}}, "validation_failed", "$.template.priority"),
    ({"template": "h"}, "validation_failed", "$.template"),
    ({"name": "Not A Name"}, "validation_failed", "$.name"),
    ({"queue": 7}, "validation_failed", "$.queue"),
    ({"colour": "blue"}, "validation_failed", "$.colour"),
]


@pytest.mark.parametrize(("overrides", "code", "path"), BAD_CREATES)
async def test_bad_creates_are_refused_and_write_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
    overrides: dict[str, Any], code: str, path: str,
) -> None:
    watch.reset()
    response = await api.post(url(tenant), headers=headers(tenant, key="bad-1"),
                              data=json.dumps(create_body(**overrides)))
    problem = await assert_problem(response, 400, code)
    assert path in [e["path"] for e in problem["errors"]], problem
    watch.assert_unchanged()


async def test_every_problem_of_a_create_is_listed(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
) -> None:
    response = await api.post(url(tenant), headers=headers(tenant), data=json.dumps({
        "name": "x y", "queue": "work", "rule": {"cron": "bad", "timezone": "Nowhere/Else"},
        "template": {"handler": "h"}, "misfire_policy": "NEVER", "grace_ms": -5}))
    problem = await assert_problem(response, 400, "validation_failed")
    assert {e["path"] for e in problem["errors"]} >= {
        "$.name", "$.rule.cron", "$.rule.timezone", "$.misfire_policy", "$.grace_ms"}


@pytest.mark.parametrize(("data", "code"), [
    (b"{", "malformed_json"),
    (b'{"name": "a", "name": "b"}', "duplicate_json_key"),
    (b"[]", "validation_failed"),
])
async def test_bodies_that_are_not_objects(api: TestClient[Any, Any], tenant: Tenant,
                                           queue: str, data: bytes, code: str) -> None:
    response = await api.post(url(tenant), headers=headers(tenant), data=data)
    await assert_problem(response, 400, code)


async def test_unknown_queue_is_refused(api: TestClient[Any, Any], tenant: Tenant, queue: str,
                                        watch: WriteWatch) -> None:
    watch.reset()
    response = await api.post(url(tenant), headers=headers(tenant),
                              data=json.dumps(create_body(queue="nowhere")))
    await assert_problem(response, 404, "queue_not_found")
    watch.assert_unchanged()


async def test_duplicate_name_is_already_exists(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
) -> None:
    await create(api, tenant)
    watch.reset()
    response = await api.post(url(tenant), headers=headers(tenant),
                              data=json.dumps(create_body(rule=EVERY_SECOND)))
    await assert_problem(response, 409, "already_exists")
    watch.assert_unchanged()


@pytest.mark.parametrize(("method", "suffix", "body"), [
    ("GET", "", None),
    ("DELETE", "", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("POST", "/trigger", None),
    ("POST", "/versions", {"revision": 1, "rule": DAILY, "template": TEMPLATE}),
    ("POST", "/backfill", {"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z",
                           "reason": "r"}),
    ("GET", "/occurrences", None),
])
async def test_unknown_schedule_is_schedule_not_found(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
    method: str, suffix: str, body: dict[str, Any] | None,
) -> None:
    watch.reset()
    response = await api.request(method, url(tenant, "/missing" + suffix),
                                 headers=headers(tenant),
                                 data=None if body is None else json.dumps(body))
    await assert_problem(response, 404, "schedule_not_found")
    watch.assert_unchanged()


@pytest.mark.parametrize(("body", "path"), [
    ({"rule": DAILY, "template": TEMPLATE}, "$.revision"),
    ({"revision": 0, "rule": DAILY, "template": TEMPLATE}, "$.revision"),
    ({"revision": True, "rule": DAILY, "template": TEMPLATE}, "$.revision"),
    ({"revision": 1, "rule": DAILY, "template": TEMPLATE, "name": "x"}, "$.name"),
    ({"revision": 1, "rule": {"cron": "* * *", "timezone": "UTC"}, "template": TEMPLATE},
     "$.rule.cron"),
    ({"revision": 1, "rule": DAILY}, "$.template"),
])
async def test_bad_publishes_write_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
    body: dict[str, Any], path: str,
) -> None:
    await create(api, tenant)
    watch.reset()
    response = await api.post(url(tenant, "/nightly/versions"), headers=headers(tenant),
                              data=json.dumps(body))
    problem = await assert_problem(response, 400, "validation_failed")
    assert path in [e["path"] for e in problem["errors"]], problem
    watch.assert_unchanged()


@pytest.mark.parametrize(("suffix", "data"), [
    ("/pause", b'{"reason": 5}'),
    ("/pause", b'{"why": "x"}'),
    ("/resume", b'{"reason": ""}'),
    ("/pause?now=1", None),
    ("/pause", None),
    ("/pause", b'{}'),
    ("/resume", b'{"reason": null}'),
])
async def test_bad_state_changes_write_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch,
    suffix: str, data: bytes | None,
) -> None:
    await create(api, tenant)
    watch.reset()
    response = await api.post(url(tenant, "/nightly" + suffix), headers=headers(tenant),
                              data=data)
    await assert_problem(response, 400, "validation_failed")
    watch.assert_unchanged()


# --- authorization ------------------------------------------------------------------------------


async def test_read_grant_reads_but_does_not_manage(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str, watch: WriteWatch,
) -> None:
    await create(api, tenant)
    reader = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["schedules.read"]}])
    status, _ = await call(api, "GET", url(tenant, "/nightly"), tenant, api_key=reader)
    assert status == 200
    status, _ = await call(api, "GET", url(tenant, "/nightly/occurrences"), tenant,
                           api_key=reader)
    assert status == 200
    watch.reset()
    for method, suffix in (("POST", "/nightly/pause"), ("POST", "/nightly/trigger"),
                           ("DELETE", "/nightly")):
        response = await api.request(method, url(tenant, suffix),
                                     headers=headers(tenant, api_key=reader))
        await assert_problem(response, 403, "forbidden")
    response = await api.post(url(tenant), headers=headers(tenant, api_key=reader),
                              data=json.dumps(create_body("other")))
    await assert_problem(response, 403, "forbidden")
    watch.assert_unchanged()

    manager = await make_key(db, tenant, [{"namespaces": ["*"],
                                           "actions": ["schedules.manage"]}])
    response = await api.get(url(tenant, "/nightly"), headers=headers(tenant, api_key=manager))
    await assert_problem(response, 403, "forbidden")


async def test_schedules_are_scoped_by_their_queue(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str, watch: WriteWatch,
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "other")
    await create(api, tenant, "mine")
    await create(api, tenant, "theirs", queue="other")
    scoped = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["schedules.*"],
                                          "queues": ["work"]}])
    status, page = await call(api, "GET", url(tenant), tenant, api_key=scoped)
    assert [s["name"] for s in page["items"]] == ["mine"]
    status, page = await call(api, "GET", url(tenant, "?limit=1"), tenant, api_key=scoped)
    assert ([s["name"] for s in page["items"]], page["next_cursor"]) == (["mine"], None)
    status, _ = await call(api, "GET", url(tenant, "/mine"), tenant, api_key=scoped)
    assert status == 200
    watch.reset()
    for method, suffix in (("GET", "/theirs"), ("GET", "/theirs/occurrences"),
                           ("POST", "/theirs/trigger"), ("POST", "/theirs/pause"),
                           ("DELETE", "/theirs")):
        response = await api.request(method, url(tenant, suffix),
                                     headers=headers(tenant, api_key=scoped))
        await assert_problem(response, 404, "schedule_not_found")
    response = await api.post(url(tenant), headers=headers(tenant, api_key=scoped),
                              data=json.dumps(create_body("new", queue="other")))
    await assert_problem(response, 403, "forbidden")
    watch.assert_unchanged()

    # Sees every schedule, manages those of one queue: the others are forbidden, not hidden.
    mixed = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["schedules.read"]},
        {"namespaces": ["*"], "actions": ["schedules.manage", "tasks.submit"],
         "queues": ["work"]}])
    status, _ = await call(api, "GET", url(tenant, "/theirs"), tenant, api_key=mixed)
    assert status == 200
    watch.reset()
    response = await api.post(url(tenant, "/theirs/trigger"),
                              headers=headers(tenant, api_key=mixed))
    await assert_problem(response, 403, "forbidden")
    watch.assert_unchanged()
    status, _ = await call(api, "POST", url(tenant, "/mine/trigger"), tenant, api_key=mixed)
    assert status == 201


async def test_schedules_manage_alone_does_not_make_tasks(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str, watch: WriteWatch,
) -> None:
    """Create, a new version, trigger and backfill make tasks: they also need tasks.submit on
    the schedule's queue. Pause, resume and disable make none and need only schedules.manage."""
    await pulse.create_queue(db, tenant.namespace_id, "other")
    await create(api, tenant, "mine")
    manage_only = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["schedules.*"]}])
    may_submit_elsewhere = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["schedules.*"]},
        {"namespaces": ["*"], "actions": ["tasks.submit"], "queues": ["other"]}])
    version = {"revision": 1, "rule": EVERY_SECOND, "template": TEMPLATE}
    window = {"start": "2020-01-01T00:00:00Z", "end": "2020-01-02T00:00:00Z", "reason": "r"}
    watch.reset()
    for api_key in (manage_only, may_submit_elsewhere):
        for suffix, body, key in (("", create_body("new"), None),
                                  ("", create_body("new"), "create-key"),
                                  ("/mine/versions", version, None),
                                  ("/mine/trigger", None, None),
                                  ("/mine/trigger", None, "trigger-key"),
                                  ("/mine/backfill", window, None)):
            response = await api.post(
                url(tenant, suffix), headers=headers(tenant, key, api_key=api_key),
                data=None if body is None else json.dumps(body).encode())
            problem = await assert_problem(response, 403, "forbidden")
            assert "tasks.submit" in problem["detail"]
    watch.assert_unchanged()
    status, _ = await call(api, "POST", url(tenant, "/mine/pause"), tenant, {"reason": "r"},
                           api_key=manage_only)
    assert status == 200

    allowed = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["schedules.*"]},
        {"namespaces": ["*"], "actions": ["tasks.submit"], "queues": ["work"]}])
    status, _ = await call(api, "POST", url(tenant, "/mine/resume"), tenant, {"reason": "r"},
                           api_key=allowed)
    assert status == 200
    status, body = await call(api, "POST", url(tenant), tenant, create_body("new"),
                              api_key=allowed)
    assert status == 201, body
    status, body = await call(api, "POST", url(tenant, "/new/versions"), tenant, version,
                              api_key=allowed)
    assert status == 200, body
    status, body = await call(api, "POST", url(tenant, "/new/trigger"), tenant, api_key=allowed)
    assert status == 201, body
    status, body = await call(api, "POST", url(tenant, "/new/backfill"), tenant, window,
                              api_key=allowed)
    assert status == 200, body


# --- the Python SDK against the real API ----------------------------------------------------------


async def test_the_sdk_drives_every_schedule_endpoint(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str,
) -> None:
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        created = await orbit.create_schedule(
            "sdk", queue="work", rule=EVERY_SECOND,
            template={"handler": "h", "input": {"n": 1}}, grace_ms=0)
        assert (created.state, created.revision, created.current_version) == ("ACTIVE", 1, 1)
        assert created.current is not None
        assert created.current.misfire_policy == "SKIP"
        published = await orbit.publish_schedule_version(
            "sdk", revision=1, rule=EVERY_SECOND, template={"handler": "h2"}, grace_ms=0)
        assert (published.revision, len(published.versions)) == (2, 2)
        with pytest.raises(StaleRevision):
            await orbit.publish_schedule_version("sdk", revision=1, rule=EVERY_SECOND,
                                                 template={"handler": "h3"})
        assert (await orbit.pause_schedule("sdk", "maintenance")).state == "PAUSED"
        assert (await orbit.resume_schedule("sdk", "maintenance done")).state == "ACTIVE"
        run = await orbit.trigger_schedule("sdk")
        assert run.version == 2
        await _passed(db, 2.5)
        await fire(db)
        rows = [o async for o in orbit.list_schedule_occurrences("sdk", page_size=1)]
        assert {o.source for o in rows} == {"TRIGGER", "RULE"}
        skipped = [o for o in rows if o.outcome == "SKIPPED"]
        assert skipped
        assert skipped[0].fire_at is not None
        assert skipped[-1].covered_until is not None
        backfill = await orbit.backfill_schedule("sdk", skipped[0].fire_at,
                                                 skipped[-1].covered_until, "sdk test")
        assert len(backfill.created) == sum(o.covered_count for o in skipped)
        assert [s.name async for s in orbit.list_schedules(page_size=1)] == ["sdk"]
        assert (await orbit.get_schedule("sdk")).last_task_id == backfill.created[-1].task_id
        disabled = await orbit.delete_schedule("sdk", "replaced")
        assert (disabled.state, disabled.disabled_at is not None) == ("DISABLED", True)

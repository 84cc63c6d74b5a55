"""The schedule calls of the Client against a scripted fake API: bodies, keys, retries, pages,
and the DTOs read from the answers."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_client import FakeApi, drop, ok, problem

from orbit_sdk import (
    BackfillResult,
    BadRequest,
    Client,
    Conflict,
    NotFound,
    RawJson,
    Schedule,
    ScheduleOccurrence,
    ScheduleRun,
    StaleRevision,
    ValidationError,
)

NS = "/v1/namespaces/team-a"
T0 = "2030-01-02T03:04:05.000006+00:00"
VERSION = {"version": 1, "rule": {"cron": "0 9 * * *", "timezone": "Europe/London",
                                  "calendar_version": "2026a"},
           "template": {"handler": "reports.build", "input": {"day": 1}},
           "misfire_policy": "SKIP", "overlap_policy": "ALLOW", "catchup_window_ms": 3600000,
           "grace_ms": 60000, "effective_from": T0, "created_by": "ab" * 16, "created_at": T0}
SCHEDULE = {"id": "cd" * 16, "name": "nightly", "queue": "reports", "state": "ACTIVE",
            "revision": 1, "current_version": 1, "processing_version": 1,
            "covered_until": T0, "next_fire_at": "2030-01-02T09:00:00.000000+00:00",
            "check_at": "2030-01-02T09:00:00.000000+00:00", "buffered_fire_at": None,
            "last_task_id": None, "last_fired_at": None, "created_at": T0, "updated_at": T0,
            "disabled_at": None, "versions": [VERSION]}
OCCURRENCE = {"id": "ef" * 16, "fire_at": T0, "version": 1, "source": "RULE",
              "outcome": "SKIPPED", "reason": "misfire",
              "covered_until": "2030-01-02T03:04:08.000006+00:00", "covered_count": 3,
              "task_id": None, "fired_at": T0, "lateness_ms": 4000}


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, Client]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app)
    await server.start_server()
    client = Client(str(server.make_url("")), "key-123", "team-a", backoff_initial=0.001,
                    backoff_max=0.01, max_retries=3)
    yield fake, client
    await client.close()
    await server.close()


def sent(fake: FakeApi, index: int = 0) -> Any:
    return json.loads(fake.seen[index].body)


async def test_create_sends_the_version_and_keeps_its_key_across_retries(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/schedules", drop(), problem(503, "commit_outcome_unknown"),
            ok(SCHEDULE, 201))
    schedule = await client.create_schedule(
        "nightly", queue="reports", rule={"cron": "0 9 * * *", "timezone": "Europe/London"},
        template={"handler": "reports.build", "input": RawJson('{"amount": 1.10}')},
        misfire_policy="MERGE", grace_ms=0)
    assert isinstance(schedule, Schedule)
    assert (schedule.name, schedule.state, schedule.revision) == ("nightly", "ACTIVE", 1)
    assert schedule.next_fire_at == dt.datetime(2030, 1, 2, 9, tzinfo=dt.UTC)
    assert schedule.current is not None
    assert schedule.current.rule["calendar_version"] == "2026a"
    assert schedule.current.template["handler"] == "reports.build"
    assert len(fake.seen) == 3
    assert len({s.headers["Idempotency-Key"] for s in fake.seen}) == 1
    assert b'"input":{"amount": 1.10}' in fake.seen[0].body
    assert json.loads(fake.seen[0].body, parse_float=Decimal) == {
        "name": "nightly", "queue": "reports",
        "rule": {"cron": "0 9 * * *", "timezone": "Europe/London"},
        "template": {"handler": "reports.build", "input": {"amount": Decimal("1.10")}},
        "misfire_policy": "MERGE", "grace_ms": 0}


async def test_publish_is_compare_and_set(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/schedules/nightly/versions",
            problem(409, "stale_revision", "schedule 'nightly' is at revision 3, not 2"))
    with pytest.raises(StaleRevision):
        await client.publish_schedule_version(
            "nightly", revision=2, rule={"interval_ms": 60000}, template={"handler": "h"},
            overlap_policy="BUFFER_ONE", idempotency_key="pub-1")
    assert len(fake.seen) == 1, "an answered conflict is not retried"
    assert fake.seen[0].headers["Idempotency-Key"] == "pub-1"
    assert sent(fake) == {"revision": 2, "rule": {"interval_ms": 60000},
                          "template": {"handler": "h"}, "overlap_policy": "BUFFER_ONE"}


async def test_state_changes_use_their_methods_and_send_their_reasons(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/schedules/nightly/pause", drop(), ok({**SCHEDULE, "state": "PAUSED"}))
    fake.on("POST", f"{NS}/schedules/nightly/resume", ok(SCHEDULE))
    fake.on("DELETE", f"{NS}/schedules/nightly",
            ok({**SCHEDULE, "state": "DISABLED", "disabled_at": T0}))
    assert (await client.pause_schedule("nightly", "quarter close")).state == "PAUSED"
    assert (await client.resume_schedule("nightly", "quarter closed")).state == "ACTIVE"
    disabled = await client.delete_schedule("nightly", "replaced")
    assert disabled.state == "DISABLED"
    assert disabled.disabled_at is not None
    assert [(s.method, s.body) for s in fake.seen] == [
        ("POST", b'{"reason":"quarter close"}'), ("POST", b'{"reason":"quarter close"}'),
        ("POST", b'{"reason":"quarter closed"}'), ("DELETE", b'{"reason":"replaced"}')]
    assert fake.seen[0].headers["Idempotency-Key"] == fake.seen[1].headers["Idempotency-Key"]


async def test_trigger_retries_with_one_key(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    run = {"schedule": "nightly", "fire_at": T0, "task_id": "01" * 16, "version": 2}
    fake.on("POST", f"{NS}/schedules/nightly/trigger", drop(), ok(run, 201))
    got = await client.trigger_schedule("nightly")
    assert isinstance(got, ScheduleRun)
    assert (got.task_id, got.version, got.schedule) == ("01" * 16, 2, "nightly")
    assert got.fire_at == dt.datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    keys = {s.headers.get("Idempotency-Key") for s in fake.seen}
    assert len(fake.seen) == 2
    assert len(keys) == 1
    assert None not in keys
    assert fake.seen[0].body == b""


async def test_backfill_sends_utc_times(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    result = {"schedule": "nightly", "start": "2030-01-01T00:00:00+00:00",
              "end": "2030-01-03T00:00:00+00:00", "searched_until": T0,
              "created": [{"fire_at": "2030-01-01T09:00:00.000000+00:00", "task_id": "02" * 16,
                           "version": 1}],
              "already_ran": 1}
    fake.on("POST", f"{NS}/schedules/nightly/backfill", ok(result))
    shanghai = dt.timezone(dt.timedelta(hours=8))
    got = await client.backfill_schedule(
        "nightly", dt.datetime(2030, 1, 1, 8, tzinfo=shanghai), "2030-01-03T00:00:00Z",
        "outage INC-7")
    assert isinstance(got, BackfillResult)
    assert (got.already_ran, [r.task_id for r in got.created]) == (1, ["02" * 16])
    assert got.searched_until == dt.datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert sent(fake) == {"start": "2030-01-01T00:00:00.000000+00:00",
                          "end": "2030-01-03T00:00:00Z", "reason": "outage INC-7"}
    assert fake.seen[0].headers["Idempotency-Key"]
    with pytest.raises(ValueError, match="naive"):
        await client.backfill_schedule("nightly", dt.datetime(2030, 1, 1),  # noqa: DTZ001
                                       "2030-01-02T00:00:00Z", "r")


async def test_lists_follow_cursors(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    schedules = iter([
        {"items": [{**SCHEDULE, "name": "a", "versions": None}], "next_cursor": "c1"},
        {"items": [{**SCHEDULE, "name": "b"}], "next_cursor": None},
    ])
    fake.on("GET", f"{NS}/schedules", lambda request, body: web.json_response(next(schedules)))
    names = [s.name async for s in client.list_schedules(after="0", page_size=1)]
    assert names == ["a", "b"]
    assert [s.query for s in fake.seen] == [{"after": "0", "limit": "1"},
                                            {"after": "0", "limit": "1", "cursor": "c1"}]

    fake.seen.clear()
    fake.on("GET", f"{NS}/schedules/nightly/occurrences",
            ok({"items": [OCCURRENCE, {**OCCURRENCE, "source": "BACKFILL", "outcome": "FIRED",
                                       "task_id": "03" * 16, "covered_until": None,
                                       "covered_count": 1, "reason": None}],
                "next_cursor": None}))
    rows = [o async for o in client.list_schedule_occurrences(
        "nightly", after=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))]
    assert all(isinstance(o, ScheduleOccurrence) for o in rows)
    assert [(o.source, o.outcome, o.covered_count) for o in rows] == [
        ("RULE", "SKIPPED", 3), ("BACKFILL", "FIRED", 1)]
    assert rows[0].covered_until == dt.datetime(2030, 1, 2, 3, 4, 8, 6, tzinfo=dt.UTC)
    assert fake.seen[0].query == {"after": "2030-01-01T00:00:00.000000+00:00"}


@pytest.mark.parametrize(("status", "code", "cls"), [
    (404, "schedule_not_found", NotFound),
    (409, "schedule_disabled", Conflict),
    (409, "already_exists", Conflict),
    (400, "range_too_large", BadRequest),
    (400, "validation_failed", ValidationError),
])
async def test_schedule_problems_become_exceptions(
        api: tuple[FakeApi, Client], status: int, code: str, cls: type[Exception]) -> None:
    fake, client = api
    fake.on("GET", f"{NS}/schedules/nightly", problem(status, code, "no"))
    with pytest.raises(cls) as caught:
        await client.get_schedule("nightly")
    assert getattr(caught.value, "code", None) == code


def test_dtos_tolerate_missing_fields() -> None:
    schedule = Schedule.from_json({"id": "x", "name": "n"})
    assert (schedule.versions, schedule.current, schedule.next_fire_at) == ((), None, None)
    assert ScheduleOccurrence.from_json({}).covered_count == 1
    assert BackfillResult.from_json({"created": "nope"}).created == ()

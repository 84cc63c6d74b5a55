"""The backfill preview (schedule_commands.preview_backfill) against the real database: it lists
exactly the instants and versions that the backfill then creates, refuses what the backfill
refuses, and writes nothing."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.pulse import schedule_commands, schedules
from orbit_common.pulse.schedule_commands import RangeTooLarge
from tests.conftest import Tenant
from tests.integration.api.conftest import WriteWatch
from tests.integration.api.test_schedules_api import SCHEDULE_TABLES
from tests.support import pulse
from tests.support.lease_fixtures import wait_db_time_past

VERSION = {"rule": {"interval_ms": 1000}, "template": {"handler": "reports.build"},
           "misfire_policy": "SKIP", "grace_ms": 0}


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, SCHEDULE_TABLES)


async def principal_of(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))


def spec(**overrides: Any) -> schedule_commands.VersionSpec:
    doc = {**VERSION, **overrides}
    return schedule_commands.parse_version(doc, doc)


async def every_second(db: Database, tenant: Tenant, principal: credentials.Principal
                       ) -> dict[str, Any]:
    """An every-second schedule with two versions, whose scheduler skipped (grace 0) the
    instants since it was created; returns the schedule's view after that."""
    await pulse.create_queue(db, tenant.namespace_id, "work")
    created = await schedule_commands.create_schedule(
        db, principal, namespace=tenant.namespace, name="ticks", queue="work", spec=spec())
    await schedule_commands.publish_version(
        db, principal, namespace=tenant.namespace, name="ticks", revision=1,
        spec=spec(template={"handler": "reports.build", "input": {"v": 2}}))
    await wait_db_time_past(db, dt.datetime.fromisoformat(created.body["created_at"])
                            + dt.timedelta(seconds=1.5))
    await db.transaction("test.fire", schedules.fire_due)
    return await schedule_commands.get_schedule(db, principal, namespace=tenant.namespace,
                                                name="ticks")


async def test_the_preview_is_what_the_backfill_then_creates_and_writes_nothing(
    db: Database, tenant: Tenant, watch: WriteWatch,
) -> None:
    principal = await principal_of(db, tenant)
    view = await every_second(db, tenant, principal)
    created_at = dt.datetime.fromisoformat(view["created_at"])
    covered = dt.datetime.fromisoformat(view["covered_until"])
    start = created_at.replace(microsecond=0) - dt.timedelta(seconds=5)
    # One instant already ran (an earlier backfill): the preview leaves it out, and counts it.
    done = await schedule_commands.backfill(
        db, principal, namespace=tenant.namespace, name="ticks", start=start,
        end=start + dt.timedelta(seconds=1), reason="the first one")
    assert len(done.body["created"]) == 1

    watch.reset()
    preview = await schedule_commands.preview_backfill(
        db, principal, namespace=tenant.namespace, name="ticks", start=start, end=covered)
    watch.assert_unchanged()  # no task, occurrence, audit row or idempotency record
    planned = [(i["fire_at"], i["version"]) for i in preview["instants"]]
    assert preview["already_ran"] == 1
    assert preview["versions"] == [1, 2]  # before the publication 1, after it 2
    assert len(planned) >= 5
    assert [at for at, _ in planned] == sorted(at for at, _ in planned)
    assert planned[0][0] == as_utc(start + dt.timedelta(seconds=1)).isoformat(
        timespec="microseconds")

    result = await schedule_commands.backfill(
        db, principal, namespace=tenant.namespace, name="ticks", start=start, end=covered,
        reason="catch up")
    assert [(r["fire_at"], r["version"]) for r in result.body["created"]] == planned
    assert result.body["already_ran"] == preview["already_ran"]
    assert result.body["searched_until"] == preview["searched_until"]
    assert watch.delta()["pulse_tasks"] == len(planned)

    again = await schedule_commands.preview_backfill(
        db, principal, namespace=tenant.namespace, name="ticks", start=start, end=covered)
    assert (again["instants"], again["versions"]) == ([], [])
    assert again["already_ran"] == len(planned) + 1


async def test_the_preview_refuses_what_the_backfill_refuses(
    db: Database, tenant: Tenant, watch: WriteWatch,
) -> None:
    principal = await principal_of(db, tenant)
    await pulse.create_queue(db, tenant.namespace_id, "work")
    await schedule_commands.create_schedule(
        db, principal, namespace=tenant.namespace, name="fast", queue="work", spec=spec())
    day = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    watch.reset()
    with pytest.raises(RangeTooLarge, match=str(schedule_commands.MAX_BACKFILL)):
        await schedule_commands.preview_backfill(
            db, principal, namespace=tenant.namespace, name="fast", start=day,
            end=day + dt.timedelta(days=1))
    with pytest.raises(errors.ValidationFailed):
        await schedule_commands.preview_backfill(
            db, principal, namespace=tenant.namespace, name="fast", start=day, end=day)
    with pytest.raises(schedule_commands.ScheduleNotFound):
        await schedule_commands.preview_backfill(
            db, principal, namespace=tenant.namespace, name="slow", start=day,
            end=day + dt.timedelta(seconds=10))
    await schedule_commands.set_state(db, principal, namespace=tenant.namespace, name="fast",
                                      target="DISABLED", reason="retired")
    watch.reset()
    with pytest.raises(schedule_commands.ScheduleDisabled):
        await schedule_commands.preview_backfill(
            db, principal, namespace=tenant.namespace, name="fast", start=day,
            end=day + dt.timedelta(seconds=10))
    watch.assert_unchanged()

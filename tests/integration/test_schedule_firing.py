"""Schedule firing against the real database: the ledger, catch-up after an outage under each
misfire policy, overlap policies, a version published over a backlog, racing replicas.

Outages are simulated the honest way: the schedule's rows are written as if it had been
created three hours ago and no scheduler had run since (database time decides everything).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import credentials
from orbit_common.pulse import interventions, schedules
from tests.conftest import Tenant
from tests.support import invariants
from tests.support.lease_fixtures import make_queue, scalar, wait_db_time_past


def _iso(at: dt.datetime) -> str:
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


async def make_schedule(db: Database, tenant: Tenant, queue_id: bytes, *, rule: dict[str, Any],
                        since: dt.timedelta, misfire: str = "SKIP", overlap: str = "ALLOW",
                        catchup_ms: int = 3_600_000, grace_ms: int = 60_000,
                        template: str = '{"handler": "noop", "input": {"v": 1}}') -> bytes:
    """A schedule created ``since`` ago (version 1 effective then) that never fired."""
    schedule_id = ids.new_id()

    async def body(cur: Any) -> None:
        now = await db_now(cur)
        born = now - since
        await cur.execute(
            "INSERT INTO pulse_schedules (namespace_id, id, queue_id, name, state, revision,"
            " current_version, processing_version, covered_until, check_at, created_at,"
            " updated_at) VALUES (%s, %s, %s, %s, 'ACTIVE', 1, 1, 1, %s, %s, %s, %s)",
            (tenant.namespace_id, schedule_id, queue_id, f"s-{schedule_id.hex()[:8]}",
             to_db(born), to_db(born), to_db(born), to_db(born)))
        await cur.execute(
            "INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule,"
            " template, misfire_policy, overlap_policy, catchup_window_ms, grace_ms,"
            " effective_from, created_by, created_at)"
            " VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s, %s, 'test', %s)",
            (tenant.namespace_id, schedule_id, jsondoc.dumps(rule), template, misfire, overlap,
             catchup_ms, grace_ms, to_db(born), to_db(born)))

    await db.transaction("test.schedule", body)
    return schedule_id


async def fire_until_idle(db: Database, rounds: int = 200) -> int:
    """Run firing steps until one finds nothing due; returns how many ledger rows they wrote
    (for every schedule in the database: other tests' schedules fire too)."""
    written = 0
    for _ in range(rounds):
        stats = await db.transaction("test.fire", lambda cur: schedules.fire_due(cur, 64))
        written += stats.fired + stats.skipped + stats.merged
        if stats.fired + stats.skipped + stats.merged == 0:
            return written
    raise AssertionError("the schedules never became idle")


async def ledger(db: Database, tenant: Tenant, schedule_id: bytes) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(
            "SELECT o.*, t.input FROM pulse_schedule_occurrences o LEFT JOIN pulse_tasks t"
            " ON t.namespace_id = o.namespace_id AND t.id = o.task_id"
            " WHERE o.namespace_id = %s AND o.schedule_id = %s ORDER BY o.fire_at, o.source",
            (tenant.namespace_id, schedule_id))
        return list(await cur.fetchall())
    return await db.read("test.ledger", body)


def count_instants(start: dt.datetime, end: dt.datetime, step: dt.timedelta) -> int:
    """Multiples of ``step`` (from the hour) in ``[start, end)``: an independent reference."""
    at = start.replace(minute=0, second=0, microsecond=0)
    while at < start:
        at += step
    n = 0
    while at < end:
        n, at = n + 1, at + step
    return n


async def progress(db: Database, tenant: Tenant, schedule_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM pulse_schedules WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, schedule_id))
        return dict(await cur.fetchone())
    return await db.read("test.progress", body)


def planned_instants(rows: list[dict[str, Any]]) -> int:
    return sum(r["covered_count"] for r in rows if r["source"] == "RULE")


async def check_invariants(db: Database, tenant: Tenant) -> None:
    assert await invariants.check_db(db, [tenant.namespace_id]) == []


async def test_fires_each_instant_once_with_one_task(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    since = dt.timedelta(minutes=5, seconds=30)
    sid = await make_schedule(db, tenant, queue.id, rule={"cron": "* * * * *", "timezone": "UTC"},
                              since=since, misfire="EACH", grace_ms=3_600_000)
    born = as_utc((await progress(db, tenant, sid))["covered_until"])
    await fire_until_idle(db)
    rows = await ledger(db, tenant, sid)
    covered = as_utc((await progress(db, tenant, sid))["covered_until"])
    expected = count_instants(born, covered, dt.timedelta(minutes=1))
    assert expected in (5, 6)
    assert [r["outcome"] for r in rows] == ["FIRED"] * expected
    assert len({r["task_id"] for r in rows}) == expected
    # Again: nothing new for it (the ledger and the progress committed together). Firing is
    # global, so other tests' schedules may fire meanwhile; this schedule's ledger is the check.
    await fire_until_idle(db)
    again = await ledger(db, tenant, sid)
    assert len(again) >= expected
    assert planned_instants(again) == count_instants(
        born, as_utc((await progress(db, tenant, sid))["covered_until"]),
        dt.timedelta(minutes=1))
    await check_invariants(db, tenant)


@pytest.mark.parametrize("policy", ["SKIP", "MERGE", "EACH"])
async def test_catch_up_after_a_three_hour_outage(db: Database, tenant: Tenant,
                                                  policy: str) -> None:
    queue = await make_queue(db, tenant)
    sid = await make_schedule(db, tenant, queue.id,
                              rule={"cron": "*/5 * * * *", "timezone": "UTC"},
                              since=dt.timedelta(hours=3), misfire=policy,
                              catchup_ms=3_600_000, grace_ms=60_000)
    born = as_utc((await progress(db, tenant, sid))["covered_until"])
    await fire_until_idle(db)
    rows = await ledger(db, tenant, sid)
    covered = as_utc((await progress(db, tenant, sid))["covered_until"])
    now = covered
    outside = [r for r in rows if r["reason"] == "outside_catchup_window"]
    inside = [r for r in rows if r["reason"] != "outside_catchup_window"]
    # Every planned instant of the three hours is in the ledger exactly once.
    assert planned_instants(rows) == count_instants(born, covered, dt.timedelta(minutes=5))
    # Older than the catch-up window: skipped as one range, under every policy.
    assert len(outside) == 1
    assert outside[0]["outcome"] == "SKIPPED"
    assert as_utc(outside[0]["covered_until"]) <= now - dt.timedelta(hours=1) + \
        dt.timedelta(minutes=5)
    # Inside the window: the last hour's instants (12, or 11 and a fresh one within grace).
    late = [r for r in inside if r["reason"] == "misfire" or r["outcome"] == "FIRED"]
    assert sum(r["covered_count"] for r in late) in (11, 12, 13)
    if policy == "SKIP":
        assert {r["outcome"] for r in inside if r["reason"]} == {"SKIPPED"}
        assert all(r["task_id"] is None for r in inside if r["reason"])
    elif policy == "MERGE":
        merged = [r for r in inside if r["outcome"] == "MERGED"]
        assert len(merged) == 1
        assert merged[0]["task_id"] is not None
        assert merged[0]["covered_count"] >= 10
    else:
        assert {r["outcome"] for r in inside} == {"FIRED"}
        assert len({r["task_id"] for r in inside}) == len(inside) >= 11
    await check_invariants(db, tenant)


async def test_overlap_skip_and_buffer_one(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    skip = await make_schedule(db, tenant, queue.id, rule={"cron": "* * * * *", "timezone": "UTC"},
                               since=dt.timedelta(minutes=4, seconds=30), overlap="SKIP",
                               misfire="EACH", grace_ms=3_600_000)
    buffer = await make_schedule(db, tenant, queue.id,
                                 rule={"cron": "* * * * *", "timezone": "UTC"},
                                 since=dt.timedelta(minutes=4, seconds=30),
                                 overlap="BUFFER_ONE", misfire="EACH", grace_ms=3_600_000)
    await fire_until_idle(db)
    # No worker runs: the first run's task stays WAITING, so it is "unfinished".
    skip_rows = await ledger(db, tenant, skip)
    n = len(skip_rows)  # 4 or 5 whole minutes in the last 4.5 minutes
    assert n in (4, 5)
    assert [r["outcome"] for r in skip_rows] == ["FIRED"] + ["SKIPPED"] * (n - 1)
    assert {r["reason"] for r in skip_rows[1:]} == {"overlap"}
    buffer_rows = await ledger(db, tenant, buffer)
    # One instant waits in the buffer (no ledger row yet); the rest are skipped.
    assert [r["outcome"] for r in buffer_rows] == ["FIRED"] + ["SKIPPED"] * (n - 2)
    buffered = await scalar(db, "SELECT buffered_fire_at FROM pulse_schedules"
                            " WHERE namespace_id = %s AND id = %s", tenant.namespace_id, buffer)
    assert buffered is not None
    # The previous run finishes (cancelled: a finished task, counters kept by the same
    # transaction); the buffered instant fires on the schedule's next check.
    principal = await db.read("test.auth",
                              lambda cur: credentials.authenticate(cur, tenant.api_key))
    await interventions.cancel_task(db, principal, namespace=tenant.namespace,
                                    task_id=buffer_rows[0]["task_id"], reason="done")
    check_at = as_utc(await scalar(db, "SELECT check_at FROM pulse_schedules"
                                   " WHERE namespace_id = %s AND id = %s",
                                   tenant.namespace_id, buffer))
    await wait_db_time_past(db, check_at)
    await fire_until_idle(db)
    after = await ledger(db, tenant, buffer)
    fired = [r for r in after if r["outcome"] == "FIRED"]
    assert len(fired) == 2
    assert as_utc(fired[1]["fire_at"]) == as_utc(buffered)


async def test_a_new_version_does_not_rewrite_the_old_backlog(db: Database,
                                                             tenant: Tenant) -> None:
    from orbit_common.pulse import schedule_rules

    queue = await make_queue(db, tenant)
    sid = await make_schedule(db, tenant, queue.id,
                              rule={"cron": "*/10 * * * *", "timezone": "UTC"},
                              since=dt.timedelta(hours=1), misfire="EACH",
                              catchup_ms=7_200_000, grace_ms=60_000)

    async def publish(cur: Any) -> None:
        now = await db_now(cur)
        rule = {"cron": "0 * * * *", "timezone": "UTC"}
        schedule_rules.parse_rule(rule)
        await cur.execute(
            "INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule,"
            " template, misfire_policy, overlap_policy, catchup_window_ms, grace_ms,"
            " effective_from, created_by, created_at) VALUES (%s, %s, 2, %s,"
            " '{\"handler\": \"noop\", \"input\": {\"v\": 2}}', 'EACH', 'ALLOW', 7200000, 60000,"
            " %s, 'test', %s)",
            (tenant.namespace_id, sid, jsondoc.dumps(rule), to_db(now), to_db(now)))
        await cur.execute("UPDATE pulse_schedules SET current_version = 2, revision = 2,"
                          " check_at = %s WHERE namespace_id = %s AND id = %s",
                          (to_db(now), tenant.namespace_id, sid))

    await db.transaction("test.publish", publish)
    await fire_until_idle(db)
    rows = await ledger(db, tenant, sid)
    # The hour of backlog (six 10-minute instants) ran with version 1 and its template.
    assert [r["version"] for r in rows] == [1] * 6
    assert all(jsondoc.loads_strict(r["input"]) == {"v": 1} for r in rows)
    assert await scalar(db, "SELECT processing_version FROM pulse_schedules"
                        " WHERE namespace_id = %s AND id = %s", tenant.namespace_id, sid) == 2


async def test_racing_replicas_fire_each_instant_once(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    sids = [await make_schedule(db, tenant, queue.id,
                                rule={"cron": "* * * * *", "timezone": "UTC"},
                                since=dt.timedelta(minutes=10), misfire="EACH",
                                grace_ms=3_600_000) for _ in range(20)]

    async def replica() -> None:
        for _ in range(30):
            stats = await db.transaction("test.fire", lambda cur: schedules.fire_due(cur, 4))
            if stats.schedules == 0:
                return

    await asyncio.gather(*(replica() for _ in range(4)))
    for sid in sids:
        rows = await ledger(db, tenant, sid)
        assert [r["outcome"] for r in rows] == ["FIRED"] * 10
        assert len({r["task_id"] for r in rows}) == 10
    total = await scalar(db, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                         tenant.namespace_id)
    assert total == 200
    await check_invariants(db, tenant)

"""At most one run per schedule instant is a database fact (issue 10 §1.7; specification 001 §4).

``uq_occurrences_run (namespace_id, schedule_id, run_fire_at)`` admits one FIRED or MERGED row
per (schedule, UTC fire time), whatever its source; SKIPPED rows (``run_fire_at`` NULL) never
collide. The application serializes its own writers on the schedule row, so these tests race a
writer that does not: a transaction that records a TRIGGER run of an instant (task and ledger
row, as a trigger whose database time was exactly that instant would) and holds it open while
the real scheduler or the real backfill command writes the same instant. Exactly one run
survives, the loser answers like any instant that already ran (the scheduler records it as
SKIPPED ``already_ran``, backfill counts it in ``already_ran``, trigger is ``409
occurrence_already_ran``), and nothing answers with a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import aiomysql
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import INIT_COMMAND, Database, DatabaseUrl
from orbit_common.model import ids
from orbit_common.platform import credentials
from orbit_common.pulse import schedule_commands, schedules, tasks
from orbit_common.pulse.workers import QueueRef
from tests.conftest import Tenant
from tests.integration.test_schedule_firing import fire_until_idle, make_schedule
from tests.support import invariants
from tests.support.lease_fixtures import make_queue
from tests.support.waiting import statements_waiting, until

EVERY_TEN_MINUTES = {"cron": "*/10 * * * *", "timezone": "UTC"}
TEN_MINUTES = dt.timedelta(minutes=10)


def _iso(at: dt.datetime) -> str:
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _first_instant_from(at: dt.datetime) -> dt.datetime:
    """The first */10 instant at or after ``at``."""
    floor = at.replace(minute=at.minute - at.minute % 10, second=0, microsecond=0)
    return floor if floor == at else floor + TEN_MINUTES


async def _schedule_row(db: Database, tenant: Tenant, schedule_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute(
            "SELECT s.id, s.name, s.covered_until, q.name AS queue_name FROM pulse_schedules s"
            " JOIN pulse_queues q ON q.namespace_id = s.namespace_id AND q.id = s.queue_id"
            " WHERE s.namespace_id = %s AND s.id = %s", (tenant.namespace_id, schedule_id))
        return dict(await cur.fetchone())
    return await db.read("test.schedule", body)


async def _runs(db: Database, tenant: Tenant, schedule_id: bytes,
                fire_at: dt.datetime) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(
            "SELECT source, outcome, reason, task_id FROM pulse_schedule_occurrences"
            " WHERE namespace_id = %s AND schedule_id = %s AND fire_at = %s ORDER BY source",
            (tenant.namespace_id, schedule_id, to_db(fire_at)))
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.runs", body)


async def _task_count(db: Database, tenant: Tenant) -> int:
    async def body(cur: Any) -> int:
        await cur.execute("SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s",
                          (tenant.namespace_id,))
        return int((await cur.fetchone())["n"])
    return await db.read("test.count", body)


async def _trigger_task(cur: Any, tenant: Tenant, schedule_id: bytes) -> bytes:
    """The task of a TRIGGER run: the real insert (counters, owner, accepted event)."""
    row = await _schedule_row_on(cur, tenant, schedule_id)
    versions = await schedules.load_versions(cur, tenant.namespace_id, schedule_id, 1, 1)
    queue = (await tasks.queues_by_name(cur, tenant.namespace_id, [row["queue_name"]]))[
        row["queue_name"]]
    spec = schedules.template_spec(tenant.namespace_id, schedule_id, versions[1], queue.name)
    item = tasks.Item(spec=spec, path="$.template", owner_kind="SCHEDULE", owner_id=schedule_id)
    await tasks.insert_generated(cur, tenant.namespace_id, [(item, queue)], await db_now(cur))
    return item.task_id


@contextlib.asynccontextmanager
async def held_trigger_run(db: Database, tenant: Tenant, schedule_id: bytes,
                           fire_at: dt.datetime, *, task_before: bool = False,
                           ) -> AsyncIterator[Any]:
    """An open transaction holding a TRIGGER run of ``fire_at`` (its ledger row, and its task
    unless ``task_before``: then the task was committed first and only the ledger row is held,
    so no queue counter row is locked), without the schedule row's lock. The caller commits or
    rolls back through the yielded connection."""
    task_id = None
    if task_before:
        task_id = await db.transaction(
            "test.trigger_task", lambda cur: _trigger_task(cur, tenant, schedule_id))
    async with db.pool.acquire() as conn, conn.cursor(aiomysql.DictCursor) as cur:
        await cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        await conn.begin()
        if task_id is None:
            task_id = await _trigger_task(cur, tenant, schedule_id)
        await cur.execute(
            schedules.INSERT_OCCURRENCES + " VALUES " + schedules.OCCURRENCE_ROW,
            (tenant.namespace_id, ids.new_id(), schedule_id, to_db(fire_at), 1, "TRIGGER",
             "FIRED", None, None, 1, task_id, to_db(await db_now(cur)), 0))
        try:
            yield conn
        finally:
            await conn.rollback()  # a no-op after the caller's commit


async def _schedule_row_on(cur: Any, tenant: Tenant, schedule_id: bytes) -> dict[str, Any]:
    await cur.execute(
        "SELECT s.id, q.name AS queue_name FROM pulse_schedules s JOIN pulse_queues q"
        " ON q.namespace_id = s.namespace_id AND q.id = s.queue_id"
        " WHERE s.namespace_id = %s AND s.id = %s", (tenant.namespace_id, schedule_id))
    return dict(await cur.fetchone())


# The statements a contender waits in while the held run's transaction is open: its ledger
# insert (on uq_occurrences_run), or, when it creates a task first, its queue counter update
# (the held transaction created its task too) -- after its own read of the ledger, so the run
# it did not see is found by the 1062 that follows.
LEDGER_INSERT = "%INSERT INTO pulse_schedule_occurrences%"
COUNTER_UPDATE = "%UPDATE pulse_queues%unfinished_tasks%"


async def _blocked(sync_conn: pymysql.connections.Connection[Any], like: str) -> None:
    """Until a statement matching ``like`` waits on the held transaction's locks."""
    await until(lambda: statements_waiting(sync_conn, like) >= 1,
                message=f"a statement like {like!r} waiting on the held run")


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> QueueRef:
    return await make_queue(db, tenant)


# --- the database fact --------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("RULE", "BACKFILL"), ("RULE", "TRIGGER"),
                                               ("BACKFILL", "TRIGGER")])
async def test_the_unique_key_admits_one_run_per_instant(
    db: Database, tenant: Tenant, queue: QueueRef,
    sync_conn: pymysql.connections.Connection[Any], first: str, second: str,
) -> None:
    """Two transactions insert a run of one instant with different sources: the second waits
    on the key and then fails with 1062 on uq_occurrences_run once the first commits."""
    schedule_id = await make_schedule(db, tenant, queue.id, rule=EVERY_TEN_MINUTES,
                                      since=dt.timedelta(minutes=1))
    fire_at = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)

    def row(source: str, outcome: str = "FIRED") -> tuple[Any, ...]:
        return (tenant.namespace_id, ids.new_id(), schedule_id, to_db(fire_at), 1, source,
                outcome, None, None, 1, None if outcome == "SKIPPED" else ids.new_id(),
                to_db(fire_at), 0)

    insert = schedules.INSERT_OCCURRENCES + " VALUES " + schedules.OCCURRENCE_ROW
    async with db.pool.acquire() as a, db.pool.acquire() as b:
        ca, cb = await a.cursor(), await b.cursor()
        await a.begin()
        await b.begin()
        await ca.execute(insert, row(first))
        racing = asyncio.create_task(cb.execute(insert, row(second)))
        await _blocked(sync_conn, LEDGER_INSERT)
        assert not racing.done()
        await a.commit()
        with pytest.raises(pymysql.err.IntegrityError) as raised:
            await racing
        assert raised.value.args[0] == 1062
        assert "uq_occurrences_run" in str(raised.value.args[1])
        await b.rollback()
        # A SKIPPED row of the same instant is no run: admitted next to the one run.
        await cb.execute(insert, row("TRIGGER" if first != "TRIGGER" else "RULE", "SKIPPED"))
        await b.commit()
    found = await _runs(db, tenant, schedule_id, fire_at)
    assert sorted((r["source"], r["outcome"]) for r in found) == sorted(
        [(first, "FIRED"), ("TRIGGER" if first != "TRIGGER" else "RULE", "SKIPPED")])
    assert invariants.codes(invariants.check(sync_conn, [tenant.namespace_id])) == set()


# --- the scheduler against a racing trigger run -------------------------------------------------


@pytest.mark.parametrize("other_commits", [True, False], ids=["trigger-commits",
                                                              "trigger-rolls-back"])
async def test_the_scheduler_and_a_trigger_race_for_one_instant(
    db: Database, tenant: Tenant, queue: QueueRef,
    sync_conn: pymysql.connections.Connection[Any], other_commits: bool,
) -> None:
    schedule_id = await make_schedule(db, tenant, queue.id, rule=EVERY_TEN_MINUTES,
                                      since=dt.timedelta(minutes=25), misfire="EACH")
    row = await _schedule_row(db, tenant, schedule_id)
    contested = _first_instant_from(as_utc(row["covered_until"]))
    async with held_trigger_run(db, tenant, schedule_id, contested) as other:
        firing = asyncio.create_task(db.transaction("test.fire", schedules.fire_due))
        await _blocked(sync_conn, COUNTER_UPDATE)
        assert not firing.done()
        await (other.commit() if other_commits else other.rollback())
        stats = await firing  # no error: the scheduler keeps going
    assert stats.fired >= 1
    await fire_until_idle(db)

    runs = await _runs(db, tenant, schedule_id, contested)
    assert [r for r in runs if r["outcome"] != "SKIPPED"] == [
        r for r in runs if r["source"] == ("TRIGGER" if other_commits else "RULE")]
    assert len([r for r in runs if r["outcome"] != "SKIPPED"]) == 1
    if other_commits:
        assert [(r["source"], r["outcome"], r["reason"]) for r in runs] == [
            ("RULE", "SKIPPED", "already_ran"), ("TRIGGER", "FIRED", None)]
    # Every later instant ran once, by the rule.
    later = await _runs(db, tenant, schedule_id, contested + TEN_MINUTES)
    assert [(r["source"], r["outcome"]) for r in later] == [("RULE", "FIRED")]
    # One task per run, nothing else.
    with sync_conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                    " AND outcome <> 'SKIPPED'", (tenant.namespace_id,))
        ((runs_total,),) = cur.fetchall()
    assert await _task_count(db, tenant) == runs_total
    assert invariants.check(sync_conn, [tenant.namespace_id]) == []


# --- the backfill command against a racing trigger run ------------------------------------------


async def test_a_backfill_and_a_trigger_race_for_one_instant(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: QueueRef,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """The backfill command locks the schedule row and its queue row first, so the racing
    trigger's task was committed before; the trigger holds only its ledger row, which the
    backfill's own ledger insert waits on after the backfill read the ledger without it."""
    schedule_id = await make_schedule(db, tenant, queue.id, rule=EVERY_TEN_MINUTES,
                                      since=dt.timedelta(minutes=35), misfire="SKIP")
    await fire_until_idle(db)
    row = await _schedule_row(db, tenant, schedule_id)
    with sync_conn.cursor() as cur:  # the first missed instant: the start of a SKIPPED range
        cur.execute("SELECT MIN(fire_at) FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                    " AND schedule_id = %s AND outcome = 'SKIPPED'",
                    (tenant.namespace_id, schedule_id))
        ((first_skipped,),) = cur.fetchall()
    contested = as_utc(first_skipped)
    assert [(r["source"], r["outcome"]) for r in await _runs(db, tenant, schedule_id,
                                                             contested)] == [("RULE", "SKIPPED")]
    body = {"start": _iso(contested), "end": _iso(contested + dt.timedelta(seconds=1)),
            "reason": "the racing backfill"}
    async with held_trigger_run(db, tenant, schedule_id, contested, task_before=True) as other:
        tasks_before = await _task_count(db, tenant)
        backfill = asyncio.create_task(api.post(
            f"/v1/namespaces/{tenant.namespace}/schedules/{row['name']}/backfill",
            json=body, headers=tenant.auth))
        await _blocked(sync_conn, LEDGER_INSERT)
        assert not backfill.done()
        await other.commit()
        response = await backfill
    result = await response.json()
    assert response.status == 200, result
    assert (result["created"], result["already_ran"]) == ([], 1)
    assert await _task_count(db, tenant) == tasks_before  # its task was rolled back too
    runs = await _runs(db, tenant, schedule_id, contested)
    assert [r["source"] for r in runs if r["outcome"] != "SKIPPED"] == ["TRIGGER"]
    assert invariants.check(sync_conn, [tenant.namespace_id]) == []


# --- trigger at an instant that already ran -----------------------------------------------------


@contextlib.asynccontextmanager
async def clock_at(url: DatabaseUrl, at: dt.datetime) -> AsyncIterator[Database]:
    """A pool whose sessions read ``at`` as the database time (``SET timestamp``): a trigger
    whose now is exactly a planned instant, which real time hits only by chance."""
    pool = await aiomysql.create_pool(
        minsize=1, maxsize=2, db=url.database,
        **{**url.connect_kwargs(),
           "init_command": f"{INIT_COMMAND}, timestamp = {int(at.timestamp())}"})
    pinned = Database(pool, url)
    try:
        yield pinned
    finally:
        await pinned.close()


async def test_a_trigger_of_an_instant_that_already_ran_is_a_conflict(
    db: Database, db_url: DatabaseUrl, tenant: Tenant, queue: QueueRef,
) -> None:
    schedule_id = await make_schedule(db, tenant, queue.id, rule=EVERY_TEN_MINUTES,
                                      since=dt.timedelta(minutes=25), misfire="EACH")
    row = await _schedule_row(db, tenant, schedule_id)
    ran = _first_instant_from(as_utc(row["covered_until"]))
    await fire_until_idle(db)
    assert [(r["source"], r["outcome"]) for r in await _runs(db, tenant, schedule_id, ran)] == [
        ("RULE", "FIRED")]
    before = await _task_count(db, tenant)
    who = await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))
    async with clock_at(db_url, ran) as pinned:
        with pytest.raises(schedule_commands.OccurrenceAlreadyRan) as raised:
            await schedule_commands.trigger_now(pinned, who, namespace=tenant.namespace,
                                                name=row["name"])
    assert (raised.value.status, raised.value.code) == (409, "occurrence_already_ran")
    assert await _task_count(db, tenant) == before  # the whole command rolled back
    assert [(r["source"], r["outcome"]) for r in await _runs(db, tenant, schedule_id, ran)] == [
        ("RULE", "FIRED")]

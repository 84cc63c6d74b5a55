"""Outage compensation (orbit_common/pulse/outages.py) against the real database.

The gap is made with database time, not a fake clock: the fleet's last heartbeat is written,
then the test waits until the database clock is past it by more than the (small) threshold.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.pulse import leases, outages
from orbit_common.pulse.leases import AttemptRef, Grant
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant
from tests.support import held
from tests.support.lease_fixtures import (
    add_tasks,
    db_time,
    make_queue,
    open_session,
    task_row,
    wait_db_time_past,
)

THRESHOLD = dt.timedelta(milliseconds=300)


async def _reset(db: Database) -> None:
    """This database's heartbeats and outages are the test's own (tests run one at a time per
    database); earlier tests' live leases may be extended by the gaps made here, harmlessly."""
    async def body(cur: Any) -> None:
        await cur.execute("DELETE FROM pulse_dispatch_heartbeats")
        await cur.execute("DELETE FROM pulse_dispatch_outages")

    await db.transaction("test.reset_beats", body)


async def _last_beat(db: Database, node: str) -> dt.datetime:
    """A beat from ``node`` with no gap before it (the fleet's last sign of life)."""
    beat = await db.transaction("test.beat", lambda cur: outages.beat(cur, node, THRESHOLD))
    assert beat.compensated is None
    return beat.at.replace(tzinfo=None)


async def _running(db: Database, tenant: Tenant, session: Session, queue: QueueRef,
                   n: int = 1) -> list[Grant]:
    grants = await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))
    refs = [AttemptRef(attempt_id=g.attempt_id, token=g.token, generation=g.generation)
            for g in grants]
    started = await db.transaction("test.start",
                                   lambda cur: held.start(cur, tenant.namespace_id, refs))
    assert all(s.approved for s in started)
    return grants


async def _lease(db: Database, tenant: Tenant, task_id: bytes) -> dt.datetime:
    return (await task_row(db, tenant, task_id))["lease_expires_at"]  # type: ignore[no-any-return]


async def test_a_gap_extends_live_leases_by_its_length_exactly_once(
        db: Database, tenant: Tenant) -> None:
    await _reset(db)
    queue = await make_queue(db, tenant)
    session = await open_session(db, tenant, [queue])
    old_task, new_task = await add_tasks(db, tenant, queue, 2)
    (old,) = await _running(db, tenant, session, queue)
    assert old.task_id == old_task
    before = await _lease(db, tenant, old_task)
    started = await _last_beat(db, "dispatcher-a")
    await _running(db, tenant, session, queue)  # the new task, granted after the gap's start
    new_before = await _lease(db, tenant, new_task)
    new_written = (await task_row(db, tenant, new_task))["updated_at"]
    await wait_db_time_past(db, started + 2 * THRESHOLD)

    # Two dispatchers see the same gap at once: one compensates, the other finds it done.
    beats = await asyncio.gather(*[
        db.transaction("test.beat", lambda cur, node=node: outages.beat(cur, node, THRESHOLD))
        for node in ("dispatcher-a", "dispatcher-b")])
    compensated = [b.compensated for b in beats if b.compensated is not None]
    assert len(compensated) == 1
    outage = compensated[0]
    assert outage.started_at.replace(tzinfo=None) == started
    assert outage.length > 2 * THRESHOLD
    assert outage.tasks_extended >= 1

    after = await _lease(db, tenant, old_task)
    assert after - before == outage.length  # exactly the gap, once
    attempt_lease = await _attempt_lease(db, tenant, old.attempt_id)
    assert attempt_lease == after
    # Granted inside the gap: it lost only the time since it was written.
    ended = outage.ended_at.replace(tzinfo=None)
    assert await _lease(db, tenant, new_task) - new_before == ended - new_written
    # A later beat sees the fresh beats: no second compensation.
    again = await db.transaction("test.beat",
                                 lambda cur: outages.beat(cur, "dispatcher-a", THRESHOLD))
    assert again.compensated is None
    assert await _lease(db, tenant, old_task) == after


async def _attempt_lease(db: Database, tenant: Tenant, attempt_id: bytes) -> dt.datetime:
    async def body(cur: Any) -> dt.datetime:
        await cur.execute("SELECT lease_expires_at FROM pulse_attempts"
                          " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, attempt_id))
        return (await cur.fetchone())["lease_expires_at"]  # type: ignore[no-any-return]

    return await db.read("test.attempt_lease", body)


async def test_recovery_never_expires_a_lease_that_lapsed_during_an_outage(
        db: Database, tenant: Tenant) -> None:
    """The lease lapses inside the gap: the bare scan would send the re-run-unsafe task to
    NEEDS_REVIEW; the scan behind the heartbeat extends it first and recovers nothing."""
    await _reset(db)
    queue = await make_queue(db, tenant, execution_lease_ms=500)
    session = await open_session(db, tenant, [queue])
    await add_tasks(db, tenant, queue, 1, execution_lease_ms=500)
    (grant,) = await _running(db, tenant, session, queue)
    await _last_beat(db, "dispatcher-a")
    lease = await _lease(db, tenant, grant.task_id)
    await wait_db_time_past(db, lease + dt.timedelta(milliseconds=100))

    # A scan while the gap is open decides nothing (the bare scan would have recovered it)...
    assert await db.transaction(
        "test.recovery", lambda cur: outages.recover_expired(cur, THRESHOLD)) is None
    # ...the next beat compensates, and then the scan finds nothing lapsed.
    beat = await db.transaction("test.beat",
                                lambda cur: outages.beat(cur, "dispatcher-b", THRESHOLD))
    assert beat.compensated is not None
    assert await db.transaction(
        "test.recovery", lambda cur: outages.recover_expired(cur, THRESHOLD)) == 0
    row = await task_row(db, tenant, grant.task_id)
    assert row["state"] == "RUNNING"
    # The lease has back the time it had left when the outage began.
    assert row["lease_expires_at"] > await db_time(db)
    renewed = await db.transaction("test.renew", lambda cur: held.renew(
        cur, tenant.namespace_id,
        [AttemptRef(attempt_id=grant.attempt_id, token=grant.token,
                    generation=grant.generation)]))
    assert renewed[0].renewed


async def test_no_gap_no_compensation(db: Database, tenant: Tenant) -> None:
    await _reset(db)
    first = await db.transaction("test.beat",
                                 lambda cur: outages.beat(cur, "dispatcher-a", THRESHOLD))
    assert first.compensated is None  # the first beat ever has nothing to compare with
    second = await db.transaction("test.beat",
                                  lambda cur: outages.beat(cur, "dispatcher-b", THRESHOLD))
    assert second.compensated is None

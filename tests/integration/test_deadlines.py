"""Deadlines and expiry against the real database (database time decides every step).

A WAITING task past its total deadline or its schedule-to-start limit becomes FAILED with a
clear reason (NEEDS_REVIEW when an earlier attempt left its effect uncertain), by the recovery
scan, once however many replicas run it; an attempt past its timeout is a lost lease: a task that
declared re-running safe goes back to WAITING, any other needs review.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.pulse import leases
from tests.conftest import Tenant
from tests.integration.test_leases import claim, finish, recover, ref, report, start
from tests.support import held, invariants
from tests.support.lease_fixtures import (
    add_tasks,
    make_queue,
    open_session,
    scalar,
    task_row,
    wait_db_time_past,
)


async def expire_waiting(db: Database) -> int:
    return await db.transaction("test.expire_waiting",
                                lambda cur: leases.expire_waiting(cur, 1000))


async def check_invariants(db: Database, tenant: Tenant) -> None:
    assert await invariants.check_db(db, [tenant.namespace_id]) == []


async def test_a_waiting_task_past_its_deadline_fails_once_with_a_clear_reason(
    db: Database, tenant: Tenant,
) -> None:
    queue = await make_queue(db, tenant)
    doomed = await add_tasks(db, tenant, queue, 5, deadline_s=0.2)
    (kept,) = await add_tasks(db, tenant, queue, deadline_s=3600)
    row = await task_row(db, tenant, doomed[0])
    await wait_db_time_past(db, as_utc(row["deadline_at"]))
    # Past its deadline, a task is no longer claimable, even before the scan runs.
    session = await open_session(db, tenant, [queue])
    grants = await claim(db, session, queue)
    assert [g.task_id for g in grants] == [kept]
    # Two replicas scanning at once (the scans are global: other tests' tasks may be handled
    # too, so the figures that matter are this tenant's events, exactly one per task).
    handled = await asyncio.gather(expire_waiting(db), expire_waiting(db))
    assert sum(handled) >= 5
    for task_id in doomed:
        row = await task_row(db, tenant, task_id)
        assert (row["state"], row["outcome_reason"]) == ("FAILED", "deadline_exceeded")
        assert row["completed_at"] is not None
        assert await scalar(
            db, "SELECT COUNT(*) FROM orbit_events WHERE namespace_id = %s AND aggregate_id = %s"
            " AND event_type = 'task.deadline_exceeded'", tenant.namespace_id, task_id) == 1
        assert await scalar(
            db, "SELECT COUNT(*) FROM orbit_result_events WHERE namespace_id = %s"
            " AND task_id = %s AND state = 'FAILED'", tenant.namespace_id, task_id) == 1
    # Unfinished tasks: the running one only; a third scan changes nothing of this tenant.
    assert await scalar(db, "SELECT unfinished_tasks FROM pulse_queues WHERE namespace_id = %s"
                        " AND id = %s", tenant.namespace_id, queue.id) == 1
    await expire_waiting(db)
    for task_id in doomed:
        assert await scalar(
            db, "SELECT COUNT(*) FROM orbit_events WHERE namespace_id = %s AND aggregate_id = %s"
            " AND event_type = 'task.deadline_exceeded'", tenant.namespace_id, task_id) == 1
    await check_invariants(db, tenant)


async def test_schedule_to_start_limit_applies_only_before_the_first_start(
    db: Database, tenant: Tenant,
) -> None:
    queue = await make_queue(db, tenant)
    never, started = await add_tasks(db, tenant, queue, 2)
    await db.transaction("test.start_deadline", lambda cur: cur.execute(
        "UPDATE pulse_tasks SET start_deadline_at = UTC_TIMESTAMP(6) + INTERVAL 200000"
        " MICROSECOND, first_started_at = IF(id = %s, UTC_TIMESTAMP(6), NULL)"
        " WHERE namespace_id = %s AND id IN (%s, %s)",
        (started, tenant.namespace_id, never, started)))
    row = await task_row(db, tenant, never)
    await wait_db_time_past(db, as_utc(row["start_deadline_at"]))
    assert await expire_waiting(db) >= 1
    row = await task_row(db, tenant, never)
    assert (row["state"], row["outcome_reason"]) == ("FAILED", "start_deadline_exceeded")
    assert (await task_row(db, tenant, started))["state"] == "WAITING"
    await check_invariants(db, tenant)


async def test_a_deadline_over_an_uncertain_effect_needs_review(
    db: Database, tenant: Tenant,
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, deadline_s=0.2)
    await db.transaction("test.uncertain", lambda cur: cur.execute(
        "UPDATE pulse_tasks SET effect_uncertain = 1 WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, task_id)))
    row = await task_row(db, tenant, task_id)
    await wait_db_time_past(db, as_utc(row["deadline_at"]))
    assert await expire_waiting(db) >= 1
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "NEEDS_REVIEW"
    assert row["outcome_reason"] == "deadline_exceeded_with_uncertain_effect"
    assert row["completed_at"] is None
    # Still unfinished: a human has to decide.
    assert await scalar(db, "SELECT unfinished_tasks FROM pulse_queues WHERE namespace_id = %s"
                        " AND id = %s", tenant.namespace_id, queue.id) == 1
    await check_invariants(db, tenant)


async def _timed_out_attempt(db: Database, tenant: Tenant, *, rerun_safe: bool) -> bytes:
    """Start an attempt with a 300 ms timeout and a 60 s execution lease; renew it; let the
    timeout pass (database time) and run the recovery scan."""
    queue = await make_queue(db, tenant, execution_lease_ms=60_000)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=rerun_safe,
                                 attempt_timeout_ms=300, execution_lease_ms=60_000)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    (started,) = await start(db, tenant, [grant])
    assert started.approved
    attempt_started = as_utc(await scalar(
        db, "SELECT started_at FROM pulse_attempts WHERE namespace_id = %s AND id = %s",
        tenant.namespace_id, grant.attempt_id))
    timeout_at = attempt_started + dt.timedelta(milliseconds=300)
    # The execution lease never reaches past the attempt's timeout, renewed or not.
    assert started.lease_expires_at <= timeout_at
    (renewed,) = await db.transaction("test.renew", lambda cur: held.renew(
        cur, tenant.namespace_id, [ref(grant)]))
    if renewed.renewed:
        assert renewed.lease_expires_at <= timeout_at
    await wait_db_time_past(db, timeout_at)
    assert await recover(db) >= 1  # the scan is global; this task's state is checked below
    # A report after the timeout is refused and kept as evidence.
    (late,) = await finish(db, tenant, [report(grant, "succeeded", result="{}")])
    assert not late.accepted
    return task_id


async def test_an_attempt_past_its_timeout_is_a_lost_lease_safe_task_retries(
    db: Database, tenant: Tenant,
) -> None:
    task_id = await _timed_out_attempt(db, tenant, rerun_safe=True)
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["outcome_reason"]) == ("WAITING", "lease_lost_retry")
    # The lost attempt's effect stays uncertain on the task (never dropped), though a re-run
    # was declared safe.
    assert row["effect_uncertain"] == 1
    assert await scalar(db, "SELECT state FROM pulse_attempts WHERE namespace_id = %s"
                        " AND task_id = %s AND generation = 1",
                        tenant.namespace_id, task_id) == "LEASE_EXPIRED"
    await check_invariants(db, tenant)


async def test_an_attempt_past_its_timeout_is_a_lost_lease_unsafe_task_needs_review(
    db: Database, tenant: Tenant,
) -> None:
    task_id = await _timed_out_attempt(db, tenant, rerun_safe=False)
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "NEEDS_REVIEW"
    assert row["effect_uncertain"] == 1
    assert row["outcome_reason"] == "lease_lost"
    await check_invariants(db, tenant)

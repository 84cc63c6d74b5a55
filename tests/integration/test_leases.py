"""The lease protocol against the real database: claim → start → renew → finish, recovery."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from orbit_common.db.pool import Database
from orbit_common.pulse import leases
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant
from orbit_common.pulse.workers import QueueRef, Session, SessionLost
from tests.conftest import Tenant
from tests.support import held
from tests.support.lease_fixtures import (
    add_tasks,
    make_queue,
    open_session,
    scalar,
    task_row,
)


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


async def claim(db: Database, session: Session, queue: QueueRef, n: int = 32) -> list[Grant]:
    return await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))


async def start(db: Database, tenant: Tenant, grants: list[Grant]) -> list[Any]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.start",
                                lambda cur: held.start(cur, tenant.namespace_id, refs))


async def finish(db: Database, tenant: Tenant, reports: list[FinishReport]) -> list[Any]:
    return await db.transaction("test.finish",
                                lambda cur: held.finish(cur, tenant.namespace_id, reports))


def report(grant: Grant, outcome: str, report_id: bytes = b"r1", **kw: Any) -> FinishReport:
    return FinishReport(ref=ref(grant), report_id=report_id, outcome=outcome, **kw)


async def expire_now(db: Database, tenant: Tenant, task_id: bytes) -> None:
    """Move a live lease's expiry into the past (database time), as if the holder went silent."""
    async def body(cur: Any) -> None:
        await cur.execute(
            "UPDATE pulse_tasks SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
            " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, task_id))
        await cur.execute(
            "UPDATE pulse_attempts SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
            " WHERE namespace_id = %s AND task_id = %s AND state IN ('OFFERED', 'RUNNING')",
            (tenant.namespace_id, task_id))
    await db.transaction("test.expire", body)


async def recover(db: Database) -> int:
    return await db.transaction("test.recover", lambda cur: leases.recover_expired(cur, 1000))


async def test_full_cycle_success(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, input_json='{"n": 12345678901234567890.5}')
    session = await open_session(db, tenant, [queue])

    grants = await claim(db, session, queue)
    assert [g.task_id for g in grants] == [task_id]
    assert grants[0].generation == 1
    assert grants[0].input == '{"n": 12345678901234567890.5}'
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "LEASED"
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 1

    (started,) = await start(db, tenant, grants)
    assert started.approved
    assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"

    renewed = await db.transaction("test.renew", lambda cur: held.renew(
        cur, tenant.namespace_id, [ref(grants[0])]))
    assert renewed[0].renewed
    assert not renewed[0].cancel_requested

    (done,) = await finish(db, tenant, [report(grants[0], "succeeded", result='{"ok": true}')])
    assert done.accepted
    assert done.task_state == "SUCCEEDED"
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "SUCCEEDED"
    assert row["result"] == '{"ok": true}'
    assert row["completed_at"] is not None
    assert row["current_attempt_id"] is None
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 0
    events = await scalar(db, "SELECT GROUP_CONCAT(event_type ORDER BY aggregate_revision)"
                              " AS e FROM orbit_events WHERE aggregate_id = %s", task_id)
    assert events == "task.leased,task.started,task.succeeded"
    results = await scalar(db, "SELECT COUNT(*) AS n FROM orbit_result_events"
                               " WHERE task_id = %s AND state = 'SUCCEEDED'", task_id)
    assert results == 1


async def test_claims_never_grant_one_task_twice(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 200)
    sessions = [await open_session(db, tenant, [queue]) for _ in range(8)]
    batches = await asyncio.gather(*(claim(db, s, queue, 16) for s in sessions for _ in range(3)))
    granted = [g.task_id for batch in batches for g in batch]
    assert len(granted) == len(set(granted))
    assert len(granted) == min(200, 8 * 3 * 16)
    active = await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s", queue.id)
    assert active == len(granted)


async def test_max_concurrent_attempts_caps_claims(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant, max_concurrent=3)
    await add_tasks(db, tenant, queue, 10)
    session = await open_session(db, tenant, [queue])
    assert len(await claim(db, session, queue, 10)) == 3
    assert await claim(db, session, queue, 10) == []


async def test_handler_capability_filters_claims(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 2, handler="email")
    (other,) = await add_tasks(db, tenant, queue, 1, handler="sms")
    session = await open_session(db, tenant, [queue], handlers=("sms",))
    assert [g.task_id for g in await claim(db, session, queue)] == [other]


async def test_a_paused_gate_grants_and_approves_nothing(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 2)
    session = await open_session(db, tenant, [queue])
    grants = await claim(db, session, queue, 1)

    async def pause(cur: Any) -> None:
        await cur.execute("UPDATE pulse_execution_gates SET state = 'PAUSED',"
                          " control_revision = control_revision + 1 WHERE id = %s",
                          (queue.gate_id,))

    await db.transaction("test.pause", pause)
    assert await claim(db, session, queue) == []
    (outcome,) = await start(db, tenant, grants)
    assert not outcome.approved
    assert outcome.reason == "queue_paused"


async def test_stale_reports_change_nothing_and_become_evidence(
    db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=True)
    session = await open_session(db, tenant, [queue])
    (first,) = await claim(db, session, queue)
    await start(db, tenant, [first])
    await expire_now(db, tenant, task_id)
    assert await recover(db) >= 1
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "WAITING"
    assert row["effect_uncertain"] == 1

    # The stale holder reports success after its lease was recovered: rejected, kept as evidence.
    (late,) = await finish(db, tenant, [report(first, "succeeded", result='{"late": 1}')])
    assert not late.accepted
    assert late.reason == "attempt_finished"
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempt_evidence"
                            " WHERE attempt_id = %s AND kind = 'SUCCEEDED'", first.attempt_id) == 1

    # A wrong token or generation is not even evidence.
    forged = FinishReport(ref=AttemptRef(attempt_id=first.attempt_id, token="x" * 43,
                                         generation=first.generation),
                          report_id=b"r9", outcome="succeeded", result="{}")
    (rejected,) = await finish(db, tenant, [forged])
    assert rejected.reason == "invalid_attempt"

    # The next generation succeeds and clears the carried uncertainty.
    (second,) = await claim(db, session, queue)
    assert second.generation == 2
    await start(db, tenant, [second])
    (ok,) = await finish(db, tenant, [report(second, "succeeded", result="{}")])
    assert ok.task_state == "SUCCEEDED"
    assert (await task_row(db, tenant, task_id))["effect_uncertain"] == 0


async def test_lost_lease_of_an_unsafe_task_needs_review(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=False)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    await expire_now(db, tenant, task_id)
    await recover(db)
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "NEEDS_REVIEW"
    assert row["effect_uncertain"] == 1
    assert row["outcome_reason"] == "lease_lost"
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 0


async def test_expired_offer_goes_back_to_waiting(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await expire_now(db, tenant, task_id)
    (outcome,) = await start(db, tenant, [grant])
    assert outcome.reason == "offer_expired"
    await recover(db)
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "WAITING"
    assert row["effect_uncertain"] == 0


@pytest.mark.parametrize(
    ("retryable", "max_attempts", "expected"),
    [(True, 3, "WAITING"), (True, 1, "FAILED"), (False, 3, "FAILED")],
)
async def test_failure_retries_only_with_retryable_evidence_and_budget(
    db: Database, tenant: Tenant, retryable: bool, max_attempts: int, expected: str
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, max_attempts=max_attempts)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    (done,) = await finish(db, tenant, [report(grant, "failed", retryable=retryable,
                                               error={"type": "Boom", "message": "x"})])
    assert done.task_state == expected
    row = await task_row(db, tenant, task_id)
    assert row["state"] == expected
    assert json.loads(row["error"])["type"] == "Boom"


async def test_unknown_outcome_needs_review(db: Database, tenant: Tenant) -> None:
    """Not re-run-safe: an unknown outcome goes to a human (the safe case waits again:
    test_kernel_rulings)."""
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=False)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    (done,) = await finish(db, tenant, [report(grant, "unknown", error={"type": "Timeout"})])
    assert done.task_state == "NEEDS_REVIEW"
    assert (await task_row(db, tenant, task_id))["effect_uncertain"] == 1


async def test_finish_reports_are_deduplicated_by_report_id_and_content(
    db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    first = await finish(db, tenant, [report(grant, "succeeded", result="{}")])
    again = await finish(db, tenant, [report(grant, "succeeded", result="{}")])
    other_id = await finish(db, tenant, [report(grant, "succeeded", b"r2", result="{}")])
    assert first[0].accepted
    assert again[0].accepted
    assert again[0].replayed
    assert other_id[0].replayed
    with pytest.raises(leases.ReportConflict):
        await finish(db, tenant, [report(grant, "failed", error={"type": "x"})])
    assert await scalar(db, "SELECT COUNT(*) AS n FROM orbit_result_events WHERE task_id = %s",
                        task_id) == 1


async def test_a_new_session_fences_the_old_one(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 2)
    old = await open_session(db, tenant, [queue], instance_key="host-1")
    (grant,) = await claim(db, old, queue, 1)
    new = await open_session(db, tenant, [queue], instance_key="host-1")
    assert new.generation == old.generation + 1
    with pytest.raises(SessionLost):
        await claim(db, old, queue)
    # The attempt itself survives the reconnect: its token still starts it.
    (outcome,) = await start(db, tenant, [grant])
    assert outcome.approved


async def test_result_sequences_are_gap_free_per_namespace(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 40)
    session = await open_session(db, tenant, [queue])
    grants = await claim(db, session, queue, 40)
    await start(db, tenant, grants)
    halves = [grants[:20], grants[20:]]
    await asyncio.gather(*(finish(db, tenant, [report(g, "succeeded", result="{}") for g in h])
                           for h in halves))
    sequences = await scalar(
        db, "SELECT GROUP_CONCAT(sequence ORDER BY sequence) AS s FROM orbit_result_events"
            " WHERE namespace_id = %s", tenant.namespace_id)
    assert [int(s) for s in sequences.split(",")] == list(range(1, 41))

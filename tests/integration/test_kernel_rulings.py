"""The kernel's rulings (docs/api/tasks-lifecycle.md, DESIGN §5) against the real database.

Each test here failed on the kernel before issue 10: the retry budget counted offers, ``unknown``
always went to review, a start ignored the deadlines, any session could act on any attempt,
``max_in_flight`` was not enforced, and tasks had no workflow gate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pymysql

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.pulse import dispatch, leases
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant, SessionRef
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant
from tests.support import held
from tests.support.invariants import check
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, scalar, task_row
from tests.support.waiting import statements_waiting, until


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


async def claim(db: Database, session: Session, queue: QueueRef, n: int = 32) -> list[Grant]:
    return await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))


async def start_as(db: Database, session: Any, grants: list[Grant]) -> list[Any]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.start", lambda cur: leases.start(cur, session, refs))


async def start(db: Database, tenant: Tenant, grants: list[Grant]) -> list[Any]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.start",
                                lambda cur: held.start(cur, tenant.namespace_id, refs))


async def finish(db: Database, tenant: Tenant, grant: Grant, outcome: str,
                 **kw: Any) -> Any:
    report = FinishReport(ref=ref(grant), report_id=ids.new_id(), outcome=outcome, **kw)
    (done,) = await db.transaction("test.finish",
                                   lambda cur: held.finish(cur, tenant.namespace_id, [report]))
    return done


async def sql(db: Database, statement: str, *params: Any) -> None:
    async def body(cur: Any) -> None:
        await cur.execute(statement, params)
    await db.transaction("test.sql", body)


async def lapse(db: Database, tenant: Tenant, task_id: bytes) -> int:
    """Move a live lease's expiry into the past (database time) and run the recovery scan."""
    await sql(db, "UPDATE pulse_tasks SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
                  " WHERE namespace_id = %s AND id = %s", tenant.namespace_id, task_id)
    await sql(db, "UPDATE pulse_attempts SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1"
                  " SECOND WHERE namespace_id = %s AND task_id = %s AND state IN"
                  " ('OFFERED', 'RUNNING')", tenant.namespace_id, task_id)
    return await db.transaction("test.recover",
                                lambda cur: leases.recover_expired(cur, 1000, 3))


async def set_gate(db: Database, tenant: Tenant, gate_id: bytes, state: str) -> None:
    await sql(db, "UPDATE pulse_execution_gates SET state = %s,"
                  " control_revision = control_revision + 1 WHERE namespace_id = %s AND id = %s",
              state, tenant.namespace_id, gate_id)


def green(conn: pymysql.connections.Connection[Any], tenant: Tenant) -> None:
    assert check(conn, [tenant.namespace_id]) == []


# --- §1.1 the retry budget counts approved starts -----------------------------------------------


async def test_a_paused_queue_withdraws_the_offer_and_spends_no_budget(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant, max_attempts=1)
    (task_id,) = await add_tasks(db, tenant, queue, max_attempts=1)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await set_gate(db, tenant, queue.gate_id, "PAUSED")

    (refused,) = await start(db, tenant, [grant])
    assert (refused.approved, refused.reason) == (False, "queue_paused")
    row = await task_row(db, tenant, task_id)
    # Withdrawn at once: no waiting for the offer lease, budget untouched.
    assert (row["state"], row["starts_used"], row["offer_lapses"]) == ("WAITING", 0, 0)
    assert row["outcome_reason"] == "offer_withdrawn"
    assert await scalar(db, "SELECT state FROM pulse_attempts WHERE id = %s",
                        grant.attempt_id) == "WITHDRAWN"
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 0

    await set_gate(db, tenant, queue.gate_id, "OPEN")
    (again,) = await claim(db, session, queue)
    assert again.generation == 2  # the generation advanced on every offer (fencing)
    assert (await start(db, tenant, [again]))[0].approved
    assert (await finish(db, tenant, again, "succeeded", result="{}")).task_state == "SUCCEEDED"
    green(sync_conn, tenant)


async def test_lapsed_offers_spend_no_budget_and_are_capped(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant, max_attempts=1)
    (task_id,) = await add_tasks(db, tenant, queue, max_attempts=1)
    session = await open_session(db, tenant, [queue])
    for lapses in (1, 2):
        await claim(db, session, queue)
        assert await lapse(db, tenant, task_id) >= 1  # other tests share the database
        row = await task_row(db, tenant, task_id)
        assert (row["state"], row["starts_used"], row["offer_lapses"]) == ("WAITING", 0, lapses)
    # The third consecutive lapse reaches the cap (3 in this scan): FAILED, not a loop.
    await claim(db, session, queue)
    await lapse(db, tenant, task_id)
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["outcome_reason"]) == ("FAILED", "offer_lapses_exhausted")
    assert (row["attempts_used"], row["starts_used"]) == (3, 0)
    green(sync_conn, tenant)


async def test_an_approved_start_resets_the_lapse_count(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, max_attempts=2, rerun_safe=True)
    session = await open_session(db, tenant, [queue])
    await claim(db, session, queue)
    await lapse(db, tenant, task_id)
    (grant,) = await claim(db, session, queue)
    assert (await start(db, tenant, [grant]))[0].approved
    row = await task_row(db, tenant, task_id)
    assert (row["starts_used"], row["offer_lapses"], row["attempts_used"]) == (1, 0, 2)


# --- §1.2 unknown follows the safe-retry rule ---------------------------------------------------


async def test_unknown_on_a_rerun_safe_task_waits_again_with_uncertainty(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=True, max_attempts=2)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    done = await finish(db, tenant, grant, "unknown", error={"type": "timeout"})
    assert done.task_state == "WAITING"
    row = await task_row(db, tenant, task_id)
    assert (row["effect_uncertain"], row["outcome_reason"]) == (1, "outcome_unknown_retry")

    # The budget is spent by the second start: the next unknown goes to a human.
    await sql(db, "UPDATE pulse_tasks SET available_at = UTC_TIMESTAMP(6) WHERE id = %s", task_id)
    (second,) = await claim(db, session, queue)
    await start(db, tenant, [second])
    assert (await finish(db, tenant, second, "unknown")).task_state == "NEEDS_REVIEW"
    green(sync_conn, tenant)


async def test_unknown_on_a_task_that_is_not_rerun_safe_goes_to_review(
        db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, rerun_safe=False, max_attempts=3)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    assert (await finish(db, tenant, grant, "unknown")).task_state == "NEEDS_REVIEW"


# --- §1.3 start re-checks the deadlines ---------------------------------------------------------


async def test_a_start_after_the_deadline_is_refused_and_the_task_fails(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, deadline_s=30)
    (late_start,) = await add_tasks(db, tenant, queue)
    await sql(db, "UPDATE pulse_tasks SET start_deadline_at = UTC_TIMESTAMP(6) + INTERVAL 30"
                  " SECOND WHERE id = %s", late_start)
    session = await open_session(db, tenant, [queue])
    grants = {g.task_id: g for g in await claim(db, session, queue)}
    await sql(db, "UPDATE pulse_tasks SET deadline_at = UTC_TIMESTAMP(6) WHERE id = %s", task_id)
    await sql(db, "UPDATE pulse_tasks SET start_deadline_at = UTC_TIMESTAMP(6) WHERE id = %s",
              late_start)

    first, second = await start(db, tenant, [grants[task_id], grants[late_start]])
    assert (first.approved, first.reason) == (False, "deadline_exceeded")
    assert (second.approved, second.reason) == (False, "start_deadline_exceeded")
    for tid, why in ((task_id, "deadline_exceeded"), (late_start, "start_deadline_exceeded")):
        row = await task_row(db, tenant, tid)
        assert (row["state"], row["outcome_reason"]) == ("FAILED", why)
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 0
    assert await scalar(db, "SELECT COUNT(*) FROM orbit_result_events WHERE task_id IN (%s, %s)",
                        task_id, late_start) == 2
    green(sync_conn, tenant)


# --- §1.4 the session is part of the execution identity -----------------------------------------


async def test_a_session_of_another_instance_cannot_touch_an_attempt(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue)
    owner = await open_session(db, tenant, [queue])
    stranger = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, owner, queue)

    (refused,) = await start_as(db, stranger, [grant])
    assert (refused.approved, refused.reason) == (False, "session_mismatch")
    (approved,) = await start_as(db, owner, [grant])
    assert approved.approved
    (renewed,) = await db.transaction("t", lambda cur: leases.renew(cur, stranger, [ref(grant)]))
    assert (renewed.renewed, renewed.reason) == (False, "session_mismatch")
    report = FinishReport(ref=ref(grant), report_id=b"r", outcome="succeeded", result="{}")
    (done,) = await db.transaction("t", lambda cur: leases.finish(cur, stranger, [report]))
    assert (done.accepted, done.reason) == (False, "session_mismatch")
    assert await scalar(db, "SELECT COUNT(*) FROM pulse_attempt_evidence WHERE attempt_id = %s",
                        grant.attempt_id) == 2  # the renewal and the report, as late evidence
    green(sync_conn, tenant)


async def test_a_reconnected_worker_adopts_its_attempts_and_gets_their_cancel_notices(
        db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    first = await open_session(db, tenant, [queue], instance_key="w-1")
    (grant,) = await claim(db, first, queue)
    assert (await start_as(db, first, [grant]))[0].approved
    second = await open_session(db, tenant, [queue], instance_key="w-1")  # fences `first`
    assert second.instance_id == first.instance_id

    # The fenced session is refused; its finish is kept as late evidence.
    (fenced,) = await db.transaction("t", lambda cur: leases.renew(cur, first, [ref(grant)]))
    assert (fenced.renewed, fenced.reason) == (False, "session_fenced")
    (adopted,) = await db.transaction("t", lambda cur: leases.renew(cur, second, [ref(grant)]))
    assert adopted.renewed
    assert await scalar(db, "SELECT worker_session_id FROM pulse_attempts WHERE id = %s",
                        grant.attempt_id) == second.id
    await sql(db, "UPDATE pulse_tasks SET cancel_requested_at = UTC_TIMESTAMP(6) WHERE id = %s",
              task_id)
    notices = await dispatch.cancel_requested(db, second)  # the gateway's notice scan
    assert notices == [grant.attempt_id]

    late = FinishReport(ref=ref(grant), report_id=b"late", outcome="succeeded", result="{}")
    (done,) = await db.transaction("t", lambda cur: leases.finish(cur, first, [late]))
    assert (done.accepted, done.reason) == (False, "session_fenced")
    assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"
    assert await scalar(db, "SELECT rejected_because FROM pulse_attempt_evidence WHERE"
                            " attempt_id = %s AND kind = 'SUCCEEDED'",
                        grant.attempt_id) == "session_fenced"


async def test_an_unknown_session_is_refused(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    ghost = SessionRef(namespace_id=tenant.namespace_id, id=ids.new_id(),
                       instance_id=session.instance_id)
    (refused,) = await start_as(db, ghost, [grant])
    assert (refused.approved, refused.reason) == (False, "session_fenced")


# --- §1.8 max_in_flight ---------------------------------------------------------------------------


async def test_a_session_never_holds_more_than_max_in_flight(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 5)
    session = await open_session(db, tenant, [queue], max_in_flight=1)
    assert len(await claim(db, session, queue, 3)) == 1
    assert await claim(db, session, queue, 3) == []  # its one offer is still live
    other = await open_session(db, tenant, [queue], max_in_flight=2)
    assert len(await claim(db, other, queue, 3)) == 2


# --- §3.2 the workflow gate -----------------------------------------------------------------------


async def workflow_gate(db: Database, tenant: Tenant, task_ids: list[bytes]) -> bytes:
    gate_id = ids.new_id()
    await sql(db, "INSERT INTO pulse_execution_gates (namespace_id, id, owner_kind, owner_id,"
                  " state, control_revision, created_at, updated_at) VALUES (%s, %s, 'WORKFLOW',"
                  " %s, 'OPEN', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
              tenant.namespace_id, gate_id, ids.new_id())
    for task_id in task_ids:
        await sql(db, "UPDATE pulse_tasks SET workflow_gate_id = %s WHERE id = %s",
                  gate_id, task_id)
    return gate_id


async def test_claim_and_start_honour_the_workflow_gate(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    gated = await add_tasks(db, tenant, queue, 2)
    (free,) = await add_tasks(db, tenant, queue)
    gate_id = await workflow_gate(db, tenant, gated)
    session = await open_session(db, tenant, [queue])
    await set_gate(db, tenant, gate_id, "PAUSED")
    assert [g.task_id for g in await claim(db, session, queue)] == [free]

    await set_gate(db, tenant, gate_id, "OPEN")
    grants = await claim(db, session, queue)
    assert sorted(g.task_id for g in grants) == sorted(gated)
    await set_gate(db, tenant, gate_id, "PAUSED")
    outcomes = await start(db, tenant, grants)
    assert [(o.approved, o.reason) for o in outcomes] == [(False, "workflow_paused")] * 2
    assert {(await task_row(db, tenant, t))["state"] for t in gated} == {"WAITING"}


async def _pause_racing(db: Database, tenant: Tenant, gate_id: bytes,
                        conn: pymysql.connections.Connection[Any], pattern: str,
                        racer: Any) -> Any:
    """Hold an uncommitted pause of the gate, start ``racer``, wait until it waits for the
    gate's lock, commit the pause, and return what the racer did."""
    locked, release = asyncio.Event(), asyncio.Event()

    async def pause(cur: Any) -> None:
        await cur.execute("UPDATE pulse_execution_gates SET state = 'PAUSED',"
                          " control_revision = control_revision + 1"
                          " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, gate_id))
        locked.set()
        await release.wait()

    pausing = asyncio.create_task(db.transaction("test.pause", pause))
    await locked.wait()
    raced = asyncio.create_task(racer())
    try:
        await until(lambda: statements_waiting(conn, pattern), timeout=10,
                    message="the racer to wait for the gate")
    finally:
        release.set()
        await pausing
    return await raced


async def test_a_pause_racing_a_claim_never_grants(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant)
    gated = await add_tasks(db, tenant, queue, 2)
    gate_id = await workflow_gate(db, tenant, gated)
    session = await open_session(db, tenant, [queue])
    grants = await _pause_racing(db, tenant, gate_id, sync_conn,
                                 "%FROM pulse_execution_gates%ORDER BY id LOCK IN SHARE MODE%",
                                 lambda: claim(db, session, queue))
    assert grants == []


async def test_a_pause_racing_a_start_never_approves(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    queue = await make_queue(db, tenant)
    gated = await add_tasks(db, tenant, queue, 1)
    gate_id = await workflow_gate(db, tenant, gated)
    session = await open_session(db, tenant, [queue])
    grants = await claim(db, session, queue)
    (outcome,) = await _pause_racing(db, tenant, gate_id, sync_conn,
                                     "%FROM pulse_execution_gates g JOIN orbit_platform_controls%",
                                     lambda: start(db, tenant, grants))
    assert (outcome.approved, outcome.reason) == (False, "workflow_paused")


# --- finish receipts answer only the token holder (issue 11 §8) ---------------------------------


async def test_a_wrong_token_learns_nothing_from_earlier_receipts(
        db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    report = FinishReport(ref=ref(grant), report_id=b"r1", outcome="succeeded", result="{}")
    (done,) = await db.transaction("t", lambda cur: leases.finish(cur, session, [report]))
    assert done.accepted
    # The same report id and content under a guessed token: not a replay of the receipt.
    forged_ref = AttemptRef(attempt_id=grant.attempt_id, token="guessed",
                            generation=grant.generation)
    for report_id in (b"r1", b"r2"):
        forged = FinishReport(ref=forged_ref, report_id=report_id, outcome="succeeded",
                              result="{}")
        (answer,) = await db.transaction("t", lambda cur, f=forged: leases.finish(
            cur, session, [f]))
        assert (answer.accepted, answer.reason, answer.replayed) == (
            False, "invalid_attempt", False)
    # Nor a copy of an authentic report in the same batch.
    forged = FinishReport(ref=forged_ref, report_id=b"r1", outcome="succeeded", result="{}")
    answers = await db.transaction("t", lambda cur: leases.finish(cur, session,
                                                                  [report, forged]))
    assert [(a.accepted, a.reason) for a in answers] == [(True, None),
                                                          (False, "invalid_attempt")]

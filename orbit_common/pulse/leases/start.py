"""Start: step 2 of the two-step dispatch (specification 000 §3, §5 "开始确认").

    LEASED --start--> RUNNING [attempt RUNNING, execution lease]

A start is approved only while the offer is valid, the caller's session is the attempt's (the
same worker instance, ACTIVE and alive; an approved start records the session on the attempt),
the queue's gate and the task's workflow gate are OPEN, no cancel is requested, the task's
deadlines have not passed and the queue's and the application's one-second start windows have
room. An approval spends one unit of the retry budget (``starts_used + 1``) and clears the
count of consecutive lapsed offers. Answers are per item; a repeated start is approved again
while the execution lease is valid.

Refusals that end the offer at once (through the ending writer, in this transaction)
    * a gate is closed: the offer is withdrawn, the task waits again (``queue_paused`` or
      ``workflow_paused``); no budget is spent and no lapse counted;
    * a deadline passed (``deadline_exceeded`` / ``start_deadline_exceeded``): the offer is
      withdrawn and the task ends FAILED (NEEDS_REVIEW when it carries uncertainty).
Other refusals change nothing: ``invalid_attempt``, ``session_mismatch``, ``session_fenced``,
``attempt_finished``, ``offer_expired`` (recovery decides), ``lease_expired``,
``cancel_requested``, ``dispatch_frozen`` (the platform's dispatch is frozen after a restore; the
offer stays), ``start_rate_limited`` (with ``retry_after_ms``; the offer stays valid).

Locks (the lock order of ``docs/architecture.md``): the session (shared), tasks, attempts, the
gates and the platform control row (shared); when offers end here, every queue row of the batch
(by id) before the writer's keys, application row and result stream; the start windows' queue
rows and the application's row, the result stream last.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common.db.batch import placeholders, values_table
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.platform.events import EventRecord, append_events
from orbit_common.pulse import control, resources
from orbit_common.pulse.leases import decisions, endings
from orbit_common.pulse.leases.common import (
    AttemptRef,
    Locked,
    SessionIdentity,
    check_batch,
    expect_rows,
    gates_and_dispatch,
    identity_refusal,
    lock_for,
    ms,
    task_event,
)
from orbit_common.pulse.model import AttemptState, TaskState


@attrs.frozen(kw_only=True)
class StartOutcome:
    attempt_id: bytes
    approved: bool
    reason: str | None = None
    lease_expires_at: dt.datetime | None = None
    retry_after_ms: int | None = None  # start_rate_limited: when the window has room again


START_ATTEMPTS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_attempts a"
    " ON a.namespace_id = %s AND a.id = v.attempt_id"
    " SET a.state = 'RUNNING', a.started_at = %s, a.lease_expires_at = v.expires,"
    "     a.worker_session_id = %s"
    " WHERE a.state = 'OFFERED'"
)
START_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.task_id"
    " SET t.state = 'RUNNING', t.revision = t.revision + 1, t.lease_expires_at = v.expires,"
    "     t.starts_used = t.starts_used + 1, t.offer_lapses = 0,"
    "     t.first_started_at = COALESCE(t.first_started_at, %s),"
    "     t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.state = 'LEASED' AND t.revision = v.revision"
    "   AND t.current_attempt_id = v.attempt_id"
)
QUEUE_ROWS = (
    "SELECT id FROM pulse_queues WHERE namespace_id = %s AND id IN ({}) ORDER BY id FOR UPDATE"
)


def execution_lease(now: dt.datetime, task: dict[str, Any],
                    started_at: dt.datetime) -> dt.datetime:
    """Execution lease: ``execution_lease_ms`` from now, never past the attempt timeout."""
    expires = now + ms(task["execution_lease_ms"])
    if task["attempt_timeout_ms"] is not None:
        expires = min(expires, started_at + ms(task["attempt_timeout_ms"]))
    return expires


async def _queue_gates(cur: Any, namespace_id: bytes, queue_ids: set[bytes]
                       ) -> tuple[dict[bytes, bytes], set[bytes], dt.datetime]:
    """The queues' gate ids, which queues have a start limit, and the database's clock: one
    plain read after the attempts' locks (so the clock is read after every lock wait)."""
    if not queue_ids:
        return {}, set(), await db_now(cur)
    ordered = sorted(queue_ids)
    await cur.execute(
        f"SELECT q.id, q.gate_id, q.max_starts_per_second, clock.now"
        f" FROM (SELECT UTC_TIMESTAMP(6) AS now) clock"
        f" JOIN pulse_queues q ON q.namespace_id = %s"
        f" AND q.id IN ({placeholders(len(ordered))})",
        (namespace_id, *ordered),
    )
    rows = list(await cur.fetchall())
    if not rows:  # cannot happen (an attempt's queue is never deleted); the clock alone then
        return {}, set(), await db_now(cur)
    return ({row["id"]: row["gate_id"] for row in rows},
            {row["id"] for row in rows if row["max_starts_per_second"] is not None},
            as_utc(rows[0]["now"]))


def _refusal(lk: Locked, now: dt.datetime, gates: dict[bytes, str], gate_of: dict[bytes, bytes],
             frozen: bool) -> tuple[str | None, decisions.Decision | None]:
    """Why a valid-looking OFFERED attempt may not start, and the ending that refusal writes."""
    task, attempt = lk.task, lk.attempt
    if attempt["state"] != AttemptState.OFFERED or not lk.is_live():
        return "attempt_finished", None
    if as_utc(attempt["lease_expires_at"]) <= now:
        return "offer_expired", None
    if task["cancel_requested_at"] is not None:
        return "cancel_requested", None
    late = decisions.past_deadline(task, now)
    if late is not None:
        return late, decisions.decide_start_too_late(task, late)
    if gates.get(gate_of.get(attempt["queue_id"], b"")) != "OPEN":
        return "queue_paused", decisions.decide_withdrawal(task)
    if task["workflow_gate_id"] is not None and gates.get(task["workflow_gate_id"]) != "OPEN":
        return "workflow_paused", decisions.decide_withdrawal(task)
    if frozen:  # the offer stays: a thaw lets the worker start it while the offer is valid
        return control.FROZEN_REASON, None
    return None, None


@attrs.define
class _Batch:
    """One start batch's answers and writes."""

    outcomes: dict[int, StartOutcome] = attrs.field(factory=dict)
    candidates: list[tuple[int, Locked]] = attrs.field(factory=list)
    endings: list[endings.Ending] = attrs.field(factory=list)


async def start(cur: Any, session: SessionIdentity,
                refs: Sequence[AttemptRef]) -> list[StartOutcome]:
    """Approve starts (the module docstring), answered per item."""
    check_batch(refs)
    namespace_id = session.namespace_id
    locked, live = await lock_for(cur, session, [r.attempt_id for r in refs])
    queue_ids = {lk.attempt["queue_id"] for lk in locked.values()}
    gate_of, start_limited, now = await _queue_gates(cur, namespace_id, queue_ids)
    gates, frozen = await gates_and_dispatch(cur, namespace_id, [
        *gate_of.values(),
        *(lk.task["workflow_gate_id"] for lk in locked.values()
          if lk.task["workflow_gate_id"] is not None)])
    batch = _Batch()
    ended: set[bytes] = set()
    for index, ref in enumerate(refs):
        lk = locked.get(ref.attempt_id)
        if lk is None or not lk.matches(ref):
            batch.outcomes[index] = StartOutcome(attempt_id=ref.attempt_id, approved=False,
                                                 reason="invalid_attempt")
            continue
        refused = identity_refusal(lk, session, live)
        if refused is not None:
            batch.outcomes[index] = StartOutcome(attempt_id=ref.attempt_id, approved=False,
                                                 reason=refused)
            continue
        if lk.attempt["state"] == AttemptState.RUNNING and lk.is_live():
            # A repeated start (its first answer was lost) is approved again only while the
            # execution lease is still valid: after that, recovery may be re-granting the task.
            lease = as_utc(lk.attempt["lease_expires_at"])
            batch.outcomes[index] = (
                StartOutcome(attempt_id=ref.attempt_id, approved=False, reason="lease_expired")
                if lease <= now else
                StartOutcome(attempt_id=ref.attempt_id, approved=True, lease_expires_at=lease))
            continue
        reason, decision = _refusal(lk, now, gates, gate_of, frozen)
        if ref.attempt_id in ended:
            reason, decision = "attempt_finished", None
        if reason is not None:
            batch.outcomes[index] = StartOutcome(attempt_id=ref.attempt_id, approved=False,
                                                 reason=reason)
            if decision is not None:
                ended.add(ref.attempt_id)
                batch.endings.append(endings.Ending(
                    task=lk.task, attempt=lk.attempt, decision=decision,
                    payload={"attempt_id": lk.attempt["id"].hex(),
                             "generation": lk.attempt["generation"], "refused": reason},
                    error={"type": reason, "message": "the start was refused"}))
            continue
        batch.candidates.append((index, lk))

    async def approve() -> None:
        await _approve(cur, session, batch, now, queue_ids=queue_ids,
                       start_limited=start_limited)

    if batch.endings:
        # Every queue row of the batch first (by id), so the writer's counters and the start
        # windows take them in one sorted pass; then keys, the application row, the stream.
        ordered = sorted(queue_ids)
        await cur.execute(QUEUE_ROWS.format(placeholders(len(ordered))),
                          (namespace_id, *ordered))
        await cur.fetchall()
        await endings.write(cur, namespace_id, batch.endings, now, before_results=approve)
    else:
        await approve()
    return [batch.outcomes[i] for i in range(len(refs))]


async def _approve(cur: Any, session: SessionIdentity, batch: _Batch, now: dt.datetime, *,
                   queue_ids: set[bytes], start_limited: set[bytes]) -> None:
    """The approvals of a batch: start windows, then the attempts and tasks RUNNING."""
    namespace_id = session.namespace_id
    approvals: list[tuple[Any, ...]] = []
    events: list[EventRecord] = []
    approved: dict[bytes, dt.datetime] = {}
    windows: dict[bytes, resources.Window] | None = None
    app_window = resources.Window(limit=None, until=None, used=0)
    for index, lk in batch.candidates:
        attempt_id = lk.attempt["id"]
        if attempt_id in approved:  # the same attempt twice in one batch
            batch.outcomes[index] = StartOutcome(attempt_id=attempt_id, approved=True,
                                                 lease_expires_at=approved[attempt_id])
            continue
        queue_id = lk.attempt["queue_id"]
        if windows is None:
            # Start windows: the queues' rows, then the application's (lock order).
            windows = await resources.queue_windows(cur, namespace_id, queue_ids, start_limited)
            app_window = await resources.application_window(cur, namespace_id)
        blocking = [w for w in (windows[queue_id], app_window)
                    if w.room(now) is not None and w.room(now) == 0]
        if blocking:
            batch.outcomes[index] = StartOutcome(
                attempt_id=attempt_id, approved=False, reason="start_rate_limited",
                retry_after_ms=max(w.retry_after_ms(now) for w in blocking))
            continue
        windows[queue_id].take(now, 1)
        app_window.take(now, 1)
        expires = execution_lease(now, lk.task, now)
        approved[attempt_id] = expires
        approvals.append((lk.task["id"], lk.task["revision"], attempt_id, to_db(expires)))
        events.append(task_event(namespace_id, lk.task["id"], lk.task["revision"] + 1,
                                 "task.started", TaskState.LEASED, TaskState.RUNNING,
                                 {"attempt_id": attempt_id.hex(),
                                  "generation": lk.attempt["generation"],
                                  "session_id": session.id.hex()}))
        batch.outcomes[index] = StartOutcome(attempt_id=attempt_id, approved=True,
                                             lease_expires_at=expires)
    if not approvals:
        return
    when = to_db(now)
    table, values = values_table(["task_id", "revision", "attempt_id", "expires"], approvals)
    await cur.execute(START_ATTEMPTS.format(table=table),
                      (*values, namespace_id, when, session.id))
    expect_rows(cur, len(approvals), "start attempts")
    await cur.execute(START_TASKS.format(table=table), (*values, namespace_id, when))
    expect_rows(cur, len(approvals), "start tasks")
    await append_events(cur, events)
    # Counter rows last, so the application's row is held only for the commit.
    await resources.save_windows(
        cur, namespace_id, windows or {},
        touched={lk.attempt["queue_id"] for _, lk in batch.candidates
                 if lk.attempt["id"] in approved},
        app=app_window, started=len(approvals))

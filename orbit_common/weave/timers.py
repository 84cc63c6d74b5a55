"""TIMER waits (docs/weave/waits.md § 计时（TIMER）; 001/003 000019).

Identity: a TIMER step's activation has exactly one ``weave_waits`` row (kind TIMER,
``uq_weave_waits_activation``) and one TIMER pending advance (``uq_weave_advances_step``) whose
``activation_id`` is fixed to that activation. Both are written by the advance that enters the
step, in its transaction: ``first_deadline_at = deadline_at = due_at`` of the advance row, the
wait WAITING, the step WAITING with its activation LIVE.

State diagram of the wait::

    WAITING --(the advance row is due and re-checked)--> FIRED      (step SUCCEEDED)
    WAITING --(its block closed / its instance ended)--> CANCELLED  (step CANCELLED, row DONE)

Firing (``engine._Advance.fire_timer``) happens in the advance transaction that leased the
TIMER row, after the instance row is locked and the lease fenced. It re-checks: the row's
namespace and instance are the advance's, the instance is RUNNING, the step's LIVE activation
is the row's ``activation_id``, the wait is WAITING; anything else is ``stale`` (or
``instance_ended``) and the row is DONE without an effect. The due time is compared with the
database time of the advance: a row that is not yet due (impossible through the lease scan,
which reads ``due_at <= UTC_TIMESTAMP(6)``, but checked) goes back to PENDING unchanged
(:data:`EARLY`). The wait becomes FIRED with ``fired_at`` (the advance's database time) and
``late_ms``; the step SUCCEEDED with ``{"due_at", "fired_at", "late_ms"}``; its ``next`` runs
in the same transaction. A timer therefore fires once (the wait leaves WAITING in the
transaction that fires it, and the row is DONE in that same transaction), never early (database
time), and one that came due while no engine ran fires at the next round, late, with the
lateness recorded.

Everything here is computed in memory on the advance and written with one statement per table
per batch (:func:`write`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import UTC, as_utc, to_db
from orbit_common.model import ids
from orbit_common.pulse.tasks import iso, parse_rfc3339
from orbit_common.weave import expressions
from orbit_common.weave.language import MAX_WAIT_MS, TimerStep

# Not an outcome of a row: the row was leased before its due time; it goes back to PENDING.
EARLY = "early"
# The earliest instant an ``until`` may name (DATETIME(6) holds 1000-9999; anything this old is
# a mistake, not a schedule).
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


@attrs.define
class Wait:
    """A ``weave_waits`` row as an advance sees and changes it (TIMER and SIGNAL rows alike;
    only TIMER rows are changed here)."""

    id: bytes
    step_id: bytes
    activation_id: bytes
    kind: str
    state: str
    deadline_at: dt.datetime | None
    first_deadline_at: dt.datetime | None
    fired_at: dt.datetime | None = None
    late_ms: int | None = None
    new: bool = False
    dirty: bool = False


def due_at(step: TimerStep, now: dt.datetime, evaluate: Callable[[str], Any]) -> dt.datetime:
    """When ``step``, entered at database time ``now``, is due: ``now + duration_ms``, or the
    instant its ``until`` expression gives (an RFC 3339 string with an offset, from 1970 to at
    most :data:`MAX_WAIT_MS` ahead). Anything else raises ``ExpressionError`` (the step fails
    with ``expression_failed``). An instant in the past is kept: the timer fires at the next
    round, late."""
    if step.duration_ms is not None:
        return now + dt.timedelta(milliseconds=step.duration_ms)
    value = evaluate(step.until or "")
    if not isinstance(value, str):
        raise expressions.ExpressionError("the instant is not a string")
    try:
        instant = parse_rfc3339(value)
    except ValueError as exc:
        raise expressions.ExpressionError(f"the instant {value[:64]!r}: {exc}") from exc
    if instant < EPOCH:
        raise expressions.ExpressionError(f"the instant {value[:64]!r} is before 1970")
    if instant > now + dt.timedelta(milliseconds=MAX_WAIT_MS):
        raise expressions.ExpressionError(
            f"the instant {value[:64]!r} is more than {MAX_WAIT_MS // 86_400_000} days ahead")
    return instant


def enter(step_id: bytes, activation_id: bytes, due: dt.datetime) -> Wait:
    """The wait of a TIMER activation entered now (written by :func:`write`)."""
    return Wait(id=ids.new_id(), step_id=step_id, activation_id=activation_id, kind="TIMER",
                state="WAITING", deadline_at=due, first_deadline_at=due, new=True)


def late_ms(wait: Wait, now: dt.datetime) -> int | None:
    """How late firing ``wait`` at ``now`` is (milliseconds, ≥ 0); None while it is not due."""
    if wait.deadline_at is None or now < wait.deadline_at:
        return None
    return (now - wait.deadline_at) // dt.timedelta(milliseconds=1)


def fire(wait: Wait, now: dt.datetime) -> dict[str, Any]:
    """``wait`` fires at ``now`` (it is due): FIRED; the step's result."""
    late = late_ms(wait, now)
    if late is None or wait.deadline_at is None:
        raise ValueError("a timer fires only when it is due")
    wait.state, wait.fired_at, wait.late_ms, wait.dirty = "FIRED", now, late, True
    return {"due_at": iso(wait.deadline_at), "fired_at": iso(now), "late_ms": late}


def cancel(wait: Wait) -> None:
    """A WAITING wait whose step was cancelled (its block closed, its instance ended)."""
    wait.state, wait.dirty = "CANCELLED", True


# --- SQL ----------------------------------------------------------------------------------------

LOAD = ("SELECT instance_id, id, step_id, activation_id, kind, state, deadline_at,"
        " first_deadline_at FROM weave_waits FORCE INDEX (ix_weave_waits_instance)"
        " WHERE namespace_id = %s AND instance_id IN ({ids}) AND state = 'WAITING'")
INSERT_WAITS = ("INSERT INTO weave_waits (namespace_id, id, instance_id, step_id, activation_id,"
                " kind, generation, first_deadline_at, deadline_at, state, created_at,"
                " updated_at)")
WAIT_ROW = "(%s, %s, %s, %s, %s, 'TIMER', 1, %s, %s, %s, %s, %s)"
INSERT_ADVANCES = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id,"
                   " activation_id, kind, state, due_at, created_at)")
ADVANCE_ROW = "(%s, %s, %s, %s, %s, 'TIMER', 'PENDING', %s, %s)"
# Every ended wait of a batch in one statement; guarded by its state (only a WAITING wait
# ends). Values only from driver parameters.
END_WAITS = ("UPDATE weave_waits SET state = CASE id {state} END,"
             " fired_at = CASE id {fired} END, late_ms = CASE id {late} END, updated_at = %s"
             " WHERE namespace_id = %s AND id IN ({ids}) AND state = 'WAITING'")
# The TIMER pending advances of cancelled waits (PENDING, or LEASED by a round that will find
# them DONE when it fences). By (namespace, instance): the unique key's prefix.
DONE_ADVANCES = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s,"
                 " lease_owner = NULL, lease_expires_at = NULL"
                 " WHERE namespace_id = %s AND instance_id IN ({instances}) AND kind = 'TIMER'"
                 " AND activation_id IN ({ids}) AND state <> 'DONE'")
RELEASE = ("UPDATE weave_pending_advances SET state = 'PENDING', lease_owner = NULL,"
           " lease_expires_at = NULL WHERE namespace_id = %s AND id IN ({ids})"
           " AND state = 'LEASED'")


async def load(cur: Any, ns: bytes, instance_ids: Sequence[bytes]
               ) -> dict[bytes, dict[bytes, Wait]]:
    """The WAITING waits of each instance, by activation id (after the instance locks: the
    committed state)."""
    found: dict[bytes, dict[bytes, Wait]] = {i: {} for i in instance_ids}
    if not instance_ids:
        return found
    await cur.execute(LOAD.format(ids=placeholders(len(instance_ids))), (ns, *instance_ids))
    for r in await cur.fetchall():
        found[r["instance_id"]][r["activation_id"]] = Wait(
            id=r["id"], step_id=r["step_id"], activation_id=r["activation_id"], kind=r["kind"],
            state=r["state"],
            deadline_at=as_utc(r["deadline_at"]) if r["deadline_at"] else None,
            first_deadline_at=(as_utc(r["first_deadline_at"]) if r["first_deadline_at"]
                               else None))
    return found


async def write(cur: Any, ns: bytes, waits: Sequence[tuple[bytes, Wait]], when: Any) -> None:
    """The batch's TIMER waits (``(instance id, wait)``): the new ones and their pending
    advances (one insert each; a wait entered and cancelled by the same advance is inserted
    CANCELLED, without a pending advance), the ended ones (one CASE update), and the pending
    advances of the cancelled ones DONE (one update)."""
    new = [(i, w) for i, w in waits if w.new and w.kind == "TIMER"]
    ended = [(i, w) for i, w in waits if not w.new and w.dirty and w.kind == "TIMER"]
    if new:
        sql, params = multi_insert(INSERT_WAITS, WAIT_ROW, [
            (ns, w.id, i, w.step_id, w.activation_id, to_db(_due(w)), to_db(_due(w)), w.state,
             when, when) for i, w in new])
        await cur.execute(sql, params)
        waiting = [(i, w) for i, w in new if w.state == "WAITING"]
        if waiting:
            sql, params = multi_insert(INSERT_ADVANCES, ADVANCE_ROW, [
                (ns, ids.new_id(), i, w.step_id, w.activation_id, to_db(_due(w)), when)
                for i, w in waiting])
            await cur.execute(sql, params)
    if ended:
        def cases(values: Sequence[tuple[bytes, Any]]) -> tuple[str, list[Any]]:
            return (" ".join("WHEN %s THEN %s" for _ in values),
                    [v for pair in values for v in pair])

        state, state_params = cases([(w.id, w.state) for _, w in ended])
        fired, fired_params = cases([(w.id, to_db(w.fired_at) if w.fired_at else None)
                                     for _, w in ended])
        late, late_params = cases([(w.id, w.late_ms) for _, w in ended])
        await cur.execute(
            END_WAITS.format(state=state, fired=fired, late=late,
                             ids=placeholders(len(ended))),
            (*state_params, *fired_params, *late_params, when, ns, *[w.id for _, w in ended]))
        cancelled = [(i, w) for i, w in ended if w.state == "CANCELLED"]
        if cancelled:
            instances = sorted({i for i, _ in cancelled})
            await cur.execute(
                DONE_ADVANCES.format(instances=placeholders(len(instances)),
                                     ids=placeholders(len(cancelled))),
                (when, ns, *instances, *[w.activation_id for _, w in cancelled]))


async def release(cur: Any, ns: bytes, row_ids: Sequence[bytes]) -> None:
    """Leased rows that were not yet due go back to PENDING unchanged (never early)."""
    if row_ids:
        await cur.execute(RELEASE.format(ids=placeholders(len(row_ids))), (ns, *row_ids))


def _due(wait: Wait) -> dt.datetime:
    if wait.deadline_at is None:
        raise ValueError("a TIMER wait has a deadline")
    return wait.deadline_at

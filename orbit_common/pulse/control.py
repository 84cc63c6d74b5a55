"""Platform-wide dispatch control: the freeze and the fencing of every session after a restore.

Why (specification 000 §7): after an old backup is restored, the platform's records have gone
back in time while the outside world has not -- a task recorded RUNNING may have finished, and
its worker may still hold a lease the restored rows believe valid. Before work resumes, dispatch
must stop, every session and lease from before the restore must be invalidated, and the normal
recovery rules must decide each task again (docs/runbooks/restore.md):

    freeze  -> no claim grants anything, no start is approved (reason ``dispatch_frozen``: the
               offer is not withdrawn and no budget is spent); renewals, finishes, the recovery
               scan, submits and every operator action go on
    fence   -> every session created before the fence is FENCED (its claims and heartbeats
               fail; its worker registers a new one), and every live lease (offer or execution)
               expires now, so the recovery scan decides each task by the usual rules: an offer
               that never started goes back to WAITING, a RUNNING task goes back to WAITING only
               when it is re-run-safe with budget left, otherwise to NEEDS_REVIEW
    thaw    -> dispatch resumes

Identity: one row, ``orbit_platform_controls`` with ``scope = 'PLATFORM'`` (migration 0017).

Locks (the one lock order, docs/architecture.md): claims and starts read the control row with
a shared lock after their own rows (session and gate for a claim; tasks, attempts and gates for
a start), so a freeze -- the row's exclusive lock, nothing else -- waits for the claims and
starts in flight and every later one sees it. :func:`fence_all` takes the row first, alone, in
its own transaction (it records the fence moment and checks the freeze), then fences sessions
and leases in bounded batches that take the tasks before their attempts, as every lease
transaction does. Fencing requires the freeze: without it new leases would keep appearing while
the old ones are fenced.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import placeholders
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.platform.audit import Actor, AuditRecord, append_audit

SCOPE = "PLATFORM"
FENCE_BATCH = 500
REASON_MAX = 1024
FROZEN_REASON = "dispatch_frozen"  # the start refusal while frozen (docs/api/worker.md)


class DispatchState(enum.StrEnum):
    OPEN = "OPEN"
    FROZEN = "FROZEN"


class DispatchNotFrozen(errors.Conflict):
    code = "dispatch_not_frozen"
    title = "Fencing every session needs dispatch frozen first"


@attrs.frozen(kw_only=True)
class Controls:
    dispatch_state: DispatchState
    dispatch_reason: str | None
    dispatch_changed_by: str | None
    dispatch_changed_at: dt.datetime | None
    sessions_fenced_at: dt.datetime | None
    revision: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Controls:
        return cls(
            dispatch_state=DispatchState(row["dispatch_state"]),
            dispatch_reason=row["dispatch_reason"],
            dispatch_changed_by=row["dispatch_changed_by"],
            dispatch_changed_at=as_utc(row["dispatch_changed_at"])
            if row["dispatch_changed_at"] else None,
            sessions_fenced_at=as_utc(row["sessions_fenced_at"])
            if row["sessions_fenced_at"] else None,
            revision=row["revision"],
        )

    def summary(self) -> dict[str, Any]:
        def iso(value: dt.datetime | None) -> str | None:
            return value.isoformat().replace("+00:00", "Z") if value else None

        return {"dispatch": self.dispatch_state.value, "reason": self.dispatch_reason,
                "changed_by": self.dispatch_changed_by,
                "changed_at": iso(self.dispatch_changed_at),
                "sessions_fenced_at": iso(self.sessions_fenced_at), "revision": self.revision}


COLUMNS = ("dispatch_state, dispatch_reason, dispatch_changed_by, dispatch_changed_at,"
           " sessions_fenced_at, revision")
SHARED = ("SELECT dispatch_state FROM orbit_platform_controls WHERE scope = %s"
          " LOCK IN SHARE MODE")
READ = f"SELECT {COLUMNS} FROM orbit_platform_controls WHERE scope = %s"
FOR_UPDATE = READ + " FOR UPDATE"
SET_DISPATCH = """
UPDATE orbit_platform_controls
SET dispatch_state = %s, dispatch_reason = %s, dispatch_changed_by = %s,
    dispatch_changed_at = UTC_TIMESTAMP(6), revision = revision + 1, updated_at = UTC_TIMESTAMP(6)
WHERE scope = %s AND revision = %s
"""
SET_FENCED = """
UPDATE orbit_platform_controls
SET sessions_fenced_at = %s, revision = revision + 1, updated_at = UTC_TIMESTAMP(6)
WHERE scope = %s AND revision = %s AND dispatch_state = 'FROZEN'
"""


class ControlsMissing(errors.DatabaseError):
    """The control row is missing: migration 0017 was not applied (a deployment bug)."""

    code = "platform_controls_missing"


# --- the hook claims and starts call -----------------------------------------------------------


async def dispatch_frozen(cur: Any) -> bool:
    """Inside a claim or a start: whether dispatch is frozen (shared lock on the control row,
    so a freeze serialises with the claims and starts in flight)."""
    await cur.execute(SHARED, (SCOPE,))
    row = await cur.fetchone()
    if row is None:
        raise ControlsMissing("orbit_platform_controls has no PLATFORM row")
    return bool(row["dispatch_state"] == DispatchState.FROZEN)


# --- operator commands ---------------------------------------------------------------------------


def _check_reason(reason: str) -> str:
    text = reason.strip()
    if not text or len(text) > REASON_MAX:
        raise errors.ValidationFailed([{"path": "reason",
                                        "message": f"1-{REASON_MAX} characters"}])
    return text


async def _locked(cur: Any) -> Controls:
    await cur.execute(FOR_UPDATE, (SCOPE,))
    row = await cur.fetchone()
    if row is None:
        raise ControlsMissing("orbit_platform_controls has no PLATFORM row")
    return Controls.from_row(row)


async def read(db: Database) -> Controls:
    """``orbit admin dispatch status``: the control row as it is now."""
    async def body(cur: Any) -> Controls:
        await cur.execute(READ, (SCOPE,))
        row = await cur.fetchone()
        if row is None:
            raise ControlsMissing("orbit_platform_controls has no PLATFORM row")
        return Controls.from_row(row)

    return await db.read("platform.controls.read", body)


async def set_dispatch(cur: Any, state: DispatchState, *, actor: Actor,
                       reason: str) -> tuple[Controls, bool]:
    """Freeze or thaw dispatch, audited in the same transaction. Returns the controls and
    whether they changed (setting the state it already has changes and audits nothing).

    Locks: the control row only (FOR UPDATE): it waits for the claims and starts holding it
    shared, so once it commits no claim grants and no start is approved (or, thawing, they
    resume).
    """
    reason = _check_reason(reason)
    before = await _locked(cur)
    if before.dispatch_state is state:
        return before, False
    await cur.execute(SET_DISPATCH, (state.value, reason, actor.describe(), SCOPE,
                                     before.revision))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the platform controls changed concurrently")
    after = await _locked(cur)
    await append_audit(cur, AuditRecord(
        actor=actor, action="dispatch.freeze" if state is DispatchState.FROZEN
        else "dispatch.thaw", resource_type="platform_controls", resource_id=None,
        resource_revision=after.revision, reason=reason, before=before.summary(),
        after=after.summary()))
    return after, True


async def freeze(db: Database, *, actor: Actor, reason: str) -> tuple[Controls, bool]:
    """``orbit admin dispatch freeze``."""
    return await db.transaction("platform.dispatch.freeze", lambda cur: set_dispatch(
        cur, DispatchState.FROZEN, actor=actor, reason=reason))


async def thaw(db: Database, *, actor: Actor, reason: str) -> tuple[Controls, bool]:
    """``orbit admin dispatch thaw``."""
    return await db.transaction("platform.dispatch.thaw", lambda cur: set_dispatch(
        cur, DispatchState.OPEN, actor=actor, reason=reason))


# --- fencing every session and lease -------------------------------------------------------------


@attrs.frozen(kw_only=True)
class FenceReport:
    fenced_at: dt.datetime
    sessions: int
    leases: int

    def to_json(self) -> dict[str, Any]:
        return {"fenced_at": self.fenced_at.isoformat().replace("+00:00", "Z"),
                "sessions_fenced": self.sessions, "leases_expired": self.leases}


async def begin_fence(cur: Any, *, actor: Actor, reason: str) -> dt.datetime:
    """Record the fence moment (database time) on the control row, audited; refuses unless
    dispatch is frozen. Locks: the control row only."""
    reason = _check_reason(reason)
    before = await _locked(cur)
    if before.dispatch_state is not DispatchState.FROZEN:
        raise DispatchNotFrozen("freeze dispatch first: orbit admin dispatch freeze --reason …")
    now = await db_now(cur)
    await cur.execute(SET_FENCED, (to_db(now), SCOPE, before.revision))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the platform controls changed concurrently")
    after = await _locked(cur)
    await append_audit(cur, AuditRecord(
        actor=actor, action="sessions.fence_all", resource_type="platform_controls",
        resource_id=None, resource_revision=after.revision, reason=reason,
        before=before.summary(), after=after.summary()))
    return now


FENCE_SESSIONS = """
UPDATE pulse_worker_sessions SET state = 'FENCED', closed_at = UTC_TIMESTAMP(6)
WHERE state = 'ACTIVE' AND created_at <= %s
LIMIT %s
"""
LIVE_LEASES = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state IN ('LEASED', 'RUNNING') AND lease_expires_at > %s
ORDER BY lease_expires_at, namespace_id, id
LIMIT %s
"""
EXPIRE_TASKS = (
    "UPDATE pulse_tasks SET lease_expires_at = %s, updated_at = UTC_TIMESTAMP(6)"
    " WHERE namespace_id = %s AND id = %s AND state IN ('LEASED', 'RUNNING')"
    " AND lease_expires_at > %s"
)
EXPIRE_ATTEMPTS = (
    "UPDATE pulse_attempts SET lease_expires_at = %s"
    " WHERE namespace_id = %s AND id = %s AND state IN ('OFFERED', 'RUNNING')"
    " AND lease_expires_at > %s"
)


async def fence_sessions(cur: Any, fenced_at: dt.datetime, limit: int = FENCE_BATCH) -> int:
    """FENCE up to ``limit`` ACTIVE sessions created at or before ``fenced_at`` (a session a
    worker registers after the fence is not from before the restore). Locks: those sessions."""
    await cur.execute(FENCE_SESSIONS, (to_db(fenced_at), limit))
    return int(cur.rowcount)


async def expire_leases(cur: Any, limit: int = FENCE_BATCH) -> tuple[int, int]:
    """Make up to ``limit`` live leases (offers and execution leases) expire now (database
    time), on the task and its attempt; the recovery scan then decides each task by the usual
    rules. Revision and state are untouched: expiry is not a transition, the scan's is.

    Locks: the tasks (by primary key, sorted), then their current attempts -- the lease
    transactions' order. A renewal that slips in before the lock extends nothing afterwards:
    it sees an expired lease. Returns how many live leases it found and how many it expired
    (fewer when some ended before their lock was granted).
    """
    now = await db_now(cur)
    await cur.execute(LIVE_LEASES, (to_db(now), limit))
    candidates = sorted((row["namespace_id"], row["id"]) for row in await cur.fetchall())
    expired = 0
    by_namespace: dict[bytes, list[bytes]] = {}
    for namespace_id, task_id in candidates:
        by_namespace.setdefault(namespace_id, []).append(task_id)
    for namespace_id, task_ids in sorted(by_namespace.items()):
        await cur.execute(
            "SELECT id, current_attempt_id FROM pulse_tasks WHERE namespace_id = %s"
            f" AND id IN ({placeholders(len(task_ids))}) AND state IN ('LEASED', 'RUNNING')"
            " AND lease_expires_at > %s ORDER BY id FOR UPDATE",
            (namespace_id, *task_ids, to_db(now)))
        live = list(await cur.fetchall())
        for row in live:
            await cur.execute(EXPIRE_TASKS, (to_db(now), namespace_id, row["id"], to_db(now)))
            expired += int(cur.rowcount)
        for attempt_id in sorted(r["current_attempt_id"] for r in live
                                 if r["current_attempt_id"] is not None):
            await cur.execute(EXPIRE_ATTEMPTS, (to_db(now), namespace_id, attempt_id,
                                                to_db(now)))
    return len(candidates), expired


async def fence_all(db: Database, *, actor: Actor, reason: str) -> FenceReport:
    """``orbit admin sessions fence-all``: fence every session and expire every live lease.

    Runs as bounded transactions: the audited fence record (requires the freeze), then
    sessions and leases in batches until none is left. Frozen, no new lease appears, and a
    fenced lease cannot be renewed, so the batches end. Safe to run again (after a crash
    midway, or to be sure): what is already fenced is not touched again.
    """
    fenced_at = await db.transaction("platform.sessions.fence_all", lambda cur: begin_fence(
        cur, actor=actor, reason=reason))
    sessions = leases = 0
    while True:
        n = await db.transaction("platform.sessions.fence",
                                 lambda cur: fence_sessions(cur, fenced_at))
        sessions += n
        if n < FENCE_BATCH:
            break
    while True:
        found, n = await db.transaction("platform.leases.expire", expire_leases)
        leases += n
        if found == 0:
            break
    return FenceReport(fenced_at=fenced_at, sessions=sessions, leases=leases)

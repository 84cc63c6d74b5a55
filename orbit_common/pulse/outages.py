"""Database outages: Orbit's communication failure, never the worker's (000 §1 invariant 7).

While the database cannot be reached, no worker can renew a lease, so that time must not expire
leases. Detection
    Every dispatcher writes its heartbeat row (``pulse_dispatch_heartbeats``) about once a
    second, in database time (:func:`beat`). The newest ``beat_at`` over all rows is the fleet's
    last sign of life ``S``; when a dispatcher next reaches the database at ``N`` and
    ``N - S`` exceeds the threshold, the gap ``[S, N]`` was an outage -- nobody could write,
    hence nobody could renew. (One dispatcher frozen while others beat is no outage: the others'
    rows stay fresh.)
Compensation
    In the same transaction, every lease live at ``S`` (granted before ``S`` and expiring after
    it: LEASED offers and RUNNING attempts -- the task's and the current attempt's
    ``lease_expires_at`` -- and ACTIVE sessions' ``expires_at``) is moved later by ``N - S``:
    each gets back exactly the time it had left when the outage began, however long the outage
    was. Exactly once per gap: the gap's row in
    ``pulse_dispatch_outages`` is keyed by ``S``, so a second dispatcher noticing the same gap
    hits the key (it waits for the first one's commit, then sees the duplicate) and extends
    nothing; one that comes later reads the first one's fresh beat and sees no gap.
Ordering
    The recovery scan runs :func:`recover_expired` (a beat, then the scan, in one transaction),
    so it never decides on a lease while an uncompensated gap is open. The dispatcher serves
    start, renew and finish only after a beat that committed less than the threshold ago
    (``orbit_dispatcher/heartbeat.py``), so a worker's first renewal after an outage finds its
    lease already extended.

Locks: the gap's outage row (insert), tasks and their current attempts (one multi-table update,
tasks/attempts in the lock order of docs/architecture.md), sessions, then this dispatcher's own
heartbeat row (no other transaction locks it). The heartbeat row is written last.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.pulse import leases

NODE_MAX = 191  # the width of pulse_dispatch_heartbeats.node
STALE_NODE_ROWS = dt.timedelta(days=1)  # rows of dispatchers gone this long are pruned

LAST_BEAT = "SELECT MAX(beat_at) AS last FROM pulse_dispatch_heartbeats"
INSERT_OUTAGE = (
    "INSERT INTO pulse_dispatch_outages (gap_started_at, gap_ended_at, gap_us, detected_by,"
    " tasks_extended, sessions_extended) VALUES (%s, %s, %s, %s, 0, 0)"
)
# A lease is compensated when it was live at the gap's start: granted (offered_at) and
# registered (sessions' created_at) before it, expiring after it. One granted after the start
# (possible only when the fleet was silent but the database was not, e.g. every dispatcher
# restarting at once) lost no time and is left alone.
LIVE_LEASES = (
    "SELECT t.namespace_id, t.id FROM pulse_tasks t JOIN pulse_attempts a"
    " ON a.namespace_id = t.namespace_id AND a.id = t.current_attempt_id"
    " WHERE t.state IN ('LEASED', 'RUNNING') AND t.lease_expires_at > %s"
    "   AND a.state IN ('OFFERED', 'RUNNING') AND a.offered_at <= %s"
    " FOR UPDATE"
)
EXTEND_LEASES = (
    "UPDATE pulse_tasks t JOIN pulse_attempts a"
    " ON a.namespace_id = t.namespace_id AND a.id = t.current_attempt_id"
    " SET t.lease_expires_at = t.lease_expires_at + INTERVAL %s MICROSECOND,"
    "     a.lease_expires_at = a.lease_expires_at + INTERVAL %s MICROSECOND"
    " WHERE t.state IN ('LEASED', 'RUNNING') AND t.lease_expires_at > %s"
    "   AND a.state IN ('OFFERED', 'RUNNING') AND a.offered_at <= %s"
)
EXTEND_SESSIONS = (
    "UPDATE pulse_worker_sessions SET expires_at = expires_at + INTERVAL %s MICROSECOND"
    " WHERE state = 'ACTIVE' AND expires_at > %s AND created_at <= %s"
)
RECORD_OUTAGE = (
    "UPDATE pulse_dispatch_outages SET tasks_extended = %s, sessions_extended = %s"
    " WHERE gap_started_at = %s"
)
UPDATE_BEAT = "UPDATE pulse_dispatch_heartbeats SET beat_at = %s WHERE node = %s"
INSERT_BEAT = (
    "INSERT INTO pulse_dispatch_heartbeats (node, beat_at, started_at) VALUES (%s, %s, %s)"
)
PRUNE_BEATS = "DELETE FROM pulse_dispatch_heartbeats WHERE beat_at < %s AND node <> %s LIMIT 100"


@attrs.frozen(kw_only=True)
class Outage:
    """A compensated gap: every lease live at ``started_at`` moved later by ``length``."""

    started_at: dt.datetime
    ended_at: dt.datetime
    tasks_extended: int
    sessions_extended: int

    @property
    def length(self) -> dt.timedelta:
        return self.ended_at - self.started_at


@attrs.frozen(kw_only=True)
class Beat:
    """One heartbeat: the database time it was written, and the outage it compensated (if this
    beat was the first to see a gap longer than the threshold)."""

    at: dt.datetime
    compensated: Outage | None = None


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


async def beat(cur: Any, node: str, threshold: dt.timedelta) -> Beat:
    """Write ``node``'s heartbeat; first compensate the gap before it if the fleet's last beat
    is older than ``threshold`` (module docstring). The named transaction ``dispatch.beat``."""
    node = node[:NODE_MAX]
    now = await db_now(cur)
    await cur.execute(LAST_BEAT)
    row = await cur.fetchone()
    last = as_utc(row["last"]) if row and row["last"] is not None else None
    outage = None
    if last is not None and now - last > threshold:
        outage = await _compensate(cur, node, last, now)
    when = to_db(now)
    await cur.execute(UPDATE_BEAT, (when, node))
    if cur.rowcount == 0:
        await cur.execute(INSERT_BEAT, (node, when, when))
    await cur.execute(PRUNE_BEATS, (to_db(now - STALE_NODE_ROWS), node))
    return Beat(at=now, compensated=outage)


async def _compensate(cur: Any, node: str, started: dt.datetime,
                      ended: dt.datetime) -> Outage | None:
    """Extend every lease live at ``started`` by the gap, unless another dispatcher already
    did (the outage row's key)."""
    gap_us = _micros(ended - started)
    try:
        await cur.execute(INSERT_OUTAGE, (to_db(started), to_db(ended), gap_us, node))
    except Exception as exc:
        if dberrors.is_duplicate(exc):
            return None  # this gap is compensated already (by another dispatcher)
        raise
    since = to_db(started)
    # Tasks first (by primary key), then the multi-table update reaches each task's current
    # attempt: the lock order of every lease transaction.
    await cur.execute(LIVE_LEASES, (since, since))
    tasks = len(await cur.fetchall())
    if tasks:
        await cur.execute(EXTEND_LEASES, (gap_us, gap_us, since, since))
    await cur.execute(EXTEND_SESSIONS, (gap_us, since, since))
    sessions = cur.rowcount
    await cur.execute(RECORD_OUTAGE, (tasks, sessions, since))
    return Outage(started_at=started, ended_at=ended, tasks_extended=tasks,
                  sessions_extended=sessions)


async def recover_expired(cur: Any, node: str, threshold: dt.timedelta,
                          limit: int = 128) -> tuple[Beat, int]:
    """The recovery scan, after a heartbeat in the same transaction: an outage that ended is
    compensated before any lapsed lease is decided (``recovery.leases``). Returns the beat and
    the number of tasks :func:`leases.recover_expired` handled."""
    done = await beat(cur, node, threshold)
    return done, await leases.recover_expired(cur, limit)

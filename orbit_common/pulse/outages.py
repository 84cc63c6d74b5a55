"""Database outages: Orbit's communication failure, never the worker's (000 §1 invariant 7).

While the database cannot be reached, no worker can renew a lease, so that time must not expire
leases.

Detection
    Every dispatcher writes its heartbeat row (``pulse_dispatch_heartbeats``) about once a
    second, in database time (:func:`beat`). The newest ``beat_at`` over all rows is the fleet's
    last sign of life ``S``; when a dispatcher next reaches the database at ``N`` and
    ``N - S`` exceeds the threshold, the gap ``[S, N]`` was an outage -- nobody could write,
    hence nobody could renew. (One dispatcher frozen while others beat is no outage: the others'
    rows stay fresh.)
Compensation
    In the same transaction, every lease live at ``S`` (expiring after it: LEASED offers and
    RUNNING attempts -- the task's and the current attempt's ``lease_expires_at`` -- and ACTIVE
    sessions' ``expires_at``) is moved later by the part of the gap since it was last written:
    ``N - max(S, last write)`` (the task's ``updated_at``, the session's ``heartbeat_at``). The
    fleet's last beat can precede the real outage by up to a heartbeat interval, and a lease
    granted or renewed in between lost the time from then on; one written just before ``N`` (a
    dispatcher granting before its first beat after every dispatcher was down) lost nothing and
    gets nothing. Each lease so gets back the time it had left when it could last be renewed,
    however long the outage was. Exactly once per gap: the gap's row in
    ``pulse_dispatch_outages`` is keyed by ``S``, so a second dispatcher noticing the same gap
    hits the key (it waits for the first one's commit, then sees the duplicate) and extends
    nothing; one that comes later reads the first one's fresh beat and sees no gap.
Ordering
    The recovery scan runs :func:`recover_expired`, which decides nothing while a gap longer
    than the threshold is open (a plain read of the fleet's last beat): the next beat
    compensates first. The dispatcher serves start, renew and finish only after a beat of its
    own that committed less than the threshold ago (``orbit_dispatcher/heartbeat.py``), so a
    worker's first renewal or finish after an outage finds its lease already extended.

Locks: a beat locks only its own heartbeat row, written last (the fleet's last beat is a plain
read; rows of dispatchers gone for a day are deleted by primary key after a plain read), so a
frozen dispatcher holding its own row stalls nobody's beat. A compensating beat first takes the
gap's outage row (insert), then tasks and their current attempts (one multi-table update;
tasks/attempts in the lock order of docs/architecture.md), then sessions.
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
# Live at the gap's start S (expiring after it) and last written before its end N: moved later
# by N - GREATEST(S, last write) (module docstring).
LIVE_LEASES = (
    "SELECT t.namespace_id, t.id FROM pulse_tasks t JOIN pulse_attempts a"
    " ON a.namespace_id = t.namespace_id AND a.id = t.current_attempt_id"
    " WHERE t.state IN ('LEASED', 'RUNNING') AND t.lease_expires_at > %(s)s"
    "   AND t.updated_at < %(n)s AND a.state IN ('OFFERED', 'RUNNING')"
    " FOR UPDATE"
)
LOST = "TIMESTAMPDIFF(MICROSECOND, GREATEST(%(s)s, {written}), %(n)s)"
EXTEND_LEASES = (
    "UPDATE pulse_tasks t JOIN pulse_attempts a"
    " ON a.namespace_id = t.namespace_id AND a.id = t.current_attempt_id"
    f" SET a.lease_expires_at = a.lease_expires_at"
    f"       + INTERVAL {LOST.format(written='t.updated_at')} MICROSECOND,"
    f"     t.lease_expires_at = t.lease_expires_at"
    f"       + INTERVAL {LOST.format(written='t.updated_at')} MICROSECOND"
    " WHERE t.state IN ('LEASED', 'RUNNING') AND t.lease_expires_at > %(s)s"
    "   AND t.updated_at < %(n)s AND a.state IN ('OFFERED', 'RUNNING')"
)
EXTEND_SESSIONS = (
    "UPDATE pulse_worker_sessions"
    f" SET expires_at = expires_at + INTERVAL {LOST.format(written='heartbeat_at')} MICROSECOND"
    " WHERE state = 'ACTIVE' AND expires_at > %(s)s AND heartbeat_at < %(n)s"
)
RECORD_OUTAGE = (
    "UPDATE pulse_dispatch_outages SET tasks_extended = %s, sessions_extended = %s"
    " WHERE gap_started_at = %s"
)
UPDATE_BEAT = "UPDATE pulse_dispatch_heartbeats SET beat_at = %s WHERE node = %s"
INSERT_BEAT = (
    "INSERT INTO pulse_dispatch_heartbeats (node, beat_at, started_at) VALUES (%s, %s, %s)"
)
STALE_BEATS = "SELECT node FROM pulse_dispatch_heartbeats WHERE beat_at < %s LIMIT 100"
PRUNE_BEATS = "DELETE FROM pulse_dispatch_heartbeats WHERE node = %s AND beat_at < %s"


@attrs.frozen(kw_only=True)
class Outage:
    """A compensated gap: every lease live at ``started_at`` moved later by the part of
    ``length`` since it was last written (module docstring)."""

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
    last = await _last_beat(cur)
    outage = None
    if last is not None and now - last > threshold:
        outage = await _compensate(cur, node, last, now)
    stale = to_db(now - STALE_NODE_ROWS)
    await cur.execute(STALE_BEATS, (stale,))  # a plain read: it waits for no one's row
    for gone in [row["node"] for row in await cur.fetchall()]:
        await cur.execute(PRUNE_BEATS, (gone, stale))
    when = to_db(now)
    await cur.execute(UPDATE_BEAT, (when, node))
    if cur.rowcount == 0:
        await cur.execute(INSERT_BEAT, (node, when, when))
    return Beat(at=now, compensated=outage)


async def _last_beat(cur: Any) -> dt.datetime | None:
    """The fleet's last beat (a plain, non-locking read)."""
    await cur.execute(LAST_BEAT)
    row = await cur.fetchone()
    return as_utc(row["last"]) if row and row["last"] is not None else None


async def gap_open(cur: Any, threshold: dt.timedelta) -> bool:
    """Whether the fleet has been silent longer than ``threshold``: an outage that no beat has
    compensated yet. Reads only, locks nothing."""
    last = await _last_beat(cur)
    return last is not None and await db_now(cur) - last > threshold


async def _compensate(cur: Any, node: str, started: dt.datetime,
                      ended: dt.datetime) -> Outage | None:
    """Extend every lease live at ``started`` by the time it lost (module docstring), unless
    another dispatcher already did (the outage row's key)."""
    gap_us = _micros(ended - started)
    try:
        await cur.execute(INSERT_OUTAGE, (to_db(started), to_db(ended), gap_us, node))
    except Exception as exc:
        if dberrors.is_duplicate(exc):
            return None  # this gap is compensated already (by another dispatcher)
        raise
    gap = {"s": to_db(started), "n": to_db(ended)}
    # Tasks first, then the multi-table update reaches each task's current attempt (the lock
    # order of every lease transaction). Both assignments read the task's updated_at, which
    # neither changes.
    await cur.execute(LIVE_LEASES, gap)
    tasks = len(await cur.fetchall())
    if tasks:
        await cur.execute(EXTEND_LEASES, gap)
    await cur.execute(EXTEND_SESSIONS, gap)
    sessions = cur.rowcount
    await cur.execute(RECORD_OUTAGE, (tasks, sessions, gap["s"]))
    return Outage(started_at=started, ended_at=ended, tasks_extended=tasks,
                  sessions_extended=sessions)


async def recover_expired(cur: Any, threshold: dt.timedelta, limit: int = 128,
                          max_offer_lapses: int = leases.DEFAULT_MAX_OFFER_LAPSES) -> int | None:
    """The recovery scan (``recovery.leases``), unless a gap longer than ``threshold`` is open:
    then it decides nothing (None) and the next beat compensates first. Otherwise the number
    of tasks :func:`leases.recover_expired` handled."""
    if await gap_open(cur, threshold):
        return None
    return await leases.recover_expired(cur, limit, max_offer_lapses)

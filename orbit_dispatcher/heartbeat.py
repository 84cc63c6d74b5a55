"""The dispatcher's heartbeat: outage detection and compensation (orbit_common/pulse/outages.py).

:meth:`Heartbeat.run` writes this node's heartbeat row every ``heartbeat_interval_s``; the beat
that first sees a fleet-wide gap longer than ``outage_threshold_s`` extends every live lease by
the gap. :meth:`Heartbeat.fresh` is the guard in front of start, renew and finish: it returns at
once while this node's last committed beat is younger than the threshold (no uncompensated gap
can be open), and otherwise writes a beat first (one at a time; concurrent callers share it), so
a worker's first renewal or finish after an outage finds its lease already extended. During the
outage the beat fails and so does the guarded call: the worker is answered
``database_unavailable`` (transient) and tries again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import prometheus_client

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.pulse import dispatch, outages

log = logging.getLogger(__name__)

OUTAGES = prometheus_client.Counter(
    "orbit_dispatch_outages_compensated_total",
    "Database outages (fleet heartbeat gaps) this dispatcher compensated.")
OUTAGE_SECONDS = prometheus_client.Counter(
    "orbit_dispatch_outage_seconds_total",
    "Length of the database outages this dispatcher compensated.")
LEASES_EXTENDED = prometheus_client.Counter(
    "orbit_dispatch_outage_leases_extended_total",
    "Task leases extended by outage compensation.")


class Heartbeat:
    """One dispatcher's heartbeat loop and freshness guard."""

    def __init__(self, db: Database, node: str, *, interval_s: float,
                 threshold_s: float) -> None:
        self.db = db
        self.node = node
        self.interval_s = interval_s
        self.threshold = dt.timedelta(seconds=threshold_s)
        self._last_ok: float | None = None  # loop time at which the last committed beat began
        self._inflight: asyncio.Future[None] | None = None

    @property
    def threshold_s(self) -> float:
        return self.threshold.total_seconds()

    def note(self, beat: outages.Beat, began: float) -> None:
        """Record a committed beat."""
        if self._last_ok is None or began > self._last_ok:
            self._last_ok = began
        outage = beat.compensated
        if outage is not None:
            OUTAGES.inc()
            OUTAGE_SECONDS.inc(outage.length.total_seconds())
            LEASES_EXTENDED.inc(outage.tasks_extended)
            log.warning("database outage compensated: live leases extended by the gap",
                        extra={"gap_started_at": outage.started_at.isoformat(),
                               "gap_s": round(outage.length.total_seconds(), 3),
                               "tasks_extended": outage.tasks_extended,
                               "sessions_extended": outage.sessions_extended})

    def is_fresh(self) -> bool:
        last = self._last_ok
        return last is not None and \
            asyncio.get_running_loop().time() - last < self.threshold_s

    async def fresh(self) -> None:
        """Return once a beat younger than the threshold has committed (module docstring)."""
        if self.is_fresh():
            return
        await self.beat_once()

    async def beat_once(self) -> None:
        """Write one beat; callers arriving while one is in flight wait for that one."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._beat())
        await asyncio.shield(self._inflight)

    async def _beat(self) -> None:
        began = asyncio.get_running_loop().time()
        done = await dispatch.beat(self.db, self.node, self.threshold)
        self.note(done, began)

    async def run(self) -> None:
        while True:
            try:
                await self.beat_once()
            except errors.OrbitError as exc:
                log.warning("heartbeat not written: %s", exc, extra={"code": exc.code})
            await asyncio.sleep(self.interval_s)

"""``orbit scheduler``: any number of replicas fire due schedules; none is a leader.

Each loop runs :func:`orbit_common.pulse.scheduling.fire` (``schedules.fire_due`` in one
transaction) at a time: it locks up to ``batch`` due schedules with ``SKIP LOCKED`` (another
replica takes the next ones), writes their ledger rows, tasks and progress, and commits. A full
batch is followed at once by the next; otherwise the loop sleeps until the earliest ``check_at``
(database time), between ``poll_min_ms`` and ``poll_max_ms`` — the longest a schedule created
meanwhile waits to be seen.
Killing a replica at any point loses nothing: an uncommitted step is simply done again by
whichever replica claims the schedule next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import prometheus_client

from orbit_common.db.pool import Database
from orbit_common.pulse import schedules, scheduling
from orbit_common.service.config import OrbitConfig
from orbit_common.service.health import ReadinessGate

log = logging.getLogger(__name__)

FIRES = prometheus_client.Counter(
    "orbit_schedule_occurrences_total", "Ledger rows written by the scheduler.", ["outcome"])
REFUSED = prometheus_client.Counter(
    "orbit_schedule_refusals_total",
    "Schedule steps postponed because a queue or application limit refused the task.")
LATENESS = prometheus_client.Histogram(
    "orbit_schedule_lateness_seconds",
    "Database time from an occurrence's due time (fire time + jitter) to its firing.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600))
DUE = prometheus_client.Gauge(
    "orbit_schedules_due", "ACTIVE schedules whose check time has passed (due but not fired).")

class SchedulerService:
    name = "scheduler"

    def __init__(self, config: OrbitConfig, db: Database, gate: ReadinessGate) -> None:
        self.config = config.scheduler
        self.db = db
        self.gate = gate
        self.stopping = asyncio.Event()
        self.loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.loops = [asyncio.create_task(self._loop(n), name=f"scheduler-{n}")
                      for n in range(max(1, self.config.concurrency))]

    async def drain(self) -> None:
        """Finish the step in flight (a step is one short transaction), then stop."""
        self.stopping.set()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.loops = []

    async def close(self) -> None:
        for task in self.loops:
            task.cancel()
        await self.drain()

    async def step(self) -> schedules.FireStats:
        stats = await scheduling.fire(self.db, self.config.batch)
        FIRES.labels("FIRED").inc(stats.fired)
        FIRES.labels("SKIPPED").inc(stats.skipped)
        FIRES.labels("MERGED").inc(stats.merged)
        REFUSED.inc(stats.refused)
        for late in stats.lateness_ms:
            LATENESS.observe(late / 1000)
        return stats

    async def _idle_sleep(self) -> None:
        upcoming = await scheduling.next_check(self.db)
        DUE.set(upcoming.due)
        wait = (self.config.poll_max_ms / 1000 if upcoming.in_seconds is None
                else upcoming.in_seconds)
        wait = min(max(wait, self.config.poll_min_ms / 1000), self.config.poll_max_ms / 1000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), wait)

    async def _loop(self, n: int) -> None:
        while not self.stopping.is_set():
            try:
                await self.gate.wait()
                stats = await self.step()
                if stats.schedules < self.config.batch:
                    await self._idle_sleep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduler step failed", extra={"loop": n})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.config.poll_max_ms / 1000)

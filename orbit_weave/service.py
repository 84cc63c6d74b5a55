"""``orbit weave``: the workflow engine daemon. Any number of replicas; none is a leader.

Two loops share one database pool:

* **advances** -- :meth:`orbit_common.weave.engine.Engine.run_once` rounds: lease up to
  ``[weave] batch`` inbox rows and pending advances (``SKIP LOCKED``, lapsed leases included),
  then the leased instances' advances, up to ``per_transaction`` instances per transaction. A
  round whose lease came back full runs again at once; one that found work waits
  ``poll_min_ms``; an idle one backs off, doubling up to ``poll_max_ms``.
* **gauges** -- every ``gauge_interval_s``, the backlog and instances by state.

Drain (SIGTERM): stop starting rounds; the round in flight finishes (every row it leased is
advanced and committed, or its lease lapses). A kill -9 loses nothing: an uncommitted advance
rolls back, its rows' leases lapse after ``lease_ms`` and any replica leases them again; a
committed one consumed its rows in the same transaction, so they are never advanced twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from orbit_common.db.pool import Database
from orbit_common.service.config import OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.loops import Pacer
from orbit_common.weave import engine
from orbit_weave.metrics import EngineMetrics, default

log = logging.getLogger(__name__)


def owner_id(configured: str) -> str:
    """The lease owner: the configured one, else ``hostname:pid`` (at most 128 characters)."""
    return (configured or f"{socket.gethostname()}:{os.getpid()}")[:128]


class WeaveService:
    name = "weave"

    def __init__(self, config: OrbitConfig, db: Database, gate: ReadinessGate, *,
                 metrics: EngineMetrics | None = None) -> None:
        self.config = config.weave
        self.db = db
        self.gate = gate
        self.engine = engine.Engine(db, owner=owner_id(self.config.owner),
                                    lease_ms=self.config.lease_ms, batch=self.config.batch,
                                    concurrency=self.config.concurrency,
                                    per_transaction=self.config.per_transaction)
        self.metrics = metrics or default()
        self.stopping = asyncio.Event()
        self.pacer = Pacer(self.stopping, gate, log, "weave")
        self.loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        log.info("weave engine starting", extra={"owner": self.engine.owner})
        self.loops = [
            asyncio.create_task(self._advance_loop(), name="weave-advances"),
            asyncio.create_task(self.pacer.every(self.config.gauge_interval_s, self.refresh_gauges,
                                            "gauges"), name="weave-gauges"),
        ]

    async def drain(self) -> None:
        """Stop starting rounds; the round in flight finishes."""
        self.stopping.set()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.loops = []

    async def close(self) -> None:
        self.stopping.set()
        for task in self.loops:
            task.cancel()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.loops = []

    async def _advance_loop(self) -> None:
        poll_min, poll_max = self.config.poll_min_ms / 1000, self.config.poll_max_ms / 1000
        delay = poll_min
        while not self.stopping.is_set():
            try:
                await self.gate.wait()
                done = await self.engine.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("weave round failed")
                await self.pacer.pause(poll_max)
                continue
            self.metrics.record(done)
            if done.full:
                delay = poll_min
                continue
            if done.inbox or done.advances or done.signals:
                delay = poll_min
                await self.pacer.pause(delay)
                continue
            await self.pacer.pause(delay)
            delay = min(delay * 2, poll_max)

    async def refresh_gauges(self) -> None:
        self.metrics.set_gauges(await engine.gauges(self.db))

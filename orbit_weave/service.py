"""``orbit weave``: the workflow engine daemon. Any number of replicas; none is a leader.

Two loops share one database pool:

* **advances** -- rounds of :class:`orbit_common.weave.engine.Engine`: a lease transaction
  (:meth:`~orbit_common.weave.engine.Engine.lease_round`: up to ``[weave] batch`` inbox rows,
  pending advances and signals, ``SKIP LOCKED``; lapsed leases at most every
  ``recover_interval_s``), then the leased instances' advances
  (:meth:`~orbit_common.weave.engine.Engine.advance_round`), up to ``per_transaction``
  instances per transaction and ``concurrency`` transactions at once. Up to
  ``rounds_in_flight`` rounds advance at once (default 1: the next lease waits for the round,
  and under load takes everything that ended meanwhile as one large round; with more, a result
  that ends while a round advances is leased after ``poll_min_ms``, not after that round). A lease
  that came back full leases again at once; one that found work waits ``poll_min_ms``; an
  idle one backs off, doubling up to ``poll_max_ms``. Two rounds in flight may hold rows of
  one instance (a PARALLEL block's branches): their advances serialise on the instance row,
  exactly as two replicas' do.
* **gauges** -- every ``gauge_interval_s``, the backlog and instances by state.

Drain (SIGTERM): stop starting rounds; the rounds in flight finish (every row it leased is
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
                                    per_transaction=self.config.per_transaction,
                                    recover_interval_s=self.config.recover_interval_s)
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
        rounds = asyncio.Semaphore(self.config.rounds_in_flight)
        running: set[asyncio.Task[None]] = set()

        async def advance(leased: engine.Leased) -> None:
            try:
                self.metrics.record(await self.engine.advance_round(leased))
            except Exception:
                # Rows not advanced keep their leases until they lapse (docs/weave/engine.md).
                log.exception("weave round failed")
            finally:
                rounds.release()

        try:
            while not self.stopping.is_set():
                await rounds.acquire()
                handed = False  # the slot goes with the rows to their advance, else back
                try:
                    await self.gate.wait()
                    leased = await self.engine.lease_round()
                    if leased:
                        task = asyncio.create_task(advance(leased), name="weave-round")
                        running.add(task)
                        task.add_done_callback(running.discard)
                        handed = True
                except Exception:
                    log.exception("weave lease failed")
                    await self.pacer.pause(poll_max)
                    continue
                finally:
                    if not handed:
                        rounds.release()
                if not leased:
                    await self.pacer.pause(delay)
                    delay = min(delay * 2, poll_max)
                    continue
                delay = poll_min
                if not leased.full(self.engine.batch):
                    await self.pacer.pause(delay)
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise
        finally:
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def refresh_gauges(self) -> None:
        self.metrics.set_gauges(await engine.gauges(self.db))

"""The process runner every daemon uses.

Lifecycle: configure JSON logging → open the database pool → start the readiness gate → start the
service → wait for SIGTERM/SIGINT → ``service.drain()`` (stop taking new work, finish in-flight
transactions) bounded by ``drain_timeout_s`` → ``service.close()`` → close the pool. A second
signal during the drain stops waiting and closes at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

from orbit_common.db.pool import Database, open_database
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.config import OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.logging import configure_logging

log = logging.getLogger(__name__)


class Service(Protocol):
    """A long-running daemon. ``start`` returns once it runs in the background."""

    name: str

    async def start(self) -> None: ...

    async def drain(self) -> None:
        """Stop accepting work and wait for in-flight work; idempotent."""

    async def close(self) -> None:
        """Release everything; idempotent."""


class ServiceFactory(Protocol):
    def __call__(self, config: OrbitConfig, db: Database, gate: ReadinessGate) -> Service: ...


async def serve(
    factory: ServiceFactory, config: OrbitConfig, *, stop: asyncio.Event | None = None
) -> None:
    """Run one service until ``stop`` is set or a termination signal arrives."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        log.info("received %s", signal.Signals(signum).name, extra={"signals": signals})
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    db = await open_database(
        config.database.parsed(), minsize=config.database.pool_min, maxsize=config.database.pool_max
    )
    gate = ReadinessGate(SchemaChecker(db), config.service.readiness_interval_s)
    service = factory(config, db, gate)
    try:
        await gate.refresh()
        if not gate.is_ready:
            log.warning("not ready yet", extra={"readiness": gate.details()})
        gate.start()
        await service.start()
        log.info("%s started", service.name)
        await stop.wait()
        log.info("%s draining", service.name)
        try:
            await asyncio.wait_for(service.drain(), config.service.drain_timeout_s)
        except TimeoutError:
            log.warning("%s drain timed out after %ss", service.name,
                        config.service.drain_timeout_s)
    finally:
        await service.close()
        await gate.stop()
        await db.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        log.info("%s stopped", service.name)


def run(factory: ServiceFactory, config: OrbitConfig, service_name: str) -> None:
    """Blocking entry point used by the CLI."""
    configure_logging(service_name, config.service.log_level, config.service.log_format)
    asyncio.run(serve(factory, config))

"""The process runner every daemon uses.

Lifecycle: configure JSON logging → open the database pool → start the readiness gate → serve
the operator listener (``/healthz``, the detailed ``/readyz`` and ``/metrics``) on
``[service] metrics_host:metrics_port`` for every daemon → start the service (whose public port,
if it has one, answers only ``/healthz`` and a bare ``/readyz``) → wait for SIGTERM/SIGINT
→ ``service.drain()`` (stop taking new work, finish in-flight transactions) bounded by
``drain_timeout_s`` → ``service.close()`` → close the pool. A second signal during the drain
stops waiting and closes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from typing import Protocol

from aiohttp import web

from orbit_common.db.pool import Database, open_database
from orbit_common.db.schema import SchemaChecker, packet_bytes_needed
from orbit_common.service.config import HttpConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.http.server import ServiceRunner, operator_app
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
    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        log.info("received %s", signal.Signals(signum).name, extra={"signals": signals})
        if stop.is_set():
            hurry.set()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    db = await open_database(
        config.database.parsed(), minsize=config.database.pool_min,
        maxsize=config.database.pool_max, session=config.database.session(),
    )
    # Every daemon reports whether the server's max_allowed_packet fits the result limit.
    checker = SchemaChecker(
        db, min_packet_bytes=packet_bytes_needed(config.dispatcher.max_result_bytes))
    gate = ReadinessGate(checker, config.service.readiness_interval_s)
    service = factory(config, db, gate)
    operator: web.AppRunner | None = None
    try:
        operator = await start_operator_server(
            gate, config.service.metrics_host, config.service.metrics_port, http=config.http
        )
        await gate.refresh()
        if not gate.is_ready:
            log.warning("not ready yet", extra={"readiness": gate.details()})
        gate.start()
        await service.start()
        # Everything alive now (modules, the application, the pools) lives as long as the
        # process: out of the collector's sight, a full collection -- one C call holding the
        # GIL, which a large request's parse triggers -- walks only what requests allocate.
        gc.freeze()
        # While a worker thread parses a large body, the event loop waits for the interpreter
        # lock after each system call (every receive and send): up to the switch interval
        # each time, 5 ms by default. 1 ms keeps a probe's answer within a few of those waits
        # (measured in tests/e2e/test_api_exhaustion.py: p99 47-63 ms against 75-88 ms).
        sys.setswitchinterval(0.001)
        log.info("%s started", service.name)
        await stop.wait()
        log.info("%s draining", service.name)
        await _drain(service, config.service.drain_timeout_s, hurry)
    finally:
        await service.close()
        if operator is not None:
            await operator.cleanup()
        await gate.stop()
        await db.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        log.info("%s stopped", service.name)


async def _drain(service: Service, timeout_s: float, hurry: asyncio.Event) -> None:
    """Drain within ``timeout_s``; a second signal (``hurry``) cuts it short."""
    drain = asyncio.create_task(service.drain(), name=f"{service.name}-drain")
    hurried = asyncio.create_task(hurry.wait(), name=f"{service.name}-hurry")
    done, _ = await asyncio.wait({drain, hurried}, timeout=timeout_s,
                                 return_when=asyncio.FIRST_COMPLETED)
    hurried.cancel()
    if drain in done:
        drain.result()
        return
    log.warning("%s drain cut short (%s)", service.name,
                "second signal" if hurried in done else f"timed out after {timeout_s}s")
    drain.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await drain


async def start_operator_server(gate: ReadinessGate, host: str, port: int, *,
                                http: HttpConfig | None = None) -> web.AppRunner:
    """Serve the operator listener (/healthz, the detailed /readyz, /metrics) on its own
    address, apart from any public port."""
    app = operator_app(gate)
    # ServiceRunner: a request the HTTP parser refuses is one WARNING line without its bytes
    # (aiohttp's own handler logs the offending header, credentials included, with a traceback).
    runner = ServiceRunner(app, access_log=None, http=http)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("operator listener (metrics, readiness details) listening",
             extra={"addresses": [str(a) for a in runner.addresses]})
    return runner


def run(factory: ServiceFactory, config: OrbitConfig, service_name: str) -> None:
    """Blocking entry point used by the CLI."""
    configure_logging(service_name, config.service.log_level, config.service.log_format)
    asyncio.run(serve(factory, config))

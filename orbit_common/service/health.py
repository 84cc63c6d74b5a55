"""Health, readiness and metrics endpoints shared by every process.

``/healthz`` answers 200 while the process runs its event loop. ``/readyz`` answers 200 only when
the last schema check passed (migrations applied, none dirty or edited, zero foreign keys) and
the database answered; otherwise 503 with the reasons. ``/metrics`` is Prometheus text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import prometheus_client
from aiohttp import web

from orbit_common.db.schema import SchemaChecker, SchemaReport

log = logging.getLogger(__name__)

READY = prometheus_client.Gauge("orbit_ready", "1 when the process passes its readiness checks.")


class ReadinessGate:
    """Re-checks the schema periodically; daemons wait on it before doing work."""

    def __init__(self, checker: SchemaChecker, interval_s: float = 5.0) -> None:
        self.checker = checker
        self.interval_s = interval_s
        self.report: SchemaReport | None = None
        self.error: str | None = None
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned: set[str] = set()

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    async def refresh(self) -> None:
        try:
            report = await self.checker.check()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported
            self.report, self.error = None, f"database check failed: {exc}"
            self._ready.clear()
        else:
            self.report, self.error = report, None
            for warning in report.warnings:
                if warning not in self._warned:
                    self._warned.add(warning)
                    log.warning("durability: %s", warning)
            if report.ready:
                self._ready.set()
            else:
                self._ready.clear()
        READY.set(1 if self.is_ready else 0)

    async def wait(self) -> None:
        await self._ready.wait()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="readiness-gate")

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def details(self) -> dict[str, Any]:
        if self.report is None:
            return {"ready": False, "problems": [self.error or "not checked yet"]}
        return self.report.to_json()


GATE_KEY = web.AppKey("readiness_gate", ReadinessGate)


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gate = request.app[GATE_KEY]
    await gate.refresh()
    return web.json_response(gate.details(), status=200 if gate.is_ready else 503)


async def metrics(_request: web.Request) -> web.Response:
    body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
    return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def add_health_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)

"""Health, readiness and metrics endpoints shared by every process.

``/healthz`` answers 200 while the process runs its event loop. ``/readyz`` answers 200 only when
the last schema check passed (migrations applied, none dirty or edited, zero foreign keys) and
the database answered; otherwise 503. ``/metrics`` is Prometheus text.

Two listeners serve them (docs/configuration.md, "运维监听"): a daemon's *public* port (the API's,
the dispatcher's worker port) answers ``/healthz`` and a ``/readyz`` that says only whether the
process is ready (:func:`add_public_routes`); the *operator* listener (``[service]
metrics_host:metrics_port``) answers ``/healthz``, ``/metrics`` and the detailed ``/readyz`` — the
reasons, migrations, durability settings and server version (:func:`add_operator_routes`).
Metrics name tenants (namespaces and queues) and readiness details describe the database: both
are for operators, never for whoever can reach a public port. Anyone can ask a public
``/readyz``, so it checks at most once per :data:`PUBLIC_CHECK_MAX_AGE_S` (concurrent requests
share one check); the operator's ``/readyz`` checks on every request.
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
# A public /readyz answers from a check at most this old: a flood of anonymous probes costs the
# database one schema check per second, not one per request.
PUBLIC_CHECK_MAX_AGE_S = 1.0


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
        self._checking = asyncio.Lock()  # one check at a time; waiters may reuse its answer
        self._checked_at: float | None = None  # loop time when the last check ended

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    async def refresh(self, *, max_age_s: float = 0.0) -> None:
        """Check the schema now, unless a check ended less than ``max_age_s`` ago (then its
        answer stands). Checks never overlap: a caller that waited for one in flight reuses it
        when it is recent enough."""
        async with self._checking:
            loop_time = asyncio.get_running_loop().time()
            if self._checked_at is not None and loop_time - self._checked_at < max_age_s:
                return
            await self._check()
            self._checked_at = asyncio.get_running_loop().time()

    async def _check(self) -> None:
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
    """The public answer: ready or not, nothing about the database or the migrations."""
    gate = request.app[GATE_KEY]
    await gate.refresh(max_age_s=PUBLIC_CHECK_MAX_AGE_S)
    return web.json_response({"ready": gate.is_ready}, status=200 if gate.is_ready else 503)


async def readyz_details(request: web.Request) -> web.Response:
    """The operator's answer: the reasons, migrations, durability settings, server version."""
    gate = request.app[GATE_KEY]
    await gate.refresh()
    return web.json_response(gate.details(), status=200 if gate.is_ready else 503)


async def metrics(_request: web.Request) -> web.Response:
    body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
    return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def add_public_routes(app: web.Application) -> None:
    """``/healthz`` and the bare ``/readyz`` of a public port (no metrics, no details)."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def add_operator_routes(app: web.Application) -> None:
    """``/healthz``, the detailed ``/readyz`` and ``/metrics`` of the operator listener."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz_details)
    app.router.add_get("/metrics", metrics)

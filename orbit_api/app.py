"""The API application and the API daemon."""

from __future__ import annotations

import logging

from aiohttp import web

from orbit_api import openapi
from orbit_api.console.app import add_console
from orbit_api.routes import (
    applications,
    interventions,
    platform,
    queues,
    schedules,
    subscription_stream,
    subscriptions,
    tasks,
    workflow_controls,
    workflow_recovery,
    workflow_signals,
    workflow_wait_recovery,
    workflows,
)
from orbit_common.db.pool import Database
from orbit_common.platform import principals
from orbit_common.service.config import OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.http.server import ServiceRunner, service_app

log = logging.getLogger(__name__)


def create_app(config: OrbitConfig, db: Database, gate: ReadinessGate) -> web.Application:
    """Build the aiohttp application (used by the daemon and by tests)."""
    app = service_app(config, db, gate, authenticate=principals.authenticate)
    app.router.add_get("/v1/openapi.json", openapi.openapi)
    add_console(app)  # the operator console's HTML pages under /console/ (docs/console.md)
    platform.add_routes(app)
    queues.add_routes(app)
    tasks.add_routes(app)
    interventions.add_routes(app)
    applications.add_routes(app)
    schedules.add_routes(app)
    subscriptions.add_routes(app)
    subscription_stream.add_routes(app)
    workflows.add_routes(app)
    workflow_signals.add_routes(app)
    workflow_controls.add_routes(app)
    workflow_recovery.add_routes(app)
    workflow_wait_recovery.add_routes(app)
    return app


for _module in (queues, tasks, interventions, applications, schedules, subscriptions,
                workflows, workflow_signals, workflow_controls, workflow_recovery,
                workflow_wait_recovery):
    openapi.merge(_module.OPENAPI_PATHS, _module.OPENAPI_SCHEMAS)
openapi.merge(subscription_stream.OPENAPI_PATHS, {})


class ApiService:
    """The ``orbit api`` daemon: serves the application until drained."""

    name = "api"

    def __init__(self, config: OrbitConfig, db: Database, gate: ReadinessGate) -> None:
        self.config = config
        self.app = create_app(config, db, gate)
        self.runner: ServiceRunner | None = None

    async def start(self) -> None:
        self.runner = ServiceRunner(
            self.app, access_log=None, shutdown_timeout=self.config.service.drain_timeout_s,
            http=self.config.http,
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.api.host, self.config.api.port)
        await site.start()
        log.info("api listening", extra={"host": self.config.api.host,
                                         "port": self.config.api.port})

    async def drain(self) -> None:
        # AppRunner.cleanup stops listening, lets in-flight requests finish (up to
        # shutdown_timeout) and then closes the connections.
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def close(self) -> None:
        await self.drain()

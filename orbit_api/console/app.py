"""The console as an aiohttp sub-application of the API, mounted at ``/console/``."""

from __future__ import annotations

import aiohttp_jinja2
import jinja2
from aiohttp import web

from orbit_api.console import (
    audit,
    auth,
    pages,
    schedules,
    subscriptions,
    tasks,
    workflows,
)
from orbit_api.console.web import HERE, PREFIX, console_middleware, duration, static, static_url


def console_app() -> web.Application:
    """The console as an aiohttp sub-application (mounted at ``/console/`` by the API)."""
    app = web.Application(middlewares=[console_middleware])
    env = aiohttp_jinja2.setup(
        app, loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True,
        undefined=jinja2.StrictUndefined, default_helpers=False)
    env.globals.update(static=static_url, prefix=PREFIX)
    env.filters["duration"] = duration
    auth.add_routes(app)
    app.router.add_get("/static/{digest}/{name}", static, name="console.static")
    pages.add_routes(app)
    tasks.add_routes(app)
    schedules.add_routes(app)
    subscriptions.add_routes(app)
    workflows.add_routes(app)
    audit.add_routes(app)
    return app


def add_console(app: web.Application) -> None:
    """Mount the console at ``/console/`` (``/console`` redirects there)."""
    async def bare(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect(f"{PREFIX}/")

    app.router.add_get(PREFIX, bare)
    app.add_subapp(f"{PREFIX}/", console_app())

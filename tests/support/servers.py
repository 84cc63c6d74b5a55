"""aiohttp's TestServer, served by Orbit's own runner (as the daemons are)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from orbit_common.service.http.server import ServiceRunner


class ServiceTestServer(TestServer):
    """A test server whose connections are the daemons' (parser refusals as problems, handlers
    not cancelled by a client disconnect)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        # The daemons keep aiohttp's default: a handler is not cancelled when its client goes.
        kwargs["handler_cancellation"] = False
        return ServiceRunner(self.app, **kwargs)

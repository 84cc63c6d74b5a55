"""aiohttp's TestServer, served by Orbit's own runner (as the daemons are)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from orbit_common.service.config import HttpConfig
from orbit_common.service.http.server import ServiceRunner


class ServiceTestServer(TestServer):
    """A test server whose connections are the daemons' (parser refusals as problems, handlers
    not cancelled by a client disconnect, the ``[http]`` limits: ``http``, else defaults)."""

    def __init__(self, app: web.Application, *, http: HttpConfig | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.http = http

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        # The daemons keep aiohttp's default: a handler is not cancelled when its client goes.
        kwargs["handler_cancellation"] = False
        return ServiceRunner(self.app, http=self.http, **kwargs)

"""The application builders and runner shared by the daemons.

:func:`service_app` builds a public aiohttp application (the API's, the dispatcher's) with
Orbit's middlewares, the public health routes and typed state; :func:`operator_app` builds the
operator listener's application (metrics and detailed readiness, orbit_common/service/health.py)
that every daemon serves on ``[service] metrics_host:metrics_port``. :class:`ServiceRunner`
serves both; unlike aiohttp's own runner, its connections answer the HTTP parser's refusals —
a request line or header field over the limit, a ``Content-Encoding`` aiohttp cannot decode,
anything that is not HTTP/1.1 — with a problem document (docs/api/errors.md) and log one
WARNING line, not a ``text/plain`` body and an ERROR traceback per request. Those requests never
reach the application or its middlewares.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import (
    ContentEncodingError,
    DecompressSizeError,
    HttpProcessingError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.service.config import OrbitConfig
from orbit_common.service.health import (
    GATE_KEY,
    ReadinessGate,
    add_operator_routes,
    add_public_routes,
)
from orbit_common.service.http import problems
from orbit_common.service.http.body import LIMIT_KEY
from orbit_common.service.http.context import AUTHENTICATE, CONFIG, DB, Authenticate
from orbit_common.service.http.middleware import (
    auth_middleware,
    metrics_middleware,
    problem_middleware,
    request_id_middleware,
)

log = logging.getLogger(__name__)


def service_app(config: OrbitConfig, db: Database, gate: ReadinessGate, *,
                authenticate: Authenticate) -> web.Application:
    """A public application with Orbit's middlewares, state and the public health routes
    (``/healthz``, a bare ``/readyz``; never ``/metrics``); add routes to it."""
    app = web.Application(
        # Outermost first: metrics see the final status, including problem documents.
        middlewares=[metrics_middleware, request_id_middleware, problem_middleware,
                     auth_middleware],
        # aiohttp enforces this while reading; read_json also checks Content-Length first.
        client_max_size=config.api.max_body_bytes,
    )
    app[DB] = db
    app[CONFIG] = config
    app[GATE_KEY] = gate
    app[LIMIT_KEY] = config.api.max_body_bytes
    app[AUTHENTICATE] = authenticate
    add_public_routes(app)
    return app


def operator_app(gate: ReadinessGate) -> web.Application:
    """The operator listener's application: ``/healthz``, the detailed ``/readyz`` and
    ``/metrics``; any other path is a 404 problem document. No credential: the listener is
    reached only by operators (bind it to loopback or a private network)."""
    app = web.Application(middlewares=[request_id_middleware, problem_middleware])
    app[GATE_KEY] = gate
    add_operator_routes(app)
    return app


def parser_error(exc: BaseException | None) -> errors.OrbitError:
    """The problem for a request the HTTP parser refused (``exc`` is aiohttp's error)."""
    if isinstance(exc, LineTooLong):
        # The C parser does not say whether the request line or a header was too long.
        return errors.RequestHeadTooLarge(
            "the request line (URL) or a header field is longer than the server accepts")
    if isinstance(exc, DecompressSizeError):
        return errors.PayloadTooLarge("the request body inflates beyond the size limit")
    if isinstance(exc, ContentEncodingError):
        if exc.__context__ is None:  # refused before any byte was decoded: no decoder for it
            return errors.UnsupportedContentEncoding(
                "this Content-Encoding is not supported (use identity, gzip or deflate)")
        return errors.ContentEncodingInvalid(
            "the request body does not decode with its Content-Encoding")
    return errors.MalformedHttpRequest("the request could not be parsed as HTTP/1.1")


class ProblemRequestHandler(RequestHandler):
    """A connection whose parser-level refusals are problem documents and one WARNING line."""

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if not (status < 500 and isinstance(exc, HttpProcessingError)):
            return super().handle_error(request, status, exc, message)
        error = parser_error(exc)
        log.warning("request refused by the HTTP parser: %s (%s)", error.code,
                    type(exc).__name__, extra={"code": error.code, "remote": request.remote})
        if request.writer.output_size > 0:  # an answer was already started; nothing to add
            raise ConnectionError("a response was already sent on this connection")
        response = problems.from_error(error)
        response.force_close()  # the parser's position in the stream is lost
        return response


class _ProblemServer(web.Server):
    def __call__(self) -> RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class ServiceRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are :class:`ProblemRequestHandler` instances."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer  # same state; only the connection class differs
        return server

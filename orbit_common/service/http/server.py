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

The connections also enforce the ``[http]`` limits (:class:`HttpConfig`, docs/configuration.md):

* the request head must arrive within ``header_timeout_s`` of the accept or, on a keep-alive
  connection, of the next request's first byte; otherwise the answer is 408 ``request_timeout``
  (queued behind the answers already owed, so never in the middle of one) and the connection
  closes. An idle keep-alive connection closes after ``keepalive_timeout_s`` (aiohttp's timer);
* the body must arrive within ``body_timeout_s`` of its head: the handler's read of it fails with
  408 ``request_timeout`` (the answer closes the connection), or, when no handler is reading it,
  the connection is closed;
* a client address (an IPv6 /64) holds at most ``max_connections_per_client`` connections; one
  more is answered 503 ``too_many_connections`` at accept, without reading its request, and
  closed. A WebSocket counts as the connection it is; the read timers stop at its upgrade.

Each closing is counted in :data:`CONNECTION_LIMITS` and logged in one line (an INFO line per
timeout; refusals, a WARNING line a minute per client address). A connection closed with an
answer (a 408, a 503 refusal) closes gracefully (RFC 9112 §9.6): the answer is followed by a
half-close and the input is read and discarded until the client closes or :data:`LINGER_S`
pass, so that a client still sending reads the answer instead of a connection reset.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
from typing import Any, cast

import prometheus_client
from aiohttp import web
from aiohttp.http_exceptions import (
    ContentEncodingError,
    DecompressSizeError,
    HttpProcessingError,
    LineTooLong,
)
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.service.config import HttpConfig, OrbitConfig
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

CONNECTION_LIMITS = prometheus_client.Counter(
    "orbit_http_connections_limited_total",
    "Connections closed by an [http] limit, by reason: header_timeout, body_timeout, "
    "too_many_connections.",
    ["reason"],
)

# How long a connection refused at accept is kept open (reading and discarding) after its 503,
# so that closing it does not reset the answer away before the client has read it.
LINGER_S = 2.0
# Refusals of one client address are logged at most once in this many seconds.
REFUSAL_LOG_INTERVAL_S = 60.0


def service_app(config: OrbitConfig, db: Database, gate: ReadinessGate, *,
                authenticate: Authenticate, max_body_bytes: int | None = None) -> web.Application:
    """A public application with Orbit's middlewares, state and the public health routes
    (``/healthz``, a bare ``/readyz``; never ``/metrics``); add routes to it. Request bodies are
    at most ``max_body_bytes`` (default: ``[api].max_body_bytes``)."""
    limit = config.api.max_body_bytes if max_body_bytes is None else max_body_bytes
    app = web.Application(
        # Outermost first: metrics see the final status, including problem documents.
        middlewares=[metrics_middleware, request_id_middleware, problem_middleware,
                     auth_middleware],
        # aiohttp enforces this while reading; read_json also checks Content-Length first.
        client_max_size=limit,
    )
    app[DB] = db
    app[CONFIG] = config
    app[GATE_KEY] = gate
    app[LIMIT_KEY] = limit
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


def client_key(peername: Any) -> str:
    """The address whose connections are counted together: an IPv4 address, an IPv6 /64 (one
    host's usual allocation), ``local`` for a Unix socket."""
    if not isinstance(peername, tuple) or not peername:
        return "local"
    try:
        address = ipaddress.ip_address(peername[0])
    except ValueError:
        return str(peername[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class ProblemRequestHandler(RequestHandler):
    """A connection whose parser-level refusals are problem documents and one WARNING line, and
    whose reads are bounded in time and count against its client address (module docstring)."""

    def __init__(self, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        server = cast(_ProblemServer, manager)
        self._http = server.http
        self._clients = server.clients
        self._refused_clients = server.refused
        self._client: str | None = None  # the key this admitted connection counts against
        self._refused: asyncio.TimerHandle | None = None  # refused at accept: its close timer
        self._expired = False  # a read timeout fired: the rest of the input is ignored
        self._close_after_answer = False  # a read timed out: its answer closes the connection
        self._lingering: asyncio.TimerHandle | None = None  # closed gracefully: its close timer
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._last_payload: StreamReader | None = None  # the body of the latest request head

    # --- connection admission --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        key = client_key(transport.get_extra_info("peername"))
        limit = self._http.max_connections_per_client
        if limit and self._clients[key] >= limit:
            self._refuse(cast(asyncio.Transport, transport), key, limit)
            return
        self._clients[key] += 1
        self._client = key
        super().connection_made(transport)
        self._head_timer = self._loop.call_later(self._http.header_timeout_s,
                                                 self._head_timed_out)

    def _refuse(self, transport: asyncio.Transport, key: str, limit: int) -> None:
        CONNECTION_LIMITS.labels("too_many_connections").inc()
        now = self._loop.time()
        if now - self._refused_clients.get(key, -REFUSAL_LOG_INTERVAL_S) >= (
                REFUSAL_LOG_INTERVAL_S):  # one line a minute per address; the metric counts all
            if len(self._refused_clients) >= 10_000:
                self._refused_clients.clear()
            self._refused_clients[key] = now
            log.warning("connections refused: the client address holds %d connections", limit,
                        extra={"code": "too_many_connections", "client": key})
        transport.write(problems.raw_response(errors.TooManyConnections(
            f"this client address already holds {limit} connections; close some or retry")))
        self.transport = transport
        self._refused = self._linger(transport)

    def _linger(self, transport: asyncio.WriteTransport) -> asyncio.TimerHandle:
        """Half-closes ``transport`` after what is buffered (the answer) and closes it after
        :data:`LINGER_S`, or earlier at the client's EOF (:meth:`eof_received`); meanwhile its
        input is discarded. Closing at once would answer a client still sending with a reset,
        which on the client's side may discard the answer before it is read."""
        if transport.can_write_eof():
            transport.write_eof()
        return self._loop.call_later(LINGER_S, transport.close)

    def eof_received(self) -> None:
        if (self._refused is not None or self._lingering is not None) and (
                self.transport is not None):
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused is not None:  # never admitted: aiohttp's server never knew of it
            self._refused.cancel()
            self.transport = None
            return
        for timer in (self._head_timer, self._body_timer, self._lingering):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._lingering = None
        if self._client is not None:
            self._clients[self._client] -= 1
            if self._clients[self._client] <= 0:
                del self._clients[self._client]
            self._client = None
        super().connection_lost(exc)

    # --- read timeouts ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused is not None or self._expired:
            return
        if self._payload_parser is not None or self._upgraded:
            super().data_received(data)  # a WebSocket after its upgrade: no read timers
            return
        last = self._last_payload
        if data and self._head_timer is None and (last is None or last.is_eof()):
            # The previous request is complete, so these bytes begin the next request's head.
            self._head_timer = self._loop.call_later(self._http.header_timeout_s,
                                                     self._head_timed_out)
        heads = self._request_count
        super().data_received(data)
        if self._request_count == heads or not self._messages:
            return
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        payload = self._messages[-1][1]
        self._last_payload = payload
        if not payload.is_eof():
            if self._body_timer is not None:
                self._body_timer.cancel()
            self._body_timer = self._loop.call_later(self._http.body_timeout_s,
                                                     self._body_timed_out, payload)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._force_close or self._close or self.transport is None:
            return
        self._expired = True
        timeout = self._http.header_timeout_s
        CONNECTION_LIMITS.labels("header_timeout").inc()
        log.info("request head not received within %s s; closing the connection", timeout,
                 extra={"code": "request_timeout", "client": self._client})
        error = errors.RequestTimeout(f"the request head did not arrive within {timeout} s")
        # Answered like a parser refusal, after the answers already owed on this connection.
        self._messages.append((_ErrInfo(status=408, exc=error, message=error.detail),
                               EMPTY_PAYLOAD))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _body_timed_out(self, payload: StreamReader) -> None:
        self._body_timer = None
        if payload.is_eof() or payload.exception() is not None or self.transport is None:
            return
        self._expired = True
        timeout = self._http.body_timeout_s
        CONNECTION_LIMITS.labels("body_timeout").inc()
        log.info("request body not received within %s s; closing the connection", timeout,
                 extra={"code": "request_timeout", "client": self._client})
        request = self._current_request
        if request is not None and request.content is payload and request.writer.output_size == 0:
            # Its handler answers: reading the body fails with 408 (read_document), and the
            # answer closes the connection (finish_response).
            self._close_after_answer = True
            payload.set_exception(errors.RequestTimeout(
                f"the request body did not arrive within {timeout} s"))
        else:  # no handler reads it (one answered already, or none has started): just close
            self.force_close()

    async def finish_response(self, request: BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        if self._close_after_answer and not resp.prepared:
            resp.force_close()
        result = await super().finish_response(request, resp, start_time)
        if self._close_after_answer:
            # Now, not after aiohttp's lingering read of the rest of the body (which would
            # raise the timeout again, as an unhandled error).
            self._close_gracefully()
        return result

    def _close_gracefully(self) -> None:
        """Ends the connection after its last answer without a reset (:meth:`_linger`)."""
        self._force_close = True  # aiohttp's loop ends and leaves the transport to us
        if self._waiter is not None:
            self._waiter.cancel()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self._lingering = self._linger(transport)

    # --- answers to requests the parser refused --------------------------------------------

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, errors.RequestTimeout):  # logged when its timer fired
            error: errors.OrbitError = exc
        elif status < 500 and isinstance(exc, HttpProcessingError):
            error = parser_error(exc)
            log.warning("request refused by the HTTP parser: %s (%s)", error.code,
                        type(exc).__name__, extra={"code": error.code, "remote": request.remote})
        else:
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:  # an answer was already started; nothing to add
            raise ConnectionError("a response was already sent on this connection")
        if isinstance(error, errors.RequestTimeout):
            self._close_after_answer = True
        response = problems.from_error(error)
        response.force_close()  # the parser's position in the stream is lost
        return response


class _ProblemServer(web.Server):
    http: HttpConfig
    clients: collections.Counter[str]  # admitted connections per client key
    refused: dict[str, float]  # client key -> when its last refusal was logged (loop time)

    def __call__(self) -> RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class ServiceRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are :class:`ProblemRequestHandler` instances,
    enforcing ``http`` (``[http]``; its defaults when not given)."""

    def __init__(self, app: web.Application, *, http: HttpConfig | None = None,
                 **kwargs: Any) -> None:
        self.http = (http or HttpConfig()).checked()
        kwargs.setdefault("keepalive_timeout", self.http.keepalive_timeout_s)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer  # same state; only the connection class differs
        problem_server = cast(_ProblemServer, server)
        problem_server.http = self.http
        problem_server.clients = collections.Counter()
        problem_server.refused = {}
        return server

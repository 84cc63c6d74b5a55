"""Middlewares: request id, problem documents for every error, bearer authentication, metrics.

Metrics: ``orbit_http_requests_total`` and ``orbit_http_request_seconds`` by route template
(a request whose client went away before its body arrived counts as status 499, nginx's "client
closed request": nothing was answered, and it is neither a server error nor a bad request);
:data:`BACKPRESSURE_REFUSALS` (``orbit_backpressure_refusals_total{code}``) for every 429
answer, by problem code (the dispatcher also counts its ``start_rate_limited`` refusals in it).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import prometheus_client
from aiohttp import web

from orbit_common import errors
from orbit_common.service.http import problems
from orbit_common.service.http.body import ClientDisconnected
from orbit_common.service.http.context import (
    AUTHENTICATE,
    CLIENT_GONE,
    DB,
    PRINCIPAL,
    REQUEST_ID,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HTTP_REQUESTS = prometheus_client.Counter(
    "orbit_http_requests_total",
    "HTTP requests answered, by route template, method and status.",
    ["route", "method", "status"],
)
HTTP_SECONDS = prometheus_client.Histogram(
    "orbit_http_request_seconds",
    "Time to answer an HTTP request, by route template and method.",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
BACKPRESSURE_REFUSALS = prometheus_client.Counter(
    "orbit_backpressure_refusals_total",
    "Requests refused by a flow-control limit (HTTP 429), by problem code.",
    ["code"],
)

# Paths that need no credential. Everything else under /v1 does.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/v1/openapi.json"})


def _route_label(request: web.Request) -> str:
    """The route template (never the raw path: ids would explode the label set)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    route = _route_label(request)
    HTTP_SECONDS.labels(route, request.method).observe(time.perf_counter() - started)
    status = "499" if request.get(CLIENT_GONE) else str(response.status)
    HTTP_REQUESTS.labels(route, request.method, status).inc()
    return response


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if 0 < len(incoming) <= 64 and incoming.isprintable() else (
        secrets.token_hex(8)
    )
    request[REQUEST_ID] = request_id
    response = await handler(request)
    response.headers["X-Request-Id"] = request_id
    return response


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    instance = request.path
    try:
        return await handler(request)
    except errors.OrbitError as exc:
        if exc.status == 429:  # a flow-control limit refused the request; nothing was written
            BACKPRESSURE_REFUSALS.labels(exc.code).inc()
        if exc.status >= 500:
            log.warning("request failed: %s", exc, extra={"code": exc.code, "path": instance,
                                                          "request_id": request.get(REQUEST_ID)})
        return problems.from_error(exc, instance)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return problems.from_http(exc, instance)
    except ClientDisconnected as exc:
        # Not a server error: the client went away mid-body. Nothing was read, nothing written;
        # the answer below is never delivered (aiohttp drops it with the connection).
        request[CLIENT_GONE] = True
        log.info("client disconnected while sending the request body: %s", exc,
                 extra={"path": instance, "request_id": request.get(REQUEST_ID)})
        return problems.problem(
            status=400, code="bad_request", title="Bad request",
            detail="the client disconnected while sending the request body", instance=instance,
        )
    except Exception:
        log.exception("unhandled error", extra={"path": instance,
                                                "request_id": request.get(REQUEST_ID)})
        return problems.problem(
            status=500, code="internal_error", title="Internal error",
            detail="an unexpected error occurred; the request id identifies it in the logs",
            instance=instance,
        )


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS or not request.path.startswith("/v1/"):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise errors.Unauthenticated("send Authorization: Bearer <api key>")
    if scheme.lower() != "bearer" or not token.strip():
        raise errors.Unauthenticated("the Authorization header must be 'Bearer <api key>'")
    request[PRINCIPAL] = await request.app[AUTHENTICATE](request.app[DB], token.strip())
    return await handler(request)

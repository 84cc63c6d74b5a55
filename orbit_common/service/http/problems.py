"""RFC 9457 problem documents: every HTTP error Orbit returns has this shape and a stable ``code``.

``type`` is a relative URI ``/problems/<code>`` documented in docs/api/errors.md.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from aiohttp import web

from orbit_common import errors

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"


def document(
    *, status: int, code: str, title: str, detail: str, instance: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The problem document itself (the body of :func:`problem`)."""
    doc: dict[str, Any] = {
        "type": f"/problems/{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance:
        doc["instance"] = instance
    doc.update(extra)
    return doc


def problem(
    *, status: int, code: str, title: str, detail: str, instance: str | None = None,
    **extra: Any,
) -> web.Response:
    doc = document(status=status, code=code, title=title, detail=detail, instance=instance,
                   **extra)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="orbit"'
    if isinstance(extra.get("retry_after_s"), int):
        headers["Retry-After"] = str(extra["retry_after_s"])
    return web.Response(
        status=status,
        body=json.dumps(doc, ensure_ascii=False).encode(),
        content_type=CONTENT_TYPE,
        headers=headers,
    )


def raw_response(error: errors.OrbitError) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response for ``error``, for a connection that has
    no request to answer (refused at accept)."""
    body = json.dumps(document(status=error.status, code=error.code, title=error.title,
                               detail=error.detail), ensure_ascii=False).encode()
    head = (f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
            f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("ascii") + body


def from_error(error: errors.OrbitError, instance: str | None = None) -> web.Response:
    extra: dict[str, Any] = {}
    if isinstance(error, errors.ValidationFailed):
        extra["errors"] = error.errors
    extra.update(error.extra)
    return problem(
        status=error.status, code=error.code, title=error.title, detail=error.detail,
        instance=instance, **extra,
    )


_HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("bad_request", "Bad request"),
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    413: ("payload_too_large", "The request body is too large"),
    415: ("unsupported_media_type", "The request body must be application/json"),
}


def from_http(exc: web.HTTPException, instance: str | None = None) -> web.Response:
    code, title = _HTTP_CODES.get(exc.status, ("http_error", exc.reason))
    response = problem(
        status=exc.status, code=code, title=title, detail=exc.text or title, instance=instance
    )
    if exc.status == 405 and "Allow" in exc.headers:
        response.headers["Allow"] = exc.headers["Allow"]
    return response

"""Reading request bodies and query strings strictly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aiohttp import web

from orbit_common import errors
from orbit_common.model import jsondoc, strict

T = TypeVar("T")

# aiohttp inflates these; anything else would reach the JSON parser as opaque bytes.
ACCEPTED_ENCODINGS = frozenset({"identity", "gzip", "deflate"})
UNSUPPORTED_ENCODING = (
    "Content-Encoding {encoding!r} is not supported (use identity, gzip or deflate)"
)
CORRUPT_ENCODING = "the request body does not decode as Content-Encoding {encoding!r}"


class ClientDisconnected(Exception):
    """The client closed the connection while its request body was being read."""


async def read_json(request: web.Request, cls: type[T],
                    precheck: Callable[[bytes], None] | None = None) -> tuple[T, Any]:
    """Parse a JSON body into ``cls``; returns the DTO and the raw document. ``precheck`` sees
    the raw bytes before anything is parsed (e.g. a bound on the items of a batch)."""
    document = await read_document(request, precheck=precheck)
    return strict.structure(document, cls), document


async def read_document(request: web.Request, *,
                        precheck: Callable[[bytes], None] | None = None, **parse: Any) -> Any:
    """A strictly parsed JSON body: content type, encoding and size checked first."""
    content_type = request.content_type
    if content_type != "application/json":
        raise errors.UnsupportedMediaType(
            f"Content-Type must be application/json, not {content_type or 'missing'}"
        )
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ACCEPTED_ENCODINGS:
        raise errors.UnsupportedContentEncoding(UNSUPPORTED_ENCODING.format(encoding=encoding))
    limit = request.app[_LIMIT]
    if request.content_length is not None and request.content_length > limit:
        raise errors.PayloadTooLarge(f"the body may be at most {limit} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise errors.PayloadTooLarge(f"the body may be at most {limit} bytes") from exc
    except web.RequestPayloadError as exc:  # e.g. a gzip Content-Encoding that does not inflate
        raise errors.ContentEncodingInvalid(CORRUPT_ENCODING.format(encoding=encoding)) from exc
    except ConnectionError as exc:  # the client went away before its body arrived in full
        raise ClientDisconnected(str(exc) or type(exc).__name__) from exc
    # A body slower than [http] body_timeout_s fails the read with errors.RequestTimeout (408;
    # the connection's timer sets it, server.ProblemRequestHandler), an OrbitError as it is.
    if not raw:
        raise errors.MalformedJson("the request body is empty")
    if len(raw) <= PARSE_INLINE_BYTES:
        return _parse(raw, precheck, parse)
    # A large body takes tens to hundreds of milliseconds to check and parse: off the event
    # loop, so the process keeps answering everyone else (health probes included) meanwhile.
    return await asyncio.to_thread(_parse, raw, precheck, parse)


# Bodies up to this size parse (and are checked) in well under a millisecond, on the event
# loop; work on a larger one runs on a worker thread (read_document, off_loop).
PARSE_INLINE_BYTES = 64 * 1024


def _parse(raw: bytes, precheck: Callable[[bytes], None] | None, parse: dict[str, Any]) -> Any:
    if precheck is not None:
        precheck(raw)
    parse.setdefault("max_containers", jsondoc.MAX_CONTAINERS)
    return jsondoc.loads_strict(raw, **parse)


async def off_loop(size: int, work: Callable[[], T]) -> T:
    """``work()`` -- CPU-bound handling of a request body of ``size`` bytes (exact parsing,
    validation, digests) -- on a worker thread when the body is large: a 1 MiB body costs
    hundreds of milliseconds, which on the event loop would delay every other request (health
    probes included). In the thread the interpreter hands the GIL back to the loop every few
    milliseconds. Small bodies run inline (the thread hop would cost more than the work)."""
    if size <= PARSE_INLINE_BYTES:
        return work()
    return await asyncio.to_thread(work)


_LIMIT = web.AppKey("max_body_bytes", int)
LIMIT_KEY = _LIMIT


def query_params(request: web.Request, allowed: Iterable[str]) -> dict[str, str]:
    """The query string as a dict; unknown or repeated parameters are refused."""
    allowed = set(allowed)
    result: dict[str, str] = {}
    problems = []
    for key, value in request.query.items():
        if key not in allowed:
            problems.append({"path": f"?{key}", "message": "unknown query parameter"})
        elif key in result:
            problems.append({"path": f"?{key}", "message": "given more than once"})
        else:
            result[key] = value
    if problems:
        raise errors.ValidationFailed(problems)
    return result


def int_param(params: dict[str, str], name: str, *, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    # isascii: "²" and other Unicode digits pass isdigit() but not int(); the length bound keeps
    # int() away from its digit limit.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or not low <= int(raw) <= high:
        raise errors.ValidationFailed(
            [{"path": f"?{name}", "message": f"an integer from {low} to {high}"}]
        )
    return int(raw)

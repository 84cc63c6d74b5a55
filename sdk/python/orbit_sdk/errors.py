"""One exception tree for everything the SDK raises, rooted at :class:`OrbitError`.

HTTP errors are parsed from RFC 9457 problem documents (``docs/api/errors.md``): the stable
machine ``code`` picks the subclass, the HTTP status picks it when the code is not one the SDK
knows. Handlers signal their outcome with :class:`RetryableError` and :class:`OutcomeUnknown`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "IdempotencyConflict",
    "NotFound",
    "OrbitError",
    "OutcomeUnknown",
    "ProtocolError",
    "QueueFull",
    "QuotaExceeded",
    "RetryableError",
    "ServerError",
    "ServiceUnavailable",
    "SessionLost",
    "StaleRevision",
    "TooManyRequests",
    "Unauthorized",
    "ValidationError",
    "error_from_problem",
]


class OrbitError(Exception):
    """An error answered by Orbit (or met on the way to it).

    ``status`` is the HTTP status (``None`` when no response arrived), ``code`` the stable
    machine code, ``detail`` the human text, ``errors`` the per-field problems of a
    ``validation_failed`` answer (``[{"path": "$.name", "message": "…"}]``).
    """

    default_code: ClassVar[str] = "error"

    def __init__(
        self,
        detail: str = "",
        *,
        status: int | None = None,
        code: str | None = None,
        errors: list[dict[str, Any]] | None = None,
        title: str | None = None,
        request_id: str | None = None,
        problem: Mapping[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.code = code or self.default_code
        self.detail = detail
        self.errors: list[dict[str, Any]] = list(errors or [])
        self.title = title
        self.request_id = request_id
        self.problem: dict[str, Any] = dict(problem or {})
        self.retry_after: float | None = None  # seconds, from a Retry-After header
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.status} {self.code}" if self.status is not None else self.code
        text = f"{head}: {self.detail}" if self.detail else head
        if self.errors:
            text += " (" + "; ".join(
                f"{e.get('path', '?')}: {e.get('message', '')}" for e in self.errors
            ) + ")"
        return text


class BadRequest(OrbitError):
    """400: the request was refused as it stands."""

    default_code = "bad_request"


class ValidationError(BadRequest):
    """400 ``validation_failed`` (or ``definition_invalid``, a refused workflow definition):
    ``errors`` points at each offending field."""

    default_code = "validation_failed"


class Unauthorized(OrbitError):
    """401: no credential, or one Orbit does not accept."""

    default_code = "unauthenticated"


class Forbidden(OrbitError):
    """403: the credential may not do this."""

    default_code = "forbidden"


class NotFound(OrbitError):
    """404: no such resource for this credential (``task_not_found``, ``queue_not_found``…)."""

    default_code = "not_found"


class Conflict(OrbitError):
    """409: the request conflicts with the resource's current state."""

    default_code = "conflict"


class IdempotencyConflict(Conflict):
    """409 ``idempotency_conflict``: the key was used with a different request."""

    default_code = "idempotency_conflict"


class StaleRevision(Conflict):
    """409 ``stale_revision``: re-read the resource and try again."""

    default_code = "stale_revision"


class SessionLost(Conflict):
    """409 ``session_lost``: the worker session was fenced or expired; register a new one."""

    default_code = "session_lost"


class TooManyRequests(OrbitError):
    """429: a flow-control limit refused the request and **nothing was written** (a batch is
    refused whole). ``retry_after`` is the server's ``Retry-After`` in seconds. The client does
    not retry these on its own: back off, shed load, or raise the limit."""

    default_code = "too_many_requests"

    def __init__(self, detail: str = "", **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        seconds = self.problem.get("retry_after_s")
        if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0:
            self.retry_after = float(seconds)

    @property
    def limit(self) -> int | None:
        """The limit that refused the request, when the server says."""
        value = self.problem.get("limit")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class QueueFull(TooManyRequests):
    """429 ``queue_full``: the queue holds ``max_unfinished_tasks`` unfinished tasks."""

    default_code = "queue_full"


class QuotaExceeded(TooManyRequests):
    """429 ``application_quota_exceeded``: the application's namespaces together hold its
    ``max_unfinished_tasks`` unfinished tasks."""

    default_code = "application_quota_exceeded"


class ServerError(OrbitError):
    """5xx other than 503: a server fault (report it with ``request_id``)."""

    default_code = "internal_error"


class ServiceUnavailable(OrbitError):
    """503: temporarily unavailable; safe to retry an idempotent call."""

    default_code = "service_unavailable"


class ConnectionFailed(OrbitError):
    """No answer arrived (connection refused or reset, timeout): the effect is unknown."""

    default_code = "connection_failed"


class ProtocolError(OrbitError):
    """The dispatcher answered a worker message with an ``error`` frame, or something the SDK
    could not understand."""

    default_code = "protocol_error"


class RetryableError(Exception):
    """Raise from a handler to report a failure that is safe to retry (``retryable=true``).

    Any exception with a true ``retryable`` attribute counts as well. Every other exception is
    reported as a non-retryable failure: a retry needs explicit evidence that it is safe.
    """

    retryable: bool = True


class OutcomeUnknown(Exception):
    """Raise from a handler when it cannot tell whether its effect happened: the attempt is
    reported ``unknown`` and the task waits for a human review (NEEDS_REVIEW)."""


_BY_CODE: dict[str, type[OrbitError]] = {
    "validation_failed": ValidationError,
    "definition_invalid": ValidationError,
    "idempotency_conflict": IdempotencyConflict,
    "stale_revision": StaleRevision,
    "session_lost": SessionLost,
    "queue_full": QueueFull,
    "application_quota_exceeded": QuotaExceeded,
}
_BY_STATUS: dict[int, type[OrbitError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def error_class(status: int | None, code: str | None) -> type[OrbitError]:
    """The exception class for a status and code: the code decides when the SDK knows it."""
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    if status is not None:
        if status in _BY_STATUS:
            return _BY_STATUS[status]
        if status >= 500:
            return ServerError
        if 400 <= status < 500:
            return BadRequest
    return OrbitError


def error_from_problem(status: int, body: bytes, *, request_id: str | None = None) -> OrbitError:
    """The exception for an HTTP error response; tolerates bodies that are not problems."""
    problem: dict[str, Any] = {}
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        problem = parsed
    code = problem.get("code")
    code = code if isinstance(code, str) else None
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = body[:200].decode("utf-8", "replace") if not problem else ""
    raw_errors = problem.get("errors")
    field_errors = [e for e in raw_errors if isinstance(e, dict)] if isinstance(
        raw_errors, list) else []
    title = problem.get("title")
    cls = error_class(status, code)
    return cls(detail, status=status, code=code or _default_code(cls, status),
               errors=field_errors, title=title if isinstance(title, str) else None,
               request_id=request_id, problem=problem)


def _default_code(cls: type[OrbitError], status: int) -> str:
    if cls is OrbitError or (cls is BadRequest and status != 400):
        return "http_error"
    return cls.default_code

"""The one exception tree of Orbit.

Every error a user can see knows its HTTP status and a stable machine ``code``; the API turns it
into an RFC 9457 problem document. Codes are part of the public contract (docs/api/errors.md):
never rename one.
"""

from __future__ import annotations

from typing import Any, ClassVar


class OrbitError(Exception):
    """Base of every Orbit error."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.extra = extra


# --- request problems (4xx) -------------------------------------------------------------------


class BadRequest(OrbitError):
    status = 400
    code = "bad_request"
    title = "Bad request"


class MalformedJson(BadRequest):
    code = "malformed_json"
    title = "The request body is not valid JSON"


class DuplicateJsonKey(BadRequest):
    code = "duplicate_json_key"
    title = "The request body repeats a key in one object"


class JsonTooDeep(BadRequest):
    code = "json_too_deep"
    title = "The request body nests too deeply"


class JsonTooComplex(BadRequest):
    code = "json_too_complex"
    title = "The JSON document holds too many arrays and objects"


MAX_LISTED_ERRORS = 100


class ValidationFailed(BadRequest):
    """``errors`` lists at most :data:`MAX_LISTED_ERRORS` problems (the answer's size is bounded
    whatever the request); when there were more, ``errors_omitted`` says how many were left
    out."""

    code = "validation_failed"
    title = "The request does not match the expected shape"

    def __init__(self, errors: list[dict[str, str]], detail: str | None = None) -> None:
        first = errors[0] if errors else {"path": "$", "message": "invalid"}
        omitted = max(0, len(errors) - MAX_LISTED_ERRORS)
        extra = {"errors_omitted": omitted} if omitted else {}
        super().__init__(detail or f"{first['path']}: {first['message']}", **extra)
        self.errors = errors[:MAX_LISTED_ERRORS]


class DefinitionInvalid(ValidationFailed):
    """A workflow definition refused by the validator (orbit_common.weave.language): each item of
    ``errors`` has the JSON path of the offending part and its own ``code``."""

    code = "definition_invalid"
    title = "The workflow definition is not valid"


class InvalidCursor(BadRequest):
    code = "invalid_cursor"
    title = "The cursor is malformed or belongs to another query"


class Unauthenticated(OrbitError):
    status = 401
    code = "unauthenticated"
    title = "Authentication required"


class InvalidCredential(Unauthenticated):
    code = "invalid_credential"
    title = "The credential is unknown, revoked or belongs to a disabled application"


class ConsoleLoginFailed(Unauthenticated):
    code = "console_login_failed"
    title = "The console name or password is wrong"


class ConsoleSessionInvalid(Unauthenticated):
    """No console session, or one that expired (idle or absolute), was revoked (logout, a
    password change) or whose bound credential no longer works."""

    code = "console_session_invalid"
    title = "The console session is missing, expired or revoked"


class CsrfTokenInvalid(OrbitError):
    status = 403
    code = "csrf_token_invalid"
    title = "The form's CSRF token is missing or does not match the session"


class Forbidden(OrbitError):
    status = 403
    code = "forbidden"
    title = "The credential is not allowed to do this"


class NotFound(OrbitError):
    status = 404
    code = "not_found"
    title = "Not found"


class NamespaceNotFound(NotFound):
    code = "namespace_not_found"
    title = "No such namespace for this credential"


class ApplicationNotFound(NotFound):
    code = "application_not_found"
    title = "No such application"


class CredentialNotFound(NotFound):
    code = "credential_not_found"
    title = "No such credential"


class MethodNotAllowed(OrbitError):
    status = 405
    code = "method_not_allowed"
    title = "Method not allowed"


class Conflict(OrbitError):
    status = 409
    code = "conflict"
    title = "Conflict"


class AlreadyExists(Conflict):
    code = "already_exists"
    title = "A resource with this name already exists"


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"
    title = "The idempotency key was used with a different request"


class StaleRevision(Conflict):
    code = "stale_revision"
    title = "The resource changed since it was read"


class TooManyRequests(OrbitError):
    """A limit refused the request; nothing was written. ``retry_after_s`` becomes the
    ``Retry-After`` header and a field of the problem document."""

    status = 429
    code = "too_many_requests"
    title = "Too many requests"

    def __init__(self, detail: str | None = None, *, retry_after_s: int = 1,
                 **extra: Any) -> None:
        super().__init__(detail, retry_after_s=retry_after_s, **extra)


class ConsoleLoginThrottled(TooManyRequests):
    code = "console_login_throttled"
    title = "Too many failed console logins; wait before trying again"


class QueueFull(TooManyRequests):
    code = "queue_full"
    title = "Queue full"


class ApplicationQuotaExceeded(TooManyRequests):
    code = "application_quota_exceeded"
    title = "Application quota exceeded"


class RequestTimeout(OrbitError):
    """The request head or body did not arrive in time ([http] header/body_timeout_s)."""

    status = 408
    code = "request_timeout"
    title = "The request did not arrive in time"


class PayloadTooLarge(OrbitError):
    status = 413
    code = "payload_too_large"
    title = "The request body is too large"


class ResultTooLarge(PayloadTooLarge):
    """A finish report whose results and errors exceed ``[dispatcher].max_result_bytes``: the
    whole request is refused and changes nothing; the lease continues, so the worker can report
    the attempt another way (e.g. ``failed``) before it expires."""

    code = "result_too_large"
    title = "The finish report's results are larger than the dispatcher stores"


class UnsupportedMediaType(OrbitError):
    status = 415
    code = "unsupported_media_type"
    title = "The request body must be application/json"


class UnsupportedContentEncoding(UnsupportedMediaType):
    code = "unsupported_content_encoding"
    title = "The request body's Content-Encoding is not supported"


class ContentEncodingInvalid(BadRequest):
    code = "content_encoding_invalid"
    title = "The request body does not decode with its Content-Encoding"


class RequestHeadTooLarge(BadRequest):
    code = "request_head_too_large"
    title = "The request line or a header field is too long"


class MalformedHttpRequest(BadRequest):
    code = "malformed_http_request"
    title = "The request is not valid HTTP/1.1"


class BinaryFrameUnsupported(BadRequest):
    """A worker WebSocket frame that is binary (the protocol is JSON text frames)."""

    code = "binary_frame_unsupported"
    title = "WebSocket frames must be JSON text frames"


# --- server-side problems (5xx) ----------------------------------------------------------------


class ServiceUnavailable(OrbitError):
    status = 503
    code = "service_unavailable"
    title = "The service is temporarily unavailable"


class TooManyConnections(ServiceUnavailable):
    """A client address already holds [http] max_connections_per_client connections."""

    code = "too_many_connections"
    title = "Too many connections from this client address"


class DatabaseUnavailable(ServiceUnavailable):
    code = "database_unavailable"
    title = "The database could not be reached"


class TransactionRetriesExhausted(ServiceUnavailable):
    code = "transaction_retries_exhausted"
    title = "The transaction kept conflicting with concurrent work; retry later"


class CommitOutcomeUnknown(ServiceUnavailable):
    """The connection was lost during COMMIT and the operation cannot be re-checked."""

    code = "commit_outcome_unknown"
    title = "The outcome of the commit is unknown; retry with the same idempotency key"


class DatabaseError(OrbitError):
    """A database error that is neither retryable nor a known domain condition."""

    code = "database_error"
    title = "Database error"


class IntegrityViolation(OrbitError):
    """A CHECK constraint or trigger refused a write: a bug or a tampering attempt."""

    code = "integrity_violation"
    title = "The database refused a write that breaks an integrity rule"


# --- pulse (issue 3) ---------------------------------------------------------------------------


class QueueNotFound(NotFound):
    """No such queue, or one the credential may not see (the two are not told apart)."""

    code = "queue_not_found"
    title = "No such queue for this credential"


class TaskNotFound(NotFound):
    """No such task, one in another namespace, or one whose queue the credential may not read
    (the three are not told apart)."""

    code = "task_not_found"
    title = "No such task for this credential"


class AttemptNotFound(NotFound):
    """No such attempt of this task."""

    code = "attempt_not_found"
    title = "No such attempt of this task"


class SourceLinkMissing(Conflict):
    """The task's source names a row that is gone or does not agree (its schedule, the ledger
    row that made it, that version, or the task it retries): reported as such, never read as
    a plain submission."""

    code = "source_link_missing"
    title = "The task's source link is missing"


class TooManyFrames(TooManyRequests):
    """A worker WebSocket sent more frames in one second than ``max_frames_per_second``."""

    code = "too_many_frames"
    title = "Too many WebSocket frames per second; closing"


class TooManyInvalidFrames(BadRequest):
    """A worker WebSocket kept sending frames answered with request errors."""

    code = "too_many_invalid_frames"
    title = "Too many invalid WebSocket frames; closing"

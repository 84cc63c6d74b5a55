"""How a handler's ending becomes a finish report (the handler contract of docs/sdk.md).

==============================================  ==========================================
the handler                                      report
==============================================  ==========================================
returns a JSON value                             ``succeeded`` with it as the result
returns something JSON cannot encode             ``failed``, not retryable (ResultNotJson)
returns a result over ``max_result_bytes``       ``failed``, not retryable (ResultTooLarge)
raises RetryableError / ``retryable = True``     ``failed``, ``retryable=true``
raises OutcomeUnknown                            ``unknown`` (the task goes to review)
raises anything else                             ``failed``, not retryable
ends with CancelledError after a cancel          ``cancelled``
is interrupted by shutdown                       ``failed`` retryable if ``rerun_safe``,
                                                 else ``unknown``
loses its lease                                  nothing (the dispatcher decided already)
==============================================  ==========================================

Every report gets a fresh ``report_id``; re-sending the same report keeps it, so the dispatcher
answers a re-send with the original receipt.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from orbit_sdk import jsonvalue
from orbit_sdk.context import Grant
from orbit_sdk.errors import OutcomeUnknown

__all__ = ["Report", "from_exception", "interrupted", "missing_handler", "succeeded",
           "too_large"]

MESSAGE_MAX = 4000  # characters of an exception message kept in a report
# The dispatcher's default [dispatcher].max_result_bytes: the results and errors of one finish
# together, as compact UTF-8 JSON (docs/api/worker.md).
MAX_RESULT_BYTES = 960 * 1024


@attrs.define(eq=False)
class Report:
    """One finish report, kept until a dispatcher acknowledges it."""

    grant: Grant
    outcome: str  # succeeded | failed | unknown | cancelled
    result: Any = None
    error: dict[str, Any] | None = None
    retryable: bool | None = None
    report_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    solo: bool = False  # after a batch was refused whole: sent alone to find the culprit
    size: int = 0  # bytes of the result and error as the dispatcher stores them (about)

    def __attrs_post_init__(self) -> None:
        if self.error is not None and not self.size:
            self.size = len(jsonvalue.dumps(self.error).encode())

    def item(self) -> dict[str, Any]:
        """The ``finish`` item: credentials, report id and outcome."""
        item: dict[str, Any] = {**self.grant.ref(), "report_id": self.report_id,
                                "outcome": self.outcome}
        if self.outcome == "succeeded":
            item["result"] = self.result
        if self.error is not None:
            item["error"] = self.error
        if self.retryable is not None:
            item["retryable"] = self.retryable
        return item


def error_json(exc: BaseException) -> dict[str, Any]:
    """The error object of a report: the exception's class and message (no traceback)."""
    return {"type": type(exc).__qualname__, "message": str(exc)[:MESSAGE_MAX]}


def succeeded(grant: Grant, value: Any, max_result_bytes: int = MAX_RESULT_BYTES) -> Report:
    try:
        size = len(jsonvalue.dumps(value).encode())
    except (TypeError, ValueError) as exc:
        return Report(grant=grant, outcome="failed", retryable=False,
                      error={"type": "ResultNotJson", "message": str(exc)[:MESSAGE_MAX]})
    if size > max_result_bytes:
        return too_large(grant, f"the result is {size} bytes of JSON; the dispatcher stores at"
                                f" most {max_result_bytes}")
    return Report(grant=grant, outcome="succeeded", result=value, size=size)


def too_large(grant: Grant, message: str) -> Report:
    """A result the dispatcher will not store (``result_too_large``): the attempt failed, not
    retryable (the same handler would return the same result)."""
    return Report(grant=grant, outcome="failed", retryable=False,
                  error={"type": "ResultTooLarge", "message": message[:MESSAGE_MAX]})


def from_exception(grant: Grant, exc: Exception) -> Report:
    if isinstance(exc, OutcomeUnknown):
        return Report(grant=grant, outcome="unknown", error=error_json(exc))
    retryable = getattr(exc, "retryable", False) is True
    return Report(grant=grant, outcome="failed", error=error_json(exc), retryable=retryable)


def interrupted(grant: Grant, stop_reason: str | None) -> Report | None:
    """The report of a handler that ended in ``CancelledError``, by why it was cancelled."""
    if stop_reason == "lost":
        return None
    if stop_reason == "cancel":
        return Report(grant=grant, outcome="cancelled",
                      error={"type": "cancelled", "message": "stopped on request"})
    error = {"type": "interrupted", "message": "the worker stopped during the attempt"}
    if grant.rerun_safe:
        return Report(grant=grant, outcome="failed", error=error, retryable=True)
    return Report(grant=grant, outcome="unknown", error=error)


def missing_handler(grant: Grant) -> Report:
    return Report(grant=grant, outcome="failed", retryable=False,
                  error={"type": "LookupError",
                         "message": f"no handler {grant.handler!r} in this worker"})

"""``POST …/tasks/{task_id}/cancel``, ``/review`` and ``/retry``: human interventions."""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from orbit_api.openapi import ID, IDEMPOTENCY_KEY, NAME, TIME, TOO_MANY_REQUESTS
from orbit_api.routes.platform import idempotency_key
from orbit_common.model import jsondoc
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import interventions, queries
from orbit_common.service.http.body import query_params, read_json
from orbit_common.service.http.context import DB, request_id_of

PATH = "/v1/namespaces/{namespace}/tasks/{task_id}"


@attrs.frozen(kw_only=True)
class CancelRequest:
    reason: str | None = None


@attrs.frozen(kw_only=True)
class RetryRequest:
    reason: str
    rerun_confirmed: bool


def _task_id(request: web.Request) -> bytes:
    # Same contract as the task routes: a malformed id is a 400 naming {task_id}.
    return queries.parse_id(request.match_info["task_id"], "{task_id}")


async def cancel(request: web.Request) -> web.Response:
    query_params(request, ())
    task_id = _task_id(request)
    key = idempotency_key(request)
    dto = CancelRequest()
    if request.can_read_body:
        dto, _ = await read_json(request, CancelRequest)
    outcome = await interventions.cancel_task(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        task_id=task_id, reason=dto.reason, idempotency_key=key,
        request_id=request_id_of(request))
    return web.json_response(outcome.body, status=outcome.status)


async def review(request: web.Request) -> web.Response:
    query_params(request, ())
    task_id = _task_id(request)
    key = idempotency_key(request)
    _, raw = await read_json(request, _ReviewShape)
    result = jsondoc.dumps(raw["result"]) if "result" in raw else None
    outcome = await interventions.review_task(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        task_id=task_id, decision=raw["decision"], reason=raw["reason"],
        evidence_ref=raw["evidence_ref"], execution_ended=raw.get("execution_ended") is True,
        revision=raw["revision"], result=result, idempotency_key=key,
        request_id=request_id_of(request))
    return web.json_response(outcome.body, status=outcome.status)


@attrs.frozen(kw_only=True)
class _ReviewShape:
    """Shape check only: ``result`` is any JSON value, taken from the raw document."""

    decision: str
    reason: str
    evidence_ref: str
    revision: int
    # Absent or false is refused with confirmation_required (not validation_failed), like
    # retry's rerun_confirmed.
    execution_ended: bool | None = None
    result: Any = None


async def retry(request: web.Request) -> web.Response:
    query_params(request, ())
    task_id = _task_id(request)
    key = idempotency_key(request)
    dto, _ = await read_json(request, RetryRequest)
    outcome = await interventions.retry_task(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        task_id=task_id, reason=dto.reason, rerun_confirmed=dto.rerun_confirmed,
        idempotency_key=key, request_id=request_id_of(request))
    return web.json_response(outcome.body, status=outcome.status)


def add_routes(app: web.Application) -> None:
    app.router.add_post(PATH + "/cancel", cancel)
    app.router.add_post(PATH + "/review", review)
    app.router.add_post(PATH + "/retry", retry)


_PARAMS = [
    {"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}},
    {"name": "task_id", "in": "path", "required": True,
     "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"}},
    {"name": "Idempotency-Key", "in": "header", "required": False,
     "schema": IDEMPOTENCY_KEY},
]


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {
        "schema": {"$ref": "#/components/schemas/Problem"}}}}


def _operation(summary: str, op_id: str, schema: str, ok: tuple[str, str], *, bad: str,
               conflicts: str, **more: Any) -> dict[str, Any]:
    status, description = ok
    return {
        "summary": summary, "operationId": op_id, "parameters": _PARAMS,
        "requestBody": {"required": op_id != "cancelTask", "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            status: {"description": description,
                     "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/TaskIntervention"}}}},
            "400": _problem(bad + ", malformed_json, duplicate_json_key, json_too_deep, "
                            "json_too_complex"),
            "401": _problem("unauthenticated, invalid_credential"),
            "403": _problem("forbidden"),
            "404": _problem("task_not_found, namespace_not_found"),
            "409": _problem(conflicts),
            "413": _problem("payload_too_large"),
            "415": _problem("unsupported_media_type"),
            "503": _problem("service_unavailable, database_unavailable, "
                            "transaction_retries_exhausted, commit_outcome_unknown"),
            **more,
        },
    }


OPENAPI_PATHS: dict[str, Any] = {
    PATH + "/cancel": {"post": _operation(
        "Cancel a task: WAITING/LEASED end now; RUNNING records a cancel intent. An operator "
        "credential (one that may also queues.manage the task's queue) must give a reason",
        "cancelTask", "CancelRequest",
        ("200", "The task after the cancel (unchanged when it had already ended)"),
        bad="validation_failed (also: reason missing on an operator's cancel)",
        conflicts="task_needs_review, idempotency_conflict")},
    PATH + "/review": {"post": _operation(
        "Resolve a NEEDS_REVIEW task to SUCCEEDED or FAILED, with reason, evidence reference, "
        "the declaration that execution has ended and the task revision judged",
        "reviewTask", "ReviewRequest", ("200", "The reviewed task"),
        bad="validation_failed, confirmation_required (the execution-ended declaration "
        "absent or false)",
        conflicts="task_not_reviewable, stale_revision (the task revision is not the one given), "
        "idempotency_conflict")},
    PATH + "/retry": {"post": _operation(
        "Create the one manual retry of a FAILED or CANCELLED task", "retryTask",
        "RetryRequest", ("201", "The new successor task (it names the original)"),
        bad="validation_failed, confirmation_required (the rerun confirmation absent or false)",
        conflicts="task_not_retryable, already_retried, idempotency_conflict",
        # The successor counts against the limits like a submission.
        **{"429": TOO_MANY_REQUESTS})},
}
OPENAPI_SCHEMAS: dict[str, Any] = {
    "CancelRequest": {
        "type": "object", "additionalProperties": False,
        "description": "reason is required when the credential is an operator's (it may also "
                       "queues.manage the task's queue); a client's cancel may omit it",
        "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 1024}}},
    "ReviewRequest": {"type": "object", "additionalProperties": False,
                      "required": ["decision", "reason", "evidence_ref", "execution_ended",
                                   "revision"],
                      "properties": {"decision": {"enum": ["succeeded", "failed"]},
                                     "reason": {"type": "string", "minLength": 1,
                                                "maxLength": 1024},
                                     "evidence_ref": {"type": "string", "minLength": 1,
                                                      "maxLength": 1024},
                                     "execution_ended": {"const": True},
                                     "revision": {"type": "integer", "minimum": 1},
                                     "result": {"description": "Only with decision "
                                                               "succeeded"}},
                      "if": {"properties": {"decision": {"const": "failed"}}},
                      "then": {"not": {"required": ["result"]}}},
    "RetryRequest": {"type": "object", "additionalProperties": False,
                     "required": ["reason", "rerun_confirmed"],
                     "properties": {"reason": {"type": "string", "minLength": 1,
                                               "maxLength": 1024},
                                    "rerun_confirmed": {"const": True}}},
    "TaskIntervention": {
        "type": "object", "additionalProperties": False,
        "description": "The reply of cancel, review and retry (docs/api/tasks-lifecycle.md)",
        "required": ["id", "queue", "handler", "state", "revision", "cancel_requested",
                     "effect_uncertain", "outcome_reason", "retry_of", "completed_at"],
        "properties": {
            "id": ID, "queue": NAME, "handler": {"type": "string"},
            "state": {"enum": ["WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW", "SUCCEEDED",
                               "FAILED", "CANCELLED"]},
            "revision": {"type": "integer", "minimum": 1},
            "cancel_requested": {"type": "boolean"}, "effect_uncertain": {"type": "boolean"},
            "outcome_reason": {"type": ["string", "null"]},
            "retry_of": {"anyOf": [ID, {"type": "null"}]},
            "completed_at": {"anyOf": [TIME, {"type": "null"}]}}},
}


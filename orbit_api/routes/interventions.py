"""``POST …/tasks/{task_id}/cancel``, ``/review`` and ``/retry``: human interventions."""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from orbit_api.openapi import TOO_MANY_REQUESTS
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
        evidence_ref=raw.get("evidence_ref"), result=result, idempotency_key=key,
        request_id=request_id_of(request))
    return web.json_response(outcome.body, status=outcome.status)


@attrs.frozen(kw_only=True)
class _ReviewShape:
    """Shape check only: ``result`` is any JSON value, taken from the raw document."""

    decision: str
    reason: str
    evidence_ref: str | None = None
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
     "schema": {"type": "string", "minLength": 1, "maxLength": 255}},
]


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {
        "schema": {"$ref": "#/components/schemas/Problem"}}}}


def _operation(summary: str, op_id: str, schema: str, ok: str, conflicts: str,
               **more: Any) -> dict[str, Any]:
    return {
        "summary": summary, "operationId": op_id, "parameters": _PARAMS,
        "requestBody": {"required": op_id != "cancelTask", "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            ok: {"description": "The task (or, for retry, its new successor)",
                 "content": {"application/json": {
                     "schema": {"$ref": "#/components/schemas/TaskIntervention"}}}},
            "400": _problem("validation_failed, confirmation_required, malformed_json, …"),
            "401": _problem("unauthenticated, invalid_credential"),
            "403": _problem("forbidden"),
            "404": _problem("task_not_found"),
            "409": _problem(conflicts),
            **more,
        },
    }


OPENAPI_PATHS: dict[str, Any] = {
    PATH + "/cancel": {"post": _operation(
        "Cancel a task: WAITING/LEASED end now; RUNNING records a cancel intent",
        "cancelTask", "CancelRequest", "200", "task_needs_review, idempotency_conflict")},
    PATH + "/review": {"post": _operation(
        "Resolve a NEEDS_REVIEW task to SUCCEEDED or FAILED", "reviewTask", "ReviewRequest",
        "200", "task_not_reviewable, idempotency_conflict")},
    PATH + "/retry": {"post": _operation(
        "Create the one manual retry of a FAILED or CANCELLED task", "retryTask",
        "RetryRequest", "201", "task_not_retryable, already_retried, idempotency_conflict",
        # The successor counts against the limits like a submission.
        **{"429": TOO_MANY_REQUESTS})},
}
OPENAPI_SCHEMAS: dict[str, Any] = {
    "CancelRequest": {"type": "object", "additionalProperties": False,
                      "properties": {"reason": {"type": "string", "maxLength": 1024}}},
    "ReviewRequest": {"type": "object", "additionalProperties": False,
                      "required": ["decision", "reason"],
                      "properties": {"decision": {"enum": ["succeeded", "failed"]},
                                     "reason": {"type": "string", "maxLength": 1024},
                                     "evidence_ref": {"type": "string", "maxLength": 1024},
                                     "result": {}}},
    "RetryRequest": {"type": "object", "additionalProperties": False,
                     "required": ["reason", "rerun_confirmed"],
                     "properties": {"reason": {"type": "string", "maxLength": 1024},
                                    "rerun_confirmed": {"const": True}}},
    "TaskIntervention": {"type": "object", "properties": {
        "id": {"type": "string"}, "queue": {"type": "string"}, "handler": {"type": "string"},
        "state": {"type": "string"}, "revision": {"type": "integer"},
        "cancel_requested": {"type": "boolean"}, "effect_uncertain": {"type": "boolean"},
        "outcome_reason": {"type": ["string", "null"]},
        "retry_of": {"type": ["string", "null"]},
        "completed_at": {"type": ["string", "null"]}}},
}


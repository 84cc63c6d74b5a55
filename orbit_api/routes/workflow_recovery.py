"""Manual recovery of a workflow step over HTTP: retry a TASK step, resolve a step
(docs/weave/recovery.md, docs/api/workflows.md § 人工恢复).

The routes check the body's shape and hand the rest to ``orbit_common.weave.recovery``: a
refused request writes nothing. A committed recovery (not a replay) is counted in
``orbit_weave_recoveries_total{kind}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from orbit_api.metrics import count_recovery
from orbit_api.openapi import (
    BODY_ERRORS,
    ID,
    IDEMPOTENCY_PARAM,
    NAME,
    _json,
    _problem,
    path_param,
    request_body,
    resource_errors,
)
from orbit_api.routes.platform import idempotency_key
from orbit_api.routes.tasks import json_response
from orbit_api.routes.workflows import INSTANCE, _namespace, _object
from orbit_common import errors
from orbit_common.platform.principals import principal_of
from orbit_common.service.http.body import query_params
from orbit_common.service.http.context import DB, request_id_of
from orbit_common.weave import recovery
from orbit_common.weave.language import ERROR_CODE_RULE

STEP = INSTANCE + "/steps/{step}"
RETRY = STEP + "/retry"
RESOLVE = STEP + "/resolve"
RETRY_FIELDS = frozenset({"reason", "evidence_ref", "execution_ended", "step_revision",
                          "additional_attempts"})
RESOLVE_FIELDS = frozenset({"reason", "evidence_ref", "step_revision", "conclusion", "output",
                            "error", "task_decision", "execution_ended"})
T = TypeVar("T")


async def checked_body(request: web.Request, fields: frozenset[str],
                       check: Callable[[dict[str, Any]], T], *,
                       nullable: frozenset[str] = frozenset()) -> T:
    """A recovery request's body, checked: unknown fields, then no field but ``nullable`` may
    be null (absent is the way to leave an optional field out), then the domain's ``check``
    (its problems for a path already named are not repeated); all problems at once."""
    query_params(request, ())
    body, problems = await _object(request, fields)
    problems += [{"path": f"$.{key}", "message": "may not be null"}
                 for key, value in sorted(body.items())
                 if value is None and key in fields - nullable]
    try:
        checked = check(body)
    except errors.ValidationFailed as exc:
        problems += [p for p in exc.errors if not any(p["path"] == n["path"] for n in problems)]
        raise errors.ValidationFailed(problems) from exc
    if problems:
        raise errors.ValidationFailed(problems)
    return checked


def answer(done: recovery.Done, kind: str) -> web.Response:
    """The receipt; a recovery committed now (not the replay of an earlier receipt) counts in
    ``orbit_weave_recoveries_total{kind}``."""
    if done.fresh:
        count_recovery(kind)
    return json_response(done.replay.body, status=done.replay.status)


async def retry_step(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    checked = await checked_body(request, RETRY_FIELDS, lambda body: recovery.RetryRequest.check(
        reason=body.get("reason"), step_revision=body.get("step_revision"),
        evidence_ref=body.get("evidence_ref"), execution_ended=body.get("execution_ended"),
        additional_attempts=body.get("additional_attempts")))
    return answer(await recovery.retry_step(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=request.match_info["step"],
        request=checked, idempotency_key=key, request_id=request_id_of(request)),
        recovery.RETRY)


async def resolve_step(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    checked = await checked_body(
        request, RESOLVE_FIELDS, lambda body: recovery.ResolveRequest.check(
            reason=body.get("reason"), evidence_ref=body.get("evidence_ref"),
            step_revision=body.get("step_revision"), conclusion=body.get("conclusion"),
            output=body.get("output"), has_output="output" in body, error=body.get("error"),
            task_decision=body.get("task_decision"),
            execution_ended=body.get("execution_ended")),
        nullable=frozenset({"output"}))
    return answer(await recovery.resolve_step(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=request.match_info["step"],
        request=checked, idempotency_key=key, request_id=request_id_of(request)),
        recovery.RESOLVE)


def add_routes(app: web.Application) -> None:
    """Register the step recovery routes."""
    app.router.add_post(RETRY, retry_step)
    app.router.add_post(RESOLVE, resolve_step)


# --- OpenAPI ------------------------------------------------------------------------------------

_PARAMS = [path_param("namespace", NAME), path_param("workflow_id", ID),
           path_param("step", {"type": "string", "minLength": 1, "maxLength": 128})]
_COMMON_ERRORS: dict[str, Any] = {
    **resource_errors("forbidden: the credential may not workflows.control here"),
    "404": _problem("namespace_not_found, workflow_instance_not_found, or "
                    "workflow_step_not_found (no step of this name has run in the instance)"),
    **BODY_ERRORS,
}

OPENAPI_PATHS: dict[str, Any] = {
    RETRY: {"parameters": _PARAMS, "post": {
        "summary": "Retry a TASK step: a new activation with a new task (retry_of the old "
                   "one), the attempt budget left across the step's activations and the "
                   "original absolute deadline",
        "operationId": "retryWorkflowStep", "parameters": [IDEMPOTENCY_PARAM],
        "requestBody": request_body("WorkflowStepRetryRequest"),
        "responses": {
            "201": _json("WorkflowStep", "The step with every activation (the old one "
                                         "SUPERSEDED, the new one LIVE); or the replay of "
                                         "the original receipt"),
            **_COMMON_ERRORS,
            "400": _problem("validation_failed (also: the evidence reference missing while "
                            "the task is in NEEDS_REVIEW), confirmation_required (the "
                            "execution-ended declaration must be true while the task is in "
                            "NEEDS_REVIEW), malformed input"),
            "409": _problem("step_not_retryable (not a TASK step, not waiting for a person, "
                            "the attempt budget spent without additional attempts granted, "
                            "the absolute deadline passed, already resolved), "
                            "workflow_instance_not_running, stale_revision, "
                            "idempotency_conflict"),
            "429": _problem("queue_full, application_quota_exceeded: the new task does not "
                            "fit its queue's or application's limits"),
        }}},
    RESOLVE: {"parameters": _PARAMS, "post": {
        "summary": "Resolve a held step (or a TASK step whose task is in NEEDS_REVIEW): "
                   "record the task's review and, separately, the step's conclusion; the "
                   "engine advances the step with it",
        "operationId": "resolveWorkflowStep", "parameters": [IDEMPOTENCY_PARAM],
        "requestBody": request_body("WorkflowStepResolveRequest"),
        "responses": {
            "202": _json("WorkflowStep", "The step with its recorded resolution (still "
                                         "WAITING: the engine advances it); or the replay "
                                         "of the original receipt"),
            **_COMMON_ERRORS,
            "400": _problem("validation_failed (also: output not of the step's result "
                            "shape; the task decision missing while the task is in "
                            "NEEDS_REVIEW, or given while it is not), confirmation_required, "
                            "malformed input"),
            "409": _problem("step_not_resolvable (not held, nor a TASK step whose task is "
                            "in NEEDS_REVIEW; already resolved), "
                            "workflow_instance_not_running, stale_revision, "
                            "idempotency_conflict"),
        }}},
}

_REASON = {"type": "string", "minLength": 1, "maxLength": recovery.REASON_MAX}
_REVISION = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1,
             "description": "Compare-and-set: the step's revision as read (stale_revision if "
                            "it moved)"}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "WorkflowStepRetryRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["reason", "step_revision"],
        "properties": {
            "reason": {**_REASON, "description": "Why (audit record and event)"},
            "evidence_ref": {**_REASON, "description": "The evidence judged; required when "
                                                       "the task is in NEEDS_REVIEW"},
            "execution_ended": {"type": "boolean",
                                "description": "true: the old task's execution has ended "
                                               "(required when it is in NEEDS_REVIEW)"},
            "step_revision": _REVISION,
            "additional_attempts": {"type": "integer", "minimum": 0,
                                    "maximum": recovery.ADDITIONAL_MAX, "default": 0,
                                    "description": "Attempts granted beyond the original "
                                                   "budget"},
        },
    },
    "WorkflowStepResolveRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["reason", "evidence_ref", "step_revision", "conclusion"],
        "properties": {
            "reason": {**_REASON, "description": "Why (audit record, event, resolution)"},
            "evidence_ref": {**_REASON, "description": "The evidence the conclusion rests on"},
            "step_revision": _REVISION,
            "conclusion": {"enum": list(recovery.CONCLUSIONS),
                           "description": "The step's logical conclusion"},
            "output": {"description": "conclusion succeeded: the step's result (checked "
                                      "against its declared result shape)"},
            "error": {"type": "string", "pattern": "^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$",
                      "description": f"conclusion failed: the error code ({ERROR_CODE_RULE})"},
            "task_decision": {"enum": list(recovery.CONCLUSIONS),
                              "description": "The task's execution conclusion (required "
                                             "only while its task is in NEEDS_REVIEW)"},
            "execution_ended": {"type": "boolean",
                                "description": "true: the task's execution has ended "
                                               "(required while it is in NEEDS_REVIEW)"},
        },
        # succeeded: an output, no error; failed: an error, no output.
        "if": {"properties": {"conclusion": {"const": "failed"}}},
        "then": {"required": ["error"], "not": {"required": ["output"]}},
        "else": {"not": {"required": ["error"]}},
    },
}

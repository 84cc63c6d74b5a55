"""Pause, resume and cancel of a workflow instance over HTTP (docs/api/workflows.md § 暂停与继续,
§ 取消).

The routes check the shape of the body (unknown fields, types) and hand the rest to
``orbit_common.weave.controls``: a refused request writes nothing.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

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
from orbit_common.weave import controls, stops

PAUSE = INSTANCE + "/pause"
RESUME = INSTANCE + "/resume"
CANCEL = INSTANCE + "/cancel"
FIELDS = frozenset({"reason", "control_revision"})


async def _body(request: web.Request) -> dict[str, Any]:
    query_params(request, ())
    body, problems = await _object(request, FIELDS)
    try:
        controls.check_request(body.get("reason"), body.get("control_revision"))
    except errors.ValidationFailed as exc:
        problems += exc.errors
    if problems:
        raise errors.ValidationFailed(problems)
    return body


async def _control(request: web.Request, *, paused: bool) -> web.Response:
    key = idempotency_key(request)
    body = await _body(request)
    outcome = await controls.set_paused(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], paused=paused, reason=body["reason"],
        control_revision=body.get("control_revision"), idempotency_key=key,
        request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def pause_workflow(request: web.Request) -> web.Response:
    return await _control(request, paused=True)


async def resume_workflow(request: web.Request) -> web.Response:
    return await _control(request, paused=False)


async def cancel_workflow(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    body = await _body(request)
    outcome = await stops.cancel(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], reason=body["reason"],
        control_revision=body.get("control_revision"), idempotency_key=key,
        request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


def add_routes(app: web.Application) -> None:
    """Register the pause, resume and cancel routes."""
    app.router.add_post(PAUSE, pause_workflow)
    app.router.add_post(RESUME, resume_workflow)
    app.router.add_post(CANCEL, cancel_workflow)


# --- OpenAPI ------------------------------------------------------------------------------------

_PARAMS = [path_param("namespace", NAME), path_param("workflow_id", ID)]
_RESPONSES: dict[str, Any] = {
    "200": _json("Workflow", "The instance after the change (unchanged when it already was; "
                             "or the replay of the original receipt)"),
    **resource_errors("forbidden: the credential may not workflows.control here"),
    "404": _problem("namespace_not_found, or workflow_instance_not_found"),
    "409": _problem("workflow_instance_finished (the instance has ended; nothing written), "
                    "workflow_instance_stopping (a cancel or a failure settlement is stopping "
                    "it: its gate stays closed), stale_revision (the control revision given is "
                    "not the instance's), or idempotency_conflict"),
    **BODY_ERRORS,
}
_CANCEL_RESPONSES: dict[str, Any] = {
    "202": _json("Workflow", "The stop intent is recorded: the instance is STOPPING, its gate "
                             "STOPPED, its unfinished tasks asked to stop; the engine settles "
                             "it CANCELLED once no step is in flight (or the replay of the "
                             "original receipt)"),
    "200": _json("Workflow", "The instance was already stopping: unchanged (an instance "
                             "stopping for a FAILURE records the user's cancel time once)"),
    **resource_errors("forbidden: the credential may not workflows.control here"),
    "404": _problem("namespace_not_found, or workflow_instance_not_found"),
    "409": _problem("workflow_instance_finished (the instance has ended: a committed success "
                    "is never overridden; nothing written), stale_revision (the control "
                    "revision given is not the instance's), or idempotency_conflict"),
    **BODY_ERRORS,
}


def _operation(verb: str, summary: str) -> dict[str, Any]:
    return {"summary": summary, "operationId": f"{verb}Workflow",
            "parameters": [IDEMPOTENCY_PARAM],
            "requestBody": request_body("WorkflowControlRequest"), "responses": _RESPONSES}


OPENAPI_PATHS: dict[str, Any] = {
    PAUSE: {"parameters": _PARAMS, "post": _operation(
        "pause", "Pause an instance: its gate closes, its results and due checkpoints are "
                 "parked")},
    RESUME: {"parameters": _PARAMS, "post": _operation(
        "resume", "Resume an instance: its gate opens, its parked checkpoints are replayed in "
                  "order, once")},
    CANCEL: {"parameters": _PARAMS, "post": {
        "summary": "Cancel an instance: the stop intent CANCEL, its gate closed for good, its "
                   "unfinished tasks asked to stop; it settles CANCELLED once nothing is in "
                   "flight",
        "operationId": "cancelWorkflow", "parameters": [IDEMPOTENCY_PARAM],
        "requestBody": request_body("WorkflowControlRequest"),
        "responses": _CANCEL_RESPONSES}},
}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "WorkflowControlRequest": {
        "type": "object", "additionalProperties": False, "required": ["reason"],
        "properties": {
            "reason": {"type": "string", "minLength": 1, "maxLength": controls.REASON_MAX,
                       "description": "Why (kept in the audit record and the event)"},
            "control_revision": {"type": ["integer", "null"], "minimum": 1,
                                 "description": "Compare-and-set: the instance's control "
                                                "revision as read (stale_revision if it moved);"
                                                " null is the same as absent"},
        },
    },
}

"""Re-arm a held SIGNAL wait and continue a held POLL step over HTTP (docs/api/workflows.md
§ 重新等待与继续查询; docs/weave/recovery.md).

The routes check the shape of the body (unknown fields, types) and hand the rest to
``orbit_common.weave.wait_recovery``: a refused request writes nothing. A recovery that
committed (not a replay of its receipt) is counted in ``orbit_weave_recoveries_total``.
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
from orbit_api.routes.workflow_recovery import answer, checked_body
from orbit_api.routes.workflows import INSTANCE, _namespace
from orbit_common.platform.principals import principal_of
from orbit_common.service.http.context import DB, request_id_of
from orbit_common.weave import wait_recovery
from orbit_common.weave.language import MAX_WAIT_MS

REARM = INSTANCE + "/steps/{step}/rearm"
CONTINUE = INSTANCE + "/steps/{step}/continue"
REARM_FIELDS = frozenset({"reason", "step_revision", "timeout_ms"})
CONTINUE_FIELDS = frozenset({"reason", "step_revision", "rounds", "deadline_ms"})


def _rearm_body(body: dict[str, Any]) -> dict[str, Any]:
    wait_recovery.check_rearm(body.get("reason"), body.get("step_revision"),
                              body.get("timeout_ms"))
    return body


def _continue_body(body: dict[str, Any]) -> dict[str, Any]:
    wait_recovery.check_continue(body.get("reason"), body.get("step_revision"),
                                 body.get("rounds"), body.get("deadline_ms"))
    return body


async def rearm_wait(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    body = await checked_body(request, REARM_FIELDS, _rearm_body)
    return answer(await wait_recovery.rearm_wait(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=request.match_info["step"],
        reason=body["reason"], step_revision=body["step_revision"],
        timeout_ms=body["timeout_ms"], idempotency_key=key,
        request_id=request_id_of(request)), "rearm")


async def continue_poll(request: web.Request) -> web.Response:
    key = idempotency_key(request)
    body = await checked_body(request, CONTINUE_FIELDS, _continue_body,
                              nullable=frozenset({"deadline_ms"}))
    return answer(await wait_recovery.continue_poll(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=request.match_info["step"],
        reason=body["reason"], step_revision=body["step_revision"], rounds=body["rounds"],
        deadline_ms=body.get("deadline_ms"), idempotency_key=key,
        request_id=request_id_of(request)), "continue")


def add_routes(app: web.Application) -> None:
    """Register the re-arm and continue routes."""
    app.router.add_post(REARM, rearm_wait)
    app.router.add_post(CONTINUE, continue_poll)


# --- OpenAPI ------------------------------------------------------------------------------------

_PARAMS = [path_param("namespace", NAME), path_param("workflow_id", ID),
           path_param("step", {"type": "string", "minLength": 1, "maxLength": 128})]


def _responses(refusal: str) -> dict[str, Any]:
    return {
        "201": _json("WorkflowRecoveredStep", "The step after the recovery, every activation "
                                              "listed (or the replay of the original receipt)"),
        **resource_errors("forbidden: the credential may not workflows.control here"),
        "404": _problem("namespace_not_found, workflow_instance_not_found, or "
                        "workflow_step_not_found (no step of this name has run)"),
        "409": _problem(f"{refusal}, workflow_instance_not_running (the instance is stopping "
                        "or has ended), stale_revision (the step revision given is not the "
                        "step's), or idempotency_conflict; nothing written"),
        "429": _problem("queue_full or application_quota_exceeded (continue: the round's new "
                        "task counts like a submission); nothing written"),
        **BODY_ERRORS,
    }


OPENAPI_PATHS: dict[str, Any] = {
    REARM: {"parameters": _PARAMS, "post": {
        "summary": "Re-arm a SIGNAL wait held after its timeout: a new activation and wait "
                   "generation, the first deadline kept",
        "operationId": "rearmWorkflowWait", "parameters": [IDEMPOTENCY_PARAM],
        "requestBody": request_body("WorkflowRearmRequest"),
        "responses": _responses("wait_not_rearmable (not a SIGNAL step held after its wait "
                                "timed out; a TIMER never times out)")}},
    CONTINUE: {"parameters": _PARAMS, "post": {
        "summary": "Continue a POLL step held after it exhausted or after a round task "
                   "failed: granted rounds, a cut-short round only with its remaining attempts",
        "operationId": "continueWorkflowPoll", "parameters": [IDEMPOTENCY_PARAM],
        "requestBody": request_body("WorkflowContinueRequest"),
        "responses": _responses("poll_not_continuable (not a POLL step held after its "
                                "query was exhausted or a round's task failed, or its next "
                                "round would come after the query deadline)")}},
}

_REASON = {"type": "string", "minLength": 1, "maxLength": wait_recovery.REASON_MAX,
           "description": "Why (kept in the audit record and the event)"}
_STEP_REVISION = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1,
                  "description": "Compare-and-set: the step's revision as read "
                                 "(stale_revision if it moved)"}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "WorkflowRearmRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["reason", "step_revision", "timeout_ms"],
        "properties": {
            "reason": _REASON, "step_revision": _STEP_REVISION,
            "timeout_ms": {"type": "integer", "minimum": wait_recovery.TIMEOUT_MIN_MS,
                           "maximum": wait_recovery.TIMEOUT_MAX_MS,
                           "description": "The new wait's timeout from now (database time)"},
        },
    },
    "WorkflowContinueRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["reason", "step_revision", "rounds"],
        "properties": {
            "reason": _REASON, "step_revision": _STEP_REVISION,
            "rounds": {"type": "integer", "minimum": 1, "maximum": wait_recovery.ROUNDS_MAX,
                       "description": "Rounds granted beyond the definition's max_rounds"},
            "deadline_ms": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_WAIT_MS,
                            "description": "A new query deadline from now; the first one is "
                                           "kept as it was"},
        },
    },
    "WorkflowRecoveredStep": {
        "allOf": [{"$ref": "#/components/schemas/WorkflowStep"}, {
            "type": "object", "required": ["workflow_id"],
            "properties": {"workflow_id": ID}}],
    },
}

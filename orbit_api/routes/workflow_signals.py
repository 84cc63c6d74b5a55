"""Workflow signals over HTTP (docs/api/workflows.md § 信号): send a signal to an instance (by
its id, or by definition and business key), read an instance's signal history and one signal.

The routes check the shape of every input (unknown fields, types, query parameters) and hand the
rest to ``orbit_common.weave.signals``: a refused request writes nothing.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orbit_api.openapi import (
    BODY_ERRORS,
    CURSOR_PARAM,
    ID,
    IDEMPOTENCY_PARAM,
    NAME,
    TIME,
    _json,
    _problem,
    limit_param,
    nullable,
    path_param,
    ref,
    request_body,
    resource_errors,
)
from orbit_api.routes.platform import idempotency_key
from orbit_api.routes.tasks import json_response
from orbit_api.routes.workflows import INSTANCE, _namespace, _object
from orbit_common import errors
from orbit_common.model import jsondoc, names
from orbit_common.platform.principals import principal_of
from orbit_common.service.http.body import int_param, query_params
from orbit_common.service.http.context import DB
from orbit_common.weave import instances, signals, types

SIGNALS = INSTANCE + "/signals"
SIGNAL = SIGNALS + "/{signal_id}"
BY_KEY = "/v1/namespaces/{namespace}/workflow-signals"
SIGNAL_FIELDS = frozenset({"name", "correlation_key", "payload", "payload_version",
                           "evidence_ref", "expires_in_ms"})
BY_KEY_FIELDS = SIGNAL_FIELDS | {"definition", "business_key"}

Problems = list[dict[str, str]]


async def _signal(request: web.Request, fields: frozenset[str]
                  ) -> tuple[dict[str, Any], signals.SignalRequest | None, Problems]:
    # One parse keeping every number's text: the payload is stored as written.
    exact, problems = await _object(request, fields, keep_number_text=True, check_numbers=True)
    plain = {k: jsondoc.plain_numbers(v) for k, v in exact.items() if k != "payload"}
    for field in ("name", "payload_version"):
        if field not in exact:
            problems.append({"path": f"$.{field}", "message": "required"})
    payload_text = jsondoc.dumps(exact.get("payload"))
    try:
        checked: signals.SignalRequest | None = signals.SignalRequest.check(
            name=plain.get("name"), correlation_key=plain.get("correlation_key"),
            payload_text=payload_text, payload_version=plain.get("payload_version"),
            evidence_ref=plain.get("evidence_ref"), expires_in_ms=plain.get("expires_in_ms"),
            problems=[])
    except errors.ValidationFailed as exc:
        checked = None
        problems += [p for p in exc.errors if p["path"] not in {q["path"] for q in problems}]
    return plain, checked, problems


async def send_signal(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    _, checked, problems = await _signal(request, SIGNAL_FIELDS)
    if problems or checked is None:
        raise errors.ValidationFailed(problems)
    try:
        instance_id = bytes.fromhex(request.match_info["workflow_id"])
    except ValueError:
        instance_id = b""
    if len(instance_id) != 16:
        # Authorization first, as for any unknown instance: the domain answers 404 after it.
        instance_id = bytes(16)
    outcome = await signals.send_signal(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        target=signals.Target(instance_id=instance_id), signal=checked, idempotency_key=key)
    return json_response(outcome.body, status=outcome.status)


async def send_signal_by_key(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    plain, checked, problems = await _signal(request, BY_KEY_FIELDS)
    definition = plain.get("definition")
    if "definition" not in plain:
        problems.insert(0, {"path": "$.definition", "message": "required"})
    elif not isinstance(definition, str) or not names.is_valid_name(definition):
        problems.insert(0, {"path": "$.definition", "message": names.NAME_RULE})
    business_key = plain.get("business_key")
    if not (isinstance(business_key, str)
            and 1 <= len(business_key.encode("utf-8", errors="surrogatepass"))
            <= instances.BUSINESS_KEY_MAX_BYTES):
        problems.append({"path": "$.business_key",
                         "message": f"required: a string of 1-{instances.BUSINESS_KEY_MAX_BYTES}"
                                    " bytes of UTF-8"})
    if problems or checked is None or not isinstance(definition, str) \
            or not isinstance(business_key, str):
        raise errors.ValidationFailed(problems)
    outcome = await signals.send_signal(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        target=signals.Target(definition=definition, business_key=business_key.encode()),
        signal=checked, idempotency_key=key)
    return json_response(outcome.body, status=outcome.status)


async def list_signals(request: web.Request) -> web.Response:
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=signals.LIST_MAX, low=1, high=signals.LIST_MAX)
    page = await signals.list_signals(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], limit=limit,
        cursor=params.get("cursor"))
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


async def get_signal(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await signals.get_signal(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"],
        signal_id=request.match_info["signal_id"])
    return json_response(view)


def add_routes(app: web.Application) -> None:
    """Register the signal routes."""
    app.router.add_post(SIGNALS, send_signal)
    app.router.add_get(SIGNALS, list_signals)
    app.router.add_get(SIGNAL, get_signal)
    app.router.add_post(BY_KEY, send_signal_by_key)


# --- OpenAPI ------------------------------------------------------------------------------------

_NAMESPACE_PARAM = path_param("namespace", NAME)
_WORKFLOW_PARAM = path_param("workflow_id", ID)
_SIGNAL_PARAM = path_param("signal_id", ID)
_ERRORS = resource_errors("forbidden: the credential may not do this with workflows here")
_SEND_RESPONSES: dict[str, Any] = {
    "201": _json("WorkflowSignal", "Accepted: the receipt (or the replay of the original one)"),
    **_ERRORS,
    "409": _problem("workflow_instance_finished (the instance has ended; nothing written), "
                    "workflow_instance_ambiguous (by business key: more than one RUNNING "
                    "instance has it), or idempotency_conflict"),
    **BODY_ERRORS,
}
_SIGNAL_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$",
             "not": {"enum": sorted(types.RESERVED_WORDS)},
             "description": "The SIGNAL step's signal name (an identifier, not a CEL reserved "
                            "word)"},
    "correlation_key": {**nullable({"type": "string"}),
                        "description": f"Exact bytes (UTF-8), at most "
                                       f"{signals.CORRELATION_MAX_BYTES}; null or absent: "
                                       "\"\""},
    "payload": {"description": f"Any JSON, kept byte-exact; at most "
                               f"{signals.PAYLOAD_MAX_BYTES} bytes; default null"},
    "payload_version": {"type": "integer", "minimum": 1,
                        "maximum": signals.PAYLOAD_VERSION_MAX},
    "evidence_ref": nullable({"type": "string", "minLength": 1,
                              "maxLength": signals.EVIDENCE_MAX}),
    "expires_in_ms": {**nullable({"type": "integer", "minimum": signals.EXPIRY_MIN_MS,
                                  "maximum": signals.EXPIRY_MAX_MS}),
                      "default": signals.EXPIRY_DEFAULT_MS,
                      "description": "Unconsumed after this long: rejected as expired (null "
                                     "or absent: the default)"},
}

OPENAPI_PATHS: dict[str, Any] = {
    SIGNALS: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM],
        "post": {
            "summary": "Send a signal to an instance (durable even before its wait exists)",
            "operationId": "sendWorkflowSignal",
            "parameters": [IDEMPOTENCY_PARAM],
            "requestBody": request_body("SendWorkflowSignalRequest"),
            "responses": {**_SEND_RESPONSES,
                          "404": _problem("namespace_not_found, or workflow_instance_not_found")},
        },
        "get": {
            "summary": "An instance's signals newest first",
            "operationId": "listWorkflowSignals",
            "parameters": [limit_param(signals.LIST_MAX, signals.LIST_MAX), CURSOR_PARAM],
            "responses": {"200": _json("WorkflowSignalPage", "A page of signals"), **_ERRORS,
                          "404": _problem("namespace_not_found, or "
                                          "workflow_instance_not_found")},
        },
    },
    SIGNAL: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM, _SIGNAL_PARAM],
        "get": {
            "summary": "One signal of an instance",
            "operationId": "getWorkflowSignal",
            "responses": {"200": _json("WorkflowSignal", "The signal"), **_ERRORS,
                          "404": _problem("namespace_not_found, workflow_instance_not_found, "
                                          "or workflow_signal_not_found")},
        },
    },
    BY_KEY: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Send a signal to the one RUNNING instance of a definition with a "
                       "business key",
            "operationId": "sendWorkflowSignalByKey",
            "parameters": [IDEMPOTENCY_PARAM],
            "requestBody": request_body("SendWorkflowSignalByKeyRequest"),
            "responses": {**_SEND_RESPONSES,
                          "404": _problem("namespace_not_found, or workflow_instance_not_found "
                                          "(no instance of the definition has the key)")},
        },
    },
}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "SendWorkflowSignalRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["name", "payload_version"], "properties": _SIGNAL_PROPERTIES,
    },
    "SendWorkflowSignalByKeyRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["definition", "business_key", "name", "payload_version"],
        "properties": {
            "definition": NAME,
            "business_key": {"type": "string", "minLength": 1,
                             "maxLength": instances.BUSINESS_KEY_MAX_BYTES,
                             "description": "1-512 bytes of UTF-8, compared as exact bytes"},
            **_SIGNAL_PROPERTIES,
        },
    },
    "WorkflowSignal": {
        "type": "object",
        "required": ["id", "workflow_id", "name", "correlation_key", "payload",
                     "payload_version", "evidence_ref", "state", "disposition", "wait_id",
                     "target_activation_sequence", "accepted_at", "expires_at",
                     "resolved_at"],
        "properties": {
            "id": ID, "workflow_id": ID, "name": {"type": "string"},
            "correlation_key": {"type": "string"}, "payload": {},
            "payload_version": {"type": "integer", "minimum": 1},
            "evidence_ref": nullable({"type": "string"}),
            "state": {"enum": list(signals.STATES)},
            "disposition": {**nullable({"enum": list(signals.DISPOSITIONS)}),
                            "description": "Set when CONSUMED or REJECTED"},
            "wait_id": nullable(ID),
            "target_activation_sequence": nullable({"type": "integer", "minimum": 1}),
            "accepted_at": TIME, "expires_at": TIME, "resolved_at": nullable(TIME),
        },
    },
    "WorkflowSignalPage": {
        "type": "object", "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": ref("WorkflowSignal")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
}

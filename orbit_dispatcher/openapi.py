"""The worker gateway's OpenAPI 3.1 document, served by the dispatcher at ``/v1/openapi.json``.

Written by hand next to the routes (``service.py``, ``_make_app``); the WebSocket channel is one
``GET`` (an upgrade) whose frames are described in docs/api/worker.md.
``tests/integration/test_dispatcher_openapi.py`` fails when a route is missing here or a path
here has no route.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orbit_common.pulse import workers
from orbit_common.pulse.leases import MAX_BATCH, OUTCOMES
from orbit_common.service.http.openapi import (
    OPERATIONAL_PATHS,
    PROBLEM,
    READINESS,
    SECURITY_SCHEMES,
)
from orbit_dispatcher import protocol

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}
NAME = {"type": "string", "pattern": "^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$"}
TIME = {"type": "string", "format": "date-time"}
TOKEN = {"type": "string", "minLength": 1, "maxLength": protocol.TOKEN_MAX}
NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": PROBLEM_REF}}}


def _json(schema_name: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema_name)}}}


def _body(schema_name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(schema_name)}}}


NAMESPACE = {"name": "namespace", "in": "path", "required": True, "schema": NAME}
SESSION = {"name": "session_id", "in": "path", "required": True, "schema": ID}
COMMON = {
    "400": _problem("Malformed or invalid input (validation_failed, malformed_json, "
                    "duplicate_json_key, json_too_deep, json_too_complex: more than 50,000 "
                    "arrays and objects, content_encoding_invalid)"),
    "401": _problem("Missing or invalid credential (unauthenticated, invalid_credential)"),
    "404": _problem("namespace_not_found or session_not_found (another tenant's session is "
                    "not found either)"),
    "413": _problem("payload_too_large: the body is over the dispatcher's message limit "
                    "(default 1 MiB); finish only: result_too_large, the results and errors of "
                    "the request over its result limit (default 960 KiB; nothing written, the "
                    "lease goes on). See docs/api/worker.md §6"),
    "415": _problem("unsupported_media_type or unsupported_content_encoding"),
    "503": _problem("Database unavailable or the dispatcher draining; retry elsewhere"),
}
SESSION_ERRORS = {k: v for k, v in COMMON.items() if k not in {"413", "415"}}


def _batch_op(op: str, summary: str, request: str, reply: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary, "operationId": f"worker{op.title()}",
        "parameters": [NAMESPACE, SESSION], "requestBody": _body(request),
        "responses": {"200": _json(reply, "One answer per item, in request order"),
                      **COMMON,
                      "409": _problem("report_conflict (finish: a report id reused with "
                                      "different content)")},
    }}


BASE = "/v1/namespaces/{namespace}/worker/sessions"

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Orbit worker gateway (dispatcher)",
        "version": "1",
        "description": "Worker sessions, grants, start/renew/finish (docs/api/worker.md). The "
        "WebSocket channel's frames are described there. Errors are RFC 9457 problem documents "
        "with a stable `code` (docs/api/errors.md).",
    },
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}],
    "paths": {
        **OPERATIONAL_PATHS,
        BASE: {"post": {
            "summary": "Register a worker session (fences the instance's older sessions)",
            "description": "A worker instance belongs to the credential that registered it: "
            "another credential registering its instance_key is refused (409 "
            "instance_owned_elsewhere) and changes nothing.",
            "operationId": "registerWorkerSession", "parameters": [NAMESPACE],
            "requestBody": _body("RegisterRequest"),
            "responses": {"201": _json("Session", "The new session"), **COMMON,
                          "403": _problem("The credential lacks workers.work (forbidden)"),
                          "409": _problem("instance_owned_elsewhere: the instance belongs "
                                          "to another credential")},
        }},
        BASE + "/{session_id}": {"delete": {
            "summary": "Close the session (attempts in flight are not affected)",
            "operationId": "closeWorkerSession", "parameters": [NAMESPACE, SESSION],
            "responses": {"204": {"description": "Closed"}, **SESSION_ERRORS},
        }},
        BASE + "/{session_id}/ws": {"get": {
            "summary": "The WebSocket channel (preferred): upgrade, then JSON text frames",
            "description": "Frames: ready, start, renew, finish (client); grants, cancel, reply, "
            "error (dispatcher). start/renew/finish must carry an id. A binary frame is "
            "answered with an error frame (binary_frame_unsupported) and close code 1003; a "
            "frame over [dispatcher].max_message_bytes (default 1 MiB) closes the socket with "
            "1009; more than max_frames_per_second frames a second (too_many_frames) or "
            "max_invalid_frames refused frames a minute (too_many_invalid_frames) with 1008 "
            "(docs/api/worker.md §6). When the session's credential is revoked or its "
            "application disabled, an error frame (invalid_credential) and close code 4401.",
            "operationId": "workerWebSocket", "parameters": [NAMESPACE, SESSION],
            "responses": {"101": {"description": "Switching protocols"}, **SESSION_ERRORS,
                          "409": _problem("session_lost: fenced or expired; register again")},
        }},
        BASE + "/{session_id}/poll": {"post": {
            "summary": "Long poll for grants (fallback); also heartbeats the session",
            "operationId": "workerPoll", "parameters": [NAMESPACE, SESSION],
            "requestBody": _body("PollRequest"),
            "responses": {"200": _json("PollReply", "Grants (possibly none) and cancel notices"),
                          **COMMON,
                          "409": _problem("session_lost: fenced or expired; register again")},
        }},
        BASE + "/{session_id}/start": _batch_op(
            "start", "Ask to start granted attempts", "RefBatch", "StartReply"),
        BASE + "/{session_id}/renew": _batch_op(
            "renew", "Renew execution leases", "RefBatch", "RenewReply"),
        BASE + "/{session_id}/finish": _batch_op(
            "finish", "Report outcomes (idempotent per report_id)", "FinishBatch",
            "FinishReply"),
        BASE + "/{session_id}/heartbeat": {"post": {
            "summary": "Keep the session alive",
            "operationId": "workerHeartbeat", "parameters": [NAMESPACE, SESSION],
            "responses": {"200": _json("HeartbeatReply", "Alive"), **SESSION_ERRORS,
                          "409": _problem("session_lost: fenced or expired; register again")},
        }},
    },
    "components": {
        "securitySchemes": SECURITY_SCHEMES,
        "schemas": {
            "Problem": PROBLEM,
            "Readiness": READINESS,
            "RegisterRequest": {
                "type": "object", "additionalProperties": False,
                "required": ["instance_key", "queues", "handlers"],
                "properties": {
                    "instance_key": {"type": "string", "minLength": 1, "maxLength": 191,
                                     "description": "1-191 UTF-8 bytes"},
                    "queues": {"type": "array", "items": NAME, "minItems": 1,
                               "maxItems": workers.MAX_QUEUES, "uniqueItems": True},
                    "handlers": {"type": "array", "minItems": 1,
                                 "maxItems": workers.MAX_HANDLERS, "uniqueItems": True,
                                 "items": {"type": "string",
                                           "pattern": workers.HANDLER_PATTERN.pattern
                                           .replace("\\A", "^").replace("\\Z", "$")}},
                    "max_in_flight": {"type": "integer", "minimum": 1, "maximum": 10_000,
                                      "default": 16},
                },
            },
            "Session": {
                "type": "object",
                "required": ["session_id", "generation", "expires_at", "heartbeat_interval_ms"],
                "properties": {"session_id": ID, "generation": {"type": "integer"},
                               "expires_at": TIME,
                               "heartbeat_interval_ms": {"type": "integer"}},
            },
            "PollRequest": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "max": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH, "default": 1},
                    "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30_000,
                                "default": 0},
                },
            },
            "Grant": {
                "type": "object",
                "required": ["task_id", "attempt_id", "generation", "token", "queue", "handler",
                             "input"],
                "properties": {
                    "task_id": ID, "attempt_id": ID, "generation": {"type": "integer"},
                    "token": {"type": "string"}, "queue": NAME,
                    "handler": {"type": "string"}, "input": {},
                    "priority": {"type": "integer"},
                    "business_key": {"type": ["string", "null"]},
                    "rerun_safe": {"type": "boolean"},
                    "offer_expires_at": NULLABLE_TIME, "deadline_at": NULLABLE_TIME,
                    "attempt_timeout_ms": {"type": ["integer", "null"]},
                    "max_attempts": {"type": "integer"},
                    "concurrency_key": {"type": ["string", "null"]},
                    "concurrency_token": {"type": ["integer", "null"]},
                },
            },
            "PollReply": {
                "type": "object", "required": ["grants", "cancel"],
                "properties": {"grants": {"type": "array", "items": _ref("Grant")},
                               "cancel": {"type": "array", "items": ID}},
            },
            "AttemptRef": {
                "type": "object", "additionalProperties": False,
                "required": ["attempt_id", "token", "generation"],
                "properties": {"attempt_id": ID, "token": TOKEN,
                               "generation": {"type": "integer", "minimum": 1}},
            },
            "RefBatch": {
                "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH,
                                         "items": _ref("AttemptRef")}},
            },
            "FinishItem": {
                "type": "object", "additionalProperties": False,
                "required": ["attempt_id", "token", "generation", "report_id", "outcome"],
                "properties": {
                    "attempt_id": ID, "token": TOKEN,
                    "generation": {"type": "integer", "minimum": 1},
                    "report_id": {"type": "string", "minLength": 1,
                                  "maxLength": protocol.REPORT_ID_MAX,
                                  "description": "1-128 UTF-8 bytes"},
                    "outcome": {"enum": list(OUTCOMES)},
                    "result": {"description": "succeeded only: any JSON (at most 16 MiB)"},
                    "error": {"type": ["object", "null"],
                              "description": "Not with succeeded; at most 64 KiB of JSON"},
                    "retryable": {"type": "boolean", "default": False,
                                  "description": "true only with failed"},
                },
                # result only with succeeded; error (non-null) and retryable true never with it;
                # retryable true only with failed.
                "allOf": [
                    {"if": {"required": ["result"]},
                     "then": {"properties": {"outcome": {"const": "succeeded"}}}},
                    {"if": {"properties": {"outcome": {"const": "succeeded"}}},
                     "then": {"properties": {"error": {"type": "null"}}}},
                    {"if": {"required": ["retryable"],
                            "properties": {"retryable": {"const": True}}},
                     "then": {"properties": {"outcome": {"const": "failed"}}}},
                ],
            },
            "FinishBatch": {
                "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH,
                                         "items": _ref("FinishItem")}},
            },
            "StartReply": {"type": "object", "required": ["items"], "properties": {"items": {
                "type": "array", "items": {
                    "type": "object",
                    "required": ["attempt_id", "approved", "reason", "lease_expires_at",
                                 "retry_after_ms"],
                    "properties": {"attempt_id": ID, "approved": {"type": "boolean"},
                                   "reason": {"type": ["string", "null"]},
                                   "lease_expires_at": NULLABLE_TIME,
                                   "retry_after_ms": {"type": ["integer", "null"]}}}}}},
            "RenewReply": {"type": "object", "required": ["items"], "properties": {"items": {
                "type": "array", "items": {
                    "type": "object",
                    "required": ["attempt_id", "renewed", "reason", "lease_expires_at",
                                 "cancel_requested"],
                    "properties": {"attempt_id": ID, "renewed": {"type": "boolean"},
                                   "reason": {"type": ["string", "null"]},
                                   "lease_expires_at": NULLABLE_TIME,
                                   "cancel_requested": {"type": "boolean"}}}}}},
            "FinishReply": {"type": "object", "required": ["items"], "properties": {"items": {
                "type": "array", "items": {
                    "type": "object",
                    "required": ["attempt_id", "accepted", "reason", "task_state", "replayed"],
                    "properties": {"attempt_id": ID, "accepted": {"type": "boolean"},
                                   "reason": {"type": ["string", "null"]},
                                   "task_state": {"type": ["string", "null"]},
                                   "replayed": {"type": "boolean"}}}}}},
            "HeartbeatReply": {
                "type": "object", "required": ["session_id", "alive"],
                "properties": {"session_id": ID, "alive": {"const": True}},
            },
        },
    },
}


async def openapi(_request: web.Request) -> web.Response:
    return web.json_response(DOCUMENT)

"""The OpenAPI 3.1 document served at ``/v1/openapi.json``.

Written by hand next to the routes; ``tests/integration/api/test_openapi.py`` fails when a route
is missing here or a path here has no route.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orbit_common.service.http.openapi import (
    OPERATIONAL_PATHS,
    PROBLEM,
    READINESS,
    SECURITY_SCHEMES,
)

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": PROBLEM_REF}}}


def _json(schema_name: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{schema_name}"}}}}


COMMON_ERRORS = {
    "400": _problem("Malformed, invalid or unknown input (codes: validation_failed, "
                    "malformed_json, duplicate_json_key, json_too_deep, json_too_complex, "
                    "invalid_cursor)"),
    "401": _problem("Missing or invalid credential (unauthenticated, invalid_credential)"),
    "503": _problem("Database unavailable or commit outcome unknown; retry"),
}

# A flow-control refusal (docs/flow-control.md): nothing was written; the whole request (a whole
# batch) may be sent again after Retry-After.
TOO_MANY_REQUESTS: dict[str, Any] = {
    **_problem("queue_full (the queue's limit of unfinished tasks) or "
               "application_quota_exceeded (the application's); nothing was written"),
    "headers": {"Retry-After": {
        "description": "Seconds to wait before sending the request again",
        "schema": {"type": "integer", "minimum": 0}}},
}

ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}
# An idempotency key: 1-255 UTF-8 bytes of printable characters (Python's str.isprintable: no
# control, format, private-use, unassigned or separator character but the space). maxLength
# counts characters and the pattern excludes the control characters only; the rest is in words.
IDEMPOTENCY_KEY: dict[str, Any] = {
    "type": "string", "minLength": 1, "maxLength": 255,
    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
    "description": "1-255 UTF-8 bytes of printable characters",
}
NAME = {"type": "string", "pattern": "^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$"}


def ref(name: str) -> dict[str, str]:
    """A reference to a component schema."""
    return {"$ref": f"#/components/schemas/{name}"}


def request_body(name: str, *, required: bool = True) -> dict[str, Any]:
    """A JSON request body of the component schema ``name``."""
    return {"required": required, "content": {"application/json": {"schema": ref(name)}}}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A required path parameter."""
    return {"name": name, "in": "path", "required": True, "schema": schema}


def limit_param(maximum: int, default: int) -> dict[str, Any]:
    """A list's ``limit`` query parameter."""
    return {"name": "limit", "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": maximum,
                       "default": default}}


IDEMPOTENCY_PARAM = {"name": "Idempotency-Key", "in": "header", "required": False,
                     "schema": IDEMPOTENCY_KEY}
CURSOR_PARAM = {"name": "cursor", "in": "query", "schema": {"type": "string"},
                "description": "next_cursor of the previous page (same other parameters)"}
# What any call of a resource's routes may answer, and what a call with a body may add.
BODY_ERRORS = {"413": _problem("payload_too_large"),
               "415": _problem("unsupported_media_type, unsupported_content_encoding")}


def resource_errors(forbidden: str | None) -> dict[str, Any]:
    """400, 401 and 503 as every resource route answers them, and 403 with ``forbidden``'s
    text when the routes have one."""
    found = {
        "400": _problem("Malformed, invalid or unknown input (codes: validation_failed, "
                        "malformed_json, duplicate_json_key, json_too_deep, json_too_complex, "
                        "invalid_cursor)"),
        "401": _problem("Missing or invalid credential (unauthenticated, invalid_credential)"),
    }
    if forbidden is not None:
        found["403"] = _problem(forbidden)
    found["503"] = _problem("Database unavailable or commit outcome unknown; retry")
    return found


def _namespace_state(summary: str, op_id: str, ok: str) -> dict[str, Any]:
    return {
        "summary": summary, "operationId": op_id,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/NamespaceStateRequest"}}}},
        "responses": {
            "200": _json("Namespace", ok), **COMMON_ERRORS,
            "400": _problem("validation_failed (the reason is required), malformed_json, "
                            "duplicate_json_key, json_too_deep, json_too_complex"),
            "403": _problem("The credential may not namespaces.manage this name (forbidden)"),
            "404": _problem("namespace_not_found: no such namespace in the caller's "
                            "application"),
            "409": _problem("stale_revision: changed concurrently; retry"),
            "413": _problem("payload_too_large"),
            "415": _problem("unsupported_media_type"),
        },
    }


TIME = {"type": "string", "format": "date-time"}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Orbit API",
        "version": "1",
        "description": "Reliable task execution and workflow orchestration. Errors are RFC 9457 "
        "problem documents with a stable `code` (docs/api/errors.md).",
    },
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}],
    "paths": {
        **OPERATIONAL_PATHS,
        "/v1/whoami": {"get": {
            "summary": "The caller's application, credential, grants and visible namespaces",
            "operationId": "whoami",
            "responses": {"200": _json("Whoami", "The caller"), **COMMON_ERRORS}}},
        "/v1/namespaces": {
            "get": {
                "summary": "List the namespaces the credential may read",
                "operationId": "listNamespaces",
                "parameters": [
                    {"name": "limit", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": _json("NamespacePage", "A page of namespaces"),
                              **COMMON_ERRORS},
            },
            "post": {
                "summary": "Create a namespace in the caller's application",
                "operationId": "createNamespace",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                "schema": IDEMPOTENCY_KEY}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateNamespaceRequest"}}}},
                "responses": {
                    "201": _json("Namespace", "Created (or the replay of the original response)"),
                    **COMMON_ERRORS,
                    "403": _problem("The credential may not create this namespace (forbidden)"),
                    "409": _problem("already_exists, or idempotency_conflict"),
                    "413": _problem("payload_too_large"),
                    "415": _problem("unsupported_media_type, unsupported_content_encoding"),
                },
            },
        },
        "/v1/namespaces/{namespace}/disable": {
            "parameters": [{"name": "namespace", "in": "path", "required": True,
                            "schema": NAME}],
            "post": _namespace_state(
                "Disable a namespace (operators): its API answers namespace_not_found, workers "
                "can neither register nor claim, its schedules do not fire; idempotent",
                "disableNamespace", "The disabled namespace"),
        },
        "/v1/namespaces/{namespace}/enable": {
            "parameters": [{"name": "namespace", "in": "path", "required": True,
                            "schema": NAME}],
            "post": _namespace_state("Enable a disabled namespace again; idempotent",
                                     "enableNamespace", "The active namespace"),
        },
    },
    "components": {
        "securitySchemes": SECURITY_SCHEMES,
        "schemas": {
            "Problem": PROBLEM,
            "Readiness": READINESS,
            "Grant": {
                "type": "object",
                "properties": {k: {"type": "array", "items": {"type": "string"}}
                               for k in ("namespaces", "actions", "queues")},
            },
            "Whoami": {
                "type": "object",
                "required": ["application", "credential", "grants", "namespaces"],
                "properties": {
                    "application": {"type": "object", "properties": {"id": ID, "name": NAME}},
                    "credential": {"type": "object", "properties": {
                        "id": ID, "name": NAME, "prefix": {"type": "string"}}},
                    "grants": {"type": "array", "items": {"$ref": "#/components/schemas/Grant"}},
                    "namespaces": {"type": "array", "items": NAME},
                },
            },
            "NamespaceStateRequest": {
                "type": "object", "additionalProperties": False, "required": ["reason"],
                "description": "An operator's intervention: the reason is required and audited",
                "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 1024}},
            },
            "CreateNamespaceRequest": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": NAME,
                               "description": {"type": "string", "maxLength": 512}},
            },
            "Namespace": {
                "type": "object",
                "required": ["id", "name", "description", "state", "revision", "created_at",
                             "updated_at"],
                "properties": {"id": ID, "name": NAME, "description": {"type": "string"},
                               "state": {"enum": ["ACTIVE", "DISABLED"]},
                               "revision": {"type": "integer", "minimum": 1},
                               "created_at": TIME, "updated_at": TIME},
            },
            "NamespacePage": {
                "type": "object", "required": ["items", "next_cursor"],
                "properties": {
                    "items": {"type": "array", "items": {"$ref": "#/components/schemas/Namespace"}},
                    "next_cursor": {"type": ["string", "null"]},
                },
            },
        },
    },
}


def merge(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Add a route module's paths and component schemas; a duplicate is a programming error."""
    for path, operations in paths.items():
        existing = DOCUMENT["paths"].setdefault(path, {})
        clash = set(existing) & set(operations)
        if clash:
            raise ValueError(f"OpenAPI: {path} {sorted(clash)} documented twice")
        existing.update(operations)
    for name, schema in schemas.items():
        if name in DOCUMENT["components"]["schemas"]:
            raise ValueError(f"OpenAPI: schema {name} defined twice")
        DOCUMENT["components"]["schemas"][name] = schema


async def openapi(_request: web.Request) -> web.Response:
    return web.json_response(DOCUMENT)

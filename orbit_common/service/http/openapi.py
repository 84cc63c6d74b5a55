"""OpenAPI pieces every HTTP daemon's document shares (the API's and the dispatcher's)."""

from __future__ import annotations

from typing import Any

# The operational routes of every public HTTP port (liveness, bare readiness, the document).
# /metrics and the detailed /readyz are served only on the operator listener ([service]
# metrics_host:metrics_port, docs/configuration.md), so they are not part of a public document.
OPERATIONAL_PATHS: dict[str, Any] = {
    "/healthz": {"get": {
        "summary": "Liveness", "security": [], "operationId": "healthz",
        "responses": {"200": {"description": "The process is alive"}}}},
    "/readyz": {"get": {
        "summary": "Readiness: ready or not (the reasons are on the operator listener only)",
        "security": [], "operationId": "readyz",
        "responses": {
            "200": {"description": "Ready", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Readiness"}}}},
            "503": {"description": "Not ready", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Readiness"}}}}}}},
    "/v1/openapi.json": {"get": {
        "summary": "This document", "security": [], "operationId": "openapi",
        "responses": {"200": {"description": "OpenAPI 3.1 document"}}}},
}


# The public /readyz body: nothing about the database, its version or the migrations.
READINESS: dict[str, Any] = {
    "type": "object", "required": ["ready"], "additionalProperties": False,
    "properties": {"ready": {"type": "boolean"}},
}


SECURITY_SCHEMES: dict[str, Any] = {
    "bearer": {"type": "http", "scheme": "bearer",
               "description": "An Orbit API key: orb_<prefix>_<secret>"},
}

# RFC 9457 problem documents, as the shared problem layer (problems.py) writes them.
PROBLEM: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"},
        "status": {"type": "integer"}, "detail": {"type": "string"},
        "code": {"type": "string"}, "instance": {"type": "string"},
        "retry_after_s": {"type": "integer", "minimum": 0,
                          "description": "429 only: the Retry-After header's value"},
        "errors": {"type": "array", "maxItems": 100, "items": {
            "type": "object", "properties": {"path": {"type": "string"},
                                             "message": {"type": "string"}}}},
        "errors_omitted": {
            "type": "integer", "minimum": 1,
            "description": "validation_failed only: problems beyond the 100 listed"},
    },
}

"""OpenAPI pieces every HTTP daemon's document shares (the API's and the dispatcher's)."""

from __future__ import annotations

from typing import Any

# The operational routes every HTTP daemon serves (health, readiness, metrics, its document).
OPERATIONAL_PATHS: dict[str, Any] = {
    "/healthz": {"get": {
        "summary": "Liveness", "security": [], "operationId": "healthz",
        "responses": {"200": {"description": "The process is alive"}}}},
    "/readyz": {"get": {
        "summary": "Readiness: migrations applied, not dirty, zero foreign keys",
        "security": [], "operationId": "readyz",
        "responses": {"200": {"description": "Ready"},
                      "503": {"description": "Not ready; the body says why"}}}},
    "/metrics": {"get": {
        "summary": "Prometheus metrics", "security": [], "operationId": "metrics",
        "responses": {"200": {"description": "Prometheus text format"}}}},
    "/v1/openapi.json": {"get": {
        "summary": "This document", "security": [], "operationId": "openapi",
        "responses": {"200": {"description": "OpenAPI 3.1 document"}}}},
}

"""``/v1/applications/{application}/resources``: the application's shared quotas
(docs/flow-control.md; orbit_common/pulse/quotas.py)."""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from orbit_api.openapi import COMMON_ERRORS, NAME, TIME, _json, _problem
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import quotas
from orbit_common.service.http.body import query_params, read_json
from orbit_common.service.http.context import DB, request_id_of


@attrs.frozen(kw_only=True)
class UpdateResourcesRequest:
    """Strict: unknown fields and wrong JSON types are refused. A limit left out keeps its
    value; a limit sent as null becomes unlimited."""

    revision: int
    max_unfinished_tasks: int | None = None
    max_active_attempts: int | None = None
    max_reserved_attempts: int | None = None
    max_starts_per_second: int | None = None
    reason: str | None = None


def _patch(dto: UpdateResourcesRequest, raw: dict[str, Any]) -> quotas.LimitsPatch:
    return quotas.LimitsPatch(**{
        name: getattr(dto, name) if name in raw else quotas.UNSET
        for name in quotas.LIMIT_FIELDS
    })


async def get_resources(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await quotas.get_resources(request.app[DB], principal_of(request),
                                      application=request.match_info["application"])
    return web.json_response(view)


async def update_resources(request: web.Request) -> web.Response:
    query_params(request, ())
    dto, raw = await read_json(request, UpdateResourcesRequest)
    view = await quotas.update_resources(
        request.app[DB], principal_of(request), application=request.match_info["application"],
        revision=dto.revision, patch=_patch(dto, raw), reason=dto.reason,
        request_id=request_id_of(request),
    )
    return web.json_response(view)


PATH = "/v1/applications/{application}/resources"


def add_routes(app: web.Application) -> None:
    """Register the application routes."""
    app.router.add_get(PATH, get_resources)
    app.router.add_patch(PATH, update_resources)


# --- OpenAPI -----------------------------------------------------------------------------------

_LIMIT = {"type": ["integer", "null"], "minimum": 1, "maximum": quotas.INT_MAX}
_LIMITS: dict[str, Any] = {
    "max_unfinished_tasks": {
        **_LIMIT, "description": "Unfinished tasks of all namespaces together, checked at "
                                 "submit (429 application_quota_exceeded); null: unlimited"},
    "max_active_attempts": {
        **_LIMIT, "description": "Attempts OFFERED or RUNNING together, checked at claim; "
                                 "null: unlimited"},
    "max_reserved_attempts": {
        **_LIMIT, "description": "Attempts granted and not yet started, checked at claim; "
                                 "null: unlimited"},
    "max_starts_per_second": {
        **_LIMIT, "description": "Start approvals per one-second window, checked at start "
                                 "(start_rate_limited); null: unlimited"},
}
_COUNT = {"type": "integer", "minimum": 0}
_NOT_FOUND = _problem("application_not_found: not the credential's application, or none")
_FORBIDDEN = _problem("forbidden: no grant covering every namespace and queue for the action")

OPENAPI_PATHS: dict[str, Any] = {
    PATH: {
        "parameters": [{"name": "application", "in": "path", "required": True,
                        "schema": NAME}],
        "get": {
            "summary": "The application's shared limits and current usage",
            "operationId": "getApplicationResources",
            "responses": {"200": _json("ApplicationResources", "Limits and usage"),
                          **COMMON_ERRORS, "403": _FORBIDDEN, "404": _NOT_FOUND},
        },
        "patch": {
            "summary": "Change the application's shared limits: compare-and-set on revision",
            "operationId": "updateApplicationResources",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/UpdateApplicationResourcesRequest"}}}},
            "responses": {
                "200": _json("ApplicationResources",
                             "After the change (unchanged if nothing differs)"),
                **COMMON_ERRORS, "403": _FORBIDDEN, "404": _NOT_FOUND,
                "409": _problem("stale_revision: the resources are no longer at this revision"),
                "413": _problem("payload_too_large"),
                "415": _problem("unsupported_media_type, unsupported_content_encoding"),
            },
        },
    },
}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "ApplicationResources": {
        "type": "object",
        "required": ["application", "application_id", "revision", *quotas.LIMIT_FIELDS, "usage",
                     "updated_at"],
        "properties": {
            "application": NAME,
            "application_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
            "revision": {"type": "integer", "minimum": 1,
                         "description": "Configuration version; usage does not change it"},
            **_LIMITS,
            "usage": {
                "type": "object",
                "required": ["measured_at", "unfinished_tasks", "active_attempts",
                             "reserved_attempts", "starts_in_window", "start_window_until"],
                "properties": {
                    "measured_at": {**TIME, "description": "Database time of the reading"},
                    "unfinished_tasks": _COUNT, "active_attempts": _COUNT,
                    "reserved_attempts": _COUNT,
                    "starts_in_window": {**_COUNT, "description": "0 once the window passed"},
                    "start_window_until": {"type": ["string", "null"], "format": "date-time"},
                },
            },
            "updated_at": TIME,
        },
    },
    "UpdateApplicationResourcesRequest": {
        "type": "object", "additionalProperties": False, "required": ["revision"],
        "properties": {
            "revision": {"type": "integer", "minimum": 1,
                         "description": "The revision the change is based on"},
            **_LIMITS,
            "reason": {"type": ["string", "null"], "maxLength": quotas.REASON_MAX,
                       "description": "Recorded in the audit event"},
        },
    },
}

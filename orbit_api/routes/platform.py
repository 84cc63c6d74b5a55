"""``/v1/whoami``, ``/v1/namespaces`` and a namespace's ``/disable`` and ``/enable``."""

from __future__ import annotations

import attrs
from aiohttp import web

from orbit_common import errors
from orbit_common.model import cursors
from orbit_common.platform import commands
from orbit_common.platform.principals import principal_of
from orbit_common.service.http.body import int_param, query_params, read_json
from orbit_common.service.http.context import DB, request_id_of


@attrs.frozen(kw_only=True)
class CreateNamespaceRequest:
    name: str
    description: str = ""


@attrs.frozen(kw_only=True)
class NamespaceStateRequest:
    reason: str | None = None


def idempotency_key(request: web.Request) -> str | None:
    values = request.headers.getall("Idempotency-Key", [])
    if len(values) > 1:
        raise errors.ValidationFailed(
            [{"path": "Idempotency-Key", "message": "given more than once"}]
        )
    return values[0] if values else None


async def whoami(request: web.Request) -> web.Response:
    query_params(request, ())  # takes none: an unknown parameter is an error, as everywhere
    return web.json_response(await commands.whoami(request.app[DB], principal_of(request)))


async def list_namespaces(request: web.Request) -> web.Response:
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=100, low=1, high=commands.PAGE_MAX)
    after = ""
    if "cursor" in params:
        position = cursors.decode(params["cursor"], "namespaces", {})
        if len(position) != 1 or not isinstance(position[0], str):
            raise errors.InvalidCursor()
        after = position[0]
    page = await commands.list_namespaces(
        request.app[DB], principal_of(request), after_name=after, limit=limit
    )
    next_cursor = (
        cursors.encode("namespaces", {}, [page.last_name]) if page.last_name is not None else None
    )
    return web.json_response({"items": page.items, "next_cursor": next_cursor})


async def create_namespace(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    dto, _raw = await read_json(request, CreateNamespaceRequest)
    outcome = await commands.create_namespace(
        request.app[DB],
        principal_of(request),
        name=dto.name,
        description=dto.description,
        idempotency_key=key,
        request_id=request_id_of(request),
    )
    return web.json_response(outcome.body, status=outcome.status)


async def _set_state(request: web.Request, *, disabled: bool) -> web.Response:
    query_params(request, ())
    reason = None
    if request.body_exists:  # without a body, the domain reports the missing reason
        dto, _raw = await read_json(request, NamespaceStateRequest)
        reason = dto.reason
    view = await commands.set_namespace_state(
        request.app[DB], principal_of(request), name=request.match_info["namespace"],
        disabled=disabled, reason=reason, request_id=request_id_of(request))
    return web.json_response(view)


async def disable_namespace(request: web.Request) -> web.Response:
    return await _set_state(request, disabled=True)


async def enable_namespace(request: web.Request) -> web.Response:
    return await _set_state(request, disabled=False)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/v1/namespaces", list_namespaces)
    app.router.add_post("/v1/namespaces", create_namespace)
    app.router.add_post("/v1/namespaces/{namespace}/disable", disable_namespace)
    app.router.add_post("/v1/namespaces/{namespace}/enable", enable_namespace)

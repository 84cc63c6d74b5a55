"""The console's audit page: a namespace's audit events, newest first, filtered by action,
actor kind and time (orbit_common/console/audit_log.py; needs ``namespaces.manage``)."""

from __future__ import annotations

import datetime as dt

from aiohttp import web

from orbit_api.console.web import principal_of, render, utc_text
from orbit_common import errors
from orbit_common.console import audit_log
from orbit_common.platform.audit import ActorKind
from orbit_common.pulse.tasks import parse_rfc3339
from orbit_common.service.http.context import DB

FILTERS = ("action", "actor_kind", "after", "before")


def _time(text: str, name: str, problems: list[dict[str, str]]) -> dt.datetime | None:
    try:
        return parse_rfc3339(utc_text(text))
    except ValueError as exc:
        problems.append({"path": f"?{name}", "message": str(exc)})
        return None


async def audit_page(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = request.match_info["namespace"]
    unknown = set(request.query) - {*FILTERS, "cursor"}
    if unknown:
        raise errors.ValidationFailed([{"path": f"?{sorted(unknown)[0]}",
                                        "message": "not a filter of this page"}])
    given = {name: request.query[name].strip() for name in FILTERS
             if request.query.get(name, "").strip()}
    problems: list[dict[str, str]] = []
    after = _time(given["after"], "after", problems) if "after" in given else None
    before = _time(given["before"], "before", problems) if "before" in given else None
    if problems:
        raise errors.ValidationFailed(problems)
    filters = audit_log.AuditFilter(action=given.get("action"),
                                    actor_kind=given.get("actor_kind"), after=after,
                                    before=before)
    page = await audit_log.list_audit(request.config_dict[DB], principal, namespace=namespace,
                                      filters=filters, cursor=request.query.get("cursor") or None)
    return await render(request, "audit.html", {
        "namespace": namespace, "page": "audit", "items": page.items,
        "next_cursor": page.next_cursor, "filters": given,
        "kinds": [k.value for k in ActorKind]})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/ns/{namespace}/audit", audit_page, name="audit")

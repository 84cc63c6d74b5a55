"""The console's schedule pages: the list, the detail with its versions and occurrence ledger,
and pause, resume, trigger now and backfill (a preview first, then a confirm carrying an
idempotency key), each audited. The reads and writes are the HTTP API's domain functions
(orbit_common/pulse/schedule_commands.py) called as the console's principal; the backfill's
preview (schedule_commands.preview_backfill) is the console's only, the API has none."""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Mapping

from aiohttp import web

from orbit_api.console.web import form_of, principal_of, redirect, render, utc_text
from orbit_common import errors
from orbit_common.model import cursors, jsondoc
from orbit_common.pulse import schedule_commands, tasks
from orbit_common.service.http.context import DB, request_id_of

PAGE = 50
LEDGER_ROWS = 50
PREVIEW_ROWS = 100  # instants listed on the backfill preview (the count is always whole)
IDEMPOTENCY_KEY = re.compile(r"[0-9a-f]{32}")
NOTICES = {"paused": "计划已暂停。", "resumed": "计划已恢复。", "triggered": "已立即运行一次。",
           "backfilled": "补跑已提交。"}


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _name(request: web.Request) -> str:
    return request.match_info["schedule"]


async def schedule_list(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    filters = {"namespace": namespace}
    after = ""
    raw = request.query.get("cursor")
    if raw is not None:
        position = cursors.decode(raw, "console.schedules", filters)
        if len(position) != 1 or not isinstance(position[0], str):
            raise errors.InvalidCursor()
        after = position[0]
    items = await schedule_commands.list_schedules(
        request.config_dict[DB], principal, namespace=namespace, after=after, limit=PAGE + 1)
    next_cursor = None
    if len(items) > PAGE:
        items = items[:PAGE]
        next_cursor = cursors.encode("console.schedules", filters, [items[-1]["name"]])
    return await render(request, "schedules.html", {
        "namespace": namespace, "page": "schedules", "items": items,
        "next_cursor": next_cursor})


async def schedule_detail(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    db = request.config_dict[DB]
    view = await schedule_commands.get_schedule(db, principal, namespace=namespace,
                                                name=_name(request))
    ledger = await schedule_commands.list_occurrences(db, principal, namespace=namespace,
                                                      name=_name(request), limit=LEDGER_ROWS)
    return await render(request, "schedule.html", {
        "namespace": namespace, "page": "schedules", "s": view, "ledger": ledger,
        "ledger_rows": LEDGER_ROWS, "json": jsondoc.dumps,
        "notice": NOTICES.get(request.query.get("done", ""))})


def _detail_url(request: web.Request, done: str) -> str:
    url = request.app.router["schedule"].url_for(namespace=_namespace(request),
                                                 schedule=_name(request))
    return str(url.with_query(done=done))


async def _set_state(request: web.Request, target: str, done: str) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    await schedule_commands.set_state(
        request.config_dict[DB], principal, namespace=_namespace(request), name=_name(request),
        target=target, reason=form.get("reason", "").strip() or None,
        request_id=request_id_of(request))
    return redirect(_detail_url(request, done))


async def schedule_pause(request: web.Request) -> web.StreamResponse:
    return await _set_state(request, "PAUSED", "paused")


async def schedule_resume(request: web.Request) -> web.StreamResponse:
    return await _set_state(request, "ACTIVE", "resumed")


async def schedule_trigger(request: web.Request) -> web.StreamResponse:
    await form_of(request)
    principal = await principal_of(request)
    await schedule_commands.trigger_now(
        request.config_dict[DB], principal, namespace=_namespace(request), name=_name(request),
        request_id=request_id_of(request))
    return redirect(_detail_url(request, "triggered"))


def _time(form: Mapping[str, str], name: str, problems: list[dict[str, str]]
          ) -> dt.datetime | None:
    text = utc_text(form.get(name, "").strip())
    try:
        return tasks.parse_rfc3339(text)
    except ValueError as exc:
        problems.append({"path": name, "message": str(exc)})
        return None


def _backfill_input(given: Mapping[str, str]) -> tuple[dt.datetime, dt.datetime, str]:
    """The range and reason of a backfill form, checked as the domain checks them."""
    problems: list[dict[str, str]] = []
    start, end = _time(given, "start", problems), _time(given, "end", problems)
    if problems or start is None or end is None:
        raise errors.ValidationFailed(problems)
    reason = given.get("reason", "").strip()
    schedule_commands.check_backfill(start, end, reason)
    return start, end, reason


async def schedule_backfill_preview(request: web.Request) -> web.StreamResponse:
    """The backfill's preview (GET, writes nothing): the instants a backfill of the range
    would create now, each with its version, and the confirm form. The confirm form carries a
    fresh idempotency key, so sending it twice backfills once."""
    principal = await principal_of(request)
    unknown = set(request.query) - {"start", "end", "reason"}
    if unknown:
        raise errors.ValidationFailed([{"path": f"?{sorted(unknown)[0]}",
                                        "message": "not a field of this page"}])
    start, end, reason = _backfill_input(request.query)
    preview = await schedule_commands.preview_backfill(
        request.config_dict[DB], principal, namespace=_namespace(request), name=_name(request),
        start=start, end=end)
    return await render(request, "backfill.html", {
        "namespace": _namespace(request), "page": "schedules", "name": _name(request),
        "p": preview, "shown": preview["instants"][:PREVIEW_ROWS], "reason": reason,
        "idempotency_key": secrets.token_hex(16)})


async def schedule_backfill(request: web.Request) -> web.StreamResponse:
    """The confirmed backfill: the domain's backfill with the preview's idempotency key."""
    form = await form_of(request)
    principal = await principal_of(request)
    start, end, reason = _backfill_input(form)
    key = form.get("idempotency_key", "")
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise errors.ValidationFailed([{"path": "idempotency_key",
                                        "message": "the preview's key: 32 hex digits"}])
    await schedule_commands.backfill(
        request.config_dict[DB], principal, namespace=_namespace(request), name=_name(request),
        start=start, end=end, reason=reason, idempotency_key=key,
        request_id=request_id_of(request))
    return redirect(_detail_url(request, "backfilled"))


def add_routes(app: web.Application) -> None:
    base = "/ns/{namespace}/schedules"
    app.router.add_get(base, schedule_list, name="schedules")
    app.router.add_get(base + "/{schedule}", schedule_detail, name="schedule")
    app.router.add_post(base + "/{schedule}/pause", schedule_pause, name="schedule.pause")
    app.router.add_post(base + "/{schedule}/resume", schedule_resume, name="schedule.resume")
    app.router.add_post(base + "/{schedule}/trigger", schedule_trigger, name="schedule.trigger")
    app.router.add_get(base + "/{schedule}/backfill", schedule_backfill_preview,
                       name="schedule.backfill_preview")
    app.router.add_post(base + "/{schedule}/backfill", schedule_backfill,
                        name="schedule.backfill")

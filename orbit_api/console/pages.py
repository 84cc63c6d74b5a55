"""The console's namespace pages: the overview and the queues (list, detail, pause/resume,
limits). Reads and writes go through the domain functions of the HTTP API
(orbit_common/pulse/queues.py, orbit_common/console/overview.py) as the console's principal."""

from __future__ import annotations

from aiohttp import web

from orbit_api.console.charts import bar_chart
from orbit_api.console.web import form_of, principal_of, redirect, render
from orbit_common import errors
from orbit_common.console import overview as overview_model
from orbit_common.model import cursors
from orbit_common.pulse import queues
from orbit_common.service.http.context import DB, request_id_of

QUEUES_PAGE = 50
# The limits form: field -> (label, unit, may be blank = unlimited).
LIMIT_FIELDS: dict[str, tuple[str, str, bool]] = {
    "max_concurrent_attempts": ("并发尝试上限", "个", True),
    "max_unfinished_tasks": ("未终结任务上限", "个", True),
    "max_starts_per_second": ("每秒开始上限", "次/秒", True),
    "offer_lease_ms": ("领取租约", "毫秒", False),
    "execution_lease_ms": ("执行租约", "毫秒", False),
}
NOTICES = {"paused": "队列已暂停。", "resumed": "队列已恢复。", "limits": "限额已保存。"}


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


async def overview(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    found = await overview_model.namespace_overview(request.config_dict[DB], principal,
                                                    namespace=_namespace(request))
    width = overview_model.FAILURE_WINDOW_S // overview_model.FAILURE_BUCKETS // 60
    charts = {
        "depth": bar_chart([(q.name, q.depth) for q in found.queues], title="队列深度"),
        "running": bar_chart([(q.name, q.running) for q in found.queues], title="执行中"),
        "failures": bar_chart(
            [(f"{(len(found.failure_buckets) - i) * width} 分钟前", n)
             for i, n in enumerate(found.failure_buckets)], title="最近一小时失败数"),
    }
    return await render(request, "overview.html", {
        "namespace": found.namespace, "page": "overview", "o": found, "charts": charts})


async def queue_list(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    filters = {"namespace": namespace}
    after = ""
    raw = request.query.get("cursor")
    if raw is not None:
        position = cursors.decode(raw, "console.queues", filters)
        if len(position) != 1 or not isinstance(position[0], str):
            raise errors.InvalidCursor()
        after = position[0]
    page = await queues.list_queues(request.config_dict[DB], principal, namespace=namespace,
                                    after_name=after, limit=QUEUES_PAGE)
    next_cursor = (None if page.next_after is None
                   else cursors.encode("console.queues", filters, [page.next_after]))
    return await render(request, "queues.html", {
        "namespace": namespace, "page": "queues", "items": page.items,
        "next_cursor": next_cursor})


async def queue_detail(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    view = await queues.get_queue(request.config_dict[DB], principal, namespace=namespace,
                                  name=request.match_info["queue"])
    return await render(request, "queue.html", {
        "namespace": namespace, "page": "queues", "q": view, "limit_fields": LIMIT_FIELDS,
        "notice": NOTICES.get(request.query.get("done", "")),
        "reason_max": queues.REASON_MAX})


def _detail_url(request: web.Request, done: str) -> str:
    url = request.app.router["queue"].url_for(namespace=_namespace(request),
                                              queue=request.match_info["queue"])
    return str(url.with_query(done=done))


async def _gate(request: web.Request, *, paused: bool) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    await queues.set_paused(
        request.config_dict[DB], principal, namespace=_namespace(request),
        name=request.match_info["queue"], paused=paused,
        reason=form.get("reason", "").strip() or None, request_id=request_id_of(request))
    return redirect(_detail_url(request, "paused" if paused else "resumed"))


async def queue_pause(request: web.Request) -> web.StreamResponse:
    return await _gate(request, paused=True)


async def queue_resume(request: web.Request) -> web.StreamResponse:
    return await _gate(request, paused=False)


def _int_field(form: dict[str, str], name: str, problems: list[dict[str, str]], *,
               blank_is_none: bool) -> int | None:
    text = form.get(name, "").strip()
    if not text:
        if blank_is_none:
            return None
        problems.append({"path": name, "message": "required"})
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        problems.append({"path": name, "message": "a whole number"})
        return None
    return int(text)


def limits_patch(form: dict[str, str]) -> tuple[int, queues.QueuePatch]:
    """The revision and the patch a limits form asks for (ValidationFailed naming the field)."""
    problems: list[dict[str, str]] = []
    revision = _int_field(form, "revision", problems, blank_is_none=False)
    values = {name: _int_field(form, name, problems, blank_is_none=blank)
              for name, (_label, _unit, blank) in LIMIT_FIELDS.items()}
    if problems:
        raise errors.ValidationFailed(problems)
    patch = queues.QueuePatch(
        offer_lease_ms=values["offer_lease_ms"],
        execution_lease_ms=values["execution_lease_ms"],
        max_concurrent_attempts=values["max_concurrent_attempts"],
        max_unfinished_tasks=values["max_unfinished_tasks"],
        max_starts_per_second=values["max_starts_per_second"],
    )
    found = patch.problems()
    if found:
        raise errors.ValidationFailed([{**p, "path": p["path"].removeprefix("$.")}
                                       for p in found])
    assert revision is not None  # noqa: S101 - a blank revision is a problem above
    return revision, patch


async def queue_limits(request: web.Request) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    revision, patch = limits_patch(form)
    await queues.update_queue(
        request.config_dict[DB], principal, namespace=_namespace(request),
        name=request.match_info["queue"], revision=revision, patch=patch,
        request_id=request_id_of(request))
    return redirect(_detail_url(request, "limits"))


def add_routes(app: web.Application) -> None:
    base = "/ns/{namespace}"
    app.router.add_get(base + "/", overview, name="overview")
    app.router.add_get(base + "/queues", queue_list, name="queues")
    app.router.add_get(base + "/queues/{queue}", queue_detail, name="queue")
    app.router.add_post(base + "/queues/{queue}/pause", queue_pause, name="queue.pause")
    app.router.add_post(base + "/queues/{queue}/resume", queue_resume, name="queue.resume")
    app.router.add_post(base + "/queues/{queue}/limits", queue_limits, name="queue.limits")


"""The console's task pages: a filtered list with cursor paging, the detail (attempts, state
events, late evidence, the source) and the interventions cancel, review and retry, each with a
reason. Reads and writes are the HTTP API's domain functions (orbit_common/pulse/queries.py,
interventions.py) called as the console's principal."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orbit_api.console.web import form_of, principal_of, redirect, render, utc_text
from orbit_common import errors
from orbit_common.model import jsondoc
from orbit_common.pulse import interventions, queries
from orbit_common.pulse.model import TaskState
from orbit_common.service.http.context import DB, request_id_of

PAGE = 50
DETAIL_ROWS = 50  # attempts, events and evidence shown on the detail page (first page of each)
FILTERS = ("queue", "state", "business_key", "created_after", "created_before")
NOTICES = {"cancelled": "已提交取消。", "reviewed": "核查已记录。", "retried": "已创建重试任务。"}


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _filter_params(request: web.Request) -> dict[str, str]:
    unknown = set(request.query) - {*FILTERS, "cursor"}
    if unknown:
        raise errors.ValidationFailed([{"path": f"?{sorted(unknown)[0]}",
                                        "message": "not a filter of this page"}])
    params = {}
    for name in FILTERS:
        values = request.query.getall(name, [])
        if len(values) > 1:
            raise errors.ValidationFailed([{"path": f"?{name}", "message": "given twice"}])
        if values and values[0].strip():
            value = values[0].strip()
            params[name] = utc_text(value) if name.startswith("created_") else value
    return params


async def task_list(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    params = _filter_params(request)
    filters = queries.ListFilter.parse(params)
    page = await queries.list_tasks(request.config_dict[DB], principal, namespace=namespace,
                                    filters=filters, limit=PAGE,
                                    cursor=request.query.get("cursor") or None)
    return await render(request, "tasks.html", {
        "namespace": namespace, "page": "tasks", "items": page.items,
        "next_cursor": page.next_cursor, "filters": params,
        "states": [s.value for s in TaskState]})


def _task_id(request: web.Request) -> bytes:
    return queries.parse_id(request.match_info["task_id"], "task_id")


def _json(value: Any) -> str:
    return "" if value is None else jsondoc.dumps(value)


async def task_detail(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    task_id = _task_id(request)
    db = request.config_dict[DB]
    task = await queries.get_task(db, principal, namespace=namespace, task_id=task_id)
    attempts = await queries.list_attempts(db, principal, namespace=namespace, task_id=task_id,
                                           limit=DETAIL_ROWS, cursor=None)
    events = await queries.list_events(db, principal, namespace=namespace, task_id=task_id,
                                       limit=DETAIL_ROWS, cursor=None)
    evidence: list[dict[str, Any]] = []
    for attempt in attempts.items:
        found = await queries.list_evidence(
            db, principal, namespace=namespace, task_id=task_id,
            attempt_id=bytes.fromhex(attempt["id"]), limit=DETAIL_ROWS, cursor=None)
        evidence.extend(found.items)
    source: dict[str, Any] | None = None
    source_problem = None
    try:
        source = await queries.task_source(db, principal, namespace=namespace, task_id=task_id)
    except errors.SourceLinkMissing as exc:
        source_problem = f"{exc.code}：{exc.detail}"
    return await render(request, "task.html", {
        "namespace": namespace, "page": "tasks", "t": task, "attempts": attempts.items,
        "events": events.items, "evidence": evidence[:DETAIL_ROWS], "source": source,
        "source_problem": source_problem, "json": _json,
        "notice": NOTICES.get(request.query.get("done", ""))})


def _detail_url(request: web.Request, task_id: str, done: str) -> str:
    url = request.app.router["task"].url_for(namespace=_namespace(request), task_id=task_id)
    return str(url.with_query(done=done))


async def task_cancel(request: web.Request) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    task_id = _task_id(request)
    await interventions.cancel_task(
        request.config_dict[DB], principal, namespace=_namespace(request), task_id=task_id,
        reason=form.get("reason", "").strip() or None, request_id=request_id_of(request))
    return redirect(_detail_url(request, task_id.hex(), "cancelled"))


def _revision(form: dict[str, str]) -> int:
    text = form.get("revision", "")
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise errors.ValidationFailed([{"path": "revision", "message": "a whole number"}])
    return int(text)


async def task_review(request: web.Request) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    task_id = _task_id(request)
    await interventions.review_task(
        request.config_dict[DB], principal, namespace=_namespace(request), task_id=task_id,
        decision=form.get("decision", ""), reason=form.get("reason", "").strip(),
        evidence_ref=form.get("evidence_ref", "").strip(),
        execution_ended=form.get("execution_ended") == "yes", revision=_revision(form),
        request_id=request_id_of(request))
    return redirect(_detail_url(request, task_id.hex(), "reviewed"))


async def task_retry(request: web.Request) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    task_id = _task_id(request)
    outcome = await interventions.retry_task(
        request.config_dict[DB], principal, namespace=_namespace(request), task_id=task_id,
        reason=form.get("reason", "").strip(), rerun_confirmed=form.get("rerun_confirmed") == "yes",
        request_id=request_id_of(request))
    return redirect(_detail_url(request, outcome.body["id"], "retried"))


def add_routes(app: web.Application) -> None:
    base = "/ns/{namespace}/tasks"
    app.router.add_get(base, task_list, name="tasks")
    app.router.add_get(base + "/{task_id}", task_detail, name="task")
    app.router.add_post(base + "/{task_id}/cancel", task_cancel, name="task.cancel")
    app.router.add_post(base + "/{task_id}/review", task_review, name="task.review")
    app.router.add_post(base + "/{task_id}/retry", task_retry, name="task.retry")

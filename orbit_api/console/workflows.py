"""The console's workflow pages (a first slice): the instances with filters next to the
definitions, an instance's detail with its steps coloured by state and its timeline, and pause,
resume and cancel (with a reason, compare-and-set on the control revision), and the step
recovery actions retry, resolve, re-arm and continue (compare-and-set on the step's revision),
each audited as the console. The reads and
writes are the HTTP API's domain functions (orbit_common/weave) called as the console's
principal. A definition version's page draws its steps and transitions as a graph (charts.py);
an instance's detail draws the same graph coloured by its steps' states, and lists its signals
(newest first, the first page)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orbit_api.console.charts import StepGraph, step_graph
from orbit_api.console.web import form_of, principal_of, redirect, render
from orbit_api.metrics import count_recovery
from orbit_common import errors
from orbit_common.model import jsondoc
from orbit_common.service.http.context import DB, request_id_of
from orbit_common.weave import (
    controls,
    definitions,
    instances,
    language,
    recovery,
    signals,
    stops,
    timeline,
    wait_recovery,
)

PAGE = 50
FILTERS = ("definition", "state", "business_key")
NOTICES = {"paused": "实例已暂停。", "resumed": "实例已继续。",
           "cancelled": "已提交取消：实例正在停止（STOPPING），引擎结束在途步骤后记为 CANCELLED。",
           "retried": "已重试步骤：新的激活与任务已创建。",
           "resolved": "已记录步骤的结论：引擎会按它推进步骤。",
           "rearmed": "已重新等待：步骤回到 WAITING，等待新的超时。",
           "continued": "已继续轮询：步骤得到新的轮次。"}


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _filters(request: web.Request) -> dict[str, str]:
    unknown = set(request.query) - {*FILTERS, "cursor"}
    if unknown:
        raise errors.ValidationFailed([{"path": f"?{sorted(unknown)[0]}",
                                        "message": "not a filter of this page"}])
    return {name: request.query[name].strip() for name in FILTERS
            if request.query.get(name, "").strip()}


async def workflow_list(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    db = request.config_dict[DB]
    filters = _filters(request)
    page = await instances.list_instances(
        db, principal, namespace=namespace, definition=filters.get("definition"),
        state=filters.get("state"), business_key=filters.get("business_key"), limit=PAGE,
        cursor=request.query.get("cursor") or None)
    defined = await definitions.list_definitions(db, principal, namespace=namespace,
                                                 limit=PAGE)
    return await render(request, "workflows.html", {
        "namespace": namespace, "page": "workflows", "items": page.items,
        "next_cursor": page.next_cursor, "filters": filters, "definitions": defined})


async def _graph(request: web.Request, name: str, version: int, *, title: str,
                 states: dict[str, str] | None = None) -> tuple[dict[str, Any], StepGraph]:
    """The version ``version`` of the definition ``name`` (read as the console's principal)
    and its steps drawn as a graph."""
    found = await definitions.get_version(request.config_dict[DB], await principal_of(request),
                                          namespace=_namespace(request), name=name,
                                          version=version)
    parsed = language.parse_definition(str(found["document"]))
    return found, step_graph(parsed, title=title, states=states)


async def version_detail(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    text = request.match_info["version"]
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        raise errors.NotFound("no such console page")
    found, graph = await _graph(request, name, int(text), title=f"{name} 版本 {text}")
    return await render(request, "workflow_version.html", {
        "namespace": _namespace(request), "page": "workflows", "v": found, "graph": graph,
        "json": jsondoc.dumps})


async def workflow_detail(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    db = request.config_dict[DB]
    workflow_id = request.match_info["workflow_id"]
    view = await instances.get_instance(db, principal, namespace=namespace,
                                        instance_id=workflow_id)
    events = await timeline.get_timeline(db, principal, namespace=namespace,
                                         instance_id=workflow_id, limit=PAGE)
    received = await signals.list_signals(db, principal, namespace=namespace,
                                          instance_id=workflow_id, limit=PAGE)
    _version, graph = await _graph(
        request, view["definition"], view["version"],
        title=f"{view['definition']} 版本 {view['version']}",
        states={step["name"]: step["state"] for step in view["steps"]})
    return await render(request, "workflow.html", {
        "namespace": namespace, "page": "workflows", "w": view, "graph": graph,
        "events": events.items, "more_events": events.next_cursor is not None,
        "signals": received.items, "more_signals": received.next_cursor is not None,
        "json": jsondoc.dumps,
        "notice": NOTICES.get(request.query.get("done", ""))})


def _whole(form: dict[str, str], name: str) -> int:
    text = form.get(name, "")
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise errors.ValidationFailed([{"path": name, "message": "a whole number"}])
    return int(text)


def _done(request: web.Request, done: str) -> web.Response:
    url = request.app.router["workflow"].url_for(namespace=_namespace(request),
                                                 workflow_id=request.match_info["workflow_id"])
    return redirect(str(url.with_query(done=done)))


async def _set_paused(request: web.Request, *, paused: bool) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    revision = _whole(form, "control_revision")
    await controls.set_paused(
        request.config_dict[DB], principal, namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], paused=paused,
        reason=form.get("reason", "").strip(), control_revision=revision,
        request_id=request_id_of(request))
    return _done(request, "paused" if paused else "resumed")


async def workflow_pause(request: web.Request) -> web.StreamResponse:
    return await _set_paused(request, paused=True)


async def workflow_resume(request: web.Request) -> web.StreamResponse:
    return await _set_paused(request, paused=False)


async def workflow_cancel(request: web.Request) -> web.StreamResponse:
    """Cancel (docs/weave/stop.md): the stop intent, compare-and-set on the control revision."""
    form = await form_of(request)
    principal = await principal_of(request)
    revision = _whole(form, "control_revision")
    await stops.cancel(
        request.config_dict[DB], principal, namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], reason=form.get("reason", "").strip(),
        control_revision=revision, request_id=request_id_of(request))
    return _done(request, "cancelled")


def _optional_whole(form: dict[str, str], name: str) -> int | None:
    return _whole(form, name) if form.get(name, "").strip() else None


def _step(request: web.Request) -> str:
    return request.match_info["step"]


async def _recovered(request: web.Request, kind: str, done: recovery.Done,
                     notice: str) -> web.Response:
    if done.fresh:  # as the API route: a committed recovery, not a replay, is counted
        count_recovery(kind)
    return _done(request, notice)


async def step_retry(request: web.Request) -> web.StreamResponse:
    """Retry a TASK step (docs/weave/recovery.md § 重试): recovery.retry_step as the API."""
    form = await form_of(request)
    principal = await principal_of(request)
    checked = recovery.RetryRequest.check(
        reason=form.get("reason", "").strip(), step_revision=_whole(form, "step_revision"),
        evidence_ref=form.get("evidence_ref", "").strip() or None,
        execution_ended=True if form.get("execution_ended") == "yes" else None,
        additional_attempts=_optional_whole(form, "additional_attempts"))
    done = await recovery.retry_step(
        request.config_dict[DB], principal, namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=_step(request), request=checked,
        request_id=request_id_of(request))
    return await _recovered(request, recovery.RETRY, done, "retried")


async def step_resolve(request: web.Request) -> web.StreamResponse:
    """Record a step's conclusion (docs/weave/recovery.md § 记录结论)."""
    form = await form_of(request)
    principal = await principal_of(request)
    output_text = form.get("output", "").strip()
    checked = recovery.ResolveRequest.check(
        reason=form.get("reason", "").strip(),
        evidence_ref=form.get("evidence_ref", "").strip(),
        step_revision=_whole(form, "step_revision"), conclusion=form.get("conclusion", ""),
        output=jsondoc.loads_strict(output_text) if output_text else None,
        has_output=bool(output_text), error=form.get("error", "").strip() or None,
        task_decision=form.get("task_decision") or None,
        execution_ended=True if form.get("execution_ended") == "yes" else None)
    done = await recovery.resolve_step(
        request.config_dict[DB], principal, namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=_step(request), request=checked,
        request_id=request_id_of(request))
    return await _recovered(request, recovery.RESOLVE, done, "resolved")


async def step_rearm(request: web.Request) -> web.StreamResponse:
    """Re-arm a held SIGNAL wait with a new timeout (docs/weave/recovery.md)."""
    form = await form_of(request)
    principal = await principal_of(request)
    done = await wait_recovery.rearm_wait(
        request.config_dict[DB], principal, namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=_step(request),
        reason=form.get("reason", "").strip(), step_revision=_whole(form, "step_revision"),
        timeout_ms=_whole(form, "timeout_ms"), request_id=request_id_of(request))
    return await _recovered(request, "rearm", done, "rearmed")


async def step_continue(request: web.Request) -> web.StreamResponse:
    """Grant a held (exhausted) POLL step more rounds (docs/weave/recovery.md)."""
    form = await form_of(request)
    principal = await principal_of(request)
    done = await wait_recovery.continue_poll(
        request.config_dict[DB], principal, namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], step=_step(request),
        reason=form.get("reason", "").strip(), step_revision=_whole(form, "step_revision"),
        rounds=_whole(form, "rounds"), deadline_ms=_optional_whole(form, "deadline_ms"),
        request_id=request_id_of(request))
    return await _recovered(request, "continue", done, "continued")


def add_routes(app: web.Application) -> None:
    base = "/ns/{namespace}/workflows"
    app.router.add_get(base, workflow_list, name="workflows")
    app.router.add_get(base + "/definitions/{name}/{version}", version_detail,
                       name="workflow.version")
    app.router.add_get(base + "/{workflow_id}", workflow_detail, name="workflow")
    app.router.add_post(base + "/{workflow_id}/pause", workflow_pause, name="workflow.pause")
    app.router.add_post(base + "/{workflow_id}/resume", workflow_resume, name="workflow.resume")
    app.router.add_post(base + "/{workflow_id}/cancel", workflow_cancel, name="workflow.cancel")
    step = base + "/{workflow_id}/steps/{step}"
    app.router.add_post(step + "/retry", step_retry, name="workflow.step.retry")
    app.router.add_post(step + "/resolve", step_resolve, name="workflow.step.resolve")
    app.router.add_post(step + "/rearm", step_rearm, name="workflow.step.rearm")
    app.router.add_post(step + "/continue", step_continue, name="workflow.step.continue_poll")

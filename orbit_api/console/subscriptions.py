"""The console's subscription pages: the list, the detail with its delivery history, one
delivery with its attempt log, pause/resume and adding budget to an exhausted delivery, each
audited. The reads and writes are the HTTP API's domain functions (orbit_common/relay) called as
the console's principal. Never a signing secret: the views the API answers with carry none."""

from __future__ import annotations

from aiohttp import web

from orbit_api.console.web import form_of, principal_of, redirect, render
from orbit_common import errors
from orbit_common.model import jsondoc
from orbit_common.pulse import queries
from orbit_common.relay import deliveries, model, subscriptions
from orbit_common.relay.model import SubscriptionState
from orbit_common.service.http.context import DB, request_id_of

PAGE = 50
NOTICES = {"paused": "订阅已暂停。", "resumed": "订阅已恢复。", "budget": "已追加投递预算。"}


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _name(request: web.Request) -> str:
    return request.match_info["subscription"]


def _delivery_id(request: web.Request) -> bytes:
    return queries.parse_id(request.match_info["delivery_id"], "delivery_id")


async def subscription_list(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    page = await subscriptions.list_subscriptions(
        request.config_dict[DB], principal, namespace=namespace, limit=PAGE,
        cursor=request.query.get("cursor") or None)
    return await render(request, "subscriptions.html", {
        "namespace": namespace, "page": "subscriptions", "items": page.items,
        "next_cursor": page.next_cursor})


async def subscription_detail(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    db = request.config_dict[DB]
    state = request.query.get("state") or None
    view = await subscriptions.get_subscription(db, principal, namespace=namespace,
                                                name=_name(request))
    history = await deliveries.list_deliveries(
        db, principal, namespace=namespace, name=_name(request), state=state, limit=PAGE,
        cursor=request.query.get("cursor") or None)
    return await render(request, "subscription.html", {
        "namespace": namespace, "page": "subscriptions", "s": view, "items": history.items,
        "next_cursor": history.next_cursor, "state": state or "",
        "states": list(model.DeliveryState.__members__),
        "notice": NOTICES.get(request.query.get("done", ""))})


async def delivery_detail(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    namespace = _namespace(request)
    view = await deliveries.get_delivery(request.config_dict[DB], principal, namespace=namespace,
                                         name=_name(request), delivery_id=_delivery_id(request))
    return await render(request, "delivery.html", {
        "namespace": namespace, "page": "subscriptions", "d": view,
        "budget_max": model.BUDGET_ADD_MAX, "json": jsondoc.dumps,
        "notice": NOTICES.get(request.query.get("done", ""))})


def _url(request: web.Request, route: str, done: str, **parts: str) -> str:
    url = request.app.router[route].url_for(namespace=_namespace(request),
                                            subscription=_name(request), **parts)
    return str(url.with_query(done=done))


async def _set_state(request: web.Request, target: SubscriptionState,
                     done: str) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    await subscriptions.set_state(
        request.config_dict[DB], principal, namespace=_namespace(request), name=_name(request),
        target=target, reason=form.get("reason", "").strip() or None,
        request_id=request_id_of(request))
    return redirect(_url(request, "subscription", done))


async def subscription_pause(request: web.Request) -> web.StreamResponse:
    return await _set_state(request, SubscriptionState.PAUSED, "paused")


async def subscription_resume(request: web.Request) -> web.StreamResponse:
    return await _set_state(request, SubscriptionState.ACTIVE, "resumed")


async def delivery_budget(request: web.Request) -> web.StreamResponse:
    form = await form_of(request)
    principal = await principal_of(request)
    delivery_id = _delivery_id(request)
    text = form.get("attempts", "").strip()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text or 0) <= (
            model.BUDGET_ADD_MAX):
        raise errors.ValidationFailed([{"path": "attempts",
                                        "message": f"1 to {model.BUDGET_ADD_MAX}"}])
    reason = form.get("reason", "").strip()
    if not reason:
        raise errors.ValidationFailed([{"path": "reason", "message": "required"}])
    await deliveries.add_budget(
        request.config_dict[DB], principal, namespace=_namespace(request), name=_name(request),
        delivery_id=delivery_id, attempts=int(text), reason=reason,
        request_id=request_id_of(request))
    return redirect(_url(request, "delivery", "budget", delivery_id=delivery_id.hex()))


def add_routes(app: web.Application) -> None:
    base = "/ns/{namespace}/subscriptions"
    item = base + "/{subscription}"
    app.router.add_get(base, subscription_list, name="subscriptions")
    app.router.add_get(item, subscription_detail, name="subscription")
    app.router.add_post(item + "/pause", subscription_pause, name="subscription.pause")
    app.router.add_post(item + "/resume", subscription_resume, name="subscription.resume")
    app.router.add_get(item + "/deliveries/{delivery_id}", delivery_detail, name="delivery")
    app.router.add_post(item + "/deliveries/{delivery_id}/budget", delivery_budget,
                        name="delivery.budget")

"""``/v1/namespaces/{namespace}/subscriptions``: result subscriptions, their deliveries and pull
consumption over HTTP and WebSocket (docs/api/subscriptions.md).

Thin routes over ``orbit_common.relay``: the routes check the shape of every input (unknown
fields, types, bounds, query parameters, ids) and the domain commands do the rest inside their
transactions (authorization, state, CAS, idempotency, audit). A refused request writes nothing.
The WebSocket stream is in :mod:`orbit_api.routes.subscription_stream`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from orbit_api.openapi import (
    BODY_ERRORS,
    CURSOR_PARAM,
    ID,
    IDEMPOTENCY_PARAM,
    NAME,
    TIME,
    _json,
    _problem,
    limit_param,
    nullable,
    path_param,
    ref,
    request_body,
    resource_errors,
)
from orbit_api.routes.platform import idempotency_key
from orbit_api.routes.tasks import json_response
from orbit_common import errors
from orbit_common.model import ids
from orbit_common.platform.principals import principal_of
from orbit_common.relay import consumer, deliveries, model, subscriptions
from orbit_common.relay.deliveries import AttemptError, Leased, Report, Settled
from orbit_common.relay.model import RelaySettings, SubscriptionState
from orbit_common.service.http.body import int_param, query_params, read_document
from orbit_common.service.http.context import CONFIG, DB, request_id_of

COLLECTION = "/v1/namespaces/{namespace}/subscriptions"
ITEM = COLLECTION + "/{subscription}"
DELIVERY = ITEM + "/deliveries/{delivery_id}"
PAGE_MAX = 500
PAGE_DEFAULT = 100
LEASE_DEFAULT = 10
LEASE_MAX = deliveries.LEASE_BATCH_MAX
WAIT_MAX_MS = 20_000  # a long poll's longest wait
POLL_MIN_MS = 50  # the first pause of an empty long poll; doubles up to POLL_MAX_MS
POLL_MAX_MS = 1000
TOKEN_MAX = 128
ERROR_TEXT_MAX = model.ERROR_MAX
SETTLE_MAX = consumer.SETTLE_BATCH_MAX
OUTCOMES = ("acknowledged", "failed")

RELAY_SETTINGS = web.AppKey("relay_settings", RelaySettings)

Problems = list[dict[str, str]]


def settings_of(app: web.Application) -> RelaySettings:
    """The ``[delivery]`` settings the management commands need (made in add_routes)."""
    return app[RELAY_SETTINGS]


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _subscription(request: web.Request) -> str:
    return request.match_info["subscription"]


def _delivery_id(request: web.Request) -> bytes:
    """The ``{delivery_id}`` path segment; anything but 32 lowercase hex is a 400."""
    return parse_id(request.match_info["delivery_id"], "{delivery_id}")


def parse_id(text: Any, path: str) -> bytes:
    if not isinstance(text, str):
        raise errors.ValidationFailed([{"path": path, "message": "32 lowercase hex characters"}])
    try:
        return ids.from_hex(text)
    except ValueError as exc:
        raise errors.ValidationFailed([{"path": path, "message": str(exc)}]) from exc


async def _object(request: web.Request, allowed: frozenset[str], *,
                  optional: bool = False) -> dict[str, Any]:
    """A JSON object body whose keys are all in ``allowed`` (an absent body is ``{}`` when
    ``optional``)."""
    if optional and not request.body_exists:
        return {}
    doc = await read_document(request)
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "expected a JSON object"}])
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise errors.ValidationFailed([{"path": f"$.{key}", "message": "unknown field"}
                                       for key in unknown])
    return doc


def _int(doc: dict[str, Any], key: str, *, default: int | None, low: int, high: int,
         problems: Problems) -> int | None:
    if key not in doc:
        if default is None:
            problems.append({"path": f"$.{key}", "message": "required"})
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.append({"path": f"$.{key}", "message": f"an integer from {low} to {high}"})
        return default
    return value


def _token(value: Any, path: str, problems: Problems) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= TOKEN_MAX \
            or not value.isascii() or not value.isprintable():
        problems.append({"path": path,
                         "message": f"the lease token: 1-{TOKEN_MAX} printable ASCII characters"})
        return ""
    return value


def _error_text(value: Any, path: str, problems: Problems) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > ERROR_TEXT_MAX:
        problems.append({"path": path, "message": f"a string of at most {ERROR_TEXT_MAX}"
                                                  " characters"})
        return None
    return value


def _reason(doc: dict[str, Any], *, required: bool, problems: Problems) -> str | None:
    value = doc.get("reason")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= model.REASON_MAX:
        problems.append({"path": "$.reason", "message": f"1-{model.REASON_MAX} characters"
                                                        + (" (required)" if required else "")})
        return None
    return value


# --- views --------------------------------------------------------------------------------------


def leased_view(item: Leased) -> dict[str, Any]:
    """A leased delivery as a consumer receives it: the relay payload, its lease token (shown
    once, to the holder) and the lease's expiry (database time)."""
    return {"delivery": item.payload, "lease_token": item.token,
            "lease_expires_at": model.iso(item.lease_expires_at)}


def settled_view(answer: Settled | errors.OrbitError, delivery_id: bytes) -> dict[str, Any]:
    """One report's outcome in a settle answer (or a WebSocket ``settled`` frame)."""
    if isinstance(answer, errors.OrbitError):
        return {"delivery_id": delivery_id.hex(), "settled": False, "code": answer.code,
                "detail": answer.detail}
    return {"delivery_id": answer.delivery_id.hex(), "settled": True,
            "state": answer.state.value, "attempts_used": answer.attempts_used,
            "repeated": answer.repeated}


def parse_report(doc: Any, path: str, problems: Problems, *, outcome: str | None = None
                 ) -> Report | None:
    """One acknowledgement or failure: ``{delivery_id, token, outcome, error?}`` (``outcome``
    fixed by the caller for the single-delivery routes and frames)."""
    if not isinstance(doc, dict):
        problems.append({"path": path, "message": "an object"})
        return None
    allowed = {"delivery_id", "token", "error"} | ({"outcome"} if outcome is None else set())
    before = len(problems)
    problems.extend({"path": f"{path}.{key}", "message": "unknown field"}
                    for key in sorted(set(doc) - allowed))
    delivery_id = b""
    try:
        delivery_id = parse_id(doc.get("delivery_id"), f"{path}.delivery_id")
    except errors.ValidationFailed as exc:
        problems.extend(exc.errors)
    token = _token(doc.get("token"), f"{path}.token", problems)
    chosen = outcome if outcome is not None else doc.get("outcome")
    if chosen not in OUTCOMES:
        problems.append({"path": f"{path}.outcome", "message": " or ".join(OUTCOMES)})
    text = _error_text(doc.get("error"), f"{path}.error", problems)
    if chosen == "acknowledged" and text is not None:
        problems.append({"path": f"{path}.error", "message": "only for a failure"})
    if len(problems) > before:
        return None
    return Report(delivery_id=delivery_id, token=token, acknowledged=chosen == "acknowledged",
                  error=AttemptError(body=text))


# --- management ---------------------------------------------------------------------------------


async def create_subscription(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    settings = settings_of(request.app)
    spec = model.parse_create(await read_document(request), settings.policy)
    created = await subscriptions.create_subscription(
        request.app[DB], principal_of(request), settings, namespace=_namespace(request),
        spec=spec, idempotency_key=key, request_id=request_id_of(request))
    body = dict(created.replay.body)
    if created.secret is not None:
        body["secret"] = created.secret
    return json_response(body, status=created.replay.status)


async def list_subscriptions(request: web.Request) -> web.Response:
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=PAGE_DEFAULT, low=1, high=PAGE_MAX)
    page = await subscriptions.list_subscriptions(
        request.app[DB], principal_of(request), namespace=_namespace(request), limit=limit,
        cursor=params.get("cursor"))
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


async def get_subscription(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await subscriptions.get_subscription(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request))
    return json_response(view)


async def update_subscription(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    spec = model.parse_update(await read_document(request), settings_of(request.app).policy)
    outcome = await subscriptions.update_subscription(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request), spec=spec, idempotency_key=key,
        request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def _set_state(request: web.Request, target: SubscriptionState) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    doc = await _object(request, frozenset({"reason"}), optional=True)
    problems: Problems = []
    reason = _reason(doc, required=False, problems=problems)
    if problems:
        raise errors.ValidationFailed(problems)
    outcome = await subscriptions.set_state(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request), target=target, reason=reason, idempotency_key=key,
        request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def pause_subscription(request: web.Request) -> web.Response:
    return await _set_state(request, SubscriptionState.PAUSED)


async def resume_subscription(request: web.Request) -> web.Response:
    return await _set_state(request, SubscriptionState.ACTIVE)


async def disable_subscription(request: web.Request) -> web.Response:
    return await _set_state(request, SubscriptionState.DISABLED)


async def rotate_secret(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    doc = await _object(request, frozenset({"window_s"}), optional=True)
    problems: Problems = []
    window = _int(doc, "window_s", default=model.ROTATION_WINDOW_DEFAULT_S, low=0,
                  high=model.ROTATION_WINDOW_MAX_S, problems=problems)
    if problems or window is None:
        raise errors.ValidationFailed(problems)
    created = await subscriptions.rotate_secret(
        request.app[DB], principal_of(request), settings_of(request.app),
        namespace=_namespace(request), name=_subscription(request), window_s=window,
        idempotency_key=key, request_id=request_id_of(request))
    body = dict(created.replay.body)
    if created.secret is not None:
        body["secret"] = created.secret
    return json_response(body, status=created.replay.status)


# --- deliveries ---------------------------------------------------------------------------------


async def list_deliveries(request: web.Request) -> web.Response:
    params = query_params(request, {"state", "limit", "cursor"})
    limit = int_param(params, "limit", default=PAGE_DEFAULT, low=1, high=PAGE_MAX)
    state = params.get("state")
    if state is not None and state not in model.DeliveryState.__members__:
        raise errors.ValidationFailed([{"path": "?state",
                                        "message": ", ".join(model.DeliveryState)}])
    page = await deliveries.list_deliveries(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request), state=state, limit=limit, cursor=params.get("cursor"))
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


async def get_delivery(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await deliveries.get_delivery(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request), delivery_id=_delivery_id(request))
    return json_response(view)


async def add_budget(request: web.Request) -> web.Response:
    query_params(request, ())
    delivery_id = _delivery_id(request)
    key = idempotency_key(request)
    doc = await _object(request, frozenset({"attempts", "reason"}))
    problems: Problems = []
    attempts = _int(doc, "attempts", default=None, low=1, high=model.BUDGET_ADD_MAX,
                    problems=problems)
    reason = _reason(doc, required=True, problems=problems)
    if problems or attempts is None or reason is None:
        raise errors.ValidationFailed(problems)
    outcome = await deliveries.add_budget(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request), delivery_id=delivery_id, attempts=attempts,
        reason=reason, idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


# --- pull consumption ---------------------------------------------------------------------------


async def lease(request: web.Request) -> web.Response:
    """Lease up to ``max`` due deliveries; with ``wait_ms``, wait that long for one when none
    is due (a cheap read between attempts with a bounded back-off, never a lease loop)."""
    query_params(request, ())
    doc = await _object(request, frozenset({"max", "wait_ms"}), optional=True)
    problems: Problems = []
    limit = _int(doc, "max", default=LEASE_DEFAULT, low=1, high=LEASE_MAX, problems=problems)
    wait_ms = _int(doc, "wait_ms", default=0, low=0, high=WAIT_MAX_MS, problems=problems)
    if problems or limit is None or wait_ms is None:
        raise errors.ValidationFailed(problems)
    db, principal = request.app[DB], principal_of(request)
    namespace, name = _namespace(request), _subscription(request)
    leased = await deliveries.lease_deliveries(db, principal, namespace=namespace, name=name,
                                               limit=limit)
    if not leased and wait_ms > 0:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        target = await consumer.locate(db, principal, namespace=namespace, name=name)
        pause_ms = POLL_MIN_MS
        while not leased and (left := deadline - loop.time()) > 0:
            found = await consumer.poll(db, target)
            if not found.due:
                due = found.due_in_ms
                nap = pause_ms if due is None or due == 0 else min(pause_ms, due)
                await asyncio.sleep(min(nap / 1000, left))
                pause_ms = min(pause_ms * 2, POLL_MAX_MS)
                continue
            leased = await deliveries.lease_deliveries(db, principal, namespace=namespace,
                                                       name=name, limit=limit)
            if not leased:  # another consumer took them first
                await asyncio.sleep(min(pause_ms / 1000, max(left, 0)))
    return json_response({"items": [leased_view(item) for item in leased]})


async def _settle_one(request: web.Request, outcome: str) -> web.Response:
    query_params(request, ())
    delivery_id = _delivery_id(request)
    allowed = frozenset({"token"} | ({"error"} if outcome == "failed" else set()))
    doc = await _object(request, allowed)
    problems: Problems = []
    report = parse_report({**doc, "delivery_id": delivery_id.hex()}, "$", problems,
                          outcome=outcome)
    if problems or report is None:
        raise errors.ValidationFailed(problems)
    db, principal = request.app[DB], principal_of(request)
    if report.acknowledged:
        settled = await deliveries.acknowledge_delivery(
            db, principal, namespace=_namespace(request), name=_subscription(request),
            delivery_id=delivery_id, token=report.token)
    else:
        settled = await deliveries.fail_delivery(
            db, principal, namespace=_namespace(request), name=_subscription(request),
            delivery_id=delivery_id, token=report.token, error=report.error)
    return json_response(settled_view(settled, delivery_id))


async def acknowledge(request: web.Request) -> web.Response:
    return await _settle_one(request, "acknowledged")


async def fail(request: web.Request) -> web.Response:
    return await _settle_one(request, "failed")


async def settle(request: web.Request) -> web.Response:
    """Many acknowledgements and failures in one transaction, answered per item in order."""
    query_params(request, ())
    doc = await _object(request, frozenset({"items"}))
    items = doc.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= SETTLE_MAX:
        raise errors.ValidationFailed([{"path": "$.items",
                                        "message": f"a list of 1 to {SETTLE_MAX} items"}])
    problems: Problems = []
    reports: list[Report] = []
    seen: set[bytes] = set()
    for index, item in enumerate(items):
        report = parse_report(item, f"$.items[{index}]", problems)
        if report is None:
            continue
        if report.delivery_id in seen:
            problems.append({"path": f"$.items[{index}].delivery_id",
                             "message": "listed twice"})
        seen.add(report.delivery_id)
        reports.append(report)
    if problems:
        raise errors.ValidationFailed(problems[:100])
    answers = await consumer.settle_deliveries(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_subscription(request), reports=reports)
    return json_response({"items": [settled_view(answer, report.delivery_id)
                                    for answer, report in zip(answers, reports, strict=True)]})


def add_routes(app: web.Application) -> None:
    """Register the subscription routes (the stream: subscription_stream.add_routes)."""
    delivery = app[CONFIG].delivery
    app[RELAY_SETTINGS] = RelaySettings(policy=delivery.policy(), sealer=delivery.sealer())
    app.router.add_post(COLLECTION, create_subscription)
    app.router.add_get(COLLECTION, list_subscriptions)
    app.router.add_get(ITEM, get_subscription)
    app.router.add_patch(ITEM, update_subscription)
    app.router.add_post(ITEM + "/pause", pause_subscription)
    app.router.add_post(ITEM + "/resume", resume_subscription)
    app.router.add_post(ITEM + "/disable", disable_subscription)
    app.router.add_post(ITEM + "/rotate-secret", rotate_secret)
    app.router.add_get(ITEM + "/deliveries", list_deliveries)
    app.router.add_get(DELIVERY, get_delivery)
    app.router.add_post(DELIVERY + "/budget", add_budget)
    app.router.add_post(ITEM + "/lease", lease)
    app.router.add_post(DELIVERY + "/ack", acknowledge)
    app.router.add_post(DELIVERY + "/fail", fail)
    app.router.add_post(ITEM + "/settle", settle)


# --- OpenAPI ------------------------------------------------------------------------------------


def _range(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


_NAMESPACE_PARAM = path_param("namespace", NAME)
_SUBSCRIPTION_PARAM = path_param("subscription", NAME)
_DELIVERY_PARAM = path_param("delivery_id", ID)
_IDEMPOTENCY_PARAM = IDEMPOTENCY_PARAM
_LIMIT_PARAM = limit_param(PAGE_MAX, PAGE_DEFAULT)
_CURSOR_PARAM = CURSOR_PARAM
_ERRORS = resource_errors(
    "forbidden: the credential may see the subscription but not do this with it"
    " (subscriptions.read, manage or consume on every queue of its scope)")
_NOT_FOUND = _problem("namespace_not_found, or subscription_not_found (also: no subscription "
                      "action on the subscription's queue scope)")
_DELIVERY_NOT_FOUND = _problem("namespace_not_found, subscription_not_found, or "
                               "delivery_not_found (also another tenant's or subscription's "
                               "delivery id)")
_BODY_ERRORS = BODY_ERRORS
_MS = model.BACKOFF_CEILING_MS
_TOKEN = {"type": "string", "minLength": 1, "maxLength": TOKEN_MAX,
          "pattern": "^[\\x20-\\x7e]+$", "description": "The lease token (printable ASCII)"}
_ERROR_TEXT = {**nullable({"type": "string", "maxLength": ERROR_TEXT_MAX}),
               "description": "Why the consumer failed it (kept in the attempt log)"}
_REASON = {"type": "string", "minLength": 1, "maxLength": model.REASON_MAX}
_POLICY: dict[str, Any] = {
    "max_attempts": {**nullable(_range(1, model.MAX_ATTEMPTS_CEILING)),
                     "description": f"The delivery budget (default {model.DEFAULT_MAX_ATTEMPTS})"},
    "backoff_initial_ms": {**nullable(_range(0, _MS)),
                           "description": "Wait after the first failure (default "
                                          f"{model.DEFAULT_BACKOFF_INITIAL_MS}); doubles"},
    "backoff_max_ms": {**nullable(_range(0, _MS)),
                       "description": "The longest wait; at least backoff_initial_ms "
                                      f"(default {model.DEFAULT_BACKOFF_MAX_MS})"},
    "lease_ms": {**nullable(_range(model.LEASE_MIN_MS, model.LEASE_MAX_MS)),
                 "description": f"Lease of a delivery (default {model.DEFAULT_LEASE_MS})"},
}


def _action(summary: str, op_id: str, body: str | None, ok: str, schema: str, *,
            conflicts: str, not_found: dict[str, Any] = _NOT_FOUND, required: bool = True,
            idempotent: bool = True, more: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary, "operationId": op_id,
        "responses": {ok: _json(schema, "The result" + (" (or the replay of the original "
                                                         "answer)" if idempotent else "")),
                      **_ERRORS, "404": not_found, "409": _problem(conflicts),
                      **_BODY_ERRORS, **(more or {})},
    }
    if idempotent:
        operation["parameters"] = [_IDEMPOTENCY_PARAM]
    if body is not None:
        operation["requestBody"] = request_body(body, required=required)
    return operation


_STATE_CONFLICTS = "subscription_disabled (DISABLED is final), or idempotency_conflict"

OPENAPI_PATHS: dict[str, Any] = {
    COLLECTION: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Create a subscription (ACTIVE; a WEBHOOK one's secret is in this answer "
                       "only)",
            "operationId": "createSubscription",
            "parameters": [_IDEMPOTENCY_PARAM],
            "requestBody": request_body("CreateSubscriptionRequest"),
            "responses": {
                "201": _json("SubscriptionCreated",
                             "Created (or the replay of the original answer, without secret)"),
                **_ERRORS,
                "400": _problem("validation_failed, endpoint_refused (the operator's endpoint "
                                "policy), malformed_json, duplicate_json_key, json_too_deep, "
                                "json_too_complex"),
                "403": _problem("forbidden: subscriptions.manage and tasks.read are needed on "
                                "every filtered queue (every queue: a '*' grant)"),
                "404": _problem("namespace_not_found, or queue_not_found (a filtered queue)"),
                "409": _problem("already_exists, or idempotency_conflict"),
                **_BODY_ERRORS,
                "503": _problem("webhooks_unavailable (the operator configured no key to seal "
                                "a WEBHOOK secret with), or the database is unavailable; "
                                "retry"),
            },
        },
        "get": {
            "summary": "List the subscriptions the credential may read, by name",
            "operationId": "listSubscriptions",
            "parameters": [_LIMIT_PARAM, _CURSOR_PARAM],
            "responses": {"200": _json("SubscriptionPage", "A page of subscriptions"),
                          **_ERRORS, "404": _problem("namespace_not_found")},
        },
    },
    ITEM: {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "get": {
            "summary": "A subscription (never its secret)",
            "operationId": "getSubscription",
            "responses": {"200": _json("Subscription", "The subscription"), **_ERRORS,
                          "404": _NOT_FOUND},
        },
        "patch": _action(
            "Change filters, endpoint or delivery policy: compare-and-set on revision",
            "updateSubscription", "UpdateSubscriptionRequest", "200", "Subscription",
            conflicts="stale_revision, subscription_disabled, or idempotency_conflict",
            more={"400": _problem("validation_failed (an endpoint for a PULL subscription, "
                                  "a longest backoff below the first), endpoint_refused, "
                                  "malformed_json")}),
    },
    ITEM + "/pause": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "post": _action("Pause: no scanning, no leasing; backlog and leases kept; idempotent",
                        "pauseSubscription", "SubscriptionStateRequest", "200", "Subscription",
                        conflicts=_STATE_CONFLICTS, required=False),
    },
    ITEM + "/resume": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "post": _action("Resume a paused subscription; idempotent", "resumeSubscription",
                        "SubscriptionStateRequest", "200", "Subscription",
                        conflicts=_STATE_CONFLICTS, required=False),
    },
    ITEM + "/disable": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "post": _action("Disable (final; deliveries and history kept); idempotent",
                        "disableSubscription", "SubscriptionStateRequest", "200",
                        "Subscription", conflicts="idempotency_conflict", required=False),
    },
    ITEM + "/rotate-secret": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "post": _action(
            "A new signing secret (in this answer only); the previous one stays valid for "
            "window_s", "rotateSubscriptionSecret", "RotateSecretRequest", "200",
            "SecretRotated", conflicts=_STATE_CONFLICTS, required=False,
            more={"400": _problem("validation_failed (a PULL subscription has no secret), "
                                  "malformed_json"),
                  "503": _problem("webhooks_unavailable (no sealing key configured), or the "
                                  "database is unavailable; retry")}),
    },
    ITEM + "/deliveries": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "get": {
            "summary": "Delivery history, newest first (subscriptions.read)",
            "operationId": "listDeliveries",
            "parameters": [{"name": "state", "in": "query",
                            "schema": {"enum": list(model.DeliveryState)}},
                           _LIMIT_PARAM, _CURSOR_PARAM],
            "responses": {"200": _json("DeliveryPage", "A page of deliveries"), **_ERRORS,
                          "404": _NOT_FOUND},
        },
    },
    DELIVERY: {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM, _DELIVERY_PARAM],
        "get": {
            "summary": "A delivery with its frozen snapshot and attempt log (never a secret "
                       "or token)",
            "operationId": "getDelivery",
            "responses": {"200": _json("DeliveryDetail", "The delivery"), **_ERRORS,
                          "404": _DELIVERY_NOT_FOUND},
        },
    },
    DELIVERY + "/budget": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM, _DELIVERY_PARAM],
        "post": _action("Give an EXHAUSTED delivery more attempts (PENDING, due now); audited "
                        "with the reason", "addDeliveryBudget", "AddBudgetRequest", "200",
                        "Delivery", not_found=_DELIVERY_NOT_FOUND,
                        conflicts="delivery_not_exhausted, or idempotency_conflict"),
    },
    ITEM + "/lease": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "post": _action(
            "Lease up to max due deliveries of a PULL subscription (subscriptions.consume); "
            "with wait_ms, wait up to that long for one", "leaseDeliveries", "LeaseRequest",
            "200", "LeaseResult", required=False, idempotent=False,
            conflicts="subscription_not_active (PAUSED or DISABLED), or subscription_not_pull"),
    },
    DELIVERY + "/ack": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM, _DELIVERY_PARAM],
        "post": _action(
            "Acknowledge a leased delivery with its lease token (again with the same token: "
            "the same success, repeated)", "acknowledgeDelivery", "AcknowledgeRequest", "200",
            "SettleOutcome", not_found=_DELIVERY_NOT_FOUND, idempotent=False,
            conflicts="delivery_lease_lost (another token, or the lease lapsed)"),
    },
    DELIVERY + "/fail": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM, _DELIVERY_PARAM],
        "post": _action(
            "Report a leased delivery failed: PENDING after the backoff, or EXHAUSTED when "
            "its budget is spent", "failDelivery", "FailRequest", "200", "SettleOutcome",
            not_found=_DELIVERY_NOT_FOUND, idempotent=False,
            conflicts="delivery_lease_lost (another token, or the lease lapsed)"),
    },
    ITEM + "/settle": {
        "parameters": [_NAMESPACE_PARAM, _SUBSCRIPTION_PARAM],
        "post": _action(
            "Acknowledge and fail many leased deliveries in one transaction, answered per item",
            "settleDeliveries", "SettleRequest", "200", "SettleResult", idempotent=False,
            conflicts="subscription_not_pull",
            more={"400": _problem("validation_failed (also: a delivery listed twice), "
                                  "malformed_json, duplicate_json_key, json_too_deep, "
                                  "json_too_complex")}),
    },
}

_FILTERS_REQUEST = {
    "type": "object", "additionalProperties": False,
    "description": "Every list empty or absent: no restriction; all three must match",
    "properties": {
        "queues": {**nullable({"type": "array", "maxItems": model.MAX_FILTER_ITEMS,
                                "uniqueItems": True, "items": NAME}),
                   "description": "Queue names (each must exist)"},
        "states": nullable({"type": "array", "maxItems": model.MAX_FILTER_ITEMS,
                             "uniqueItems": True,
                             "items": {"enum": list(model.RESULT_STATES)}}),
        "handlers": {**nullable({"type": "array", "maxItems": model.MAX_FILTER_ITEMS,
                                  "uniqueItems": True,
                                  "items": {"type": "string", "minLength": 1,
                                            "maxLength": model.HANDLER_MAX}}),
                     "description": "Handler names of 1-128 printable characters"},
    },
}
_SUBSCRIPTION_PROPS: dict[str, Any] = {
    "id": ID, "name": NAME, "kind": {"enum": list(model.Kind)},
    "endpoint_url": {"type": ["string", "null"]},
    "filters": {"type": "object", "required": ["queues", "states", "handlers"],
                "properties": {"queues": {"type": "array", "items": {"type": "string"}},
                               "states": {"type": "array",
                                          "items": {"enum": list(model.RESULT_STATES)}},
                               "handlers": {"type": "array", "items": {"type": "string"}}}},
    "max_attempts": _range(1, model.MAX_ATTEMPTS_CEILING),
    "backoff_initial_ms": _range(0, _MS), "backoff_max_ms": _range(0, _MS),
    "lease_ms": _range(model.LEASE_MIN_MS, model.LEASE_MAX_MS),
    "start_after_sequence": {"type": "integer", "minimum": 0},
    "scan_after_sequence": {"type": "integer", "minimum": 0},
    "backlog": {"type": "integer", "minimum": 0,
                "description": "PENDING + LEASED deliveries"},
    "state": {"enum": list(model.SubscriptionState)},
    "revision": {"type": "integer", "minimum": 1},
    "owner_application_id": ID,
    "previous_secret_valid_until": nullable(TIME),
    "circuit": {"type": "object", "required": ["state", "open_until", "consecutive_failures"],
                "properties": {"state": {"enum": ["CLOSED", "OPEN", "HALF_OPEN"]},
                               "open_until": nullable(TIME),
                               "consecutive_failures": {"type": "integer", "minimum": 0}}},
    "created_at": TIME, "updated_at": TIME, "disabled_at": nullable(TIME),
}
_SECRET = {"type": "string", "pattern": "^whsec_[A-Za-z0-9+/]+={0,2}$",
           "description": "The Standard Webhooks signing secret: shown in this answer only"}
_DELIVERY_PROPS: dict[str, Any] = {
    "id": ID, "subscription_id": ID, "event_id": ID,
    "sequence": {"type": "integer", "minimum": 1}, "task_id": ID,
    "task_revision": {"type": "integer", "minimum": 1},
    "state": {"enum": list(model.DeliveryState)},
    "attempts_used": {"type": "integer", "minimum": 0},
    "max_attempts": {"type": "integer", "minimum": 1},
    "available_at": TIME, "lease_expires_at": nullable(TIME),
    "last_error": nullable({"type": "object",
                             "required": ["status_code", "body", "duration_ms"],
                             "properties": {"status_code": {"type": ["integer", "null"]},
                                            "body": {"type": ["string", "null"]},
                                            "duration_ms": {"type": ["integer", "null"]}}}),
    "created_at": TIME, "updated_at": TIME, "acknowledged_at": nullable(TIME),
    "exhausted_at": nullable(TIME),
}
_DELIVERY_REQUIRED = sorted(_DELIVERY_PROPS)
_PAYLOAD_PROPS: dict[str, Any] = {
    "type": {"const": "task.result"}, "id": ID, "subscription_id": ID, "subscription": NAME,
    "namespace": NAME, "sequence": {"type": "integer", "minimum": 1}, "event_id": ID,
    "task_id": ID, "queue": {"type": "string"}, "task_revision": {"type": "integer"},
    "state": {"enum": list(model.RESULT_STATES)}, "committed_at": TIME,
    "attempt": {"type": "integer", "minimum": 1},
    "snapshot": {"type": "object", "description": "The result snapshot, byte-exact"},
}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "SubscriptionFilters": _FILTERS_REQUEST,
    "CreateSubscriptionRequest": {
        "type": "object", "additionalProperties": False, "required": ["name", "kind"],
        "properties": {
            "name": NAME, "kind": {"enum": list(model.Kind)},
            "endpoint_url": {**nullable({"type": "string", "minLength": 1}),
                             "description": "WEBHOOK only (required there): an absolute https "
                                            "URL allowed by the operator's endpoint policy"},
            "filters": nullable(ref("SubscriptionFilters")),
            **_POLICY,
            "start_after_sequence": {**nullable(_range(0, 2**62)),
                                     "description": "Deliver events after this sequence (at "
                                                    "most the stream's last committed one); "
                                                    "default: from now"},
            "secret": {**nullable({"type": "string", "maxLength": 200,
                                    "pattern": "^whsec_[A-Za-z0-9+/]+={0,2}$"}),
                       "description": "WEBHOOK only: whsec_ + base64 of 24-64 random bytes; "
                                      "default: generated"},
        },
        "allOf": [
            {"if": {"required": ["kind"], "properties": {"kind": {"const": "PULL"}}},
             "then": {"properties": {"endpoint_url": {"type": "null"},
                                     "secret": {"type": "null"}}}},
            {"if": {"required": ["kind"], "properties": {"kind": {"const": "WEBHOOK"}}},
             "then": {"required": ["endpoint_url"],
                      "properties": {"endpoint_url": {"type": "string"}}}},
        ],
    },
    "UpdateSubscriptionRequest": {
        "type": "object", "additionalProperties": False, "required": ["revision"],
        "description": "Fields left out (or null) keep their value",
        "properties": {
            "revision": {**_range(1, 2**62), "description": "The revision the change is based "
                                                            "on"},
            "endpoint_url": {**nullable({"type": "string", "minLength": 1}),
                             "description": "WEBHOOK subscriptions only"},
            "filters": {**nullable(ref("SubscriptionFilters")),
                        "description": "Replaces the filters (null: no restriction)"},
            **_POLICY,
        },
    },
    "SubscriptionStateRequest": {
        "type": "object", "additionalProperties": False,
        "properties": {"reason": {**nullable(_REASON), "description": "Audited"}},
    },
    "RotateSecretRequest": {
        "type": "object", "additionalProperties": False,
        "properties": {"window_s": {**_range(0, model.ROTATION_WINDOW_MAX_S),
                                    "default": model.ROTATION_WINDOW_DEFAULT_S,
                                    "description": "How long the previous secret stays valid"}},
    },
    "Subscription": {"type": "object", "required": sorted(_SUBSCRIPTION_PROPS),
                     "properties": _SUBSCRIPTION_PROPS},
    "SubscriptionCreated": {
        "type": "object", "required": sorted(_SUBSCRIPTION_PROPS),
        "properties": {**_SUBSCRIPTION_PROPS, "secret": _SECRET},
        "description": "The subscription; secret only for a new WEBHOOK subscription, never in "
                       "a replay",
    },
    "SecretRotated": {
        "type": "object",
        "required": ["subscription", "rotation_id", "previous_secret_valid_until"],
        "properties": {"subscription": ref("Subscription"), "rotation_id": ID,
                       "previous_secret_valid_until": nullable(TIME),
                       "secret": {**_SECRET, "description": "The new secret: in this answer "
                                                            "only, never in a replay"}},
    },
    "SubscriptionPage": {
        "type": "object", "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": ref("Subscription")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "Delivery": {"type": "object", "required": _DELIVERY_REQUIRED,
                 "properties": _DELIVERY_PROPS},
    "DeliveryAttempt": {
        "type": "object",
        "required": ["attempt", "outcome", "status_code", "error", "duration_ms", "ended_at"],
        "properties": {"attempt": {"type": "integer", "minimum": 1},
                       "outcome": {"enum": ["ACKNOWLEDGED", "FAILED", "LAPSED"]},
                       "status_code": {"type": ["integer", "null"]},
                       "error": {"type": ["string", "null"]},
                       "duration_ms": {"type": ["integer", "null"]}, "ended_at": TIME},
    },
    "DeliveryDetail": {
        "type": "object",
        "required": [*_DELIVERY_REQUIRED, "subscription", "queue", "result_state",
                     "committed_at", "snapshot", "attempts"],
        "properties": {**_DELIVERY_PROPS, "subscription": NAME,
                       "queue": {"type": ["string", "null"]},
                       "result_state": nullable({"enum": list(model.RESULT_STATES)}),
                       "committed_at": nullable(TIME),
                       "snapshot": {"type": ["object", "null"],
                                    "description": "The frozen result snapshot"},
                       "attempts": {"type": "array", "items": ref("DeliveryAttempt")}},
    },
    "DeliveryPage": {
        "type": "object", "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": ref("Delivery")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "AddBudgetRequest": {
        "type": "object", "additionalProperties": False, "required": ["attempts", "reason"],
        "properties": {"attempts": _range(1, model.BUDGET_ADD_MAX), "reason": _REASON},
    },
    "LeaseRequest": {
        "type": "object", "additionalProperties": False,
        "properties": {"max": {**_range(1, LEASE_MAX), "default": LEASE_DEFAULT},
                       "wait_ms": {**_range(0, WAIT_MAX_MS), "default": 0,
                                   "description": "Wait up to this long for a due delivery"}},
    },
    "DeliveryPayload": {"type": "object", "required": sorted(_PAYLOAD_PROPS),
                        "properties": _PAYLOAD_PROPS},
    "LeasedDelivery": {
        "type": "object", "required": ["delivery", "lease_token", "lease_expires_at"],
        "properties": {"delivery": ref("DeliveryPayload"),
                       "lease_token": {"type": "string", "minLength": 1},
                       "lease_expires_at": TIME},
    },
    "LeaseResult": {
        "type": "object", "required": ["items"],
        "properties": {"items": {"type": "array", "items": ref("LeasedDelivery")}},
    },
    "AcknowledgeRequest": {
        "type": "object", "additionalProperties": False, "required": ["token"],
        "properties": {"token": _TOKEN},
    },
    "FailRequest": {
        "type": "object", "additionalProperties": False, "required": ["token"],
        "properties": {"token": _TOKEN, "error": _ERROR_TEXT},
    },
    "SettleItem": {
        "type": "object", "additionalProperties": False,
        "required": ["delivery_id", "token", "outcome"],
        "properties": {"delivery_id": ID, "token": _TOKEN, "outcome": {"enum": list(OUTCOMES)},
                       "error": {**_ERROR_TEXT, "description": "Only for failed"}},
        "if": {"properties": {"outcome": {"const": "acknowledged"}}},
        "then": {"properties": {"error": {"type": "null"}}},
    },
    "SettleRequest": {
        "type": "object", "additionalProperties": False, "required": ["items"],
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": SETTLE_MAX,
                                 "items": ref("SettleItem"),
                                 "description": "Each delivery at most once"}},
    },
    "SettleOutcome": {
        "type": "object", "required": ["delivery_id", "settled"],
        "properties": {
            "delivery_id": ID, "settled": {"type": "boolean"},
            "state": {"enum": list(model.DeliveryState),
                      "description": "settled: ACKNOWLEDGED, PENDING (retry after the "
                                     "backoff) or EXHAUSTED"},
            "attempts_used": {"type": "integer", "minimum": 0},
            "repeated": {"type": "boolean",
                         "description": "An acknowledgement already recorded with this token"},
            "code": {"enum": ["delivery_not_found", "delivery_lease_lost"],
                     "description": "Not settled: why"},
            "detail": {"type": "string"},
        },
    },
    "SettleResult": {
        "type": "object", "required": ["items"],
        "properties": {"items": {"type": "array", "items": ref("SettleOutcome")}},
    },
}

"""``/v1/namespaces/{namespace}/queues``: queue management (issue 3, docs/api/queues.md)."""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from orbit_api.openapi import (
    BODY_ERRORS,
    ID,
    IDEMPOTENCY_PARAM,
    NAME,
    TIME,
    _json,
    _problem,
    path_param,
    ref,
    request_body,
    resource_errors,
)
from orbit_api.routes.platform import idempotency_key
from orbit_api.routes.tasks import json_response
from orbit_common import errors
from orbit_common.model import cursors
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import queues
from orbit_common.pulse.model import GateState, RetryPolicy
from orbit_common.service.http.body import int_param, query_params, read_json
from orbit_common.service.http.context import DB, request_id_of

DEFAULT_RETRY = queues.DEFAULT_RETRY


# --- request bodies (strict: unknown fields and wrong JSON types are refused) ------------------


@attrs.frozen(kw_only=True)
class RetryFields:
    max_attempts: int = DEFAULT_RETRY.max_attempts
    initial_ms: int = DEFAULT_RETRY.initial_ms
    max_ms: int = DEFAULT_RETRY.max_ms
    # A JSON number (or, for compatibility, a decimal string): queues.parse_decimal.
    multiplier: Any = DEFAULT_RETRY.multiplier
    jitter: Any = DEFAULT_RETRY.jitter


@attrs.frozen(kw_only=True)
class CreateQueueRequest:
    name: str
    description: str = ""
    offer_lease_ms: int = queues.DEFAULT_OFFER_LEASE_MS
    execution_lease_ms: int = queues.DEFAULT_EXECUTION_LEASE_MS
    retry: RetryFields = attrs.field(factory=RetryFields)
    max_concurrent_attempts: int | None = None
    max_unfinished_tasks: int | None = None
    max_starts_per_second: int | None = None


@attrs.frozen(kw_only=True)
class RetryPatchFields:
    max_attempts: int | None = None
    initial_ms: int | None = None
    max_ms: int | None = None
    multiplier: Any = None
    jitter: Any = None


@attrs.frozen(kw_only=True)
class UpdateQueueRequest:
    revision: int
    description: str | None = None
    offer_lease_ms: int | None = None
    execution_lease_ms: int | None = None
    retry: RetryPatchFields | None = None
    max_concurrent_attempts: int | None = None
    max_unfinished_tasks: int | None = None
    max_starts_per_second: int | None = None


@attrs.frozen(kw_only=True)
class GateRequest:
    reason: str | None = None


# Fields whose JSON null would mean nothing in a PATCH (omit a field to keep its value).
_NOT_NULLABLE = ("description", "offer_lease_ms", "execution_lease_ms", "retry")
_RETRY_FIELDS = ("max_attempts", "initial_ms", "max_ms", "multiplier", "jitter")


def _settings(dto: CreateQueueRequest) -> queues.QueueSettings:
    problems = queues.check_queue_name(dto.name)
    multiplier = queues.parse_decimal(dto.retry.multiplier, "$.retry.multiplier", problems)
    jitter = queues.parse_decimal(dto.retry.jitter, "$.retry.jitter", problems)
    settings = queues.QueueSettings(
        description=dto.description,
        offer_lease_ms=dto.offer_lease_ms,
        execution_lease_ms=dto.execution_lease_ms,
        retry=RetryPolicy(
            max_attempts=dto.retry.max_attempts, initial_ms=dto.retry.initial_ms,
            max_ms=dto.retry.max_ms,
            # A decimal that did not parse is already reported; the default stands in for it
            # so that every other field is still judged.
            multiplier=DEFAULT_RETRY.multiplier if multiplier is None else multiplier,
            jitter=DEFAULT_RETRY.jitter if jitter is None else jitter,
        ),
        max_concurrent_attempts=dto.max_concurrent_attempts,
        max_unfinished_tasks=dto.max_unfinished_tasks,
        max_starts_per_second=dto.max_starts_per_second,
    )
    problems += settings.problems()
    if problems:
        raise errors.ValidationFailed(problems)
    return settings


def _patch(dto: UpdateQueueRequest, raw: dict[str, Any]) -> queues.QueuePatch:
    problems: queues.Problems = []
    nulls = [f"$.{key}" for key in _NOT_NULLABLE if key in raw and raw[key] is None]
    if isinstance(raw.get("retry"), dict):
        nulls += [f"$.retry.{key}" for key in _RETRY_FIELDS
                  if key in raw["retry"] and raw["retry"][key] is None]
    problems += [{"path": path, "message": "may not be null (omit it to keep the current value)"}
                 for path in nulls]
    retry = dto.retry or RetryPatchFields()
    multiplier = jitter = None
    if retry.multiplier is not None:
        multiplier = queues.parse_decimal(retry.multiplier, "$.retry.multiplier", problems)
    if retry.jitter is not None:
        jitter = queues.parse_decimal(retry.jitter, "$.retry.jitter", problems)
    patch = queues.QueuePatch(
        description=dto.description,
        offer_lease_ms=dto.offer_lease_ms,
        execution_lease_ms=dto.execution_lease_ms,
        max_attempts=retry.max_attempts,
        initial_ms=retry.initial_ms,
        max_ms=retry.max_ms,
        multiplier=multiplier,
        jitter=jitter,
        # A limit sent as null means "unlimited"; one left out stays as it is.
        max_concurrent_attempts=(
            dto.max_concurrent_attempts if "max_concurrent_attempts" in raw else queues.UNSET
        ),
        max_unfinished_tasks=(
            dto.max_unfinished_tasks if "max_unfinished_tasks" in raw else queues.UNSET
        ),
        max_starts_per_second=(
            dto.max_starts_per_second if "max_starts_per_second" in raw else queues.UNSET
        ),
    )
    problems += patch.problems()
    if dto.revision < 1:
        problems.insert(0, {"path": "$.revision", "message": "an integer of at least 1"})
    if problems:
        raise errors.ValidationFailed(problems)
    return patch


# --- handlers ----------------------------------------------------------------------------------


async def create_queue(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    dto, _raw = await read_json(request, CreateQueueRequest)
    outcome = await queues.create_queue(
        request.app[DB], principal_of(request),
        namespace=request.match_info["namespace"], name=dto.name, settings=_settings(dto),
        idempotency_key=key, request_id=request_id_of(request),
    )
    return json_response(outcome.body, status=outcome.status)


async def list_queues(request: web.Request) -> web.Response:
    namespace = request.match_info["namespace"]
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=100, low=1, high=queues.PAGE_MAX)
    filters = {"namespace": namespace}
    after = ""
    if "cursor" in params:
        position = cursors.decode(params["cursor"], "queues", filters)
        if len(position) != 1 or not isinstance(position[0], str):
            raise errors.InvalidCursor()
        after = position[0]
    page = await queues.list_queues(
        request.app[DB], principal_of(request), namespace=namespace, after_name=after,
        limit=limit,
    )
    next_cursor = (
        None if page.next_after is None else cursors.encode("queues", filters, [page.next_after])
    )
    return json_response({"items": page.items, "next_cursor": next_cursor})


async def get_queue(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await queues.get_queue(
        request.app[DB], principal_of(request),
        namespace=request.match_info["namespace"], name=request.match_info["queue"],
    )
    return json_response(view)


async def update_queue(request: web.Request) -> web.Response:
    query_params(request, ())
    dto, raw = await read_json(request, UpdateQueueRequest)
    view = await queues.update_queue(
        request.app[DB], principal_of(request),
        namespace=request.match_info["namespace"], name=request.match_info["queue"],
        revision=dto.revision, patch=_patch(dto, raw), request_id=request_id_of(request),
    )
    return json_response(view)


async def _gate(request: web.Request, to: GateState) -> web.Response:
    query_params(request, ())
    reason = None
    if request.body_exists:  # without a body, the domain reports the missing reason
        dto, _raw = await read_json(request, GateRequest)
        reason = dto.reason
    view = await queues.set_paused(
        request.app[DB], principal_of(request),
        namespace=request.match_info["namespace"], name=request.match_info["queue"],
        paused=to is GateState.PAUSED, reason=reason, request_id=request_id_of(request),
    )
    return json_response(view)


async def pause_queue(request: web.Request) -> web.Response:
    return await _gate(request, GateState.PAUSED)


async def resume_queue(request: web.Request) -> web.Response:
    return await _gate(request, GateState.OPEN)


COLLECTION = "/v1/namespaces/{namespace}/queues"
ITEM = COLLECTION + "/{queue}"


def add_routes(app: web.Application) -> None:
    """Register the queue routes."""
    app.router.add_post(COLLECTION, create_queue)
    app.router.add_get(COLLECTION, list_queues)
    app.router.add_get(ITEM, get_queue)
    app.router.add_patch(ITEM, update_queue)
    app.router.add_post(ITEM + "/pause", pause_queue)
    app.router.add_post(ITEM + "/resume", resume_queue)


# --- OpenAPI -----------------------------------------------------------------------------------


_NAMESPACE_PARAM = path_param("namespace", NAME)
_QUEUE_PARAM = path_param("queue", NAME)
_IDEMPOTENCY_PARAM = IDEMPOTENCY_PARAM
_ERRORS = resource_errors(None)
_NOT_FOUND = _problem(
    "namespace_not_found, or queue_not_found: no such queue, or one the credential may not see"
)
_FORBIDDEN = _problem("forbidden: the credential sees the queue but may not do this")
_BODY_ERRORS = BODY_ERRORS

_INT = {"type": "integer"}
# Decimals are JSON numbers (docs/api/README.md, "数值"); a request may still send the decimal
# string of earlier versions.
_DECIMAL = {"type": "number"}
# At most 3 decimal places: the server reads a number as an exact decimal (never a binary float),
# so multipleOf 0.001 is the rule itself.
_MILLI = {"multipleOf": 0.001}
# The decimal strings of earlier versions, exactly the ones in range: 1-999.999 and 0-1.
_MULTIPLIER_TEXT = r"^(?=0{0,2}[1-9])[0-9]{1,3}(\.[0-9]{1,3})?$"
_JITTER_TEXT = r"^(0{1,3}(\.[0-9]{1,3})?|0{0,2}1(\.0{1,3})?)$"


def _decimal_in(low: int, high: float, text: str) -> dict[str, Any]:
    return {"anyOf": [{"type": "number", "minimum": low, "maximum": high, **_MILLI},
                      {"type": "string", "pattern": text, "deprecated": True}]}


_FLOW_LIMIT = {"type": ["integer", "null"], "minimum": 1, "maximum": queues.INT_MAX}
_LIMITS = {
    "offer_lease_ms": {**_INT, "minimum": 100, "maximum": 3_600_000},
    "execution_lease_ms": {**_INT, "minimum": 100, "maximum": 86_400_000},
    "max_concurrent_attempts": {
        **_FLOW_LIMIT,
        "description": "Attempts OFFERED or RUNNING at once, checked at claim; null: unlimited"},
    "max_unfinished_tasks": {
        **_FLOW_LIMIT,
        "description": "Tasks WAITING, LEASED, RUNNING or NEEDS_REVIEW, checked at submit "
                       "(429 queue_full); null: unlimited"},
    "max_starts_per_second": {
        **_FLOW_LIMIT,
        "description": "Start approvals per one-second window, checked at start "
                       "(start_rate_limited); null: unlimited"},
}
_RETRY_LIMITS = {
    "max_attempts": {**_INT, "minimum": 1, "maximum": 1000},
    "initial_ms": {**_INT, "minimum": 0, "maximum": queues.INT_MAX},
    "max_ms": {**_INT, "minimum": 0, "maximum": queues.INT_MAX,
               "description": "At least initial_ms"},
    "multiplier": {**_DECIMAL, "minimum": 1, "maximum": 999.999,
                   "description": "At most 3 decimal places; written in its shortest form"},
    "jitter": {**_DECIMAL, "minimum": 0, "maximum": 1,
               "description": "At most 3 decimal places; written in its shortest form"},
}
_RETRY_INPUT = {**_RETRY_LIMITS,
                "multiplier": {**_decimal_in(1, 999.999, _MULTIPLIER_TEXT),
                               "description": "From 1 to 999.999, at most 3 decimal places (a "
                                              "decimal string is still accepted)"},
                "jitter": {**_decimal_in(0, 1, _JITTER_TEXT),
                           "description": "From 0 to 1, at most 3 decimal places (a decimal "
                                          "string is still accepted)"}}


def _with_defaults(schemas: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: {**v, "default": defaults[k]} if k in defaults else v for k, v in schemas.items()}


OPENAPI_PATHS: dict[str, Any] = {
    COLLECTION: {
        "parameters": [_NAMESPACE_PARAM],
        "get": {
            "summary": "List the queues of a namespace that the credential may read, by name",
            "operationId": "listQueues",
            "parameters": [
                {"name": "limit", "in": "query",
                 "schema": {"type": "integer", "minimum": 1, "maximum": queues.PAGE_MAX,
                            "default": 100}},
                {"name": "cursor", "in": "query", "schema": {"type": "string"}},
            ],
            "responses": {
                "200": _json("QueuePage", "A page of queues; may be short with a next cursor"),
                **_ERRORS,
                "403": _problem("forbidden: no queue read grant in this namespace"),
                "404": _problem("namespace_not_found"),
            },
        },
        "post": {
            "summary": "Create a queue with its execution gate (open)",
            "operationId": "createQueue",
            "parameters": [_IDEMPOTENCY_PARAM],
            "requestBody": request_body("CreateQueueRequest"),
            "responses": {
                "201": _json("Queue", "Created (or the replay of the original response)"),
                **_ERRORS,
                "403": _problem("forbidden: the credential may not manage this queue name"),
                "404": _problem("namespace_not_found"),
                "409": _problem("already_exists, or idempotency_conflict"),
                **_BODY_ERRORS,
            },
        },
    },
    ITEM: {
        "parameters": [_NAMESPACE_PARAM, _QUEUE_PARAM],
        "get": {
            "summary": "A queue with its gate, runtime counters and usage (backlog, lag)",
            "operationId": "getQueue",
            "responses": {"200": _json("Queue", "The queue"), **_ERRORS,
                          "403": _FORBIDDEN, "404": _NOT_FOUND},
        },
        "patch": {
            "summary": "Change a queue's configuration: compare-and-set on revision",
            "operationId": "updateQueue",
            "requestBody": request_body("UpdateQueueRequest"),
            "responses": {
                "200": _json("Queue", "The queue after the change (unchanged if nothing "
                             "differs)"),
                **_ERRORS, "403": _FORBIDDEN, "404": _NOT_FOUND,
                "409": _problem("stale_revision: the queue is no longer at this revision"),
                **_BODY_ERRORS,
            },
        },
    },
    ITEM + "/pause": {
        "parameters": [_NAMESPACE_PARAM, _QUEUE_PARAM],
        "post": {
            "summary": "Pause: no new lease is granted and no new start approved; idempotent",
            "operationId": "pauseQueue",
            "requestBody": request_body("QueueGateRequest"),
            "responses": {"200": _json("Queue", "The paused queue"), **_ERRORS,
                          "403": _FORBIDDEN, "404": _NOT_FOUND, **_BODY_ERRORS},
        },
    },
    ITEM + "/resume": {
        "parameters": [_NAMESPACE_PARAM, _QUEUE_PARAM],
        "post": {
            "summary": "Resume a paused queue; idempotent",
            "operationId": "resumeQueue",
            "requestBody": request_body("QueueGateRequest"),
            "responses": {"200": _json("Queue", "The open queue"), **_ERRORS,
                          "403": _FORBIDDEN, "404": _NOT_FOUND, **_BODY_ERRORS},
        },
    },
}

_RETRY_DEFAULTS = DEFAULT_RETRY.view()

OPENAPI_SCHEMAS: dict[str, Any] = {
    "QueueRetry": {
        "type": "object", "additionalProperties": False,
        "required": list(_RETRY_LIMITS),
        "properties": _RETRY_LIMITS,
    },
    "Queue": {
        "type": "object",
        "required": ["id", "name", "description", "revision", "offer_lease_ms",
                     "execution_lease_ms", "retry", "max_concurrent_attempts",
                     "max_unfinished_tasks", "max_starts_per_second", "active_attempts",
                     "paused", "gate", "created_at", "updated_at"],
        "properties": {
            "id": ID, "name": NAME, "description": {"type": "string"},
            "revision": {"type": "integer", "minimum": 1},
            **_LIMITS,
            "retry": ref("QueueRetry"),
            "active_attempts": {"type": "integer", "minimum": 0,
                                "description": "Attempts LEASED or RUNNING now (runtime)"},
            "paused": {"type": "boolean"},
            "gate": {
                "type": "object", "required": ["state", "control_revision", "reason"],
                "properties": {"state": {"enum": ["OPEN", "PAUSED"]},
                               "control_revision": {"type": "integer", "minimum": 1},
                               "reason": {"type": ["string", "null"]}},
            },
            "created_at": TIME, "updated_at": TIME,
            "usage": {**ref("QueueUsage"),
                      "description": "Only in the answer to GET of one queue"},
        },
    },
    "QueueUsage": {
        "type": "object",
        "required": ["measured_at", "unfinished_tasks", "active_attempts", "starts_in_window",
                     "start_window_until", "waiting_tasks", "oldest_waiting_age_ms"],
        "properties": {
            "measured_at": {**TIME, "description": "Database time of the reading"},
            "unfinished_tasks": {"type": "integer", "minimum": 0,
                                 "description": "Tasks WAITING, LEASED, RUNNING, NEEDS_REVIEW"},
            "active_attempts": {"type": "integer", "minimum": 0},
            "starts_in_window": {"type": "integer", "minimum": 0,
                                 "description": "Starts approved in the current one-second "
                                                "window; 0 once it has passed"},
            "start_window_until": {"type": ["string", "null"], "format": "date-time"},
            "waiting_tasks": {"type": "integer", "minimum": 0,
                              "description": "Due WAITING tasks (available now)"},
            "oldest_waiting_age_ms": {"type": "integer", "minimum": 0,
                                      "description": "Database time minus the oldest due "
                                                     "WAITING task's available_at; 0 if none"},
        },
    },
    "QueuePage": {
        "type": "object", "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": ref("Queue")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "CreateQueueRequest": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {
            "name": NAME,
            "description": {"type": "string", "maxLength": queues.DESCRIPTION_MAX,
                            "default": ""},
            **_with_defaults(_LIMITS, {
                "offer_lease_ms": queues.DEFAULT_OFFER_LEASE_MS,
                "execution_lease_ms": queues.DEFAULT_EXECUTION_LEASE_MS,
                "max_concurrent_attempts": None,
                "max_unfinished_tasks": None,
                "max_starts_per_second": None,
            }),
            "retry": {"type": "object", "additionalProperties": False,
                      "properties": _with_defaults(_RETRY_INPUT, _RETRY_DEFAULTS)},
        },
    },
    "UpdateQueueRequest": {
        "type": "object", "additionalProperties": False, "required": ["revision"],
        "properties": {
            "revision": {"type": "integer", "minimum": 1,
                         "description": "The revision the change is based on"},
            "description": {"type": "string", "maxLength": queues.DESCRIPTION_MAX},
            **_LIMITS,
            "retry": {"type": "object", "additionalProperties": False,
                      "properties": _RETRY_INPUT},
        },
    },
    "QueueGateRequest": {
        "type": "object", "additionalProperties": False, "required": ["reason"],
        "description": "An operator's intervention: the reason is required and audited",
        "properties": {"reason": {"type": "string", "minLength": 1,
                                  "maxLength": queues.REASON_MAX}},
    },
}

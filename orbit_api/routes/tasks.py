"""``/v1/namespaces/{namespace}/tasks``: submission and queries (docs/api/tasks.md)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orbit_api.openapi import (
    COMMON_ERRORS,
    ID,
    IDEMPOTENCY_KEY,
    NAME,
    TIME,
    TOO_MANY_REQUESTS,
    _json,
    _problem,
    nullable,
    ref,
)
from orbit_api.routes.platform import idempotency_key
from orbit_common import errors
from orbit_common.model import jsondoc, strict
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import queries, queues, resources, tasks
from orbit_common.pulse.model import AttemptState, TaskState
from orbit_common.service.http.body import int_param, off_loop, query_params, read_document
from orbit_common.service.http.context import DB

BASE = "/v1/namespaces/{namespace}/tasks"


def json_response(body: Any, status: int = 200) -> web.Response:
    """JSON written by jsondoc: task inputs and results keep every number's spelling."""
    return web.Response(text=jsondoc.dumps(body), status=status, content_type="application/json")


def _input_of(exact: Any) -> Any:
    """``input`` from the number-preserving parse of an item (``{}`` when absent)."""
    return exact.get("input", {}) if isinstance(exact, dict) else {}


def _request_form(item: Any) -> Any:
    """An item of the number-preserving parse as its DTO is structured from: numbers as the
    normal parse makes them, except in ``input`` (kept as written, and not walked: it may hold
    500,000 numbers; :func:`tasks.validate` takes it from the exact parse)."""
    if type(item) is not dict:
        return jsondoc.plain_numbers(item)
    return {key: value if key == "input" else jsondoc.plain_numbers(value)
            for key, value in item.items()}


async def submit_task(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    principal = principal_of(request)
    namespace = request.match_info["namespace"]
    await tasks.authorize_submission(request.app[DB], principal, namespace)
    # One parse, keeping every number's text (the stored input is byte-exact); the DTO is
    # structured from it with plain numbers. A large body is parsed on a worker thread.
    exact = await read_document(request, keep_number_text=True, check_numbers=True)
    size = len(await request.read())  # the body as read (cached; inflated when encoded)

    def prepare() -> list[tasks.Item]:
        dto = strict.structure(_request_form(exact), tasks.SubmitRequest)
        spec, problems = tasks.validate(dto, _input_of(exact), "$")
        if spec is None:
            raise errors.ValidationFailed(problems)
        return tasks.make_items(principal, [(spec, key, "$", "Idempotency-Key")])

    items = await off_loop(size, prepare)
    (accepted,) = await tasks.submit(request.app[DB], principal, namespace=namespace, items=items)
    return json_response(accepted.receipt, status=201)


async def submit_batch(request: web.Request) -> web.Response:
    query_params(request, ())
    if idempotency_key(request) is not None:
        raise errors.ValidationFailed([{
            "path": "Idempotency-Key",
            "message": "a batch takes one idempotency_key per item ($.tasks[i].idempotency_key)",
        }])
    principal = principal_of(request)
    namespace = request.match_info["namespace"]
    # The path first (authorization), then the size of the batch while its array is read,
    # and only then the items themselves.
    await tasks.authorize_submission(request.app[DB], principal, namespace)
    exact = await read_document(request, precheck=tasks.check_batch_size,
                                keep_number_text=True, check_numbers=True)
    size = len(await request.read())  # the body as read (cached; inflated when encoded)

    def prepare() -> list[tasks.Item]:
        items = exact.get("tasks") if type(exact) is dict else None
        form = ({**exact, "tasks": [_request_form(item) for item in items]}
                if type(items) is list else jsondoc.plain_numbers(exact))
        dto = strict.structure(form, tasks.BatchRequest)
        if not 1 <= len(dto.tasks) <= tasks.MAX_BATCH:
            raise errors.ValidationFailed(
                [{"path": "$.tasks", "message": f"1-{tasks.MAX_BATCH} items"}]
            )
        problems: list[dict[str, str]] = []
        specs = []
        for index, item in enumerate(dto.tasks):
            path = f"$.tasks[{index}]"
            spec, found = tasks.validate(item, _input_of(exact["tasks"][index]), path)
            problems += found
            if spec is not None:
                specs.append((spec, item.idempotency_key, path, f"{path}.idempotency_key"))
        if problems:
            raise errors.ValidationFailed(problems)
        return tasks.make_items(principal, specs)

    items = await off_loop(size, prepare)
    accepted = await tasks.submit(request.app[DB], principal, namespace=namespace, items=items)
    return json_response(
        {"tasks": [{**a.receipt, "replayed": a.replayed} for a in accepted]}, status=201
    )


def _page(page: queries.Page) -> web.Response:
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


def _limit(params: dict[str, str]) -> int:
    return int_param(params, "limit", default=queries.PAGE_DEFAULT, low=1, high=queries.PAGE_MAX)


async def list_tasks(request: web.Request) -> web.Response:
    params = query_params(request, {"queue", "state", "business_key", "created_after",
                                    "created_before", "limit", "cursor"})
    limit = _limit(params)
    filters = queries.ListFilter.parse(params)
    page = await queries.list_tasks(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        filters=filters, limit=limit, cursor=params.get("cursor"),
    )
    return _page(page)


def _task_id(request: web.Request) -> bytes:
    return queries.parse_id(request.match_info["task_id"], "{task_id}")


async def get_task(request: web.Request) -> web.Response:
    query_params(request, ())
    task_id = _task_id(request)
    view = await queries.get_task(request.app[DB], principal_of(request),
                                  namespace=request.match_info["namespace"], task_id=task_id)
    return json_response(view)


async def get_task_source(request: web.Request) -> web.Response:
    query_params(request, ())
    task_id = _task_id(request)
    view = await queries.task_source(request.app[DB], principal_of(request),
                                     namespace=request.match_info["namespace"], task_id=task_id)
    return json_response(view)


async def list_attempts(request: web.Request) -> web.Response:
    params = query_params(request, {"limit", "cursor"})
    limit = _limit(params)
    task_id = _task_id(request)
    page = await queries.list_attempts(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        task_id=task_id, limit=limit, cursor=params.get("cursor"),
    )
    return _page(page)


async def list_events(request: web.Request) -> web.Response:
    params = query_params(request, {"limit", "cursor"})
    limit = _limit(params)
    task_id = _task_id(request)
    page = await queries.list_events(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        task_id=task_id, limit=limit, cursor=params.get("cursor"),
    )
    return _page(page)


async def list_evidence(request: web.Request) -> web.Response:
    params = query_params(request, {"limit", "cursor"})
    limit = _limit(params)
    task_id = _task_id(request)
    attempt_id = queries.parse_id(request.match_info["attempt_id"], "{attempt_id}")
    page = await queries.list_evidence(
        request.app[DB], principal_of(request), namespace=request.match_info["namespace"],
        task_id=task_id, attempt_id=attempt_id, limit=limit, cursor=params.get("cursor"),
    )
    return _page(page)


def add_routes(app: web.Application) -> None:
    """Register the task routes."""
    app.router.add_post(BASE, submit_task)
    app.router.add_get(BASE, list_tasks)
    app.router.add_post(BASE + "/batch", submit_batch)
    # Not "batch": GET …/tasks/batch is no route (a 405 naming POST), not a malformed task id.
    app.router.add_get(BASE + "/{task_id:(?!batch$)[^/]+}", get_task)
    app.router.add_get(BASE + "/{task_id}/source", get_task_source)
    app.router.add_get(BASE + "/{task_id}/attempts", list_attempts)
    app.router.add_get(BASE + "/{task_id}/events", list_events)
    app.router.add_get(BASE + "/{task_id}/attempts/{attempt_id}/evidence", list_evidence)


# --- OpenAPI ------------------------------------------------------------------------------------


def _int(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def _page_schema(item: str) -> dict[str, Any]:
    return {"type": "object", "required": ["items", "next_cursor"],
            "properties": {"items": {"type": "array", "items": ref(item)},
                           "next_cursor": {"type": ["string", "null"]}}}


_NAMESPACE = {"name": "namespace", "in": "path", "required": True, "schema": NAME}
_TASK_ID = {"name": "task_id", "in": "path", "required": True, "schema": ID}
_ATTEMPT_ID = {"name": "attempt_id", "in": "path", "required": True, "schema": ID}
_LIMIT = {"name": "limit", "in": "query",
          "schema": {"type": "integer", "minimum": 1, "maximum": queries.PAGE_MAX,
                     "default": queries.PAGE_DEFAULT}}
_CURSOR = {"name": "cursor", "in": "query", "schema": {"type": "string"}}
_READ_ERRORS = {**COMMON_ERRORS,
                "403": _problem("The credential may not read tasks here (forbidden)"),
                "404": _problem("namespace_not_found, task_not_found")}
_SUBMIT_ERRORS = {
    **COMMON_ERRORS,
    "403": _problem("The credential may not submit tasks in this namespace (forbidden)"),
    "404": _problem("namespace_not_found, queue_not_found"),
    "409": _problem("idempotency_conflict"),
    "413": _problem("payload_too_large"),
    "415": _problem("unsupported_media_type, unsupported_content_encoding"),
    "429": TOO_MANY_REQUESTS,
}
_STATES = [s.value for s in TaskState]
_RECEIPT_PROPS: dict[str, Any] = {
    "id": ID, "queue": NAME, "handler": {"type": "string"}, "state": {"enum": _STATES},
    "priority": _int(0, 9), "business_key": {"type": ["string", "null"]},
    "concurrency_key": {"type": ["string", "null"]},
    "created_at": TIME, "available_at": TIME, "deadline_at": nullable(TIME),
    "start_deadline_at": nullable(TIME), "rerun_safe": {"type": "boolean"},
    "revision": {"type": "integer", "minimum": 1},
}
_SUMMARY_PROPS: dict[str, Any] = {
    **_RECEIPT_PROPS, "attempts_used": {"type": "integer", "minimum": 0},
    "starts_used": {"type": "integer", "minimum": 0},
    "offer_lapses": {"type": "integer", "minimum": 0},
    "effect_uncertain": {"type": "boolean"}, "outcome_reason": {"type": ["string", "null"]},
    "cancel_requested_at": nullable(TIME), "updated_at": TIME, "completed_at": nullable(TIME),
}
_SUBMIT_PROPS: dict[str, Any] = {
    "queue": NAME,
    "handler": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
    "input": {"description": "Any JSON value, stored and returned byte-exact (default {})"},
    "delay_ms": _int(0, tasks.MAX_DELAY_MS),
    "not_before": {"type": "string", "format": "date-time",
                   "description": "RFC 3339 with an offset; exclusive with delay_ms"},
    "priority": {**_int(0, 9), "default": 0},
    "business_key": {"type": "string", "minLength": 1,
                     "maxLength": tasks.BUSINESS_KEY_MAX_BYTES,
                     "description": "At most 512 UTF-8 bytes, matched byte-exact"},
    "concurrency_key": {"type": "string", "minLength": 1, "maxLength": resources.KEY_MAX_BYTES,
                        "description": "1-255 UTF-8 bytes, matched byte-exact: at most one "
                                       "valid permit per key in the namespace; each grant "
                                       "carries a fencing token (docs/howto/fencing-tokens.md)"},
    "deadline_ms": _int(1, tasks.MAX_DEADLINE_MS),
    "start_deadline_ms": _int(1, tasks.MAX_DEADLINE_MS),
    "attempt_timeout_ms": _int(100, tasks.DAY_MS),
    "retry": ref("TaskRetryOverrides"),
    "rerun_safe": {"type": "boolean", "default": False},
    "offer_lease_ms": _int(*queues.OFFER_LEASE_MS),
    "execution_lease_ms": _int(*queues.EXECUTION_LEASE_MS),
}
# delay_ms and not_before are exclusive.
_DELAY_OR_NOT_BEFORE: dict[str, Any] = {"not": {
    "required": ["delay_ms", "not_before"],
    "properties": {"delay_ms": {"type": "integer"}, "not_before": {"type": "string"}}}}
_JSON_ANY: dict[str, Any] = {"description": "Any JSON value (numbers exactly as stored)"}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional request field: null is the same as leaving it out."""
    return {"anyOf": [{k: v for k, v in schema.items() if k != "description"},
                      {"type": "null"}],
            **({"description": schema["description"]} if "description" in schema else {})}


# Optional submission fields: null is the same as leaving the field out (default or none).
_NULLABLE_SUBMIT = ("delay_ms", "not_before", "business_key", "concurrency_key", "deadline_ms",
                    "start_deadline_ms", "attempt_timeout_ms", "retry", "offer_lease_ms",
                    "execution_lease_ms")
_SUBMIT_PROPS = {k: _or_null(v) if k in _NULLABLE_SUBMIT else v for k, v in _SUBMIT_PROPS.items()}

OPENAPI_PATHS: dict[str, Any] = {
    BASE: {
        "post": {
            "summary": "Submit a task", "operationId": "submitTask",
            "parameters": [_NAMESPACE, {"name": "Idempotency-Key", "in": "header",
                                        "required": False,
                                        "schema": IDEMPOTENCY_KEY}],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": ref("TaskSubmitRequest")}}},
            "responses": {"201": _json("TaskReceipt", "Accepted (or the original receipt)"),
                          **_SUBMIT_ERRORS},
        },
        "get": {
            "summary": "List tasks, newest first", "operationId": "listTasks",
            "parameters": [
                _NAMESPACE,
                {"name": "queue", "in": "query", "schema": NAME},
                {"name": "state", "in": "query", "schema": {"enum": _STATES}},
                {"name": "business_key", "in": "query",
                 "schema": {"type": "string", "minLength": 1,
                            "maxLength": tasks.BUSINESS_KEY_MAX_BYTES},
                 "description": "At most 512 UTF-8 bytes, matched byte-exact"},
                {"name": "created_after", "in": "query", "schema": TIME,
                 "description": "Inclusive lower bound"},
                {"name": "created_before", "in": "query", "schema": TIME,
                 "description": "Exclusive upper bound"},
                _LIMIT, _CURSOR,
            ],
            "responses": {"200": _json("TaskPage", "A page of tasks"),
                          **_READ_ERRORS,
                          "404": _problem("namespace_not_found, queue_not_found")},
        },
    },
    BASE + "/batch": {
        "post": {
            "summary": "Submit 1-500 tasks in one transaction", "operationId": "submitTasks",
            "parameters": [_NAMESPACE],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": ref("TaskBatchRequest")}}},
            "responses": {"201": _json("TaskBatchResponse", "Every item accepted or replayed"),
                          **_SUBMIT_ERRORS},
        },
    },
    BASE + "/{task_id}": {
        "get": {"summary": "A task in full", "operationId": "getTask",
                "parameters": [_NAMESPACE, _TASK_ID],
                "responses": {"200": _json("TaskDetail", "The task"), **_READ_ERRORS}},
    },
    BASE + "/{task_id}/source": {
        "get": {"summary": "The task's direct source: submitted, a retry, a schedule or a "
                           "workflow", "operationId": "getTaskSource",
                "parameters": [_NAMESPACE, _TASK_ID],
                "responses": {"200": _json("TaskSource", "The direct source, every link "
                                                         "verified"),
                              **_READ_ERRORS,
                              "409": _problem("source_link_missing: the task names a source "
                                              "row that is gone or does not agree")}},
    },
    BASE + "/{task_id}/attempts": {
        "get": {"summary": "A task's attempts by generation", "operationId": "listTaskAttempts",
                "parameters": [_NAMESPACE, _TASK_ID, _LIMIT, _CURSOR],
                "responses": {"200": _json("TaskAttemptPage", "A page of attempts"),
                              **_READ_ERRORS}},
    },
    BASE + "/{task_id}/events": {
        "get": {"summary": "A task's state events, oldest first", "operationId": "listTaskEvents",
                "parameters": [_NAMESPACE, _TASK_ID, _LIMIT, _CURSOR],
                "responses": {"200": _json("TaskEventPage", "A page of events"),
                              **_READ_ERRORS}},
    },
    BASE + "/{task_id}/attempts/{attempt_id}/evidence": {
        "get": {"summary": "Late reports about an attempt, oldest first",
                "operationId": "listAttemptEvidence",
                "parameters": [_NAMESPACE, _TASK_ID, _ATTEMPT_ID, _LIMIT, _CURSOR],
                "responses": {"200": _json("TaskEvidencePage", "A page of late evidence"),
                              **_READ_ERRORS,
                              "404": _problem("namespace_not_found, task_not_found, "
                                              "attempt_not_found")}},
    },
}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "TaskRetryOverrides": {
        "type": "object", "additionalProperties": False,
        "description": "Fields left out take the queue's defaults; frozen into the task",
        "properties": {k: _or_null(v) for k, v in {
            "max_attempts": _int(*queues.MAX_ATTEMPTS), "initial_ms": _int(0, queues.INT_MAX),
            "max_ms": {**_int(0, queues.INT_MAX), "description": "At least the initial_ms of "
                                                                 "the merged policy"},
            "multiplier": {"type": "number", "minimum": 1, "maximum": 999.999,
                           "multipleOf": 0.001, "description": "At most 3 decimal places"},
            "jitter": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.001,
                       "description": "At most 3 decimal places"},
        }.items()},
    },
    "TaskSubmitRequest": {
        "type": "object", "additionalProperties": False, "required": ["queue", "handler"],
        "properties": _SUBMIT_PROPS, **_DELAY_OR_NOT_BEFORE,
    },
    "TaskBatchRequest": {
        "type": "object", "additionalProperties": False, "required": ["tasks"],
        "properties": {"tasks": {
            "type": "array", "minItems": 1, "maxItems": tasks.MAX_BATCH,
            "items": {"type": "object", "additionalProperties": False,
                      "required": ["queue", "handler"], **_DELAY_OR_NOT_BEFORE,
                      "properties": {**_SUBMIT_PROPS,
                                     "idempotency_key": _or_null(IDEMPOTENCY_KEY)}},
        }},
    },
    "TaskReceipt": {"type": "object", "required": list(_RECEIPT_PROPS),
                    "properties": _RECEIPT_PROPS},
    "TaskBatchResponse": {
        "type": "object", "required": ["tasks"],
        "properties": {"tasks": {"type": "array", "items": {
            "type": "object", "required": [*_RECEIPT_PROPS, "replayed"],
            "properties": {**_RECEIPT_PROPS, "replayed": {"type": "boolean"}}}}},
    },
    "TaskSummary": {"type": "object", "required": list(_SUMMARY_PROPS),
                    "properties": _SUMMARY_PROPS},
    "TaskPage": _page_schema("TaskSummary"),
    "TaskDetail": {
        "type": "object",
        "properties": {
            **_SUMMARY_PROPS, "input": _JSON_ANY, "result": _JSON_ANY, "error": _JSON_ANY,
            "current_attempt_id": nullable(ID), "lease_expires_at": nullable(TIME),
            "cancel_reason": {"type": ["string", "null"]}, "retry_of": nullable(ID),
            "attempt_timeout_ms": {"type": ["integer", "null"]},
            "retry": {"type": "object", "properties": {
                "max_attempts": {"type": "integer"}, "initial_ms": {"type": "integer"},
                "max_ms": {"type": "integer"}, "multiplier": {"type": "number"},
                "jitter": {"type": "number"}}},
            "offer_lease_ms": {"type": "integer"}, "execution_lease_ms": {"type": "integer"},
            "first_started_at": nullable(TIME),
            "source": {**ref("TaskSourceView"),
                       "description": "Who made the task (the …/source answer), verified"},
        },
    },
    "TaskSource": {"oneOf": [
        {"type": "object", "additionalProperties": False, "required": ["kind"],
         "description": "Submitted by a client (single or batch)",
         "properties": {"kind": {"const": "submitted"}}},
        {"type": "object", "additionalProperties": False, "required": ["kind", "retry_of"],
         "description": "A manual retry of another task of the namespace",
         "properties": {"kind": {"const": "retry"}, "retry_of": ID}},
        {"type": "object", "additionalProperties": False,
         "required": ["kind", "schedule_id", "schedule_name", "version", "occurrence_id",
                      "fire_at"],
         "description": "Made by a schedule's occurrence (rule, backfill or trigger)",
         "properties": {"kind": {"const": "schedule"}, "schedule_id": ID,
                        "schedule_name": NAME, "version": {"type": "integer", "minimum": 1},
                        "occurrence_id": ID, "fire_at": TIME}},
        {"type": "object", "additionalProperties": False,
         "required": ["kind", "workflow_id", "definition", "version", "step", "activation",
                      "sequence", "round", "retry_of"],
         "description": "Made by an activation of a workflow instance's step",
         "properties": {"kind": {"const": "workflow"}, "workflow_id": ID, "definition": NAME,
                        "version": {"type": "integer", "minimum": 1},
                        "step": {"type": "string"}, "activation": ID,
                        "sequence": {"type": "integer", "minimum": 1},
                        "round": {"type": ["integer", "null"], "minimum": 1,
                                  "description": "The POLL round whose task it is; null for "
                                                 "a TASK step's task"},
                        "retry_of": {**nullable(ID),
                                     "description": "The task a step's manual retry made this "
                                                    "one to replace (its direct parent)"}}},
    ]},
    "TaskSourceView": {
        "type": "object", "required": ["kind", "verified", "problem"],
        "description": "The task's source in its detail: the fields of TaskSource with "
                       "verified true; when a link does not hold, only what the task's own "
                       "columns claim (workflow_id, schedule_id, retry_of) with verified false "
                       "and the problem",
        "properties": {
            "kind": {"enum": ["submitted", "retry", "schedule", "workflow"]},
            "verified": {"type": "boolean",
                         "description": "Every link checked both ways in the read"},
            "problem": {"type": ["string", "null"],
                        "description": "Which link does not hold (verified false)"},
            "retry_of": nullable(ID), "schedule_id": ID, "schedule_name": NAME,
            "version": {"type": "integer", "minimum": 1}, "occurrence_id": ID,
            "fire_at": TIME, "workflow_id": ID, "definition": NAME,
            "step": {"type": "string"}, "activation": ID,
            "sequence": {"type": "integer", "minimum": 1},
            "round": {"type": ["integer", "null"], "minimum": 1},
        },
    },
    "TaskAttempt": {
        "type": "object",
        "properties": {
            "id": ID, "generation": {"type": "integer", "minimum": 1},
            "state": {"enum": [s.value for s in AttemptState]},
            "worker_instance_id": ID, "worker_session_id": ID, "offered_at": TIME,
            "started_at": nullable(TIME), "lease_expires_at": TIME,
            "renewals": {"type": "integer"},
            "concurrency_token": {"type": ["integer", "null"], "minimum": 1,
                                  "description": "Fencing token of the concurrency key's "
                                                 "permit; null for a task without a key"},
            "finished_at": nullable(TIME),
            "retryable": {"type": ["boolean", "null"]}, "result": _JSON_ANY, "error": _JSON_ANY,
        },
    },
    "TaskAttemptPage": _page_schema("TaskAttempt"),
    "TaskEvent": {
        "type": "object",
        "properties": {
            "id": ID, "type": {"type": "string"}, "revision": {"type": "integer"},
            "from_state": {"type": ["string", "null"]}, "to_state": {"type": ["string", "null"]},
            "payload": _JSON_ANY, "occurred_at": TIME,
        },
    },
    "TaskEventPage": _page_schema("TaskEvent"),
    "TaskEvidence": {
        "type": "object",
        "properties": {
            "id": ID, "attempt_id": ID, "task_id": ID, "generation": {"type": "integer"},
            "kind": {"enum": ["SUCCEEDED", "FAILED", "UNKNOWN", "CANCELLED", "RENEW"]},
            "retryable": {"type": ["boolean", "null"]}, "payload": _JSON_ANY,
            "rejected_because": {"type": "string"}, "received_at": TIME,
        },
    },
    "TaskEvidencePage": _page_schema("TaskEvidence"),
}

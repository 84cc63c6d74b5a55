"""``/v1/namespaces/{namespace}/schedules``: recurring schedules (docs/api/schedules.md).

The routes check the shape of every input (unknown fields, types, times, query parameters)
and hand the rest to ``orbit_common.pulse.schedule_commands``: a refused request writes nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
from aiohttp import web

from orbit_api.openapi import (
    BODY_ERRORS,
    CURSOR_PARAM,
    ID,
    IDEMPOTENCY_PARAM,
    NAME,
    TIME,
    TOO_MANY_REQUESTS,
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
from orbit_api.routes.tasks import OPENAPI_SCHEMAS as TASK_SCHEMAS
from orbit_api.routes.tasks import json_response
from orbit_common import errors
from orbit_common.model import cursors, jsondoc, names
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import schedule_commands, schedule_rules, schedules, tasks
from orbit_common.service.http.body import int_param, query_params, read_document, read_json
from orbit_common.service.http.context import DB, request_id_of

COLLECTION = "/v1/namespaces/{namespace}/schedules"
ITEM = COLLECTION + "/{schedule}"
PAGE_MAX = 500
PAGE_DEFAULT = 100
REASON_MAX = 1024
VERSION_FIELDS = ("rule", "template", "misfire_policy", "overlap_policy", "catchup_window_ms",
                  "grace_ms")
CREATE_FIELDS = frozenset({"name", "queue", *VERSION_FIELDS})
PUBLISH_FIELDS = frozenset({"revision", *VERSION_FIELDS})
SOURCES = ("BACKFILL", "RULE", "TRIGGER")  # the ledger's order within one fire time


@attrs.frozen(kw_only=True)
class ReasonRequest:
    reason: str | None = None


@attrs.frozen(kw_only=True)
class TriggerRequest:
    """Takes no fields: an optional empty object."""


@attrs.frozen(kw_only=True)
class BackfillRequest:
    start: str
    end: str
    reason: str


Problems = list[dict[str, str]]


async def _version_body(request: web.Request, fields: frozenset[str]
                        ) -> tuple[dict[str, Any], schedule_commands.VersionSpec | None, Problems]:
    """The body parsed twice (plain, and with every number's spelling for the template), its
    unknown fields, and the version part validated; problems are collected, not raised."""
    doc = await read_document(request)
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "expected a JSON object"}])
    exact = jsondoc.loads_strict(await request.read(), keep_number_text=True)
    problems: Problems = [{"path": f"$.{key}", "message": "unknown field"}
                          for key in sorted(set(doc) - fields)]
    spec = None
    try:
        spec = schedule_commands.parse_version(doc, exact)
    except errors.ValidationFailed as exc:
        problems += exc.errors
    return doc, spec, problems


def _name_field(doc: dict[str, Any], key: str, problems: Problems) -> str:
    value = doc.get(key)
    if key not in doc:
        problems.append({"path": f"$.{key}", "message": "required"})
    elif not isinstance(value, str) or not names.is_valid_name(value):
        problems.append({"path": f"$.{key}", "message": names.NAME_RULE})
    return value if isinstance(value, str) else ""


def _schedule(request: web.Request) -> str:
    """The ``{schedule}`` path segment (a name no schedule has is simply not found, after the
    authorization check like any other)."""
    return request.match_info["schedule"]


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _time(text: str, path: str, problems: Problems) -> dt.datetime | None:
    try:
        value = tasks.parse_rfc3339(text)
    except ValueError as exc:
        problems.append({"path": path, "message": str(exc)})
        return None
    if not 1970 <= value.year <= 9998:  # inside DATETIME(6), with room for a rule's horizon
        problems.append({"path": path, "message": "a time from 1970 to 9998"})
        return None
    return value


async def _reason(request: web.Request) -> str | None:
    """The ``{"reason": …}`` body of pause, resume and disable (the domain requires the
    reason: a missing body is reported as a missing ``$.reason``)."""
    if not request.body_exists:
        return None
    dto, _ = await read_json(request, ReasonRequest)
    if dto.reason is not None and not 1 <= len(dto.reason) <= REASON_MAX:
        raise errors.ValidationFailed(
            [{"path": "$.reason", "message": f"1-{REASON_MAX} characters"}])
    return dto.reason


# --- handlers -----------------------------------------------------------------------------------


async def create_schedule(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    doc, spec, problems = await _version_body(request, CREATE_FIELDS)
    name_problems: Problems = []
    name = _name_field(doc, "name", name_problems)
    queue = _name_field(doc, "queue", name_problems)
    problems = name_problems + problems
    if problems or spec is None:
        raise errors.ValidationFailed(problems)
    outcome = await schedule_commands.create_schedule(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
        queue=queue, spec=spec, idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def list_schedules(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    params = query_params(request, {"limit", "cursor", "after"})
    limit = int_param(params, "limit", default=PAGE_DEFAULT, low=1, high=PAGE_MAX)
    after = params.get("after", "")
    filters = {"namespace": namespace, "after": after}
    if "cursor" in params:
        position = cursors.decode(params["cursor"], "schedules", filters)
        if len(position) != 1 or not isinstance(position[0], str):
            raise errors.InvalidCursor()
        after = position[0]
    items = await schedule_commands.list_schedules(
        request.app[DB], principal_of(request), namespace=namespace, after=after,
        limit=limit + 1)
    next_cursor = None
    if len(items) > limit:
        items = items[:limit]
        next_cursor = cursors.encode("schedules", filters, [items[-1]["name"]])
    return json_response({"items": items, "next_cursor": next_cursor})


async def get_schedule(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await schedule_commands.get_schedule(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_schedule(request))
    return json_response(view)


async def publish_version(request: web.Request) -> web.Response:
    query_params(request, ())
    name = _schedule(request)
    key = idempotency_key(request)
    doc, spec, problems = await _version_body(request, PUBLISH_FIELDS)
    revision = doc.get("revision")
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        problems.insert(0, {"path": "$.revision",
                            "message": "an integer of at least 1 (the revision you read)"})
    if problems or spec is None or not isinstance(revision, int):
        raise errors.ValidationFailed(problems)
    outcome = await schedule_commands.publish_version(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
        revision=revision, spec=spec, idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def _set_state(request: web.Request, target: str) -> web.Response:
    query_params(request, ())
    name = _schedule(request)
    key = idempotency_key(request)
    reason = await _reason(request)
    outcome = await schedule_commands.set_state(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
        target=target, reason=reason, idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def pause_schedule(request: web.Request) -> web.Response:
    return await _set_state(request, "PAUSED")


async def resume_schedule(request: web.Request) -> web.Response:
    return await _set_state(request, "ACTIVE")


async def delete_schedule(request: web.Request) -> web.Response:
    return await _set_state(request, "DISABLED")


async def trigger_schedule(request: web.Request) -> web.Response:
    query_params(request, ())
    name = _schedule(request)
    key = idempotency_key(request)
    if request.body_exists:
        await read_json(request, TriggerRequest)
    outcome = await schedule_commands.trigger_now(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
        idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def backfill_schedule(request: web.Request) -> web.Response:
    query_params(request, ())
    name = _schedule(request)
    key = idempotency_key(request)
    dto, _ = await read_json(request, BackfillRequest)
    problems: Problems = []
    start = _time(dto.start, "$.start", problems)
    end = _time(dto.end, "$.end", problems)
    if start is not None and end is not None and end <= start:
        problems.append({"path": "$.end", "message": "after start"})
    if not 1 <= len(dto.reason) <= REASON_MAX:
        problems.append({"path": "$.reason", "message": f"1-{REASON_MAX} characters"})
    if problems or start is None or end is None:
        raise errors.ValidationFailed(problems)
    outcome = await schedule_commands.backfill(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
        start=start, end=end, reason=dto.reason, idempotency_key=key,
        request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def list_occurrences(request: web.Request) -> web.Response:
    params = query_params(request, {"after", "limit", "cursor"})
    name = _schedule(request)
    limit = int_param(params, "limit", default=PAGE_DEFAULT, low=1, high=PAGE_MAX)
    problems: Problems = []
    after = _time(params["after"], "?after", problems) if "after" in params else None
    if problems:
        raise errors.ValidationFailed(problems)
    filters = {"namespace": _namespace(request), "schedule": name,
               "after": params.get("after")}
    after_source = None
    if "cursor" in params:
        position = cursors.decode(params["cursor"], "schedule_occurrences", filters)
        if (len(position) != 2 or not isinstance(position[0], str)
                or position[1] not in SOURCES):
            raise errors.InvalidCursor()
        try:
            after = tasks.parse_rfc3339(position[0])
        except ValueError as exc:
            raise errors.InvalidCursor() from exc
        after_source = position[1]
    items = await schedule_commands.list_occurrences(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
        after=after, after_source=after_source, limit=limit + 1)
    next_cursor = None
    if len(items) > limit:
        items = items[:limit]
        next_cursor = cursors.encode("schedule_occurrences", filters,
                                     [items[-1]["fire_at"], items[-1]["source"]])
    return json_response({"items": items, "next_cursor": next_cursor})


def add_routes(app: web.Application) -> None:
    """Register the schedule routes."""
    app.router.add_post(COLLECTION, create_schedule)
    app.router.add_get(COLLECTION, list_schedules)
    app.router.add_get(ITEM, get_schedule)
    app.router.add_delete(ITEM, delete_schedule)
    app.router.add_post(ITEM + "/versions", publish_version)
    app.router.add_post(ITEM + "/pause", pause_schedule)
    app.router.add_post(ITEM + "/resume", resume_schedule)
    app.router.add_post(ITEM + "/trigger", trigger_schedule)
    app.router.add_post(ITEM + "/backfill", backfill_schedule)
    app.router.add_get(ITEM + "/occurrences", list_occurrences)


# --- OpenAPI ------------------------------------------------------------------------------------


_NAMESPACE_PARAM = path_param("namespace", NAME)
_SCHEDULE_PARAM = path_param("schedule", NAME)
_IDEMPOTENCY_PARAM = IDEMPOTENCY_PARAM
_LIMIT_PARAM = limit_param(PAGE_MAX, PAGE_DEFAULT)
_CURSOR_PARAM = CURSOR_PARAM
_ERRORS = resource_errors("forbidden: the credential may not do this with schedules here")
_NOT_FOUND = _problem("namespace_not_found, or schedule_not_found")
_BODY_ERRORS = BODY_ERRORS
_MS = {"type": "integer", "minimum": 0}
# A rule's bounds: RFC 3339 with an upper-case T and Z, at most 6 fraction digits, years 1900
# to 8999 (schedule_rules._RFC3339, _MIN_AT, _MAX_AT).
_RULE_TIME = {"type": "string", "format": "date-time",
              "pattern": r"^(19|[2-8][0-9])[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                         r"(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"}
# The times of backfill and of the ledger's ?after: from 1970 to 9998 (_time).
_TIME_1970 = {"type": "string", "format": "date-time",
                "pattern": r"^(19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9])-"}
_POLICY_PROPS: dict[str, Any] = {
    "rule": {**ref("ScheduleRule")},
    "template": {**ref("ScheduleTemplate")},
    "misfire_policy": {"enum": list(schedules.MISFIRE_POLICIES), "default": "SKIP"},
    "overlap_policy": {"enum": list(schedules.OVERLAP_POLICIES), "default": "ALLOW"},
    "catchup_window_ms": {**_MS, "maximum": schedule_commands.MAX_WINDOW_MS,
                          "default": schedule_commands.DEFAULT_CATCHUP_MS},
    "grace_ms": {**_MS, "maximum": schedule_commands.MAX_GRACE_MS,
                 "default": schedule_commands.DEFAULT_GRACE_MS},
}


def _post(summary: str, op_id: str, body: str | None, ok: str, schema: str, *,
          conflicts: str, required: bool = True,
          more: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary, "operationId": op_id, "parameters": [_IDEMPOTENCY_PARAM],
        "responses": {ok: _json(schema, "The result (or the replay of the original answer)"),
                      **_ERRORS, "404": _NOT_FOUND, "409": _problem(conflicts),
                      **_BODY_ERRORS, **(more or {})},
    }
    if body is not None:
        operation["requestBody"] = request_body(body, required=required)
    return operation


OPENAPI_PATHS: dict[str, Any] = {
    COLLECTION: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Create a schedule (ACTIVE, version 1, covering from now)",
            "operationId": "createSchedule",
            "parameters": [_IDEMPOTENCY_PARAM],
            "requestBody": request_body("CreateScheduleRequest"),
            "responses": {
                "201": _json("Schedule", "Created (or the replay of the original answer)"),
                **_ERRORS,
                "404": _problem("namespace_not_found, or queue_not_found"),
                "409": _problem("already_exists, or idempotency_conflict"),
                **_BODY_ERRORS,
            },
        },
        "get": {
            "summary": "List schedules by name",
            "operationId": "listSchedules",
            "parameters": [_LIMIT_PARAM, _CURSOR_PARAM,
                           {"name": "after", "in": "query", "schema": {"type": "string"},
                            "description": "Start after this name (exclusive; any string "
                                           "orders among the names)"}],
            "responses": {"200": _json("SchedulePage", "A page of schedules"), **_ERRORS,
                          "404": _problem("namespace_not_found")},
        },
    },
    ITEM: {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "get": {
            "summary": "A schedule with every version",
            "operationId": "getSchedule",
            "responses": {"200": _json("Schedule", "The schedule"), **_ERRORS,
                          "404": _NOT_FOUND},
        },
        "delete": {
            **_post("Disable the schedule (final; versions and ledger are kept); idempotent",
                    "deleteSchedule", "ScheduleReasonRequest", "200", "Schedule",
                    conflicts="idempotency_conflict"),
        },
    },
    ITEM + "/versions": {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "post": _post("Publish a new version, effective from now: compare-and-set on revision",
                      "publishScheduleVersion", "PublishScheduleVersionRequest", "200",
                      "Schedule",
                      conflicts="stale_revision, schedule_disabled, or idempotency_conflict"),
    },
    ITEM + "/pause": {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "post": _post("Pause firing; idempotent", "pauseSchedule", "ScheduleReasonRequest",
                      "200", "Schedule", conflicts="schedule_disabled, or idempotency_conflict"),
    },
    ITEM + "/resume": {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "post": _post("Resume firing; the paused time meets the misfire policy; idempotent",
                      "resumeSchedule", "ScheduleReasonRequest", "200", "Schedule",
                      conflicts="schedule_disabled, or idempotency_conflict"),
    },
    ITEM + "/trigger": {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "post": _post("Run once now with the current version (source TRIGGER)",
                      "triggerSchedule", "ScheduleTriggerRequest", "201",
                      "ScheduleTriggerResult",
                      conflicts="schedule_disabled, occurrence_already_ran (a run of this "
                                "instant is already recorded), or idempotency_conflict",
                      required=False,
                      more={"429": TOO_MANY_REQUESTS}),
    },
    ITEM + "/backfill": {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "post": _post("Run the planned instants of [start, end) that never ran; idempotent",
                      "backfillSchedule", "ScheduleBackfillRequest", "200",
                      "ScheduleBackfillResult",
                      conflicts="schedule_disabled, occurrence_already_ran (runs kept "
                                "racing it), or idempotency_conflict",
                      more={"400": _problem("validation_failed, range_too_large (more than "
                                            f"{schedule_commands.MAX_BACKFILL} instants), "
                                            "malformed_json"),
                            "429": TOO_MANY_REQUESTS}),
    },
    ITEM + "/occurrences": {
        "parameters": [_NAMESPACE_PARAM, _SCHEDULE_PARAM],
        "get": {
            "summary": "The occurrence ledger in fire-time order",
            "operationId": "listScheduleOccurrences",
            "parameters": [_LIMIT_PARAM, _CURSOR_PARAM,
                           {"name": "after", "in": "query", "schema": _TIME_1970,
                            "description": "Only fire times after this (exclusive); the "
                                           "instant in UTC from 1970 to 9998"}],
            "responses": {"200": _json("ScheduleOccurrencePage", "A page of the ledger"),
                          **_ERRORS, "404": _NOT_FOUND},
        },
    },
}

OPENAPI_SCHEMAS: dict[str, Any] = {
    "ScheduleRule": {
        "type": "object", "additionalProperties": False,
        "description": "A cron expression (5 fields, or 6 with leading seconds) read in an "
                       "IANA time zone, or a fixed interval; optional bounds, daylight-saving "
                       "policies and jitter (docs/schedules.md). Stored with every field, "
                       "calendar_version frozen at publication.",
        "oneOf": [{"required": ["cron", "timezone"], "not": {"required": ["interval_ms"]}},
                  {"required": ["interval_ms"], "not": {"required": ["cron"]}}],
        "properties": {
            "cron": {"type": "string", "minLength": 1,
                     "maxLength": schedule_rules.MAX_CRON_LENGTH},
            "interval_ms": {"type": "integer", "minimum": schedule_rules.MIN_INTERVAL_MS,
                            "maximum": schedule_rules.MAX_INTERVAL_MS},
            "timezone": {"type": "string", "minLength": 1,
                         "description": "IANA name (of the server's tz database); default UTC "
                                        "for intervals"},
            "calendar_version": {"type": "string",
                                 "pattern": "^[0-9A-Za-z][0-9A-Za-z.+-]{0,31}$",
                                 "description": "tz database release; set by the server"},
            "start_at": {**nullable(_RULE_TIME), "description": "Inclusive"},
            "end_at": {**nullable(_RULE_TIME), "description": "Exclusive; after start_at"},
            "nonexistent": {"enum": [p.value for p in schedule_rules.NonexistentPolicy],
                            "default": "shift_forward"},
            "ambiguous": {"enum": [p.value for p in schedule_rules.AmbiguousPolicy],
                          "default": "first"},
            "jitter_ms": {"type": "integer", "minimum": 0,
                          "maximum": schedule_rules.MAX_JITTER_MS, "default": 0},
        },
    },
    "ScheduleTemplate": {
        "type": "object", "additionalProperties": False,
        "description": "The task to create: a task submission without queue (the "
                       "schedule's), delay_ms and not_before (the rule decides when); input "
                       "is kept byte-exact",
        "required": ["handler"],
        "properties": {k: v for k, v in TASK_SCHEMAS["TaskSubmitRequest"]["properties"].items()
                       if k in schedules.TEMPLATE_FIELDS},
    },
    "CreateScheduleRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["name", "queue", "rule", "template"],
        "properties": {"name": NAME, "queue": NAME, **_POLICY_PROPS},
    },
    "PublishScheduleVersionRequest": {
        "type": "object", "additionalProperties": False,
        "required": ["revision", "rule", "template"],
        "properties": {"revision": {"type": "integer", "minimum": 1,
                                    "description": "The revision the change is based on"},
                       **_POLICY_PROPS},
    },
    "ScheduleReasonRequest": {
        "type": "object", "additionalProperties": False, "required": ["reason"],
        "description": "An operator's intervention: the reason is required and audited",
        "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": REASON_MAX}},
    },
    "ScheduleTriggerRequest": {"type": "object", "additionalProperties": False},
    "ScheduleBackfillRequest": {
        "type": "object", "additionalProperties": False, "required": ["start", "end", "reason"],
        "properties": {"start": {**_TIME_1970, "description": "Inclusive; the instant in UTC "
                                                             "from 1970 to 9998"},
                       "end": {**_TIME_1970, "description": "Exclusive; after start"},
                       "reason": {"type": "string", "minLength": 1, "maxLength": REASON_MAX}},
    },
    "ScheduleVersion": {
        "type": "object",
        "properties": {
            "version": {"type": "integer", "minimum": 1}, "rule": ref("ScheduleRule"),
            "template": ref("ScheduleTemplate"),
            "misfire_policy": {"enum": list(schedules.MISFIRE_POLICIES)},
            "overlap_policy": {"enum": list(schedules.OVERLAP_POLICIES)},
            "catchup_window_ms": _MS, "grace_ms": _MS, "effective_from": TIME,
            "created_by": {"type": "string"}, "created_at": TIME,
        },
    },
    "Schedule": {
        "type": "object",
        "required": ["id", "name", "queue", "state", "revision", "current_version",
                     "processing_version", "covered_until", "next_fire_at", "created_at",
                     "updated_at"],
        "properties": {
            "id": ID, "name": NAME, "queue": NAME,
            "state": {"enum": ["ACTIVE", "PAUSED", "DISABLED"]},
            "revision": {"type": "integer", "minimum": 1},
            "current_version": {"type": "integer", "minimum": 1},
            "processing_version": {"type": "integer", "minimum": 1},
            "covered_until": TIME, "next_fire_at": nullable(TIME), "check_at": nullable(TIME),
            "buffered_fire_at": nullable(TIME), "last_task_id": nullable(ID),
            "last_fired_at": nullable(TIME), "created_at": TIME, "updated_at": TIME,
            "disabled_at": nullable(TIME),
            "versions": {"type": "array", "items": ref("ScheduleVersion"),
                         "description": "In GET of one schedule, create and publish"},
        },
    },
    "SchedulePage": {
        "type": "object", "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": ref("Schedule")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "ScheduleOccurrence": {
        "type": "object",
        "properties": {
            "id": ID, "fire_at": TIME, "version": {"type": "integer", "minimum": 1},
            "source": {"enum": list(SOURCES)},
            "outcome": {"enum": ["FIRED", "SKIPPED", "MERGED"]},
            "reason": {"type": ["string", "null"]}, "covered_until": nullable(TIME),
            "covered_count": {"type": "integer", "minimum": 1}, "task_id": nullable(ID),
            "fired_at": TIME, "lateness_ms": _MS,
        },
    },
    "ScheduleOccurrencePage": {
        "type": "object", "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": ref("ScheduleOccurrence")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "ScheduleRun": {
        "type": "object",
        "properties": {"fire_at": TIME, "task_id": ID,
                       "version": {"type": "integer", "minimum": 1}},
    },
    "ScheduleTriggerResult": {
        "type": "object",
        "properties": {"schedule": NAME, "fire_at": TIME, "task_id": ID,
                       "version": {"type": "integer", "minimum": 1}},
    },
    "ScheduleBackfillResult": {
        "type": "object",
        "properties": {
            "schedule": NAME, "start": TIME, "end": TIME,
            "searched_until": {**TIME, "description": "min(end, covered_until): later "
                                                      "instants are the scheduler's"},
            "created": {"type": "array", "items": ref("ScheduleRun")},
            "already_ran": {"type": "integer", "minimum": 0},
        },
    },
}

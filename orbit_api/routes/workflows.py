"""Workflows over HTTP (docs/api/workflows.md): definitions, their immutable versions,
validation without publishing, and instances.

``/v1/namespaces/{namespace}/workflow-definitions…`` and ``…/workflow-validations`` (a path of
its own: a definition may be named ``validate``), ``…/workflows…`` for instances. The routes
check the shape of every input (unknown fields, types, query parameters) and hand the rest to
``orbit_common.weave.definitions`` and ``instances``: a refused request writes nothing. The
problems of a definition document (``definition_invalid``) point into the request body
(``$.document…``).
"""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from orbit_api.openapi import (
    BODY_ERRORS,
    CURSOR_PARAM,
    ID,
    IDEMPOTENCY_KEY,
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
from orbit_common.model import cursors, jsondoc, names
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import tasks
from orbit_common.pulse.model import TaskState
from orbit_common.service.http.body import int_param, query_params, read_document, read_json
from orbit_common.service.http.context import DB, request_id_of
from orbit_common.weave import definitions, instance_tasks, instances, starts, timeline

DEFINITIONS = "/v1/namespaces/{namespace}/workflow-definitions"
DEFINITION = DEFINITIONS + "/{definition}"
VERSIONS = DEFINITION + "/versions"
VERSION = VERSIONS + "/{version}"
VALIDATIONS = "/v1/namespaces/{namespace}/workflow-validations"
INSTANCES = "/v1/namespaces/{namespace}/workflows"
INSTANCE = INSTANCES + "/{workflow_id}"
BATCH = INSTANCES + "/batch"
ROUNDS = INSTANCE + "/steps/{step}/rounds"
WAITS = INSTANCE + "/waits"
TIMELINE = INSTANCE + "/timeline"
TASKS = INSTANCE + "/tasks"
ACTIVATION_VIEWS = ("current", "all")
PAGE_MAX = definitions.LIST_MAX
PUBLISH_FIELDS = frozenset({"revision", "document"})
VALIDATE_FIELDS = frozenset({"document"})
START_FIELDS = frozenset({"definition", "version", "input", "business_key"})
BATCH_FIELDS = frozenset({"instances"})
BATCH_ITEM_FIELDS = START_FIELDS | {"idempotency_key"}
VERSION_MAX = 2**31 - 1  # weave_definition_versions.version is an INT

Problems = list[dict[str, str]]


@attrs.frozen(kw_only=True)
class CreateDefinitionRequest:
    name: str
    description: str = ""


def _namespace(request: web.Request) -> str:
    return request.match_info["namespace"]


def _definition(request: web.Request) -> str:
    """The ``{definition}`` path segment (a name no definition has is simply not found, after
    the authorization check like any other)."""
    return request.match_info["definition"]


async def _object(request: web.Request, fields: frozenset[str], **parse: Any
                  ) -> tuple[dict[str, Any], Problems]:
    """The body as a JSON object and a problem for each unknown field."""
    doc = await read_document(request, **parse)
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "expected a JSON object"}])
    return doc, [{"path": f"$.{key}", "message": "unknown field"}
                 for key in sorted(set(doc) - fields)]


def _document(doc: dict[str, Any], problems: Problems) -> bytes:
    """The ``document`` member as JSON bytes (its numbers' digits kept)."""
    if "document" not in doc:
        problems.append({"path": "$.document", "message": "required"})
        return b""
    return jsondoc.dumps(doc["document"]).encode()


def _in_body(exc: errors.DefinitionInvalid) -> errors.DefinitionInvalid:
    """The validator's problems, whose paths start at the document, pointed into the body."""
    return errors.DefinitionInvalid(
        [{**p, "path": "$.document" + p["path"].removeprefix("$")} for p in exc.errors])


def _positive(value: Any, path: str, high: int, problems: Problems) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        problems.append({"path": path, "message": f"an integer from 1 to {high}"})
        return 0
    return value


# --- definitions --------------------------------------------------------------------------------


async def create_definition(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    dto, _ = await read_json(request, CreateDefinitionRequest)
    outcome = await definitions.create_definition(
        request.app[DB], principal_of(request), namespace=_namespace(request), name=dto.name,
        description=dto.description, idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


async def list_definitions(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=PAGE_MAX, low=1, high=PAGE_MAX)
    filters = {"namespace": namespace}
    after = ""
    if "cursor" in params:
        position = cursors.decode(params["cursor"], "workflow_definitions", filters)
        if len(position) != 1 or not isinstance(position[0], str):
            raise errors.InvalidCursor()
        after = position[0]
    items = await definitions.list_definitions(
        request.app[DB], principal_of(request), namespace=namespace, after=after, limit=limit)
    # A full page may be the last one: the next is then empty, with no cursor.
    next_cursor = (cursors.encode("workflow_definitions", filters, [items[-1]["name"]])
                   if len(items) == limit else None)
    return json_response({"items": items, "next_cursor": next_cursor})


async def get_definition(request: web.Request) -> web.Response:
    query_params(request, ())
    view = await definitions.get_definition(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_definition(request), documents=False)
    return json_response(view)


async def publish_version(request: web.Request) -> web.Response:
    query_params(request, ())
    name = _definition(request)
    key = idempotency_key(request)
    doc, problems = await _object(request, PUBLISH_FIELDS)
    if "revision" not in doc:
        problems.insert(0, {"path": "$.revision", "message": "required"})
    revision = _positive(doc.get("revision", 1), "$.revision", 2**63 - 1, problems)
    document = _document(doc, problems)
    if problems:
        raise errors.ValidationFailed(problems)
    try:
        outcome = await definitions.publish_version(
            request.app[DB], principal_of(request), namespace=_namespace(request), name=name,
            revision=revision, document=document, idempotency_key=key,
            request_id=request_id_of(request))
    except errors.DefinitionInvalid as exc:
        raise _in_body(exc) from exc
    return json_response(outcome.body, status=outcome.status)


async def get_version(request: web.Request) -> web.Response:
    query_params(request, ())
    text = request.match_info["version"]
    problems: Problems = []
    version = 0
    if text.isascii() and text.isdigit() and len(text) <= 10:
        version = _positive(int(text), "{version}", VERSION_MAX, problems)
    else:
        problems.append({"path": "{version}", "message": f"an integer from 1 to {VERSION_MAX}"})
    if problems:
        raise errors.ValidationFailed(problems)
    view = await definitions.get_version(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        name=_definition(request), version=version)
    return json_response(view)


async def validate_definition(request: web.Request) -> web.Response:
    query_params(request, ())
    doc, problems = await _object(request, VALIDATE_FIELDS)
    document = _document(doc, problems)
    if problems:
        raise errors.ValidationFailed(problems)
    try:
        view = await definitions.check_document(
            request.app[DB], principal_of(request), namespace=_namespace(request),
            document=document)
    except errors.DefinitionInvalid as exc:
        raise _in_body(exc) from exc
    return json_response(view)


# --- instances ----------------------------------------------------------------------------------


def _start_fields(exact: dict[str, Any], path: str, problems: Problems
                  ) -> tuple[str | None, int | None, str | None, bytes]:
    """A start request's fields (one start, or one item of a batch at ``path``): the
    definition, version and business key as the normal parse makes them (a number is no
    string), the input with every number's text kept (it is stored as written)."""
    plain = {k: jsondoc.plain_numbers(v) for k, v in exact.items() if k != "input"}
    definition = plain.get("definition")
    if "definition" not in plain:
        problems.insert(0, {"path": f"{path}.definition", "message": "required"})
    elif not isinstance(definition, str) or not names.is_valid_name(definition):
        problems.insert(0, {"path": f"{path}.definition", "message": names.NAME_RULE})
    version = None
    if plain.get("version") is not None:
        version = _positive(plain["version"], f"{path}.version", VERSION_MAX, problems)
    business_key = plain.get("business_key")
    if business_key is not None and not (
            isinstance(business_key, str)
            and 1 <= len(business_key.encode()) <= instances.BUSINESS_KEY_MAX_BYTES):
        problems.append({"path": f"{path}.business_key",
                         "message": f"a string of 1-{instances.BUSINESS_KEY_MAX_BYTES} bytes"
                                    " of UTF-8"})
        business_key = None
    input_json = jsondoc.dumps(exact.get("input", {})).encode()
    return (definition if isinstance(definition, str) else None), version, business_key, \
        input_json


async def start_workflow(request: web.Request) -> web.Response:
    query_params(request, ())
    key = idempotency_key(request)
    # One parse keeping every number's text: the input is stored as written.
    exact, problems = await _object(request, START_FIELDS, keep_number_text=True,
                                    check_numbers=True)
    definition, version, business_key, input_json = _start_fields(exact, "$", problems)
    if problems or definition is None:
        raise errors.ValidationFailed(problems)
    outcome = await instances.start_instance(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        definition=definition, input_json=input_json, version=version,
        business_key=business_key, idempotency_key=key, request_id=request_id_of(request))
    return json_response(outcome.body, status=outcome.status)


def _check_batch_size(raw: bytes) -> None:
    """Refuse more than :data:`starts.MAX_BATCH` items while the array is read."""
    if jsondoc.array_longer_than(raw, "instances", starts.MAX_BATCH):
        raise errors.ValidationFailed([{"path": "$.instances",
                                        "message": f"1-{starts.MAX_BATCH} items"}])


async def start_workflows(request: web.Request) -> web.Response:
    """``POST …/workflows/batch``: 1–100 starts in one transaction (orbit_common.weave.starts),
    each item with its own optional ``idempotency_key`` (the header is refused: it would name
    the whole batch)."""
    query_params(request, ())
    if idempotency_key(request) is not None:
        raise errors.ValidationFailed([{
            "path": "Idempotency-Key",
            "message": "a batch takes one idempotency_key per item"
                       " ($.instances[i].idempotency_key)"}])
    principal = principal_of(request)
    exact, problems = await _object(request, BATCH_FIELDS, precheck=_check_batch_size,
                                    keep_number_text=True, check_numbers=True)
    raw_items = exact.get("instances")
    if type(raw_items) is not list or not 1 <= len(raw_items) <= starts.MAX_BATCH:
        problems.insert(0, {"path": "$.instances",
                            "message": f"an array of 1-{starts.MAX_BATCH} start requests"})
        raise errors.ValidationFailed(problems)
    items: list[starts.StartItem] = []
    for index, raw in enumerate(raw_items):
        path = f"$.instances[{index}]"
        if type(raw) is not dict:
            problems.append({"path": path, "message": "expected a JSON object"})
            continue
        problems += [{"path": f"{path}.{name}", "message": "unknown field"}
                     for name in sorted(set(raw) - BATCH_ITEM_FIELDS)]
        found: Problems = []
        definition, version, business_key, input_json = _start_fields(raw, path, found)
        key = jsondoc.plain_numbers(raw.get("idempotency_key"))
        if key is not None and not isinstance(key, str):
            found.append({"path": f"{path}.idempotency_key", "message": "a string"})
            key = None
        problems += found
        if found or definition is None:
            continue
        try:
            items.append(starts.start_item(
                principal, index=index, definition=definition, input_json=input_json,
                version=version, business_key=business_key, idempotency_key=key))
        except errors.ValidationFailed as exc:
            problems += exc.errors
    if problems:
        raise errors.ValidationFailed(problems)
    started = await starts.start_instances(
        request.app[DB], principal, namespace=_namespace(request), items=items,
        request_id=request_id_of(request))
    return json_response({"instances": [{**s.receipt, "replayed": s.replayed} for s in started]},
                         status=201)


async def get_workflow(request: web.Request) -> web.Response:
    params = query_params(request, {"activations"})
    shown = params.get("activations", "current")
    if shown not in ACTIVATION_VIEWS:
        raise errors.ValidationFailed([{"path": "?activations", "message": "current or all"}])
    view = await instances.get_instance(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], all_activations=shown == "all")
    return json_response(view)


async def list_waits(request: web.Request) -> web.Response:
    query_params(request, ())
    items = await instances.list_waits(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"])
    return json_response({"items": items})


async def list_workflows(request: web.Request) -> web.Response:
    params = query_params(request, {"definition", "version", "state", "business_key",
                                    "created_from", "created_to", "limit", "cursor"})
    limit = int_param(params, "limit", default=instances.LIST_MAX, low=1,
                      high=instances.LIST_MAX)
    version = (int_param(params, "version", default=1, low=1, high=VERSION_MAX)
               if "version" in params else None)
    problems: Problems = []
    definition = params.get("definition")
    if definition is not None and not names.is_valid_name(definition):
        problems.append({"path": "?definition", "message": names.NAME_RULE})
    if version is not None and definition is None:
        problems.append({"path": "?version",
                         "message": "needs definition (a version number is its definition's)"})
    state = params.get("state")
    if state is not None and state not in instances.STATES:
        problems.append({"path": "?state", "message": f"one of {', '.join(instances.STATES)}"})
    business_key = params.get("business_key")
    if business_key is not None:
        raw = business_key.encode("utf-8", errors="surrogateescape")
        if not 1 <= len(raw) <= instances.BUSINESS_KEY_MAX_BYTES or raw.decode(
                "utf-8", errors="replace") != business_key:
            problems.append({"path": "?business_key",
                             "message": f"1-{instances.BUSINESS_KEY_MAX_BYTES} bytes of UTF-8"})
    bounds = {}
    for name in ("created_from", "created_to"):
        if name in params:
            try:
                bounds[name] = tasks.parse_rfc3339(params[name])
            except ValueError as exc:
                problems.append({"path": f"?{name}",
                                 "message": f"{exc} (write '+' as %2B in a URL)"})
    if problems:
        raise errors.ValidationFailed(problems)
    page = await instances.list_instances(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        definition=definition, state=state, business_key=business_key,
        created_from=bounds.get("created_from"), created_to=bounds.get("created_to"),
        limit=limit, cursor=params.get("cursor"), version=version)
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


async def list_rounds(request: web.Request) -> web.Response:
    """A POLL step's query and its rounds (docs/api/workflows.md § 有界查询的轮次)."""
    namespace, workflow_id = _namespace(request), request.match_info["workflow_id"]
    step = request.match_info["step"]
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=instances.ROUNDS_MAX, low=1,
                      high=instances.ROUNDS_MAX)
    filters = {"namespace": namespace, "workflow": workflow_id, "step": step}
    after = 0
    if "cursor" in params:
        position = cursors.decode(params["cursor"], "workflow_rounds", filters)
        if (len(position) != 1 or isinstance(position[0], bool)
                or not isinstance(position[0], int) or position[0] < 1):
            raise errors.InvalidCursor()
        after = position[0]
    view = await instances.get_rounds(
        request.app[DB], principal_of(request), namespace=namespace, instance_id=workflow_id,
        step=step, after=after, limit=limit)
    items = view["items"]
    view["next_cursor"] = (cursors.encode("workflow_rounds", filters, [items[-1]["round"]])
                           if len(items) >= limit else None)
    return json_response(view)


async def get_timeline(request: web.Request) -> web.Response:
    """The instance's timeline of events, paged by database time (docs/api/workflows.md
    § 时间线): a history view, not a consumption watermark."""
    params = query_params(request, {"order", "limit", "cursor"})
    limit = int_param(params, "limit", default=timeline.LIMIT_MAX, low=1,
                      high=timeline.LIMIT_MAX)
    order = params.get("order", "asc")
    if order not in timeline.ORDERS:
        raise errors.ValidationFailed([{"path": "?order", "message": "asc or desc"}])
    page = await timeline.get_timeline(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], order=order, limit=limit,
        cursor=params.get("cursor"))
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


async def list_tasks(request: web.Request) -> web.Response:
    """Every task the instance created, verified back to it (docs/api/workflows.md
    § 实例的任务)."""
    params = query_params(request, {"limit", "cursor"})
    limit = int_param(params, "limit", default=instance_tasks.LIST_MAX, low=1,
                      high=instance_tasks.LIST_MAX)
    page = await instance_tasks.list_tasks(
        request.app[DB], principal_of(request), namespace=_namespace(request),
        instance_id=request.match_info["workflow_id"], limit=limit,
        cursor=params.get("cursor"))
    return json_response({"items": page.items, "next_cursor": page.next_cursor})


def add_routes(app: web.Application) -> None:
    """Register the workflow routes."""
    app.router.add_post(DEFINITIONS, create_definition)
    app.router.add_get(DEFINITIONS, list_definitions)
    app.router.add_get(DEFINITION, get_definition)
    app.router.add_post(VERSIONS, publish_version)
    app.router.add_get(VERSION, get_version)
    app.router.add_post(VALIDATIONS, validate_definition)
    app.router.add_post(INSTANCES, start_workflow)
    app.router.add_get(INSTANCES, list_workflows)
    app.router.add_post(BATCH, start_workflows)
    # Not "batch": GET …/workflows/batch is no route (a 405 naming POST), not a malformed id.
    app.router.add_get(INSTANCES + "/{workflow_id:(?!batch$)[^/]+}", get_workflow)
    app.router.add_get(ROUNDS, list_rounds)
    app.router.add_get(WAITS, list_waits)
    app.router.add_get(TIMELINE, get_timeline)
    app.router.add_get(TASKS, list_tasks)


# --- OpenAPI ------------------------------------------------------------------------------------


_NAMESPACE_PARAM = path_param("namespace", NAME)
_DEFINITION_PARAM = path_param("definition", NAME)
_VERSION = {"type": "integer", "minimum": 1, "maximum": VERSION_MAX}
_VERSION_PARAM = path_param("version", _VERSION)
_WORKFLOW_PARAM = path_param("workflow_id", ID)
_IDEMPOTENCY_PARAM = IDEMPOTENCY_PARAM
_LIMIT_PARAM = limit_param(PAGE_MAX, PAGE_MAX)
_CURSOR_PARAM = CURSOR_PARAM
_ERRORS = resource_errors("forbidden: the credential may not do this with workflows here")
_BODY_ERRORS = BODY_ERRORS
_INVALID = _problem("definition_invalid (each item of errors has a path into the body, "
                    "$.document…, and its own code), validation_failed, malformed_json, "
                    "duplicate_json_key, json_too_deep, json_too_complex")
_PAGE = {"type": "object", "required": ["items", "next_cursor"]}

OPENAPI_PATHS: dict[str, Any] = {
    DEFINITIONS: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Create a workflow definition (without versions: publish adds them)",
            "operationId": "createWorkflowDefinition",
            "parameters": [_IDEMPOTENCY_PARAM],
            "requestBody": request_body("CreateWorkflowDefinitionRequest"),
            "responses": {
                "201": _json("WorkflowDefinition",
                             "Created (or the replay of the original answer)"),
                **_ERRORS, "404": _problem("namespace_not_found"),
                "409": _problem("already_exists, or idempotency_conflict"), **_BODY_ERRORS,
            },
        },
        "get": {
            "summary": "List workflow definitions by name",
            "operationId": "listWorkflowDefinitions",
            "parameters": [_LIMIT_PARAM, _CURSOR_PARAM],
            "responses": {"200": _json("WorkflowDefinitionPage", "A page of definitions"),
                          **_ERRORS, "404": _problem("namespace_not_found")},
        },
    },
    DEFINITION: {
        "parameters": [_NAMESPACE_PARAM, _DEFINITION_PARAM],
        "get": {
            "summary": "A workflow definition with its versions (without their documents)",
            "operationId": "getWorkflowDefinition",
            "responses": {"200": _json("WorkflowDefinition", "The definition"), **_ERRORS,
                          "404": _problem("namespace_not_found, or definition_not_found")},
        },
    },
    VERSIONS: {
        "parameters": [_NAMESPACE_PARAM, _DEFINITION_PARAM],
        "post": {
            "summary": "Publish the next immutable version: compare-and-set on revision; the "
                       "credential must be allowed tasks.submit on every queue it uses",
            "operationId": "publishWorkflowVersion",
            "parameters": [_IDEMPOTENCY_PARAM],
            "requestBody": request_body("PublishWorkflowVersionRequest"),
            "responses": {
                "201": _json("WorkflowDefinition", "Published (or the replay of the original "
                                                   "answer), with the new version's number"),
                **_ERRORS, "400": _INVALID,
                "404": _problem("namespace_not_found, or definition_not_found"),
                "409": _problem("stale_revision, or idempotency_conflict"), **_BODY_ERRORS,
            },
        },
    },
    VERSION: {
        "parameters": [_NAMESPACE_PARAM, _DEFINITION_PARAM, _VERSION_PARAM],
        "get": {
            "summary": "One published version with its document",
            "operationId": "getWorkflowVersion",
            "responses": {"200": _json("WorkflowVersion", "The version"), **_ERRORS,
                          "404": _problem("namespace_not_found, definition_not_found, or "
                                          "definition_version_not_found")},
        },
    },
    VALIDATIONS: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Validate a definition document as a publish here would, without "
                       "publishing (writes nothing)",
            "operationId": "validateWorkflowDefinition",
            "requestBody": request_body("ValidateWorkflowDefinitionRequest"),
            "responses": {"200": _json("WorkflowValidation", "Valid: its digest and queues"),
                          **_ERRORS, "400": _INVALID, "404": _problem("namespace_not_found"),
                          **_BODY_ERRORS},
        },
    },
    INSTANCES: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Start a workflow instance on a published version (the latest unless "
                       "version is given)",
            "operationId": "startWorkflow",
            "parameters": [_IDEMPOTENCY_PARAM],
            "requestBody": request_body("StartWorkflowRequest"),
            "responses": {
                "201": _json("Workflow", "The receipt (or the replay of the original one)"),
                **_ERRORS,
                "404": _problem("namespace_not_found, definition_not_found, or "
                                "definition_version_not_found"),
                "409": _problem("definition_not_published, or idempotency_conflict"),
                "500": _problem("version_scope_mismatch: the version's stored scope or "
                                "document does not match its digest"),
                **_BODY_ERRORS,
            },
        },
        "get": {
            "summary": "List workflow instances newest first",
            "operationId": "listWorkflows",
            "parameters": [
                {"name": "definition", "in": "query", "schema": NAME},
                {"name": "version", "in": "query", "schema": _VERSION,
                 "description": "The pinned version; only with definition"},
                {"name": "state", "in": "query", "schema": {"enum": list(instances.STATES)}},
                {"name": "business_key", "in": "query",
                 "schema": {"type": "string", "minLength": 1,
                            "maxLength": instances.BUSINESS_KEY_MAX_BYTES},
                 "description": "Exact bytes; 1-512 bytes of UTF-8"},
                {"name": "created_from", "in": "query", "schema": TIME,
                 "description": "Inclusive; RFC 3339 with an offset"},
                {"name": "created_to", "in": "query", "schema": TIME,
                 "description": "Exclusive; RFC 3339 with an offset"},
                {**_LIMIT_PARAM, "schema": {"type": "integer", "minimum": 1,
                                            "maximum": instances.LIST_MAX,
                                            "default": instances.LIST_MAX}},
                _CURSOR_PARAM,
            ],
            "responses": {"200": _json("WorkflowPage", "A page of instances"), **_ERRORS,
                          "404": _problem("namespace_not_found")},
        },
    },
    BATCH: {
        "parameters": [_NAMESPACE_PARAM],
        "post": {
            "summary": "Start 1-100 workflow instances in one transaction (all or nothing)",
            "description": "Each item is a start request with its own optional idempotency_key "
                           "(the identity of a single start with that key: either replays the "
                           "other); the Idempotency-Key header is refused.",
            "operationId": "startWorkflows",
            "requestBody": request_body("StartWorkflowBatchRequest"),
            "responses": {
                "201": _json("WorkflowBatch", "One receipt per item, in order; replayed marks "
                                              "the original receipt of a key already used"),
                **_ERRORS,
                "404": _problem("namespace_not_found, definition_not_found, or "
                                "definition_version_not_found"),
                "409": _problem("definition_not_published, or idempotency_conflict (naming "
                                "the item)"),
                "500": _problem("version_scope_mismatch: the version's stored scope or "
                                "document does not match its digest"),
                **_BODY_ERRORS,
            },
        },
    },
    INSTANCE: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM],
        "get": {
            "summary": "A workflow instance with its steps and their activations",
            "operationId": "getWorkflow",
            "parameters": [{
                "name": "activations", "in": "query",
                "schema": {"enum": list(ACTIVATION_VIEWS), "default": "current"},
                "description": "current: each step's current (newest) activation; all: every "
                               "activation, historical ones too, in sequence order"}],
            "responses": {"200": _json("Workflow", "The instance"), **_ERRORS,
                          "404": _problem("namespace_not_found, or "
                                          "workflow_instance_not_found")},
        },
    },
    ROUNDS: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM,
                       path_param("step", {"type": "string", "minLength": 1,
                                           "maxLength": 128})],
        "get": {
            "summary": "A POLL step's bounded query and its rounds, in round order",
            "operationId": "listWorkflowPollRounds",
            "parameters": [
                {**_LIMIT_PARAM, "schema": {"type": "integer", "minimum": 1,
                                            "maximum": instances.ROUNDS_MAX,
                                            "default": instances.ROUNDS_MAX}},
                _CURSOR_PARAM,
            ],
            "responses": {"200": _json("WorkflowPollRounds", "The query and a page of rounds"),
                          **_ERRORS,
                          "404": _problem("namespace_not_found, workflow_instance_not_found, "
                                          "or workflow_step_not_found (no POLL step of this "
                                          "name has run)")},
        },
    },
    WAITS: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM],
        "get": {
            "summary": "The instance's waits (TIMER and SIGNAL steps), oldest first; not paged "
                       "(at most one wait per activation)",
            "operationId": "listWorkflowWaits",
            "responses": {"200": _json("WorkflowWaitList", "The waits"), **_ERRORS,
                          "404": _problem("namespace_not_found, or "
                                          "workflow_instance_not_found")},
        },
    },
    TIMELINE: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM],
        "get": {
            "summary": "The instance's timeline: its own events and its signals' events in "
                       "database-time order (a history view, not a consumption watermark)",
            "operationId": "getWorkflowTimeline",
            "parameters": [
                {"name": "order", "in": "query",
                 "schema": {"enum": list(timeline.ORDERS), "default": "asc"},
                 "description": "asc: oldest first; desc: newest first"},
                {**_LIMIT_PARAM, "schema": {"type": "integer", "minimum": 1,
                                            "maximum": timeline.LIMIT_MAX,
                                            "default": timeline.LIMIT_MAX}},
                _CURSOR_PARAM,
            ],
            "responses": {"200": _json("WorkflowTimelinePage", "A page of events"),
                          **_ERRORS,
                          "404": _problem("namespace_not_found, or "
                                          "workflow_instance_not_found")},
        },
    },
    TASKS: {
        "parameters": [_NAMESPACE_PARAM, _WORKFLOW_PARAM],
        "get": {
            "summary": "Every task the instance created (TASK steps, POLL rounds, step "
                       "retries), each verified back to its activation, in task id order",
            "operationId": "listWorkflowTasks",
            "parameters": [
                {**_LIMIT_PARAM, "schema": {"type": "integer", "minimum": 1,
                                            "maximum": instance_tasks.LIST_MAX,
                                            "default": instance_tasks.LIST_MAX}},
                _CURSOR_PARAM,
            ],
            "responses": {"200": _json("WorkflowTaskPage", "A page of the instance's tasks"),
                          **_ERRORS,
                          "404": _problem("namespace_not_found, or "
                                          "workflow_instance_not_found")},
        },
    },
}

_JSON_ANY: dict[str, Any] = {}
_DOCUMENT = {"type": "object",
             "description": "A definition document (docs/weave/language.md), format "
                            "orbit.weave/1; the validator's rules are not in this schema"}

_START_PROPERTIES: dict[str, Any] = {
    "definition": NAME,
    "version": {**nullable(_VERSION), "description": "Default: the latest version"},
    "input": {"type": "object", "default": {},
              "description": "Checked against the version's input_schema; kept "
                             "byte-exact"},
    "business_key": {**nullable({"type": "string", "minLength": 1,
                                  "maxLength": instances.BUSINESS_KEY_MAX_BYTES}),
                     "description": "1-512 bytes of UTF-8, compared as exact bytes"},
}


OPENAPI_SCHEMAS: dict[str, Any] = {
    "CreateWorkflowDefinitionRequest": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {"name": NAME,
                       "description": {"type": "string",
                                       "maxLength": definitions.DESCRIPTION_MAX}},
    },
    "PublishWorkflowVersionRequest": {
        "type": "object", "additionalProperties": False, "required": ["revision", "document"],
        "properties": {"revision": {"type": "integer", "minimum": 1,
                                    "maximum": 2**63 - 1,
                                    "description": "The definition's revision you read"},
                       "document": _DOCUMENT},
    },
    "ValidateWorkflowDefinitionRequest": {
        "type": "object", "additionalProperties": False, "required": ["document"],
        "properties": {"document": _DOCUMENT},
    },
    "WorkflowValidation": {
        "type": "object", "required": ["valid", "digest", "queues"],
        "properties": {"valid": {"const": True},
                       "digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                       "queues": {"type": "array", "items": NAME}},
    },
    "WorkflowVersion": {
        "type": "object", "required": ["version", "digest", "created_by", "created_at"],
        "properties": {
            "definition": NAME, "version": _VERSION,
            "digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "document": {**nullable(_DOCUMENT),
                         "description": "In GET of one version; null in a definition's list"},
            "created_by": ID, "created_at": TIME,
        },
    },
    "WorkflowDefinition": {
        "type": "object",
        "required": ["id", "name", "description", "revision", "latest_version", "created_at",
                     "updated_at"],
        "properties": {
            "id": ID, "name": NAME, "description": {"type": "string"},
            "revision": {"type": "integer", "minimum": 1},
            "latest_version": nullable(_VERSION), "created_at": TIME, "updated_at": TIME,
            "versions": {"type": "array", "items": ref("WorkflowVersion"),
                         "description": "In GET of one definition, create and publish"},
            "published_version": {**_VERSION, "description": "In the answer of a publish"},
        },
    },
    "WorkflowDefinitionPage": {
        **_PAGE,
        "properties": {"items": {"type": "array", "items": ref("WorkflowDefinition")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "StartWorkflowBatchRequest": {
        "type": "object", "additionalProperties": False, "required": ["instances"],
        "properties": {
            "instances": {"type": "array", "minItems": 1, "maxItems": starts.MAX_BATCH,
                          "items": {
                              "type": "object", "additionalProperties": False,
                              "required": ["definition"],
                              "properties": {
                                  **_START_PROPERTIES,
                                  "idempotency_key": {
                                      **nullable(IDEMPOTENCY_KEY),
                                      "description": "This item's Idempotency-Key"},
                              }}},
        },
    },
    "WorkflowBatch": {
        "type": "object", "required": ["instances"],
        "properties": {"instances": {"type": "array", "items": {"allOf": [
            ref("Workflow"),
            {"type": "object", "required": ["replayed"],
             "properties": {"replayed": {"type": "boolean"}}}]}}},
    },
    "StartWorkflowRequest": {
        "type": "object", "additionalProperties": False, "required": ["definition"],
        "properties": _START_PROPERTIES,
    },
    "WorkflowActivation": {
        "type": "object",
        "required": ["id", "sequence", "state", "task_id", "created_at", "ended_at",
                     "task_state", "result"],
        "properties": {
            "id": ID, "sequence": {"type": "integer", "minimum": 1},
            "state": {"enum": ["LIVE", "SUCCEEDED", "FAILED", "CANCELLED", "SUPERSEDED"]},
            "task_id": nullable(ID), "created_at": TIME, "ended_at": nullable(TIME),
            "task_state": {**nullable({"enum": [s.value for s in TaskState]}),
                           "description": "The state of the activation's task now"},
            "result": {"enum": list(instances.RESULTS),
                       "description": "What the task's result has become: none, recorded "
                                      "(the engine has not consumed it yet), advanced, "
                                      "quarantined"},
        },
    },
    "WorkflowWait": {
        "type": "object",
        "required": ["id", "step", "step_id", "activation_id", "activation_sequence", "kind",
                     "state", "generation", "first_deadline_at", "deadline_at", "signal_name",
                     "correlation_key", "correlation_key_encoding", "payload_versions",
                     "winner_signal_id", "fired_at", "late_ms", "created_at", "updated_at"],
        "properties": {
            "id": ID, "step": {"type": ["string", "null"]}, "step_id": ID,
            "activation_id": ID,
            "activation_sequence": {"type": ["integer", "null"], "minimum": 1},
            "kind": {"enum": ["TIMER", "SIGNAL"]},
            "state": {"enum": ["WAITING", "FIRED", "SIGNALLED", "TIMED_OUT", "CANCELLED"]},
            "generation": {"type": "integer", "minimum": 1},
            "first_deadline_at": {**nullable(TIME),
                                  "description": "TIMER: the due time; SIGNAL: the first "
                                                 "timeout (null without one); never moves"},
            "deadline_at": {**nullable(TIME),
                            "description": "The current generation's deadline"},
            "signal_name": {"type": ["string", "null"]},
            "correlation_key": {"type": ["string", "null"],
                                "description": "Exact bytes: UTF-8 text, or base64 when they "
                                               "are not UTF-8 (correlation_key_encoding)"},
            "correlation_key_encoding": {"enum": ["utf8", "base64", None]},
            "payload_versions": {"type": ["array", "null"],
                                 "items": {"type": "integer", "minimum": 1}},
            "winner_signal_id": nullable(ID),
            "fired_at": {**nullable(TIME),
                         "description": "Database time the wait was satisfied or timed out"},
            "late_ms": {"type": ["integer", "null"], "minimum": 0,
                        "description": "How late it fired past its deadline (a timer whose "
                                       "engine was down fires late and says so)"},
            "created_at": TIME, "updated_at": TIME,
        },
    },
    "WorkflowWaitList": {
        "type": "object", "required": ["items"],
        "properties": {"items": {"type": "array", "items": ref("WorkflowWait")}},
    },
    "WorkflowStep": {
        "type": "object",
        "required": ["id", "name", "kind", "state", "revision", "activation_count",
                     "current_activation", "activations"],
        "properties": {
            "id": ID, "name": {"type": "string"},
            "workflow_id": {**ID, "description": "In the answers of step recovery (retry, "
                                                 "resolve): the instance"},
            "kind": {"enum": ["ROOT", "TASK", "CHOICE", "PARALLEL", "SUCCEED", "FAIL", "TIMER",
                              "SIGNAL", "POLL"]},
            "state": {"enum": ["PENDING", "RUNNING", "WAITING", "SUCCEEDED", "FAILED",
                               "CANCELLED", "SKIPPED"]},
            "revision": {"type": "integer", "minimum": 1}, "output": _JSON_ANY,
            "error": _JSON_ANY, "created_at": TIME, "updated_at": TIME,
            "held_at": {**nullable(TIME),
                        "description": "Set while the step is held ($hold): WAITING, its "
                                       "activation LIVE, until a person decides (retry, "
                                       "resolve)"},
            "held_error": {**_JSON_ANY,
                           "description": "While held: the error the step would have "
                                          "propagated"},
            "resolution": {**_JSON_ANY,
                           "description": "The logical conclusion an operator recorded "
                                          "(resolve): conclusion, output or error, reason, "
                                          "evidence_ref, actor, at"},
            "activation_count": {"type": "integer", "minimum": 0,
                                 "description": "Activations the step has had"},
            "current_activation": {"type": ["integer", "null"], "minimum": 1,
                                   "description": "Sequence of the current (newest) "
                                                  "activation; null before the first"},
            "activations": {"type": "array", "items": ref("WorkflowActivation"),
                            "description": "The current activation; every one with "
                                           "?activations=all"},
            "waits": {"type": "array", "items": ref("WorkflowWait"),
                      "description": "In GET of one instance: the step's waits (TIMER and "
                                     "SIGNAL steps; empty for others)"},
            "poll": {**nullable(ref("WorkflowPollState")),
                     "description": "POLL steps in GET of one instance: the bounded query"},
        },
    },
    "WorkflowPollState": {
        "type": "object",
        "required": ["state", "used_rounds", "max_rounds", "granted_rounds", "next_interval_ms",
                     "next_round_at", "deadline_at", "continued_deadline_at", "first_round",
                     "first_round_attempts_used", "activation_id"],
        "properties": {
            "state": {"enum": ["ROUND", "WAITING", "SATISFIED", "EXHAUSTED", "FAILED",
                               "CANCELLED"]},
            "used_rounds": {"type": "integer", "minimum": 0},
            "max_rounds": {"type": "integer", "minimum": 1},
            "next_interval_ms": {"type": "integer", "minimum": 1},
            "next_round_at": {**nullable(TIME), "description": "Set while WAITING"},
            "deadline_at": {**nullable(TIME),
                            "description": "The query's absolute deadline, fixed when the step "
                                           "started; null without query_deadline_ms"},
            "granted_rounds": {"type": "integer", "minimum": 0,
                               "description": "Rounds granted by continues: the query may use "
                                              "max_rounds + granted_rounds"},
            "continued_deadline_at": {**nullable(TIME),
                                      "description": "A continue's new query deadline, in "
                                                     "force instead of deadline_at"},
            "first_round": {"type": "integer", "minimum": 1,
                            "description": "The current activation's first round"},
            "first_round_attempts_used": {"type": "integer", "minimum": 0,
                                          "description": "Attempts that round had used in "
                                                         "older activations"},
            "activation_id": ID,
        },
    },
    "WorkflowPollRound": {
        "type": "object",
        "required": ["round", "activation_id", "task_id", "state", "task_state", "result",
                     "created_at", "ended_at"],
        "properties": {
            "round": {"type": "integer", "minimum": 1}, "activation_id": ID, "task_id": ID,
            "state": {"enum": ["RUNNING", "MET", "NOT_MET", "FAILED", "CANCELLED"]},
            "task_state": nullable({"enum": [s.value for s in TaskState]}),
            "result": {**_JSON_ANY, "description": "The round's task result (succeeded)"},
            "created_at": TIME, "ended_at": nullable(TIME),
        },
    },
    "WorkflowPollRounds": {
        "type": "object", "required": ["workflow_id", "step", "poll", "items", "next_cursor"],
        "properties": {
            "workflow_id": ID, "step": {"type": "string"},
            "poll": ref("WorkflowPollState"),
            "items": {"type": "array", "items": ref("WorkflowPollRound")},
            "next_cursor": {"type": ["string", "null"]},
        },
    },
    "Workflow": {
        "type": "object",
        "required": ["id", "definition", "version", "version_digest", "state", "revision",
                     "paused", "control_revision", "checkpoints", "stop_kind",
                     "stop_requested_at", "cancel_requested_at", "business_key", "input",
                     "output", "error", "created_at", "updated_at", "completed_at"],
        "properties": {
            "id": ID, "definition": NAME, "version": _VERSION,
            "version_digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "state": {"enum": list(instances.STATES)},
            "revision": {"type": "integer", "minimum": 1},
            "paused": {"type": "boolean",
                       "description": "Paused (apart from state): its gate holds its tasks"
                                      " back, its results and due checkpoints are parked"},
            "control_revision": {"type": "integer", "minimum": 1,
                                 "description": "+1 on each pause, resume and cancel"},
            "checkpoints": {"type": "integer", "minimum": 0,
                            "description": "Parked checkpoints the resume replays"},
            "stop_kind": {"enum": ["CANCEL", "FAILURE", None],
                          "description": "The first stop intent, frozen: a user's cancel or "
                                         "a failure settlement; null when none"},
            "stop_requested_at": {**nullable(TIME),
                                  "description": "When the stop intent was recorded"},
            "cancel_requested_at": {**nullable(TIME),
                                    "description": "When a user asked to cancel (also on an "
                                                   "instance stopping for a FAILURE)"},
            "business_key": {"type": ["string", "null"]}, "input": _JSON_ANY,
            "output": _JSON_ANY, "error": _JSON_ANY, "created_at": TIME, "updated_at": TIME,
            "completed_at": nullable(TIME),
            "steps": {"type": "array", "items": ref("WorkflowStep"),
                      "description": "In GET of one instance"},
        },
    },
    "WorkflowEvent": {
        "type": "object",
        "required": ["id", "type", "aggregate_type", "aggregate_id", "aggregate_revision",
                     "from_state", "to_state", "payload", "occurred_at"],
        "properties": {
            "id": ID, "type": {"type": "string", "description": "e.g. workflow.started"},
            "aggregate_type": {"type": "string",
                               "description": "workflow_instance, workflow_signal or "
                                              "workflow_step (a manual recovery)"},
            "aggregate_id": ID, "aggregate_revision": {"type": "integer", "minimum": 1},
            "from_state": {"type": ["string", "null"]}, "to_state": {"type": ["string", "null"]},
            "payload": _JSON_ANY,
            "occurred_at": {**TIME, "description": "Database time of the writing statement"},
        },
    },
    "WorkflowTimelinePage": {
        **_PAGE,
        "properties": {"items": {"type": "array", "items": ref("WorkflowEvent")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "WorkflowTask": {
        "type": "object",
        "required": ["task_id", "queue", "handler", "state", "retry_of", "created_at",
                     "completed_at", "verified", "step", "step_kind", "activation_id",
                     "activation_sequence", "activation_state", "round"],
        "properties": {
            "task_id": ID, "queue": NAME, "handler": {"type": "string"},
            "state": {"enum": [s.value for s in TaskState],
                      "description": "The task's state now"},
            "retry_of": {**nullable(ID),
                         "description": "The task a step's manual retry replaced"},
            "created_at": TIME, "completed_at": nullable(TIME),
            "verified": {"type": "boolean",
                         "description": "An activation of this instance (directly or through "
                                        "its POLL round) references the task and its step "
                                        "exists; false: the fields below are null"},
            "step": {"type": ["string", "null"]},
            "step_kind": {"enum": ["TASK", "POLL", None]},
            "activation_id": nullable(ID),
            "activation_sequence": {"type": ["integer", "null"], "minimum": 1},
            "activation_state": {"enum": ["LIVE", "SUCCEEDED", "FAILED", "CANCELLED",
                                          "SUPERSEDED", None]},
            "round": {"type": ["integer", "null"], "minimum": 1,
                      "description": "The POLL round whose task it is"},
        },
    },
    "WorkflowTaskPage": {
        **_PAGE,
        "properties": {"items": {"type": "array", "items": ref("WorkflowTask")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
    "WorkflowPage": {
        **_PAGE,
        "properties": {"items": {"type": "array", "items": ref("Workflow")},
                       "next_cursor": {"type": ["string", "null"]}},
    },
}

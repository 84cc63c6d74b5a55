"""Workflow instances: start, get (with steps and activations), list.

Start is one transaction (000 §5 "流程启动"): the idempotency identity (a replay returns the
original receipt, another request under the same key is ``idempotency_conflict``), the pinned
definition version (its scope verified against its digest), the input validated against the
version's input schema, the instance (RUNNING), its own execution gate (``owner_kind =
'WORKFLOW'``), the internal ``$root`` step with its first activation, the ROOT pending advance
the engine leases, and the ``workflow.started`` event and audit record.

Authorization: ``workflows.start`` in the namespace and ``tasks.submit`` on every queue the
version uses (the scope is never a grant by itself: it is checked against the caller's current
grants). Reads need ``workflows.read``; another namespace's instances are not found.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids, jsondoc
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import tasks
from orbit_common.weave import definitions, polls, waits

ROOT_STEP = "$root"
BUSINESS_KEY_MAX_BYTES = 512
INPUT_MAX_BYTES = 1024 * 1024
LIST_MAX = 100
VERSION_MAX = 2**31 - 1  # weave_instances.version is an INT
# An instance's states. The column's CHECK also allows PAUSED, reserved and never written: a
# paused instance is RUNNING with its ``paused`` flag set (docs/api/workflows.md).
STATES = ("RUNNING", "STOPPING", "SUCCEEDED", "FAILED", "CANCELLED")


class InstanceNotFound(errors.NotFound):
    code = "workflow_instance_not_found"
    title = "Workflow instance not found"


class PollStepNotFound(errors.NotFound):
    code = "workflow_step_not_found"
    title = "Workflow step not found"


StepNotFound = PollStepNotFound  # the same problem (workflow_step_not_found) for any step


class DefinitionNotPublished(errors.Conflict):
    code = "definition_not_published"
    title = "The workflow definition has no published version"


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


INSTANCE_COLUMNS = (
    "i.namespace_id, i.id, i.definition_id, i.version, i.version_digest, i.state, i.revision,"
    " i.paused, i.control_revision, i.checkpoints, i.stop_kind, i.stop_requested_at,"
    " i.cancel_requested_at,"
    " i.business_key, i.input, i.output, i.error, i.gate_id, i.created_at, i.updated_at,"
    " i.completed_at, d.name AS definition_name"
)
INSTANCE_FROM = (" FROM weave_instances i STRAIGHT_JOIN weave_definitions d"
                 " ON d.namespace_id = i.namespace_id AND d.id = i.definition_id")


def instance_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(), "definition": row["definition_name"], "version": row["version"],
        "version_digest": row["version_digest"].hex(), "state": row["state"],
        "revision": row["revision"], "paused": bool(row["paused"]),
        "control_revision": row["control_revision"], "checkpoints": row["checkpoints"],
        "stop_kind": row["stop_kind"], "stop_requested_at": _iso(row["stop_requested_at"]),
        "cancel_requested_at": _iso(row["cancel_requested_at"]),
        "business_key": tasks.business_key_text(row["business_key"]),
        "input": jsondoc.RawJson(row["input"]),
        "output": jsondoc.RawJson(row["output"]) if row["output"] is not None else None,
        "error": jsondoc.RawJson(row["error"]) if row["error"] is not None else None,
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
        "completed_at": _iso(row["completed_at"]),
    }


# What the result of an activation's task has become (000 §6.3: "the task has a result" is not
# "orchestration has advanced"), from its newest weave_inbox row: none (no row: the task has not
# ended, or is not linked), recorded (PENDING or LEASED: the engine has not consumed it yet),
# advanced (CONSUMED), quarantined (its links were incomplete; never guessed). A row the engine
# parked while the instance was paused (CONSUMED, outcome ``paused``) is still recorded.
RESULT_STATES = {"PENDING": "recorded", "LEASED": "recorded", "CONSUMED": "advanced",
                 "QUARANTINED": "quarantined"}
RESULTS = ("none", "recorded", "advanced", "quarantined")
PARKED_OUTCOME = "paused"


@attrs.frozen(kw_only=True)
class TaskResult:
    """The state of an activation's task and what its result has become."""

    task_state: str | None
    result: str


def step_view(row: dict[str, Any], activations: list[dict[str, Any]],
              results: dict[bytes, TaskResult] | None = None,
              step_waits: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A step with its activations; with ``results``, each activation with a task also says
    the task's state and what its result has become (``task_state``, ``result``); with
    ``step_waits``, the step's waits (``waits``: TIMER and SIGNAL steps)."""
    def task_fields(task_id: bytes | None) -> dict[str, Any]:
        if results is None:
            return {}
        found = results.get(task_id) if task_id else None
        if found is None:
            return {"task_state": None, "result": "none"}
        return {"task_state": found.task_state, "result": found.result}

    count = row["activation_count"]
    return {
        "id": row["id"].hex(), "name": row["name"], "kind": row["kind"], "state": row["state"],
        "revision": row["revision"], "activation_count": count,
        "current_activation": count or None,
        "output": jsondoc.RawJson(row["output"]) if row["output"] is not None else None,
        "error": jsondoc.RawJson(row["error"]) if row["error"] is not None else None,
        "held_at": _iso(row["held_at"]),
        "held_error": (jsondoc.RawJson(row["held_error"]) if row["held_error"] is not None
                       else None),
        "resolution": (jsondoc.RawJson(row["resolution"]) if row["resolution"] is not None
                       else None),
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
        "activations": [{
            "id": a["id"].hex(), "sequence": a["sequence"], "state": a["state"],
            "task_id": a["task_id"].hex() if a["task_id"] else None,
            "created_at": _iso(a["created_at"]), "ended_at": _iso(a["ended_at"]),
            **task_fields(a["task_id"]),
        } for a in activations],
        **({} if step_waits is None else {"waits": step_waits}),
    }


def _business_key(value: str | None) -> bytes | None:
    if value is None:
        return None
    raw = value.encode() if isinstance(value, str) else None
    if raw is None or not 1 <= len(raw) <= BUSINESS_KEY_MAX_BYTES:
        raise errors.ValidationFailed([{
            "path": "$.business_key",
            "message": f"a string of 1-{BUSINESS_KEY_MAX_BYTES} bytes (UTF-8)"}])
    return raw


async def start_instance(db: Database, principal: credentials.Principal, *, namespace: str,
                         definition: str, input_json: bytes, version: int | None = None,
                         business_key: str | None = None, idempotency_key: str | None = None,
                         request_id: str | None = None) -> Replay:
    """Start an instance of ``definition`` (its latest version unless ``version``); 201 with
    the receipt (the instance)."""
    problems: list[dict[str, str]] = []
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 1):
        problems.append({"path": "$.version", "message": "an integer ≥ 1"})
    if len(input_json) > INPUT_MAX_BYTES:
        problems.append({"path": "$.input", "message": f"at most {INPUT_MAX_BYTES} bytes"})
    if problems:
        raise errors.ValidationFailed(problems)
    key = _business_key(business_key)
    value = jsondoc.loads_strict(input_json)
    input_text = jsondoc.dumps(jsondoc.loads_strict(input_json, keep_number_text=True))
    instance_id, gate_id, root_id, activation_id, advance_id = (ids.new_id() for _ in range(5))
    idem = namespaced.request(
        "workflows.instances.start", idempotency_key, definition.encode(),
        {"definition": definition, "version": version, "input": input_text,
         "business_key": business_key}, principal)

    located: list[tuple[dict[str, Any], definitions.PinnedVersion, dt.datetime]] = []

    async def locate(cur: Any, namespace_id: bytes) -> None:
        """The pinned version, and ``tasks.submit`` on each of its queues: before an idempotent
        replay, so a credential that may not start it gets neither another caller's receipt
        nor a conflict (the version as resolved now: the latest one unless ``version``)."""
        located.clear()
        row, pinned, now = await definitions.pin_by_name(cur, namespace_id, definition, version)
        if pinned is None:
            raise DefinitionNotPublished(f"workflow definition {definition!r} has no version")
        grants = await credentials.recheck_principal(cur, principal)
        for queue in pinned.definition.queues:
            if not authz.allowed(grants, authz.Action.TASKS_SUBMIT.value, namespace, queue):
                raise errors.Forbidden(
                    f"the credential may not tasks.submit in queue {queue!r}, which this"
                    " workflow version's steps use")
        located.append((row, pinned, now))

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        ((row, pinned, now),) = located  # this transaction's locate (and its clock)
        found = pinned.definition.input_problems(value)
        if found:
            raise errors.ValidationFailed(found)
        when = to_db(now)
        await cur.execute(
            "INSERT INTO pulse_execution_gates (namespace_id, id, owner_kind, owner_id, state,"
            " control_revision, created_at, updated_at)"
            " VALUES (%s, %s, 'WORKFLOW', %s, 'OPEN', 1, %s, %s)",
            (namespace_id, gate_id, instance_id, when, when))
        await cur.execute(
            "INSERT INTO weave_instances (namespace_id, id, definition_id, version,"
            " version_digest, state, revision, business_key, input, gate_id,"
            " started_by_credential_id, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, 'RUNNING', 1, %s, %s, %s, %s, %s, %s)",
            (namespace_id, instance_id, row["id"], pinned.version, pinned.digest, key,
             input_text, gate_id, principal.credential_id, when, when))
        await cur.execute(
            "INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state, revision,"
            " activation_count, live_activation_id, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, 'ROOT', 'RUNNING', 1, 1, %s, %s, %s)",
            (namespace_id, instance_id, root_id, ROOT_STEP, activation_id, when, when))
        await cur.execute(
            "INSERT INTO weave_activations (namespace_id, instance_id, step_id, id, sequence,"
            " state, live_step_id, created_at) VALUES (%s, %s, %s, %s, 1, 'LIVE', %s, %s)",
            (namespace_id, instance_id, root_id, activation_id, root_id, when))
        await cur.execute(
            "INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id, kind,"
            " state, due_at, created_at) VALUES (%s, %s, %s, %s, 'ROOT', 'PENDING', %s, %s)",
            (namespace_id, advance_id, instance_id, root_id, when, when))
        payload = {"definition": definition, "version": pinned.version,
                   "digest": pinned.digest.hex(), "business_key": business_key}
        await append_event(cur, namespace_id=namespace_id, aggregate_type="workflow_instance",
                           aggregate_id=instance_id, aggregate_revision=1,
                           event_type="workflow.started", from_state=None, to_state="RUNNING",
                           payload=payload)
        await append_audit(cur, AuditRecord(
            actor=principal.actor, action="workflow.started", resource_type="workflow_instance",
            resource_id=instance_id, resource_revision=1, namespace_id=namespace_id,
            application_id=principal.application_id, after=payload, request_id=request_id))
        # The receipt from what this transaction wrote (the row as _instance would read it).
        view = {"namespace_id": namespace_id, "id": instance_id, "definition_id": row["id"],
                "version": pinned.version, "version_digest": pinned.digest,
                "state": "RUNNING", "revision": 1, "paused": 0, "control_revision": 1,
                "checkpoints": 0, "stop_kind": None, "stop_requested_at": None,
                "cancel_requested_at": None, "business_key": key, "input": input_text,
                "output": None, "error": None, "gate_id": gate_id, "created_at": now,
                "updated_at": now, "completed_at": None, "definition_name": row["name"]}
        return 201, instance_view(view), instance_id

    return await namespaced.run(
        db, "workflows.instances.start", principal=principal,
        action=authz.Action.WORKFLOWS_START, namespace=namespace, idem=idem, act=act,
        locate=locate)


async def _instance(cur: Any, namespace_id: bytes, instance_id: bytes) -> dict[str, Any]:
    await cur.execute(f"SELECT {INSTANCE_COLUMNS}{INSTANCE_FROM}"
                      " WHERE i.namespace_id = %s AND i.id = %s", (namespace_id, instance_id))
    row = await cur.fetchone()
    if row is None:
        raise InstanceNotFound("no such workflow instance in this namespace")
    return dict(row)


async def get_instance(db: Database, principal: credentials.Principal, *, namespace: str,
                       instance_id: str, all_activations: bool = False) -> dict[str, Any]:
    """The instance with its steps, each with its current activation (or, with
    ``all_activations``, every activation in sequence order)."""
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await detail(cur, ns.id, raw_id, all_activations=all_activations)

    return await db.read("workflows.instances.get", body)


async def list_waits(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str) -> list[dict[str, Any]]:
    """Every wait of the instance (TIMER and SIGNAL, ``waits.wait_view``), oldest first; not
    paged: an instance has at most one wait per activation."""
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        await _instance(cur, ns.id, raw_id)
        return await waits.waits_of(cur, ns.id, raw_id)

    return await db.read("workflows.waits.list", body)


# A step's current activation is its newest (sequence = the step's activation_count): a retry
# or re-arm makes a new one and supersedes the old. Parameters: namespace id, instance id.
CURRENT_ACTIVATIONS = (
    "SELECT a.* FROM weave_steps s STRAIGHT_JOIN weave_activations a"
    " ON a.namespace_id = s.namespace_id AND a.instance_id = s.instance_id"
    " AND a.step_id = s.id AND a.sequence = s.activation_count"
    " WHERE s.namespace_id = %s AND s.instance_id = %s")
# Every activation of the instance (historical ones too). Parameters: as CURRENT_ACTIVATIONS.
ALL_ACTIVATIONS = ("SELECT * FROM weave_activations WHERE namespace_id = %s"
                   " AND instance_id = %s ORDER BY step_id, sequence")


async def detail(cur: Any, namespace_id: bytes, instance_id: bytes, *,
                 all_activations: bool = False) -> dict[str, Any]:
    """An instance's view with its steps, each step's current activation (every activation
    with ``all_activations``) and what each shown activation's task result has become
    (:func:`task_results`); ``InstanceNotFound`` when there is none."""
    view = instance_view(await _instance(cur, namespace_id, instance_id))
    await cur.execute("SELECT * FROM weave_steps WHERE namespace_id = %s"
                      " AND instance_id = %s ORDER BY created_at, id", (namespace_id, instance_id))
    steps = [dict(r) for r in await cur.fetchall()]
    await cur.execute(ALL_ACTIVATIONS if all_activations else CURRENT_ACTIVATIONS,
                      (namespace_id, instance_id))
    by_step: dict[bytes, list[dict[str, Any]]] = {}
    task_ids: list[bytes] = []
    for a in await cur.fetchall():
        by_step.setdefault(a["step_id"], []).append(dict(a))
        if a["task_id"] is not None:
            task_ids.append(a["task_id"])
    results = await task_results(cur, namespace_id, task_ids)
    by_wait_step: dict[str, list[dict[str, Any]]] = {}
    for w in await waits.waits_of(cur, namespace_id, instance_id):
        by_wait_step.setdefault(w["step_id"], []).append(w)
    view["steps"] = [step_view(s, by_step.get(s["id"], []), results,
                               by_wait_step.get(s["id"].hex(), [])) for s in steps]
    if any(s["kind"] == "POLL" for s in steps):
        # A POLL step's query: used / max rounds, deadline, next round (polls.state_view).
        queries = await polls.states_of(cur, namespace_id, instance_id)
        for step, shown in zip(steps, view["steps"], strict=True):
            if step["kind"] == "POLL":
                shown["poll"] = queries.get(step["id"])
    return view


ROUNDS_MAX = 100


async def get_rounds(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str, step: str, after: int = 0, limit: int = ROUNDS_MAX
                     ) -> dict[str, Any]:
    """A POLL step's query state and its rounds in order (those after round ``after``, at most
    ``limit``): ``workflow_instance_not_found`` for an instance of another namespace,
    ``workflow_step_not_found`` for a step that is not an entered POLL step."""
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        await _instance(cur, ns.id, raw_id)
        await cur.execute("SELECT id, kind FROM weave_steps WHERE namespace_id = %s"
                          " AND instance_id = %s AND name = %s", (ns.id, raw_id, step))
        row = await cur.fetchone()
        if row is None or row["kind"] != "POLL":
            raise PollStepNotFound("no POLL step of this name has run in this instance")
        query, rounds = await polls.rounds_of(cur, ns.id, raw_id, row["id"], after=after,
                                              limit=limit)
        if query is None:
            raise PollStepNotFound("no POLL step of this name has run in this instance")
        return {"workflow_id": raw_id.hex(), "step": step, "poll": query, "items": rounds}

    return await db.read("workflows.rounds", body)


async def task_results(cur: Any, namespace_id: bytes, task_ids: list[bytes]
                       ) -> dict[bytes, TaskResult]:
    """For each task of ``task_ids`` that exists: its state and what its result has become
    (:data:`RESULT_STATES`, from its newest inbox row by ``ix_weave_inbox_task``)."""
    found: dict[bytes, TaskResult] = {}
    for start in range(0, len(task_ids), RESULTS_CHUNK):
        chunk = task_ids[start:start + RESULTS_CHUNK]
        marks = ", ".join(["%s"] * len(chunk))  # placeholders only; values are parameters
        await cur.execute(f"SELECT id, state FROM pulse_tasks WHERE namespace_id = %s"
                          f" AND id IN ({marks})", (namespace_id, *chunk))
        states = {r["id"]: r["state"] for r in await cur.fetchall()}
        await cur.execute(f"SELECT task_id, state, outcome FROM weave_inbox"
                          f" WHERE namespace_id = %s AND task_id IN ({marks})"
                          f" ORDER BY created_at, id", (namespace_id, *chunk))
        inbox = {r["task_id"]: "recorded" if r["outcome"] == PARKED_OUTCOME
                 else RESULT_STATES[r["state"]] for r in await cur.fetchall()}
        for task_id in chunk:
            if task_id in states or task_id in inbox:
                found[task_id] = TaskResult(task_state=states.get(task_id),
                                            result=inbox.get(task_id, "none"))
    return found


RESULTS_CHUNK = 500


def list_index(*, definition: bool, version: bool, state: bool, key: bool) -> str:
    """The index a combination of list filters reads, newest first from the cursor position
    (each ``(namespace, filter columns…, created_at, id)``; a created range is a range on its
    ``created_at``). A business key is the most selective filter: any combination with one
    reads the key's rows (the other filters check those). A version is only given with its
    definition; with a state too, the version's rows are checked for the state."""
    if key:
        return "ix_weave_instances_business_key"
    if version:
        return "ix_weave_instances_version"
    if definition and state:
        return "ix_weave_instances_definition_state"
    if definition:
        return "ix_weave_instances_definition"
    if state:
        return "ix_weave_instances_state"
    return "ix_weave_instances_created"


def list_query(namespace_id: bytes, *, definition_id: bytes | None, state: str | None,
               key: bytes | None, created_from: dt.datetime | None,
               created_to: dt.datetime | None, position: tuple[dt.datetime, bytes] | None,
               limit: int, version: int | None = None) -> tuple[str, list[Any]]:
    """The list statement, newest first, on the index of :func:`list_index` for its filters,
    read in order from the cursor position. ``version`` needs ``definition_id``."""
    if version is not None and definition_id is None:
        raise ValueError("a version filter needs its definition")
    where: list[str] = ["i.namespace_id = %s"]
    params: list[Any] = [namespace_id]
    for column, value in (("i.definition_id", definition_id), ("i.version", version),
                          ("i.state", state), ("i.business_key", key)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    if created_from is not None:
        where.append("i.created_at >= %s")
        params.append(to_db(cursors.clamp(created_from)))
    if created_to is not None:
        where.append("i.created_at < %s")
        params.append(to_db(cursors.clamp(created_to)))
    if position is not None:
        where.append("(i.created_at < %s OR (i.created_at = %s AND i.id < %s))")
        params += [to_db(position[0]), to_db(position[0]), position[1]]
    index = list_index(definition=definition_id is not None, version=version is not None,
                       state=state is not None, key=key is not None)
    table_from = INSTANCE_FROM.replace(" i ", f" i FORCE INDEX ({index}) ", 1)
    sql = (f"SELECT {INSTANCE_COLUMNS}{table_from} WHERE {' AND '.join(where)}"
           " ORDER BY i.created_at DESC, i.id DESC LIMIT %s")
    return sql, [*params, limit]


async def list_instances(db: Database, principal: credentials.Principal, *, namespace: str,
                         definition: str | None = None, state: str | None = None,
                         business_key: str | None = None,
                         created_from: dt.datetime | None = None,
                         created_to: dt.datetime | None = None, limit: int = LIST_MAX,
                         cursor: str | None = None, version: int | None = None
                         ) -> cursors.Page:
    """Instances newest first, filtered by definition (and its version), state, business key
    (exact bytes) and a created range ``[created_from, created_to)``; a cursor is bound to its
    filter."""
    filters = ListFilters.check(definition=definition, state=state, business_key=business_key,
                                created_from=created_from, created_to=created_to, limit=limit,
                                version=version)
    position = (cursors.time_position(cursors.decode(cursor, "workflow_instances",
                                                     filters.bound()))
                if cursor else None)

    async def body(cur: Any) -> cursors.Page:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await page(cur, ns.id, filters, position)

    return await db.read("workflows.instances.list", body)


@attrs.frozen(kw_only=True)
class ListFilters:
    """The checked filters of an instance list (:meth:`check`)."""

    definition: str | None
    state: str | None
    business_key: str | None
    key: bytes | None
    created_from: dt.datetime | None
    created_to: dt.datetime | None
    limit: int
    version: int | None = None

    @classmethod
    def check(cls, *, definition: str | None, state: str | None, business_key: str | None,
              created_from: dt.datetime | None, created_to: dt.datetime | None,
              limit: int, version: int | None = None) -> ListFilters:
        problems = []
        if version is not None:
            if (isinstance(version, bool) or not isinstance(version, int)
                    or not 1 <= version <= VERSION_MAX):
                problems.append({"path": "version", "message": f"an integer 1-{VERSION_MAX}"})
            elif definition is None:
                problems.append({"path": "version", "message": "needs definition (a version "
                                                               "number is its definition's)"})
        if state is not None and state not in STATES:
            problems.append({"path": "state", "message": f"one of {', '.join(STATES)}"})
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_MAX:
            problems.append({"path": "limit", "message": f"1-{LIST_MAX}"})
        for name, value in (("created_from", created_from), ("created_to", created_to)):
            if value is not None and value.tzinfo is None:
                problems.append({"path": name, "message": "a time with a zone"})
        if problems:
            raise errors.ValidationFailed(problems)
        key = _business_key(business_key) if business_key is not None else None
        return cls(definition=definition, state=state, business_key=business_key, key=key,
                   created_from=created_from, created_to=created_to, limit=limit,
                   version=version)

    def bound(self) -> dict[str, Any]:
        """What a cursor is bound to (the version only when given, so that a cursor issued
        before the version filter existed still fits its filter)."""
        bound: dict[str, Any] = {"definition": self.definition, "state": self.state,
                                 "business_key": self.business_key,
                                 "created_from": (self.created_from.isoformat()
                                                  if self.created_from else None),
                                 "created_to": (self.created_to.isoformat()
                                                if self.created_to else None)}
        if self.version is not None:
            bound["version"] = self.version
        return bound


async def page(cur: Any, namespace_id: bytes, filters: ListFilters,
               position: tuple[dt.datetime, bytes] | None) -> cursors.Page:
    """One page of :func:`list_query` from ``position`` (None: the newest)."""
    definition_id = None
    if filters.definition is not None:
        await cur.execute("SELECT id, name FROM weave_definitions WHERE namespace_id = %s"
                          " AND name = %s", (namespace_id, filters.definition))
        found = await cur.fetchone()
        if found is None or found["name"] != filters.definition:
            return cursors.Page(items=[], next_cursor=None)
        definition_id = found["id"]
    sql, params = list_query(namespace_id, definition_id=definition_id, state=filters.state,
                             key=filters.key, created_from=filters.created_from,
                             created_to=filters.created_to, position=position,
                             limit=filters.limit + 1, version=filters.version)
    await cur.execute(sql, params)
    rows = [dict(r) for r in await cur.fetchall()]
    more = len(rows) > filters.limit
    rows = rows[:filters.limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = cursors.encode("workflow_instances", filters.bound(), [
            as_utc(last["created_at"]).isoformat(), last["id"].hex()])
    return cursors.Page(items=[instance_view(r) for r in rows], next_cursor=next_cursor)

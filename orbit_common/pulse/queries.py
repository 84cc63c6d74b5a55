"""Task queries: the list with filters and cursors, a task's detail, its direct source, attempts,
events and late evidence.

Authorization
    Every read re-checks the credential in its own transaction (``tasks.read`` in the
    namespace) and then the task's queue: a task in another namespace, or in a queue the
    credential may not read, is ``task_not_found`` -- the same answer as a task that does not
    exist, so nothing leaks. A queue filter naming a queue the credential may not read is
    ``queue_not_found``. Without a queue filter, rows of unreadable queues are skipped.

Indexes
    Every filter combination of the list reads one index in ``(created_at, id)`` order, newest
    first, with no sort (``tests/schema/test_explain_tasks.py`` checks all eight):

    ===================  =====================================
    filters               index
    ===================  =====================================
    none                  ix_tasks_created
    queue                 ix_tasks_queue_created
    state                 ix_tasks_state_created
    queue + state         ix_tasks_queue_state_created
    business_key (+ any)  ix_tasks_business_key (queue and state checked on its few rows)
    ===================  =====================================

    The index is forced: for ``ORDER BY … LIMIT`` the optimizer's choice flips with statistics,
    and a flip to the claim index would sort the whole queue.

Cursors
    Opaque (:mod:`orbit_common.model.cursors`), bound to the normalised filters; the position is
    the last row's ``(created_at, id)`` (``(occurred_at, id)``, ``(received_at, id)``, the
    generation for the other lists). The first page starts at ``created_before`` (exclusive), so
    one keyset condition covers both.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids, jsondoc, names
from orbit_common.platform import authz
from orbit_common.platform import credentials as creds
from orbit_common.platform.namespaces import Namespace, find_namespace
from orbit_common.pulse.model import AttemptState, Task, TaskState
from orbit_common.pulse.tasks import (
    BUSINESS_KEY_MAX_BYTES,
    authorize,
    iso,
    may,
    parse_rfc3339,
    queues_by_name,
    receipt_view,
)

PAGE_MAX = 500
PAGE_DEFAULT = 100
SCAN_ROUNDS = 10  # pages of rows read per request when rows of unreadable queues are skipped
READ = authz.Action.TASKS_READ
# DATETIME(6) bounds: filters beyond them are clamped (the column cannot hold other values).
TIME_MIN, TIME_MAX = cursors.TIME_MIN, cursors.TIME_MAX
ID_MIN = bytes(16)
ID_MAX = b"\xff" * 16


def parse_id(text: str, name: str) -> bytes:
    """A public id from a path or query; anything but 32 lowercase hex is a 400."""
    try:
        return ids.from_hex(text)
    except ValueError as exc:
        raise errors.ValidationFailed([{"path": name, "message": str(exc)}]) from exc


def _opt_iso(value: dt.datetime | None) -> str | None:
    return None if value is None else iso(value)


def _exact(text: str | None) -> Any:
    """A stored JSON document, numbers kept as written (render with jsondoc.dumps)."""
    return None if text is None else jsondoc.loads_strict(text, keep_number_text=True)


# --- the list -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ListFilter:
    queue: str | None = None
    state: TaskState | None = None
    business_key: bytes | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None

    @classmethod
    def parse(cls, params: dict[str, str]) -> ListFilter:
        """From query parameters (already checked for unknown and repeated names)."""
        problems = []
        queue = params.get("queue")
        if queue is not None and not names.is_valid_name(queue):
            problems.append({"path": "?queue", "message": names.NAME_RULE})
        state = None
        if "state" in params:
            try:
                state = TaskState(params["state"])
            except ValueError:
                problems.append({"path": "?state",
                                 "message": "one of " + ", ".join(s.value for s in TaskState)})
        business_key = None
        if "business_key" in params:
            business_key = params["business_key"].encode("utf-8", errors="surrogateescape")
            if not 1 <= len(business_key) <= BUSINESS_KEY_MAX_BYTES:
                problems.append({"path": "?business_key",
                                 "message": f"1-{BUSINESS_KEY_MAX_BYTES} bytes of UTF-8"})
        bounds: dict[str, dt.datetime | None] = {}
        for name in ("created_after", "created_before"):
            bounds[name] = None
            if name in params:
                try:
                    bounds[name] = parse_rfc3339(params[name])
                except ValueError as exc:
                    problems.append({"path": f"?{name}",
                                     "message": f"{exc} (write '+' as %2B in a URL)"})
        if problems:
            raise errors.ValidationFailed(problems)
        return cls(queue=queue, state=state, business_key=business_key,
                   created_after=bounds["created_after"], created_before=bounds["created_before"])

    def normalised(self) -> dict[str, Any]:
        """What a cursor is bound to."""
        return {
            "queue": self.queue,
            "state": None if self.state is None else self.state.value,
            "business_key": None if self.business_key is None else self.business_key.hex(),
            "created_after": _opt_iso(self.created_after),
            "created_before": _opt_iso(self.created_before),
        }


SUMMARY_COLUMNS = (
    "t.id, t.handler, t.state, t.revision, t.priority, t.available_at, t.business_key,"
    " t.concurrency_key, t.deadline_at, t.start_deadline_at, t.rerun_safe, t.attempts_used,"
    " t.starts_used, t.offer_lapses, t.effect_uncertain,"
    " t.outcome_reason, t.cancel_requested_at, t.created_at, t.updated_at, t.completed_at,"
    " q.name AS queue_name"
)


def _list_sql(*, queue: bool, state: bool, business_key: bool) -> str:
    """The list query for one filter combination; only fixed fragments, never values.

    Parameters: namespace id, [queue id], [state], [business key], created_after, position
    created_at (twice), position id, limit.
    """
    if business_key:
        index = "ix_tasks_business_key"
    elif queue and state:
        index = "ix_tasks_queue_state_created"
    elif queue:
        index = "ix_tasks_queue_created"
    elif state:
        index = "ix_tasks_state_created"
    else:
        index = "ix_tasks_created"
    where = ["t.namespace_id = %s"]
    where += ["t.queue_id = %s"] if queue else []
    where += ["t.state = %s"] if state else []
    where += ["t.business_key = %s"] if business_key else []
    # STRAIGHT_JOIN: the tasks drive, in index order; the queue row is read by primary key
    # (forced: the covering uq_queues_name would scan every queue of the namespace per task).
    return (
        f"SELECT STRAIGHT_JOIN {SUMMARY_COLUMNS}\n"
        f"FROM pulse_tasks t FORCE INDEX ({index})\n"
        "JOIN pulse_queues q FORCE INDEX (PRIMARY)\n"
        "  ON q.namespace_id = t.namespace_id AND q.id = t.queue_id\n"
        f"WHERE {' AND '.join(where)}\n"
        "  AND t.created_at >= %s\n"
        "  AND (t.created_at < %s OR (t.created_at = %s AND t.id < %s))\n"
        "ORDER BY t.created_at DESC, t.id DESC\n"
        "LIMIT %s"
    )


# (queue, state, business_key) given → the statement. Built once, from fixed fragments.
LIST_SQL: dict[tuple[bool, bool, bool], str] = {
    (q, s, b): _list_sql(queue=q, state=s, business_key=b)
    for q in (False, True) for s in (False, True) for b in (False, True)
}


def summary_view(row: dict[str, Any]) -> dict[str, Any]:
    """A list item: the receipt plus where the task stands now."""
    view = receipt_view(
        task_id=row["id"], queue=row["queue_name"], handler=row["handler"],
        state=TaskState(row["state"]), priority=row["priority"],
        business_key=row["business_key"], created_at=as_utc(row["created_at"]),
        available_at=as_utc(row["available_at"]),
        deadline_at=as_utc(row["deadline_at"]) if row["deadline_at"] else None,
        start_deadline_at=as_utc(row["start_deadline_at"]) if row["start_deadline_at"] else None,
        rerun_safe=bool(row["rerun_safe"]), revision=row["revision"],
        concurrency_key=row["concurrency_key"],
    )
    view.update({
        "attempts_used": row["attempts_used"],
        "starts_used": row["starts_used"],
        "offer_lapses": row["offer_lapses"],
        "effect_uncertain": bool(row["effect_uncertain"]),
        "outcome_reason": row["outcome_reason"],
        "cancel_requested_at": _opt_iso(_opt_utc(row["cancel_requested_at"])),
        "updated_at": iso(as_utc(row["updated_at"])),
        "completed_at": _opt_iso(_opt_utc(row["completed_at"])),
    })
    return view


def _opt_utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else as_utc(value)


Page = cursors.Page
_time_position = cursors.time_position
_clamp = cursors.clamp


def _time_cursor(kind: str, filters: dict[str, Any], at: dt.datetime, row_id: bytes) -> str:
    return cursors.encode(kind, filters, [iso(at), row_id.hex()])


async def list_tasks(
    db: Database, principal: creds.Principal, *, namespace: str, filters: ListFilter,
    limit: int, cursor: str | None,
) -> Page:
    """Tasks newest first by ``(created_at, id)``; see the module docstring."""
    bound = filters.normalised()
    if cursor is not None:
        position = _time_position(cursors.decode(cursor, "tasks", bound))
    else:
        position = (_clamp(filters.created_before) if filters.created_before else TIME_MAX,
                     ID_MIN if filters.created_before else ID_MAX)
    after = _clamp(filters.created_after) if filters.created_after else TIME_MIN
    sql = LIST_SQL[(filters.queue is not None, filters.state is not None,
                    filters.business_key is not None)]

    async def body(cur: Any) -> Page:
        ns, grants = await authorize(cur, principal, READ, namespace)
        head: list[Any] = [ns.id]
        if filters.queue is not None:
            queues = await queues_by_name(cur, ns.id, [filters.queue])
            if filters.queue not in queues or not may(grants, READ, ns.name, filters.queue):
                raise errors.QueueNotFound(
                    f"no queue {filters.queue!r} in {ns.name!r} for this credential"
                )
            head.append(queues[filters.queue].id)
        if filters.state is not None:
            head.append(filters.state.value)
        if filters.business_key is not None:
            head.append(filters.business_key)
        items: list[dict[str, Any]] = []
        at, last_id = position
        for _ in range(SCAN_ROUNDS):
            await cur.execute(sql, (*head, to_db(after), to_db(at), to_db(at), last_id, limit))
            rows = await cur.fetchall()
            for row in rows:
                at, last_id = as_utc(row["created_at"]), row["id"]
                if may(grants, READ, ns.name, row["queue_name"]):
                    items.append(summary_view(row))
                    if len(items) == limit:
                        return Page(items=items,
                                    next_cursor=_time_cursor("tasks", bound, at, last_id))
            if len(rows) < limit:
                return Page(items=items, next_cursor=None)
        # Many rows of unreadable queues in a row: hand back what we have and where we stopped.
        return Page(items=items, next_cursor=_time_cursor("tasks", bound, at, last_id))

    return await db.read("tasks.list", body)


# --- one task -----------------------------------------------------------------------------------

SELECT_TASK = f"""
SELECT {Task.COLUMNS}, q.name AS queue_name
FROM pulse_tasks t
JOIN pulse_queues q FORCE INDEX (PRIMARY)
  ON q.namespace_id = t.namespace_id AND q.id = t.queue_id
WHERE t.namespace_id = %s AND t.id = %s
"""


async def _readable_task(cur: Any, principal: creds.Principal, namespace: str,
                         task_id: bytes) -> tuple[Namespace, Task, str]:
    """The task, if the credential may read its queue; otherwise task_not_found."""
    ns, grants = await authorize(cur, principal, READ, namespace)
    await cur.execute(SELECT_TASK, (ns.id, task_id))
    row = await cur.fetchone()
    if row is None or not may(grants, READ, ns.name, row["queue_name"]):
        raise errors.TaskNotFound(f"no task {task_id.hex()} in {ns.name!r} for this credential")
    return ns, Task.from_row(row), row["queue_name"]


def detail_view(task: Task, queue: str) -> dict[str, Any]:
    """Everything about a task (render with jsondoc.dumps: input and result keep their bytes)."""
    view = receipt_view(
        task_id=task.id, queue=queue, handler=task.handler, state=task.state,
        priority=task.priority, business_key=task.business_key, created_at=task.created_at,
        available_at=task.available_at, deadline_at=task.deadline_at,
        start_deadline_at=task.start_deadline_at, rerun_safe=task.rerun_safe,
        revision=task.revision, concurrency_key=task.concurrency_key,
    )
    view.update({
        "input": _exact(task.input),
        "result": _exact(task.result),
        "error": _exact(task.error),
        "effect_uncertain": task.effect_uncertain,
        "outcome_reason": task.outcome_reason,
        "attempts_used": task.attempts_used,
        "starts_used": task.starts_used,
        "offer_lapses": task.offer_lapses,
        "current_attempt_id": None if task.current_attempt_id is None
        else task.current_attempt_id.hex(),
        "lease_expires_at": _opt_iso(task.lease_expires_at),
        "cancel_requested_at": _opt_iso(task.cancel_requested_at),
        "cancel_reason": task.cancel_reason,
        "retry_of": None if task.retry_of is None else task.retry_of.hex(),
        "attempt_timeout_ms": task.attempt_timeout_ms,
        "retry": task.retry.view(),
        "offer_lease_ms": task.offer_lease_ms,
        "execution_lease_ms": task.execution_lease_ms,
        "updated_at": iso(task.updated_at),
        "first_started_at": _opt_iso(task.first_started_at),
        "completed_at": _opt_iso(task.completed_at),
    })
    return view


async def get_task(db: Database, principal: creds.Principal, *, namespace: str,
                   task_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        ns, task, queue = await _readable_task(cur, principal, namespace, task_id)
        return {**detail_view(task, queue), "source": await source_view(cur, ns.id, task)}

    return await db.read("tasks.get", body)


async def operator_task(db: Database, *, namespace: str, task_id: str) -> dict[str, Any]:
    """The task's detail with its source, for an operator (``orbit admin tasks get``): the
    namespace by name, no credential (the operator reads everything)."""
    raw_id = parse_id(task_id, "task_id")

    async def body(cur: Any) -> dict[str, Any]:
        found = await find_namespace(cur, namespace)
        if found is None:
            raise errors.NamespaceNotFound(f"no namespace {namespace!r}")
        await cur.execute(SELECT_TASK, (found.id, raw_id))
        row = await cur.fetchone()
        if row is None:
            raise errors.TaskNotFound(f"no task {raw_id.hex()} in {namespace!r}")
        task = Task.from_row(row)
        return {**detail_view(task, row["queue_name"]),
                "source": await source_view(cur, found.id, task)}

    return await db.read("tasks.operator.get", body)


# --- the direct source ------------------------------------------------------------------------

# The ledger row that made a task (uq_occurrences_task), its schedule (primary key) and that
# version (primary key); the retry parent (primary key). Plain reads in the caller's
# transaction, after the task was found readable.
SELECT_SOURCE_OCCURRENCE = """
SELECT id, schedule_id, version, fire_at, source, outcome
FROM pulse_schedule_occurrences
WHERE namespace_id = %s AND task_id = %s
"""
SELECT_SOURCE_SCHEDULE = """
SELECT s.name, s.queue_id, v.version
FROM pulse_schedules s
LEFT JOIN pulse_schedule_versions v
  ON v.namespace_id = s.namespace_id AND v.schedule_id = s.id AND v.version = %s
WHERE s.namespace_id = %s AND s.id = %s
"""
SELECT_SOURCE_PARENT = "SELECT id FROM pulse_tasks WHERE namespace_id = %s AND id = %s"
# A workflow's task: the activation that references it (uq_weave_activations_task), or whose
# POLL round does (uq_weave_poll_rounds_task: a query's activation names only its current
# round's task, so a current round's task is found both ways, with and without its round), with
# its step, then the owner instance with its definition's name.
SELECT_SOURCE_ACTIVATION = """
SELECT a.instance_id, a.id, a.sequence, s.name AS step, NULL AS round
FROM weave_activations a
LEFT JOIN weave_steps s
  ON s.namespace_id = a.namespace_id AND s.instance_id = a.instance_id AND s.id = a.step_id
WHERE a.namespace_id = %s AND a.task_id = %s
UNION ALL
SELECT a.instance_id, a.id, a.sequence, s.name AS step, r.round
FROM weave_poll_rounds r
JOIN weave_activations a ON a.namespace_id = r.namespace_id AND a.id = r.activation_id
LEFT JOIN weave_steps s
  ON s.namespace_id = a.namespace_id AND s.instance_id = a.instance_id AND s.id = a.step_id
WHERE r.namespace_id = %s AND r.task_id = %s
"""
# The task a workflow task retries (a step's manual retry): it exists and has the same owner.
SELECT_SOURCE_RETRIED = """
SELECT owner_kind, owner_id FROM pulse_tasks WHERE namespace_id = %s AND id = %s
"""
SELECT_SOURCE_INSTANCE = """
SELECT i.version, d.name AS definition
FROM weave_instances i
LEFT JOIN weave_definitions d ON d.namespace_id = i.namespace_id AND d.id = i.definition_id
WHERE i.namespace_id = %s AND i.id = %s
"""


def _missing(task: Task, what: str) -> errors.SourceLinkMissing:
    return errors.SourceLinkMissing(f"task {task.id.hex()}: {what}")


async def source_of(cur: Any, namespace_id: bytes, task: Task) -> dict[str, Any]:
    """The task's direct source, every link verified in the caller's transaction (specification
    001 "任务直接来源视图", 003 "流程任务直接来源"). In order:

    - ``owner_kind = 'WORKFLOW'``: ``{"kind": "workflow", "workflow_id", "definition",
      "version", "step", "activation", "sequence", "round", "retry_of"}``, verified both ways:
      the owner instance exists in the namespace with its definition, and an activation of that
      instance (with its step) references the task -- directly, or through the POLL round whose
      task it is (``round``, else null). ``retry_of`` is the direct parent task when a step's
      manual retry made it (the parent exists with the same owner), else null;
    - ``retry_of`` set: ``{"kind": "retry", "retry_of"}``, the parent task existing in the
      namespace (a retry is the direct child of the task it retries, whoever made that one);
    - ``owner_kind = 'SCHEDULE'``: ``{"kind": "schedule", "schedule_id", "schedule_name",
      "version", "occurrence_id", "fire_at"}``: the ledger row that references the task names
      the owner schedule, which exists, holds that version and fires into the task's queue;
    - neither: ``{"kind": "submitted"}``, after checking that no ledger row references the task
      (a schedule's task that lost its owner is not passed off as a submission).

    Anything that does not hold is :class:`errors.SourceLinkMissing`.
    """
    if task.owner_kind == "WORKFLOW":
        assert task.owner_id is not None  # noqa: S101 - ck_tasks_owner
        return await _workflow_source(cur, namespace_id, task, task.owner_id)
    if task.retry_of is not None:
        await cur.execute(SELECT_SOURCE_PARENT, (namespace_id, task.retry_of))
        if await cur.fetchone() is None:
            raise _missing(task, f"the task it retries ({task.retry_of.hex()}) is gone")
        return {"kind": "retry", "retry_of": task.retry_of.hex()}
    await cur.execute(SELECT_SOURCE_OCCURRENCE, (namespace_id, task.id))
    occurrence = await cur.fetchone()
    if task.owner_kind is None:
        if occurrence is not None:
            raise _missing(task, "a schedule occurrence made it but the task names no owner")
        return {"kind": "submitted"}
    if occurrence is None:
        raise _missing(task, "no schedule occurrence references it")
    if occurrence["schedule_id"] != task.owner_id:
        raise _missing(task, "its schedule occurrence belongs to another schedule")
    await cur.execute(SELECT_SOURCE_SCHEDULE,
                      (occurrence["version"], namespace_id, occurrence["schedule_id"]))
    schedule = await cur.fetchone()
    if schedule is None:
        raise _missing(task, f"its schedule {occurrence['schedule_id'].hex()} is gone")
    if schedule["version"] is None:
        raise _missing(task, f"version {occurrence['version']} of its schedule is gone")
    if schedule["queue_id"] != task.queue_id:
        raise _missing(task, "its schedule fires into another queue")
    return {
        "kind": "schedule", "schedule_id": occurrence["schedule_id"].hex(),
        "schedule_name": schedule["name"], "version": occurrence["version"],
        "occurrence_id": occurrence["id"].hex(), "fire_at": iso(as_utc(occurrence["fire_at"])),
    }


async def _workflow_source(cur: Any, namespace_id: bytes, task: Task, instance_id: bytes
                           ) -> dict[str, Any]:
    await cur.execute(SELECT_SOURCE_INSTANCE, (namespace_id, instance_id))
    instance = await cur.fetchone()
    if instance is None:
        raise _missing(task, f"its workflow instance {instance_id.hex()} is gone")
    if instance["definition"] is None:
        raise _missing(task, "its workflow instance's definition is gone")
    await cur.execute(SELECT_SOURCE_ACTIVATION, (namespace_id, task.id, namespace_id, task.id))
    found = list(await cur.fetchall())
    if not found:
        raise _missing(task, "no workflow activation references it")
    if len({row["id"] for row in found}) > 1:
        raise _missing(task, "two workflow activations reference it")
    # The row through its round, when it has one (a current round's task is found both ways).
    activation = max(found, key=lambda row: row["round"] is not None)
    if activation["instance_id"] != instance_id:
        raise _missing(task, "its workflow activation belongs to another instance")
    if activation["step"] is None:
        raise _missing(task, "its workflow activation's step is gone")
    if task.retry_of is not None:
        await cur.execute(SELECT_SOURCE_RETRIED, (namespace_id, task.retry_of))
        parent = await cur.fetchone()
        if parent is None:
            raise _missing(task, f"the task it retries ({task.retry_of.hex()}) is gone")
        if (parent["owner_kind"], parent["owner_id"]) != ("WORKFLOW", instance_id):
            raise _missing(task, "the task it retries belongs to another owner")
    return {
        "kind": "workflow", "workflow_id": instance_id.hex(),
        "definition": instance["definition"], "version": instance["version"],
        "step": activation["step"], "activation": activation["id"].hex(),
        "sequence": activation["sequence"], "round": activation["round"],
        "retry_of": None if task.retry_of is None else task.retry_of.hex(),
    }


def _claimed(task: Task) -> dict[str, Any]:
    """What the task's own columns say made it, before any link is checked (never more)."""
    if task.owner_kind == "WORKFLOW":
        assert task.owner_id is not None  # noqa: S101 - ck_tasks_owner
        return {"kind": "workflow", "workflow_id": task.owner_id.hex(),
                "retry_of": None if task.retry_of is None else task.retry_of.hex()}
    if task.retry_of is not None:
        return {"kind": "retry", "retry_of": task.retry_of.hex()}
    if task.owner_kind == "SCHEDULE":
        assert task.owner_id is not None  # noqa: S101 - ck_tasks_owner
        return {"kind": "schedule", "schedule_id": task.owner_id.hex()}
    return {"kind": "submitted"}


async def source_view(cur: Any, namespace_id: bytes, task: Task) -> dict[str, Any]:
    """The task's source as its detail shows it: :func:`source_of` with ``verified: true``; a
    link that does not hold is shown, not raised: what the task's own columns claim
    (:func:`_claimed`) with ``verified: false`` and ``problem`` saying which link -- never a
    guessed step or activation."""
    try:
        found = await source_of(cur, namespace_id, task)
    except errors.SourceLinkMissing as exc:
        return {**_claimed(task), "verified": False, "problem": exc.detail}
    return {**found, "verified": True, "problem": None}


async def task_source(db: Database, principal: creds.Principal, *, namespace: str,
                      task_id: bytes) -> dict[str, Any]:
    """``GET …/tasks/{id}/source``: authorized like the task's detail (another namespace's
    task, or one of a queue the credential may not read, is ``task_not_found``)."""
    async def body(cur: Any) -> dict[str, Any]:
        ns, task, _ = await _readable_task(cur, principal, namespace, task_id)
        return await source_of(cur, ns.id, task)

    return await db.read("tasks.source", body)


# --- scans by state ----------------------------------------------------------------------------

# Every task in one state across namespaces, keyset-paged by the time that matters for that
# state: ``available_at`` for the waiting backlog (samplers, due-time reports),
# ``completed_at`` for terminal tasks (retention, completion samplers). EXPLAIN-checked in
# tests/schema/test_explain_events.py against ix_tasks_state_available and
# ix_tasks_state_completed. Parameters: state, position time (twice), position id, limit.
SELECT_BY_STATE_AVAILABLE = """
SELECT namespace_id, id, queue_id, state, available_at
FROM pulse_tasks
WHERE state = %s AND (available_at > %s OR (available_at = %s AND id > %s))
ORDER BY available_at, id
LIMIT %s
"""
SELECT_BY_STATE_COMPLETED = """
SELECT namespace_id, id, queue_id, state, completed_at
FROM pulse_tasks
WHERE state = %s AND (completed_at > %s OR (completed_at = %s AND id > %s))
ORDER BY completed_at, id
LIMIT %s
"""


# --- attempts -----------------------------------------------------------------------------------

# Never token_digest: the lease token's digest stays inside the dispatcher.
SELECT_ATTEMPTS = """
SELECT a.id, a.generation, a.state, a.worker_instance_id, a.worker_session_id, a.offered_at,
       a.started_at, a.lease_expires_at, a.renewals, a.finished_at, a.retryable, a.result,
       a.error, a.concurrency_token
FROM pulse_attempts a
WHERE a.namespace_id = %s AND a.task_id = %s AND a.generation > %s
ORDER BY a.generation
LIMIT %s
"""


def attempt_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(),
        "generation": row["generation"],
        "state": AttemptState(row["state"]).value,
        "worker_instance_id": row["worker_instance_id"].hex(),
        "worker_session_id": row["worker_session_id"].hex(),
        "offered_at": iso(as_utc(row["offered_at"])),
        "started_at": _opt_iso(_opt_utc(row["started_at"])),
        "lease_expires_at": iso(as_utc(row["lease_expires_at"])),
        "renewals": row["renewals"],
        "concurrency_token": row["concurrency_token"],
        "finished_at": _opt_iso(_opt_utc(row["finished_at"])),
        "retryable": None if row["retryable"] is None else bool(row["retryable"]),
        "result": _exact(row["result"]),
        "error": _exact(row["error"]),
    }


async def list_attempts(db: Database, principal: creds.Principal, *, namespace: str,
                        task_id: bytes, limit: int, cursor: str | None) -> Page:
    """A task's attempts by generation."""
    bound = {"task_id": task_id.hex()}
    after = 0
    if cursor is not None:
        position = cursors.decode(cursor, "tasks.attempts", bound)
        if (len(position) != 1 or not isinstance(position[0], int)
                or isinstance(position[0], bool)):
            raise errors.InvalidCursor()
        after = position[0]

    async def body(cur: Any) -> Page:
        ns, _, _ = await _readable_task(cur, principal, namespace, task_id)
        await cur.execute(SELECT_ATTEMPTS, (ns.id, task_id, after, limit))
        rows = await cur.fetchall()
        next_cursor = None
        if len(rows) == limit:
            next_cursor = cursors.encode("tasks.attempts", bound, [rows[-1]["generation"]])
        return Page(items=[attempt_view(r) for r in rows], next_cursor=next_cursor)

    return await db.read("tasks.attempts", body)


# --- state events -------------------------------------------------------------------------------

SELECT_EVENTS = """
SELECT id, aggregate_revision, event_type, from_state, to_state, payload, occurred_at
FROM orbit_events
WHERE namespace_id = %s AND aggregate_type = 'task' AND aggregate_id = %s
  AND (occurred_at > %s OR (occurred_at = %s AND id > %s))
ORDER BY occurred_at, id
LIMIT %s
"""


def event_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(),
        "type": row["event_type"],
        "revision": row["aggregate_revision"],
        "from_state": row["from_state"],
        "to_state": row["to_state"],
        "payload": _exact(row["payload"]),
        "occurred_at": iso(as_utc(row["occurred_at"])),
    }


async def list_events(db: Database, principal: creds.Principal, *, namespace: str,
                      task_id: bytes, limit: int, cursor: str | None) -> Page:
    """A task's state events, oldest first by ``(occurred_at, id)``."""
    bound = {"task_id": task_id.hex()}
    at, last_id = TIME_MIN, ID_MIN
    if cursor is not None:
        at, last_id = _time_position(cursors.decode(cursor, "tasks.events", bound))

    async def body(cur: Any) -> Page:
        ns, _, _ = await _readable_task(cur, principal, namespace, task_id)
        await cur.execute(SELECT_EVENTS, (ns.id, task_id, to_db(at), to_db(at), last_id, limit))
        rows = await cur.fetchall()
        next_cursor = None
        if len(rows) == limit:
            last = rows[-1]
            next_cursor = _time_cursor("tasks.events", bound, as_utc(last["occurred_at"]),
                                       last["id"])
        return Page(items=[event_view(r) for r in rows], next_cursor=next_cursor)

    return await db.read("tasks.events", body)


# --- late evidence ------------------------------------------------------------------------------

SELECT_ATTEMPT_TASK = "SELECT task_id FROM pulse_attempts WHERE namespace_id = %s AND id = %s"
SELECT_EVIDENCE = """
SELECT id, attempt_id, task_id, generation, kind, retryable, payload, rejected_because,
       received_at
FROM pulse_attempt_evidence
WHERE namespace_id = %s AND attempt_id = %s
  AND (received_at > %s OR (received_at = %s AND id > %s))
ORDER BY received_at, id
LIMIT %s
"""


def evidence_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(),
        "attempt_id": row["attempt_id"].hex(),
        "task_id": row["task_id"].hex(),
        "generation": row["generation"],
        "kind": row["kind"],
        "retryable": None if row["retryable"] is None else bool(row["retryable"]),
        "payload": _exact(row["payload"]),
        "rejected_because": row["rejected_because"],
        "received_at": iso(as_utc(row["received_at"])),
    }


async def list_evidence(db: Database, principal: creds.Principal, *, namespace: str,
                        task_id: bytes, attempt_id: bytes, limit: int,
                        cursor: str | None) -> Page:
    """Late reports about one attempt of the task, oldest first by ``(received_at, id)``."""
    bound = {"task_id": task_id.hex(), "attempt_id": attempt_id.hex()}
    at, last_id = TIME_MIN, ID_MIN
    if cursor is not None:
        at, last_id = _time_position(cursors.decode(cursor, "tasks.evidence", bound))

    async def body(cur: Any) -> Page:
        ns, _, _ = await _readable_task(cur, principal, namespace, task_id)
        await cur.execute(SELECT_ATTEMPT_TASK, (ns.id, attempt_id))
        row = await cur.fetchone()
        if row is None or row["task_id"] != task_id:
            raise errors.AttemptNotFound(f"no attempt {attempt_id.hex()} of this task")
        await cur.execute(SELECT_EVIDENCE,
                          (ns.id, attempt_id, to_db(at), to_db(at), last_id, limit))
        rows = await cur.fetchall()
        next_cursor = None
        if len(rows) == limit:
            last = rows[-1]
            next_cursor = _time_cursor("tasks.evidence", bound, as_utc(last["received_at"]),
                                       last["id"])
        return Page(items=[evidence_view(r) for r in rows], next_cursor=next_cursor)

    return await db.read("tasks.evidence", body)

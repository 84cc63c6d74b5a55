"""The workflow engine: leases inbox rows and pending advances, and advances instances
(docs/weave/engine.md; 000 §5 "流程推进" / "内部事件消费", §6.3).

A round (:meth:`Engine.run_once`) leases up to ``batch`` inbox rows and up to ``batch`` due
pending advances in one short transaction (``leasing.py``: ``SKIP LOCKED``, oldest first, then
lapsed leases), then advances each instance that has leased rows in **one transaction per
instance**, in this lock order:

1. the instance row ``FOR UPDATE`` -- it serialises every advance of one instance, whichever
   replica runs it (a PARALLEL join is decided once, on fresh rows);
2. its leased inbox rows, then its leased pending advances, ``FOR UPDATE``; only the rows still
   LEASED by this owner with the ``attempts`` this round leased them at are kept (the fence: a
   lease that lapsed and was leased again belongs to its new holder);
3. the instance's steps and activations (plain reads: after the instance lock they are the
   committed state), the pinned version (verified against its digest, cached per process);
4. the tasks of the activations the advance cancelled (``interventions.request_cancel``: task
   rows in id order, their attempts, then counters), **before**
5. the new tasks (``tasks.insert_generated``: counters and limits as a submission), the steps,
   activations (covered by the instance lock), the cancels of tasks this advance made and
   cancelled itself (rows it inserted, counters it holds), the instance, one
   ``workflow_instance`` event, and the rows CONSUMED / DONE with their outcome.

Each row gets one outcome (``OUTCOMES``), stored on the inbox row: ``advanced`` (the result
moved its step), ``held`` (NEEDS_REVIEW: the step waits, its activation stays LIVE),
``duplicate`` (the activation was already advanced by this very event), ``stale`` (the event's
activation is not the task's current LIVE activation), ``closed_block`` (a FAIL_FAST block
closed its branch), ``instance_ended``, ``rejected`` (see below). Only ``advanced``, ``held``
and ``rejected`` change the instance.

Deterministic refusals inside an advance -- the pinned version no longer verifies, a queue a
step names is gone, a task the step creates is refused (its options, a queue or application
limit) -- never loop: the advance rolls back and a second transaction fails the instance with
``{"error": "task_rejected" | "version_unusable", "cause": ...}``, consuming the rows as
``rejected``. Transient errors (deadlocks, a lost connection) roll back; the rows' leases lapse
and another round leases them again.

The semantics are the reference interpreter's (``interpreter.py``), computed on the instance's
rows: a step's scope is found from the definition (every name is document-wide unique); a
PARALLEL step keeps the outcomes of the branches that reached its join in ``join_state`` while it
is RUNNING; a block is *alive* while every enclosing PARALLEL step is RUNNING. Closing a block
ends the LIVE activations inside it (CANCELLED), and so does the end of the instance; in the same
transaction the engine sends their tasks a cancel intent with the kernel's cancel semantics
(WAITING / LEASED end CANCELLED at once, RUNNING get ``cancel_requested_at``, NEEDS_REVIEW waits
for a person; events say ``"by": "workflow"``). The results of those tasks arrive later through
the inbox like any other and are consumed as ``closed_block`` / ``instance_ended``: kept, never
advanced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform.events import append_event
from orbit_common.pulse import interventions, tasks
from orbit_common.weave import definitions, expressions, leasing, types
from orbit_common.weave.language import (
    ChoiceStep,
    Definition,
    FailStep,
    ParallelStep,
    Step,
    SucceedStep,
    TaskStep,
)

ROOT_STEP = "$root"
ADVANCED = "advanced"
HELD = "held"
DUPLICATE = "duplicate"
STALE = "stale"
CLOSED_BLOCK = "closed_block"
INSTANCE_ENDED = "instance_ended"
REJECTED = "rejected"
# The cancel intents the engine sends (docs/weave/engine.md § 取消意图).
CLOSED_REASON = "workflow block closed"
ENDED_REASON = "workflow instance ended"
CANCELLED_BY = "workflow"
OUTCOMES = (ADVANCED, HELD, DUPLICATE, STALE, CLOSED_BLOCK, INSTANCE_ENDED, REJECTED)
# Not outcomes of a row: this round's lease on it was lost before the advance locked it; the
# advance failed with an error that is not a refusal (it rolled back, the lease will lapse).
FENCED = "fenced"
FAILED_ADVANCE = "error"

EXPRESSION_FAILED = "expression_failed"
RESULT_SHAPE = "result_shape_mismatch"
TASK_FAILED = "task_failed"
TASK_REJECTED = "task_rejected"
VERSION_UNUSABLE = "version_unusable"

# Refusals that running the advance again would repeat.
DETERMINISTIC = (errors.BadRequest, errors.TooManyRequests, errors.NotFound,
                 definitions.VersionScopeMismatch)

log = logging.getLogger(__name__)

Frame = tuple[str, str] | None  # (PARALLEL step, branch) a step runs in; None: the top level


@attrs.frozen(kw_only=True)
class Round:
    """What one :meth:`Engine.run_once` did. ``inbox`` / ``advances``: rows leased;
    ``outcomes``: rows by outcome (and ``fenced``); ``advance_seconds``: each instance
    transaction's duration; ``result_latency_seconds``: for each advanced result, database time
    from the inbox row's creation (the task's ending commit) to the advance."""

    inbox: int
    advances: int
    outcomes: dict[str, int]
    batch: int = 0
    advance_seconds: tuple[float, ...] = ()
    result_latency_seconds: tuple[float, ...] = ()

    @property
    def full(self) -> bool:
        """A lease came back full: more work is probably waiting, run again at once."""
        return self.batch > 0 and (self.inbox >= self.batch or self.advances >= self.batch)


@attrs.frozen(kw_only=True)
class Gauges:
    inbox_backlog: int  # PENDING + LEASED inbox rows
    inbox_oldest_age_s: float  # database time since the oldest of them was written; 0 if none
    advances_due: int  # PENDING and due, or LEASED
    quarantined: int
    instances: dict[str, int]  # by state


@attrs.frozen
class _Model:
    """A parsed version and its scopes."""

    definition: Definition
    frames: Mapping[str, Frame]
    inside: Mapping[str, frozenset[str]]  # PARALLEL step -> every step of its branches


def _model(definition: Definition) -> _Model:
    frames: dict[str, Frame] = {}
    inside: dict[str, frozenset[str]] = {}

    def walk(steps: Mapping[str, Step], frame: Frame) -> set[str]:
        found: set[str] = set()
        for name, step in steps.items():
            frames[name] = frame
            found.add(name)
            if isinstance(step, ParallelStep):
                nested: set[str] = set()
                for branch in step.branches:
                    nested |= walk(branch.steps, (name, branch.name))
                inside[name] = frozenset(nested)
                found |= nested
        return found

    walk(definition.steps, None)
    return _Model(definition=definition, frames=frames, inside=inside)


class _Rejected(errors.OrbitError):
    """A deterministic refusal inside an advance. Internal: an OrbitError only so that the
    transaction runner re-raises it as it is; it never reaches an API (no code of its own)."""

    def __init__(self, reason: str, cause: str) -> None:
        super().__init__(cause)
        self.reason = reason
        self.cause = cause


@attrs.define
class _Activation:
    id: bytes
    step_id: bytes
    state: str
    task_id: bytes | None
    result_event_id: bytes | None
    new: bool = False
    dirty: bool = False


@attrs.define
class _Step:
    id: bytes
    name: str
    kind: str
    state: str
    output: Any
    error: Any
    join: dict[str, Any] | None
    activation: _Activation | None
    new: bool = False
    dirty: bool = False


@attrs.frozen
class _NewTask:
    item: tasks.Item
    step: str
    activation_id: bytes
    sequence: int


def _text(value: Any) -> Any:
    return None if value is None else jsondoc.loads_strict(value)


def _json(value: Any) -> str | None:
    return None if value is None else jsondoc.dumps(value)


def _live(row: _Step) -> _Activation:
    if row.activation is None:
        raise errors.DatabaseError(f"step {row.name!r} has no activation")
    return row.activation


class _Advance:
    """One instance's advance, computed in memory from its rows, then written."""

    def __init__(self, instance: dict[str, Any], model: _Model | None, steps: list[_Step],
                 task_count: int) -> None:
        """``model`` None: the version cannot be used; only :meth:`fail` may run."""
        self.instance = instance
        self._model = model
        self.steps = {s.name: s for s in steps}
        self.by_activation = {s.activation.id: s for s in steps if s.activation is not None}
        self.state = instance["state"]
        self.output: Any = None
        self.error: Any = None
        self.changed = False
        self.task_count = task_count
        self.new_tasks: list[_NewTask] = []
        self.completed: list[str] = []
        self.cel_results: dict[str, Any] = {}
        self.input: Any = None
        if model is not None:
            self.input = types.cel_input(model.definition.input_schema,
                                         jsondoc.loads_strict(instance["input"]))
            for s in steps:
                if s.state == "SUCCEEDED" and s.kind in ("TASK", "PARALLEL"):
                    self._remember(s.name, s.output)

    @property
    def model(self) -> _Model:
        if self._model is None:
            raise errors.DatabaseError("an advance without its version")
        return self._model

    @property
    def definition(self) -> Definition:
        return self.model.definition

    @property
    def running(self) -> bool:
        return bool(self.state == "RUNNING")

    # --- the rows ----------------------------------------------------------------------------

    def _remember(self, name: str, result: Any) -> None:
        step = self.definition.all_steps[name]
        schema = step.result_schema if isinstance(step, TaskStep) else None
        self.cel_results[name] = {"result": types.cel_input(schema, result)}

    def _reach(self, step: Step, state: str, *, task_id: bytes | None = None,
               output: Any = None, error: Any = None) -> _Step:
        """The first (and, without loops, only) run of ``step``: its row and activation."""
        if step.name in self.steps:  # uq_weave_steps_name would refuse it anyway
            raise errors.DatabaseError(f"step {step.name!r} reached twice")
        step_id = ids.new_id()
        live = state in ("RUNNING", "WAITING")
        activation = _Activation(id=ids.new_id(), step_id=step_id,
                                 state="LIVE" if live else state, task_id=task_id,
                                 result_event_id=None, new=True)
        row = _Step(id=step_id, name=step.name, kind=step.kind, state=state, output=output,
                    error=error, join={} if isinstance(step, ParallelStep) else None,
                    activation=activation, new=True)
        self.steps[step.name] = row
        self.by_activation[activation.id] = row
        self.changed = True
        return row

    def _end(self, row: _Step, state: str, *, output: Any = None, error: Any = None) -> None:
        """``row`` ends in ``state``; so does its activation if it is LIVE."""
        row.state = state
        row.output = output if state == "SUCCEEDED" else row.output
        row.error = error
        row.dirty = True
        if row.activation is not None and row.activation.state == "LIVE":
            row.activation.state = state
            row.activation.dirty = True
        self.changed = True

    def alive(self, frame: Frame) -> bool:
        while frame is not None:
            block = self.steps.get(frame[0])
            if block is None or block.state != "RUNNING":
                return False
            frame = self.model.frames[frame[0]]
        return True

    def frame(self, name: str) -> Frame:
        return self.model.frames[name]

    # --- the semantics (docs/weave/language.md § 执行语义) -----------------------------------

    def evaluate(self, source: str) -> Any:
        return expressions.evaluate(source, {"input": self.input, "steps": self.cel_results})

    def start(self) -> None:
        root = self.steps[ROOT_STEP]
        self._end(root, "SUCCEEDED")
        self.run_path(self.definition.start)

    def run_path(self, name: str | None) -> None:
        while name is not None:
            step = self.definition.all_steps[name]
            try:
                name = self._pass(step)
            except expressions.ExpressionError as exc:
                failure = {"error": EXPRESSION_FAILED, "cause": exc.message, "step": step.name}
                # Every expression is evaluated before its step's row is made.
                self._reach(step, "FAILED", error=failure)
                if isinstance(step, TaskStep):
                    self.task_failed(step, failure)
                else:
                    self.scope_ended(self.frame(step.name), False, failure)
                return

    def _pass(self, step: Step) -> str | None:
        if isinstance(step, ChoiceStep):
            chosen = self._choose(step)
            self._reach(step, "SUCCEEDED", output={"next": chosen})
            return chosen
        if isinstance(step, TaskStep):
            self._create_task(step)
        elif isinstance(step, ParallelStep):
            block = self._reach(step, "RUNNING")
            frame = self.frame(step.name)
            for branch in step.branches:
                if block.state != "RUNNING" or not self.alive(frame):
                    break
                self.run_path(branch.start)
        elif isinstance(step, SucceedStep):
            value = None if step.output is None else self.evaluate(step.output)
            self._reach(step, "SUCCEEDED", output=value)
            self.scope_ended(self.frame(step.name), True, value)
        else:
            self._fail_step(step)
        return None

    def _fail_step(self, step: FailStep) -> None:
        cause = None if step.cause is None else self.evaluate(step.cause)
        failure = {"error": step.error, "cause": cause, "step": step.name}
        self._reach(step, "FAILED", error=failure)
        self.scope_ended(self.frame(step.name), False, failure)

    def _choose(self, step: ChoiceStep) -> str:
        for choice in step.choices:
            holds = self.evaluate(choice.when)
            if not isinstance(holds, bool):
                raise expressions.ExpressionError("the condition is not a bool")
            if holds:
                return choice.next
        return step.default

    def _create_task(self, step: TaskStep) -> None:
        task_input = {} if step.input is None else self.evaluate(step.input)
        if not isinstance(task_input, dict):
            raise expressions.ExpressionError("the task input is not an object")
        options = step.options
        spec = tasks.TaskSpec(
            queue=step.queue, handler=step.handler, input=task_input, delay_ms=None,
            not_before=None, priority=options.priority, business_key=None,
            deadline_ms=options.deadline_ms, start_deadline_ms=options.start_deadline_ms,
            attempt_timeout_ms=options.attempt_timeout_ms, retry=options.retry,
            rerun_safe=options.rerun_safe, offer_lease_ms=options.offer_lease_ms,
            execution_lease_ms=options.execution_lease_ms,
            concurrency_key=options.concurrency_key)
        item = tasks.Item(spec=spec, path=step.path, owner_kind="WORKFLOW",
                          owner_id=self.instance["id"],
                          workflow_gate_id=self.instance["gate_id"])
        row = self._reach(step, "RUNNING", task_id=item.task_id)
        activation = _live(row)
        self.task_count += 1
        self.new_tasks.append(_NewTask(item=item, step=step.name,
                                       activation_id=activation.id,
                                       sequence=self.task_count))

    def _complete(self, row: _Step, result: Any) -> None:
        self._end(row, "SUCCEEDED", output=result)
        self._remember(row.name, result)
        self.completed.append(row.name)

    def task_succeeded(self, step: TaskStep, row: _Step, result: Any) -> None:
        if step.result_schema is not None:
            found: list[dict[str, str]] = []
            types.value_problems(step.result_schema, result, "$.result", found)
            if found:
                failure = {"error": RESULT_SHAPE,
                           "cause": f"{found[0]['path']}: {found[0]['message']}",
                           "step": step.name}
                self._end(row, "FAILED", error=failure)
                self.task_failed(step, failure)
                return
        self._complete(row, result)
        self.run_path(step.next)

    def task_failed(self, step: TaskStep | ParallelStep, error: Any) -> None:
        """``step`` failed (its row already FAILED): its failure transition, else its scope
        ends with the error."""
        if isinstance(error, dict) and "step" not in error:
            error = {**error, "step": step.name}
        row = self.steps[step.name]
        if row.state != "FAILED":
            self._end(row, "FAILED", error=error)
        if step.on_failure is not None:
            self.run_path(step.on_failure)
        else:
            self.scope_ended(self.frame(step.name), False, error)

    def scope_ended(self, frame: Frame, ok: bool, value: Any) -> None:
        if frame is None:
            self._end_instance(ok, value)
            return
        block_name, branch = frame
        block = self.steps[block_name]
        if block.state != "RUNNING":
            return
        step = self.definition.all_steps[block_name]
        if block.join is None or not isinstance(step, ParallelStep):
            raise errors.DatabaseError(f"step {block_name!r} is not a running PARALLEL block")
        block.join[branch] = {"ok": ok, "value": value}
        block.dirty = True
        if not ok and step.policy == "FAIL_FAST":
            self._close(block, "FAILED", error=value)
            self.task_failed(step, value)
            return
        if len(block.join) < len(step.branches):
            return
        for b in step.branches:
            outcome = block.join[b.name]
            if not outcome["ok"]:
                self._close(block, "FAILED", error=outcome["value"])
                self.task_failed(step, outcome["value"])
                return
        result = {b.name: block.join[b.name]["value"] for b in step.branches}
        self._close(block, "SUCCEEDED", output=result)
        self._remember(block.name, result)
        self.completed.append(block.name)
        self.run_path(step.next)

    def _close(self, block: _Step, state: str, *, output: Any = None, error: Any = None) -> None:
        """The block's join is decided: its step ends and what still runs inside is cancelled
        (kept, never advanced)."""
        if isinstance(error, dict) and "step" not in error:
            error = {**error, "step": block.name}
        self._end(block, state, output=output, error=error)
        for name in self.model.inside[block.name]:
            row = self.steps.get(name)
            if row is not None and row.state in ("RUNNING", "WAITING"):
                self._end(row, "CANCELLED")

    def _end_instance(self, ok: bool, value: Any) -> None:
        self.state = "SUCCEEDED" if ok else "FAILED"
        if ok:
            self.output = value
        else:
            self.error = value
        self.changed = True
        for row in self.steps.values():
            if row.state in ("RUNNING", "WAITING", "PENDING"):
                self._end(row, "CANCELLED")

    def fail(self, code: str, cause: str) -> None:
        """A deterministic refusal: the instance fails."""
        self._end_instance(False, {"error": code, "cause": cause})

    # --- the events ----------------------------------------------------------------------------

    def consume(self, row: dict[str, Any]) -> str:
        """One inbox row's outcome (and its effect on the rows in memory)."""
        if not self.running:
            return INSTANCE_ENDED
        step = self.by_activation.get(row["activation_id"]) if row["activation_id"] else None
        activation = step.activation if step is not None else None
        if step is None or activation is None:
            return STALE
        if activation.result_event_id == row["source_event_id"]:
            return DUPLICATE
        if activation.task_id != row["task_id"]:
            return STALE
        if activation.state == "CANCELLED" and step.state == "CANCELLED":
            return CLOSED_BLOCK
        if activation.state != "LIVE" or step.kind != "TASK":
            return STALE
        definition_step = self.definition.all_steps.get(step.name)
        if not isinstance(definition_step, TaskStep):
            return STALE
        if not self.alive(self.frame(step.name)):
            return CLOSED_BLOCK
        if row["task_state"] == "NEEDS_REVIEW":
            if step.state != "WAITING":
                step.state = "WAITING"
                step.dirty = True
                self.changed = True
            return HELD
        snapshot = jsondoc.loads_strict(row["snapshot"])
        activation.result_event_id = row["source_event_id"]
        activation.dirty = True
        if row["task_state"] == "SUCCEEDED":
            self.task_succeeded(definition_step, step, snapshot.get("result"))
        else:
            failure = {"error": TASK_FAILED, "cause": snapshot.get("error"),
                       "step": step.name}
            self._end(step, "FAILED", error=failure)
            self.task_failed(definition_step, failure)
        return ADVANCED

    def root(self) -> str:
        if not self.running:
            return INSTANCE_ENDED
        root = self.steps.get(ROOT_STEP)
        if root is None or root.activation is None or root.activation.state != "LIVE":
            return DUPLICATE
        self.start()
        return ADVANCED

    def rows(self) -> Iterator[_Step]:
        return iter(self.steps.values())


# --- SQL ----------------------------------------------------------------------------------------

LOCK_INSTANCE = ("SELECT id, namespace_id, definition_id, version, version_digest, state,"
                 " revision, input, gate_id FROM weave_instances"
                 " WHERE namespace_id = %s AND id = %s FOR UPDATE")
FENCE = ("SELECT * FROM {table} WHERE namespace_id = %s AND id IN ({ids})"
         " ORDER BY created_at, id FOR UPDATE")
STEPS = ("SELECT id, name, kind, state, output, error, join_state FROM weave_steps"
         " WHERE namespace_id = %s AND instance_id = %s")
ACTIVATIONS = ("SELECT id, step_id, state, task_id, result_event_id FROM weave_activations"
               " WHERE namespace_id = %s AND instance_id = %s")
INSERT_STEPS = ("INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state,"
                " revision, activation_count, live_activation_id, output, error, join_state,"
                " created_at, updated_at)")
STEP_ROW = "(%s, %s, %s, %s, %s, %s, 1, 1, %s, %s, %s, %s, %s, %s)"
INSERT_ACTIVATIONS = ("INSERT INTO weave_activations (namespace_id, instance_id, step_id, id,"
                      " sequence, state, live_step_id, task_id, result_event_id, created_at,"
                      " ended_at)")
ACTIVATION_ROW = "(%s, %s, %s, %s, 1, %s, %s, %s, %s, %s, %s)"
UPDATE_STEP = ("UPDATE weave_steps SET state = %s, revision = revision + 1,"
               " live_activation_id = %s, output = %s, error = %s, join_state = %s,"
               " updated_at = %s WHERE namespace_id = %s AND instance_id = %s AND id = %s")
UPDATE_ACTIVATION = ("UPDATE weave_activations SET state = %s, live_step_id = %s,"
                     " result_event_id = %s, ended_at = %s"
                     " WHERE namespace_id = %s AND id = %s")
UPDATE_INSTANCE = ("UPDATE weave_instances SET state = %s, revision = revision + 1,"
                   " output = %s, error = %s, updated_at = %s, completed_at = %s"
                   " WHERE namespace_id = %s AND id = %s")
CONSUME = ("UPDATE weave_inbox SET state = 'CONSUMED', outcome = %s, consumed_at = %s,"
           " lease_owner = NULL, lease_expires_at = NULL"
           " WHERE namespace_id = %s AND id IN ({ids})")
DONE = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s, lease_owner = NULL,"
        " lease_expires_at = NULL WHERE namespace_id = %s AND id IN ({ids})")


async def _fence(cur: Any, table: str, namespace_id: bytes, leased: Sequence[dict[str, Any]],
                 owner: str) -> list[dict[str, Any]]:
    """The rows of ``leased`` this owner still holds, locked, oldest first."""
    if not leased:
        return []
    attempts = {r["id"]: r["attempts"] for r in leased}
    await cur.execute(FENCE.format(table=table, ids=placeholders(len(leased))),
                      (namespace_id, *attempts))
    return [dict(r) for r in await cur.fetchall()
            if r["state"] == "LEASED" and r["lease_owner"] == owner
            and r["attempts"] == attempts[r["id"]]]


async def _load_steps(cur: Any, instance: dict[str, Any]) -> tuple[list[_Step], int]:
    key = (instance["namespace_id"], instance["id"])
    await cur.execute(ACTIVATIONS, key)
    activations: dict[bytes, _Activation] = {}
    tasks_made = 0
    for a in await cur.fetchall():
        if a["task_id"] is not None:
            tasks_made += 1
        # One activation per step in this issue (no loops); the LIVE one, else the last.
        current = activations.get(a["step_id"])
        if current is None or a["state"] == "LIVE":
            activations[a["step_id"]] = _Activation(
                id=a["id"], step_id=a["step_id"], state=a["state"], task_id=a["task_id"],
                result_event_id=a["result_event_id"])
    await cur.execute(STEPS, key)
    steps = [_Step(id=s["id"], name=s["name"], kind=s["kind"], state=s["state"],
                   output=_text(s["output"]), error=_text(s["error"]),
                   join=_text(s["join_state"]), activation=activations.get(s["id"]))
             for s in await cur.fetchall()]
    return steps, tasks_made


def _cancelled_tasks(advance: _Advance) -> tuple[list[bytes], list[bytes]]:
    """The tasks of the activations this advance cancelled: those of activations that were
    LIVE before it, and those it created and cancelled itself (a branch's task made before
    another branch closed the block)."""
    before, made = [], []
    for row in advance.rows():
        activation = row.activation
        if activation is None or activation.task_id is None or activation.state != "CANCELLED":
            continue
        if activation.new:
            made.append(activation.task_id)
        elif activation.dirty:  # only _end changes a loaded activation's state (LIVE -> ...)
            before.append(activation.task_id)
    return before, made


async def _cancel(cur: Any, advance: _Advance, task_ids: Sequence[bytes], now: Any) -> None:
    """Cancel intents for ``task_ids`` (the kernel's cancel semantics, docs/weave/engine.md
    § 取消意图); their results still arrive through the inbox."""
    if not task_ids:
        return
    reason = CLOSED_REASON if advance.running else ENDED_REASON
    await interventions.request_cancel(cur, advance.instance["namespace_id"], task_ids,
                                       reason=reason, now=now, by=CANCELLED_BY)


async def _write(cur: Any, advance: _Advance, now: Any) -> None:
    instance = advance.instance
    ns, instance_id = instance["namespace_id"], instance["id"]
    when = to_db(now)
    cancel_before, cancel_made = _cancelled_tasks(advance)
    # Task rows before the counters: the live tasks' cancels come before the new tasks' insert
    # (whose counters and limits are the shared rows at its end).
    await _cancel(cur, advance, cancel_before, now)
    if advance.new_tasks:
        names = sorted({t.item.spec.queue for t in advance.new_tasks})
        queues = await tasks.queues_by_name(cur, ns, names)
        for name in names:
            if name not in queues:
                raise _Rejected(TASK_REJECTED, f"queue {name!r} does not exist")
        try:
            await tasks.insert_generated(
                cur, ns, [(t.item, queues[t.item.spec.queue]) for t in advance.new_tasks],
                now, [{"workflow": {"instance_id": instance_id.hex(), "step": t.step,
                                    "activation_id": t.activation_id.hex(),
                                    "sequence": t.sequence}} for t in advance.new_tasks])
        except DETERMINISTIC as exc:
            raise _Rejected(TASK_REJECTED, f"{getattr(exc, 'code', 'refused')}: {exc}"
                            ) from exc
    new_steps, new_activations = [], []
    for row in advance.rows():
        activation = row.activation
        live = activation is not None and activation.state == "LIVE"
        join = _json(row.join)
        if row.new:
            new_steps.append((ns, instance_id, row.id, row.name, row.kind, row.state,
                              activation.id if live and activation else None,
                              _json(row.output), _json(row.error), join, when, when))
        elif row.dirty:
            await cur.execute(UPDATE_STEP, (
                row.state, activation.id if live and activation else None, _json(row.output),
                _json(row.error), join, when, ns, instance_id, row.id))
        if activation is None:
            continue
        if activation.new:
            new_activations.append((ns, instance_id, row.id, activation.id, activation.state,
                                    row.id if live else None, activation.task_id,
                                    activation.result_event_id, when, None if live else when))
        elif activation.dirty:
            await cur.execute(UPDATE_ACTIVATION, (
                activation.state, row.id if live else None, activation.result_event_id,
                None if live else when, ns, activation.id))
    if new_steps:
        sql, params = multi_insert(INSERT_STEPS, STEP_ROW, new_steps)
        await cur.execute(sql, params)
    if new_activations:
        sql, params = multi_insert(INSERT_ACTIVATIONS, ACTIVATION_ROW, new_activations)
        await cur.execute(sql, params)
    # Tasks this very advance made and cancelled: rows this transaction inserted (no one else
    # can hold them) whose counters it already holds, cancelled once their activations exist so
    # that their inbox rows link to them.
    await _cancel(cur, advance, cancel_made, now)
    ended = advance.state != "RUNNING"
    await cur.execute(UPDATE_INSTANCE, (
        advance.state, _json(advance.output), _json(advance.error), when,
        when if ended else None, ns, instance_id))
    event_type = {"SUCCEEDED": "workflow.succeeded", "FAILED": "workflow.failed"}.get(
        advance.state, "workflow.advanced")
    await append_event(
        cur, namespace_id=ns, aggregate_type="workflow_instance", aggregate_id=instance_id,
        aggregate_revision=instance["revision"] + 1, event_type=event_type,
        from_state="RUNNING", to_state=advance.state,
        payload={"completed": advance.completed,
                 "tasks": [{"step": t.step, "task_id": t.item.task_id.hex(),
                            "sequence": t.sequence} for t in advance.new_tasks],
                 "waiting": sorted(r.name for r in advance.rows() if r.state == "WAITING"),
                 "output": advance.output, "error": advance.error})


async def _consume(cur: Any, ns: bytes, outcomes: Mapping[bytes, str], done: Sequence[bytes],
                   now: Any) -> None:
    by_outcome: dict[str, list[bytes]] = {}
    for row_id, outcome in outcomes.items():
        by_outcome.setdefault(outcome, []).append(row_id)
    for outcome, row_ids in sorted(by_outcome.items()):
        await cur.execute(CONSUME.format(ids=placeholders(len(row_ids))),
                          (outcome, to_db(now), ns, *row_ids))
    if done:
        await cur.execute(DONE.format(ids=placeholders(len(done))), (to_db(now), ns, *done))


@attrs.frozen
class _Result:
    outcomes: dict[str, int]
    seconds: float
    latencies: tuple[float, ...]


class Engine:
    """One engine replica's work (the daemon ``orbit weave`` runs :meth:`run_once` in a loop)."""

    def __init__(self, db: Database, *, owner: str, lease_ms: int = 30_000,
                 batch: int = 32, concurrency: int = 4) -> None:
        """``concurrency``: instances advanced at once within a round (each its own
        transaction and connection)."""
        if not owner or len(owner) > 128:
            raise ValueError("owner: 1-128 characters")
        self.db = db
        self.owner = owner
        self.lease_ms = lease_ms
        self.batch = batch
        self.concurrency = concurrency
        self._models: dict[tuple[bytes, bytes, int, bytes], _Model] = {}

    async def run_once(self) -> Round:
        async def lease(cur: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            inbox = await leasing.lease_inbox(cur, owner=self.owner, lease_ms=self.lease_ms,
                                              limit=self.batch)
            due = await leasing.lease_advances(cur, owner=self.owner, lease_ms=self.lease_ms,
                                               limit=self.batch)
            return inbox, due

        inbox, due = await self.db.transaction("weave.lease", lease)
        work: dict[tuple[bytes, bytes], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        for row in due:
            work.setdefault((row["namespace_id"], row["instance_id"]), ([], []))[1].append(row)
        for row in sorted(inbox, key=lambda r: (r["created_at"], r["id"])):
            work.setdefault((row["namespace_id"], row["instance_id"]), ([], []))[0].append(row)
        outcomes: dict[str, int] = {}
        seconds: list[float] = []
        latencies: list[float] = []
        slots = asyncio.Semaphore(self.concurrency)

        async def one(ns: bytes, instance_id: bytes, rows: list[dict[str, Any]],
                      advances: list[dict[str, Any]]) -> _Result:
            async with slots:
                try:
                    return await self.advance(ns, instance_id, rows, advances)
                except Exception:
                    # One instance's failure does not hold up the others: its rows' leases
                    # lapse and a later round leases them again.
                    log.exception("advance failed", extra={"instance": instance_id.hex()})
                    return _Result(outcomes={FAILED_ADVANCE: len(rows) + len(advances)},
                                   seconds=0.0, latencies=())

        for result in await asyncio.gather(*(one(ns, instance_id, rows, advances)
                                             for (ns, instance_id), (rows, advances)
                                             in work.items())):
            for outcome, n in result.outcomes.items():
                outcomes[outcome] = outcomes.get(outcome, 0) + n
            seconds.append(result.seconds)
            latencies.extend(result.latencies)
        return Round(inbox=len(inbox), advances=len(due), outcomes=outcomes, batch=self.batch,
                     advance_seconds=tuple(seconds), result_latency_seconds=tuple(latencies))

    async def _version(self, cur: Any, instance: dict[str, Any]) -> _Model:
        key = (instance["namespace_id"], instance["definition_id"], instance["version"],
               instance["version_digest"])
        model = self._models.get(key)
        if model is None:
            pinned = await definitions.load_version(cur, *key[:3])
            if pinned.digest != instance["version_digest"]:
                raise definitions.VersionScopeMismatch(
                    f"version {instance['version']}'s digest is not the instance's")
            model = self._models[key] = _model(pinned.definition)
        return model

    async def advance(self, ns: bytes, instance_id: bytes, inbox: Sequence[dict[str, Any]],
                      advances: Sequence[dict[str, Any]]) -> _Result:
        """Advance one instance with the rows this engine leased (one transaction)."""
        began = time.monotonic()
        latencies: list[float] = []

        async def body(cur: Any) -> dict[str, int]:
            latencies.clear()
            await cur.execute(LOCK_INSTANCE, (ns, instance_id))
            instance = await cur.fetchone()
            rows = await _fence(cur, "weave_inbox", ns, inbox, self.owner)
            due = await _fence(cur, "weave_pending_advances", ns, advances, self.owner)
            counts = {FENCED: len(inbox) + len(advances) - len(rows) - len(due)}
            now = await db_now(cur)
            outcomes: dict[bytes, str] = {}
            outcomes_due: dict[bytes, str] = {r["id"]: INSTANCE_ENDED for r in due}
            if instance is None or instance["state"] != "RUNNING":
                outcomes = {r["id"]: INSTANCE_ENDED if instance else STALE for r in rows}
            elif rows or due:
                instance = dict(instance)
                try:
                    model = await self._version(cur, instance)
                except DETERMINISTIC as exc:
                    raise _Rejected(VERSION_UNUSABLE, str(exc)) from exc
                steps, made = await _load_steps(cur, instance)
                run = _Advance(instance, model, steps, made)
                for row in due:
                    outcomes_due[row["id"]] = run.root()
                for row in rows:
                    outcome = outcomes[row["id"]] = run.consume(row)
                    if outcome == ADVANCED:
                        latencies.append(
                            (now - as_utc(row["created_at"])).total_seconds())
                if run.changed:
                    await _write(cur, run, now)
            await _consume(cur, ns, outcomes, [r["id"] for r in due], now)
            for outcome in (*outcomes.values(), *outcomes_due.values()):
                counts[outcome] = counts.get(outcome, 0) + 1
            return {k: v for k, v in counts.items() if v}

        try:
            counts = await self.db.transaction("weave.advance", body)
        except _Rejected as exc:
            refusal = exc
            counts = await self.db.transaction(
                "weave.reject", lambda cur: self._reject(cur, ns, instance_id, inbox, advances,
                                                         refusal))
            latencies.clear()
        return _Result(outcomes=counts, seconds=time.monotonic() - began,
                       latencies=tuple(latencies))

    async def _reject(self, cur: Any, ns: bytes, instance_id: bytes,  # noqa: PLR0917
                      inbox: Sequence[dict[str, Any]], advances: Sequence[dict[str, Any]],
                      refusal: _Rejected) -> dict[str, int]:
        """The instance fails with the refusal; its rows are consumed as ``rejected``."""
        await cur.execute(LOCK_INSTANCE, (ns, instance_id))
        instance = await cur.fetchone()
        rows = await _fence(cur, "weave_inbox", ns, inbox, self.owner)
        due = await _fence(cur, "weave_pending_advances", ns, advances, self.owner)
        now = await db_now(cur)
        outcome = REJECTED
        if instance is None or instance["state"] != "RUNNING":
            outcome = INSTANCE_ENDED if instance else STALE
        elif rows or due:
            instance = dict(instance)
            steps, made = await _load_steps(cur, instance)
            run = _Advance(instance, None, steps, made)
            run.fail(refusal.reason, refusal.cause)
            await _write(cur, run, now)
        await _consume(cur, ns, {r["id"]: outcome for r in rows}, [r["id"] for r in due], now)
        counts = {outcome: len(rows) + len(due),
                  FENCED: len(inbox) + len(advances) - len(rows) - len(due)}
        return {k: v for k, v in counts.items() if v}


GAUGE_INBOX = ("SELECT COUNT(*) AS n, TIMESTAMPDIFF(MICROSECOND, MIN(created_at),"
               " UTC_TIMESTAMP(6)) AS age_us FROM weave_inbox FORCE INDEX (ix_weave_inbox_scan)"
               " WHERE state IN ('PENDING', 'LEASED')")
GAUGE_QUARANTINED = ("SELECT COUNT(*) AS n FROM weave_inbox FORCE INDEX (ix_weave_inbox_scan)"
                     " WHERE state = 'QUARANTINED'")
GAUGE_ADVANCES = ("SELECT COUNT(*) AS n FROM weave_pending_advances"
                  " FORCE INDEX (ix_weave_advances_due)"
                  " WHERE (state = 'PENDING' AND due_at <= UTC_TIMESTAMP(6)) OR state = 'LEASED'")
GAUGE_INSTANCES = "SELECT state, COUNT(*) AS n FROM weave_instances GROUP BY state"


async def gauges(db: Database) -> Gauges:
    """The engine's backlog and the instances by state, from the database."""
    async def body(cur: Any) -> Gauges:
        await cur.execute(GAUGE_INBOX)
        inbox = await cur.fetchone()
        await cur.execute(GAUGE_QUARANTINED)
        quarantined = (await cur.fetchone())["n"]
        await cur.execute(GAUGE_ADVANCES)
        due = (await cur.fetchone())["n"]
        await cur.execute(GAUGE_INSTANCES)
        by_state = {r["state"]: int(r["n"]) for r in await cur.fetchall()}
        return Gauges(inbox_backlog=int(inbox["n"]),
                      inbox_oldest_age_s=max(0, int(inbox["age_us"] or 0)) / 1e6,
                      advances_due=int(due), quarantined=int(quarantined),
                      instances=by_state)

    return await db.read("weave.gauges", body)

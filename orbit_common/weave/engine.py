"""The workflow engine: leases inbox rows and pending advances, and advances instances
(docs/weave/engine.md; 000 §5 "流程推进" / "内部事件消费", §6.3).

A round (:meth:`Engine.run_once`) leases up to ``batch`` inbox rows and up to ``batch`` due
pending advances in one short transaction (``leasing.py``: ``SKIP LOCKED``, oldest first, then
lapsed leases), then advances the instances that have leased rows: each instance's advance is
whole in **one transaction**, and up to ``per_transaction`` instances of a namespace share it
(each statement then serves all of them: one task insert, one CASE update per table, one event
insert -- a transaction's statement count does not grow with its instances). If that
transaction fails, each of its instances is advanced alone. The lock order:

1. the instance rows ``FOR UPDATE``, in id order -- an instance's row serialises every advance
   of that instance, whichever replica runs it (a PARALLEL join is decided once, on fresh
   rows);
2. its leased inbox rows, then its leased pending advances, ``FOR UPDATE``; only the rows still
   LEASED by this owner with the ``attempts`` this round leased them at are kept (the fence: a
   lease that lapsed and was leased again belongs to its new holder);
3. the instance's steps and activations (plain reads: after the instance lock they are the
   committed state), the pinned version (verified against its digest, cached per process);
4. the tasks of the activations the advance cancelled (``interventions.request_cancel``: task
   rows in id order, their attempts, then counters), **before** the rest;
5. the steps, activations, instances, one ``workflow_instance`` event each, the rows CONSUMED /
   DONE with their outcome, and last the new tasks (``tasks.insert_generated``: counters and
   limits as a submission; the queue and application rows they update are the hot rows every
   finishing task updates too, so they are locked only just before the commit), then the
   cancels of tasks this advance made and cancelled itself (rows it inserted, counters it
   holds).

Each row gets one outcome (``OUTCOMES``), stored on the inbox row: ``advanced`` (the result
moved its step), ``held`` (NEEDS_REVIEW: the step waits, its activation stays LIVE),
``duplicate`` (the activation was already advanced by this very event), ``stale`` (the event's
activation is not the task's current LIVE activation), ``closed_block`` (a FAIL_FAST block
closed its branch), ``instance_ended``, ``rejected`` (see below), ``paused`` (parked),
``stopping`` (the instance is stopping: the result is recorded on its step, never advanced).
Only ``advanced``, ``held``, ``rejected`` and ``stopping`` change the instance. A pending
advance is dispatched by its ``kind`` (``due``): a TIMER row fires its wait (``timers.py``);
one leased before its due time (database time) goes back to PENDING unchanged
(``timers.EARLY``, counted, not an outcome); a RESOLVE row advances a step with the conclusion
an operator recorded (``recovery.py``). A failure or timeout whose transition is ``$hold``
holds its step instead (WAITING, activation LIVE, ``held_at`` and ``held_error``;
docs/weave/recovery.md).

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

The stop (docs/weave/stop.md): a failure that ends the top-level scope records the stop intent
FAILURE (frozen: kind, time, error), closes the instance's gate for good (``STOPPED``), ends
what is not in flight and asks the in-flight tasks (a RUNNING TASK step or POLL round with its
activation LIVE and its task made before this advance) to stop; the instance is STOPPING
until their results are recorded (``stopping``), and the advance that accounts for the last of
them settles it FAILED -- in the same advance when nothing is in flight. A user's cancel
(``stops.py``) records the intent CANCEL and re-arms the ROOT continuation, whose advance runs
the same sweep and settles the instance CANCELLED once nothing is in flight.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform.events import EventRecord, append_events
from orbit_common.pulse import interventions, tasks
from orbit_common.weave import (
    definitions,
    expressions,
    leasing,
    polls,
    signals,
    timers,
    types,
)
from orbit_common.weave.language import (
    HOLD,
    ChoiceStep,
    Definition,
    FailStep,
    ParallelStep,
    PollStep,
    SignalStep,
    Step,
    SucceedStep,
    TaskStep,
    TimerStep,
)

ROOT_STEP = "$root"
ADVANCED = "advanced"
HELD = "held"
DUPLICATE = "duplicate"
STALE = "stale"
CLOSED_BLOCK = "closed_block"
INSTANCE_ENDED = "instance_ended"
REJECTED = "rejected"
# The instance is paused: the row is parked (an inbox row CONSUMED with this outcome, a pending
# advance or a signal moved out of the scans' reach) until the resume replays it (controls.py).
PAUSED = "paused"
# The instance is stopping (docs/weave/stop.md): the result is recorded on its step (a committed
# success stays SUCCEEDED), nothing advances; the last in-flight step's result settles it.
STOPPING = "stopping"
# The cancel intents the engine sends (docs/weave/engine.md § 取消意图).
CLOSED_REASON = "workflow block closed"
ENDED_REASON = "workflow instance ended"
CANCELLED_BY = "workflow"
STOP_REASONS = {"CANCEL": "workflow instance cancelled", "FAILURE": "workflow instance failed"}
OUTCOMES = (ADVANCED, HELD, DUPLICATE, STALE, CLOSED_BLOCK, INSTANCE_ENDED, REJECTED, PAUSED,
            STOPPING)
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
    signals: int = 0  # signals leased (the third work source: signals.py)

    @property
    def full(self) -> bool:
        """A lease came back full: more work is probably waiting, run again at once."""
        return self.batch > 0 and _lease_full(self.inbox, self.advances, self.signals,
                                              self.batch)


def _lease_full(inbox: int, advances: int, sent: int, batch: int) -> bool:
    """Whether a lease of ``batch`` rows a kind (signals: at most REJECT_BATCH) came back full."""
    return inbox >= batch or advances >= batch or sent >= min(batch, signals.REJECT_BATCH)


@attrs.frozen(kw_only=True)
class Leased:
    """The rows one lease transaction took (:meth:`Engine.lease_round`)."""

    inbox: list[dict[str, Any]]
    advances: list[dict[str, Any]]
    signals: list[dict[str, Any]]

    def __bool__(self) -> bool:
        return bool(self.inbox or self.advances or self.signals)

    def full(self, batch: int) -> bool:
        """A lease came back full (as :attr:`Round.full`): more work is probably waiting."""
        return _lease_full(len(self.inbox), len(self.advances), len(self.signals), batch)


@attrs.frozen(kw_only=True)
class Gauges:
    inbox_backlog: int  # PENDING + LEASED inbox rows
    inbox_oldest_age_s: float  # database time since the oldest of them was written; 0 if none
    advances_due: int  # PENDING and due, or LEASED
    quarantined: int
    instances: dict[str, int]  # by state
    signals_pending: int = 0  # PENDING + LEASED signals (no wait yet, backing off, or in hand)
    advances_overdue_s: float = 0.0  # database time since the oldest due PENDING advance was due
    paused: int = 0  # paused instances
    checkpoints: int = 0  # checkpoints parked by paused instances, waiting for the replay


@attrs.frozen
class _Model:
    """A parsed version and its scopes."""

    definition: Definition
    frames: Mapping[str, Frame]
    inside: Mapping[str, frozenset[str]]  # PARALLEL step -> every step of its branches
    task_steps: int  # TASK and POLL steps: at most this many tasks in one advance


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
    return _Model(definition=definition, frames=frames, inside=inside,
                  task_steps=sum(isinstance(step, TaskStep | PollStep)
                                 for step in definition.all_steps.values()))


class _RoundFailed(Exception):
    """A POLL round's result cannot be judged (its shape, its condition): the step fails."""

    def __init__(self, failure: dict[str, Any]) -> None:
        super().__init__(failure["error"])
        self.failure = failure


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
    wait: timers.Wait | None = None  # the WAITING wait of its LIVE activation, or one it made
    held_at: Any = None  # held ($hold): WAITING, activation LIVE, until a person decides
    held_error: Any = None  # the error the step would have propagated
    resolution: Any = None  # an operator's logical conclusion (docs/weave/recovery.md)


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


class TaskIds:
    """The ids of one advance transaction's new tasks: fresh random ids (:func:`ids.new_id`),
    drawn ahead as a sorted pool of ``size`` at the first call (a transaction that makes no
    task draws none) and handed out in increasing order, then (the pool spent) fresh ones
    unsorted.

    The instances of a transaction are advanced in id order and each takes its tasks' ids as it
    creates them, so every instance's new tasks hold one contiguous run of ids. They share one
    ``available_at`` (the transaction's database time), and a claim orders equal times by id
    (``ix_tasks_claim``): a PARALLEL block's branch tasks are then claimed, run and ended
    together, and their results reach the engine in one round instead of one advance per
    branch. The ids stay random; only their assignment is ordered."""

    def __init__(self, size: int) -> None:
        self._size = max(0, size)
        self._pool: list[bytes] | None = None
        self._next = 0

    def __call__(self) -> bytes:
        if self._pool is None:
            self._pool = sorted(ids.new_id() for _ in range(self._size))
        if self._next < len(self._pool):
            self._next += 1
            return self._pool[self._next - 1]
        return ids.new_id()


TASK_IDS_POOL_MAX = 2_000  # ids drawn ahead for one transaction at most


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
        self.task_ids: Callable[[], bytes] = ids.new_id  # the transaction's (TaskIds)
        self.completed: list[str] = []
        self.cel_results: dict[str, Any] = {}
        self.input: Any = None
        self._book: signals.Book | None = None
        self.polls = polls.Book()
        self.now: Any = None  # the advance's database time (set before any step runs)
        self.replayed = False  # this advance replayed the instance's parked checkpoints
        self.held: list[str] = []  # the steps this advance held ($hold)
        # The stop intent (docs/weave/stop.md): frozen once recorded; ``stop_began`` when this
        # advance recorded it (a failure settlement: the engine closes the gate and asks the
        # in-flight tasks to stop); ``closed_now`` the in-flight steps a block closed in this
        # advance (they stay in flight if the instance stops in the same advance).
        self.stop_kind: str | None = instance.get("stop_kind")
        self.stop_requested_at: Any = instance.get("stop_requested_at")
        self.stop_began = False
        self.stop_tasks: list[bytes] = []
        self.closed_now: list[_Step] = []
        if self.stop_kind is not None:
            self.error = _text(instance.get("error"))
        if model is not None:
            self.input = types.cel_input(model.definition.input_schema,
                                         jsondoc.loads_strict(instance["input"]))
            for s in steps:
                if s.state == "SUCCEEDED" and s.kind in ("TASK", "PARALLEL", "TIMER", "SIGNAL",
                                                         "POLL"):
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

    @property
    def stopping(self) -> bool:
        return bool(self.state == "STOPPING")

    # --- the rows ----------------------------------------------------------------------------

    def _remember(self, name: str, result: Any) -> None:
        step = self.definition.all_steps[name]
        schema = step.result_schema if isinstance(step, TaskStep | PollStep) else None
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
        """``row`` ends in ``state``; so does its activation if it is LIVE (a hold ends)."""
        row.state = state
        row.output = output if state == "SUCCEEDED" else row.output
        row.error = error
        row.held_at = row.held_error = None
        row.dirty = True
        if row.activation is not None and row.activation.state == "LIVE":
            row.activation.state = state
            row.activation.dirty = True
        self.changed = True

    def hold(self, row: _Step, error: Any) -> None:
        """The step's failure or timeout transition is ``$hold``: instead of transitioning,
        the step stays WAITING with its activation LIVE, ``held_at`` set and ``held_error``
        the error it would have propagated (docs/weave/recovery.md)."""
        if row.activation is None or row.activation.state != "LIVE":
            raise errors.DatabaseError(f"step {row.name!r} is held without a LIVE activation")
        if self.now is None:
            raise errors.DatabaseError("an advance without its database time")
        row.state = "WAITING"
        row.held_at = self.now
        row.held_error = error
        row.dirty = True
        self.changed = True
        self.held.append(row.name)

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
                if isinstance(step, TaskStep | PollStep) and step.on_failure == HOLD:
                    self.hold(self._reach(step, "WAITING"), failure)
                    return
                self._reach(step, "FAILED", error=failure)
                if isinstance(step, TaskStep | PollStep):
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
        elif isinstance(step, FailStep):
            self._fail_step(step)
        elif isinstance(step, TimerStep):
            self.enter_timer(step)
        elif isinstance(step, SignalStep):
            self.enter_signal(step)
        else:
            self.enter_poll(step)
        return None

    # --- waits (docs/weave/waits.md) ---------------------------------------------------------

    def enter_timer(self, step: TimerStep) -> None:
        """The step WAITING, its wait and its TIMER pending advance (timers.py)."""
        if self.now is None:
            raise errors.DatabaseError("an advance without its database time")
        due = timers.due_at(step, self.now, self.evaluate)
        row = self._reach(step, "WAITING")
        activation = _live(row)
        row.wait = timers.enter(row.id, activation.id, due)

    @property
    def book(self) -> signals.Book:
        """This instance's SIGNAL waits and unresolved signals (loaded by the advance)."""
        if self._book is None:
            raise errors.DatabaseError("an advance without its signals")
        return self._book

    @book.setter
    def book(self, value: signals.Book) -> None:
        self._book = value

    def enter_signal(self, step: SignalStep) -> None:
        """The wait opens (with its timeout's pending advance); the oldest signal of the
        instance that matches it already wins (one sent before its wait existed)."""
        key = signals.correlation_of(
            "" if step.correlation is None else self.evaluate(step.correlation))
        row = self._reach(step, "WAITING")
        wait = self.book.open_wait(row.id, _live(row).id, name=step.signal, key=key,
                                   versions=step.payload_versions, timeout_ms=step.timeout_ms)
        winner = self.book.take(wait)
        if winner is not None:
            self._signalled(step, row, wait, winner)

    def _signalled(self, step: SignalStep, row: _Step, wait: signals.Wait,
                   signal: signals.Signal) -> None:
        self.book.win(wait, signal)
        self._complete(row, signal.result())
        self.run_path(step.next)

    def _wait_open(self, wait: signals.Wait) -> bool:
        row = self.by_activation.get(wait.activation_id)
        return (wait.state == "WAITING" and row is not None and row.state == "WAITING"
                and row.activation is not None and row.activation.state == "LIVE")

    def receive_signal(self, signal: signals.Signal) -> None:
        """A leased signal: it wins the open wait it matches, stays PENDING (backed off) while
        a step that may wait for it is still to come, else it is rejected with why it can never
        win (docs/weave/waits.md § 信号（SIGNAL）)."""
        if signal.resolved:  # won by a wait this advance opened
            return
        if not self.running:
            signal.disposition = signals.INSTANCE_FINISHED
            return
        if signal.expires_at <= self.book.now:
            signal.disposition = signals.EXPIRED
            return
        steps = [s for s in self.definition.all_steps.values()
                 if isinstance(s, SignalStep) and s.signal == signal.name]
        if not steps:
            signal.disposition = signals.UNKNOWN_SIGNAL
            return
        if not any(signal.version in s.payload_versions for s in steps):
            signal.disposition = signals.PAYLOAD_VERSION
            return
        waits = sorted((w for w in self.book.waits.values()
                        if w.name == signal.name and self._wait_open(w)),
                       key=lambda w: (w.created_at, w.id))
        for wait in waits:
            if wait.matches(signal):
                row = self.by_activation[wait.activation_id]
                step = self.definition.all_steps[row.name]
                if not isinstance(step, SignalStep):
                    raise errors.DatabaseError(f"step {row.name!r} is not a SIGNAL step")
                self._signalled(step, row, wait, signal)
                return
        if any(s.name not in self.steps or self._rearmable(s.name) for s in steps):
            self.book.later(signal)
        elif any(w.key == signal.key for w in waits):
            signal.disposition = signals.PAYLOAD_VERSION
        elif waits:
            signal.disposition = signals.CORRELATION_MISMATCH
        else:
            signal.disposition = signals.WAIT_CLOSED

    def _rearmable(self, name: str) -> bool:
        """A SIGNAL step held after its wait timed out (``$hold``): a re-arm may open its wait
        again, so the signals of its name wait for it (docs/weave/recovery.md § 重新等待)."""
        row = self.steps[name]
        return row.kind == "SIGNAL" and row.state == "WAITING" and row.held_at is not None

    def receive_signals(self) -> None:
        """The signals this round leased for the instance, then :meth:`settle_signals`."""
        for signal in self.book.signals:
            if signal.leased:
                self.receive_signal(signal)
        self.settle_signals()

    def settle_signals(self) -> None:
        """Waits whose step this advance ended otherwise (a closed block, the instance's end)
        are CANCELLED and their timeout advance DONE."""
        if self._book is None:
            return
        for wait in self._book.waits.values():
            if wait.state == "WAITING" and not self._wait_open(wait):
                wait.state = "CANCELLED"
                wait.dirty = True
                self._book.done_steps.add(wait.step_id)

    def enter_poll(self, step: PollStep) -> None:
        """Round 1 starts with the step (RUNNING): its task, the poll state (the query
        deadline fixed from now, forever) and the round."""
        now = self.polls.time
        deadline_at = (None if step.query_deadline_ms is None
                       else now + dt.timedelta(milliseconds=step.query_deadline_ms))
        item = self._task_item(step, polls.round_deadline_ms(step.options.deadline_ms,
                                                             step.query_deadline_ms))
        row = self._reach(step, "RUNNING", task_id=item.task_id)
        activation = _live(row)
        polls.entered(self.instance["id"], row.id, activation.id, task_id=item.task_id,
                      max_rounds=step.max_rounds, interval_ms=step.interval_ms,
                      deadline_at=deadline_at, book=self.polls)
        self._add_task(item, step.name, activation.id)

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
        item = self._task_item(step, step.options.deadline_ms)
        row = self._reach(step, "RUNNING", task_id=item.task_id)
        self._add_task(item, step.name, _live(row).id)

    def _task_item(self, step: TaskStep | PollStep, deadline_ms: int | None) -> tasks.Item:
        """The task a TASK step (or a POLL step's round) submits: its input evaluated now,
        its options, ``deadline_ms`` as its deadline."""
        task_input = {} if step.input is None else self.evaluate(step.input)
        if not isinstance(task_input, dict):
            raise expressions.ExpressionError("the task input is not an object")
        options = step.options
        spec = tasks.TaskSpec(
            queue=step.queue, handler=step.handler, input=task_input, delay_ms=None,
            not_before=None, priority=options.priority, business_key=None,
            deadline_ms=deadline_ms, start_deadline_ms=options.start_deadline_ms,
            attempt_timeout_ms=options.attempt_timeout_ms, retry=options.retry,
            rerun_safe=options.rerun_safe, offer_lease_ms=options.offer_lease_ms,
            execution_lease_ms=options.execution_lease_ms,
            concurrency_key=options.concurrency_key)
        return tasks.Item(spec=spec, path=step.path, owner_kind="WORKFLOW",
                          owner_id=self.instance["id"],
                          workflow_gate_id=self.instance["gate_id"], task_id=self.task_ids())

    def _add_task(self, item: tasks.Item, step: str, activation_id: bytes) -> None:
        self.task_count += 1
        self.new_tasks.append(_NewTask(item=item, step=step, activation_id=activation_id,
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
                self.task_failed(step, failure)
                return
        self._complete(row, result)
        self.run_path(step.next)

    def task_failed(self, step: TaskStep | ParallelStep | PollStep, error: Any) -> None:
        """``step`` failed: its row FAILED and its failure transition, else its scope ends
        with the error; a ``$hold`` transition holds the step instead (its row WAITING, its
        activation LIVE)."""
        if isinstance(error, dict) and "step" not in error:
            error = {**error, "step": step.name}
        row = self.steps[step.name]
        if step.on_failure == HOLD and row.state != "FAILED":
            self.hold(row, error)
            return
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
                if self.in_flight(row):
                    self.closed_now.append(row)
                self._end(row, "CANCELLED")

    def _end_instance(self, ok: bool, value: Any) -> None:
        """The top-level scope ended: success ends the instance now (what still runs is
        cancelled); a failure records the stop intent FAILURE (:meth:`stop`)."""
        if not ok:
            self.stop("FAILURE", value)
            return
        self.state = "SUCCEEDED"
        self.output = value
        self.changed = True
        for row in self.steps.values():
            if row.state in ("RUNNING", "WAITING", "PENDING"):
                self._end(row, "CANCELLED")

    def fail(self, code: str, cause: str) -> None:
        """A deterministic refusal: the instance fails (a stopping one settles at once: its
        version is unusable, so nothing more can be recorded)."""
        if self.stopping:
            self._sweep(force=True)
            return
        self._end_instance(False, {"error": code, "cause": cause})

    # --- the stop (docs/weave/stop.md) ---------------------------------------------------------

    def rejected(self, rows: Sequence[dict[str, Any]]) -> None:
        """The results of ``rows`` are consumed as ``rejected``: their steps are not in flight
        any more (they end CANCELLED, as the refused advance never applied them)."""
        for row in rows:
            step = self.by_activation.get(row["activation_id"]) if row["activation_id"] else None
            if (step is not None and self.in_flight(step)
                    and _live(step).task_id == row["task_id"]):
                self._end(step, "CANCELLED")

    def _made(self) -> set[bytes]:
        return {t.item.task_id for t in self.new_tasks}

    def in_flight(self, row: _Step) -> bool:
        """A TASK step, or a POLL round, whose task was made before this advance and whose
        result has not been consumed: its step RUNNING with its activation LIVE. A step
        WAITING for a review, a timer or a signal is not in flight; a task this advance made is
        cancelled before any worker sees it."""
        activation = row.activation
        return (row.kind in ("TASK", "POLL") and row.state == "RUNNING"
                and activation is not None and activation.state == "LIVE"
                and not activation.new and activation.task_id is not None
                and activation.task_id not in self._made())

    def stop(self, kind: str, error: Any) -> None:
        """Record the stop intent (the first one wins: kind, time and error are frozen), go
        STOPPING; what is not in flight ends now, and with nothing in flight the instance
        settles in this advance."""
        if self.stop_kind is None:
            self.stop_kind = kind
            self.stop_requested_at = to_db(self.now)  # naive UTC, as the column stores it
            self.error = error
            self.stop_began = True
        for row in self.closed_now:  # its block closed in this advance; its task still runs
            row.state = "RUNNING"
            row.error = None
            _live(row).state = "LIVE"
        self.closed_now = []
        self.state = "STOPPING"
        self.changed = True
        if self.stop_began:
            self.stop_tasks = sorted(_live(r).task_id or b"" for r in self.steps.values()
                                     if self.in_flight(r))
        self._sweep()

    def _sweep(self, *, force: bool = False) -> None:
        """Every open step that is not in flight ends CANCELLED; with none in flight (or
        ``force``), the instance settles: CANCELLED for a user's cancel, FAILED with the
        frozen error for a failure."""
        for row in self.steps.values():
            if row.state in ("RUNNING", "WAITING", "PENDING") and (
                    force or not self.in_flight(row)):
                self._end(row, "CANCELLED")
        self.changed = True
        if not any(self.in_flight(r) for r in self.steps.values()):
            self.state = "CANCELLED" if self.stop_kind == "CANCEL" else "FAILED"

    def stopping_result(self, row: dict[str, Any]) -> str:
        """A result that arrives while the instance stops: recorded on its step if the step was
        in flight (a success stays SUCCEEDED, never rewritten), never advanced; then the sweep
        (the last in-flight step's result settles the instance)."""
        step = self.by_activation.get(row["activation_id"]) if row["activation_id"] else None
        activation = step.activation if step is not None else None
        if step is None or activation is None:
            return STALE
        if activation.result_event_id == row["source_event_id"]:
            return DUPLICATE
        if activation.task_id != row["task_id"]:
            return STALE
        if self.in_flight(step):
            snapshot = jsondoc.loads_strict(row["snapshot"])
            task_state = row["task_state"]
            if task_state == "NEEDS_REVIEW":  # waits for a person: it does not hold the stop
                self._end(step, "CANCELLED")
            else:
                activation.result_event_id = row["source_event_id"]
                activation.dirty = True
                if step.kind == "POLL":
                    self._stopped_round(row, step, snapshot)
                elif task_state == "SUCCEEDED":
                    self._stopped_success(step, snapshot.get("result"))
                elif task_state == "CANCELLED":
                    self._end(step, "CANCELLED")
                else:
                    self._end(step, "FAILED", error={"error": TASK_FAILED,
                                                     "cause": snapshot.get("error"),
                                                     "step": step.name})
        self._sweep()
        return STOPPING

    def _definition_step(self, name: str) -> Step | None:
        return None if self._model is None else self.definition.all_steps.get(name)

    def _stopped_success(self, row: _Step, result: Any) -> None:
        step = self._definition_step(row.name)
        if isinstance(step, TaskStep) and step.result_schema is not None:
            found: list[dict[str, str]] = []
            types.value_problems(step.result_schema, result, "$.result", found)
            if found:
                self._end(row, "FAILED", error={
                    "error": RESULT_SHAPE, "cause": f"{found[0]['path']}: {found[0]['message']}",
                    "step": row.name})
                return
        self._end(row, "SUCCEEDED", output=result)
        self.completed.append(row.name)

    def _stopped_round(self, row: dict[str, Any], step: _Step, snapshot: Any) -> None:
        """A POLL round's result while stopping: the round is decided; a met condition
        completes the step, anything else ends it (no next round)."""
        state = self.polls.states.get(step.id)
        current = self.polls.rounds.get(row["task_id"])
        definition_step = self._definition_step(step.name)
        if state is None or current is None or current.state != polls.RUNNING:
            self._end(step, "CANCELLED")
            return
        state.dirty = True
        if row["task_state"] != "SUCCEEDED":
            cancelled = row["task_state"] == "CANCELLED"
            polls.end_round(current, polls.CANCELLED if cancelled else polls.FAILED)
            if cancelled:
                self._end(step, "CANCELLED")
            else:
                state.state = polls.FAILED
                self._end(step, "FAILED", error={"error": TASK_FAILED,
                                                 "cause": snapshot.get("error"),
                                                 "step": step.name})
            return
        result = snapshot.get("result")
        state.last_result = result
        try:
            met = isinstance(definition_step, PollStep) and self._until(definition_step, result)
        except _RoundFailed as exc:
            polls.end_round(current, polls.FAILED, result)
            state.state = polls.FAILED
            self._end(step, "FAILED", error=exc.failure)
            return
        polls.end_round(current, polls.MET if met else polls.NOT_MET, result)
        if met:
            state.state = polls.SATISFIED
            self._end(step, "SUCCEEDED", output=result)
            self.completed.append(step.name)
        else:
            self._end(step, "CANCELLED")

    # --- the events ----------------------------------------------------------------------------

    def consume(self, row: dict[str, Any]) -> str:  # noqa: PLR0912 - one guard per outcome
        """One inbox row's outcome (and its effect on the rows in memory)."""
        if self.stopping:
            return self.stopping_result(row)
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
        if activation.state == "LIVE" and step.kind == "POLL":
            return self.poll_result(row, step)
        if activation.state != "LIVE" or step.kind != "TASK":
            return STALE
        definition_step = self.definition.all_steps.get(step.name)
        if not isinstance(definition_step, TaskStep):
            return STALE
        if not self.alive(self.frame(step.name)):
            return CLOSED_BLOCK
        if step.resolution is not None:
            # An operator recorded the step's conclusion (the RESOLVE advance carries it); the
            # task's own result -- its review -- is kept, never advanced.
            return STALE
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
            self.task_failed(definition_step, failure)
        return ADVANCED

    def due(self, row: dict[str, Any]) -> str:
        """One leased pending advance's outcome: by its kind. While the instance stops none
        advances anything (the ROOT row a cancel re-arms only runs the sweep)."""
        if self.stopping:
            self._sweep()
            return STOPPING
        if row["kind"] == "ROOT":
            return self.root()
        if row["kind"] == "TIMER":
            return self.fire_timer(row)
        if row["kind"] == "SIGNAL":
            return self.signal_timeout(row)
        if row["kind"] == "POLL":
            return self.next_round(row)
        if row["kind"] == "RESUME":  # the replay ran first in this advance (or an earlier one)
            return ADVANCED if self.replayed else DUPLICATE
        if row["kind"] == "RESOLVE":
            return self.resolve(row)
        return STALE

    def resolve(self, row: dict[str, Any]) -> str:
        """An operator recorded the step's conclusion (``resolution``; recovery.py): the step
        advances as if it had succeeded with the output, or failed with the error -- through
        its own failure transition (``on_failure``; a SIGNAL step's ``on_timeout``), never
        ``$hold`` again: without one the failure propagates to the scope."""
        if not self.running:
            return INSTANCE_ENDED
        step = next((s for s in self.steps.values() if s.id == row["step_id"]), None)
        if (step is None or step.resolution is None or step.state != "WAITING"
                or step.activation is None or step.activation.state != "LIVE"):
            return STALE
        definition_step = self.definition.all_steps.get(step.name)
        if not isinstance(definition_step, TaskStep | PollStep | SignalStep):
            return STALE
        if not self.alive(self.frame(step.name)):
            return CLOSED_BLOCK
        resolution = step.resolution
        if resolution.get("conclusion") == "succeeded":
            self._complete(step, resolution.get("output"))
            self.run_path(definition_step.next)
            return ADVANCED
        failure = {"error": resolution.get("error"), "cause": resolution.get("reason"),
                   "step": step.name, "resolved": True}
        self._end(step, "FAILED", error=failure)
        target = (definition_step.on_timeout if isinstance(definition_step, SignalStep)
                  else definition_step.on_failure)
        if target is not None and target != HOLD:
            self.run_path(target)
        else:
            self.scope_ended(self.frame(step.name), False, failure)
        return ADVANCED

    def fire_timer(self, row: dict[str, Any]) -> str:
        """A due TIMER row (timers.py): re-checked against the rows and database time; the
        wait FIRED, the step SUCCEEDED with its result, its ``next`` runs."""
        if not self.running:
            return INSTANCE_ENDED
        if (row["namespace_id"] != self.instance["namespace_id"]
                or row["instance_id"] != self.instance["id"] or row["activation_id"] is None):
            return STALE
        step = self.by_activation.get(row["activation_id"])
        activation = step.activation if step is not None else None
        wait = step.wait if step is not None else None
        definition_step = self.definition.all_steps.get(step.name) if step else None
        if (step is None or activation is None or activation.state != "LIVE"
                or step.state != "WAITING" or step.id != row["step_id"] or wait is None
                or wait.kind != "TIMER" or wait.state != "WAITING"
                or wait.activation_id != activation.id
                or not isinstance(definition_step, TimerStep)):
            return STALE
        if self.now is None or timers.late_ms(wait, self.now) is None:
            return timers.EARLY
        self._complete(step, timers.fire(wait, self.now))
        self.run_path(definition_step.next)
        return ADVANCED

    def signal_timeout(self, row: dict[str, Any]) -> str:
        """A SIGNAL wait's deadline: the wait TIMED_OUT, the step FAILED ``signal_timeout``,
        then ``on_timeout``. Never early (database time): an early row (a re-armed wait's comes
        at once) first lets a matching pending signal win, else it is re-armed for the
        deadline."""
        if not self.running:
            return INSTANCE_ENDED
        wait = self.book.waits.get(row["activation_id"]) if row["activation_id"] else None
        if wait is None or not self._wait_open(wait):
            return STALE
        step_row = self.by_activation[wait.activation_id]
        step = self.definition.all_steps[step_row.name]
        if not isinstance(step, SignalStep):
            return STALE
        early = wait.deadline_at is None or self.book.now < wait.deadline_at
        # A re-armed wait's row is due at once (wait_recovery.py), before its deadline: it is
        # the wait's entry, where a matching signal already pending wins, however short the
        # new timeout (a row due at the deadline times out: signals lost that race on entry).
        entry = wait.deadline_at is not None and as_utc(row["due_at"]) < wait.deadline_at
        if early or entry:
            winner = self.book.take(wait)
            if winner is not None:
                self._signalled(step, step_row, wait, winner)
                return ADVANCED
        if early:  # not due yet: the row waits for the deadline
            self.book.rearm.append((row["id"], wait.deadline_at or as_utc(row["due_at"])))
            return STALE
        self.book.time_out(wait)
        failure = {"error": signals.SIGNAL_TIMEOUT, "step": step.name}
        if step.on_timeout == HOLD:
            self.hold(step_row, failure)
            return ADVANCED
        self._end(step_row, "FAILED", error=failure)
        if step.on_timeout is not None:
            self.run_path(step.on_timeout)
        else:
            self.scope_ended(self.frame(step.name), False, failure)
        return ADVANCED

    # --- POLL (docs/weave/waits.md § 有界查询（POLL）; rows and decisions: polls.py)

    def poll_result(self, row: dict[str, Any], step: _Step) -> str:
        """A POLL round's task ended: the round is decided, then the query."""
        definition_step = self.definition.all_steps.get(step.name)
        state = self.polls.states.get(step.id)
        if not isinstance(definition_step, PollStep) or state is None:
            return STALE
        if not self.alive(self.frame(step.name)):
            return CLOSED_BLOCK
        current = self.polls.rounds.get(row["task_id"])
        if current is None or current.state != polls.RUNNING or state.state != polls.ROUND:
            return STALE  # an older round's, or one already decided
        if row["task_state"] == "NEEDS_REVIEW":
            if step.state != "WAITING":
                step.state = "WAITING"
                step.dirty = True
                self.changed = True
            return HELD
        activation = _live(step)
        activation.result_event_id = row["source_event_id"]
        activation.dirty = True
        self.changed = True
        state.dirty = True
        snapshot = jsondoc.loads_strict(row["snapshot"])
        if row["task_state"] != "SUCCEEDED":
            polls.end_round(current, polls.CANCELLED if row["task_state"] == "CANCELLED"
                            else polls.FAILED)
            self._poll_failed(definition_step, step, state, {
                "error": TASK_FAILED, "cause": snapshot.get("error"), "step": step.name})
            return ADVANCED
        result = snapshot.get("result")
        state.last_result = result
        try:
            met = self._until(definition_step, result)
        except _RoundFailed as exc:
            polls.end_round(current, polls.FAILED, result)
            self._poll_failed(definition_step, step, state, exc.failure)
            return ADVANCED
        polls.end_round(current, polls.MET if met else polls.NOT_MET, result)
        if met:
            state.state = polls.SATISFIED
            self._complete(step, result)
            self.run_path(definition_step.next)
            return ADVANCED
        now = self.polls.time
        interval = state.next_interval_ms
        at = now + dt.timedelta(milliseconds=interval)
        if state.used_rounds >= state.round_budget:
            self._poll_exhausted(definition_step, step, state, "max_rounds")
        elif state.query_deadline is not None and at >= state.query_deadline:
            self._poll_exhausted(definition_step, step, state, "deadline")
        else:
            state.state = polls.WAITING
            state.next_round_at = state.arm_at = at
            state.next_interval_ms = polls.grown(interval, definition_step.backoff)
            step.state = "WAITING"
            step.dirty = True
        return ADVANCED

    def _until(self, step: PollStep, result: Any) -> bool:
        """The round's result checked against the result schema, then ``until`` on it."""
        if step.result_schema is not None:
            found: list[dict[str, str]] = []
            types.value_problems(step.result_schema, result, "$.result", found)
            if found:
                raise _RoundFailed({"error": RESULT_SHAPE,
                                    "cause": f"{found[0]['path']}: {found[0]['message']}",
                                    "step": step.name})
        try:
            holds = expressions.evaluate(step.until, {
                "input": self.input, "steps": self.cel_results,
                "round": {"result": types.cel_input(step.result_schema, result)}})
        except expressions.ExpressionError as exc:
            raise _RoundFailed({"error": EXPRESSION_FAILED, "cause": exc.message,
                                "step": step.name}) from exc
        if not isinstance(holds, bool):
            raise _RoundFailed({"error": EXPRESSION_FAILED,
                                "cause": "the condition is not a bool", "step": step.name})
        return holds

    def _poll_failed(self, step: PollStep, row: _Step, state: polls.PollState,
                     failure: dict[str, Any]) -> None:
        state.state = polls.FAILED
        state.dirty = True
        self.task_failed(step, failure)

    def _poll_exhausted(self, step: PollStep, row: _Step, state: polls.PollState,
                        reason: str) -> None:
        """The query ends without its condition: ``on_exhausted``, else ``on_failure``, else
        the scope fails."""
        state.state = polls.EXHAUSTED
        state.next_round_at = state.arm_at = None
        state.dirty = True
        failure = polls.exhausted_error(step.name, state, reason)
        target = step.on_exhausted or step.on_failure
        if target == HOLD:
            self.hold(row, failure)
            return
        self._end(row, "FAILED", error=failure)
        if target is not None:
            self.run_path(target)
        else:
            self.scope_ended(self.frame(step.name), False, failure)

    def next_round(self, row: dict[str, Any]) -> str:
        """The POLL advance is due: re-check the activation, the query, the time, the gate,
        the budget and the deadline, then count and start the next round."""
        if not self.running:
            return INSTANCE_ENDED
        step = self.by_activation.get(row["activation_id"]) if row["activation_id"] else None
        state = self.polls.states.get(step.id) if step is not None else None
        definition_step = self.definition.all_steps.get(step.name) if step else None
        if (step is None or state is None or step.activation is None
                or step.activation.state != "LIVE" or state.state != polls.WAITING
                or not isinstance(definition_step, PollStep)
                or state.activation_id != step.activation.id):
            return STALE
        now = self.polls.time
        if state.next_round_at is not None and now < state.next_round_at:
            state.arm_at = state.next_round_at  # never early: back to PENDING unchanged
            return HELD
        if not self.polls.gate_open:
            state.arm_at = now + dt.timedelta(milliseconds=state.next_interval_ms)
            return HELD
        left = polls.remaining_ms(state.query_deadline, now)
        if state.used_rounds >= state.round_budget:
            self._poll_exhausted(definition_step, step, state, "max_rounds")
            return ADVANCED
        if left is not None and left < 1:
            self._poll_exhausted(definition_step, step, state, "deadline")
            return ADVANCED
        try:
            item = self._task_item(definition_step, polls.round_deadline_ms(
                definition_step.options.deadline_ms, left))
        except expressions.ExpressionError as exc:
            self._poll_failed(definition_step, step, state, {
                "error": EXPRESSION_FAILED, "cause": exc.message, "step": step.name})
            return ADVANCED
        polls.next_round(state, item.task_id, self.polls)
        activation = step.activation
        activation.task_id = item.task_id
        step.state = "RUNNING"
        step.dirty = True
        self.changed = True
        self._add_task(item, step.name, activation.id)
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

    def adopt(self, book: polls.Book) -> None:
        """The instance's poll rows and the advance's database time; each earlier round of a
        query made a task the activations do not count."""
        self.polls = book
        self.task_count += sum(s.extra_tasks if s.granted_rounds else s.used_rounds - 1
                               for s in book.states.values())


# --- SQL ----------------------------------------------------------------------------------------

LOCK_INSTANCE = ("SELECT id, namespace_id, definition_id, version, version_digest, state,"
                 " revision, paused, checkpoints, input, error, stop_kind, stop_requested_at,"
                 " gate_id FROM weave_instances WHERE namespace_id = %s AND id = %s FOR UPDATE")
LOCK_INSTANCES = ("SELECT id, namespace_id, definition_id, version, version_digest, state,"
                  " revision, paused, checkpoints, input, error, stop_kind, stop_requested_at,"
                  " gate_id FROM weave_instances WHERE namespace_id = %s AND id IN ({ids})"
                  " ORDER BY id FOR UPDATE")
FENCE = ("SELECT * FROM {table} WHERE namespace_id = %s AND id IN ({ids})"
         " ORDER BY created_at, id FOR UPDATE")
# The inbox's fence reads only what a lease changes: an inbox row is otherwise immutable until
# its consumption (the only other UPDATE of weave_inbox), so a row still LEASED by this owner
# with the lease's attempt count is exactly the row the lease returned, snapshot included.
FENCE_INBOX = ("SELECT id, state, lease_owner, attempts FROM weave_inbox"
               " WHERE namespace_id = %s AND id IN ({ids}) ORDER BY created_at, id FOR UPDATE")
STEPS = ("SELECT instance_id, id, name, kind, state, output, error, join_state, held_at,"
         " held_error, resolution FROM weave_steps"
         " WHERE namespace_id = %s AND instance_id IN ({ids})")
# In sequence order: a step's activation that counts is its LIVE one, else its newest.
ACTIVATIONS = ("SELECT instance_id, id, step_id, state, task_id, result_event_id"
               " FROM weave_activations WHERE namespace_id = %s AND instance_id IN ({ids})"
               " ORDER BY step_id, sequence")
INSERT_STEPS = ("INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state,"
                " revision, activation_count, live_activation_id, output, error, join_state,"
                " held_at, held_error, created_at, updated_at)")
STEP_ROW = "(%s, %s, %s, %s, %s, %s, 1, 1, %s, %s, %s, %s, %s, %s, %s, %s)"
INSERT_ACTIVATIONS = ("INSERT INTO weave_activations (namespace_id, instance_id, step_id, id,"
                      " sequence, state, live_step_id, task_id, result_event_id, created_at,"
                      " ended_at)")
ACTIVATION_ROW = "(%s, %s, %s, %s, 1, %s, %s, %s, %s, %s, %s)"
# Every changed row of a batch in one statement per table: each column a CASE over the row ids
# (values only from driver parameters). A step's key is (namespace, instance, id): the instance
# ids bound the range, the ids pick the rows.
UPDATE_STEPS = ("UPDATE weave_steps SET state = CASE id {state} END, revision = revision + 1,"
                " live_activation_id = CASE id {live} END, output = CASE id {output} END,"
                " error = CASE id {error} END, join_state = CASE id {join} END,"
                " held_at = CASE id {held_at} END, held_error = CASE id {held_error} END,"
                " updated_at = %s WHERE namespace_id = %s AND instance_id IN ({instances})"
                " AND id IN ({ids})")
UPDATE_ACTIVATIONS = ("UPDATE weave_activations SET state = CASE id {state} END,"
                      " live_step_id = CASE id {live} END,"
                      " result_event_id = CASE id {event} END, ended_at = CASE id {ended} END"
                      " WHERE namespace_id = %s AND id IN ({ids})")
UPDATE_INSTANCES = ("UPDATE weave_instances SET state = CASE id {state} END,"
                    " revision = revision + 1, output = CASE id {output} END,"
                    " error = CASE id {error} END, completed_at = CASE id {completed} END,"
                    " stop_kind = CASE id {kind} END, stop_requested_at = CASE id {stopped} END,"
                    " updated_at = %s WHERE namespace_id = %s AND id IN ({ids})")
# A failure settlement closes the instance's gate for good (a cancel closes it in its own
# transaction, controls.py): claims and starts read it with a shared lock.
STOP_GATES = ("UPDATE pulse_execution_gates SET state = 'STOPPED', reason = %s,"
              " control_revision = control_revision + 1, updated_at = %s"
              " WHERE namespace_id = %s AND id IN ({ids})")
# A stopping or stopped instance's open pending advances: none will advance anything.
STOPPED_ADVANCES = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s,"
                    " lease_owner = NULL, lease_expires_at = NULL, parked_due_at = NULL"
                    " WHERE namespace_id = %s AND instance_id IN ({ids}) AND state = 'PENDING'")
CONSUME = ("UPDATE weave_inbox SET state = 'CONSUMED', outcome = %s, consumed_at = %s,"
           " lease_owner = NULL, lease_expires_at = NULL"
           " WHERE namespace_id = %s AND id IN ({ids})")
DONE = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s, lease_owner = NULL,"
        " lease_expires_at = NULL WHERE namespace_id = %s AND id IN ({ids})")
# Pause and resume (docs/weave/pause.md). Parking: a leased pending advance of a paused instance
# goes back to PENDING, due never, its due time kept; a leased signal goes back to PENDING,
# available never (the resume makes it available); the instance counts its checkpoints.
PARK_ADVANCES = ("UPDATE weave_pending_advances SET state = 'PENDING', lease_owner = NULL,"
                 " lease_expires_at = NULL, parked_due_at = CASE WHEN kind = 'RESUME' THEN NULL"
                 " ELSE COALESCE(parked_due_at, due_at) END, due_at = %s"
                 " WHERE namespace_id = %s AND id IN ({ids})")
PARK_SIGNALS = ("UPDATE weave_signals SET state = 'PENDING', lease_owner = NULL,"
                " lease_expires_at = NULL, available_at = %s"
                " WHERE namespace_id = %s AND id IN ({ids})")
COUNT_CHECKPOINTS = ("UPDATE weave_instances SET checkpoints = checkpoints + CASE id {n} END"
                     " WHERE namespace_id = %s AND id IN ({ids})")
# Replay: the parked rows of resumed instances, locked (after the instance rows and this round's
# leased rows), restored, handled in order; the RESUME row DONE, the count back to zero.
PARKED_INBOX = ("SELECT * FROM weave_inbox WHERE namespace_id = %s AND instance_id IN ({ids})"
                " AND state = 'CONSUMED' AND outcome = 'paused' ORDER BY created_at, id"
                " FOR UPDATE")
PARKED_ADVANCES = ("SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                   " AND instance_id IN ({ids}) AND state = 'PENDING'"
                   " AND parked_due_at IS NOT NULL ORDER BY parked_due_at, id FOR UPDATE")
RESTORE = ("UPDATE weave_pending_advances SET due_at = parked_due_at, parked_due_at = NULL"
           " WHERE namespace_id = %s AND id IN ({ids})")
RESUMED = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s, lease_owner = NULL,"
           " lease_expires_at = NULL WHERE namespace_id = %s AND instance_id IN ({ids})"
           " AND kind = 'RESUME' AND state <> 'DONE'")
REPLAYED = ("UPDATE weave_instances SET checkpoints = 0 WHERE namespace_id = %s"
            " AND id IN ({ids})")
# A parked row's due time: the scans (due_at <= now) never reach it.
PARKED_AT = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)


async def _fence(cur: Any, table: str, namespace_id: bytes, leased: Sequence[dict[str, Any]],
                 owner: str) -> list[dict[str, Any]]:
    """The rows of ``leased`` this owner still holds, locked, oldest first (the inbox's as the
    lease returned them, :data:`FENCE_INBOX`; other tables' read again)."""
    if not leased:
        return []
    attempts = {r["id"]: r["attempts"] for r in leased}
    inbox = table == "weave_inbox"
    marks = placeholders(len(leased))
    sql = FENCE_INBOX.format(ids=marks) if inbox else FENCE.format(table=table, ids=marks)
    await cur.execute(sql, (namespace_id, *attempts))
    held = [r for r in await cur.fetchall()
            if r["state"] == "LEASED" and r["lease_owner"] == owner
            and r["attempts"] == attempts[r["id"]]]
    if inbox:
        by_id = {r["id"]: r for r in leased}
        return [dict(by_id[r["id"]]) for r in held]
    return [dict(r) for r in held]


async def _load_steps(cur: Any, ns: bytes, instance_ids: Sequence[bytes]
                      ) -> dict[bytes, tuple[list[_Step], int]]:
    """Each instance's steps (with the activation that counts: the LIVE one, else the last)
    and how many tasks its activations made."""
    if not instance_ids:
        return {}
    marks = placeholders(len(instance_ids))
    await cur.execute(ACTIVATIONS.format(ids=marks), (ns, *instance_ids))
    activations: dict[bytes, _Activation] = {}
    made: dict[bytes, int] = dict.fromkeys(instance_ids, 0)
    for a in await cur.fetchall():
        if a["task_id"] is not None:
            made[a["instance_id"]] += 1
        # A step's LIVE activation, else its newest (a retried step has older, SUPERSEDED
        # ones: their results are stale).
        current = activations.get(a["step_id"])
        if current is None or current.state != "LIVE":
            activations[a["step_id"]] = _Activation(
                id=a["id"], step_id=a["step_id"], state=a["state"], task_id=a["task_id"],
                result_event_id=a["result_event_id"])
    waits = await timers.load(cur, ns, instance_ids)
    await cur.execute(STEPS.format(ids=marks), (ns, *instance_ids))
    steps: dict[bytes, list[_Step]] = {instance_id: [] for instance_id in instance_ids}
    for r in await cur.fetchall():
        activation = activations.get(r["id"])
        steps[r["instance_id"]].append(_Step(
            id=r["id"], name=r["name"], kind=r["kind"], state=r["state"],
            output=_text(r["output"]), error=_text(r["error"]), join=_text(r["join_state"]),
            activation=activation,
            held_at=None if r["held_at"] is None else as_utc(r["held_at"]),
            held_error=_text(r["held_error"]),
            resolution=_text(r["resolution"]),
            wait=waits[r["instance_id"]].get(activation.id) if activation else None))
    return {instance_id: (steps[instance_id], made[instance_id]) for instance_id in instance_ids}


async def _load_polls(cur: Any, ns: bytes, instances: Mapping[bytes, Mapping[str, Any]],
                      loaded: Mapping[bytes, tuple[list[_Step], int]], now: Any
                      ) -> dict[bytes, polls.Book]:
    """Each loaded instance's poll book (rows only where it has POLL steps)."""
    return await polls.load(cur, ns, {
        instance_id: (instances[instance_id]["gate_id"],
                      any(s.kind == "POLL" for s in steps))
        for instance_id, (steps, _) in loaded.items()}, now)


def _cancelled_tasks(advance: _Advance) -> tuple[list[bytes], list[bytes]]:
    """The tasks of the activations this advance cancelled: those of activations that were
    LIVE before it, and those it created and cancelled itself (a branch's task made before
    another branch closed the block; a POLL round's task made in the query's existing
    activation)."""
    before, made = [], []
    created = {t.item.task_id for t in advance.new_tasks}
    for row in advance.rows():
        activation = row.activation
        if activation is None or activation.task_id is None or activation.state != "CANCELLED":
            continue
        if activation.new or activation.task_id in created:
            made.append(activation.task_id)
        elif activation.dirty:  # only _end changes a loaded activation's state (LIVE -> ...)
            before.append(activation.task_id)
    return before, made


async def _cancel(cur: Any, ns: bytes, advances: Sequence[_Advance], now: Any, *,
                  made: bool) -> None:
    """Cancel intents for the tasks the batch's advances cancelled (``made``: those the
    advances created themselves; else those that were live before) -- the kernel's cancel
    semantics, docs/weave/engine.md § 取消意图; their results still arrive through the inbox.
    One call per reason, task rows in id order."""
    by_reason: dict[str, list[bytes]] = {}
    for advance in advances:
        before, created = _cancelled_tasks(advance)
        if advance.running:
            reason = CLOSED_REASON
        elif advance.stop_kind is not None:
            reason = STOP_REASONS[advance.stop_kind]
            before = [*before, *advance.stop_tasks]  # in flight: asked to stop, still LIVE
        else:
            reason = ENDED_REASON
        by_reason.setdefault(reason, []).extend(created if made else before)
    for reason, task_ids in sorted(by_reason.items()):
        if task_ids:
            await interventions.request_cancel(cur, ns, sorted(task_ids), reason=reason,
                                               now=now, by=CANCELLED_BY)


def _cases(rows: Sequence[tuple[bytes, Any]]) -> tuple[str, list[Any]]:
    """``WHEN id THEN value …`` for a CASE over the row ids, and its parameters."""
    return " ".join("WHEN %s THEN %s" for _ in rows), [v for row in rows for v in row]


async def _update(cur: Any, sql: str, columns: Mapping[str, Sequence[tuple[bytes, Any]]],
                  head: Sequence[Any], **lists: Sequence[bytes]) -> None:
    """One UPDATE with a CASE per column. ``sql``'s CASEs are named by ``columns``' keys and
    appear in their order; then the scalars ``head``, then each id list of ``lists`` (named,
    in order)."""
    texts: dict[str, str] = {}
    params: list[Any] = []
    for key, rows in columns.items():
        texts[key], found = _cases(rows)
        params += found
    marks = {name: placeholders(len(values)) for name, values in lists.items()}
    await cur.execute(sql.format(**texts, **marks),
                      (*params, *head, *[v for values in lists.values() for v in values]))


async def _write(cur: Any, ns: bytes, advances: Sequence[_Advance], now: Any) -> None:
    """Write every changed instance of a batch: its steps, activations and instance (one
    statement per table), one event each. The new tasks are inserted last
    (:func:`_insert_tasks`, after the inbox rows are consumed): their counters are the queue's
    and the application's rows, which every finishing task updates too, so the transaction
    holds them only for the moment before its commit. The cancels of tasks that were live come
    first (task rows, then the counters their endings update)."""
    stopped = sorted(adv.instance["gate_id"] for adv in advances if adv.stop_began)
    if stopped:
        await cur.execute(STOP_GATES.format(ids=placeholders(len(stopped))),
                          (STOP_REASONS["FAILURE"], to_db(now), ns, *stopped))
    await _cancel(cur, ns, advances, now, made=False)
    await _write_rows(cur, ns, advances, to_db(now))
    for advance in advances:
        polls.cancel_closed(advance.polls, {r.id: r.state for r in advance.rows()})
    await polls.write(cur, ns, [advance.polls for advance in advances], now)
    await append_events(cur, [EventRecord(
        namespace_id=ns, id=ids.new_id(), aggregate_type="workflow_instance",
        aggregate_id=adv.instance["id"], aggregate_revision=adv.instance["revision"] + 1,
        event_type=_event_type(adv), from_state=adv.instance["state"], to_state=adv.state,
        payload={"completed": adv.completed,
                 "tasks": [{"step": t.step, "task_id": t.item.task_id.hex(),
                            "sequence": t.sequence} for t in adv.new_tasks],
                 "waiting": sorted(r.name for r in adv.rows() if r.state == "WAITING"),
                 **({"held": sorted(adv.held)} if adv.held else {}),
                 "output": adv.output, "error": adv.error}) for adv in advances])


async def _stopped_advances(cur: Any, ns: bytes, runs: Sequence[_Advance], now: Any) -> None:
    """The open pending advances of the batch's stopping and stopped instances end DONE
    (after this round's own rows are handled): nothing of theirs advances again."""
    stopped = sorted(run.instance["id"] for run in runs if run.stop_kind is not None)
    if stopped:
        await cur.execute(STOPPED_ADVANCES.format(ids=placeholders(len(stopped))),
                          (to_db(now), ns, *stopped))


def _event_type(advance: _Advance) -> str:
    if advance.state == "STOPPING":
        return "workflow.stopping" if advance.stop_began else "workflow.advanced"
    return {"SUCCEEDED": "workflow.succeeded", "FAILED": "workflow.failed",
            "CANCELLED": "workflow.cancelled"}.get(advance.state, "workflow.advanced")


async def _insert_tasks(cur: Any, ns: bytes, advances: Sequence[_Advance], now: Any) -> None:
    """The batch's new tasks in one generated insert (counters and limits as a submission);
    a missing queue or a refused task is a deterministic refusal. Then the cancels of the new
    tasks the same advance cancelled (a branch's task made before another branch closed the
    block): rows this transaction inserted (no one else can hold them), counters it holds,
    cancelled once their activations exist so that their inbox rows link to them."""
    new_tasks = [(advance, t) for advance in advances for t in advance.new_tasks]
    if new_tasks:
        names = sorted({t.item.spec.queue for _, t in new_tasks})
        queues = await tasks.queues_by_name(cur, ns, names)
        for name in names:
            if name not in queues:
                raise _Rejected(TASK_REJECTED, f"queue {name!r} does not exist")
        try:
            await tasks.insert_generated(
                cur, ns, [(t.item, queues[t.item.spec.queue]) for _, t in new_tasks],
                now, [{"workflow": {"instance_id": advance.instance["id"].hex(),
                                    "step": t.step, "activation_id": t.activation_id.hex(),
                                    "sequence": t.sequence}} for advance, t in new_tasks])
        except DETERMINISTIC as exc:
            raise _Rejected(TASK_REJECTED, f"{getattr(exc, 'code', 'refused')}: {exc}"
                            ) from exc
    await _cancel(cur, ns, advances, now, made=True)


async def _write_rows(cur: Any, ns: bytes, advances: Sequence[_Advance], when: Any) -> None:
    """The batch's steps and activations (new: one insert each; changed: one CASE update
    each) and its instances (one CASE update)."""
    new_steps, new_activations = [], []
    dirty_steps: list[tuple[bytes, _Step]] = []
    dirty_activations: list[tuple[_Step, _Activation]] = []
    for advance in advances:
        instance_id = advance.instance["id"]
        for row in advance.rows():
            activation = row.activation
            live = activation is not None and activation.state == "LIVE"
            if row.new:
                new_steps.append((ns, instance_id, row.id, row.name, row.kind, row.state,
                                  activation.id if live and activation else None,
                                  _json(row.output), _json(row.error), _json(row.join),
                                  _held_at(row), _json(row.held_error), when, when))
            elif row.dirty:
                dirty_steps.append((instance_id, row))
            if activation is None:
                continue
            if activation.new:
                new_activations.append((ns, instance_id, row.id, activation.id,
                                        activation.state, row.id if live else None,
                                        activation.task_id, activation.result_event_id, when,
                                        None if live else when))
            elif activation.dirty:
                dirty_activations.append((row, activation))
    if new_steps:
        sql, params = multi_insert(INSERT_STEPS, STEP_ROW, new_steps)
        await cur.execute(sql, params)
    if new_activations:
        sql, params = multi_insert(INSERT_ACTIVATIONS, ACTIVATION_ROW, new_activations)
        await cur.execute(sql, params)
    if dirty_steps:
        def live_of(row: _Step) -> bytes | None:
            a = row.activation
            return a.id if a is not None and a.state == "LIVE" else None

        await _update(cur, UPDATE_STEPS, {
            "state": [(r.id, r.state) for _, r in dirty_steps],
            "live": [(r.id, live_of(r)) for _, r in dirty_steps],
            "output": [(r.id, _json(r.output)) for _, r in dirty_steps],
            "error": [(r.id, _json(r.error)) for _, r in dirty_steps],
            "join": [(r.id, _json(r.join)) for _, r in dirty_steps],
            "held_at": [(r.id, _held_at(r)) for _, r in dirty_steps],
            "held_error": [(r.id, _json(r.held_error)) for _, r in dirty_steps],
        }, (when, ns), instances=sorted({i for i, _ in dirty_steps}),
            ids=[r.id for _, r in dirty_steps])
    if dirty_activations:
        pairs = [(row, a, a.state == "LIVE") for row, a in dirty_activations]
        await _update(cur, UPDATE_ACTIVATIONS, {
            "state": [(a.id, a.state) for _, a, _ in pairs],
            "live": [(a.id, row.id if live else None) for row, a, live in pairs],
            "event": [(a.id, a.result_event_id) for _, a, _ in pairs],
            "ended": [(a.id, None if live else when) for _, a, live in pairs],
        }, (ns,), ids=[a.id for _, a, _ in pairs])
    await _update(cur, UPDATE_INSTANCES, {
        "state": [(adv.instance["id"], adv.state) for adv in advances],
        "output": [(adv.instance["id"], _json(adv.output)) for adv in advances],
        "error": [(adv.instance["id"], _json(adv.error)) for adv in advances],
        "completed": [(adv.instance["id"], None if adv.state in ("RUNNING", "STOPPING")
                       else when) for adv in advances],
        "kind": [(adv.instance["id"], adv.stop_kind) for adv in advances],
        "stopped": [(adv.instance["id"], adv.stop_requested_at) for adv in advances],
    }, (when, ns), ids=[adv.instance["id"] for adv in advances])
    await timers.write(cur, ns, _timer_waits(advances), when)


def _held_at(row: _Step) -> Any:
    return None if row.held_at is None else to_db(row.held_at)


def _timer_waits(advances: Sequence[_Advance]) -> list[tuple[bytes, timers.Wait]]:
    """The batch's TIMER waits to write: those entered, fired, or whose step this advance
    cancelled (its block closed, its instance ended: the wait is CANCELLED now)."""
    found = []
    for advance in advances:
        for row in advance.rows():
            wait = row.wait
            if wait is None or wait.kind != "TIMER":
                continue
            if wait.state == "WAITING" and row.state == "CANCELLED":
                timers.cancel(wait)
            if wait.new or wait.dirty:
                found.append((advance.instance["id"], wait))
    return found


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


def _classify(instance_ids: Sequence[bytes], found: Mapping[bytes, dict[str, Any]],
              rows_of: Mapping[bytes, Sequence[dict[str, Any]]],
              due_of: Mapping[bytes, Sequence[dict[str, Any]]],
              received_of: Mapping[bytes, Sequence[dict[str, Any]]]
              ) -> tuple[dict[bytes, str], list[bytes], list[bytes]]:
    """The locked instances by what their leased rows become: the inbox rows of ended (or
    missing) instances get their outcome now, those of paused instances ``paused``; the
    running instances advance; the paused ones park their rows."""
    outcomes: dict[bytes, str] = {}
    running, paused = [], []
    for instance_id in instance_ids:
        instance = found.get(instance_id)
        if instance is None or instance["state"] not in ("RUNNING", "STOPPING"):
            for r in rows_of.get(instance_id, []):
                outcomes[r["id"]] = INSTANCE_ENDED if instance else STALE
        elif instance["paused"] and instance["state"] == "RUNNING":
            paused.append(instance_id)
            for r in rows_of.get(instance_id, []):
                outcomes[r["id"]] = PAUSED
        elif any(instance_id in of for of in (rows_of, due_of, received_of)):
            running.append(instance_id)
    return outcomes, running, paused


def _replay(run: _Advance, parked: Sequence[dict[str, Any]] | None,
            outcomes: dict[bytes, str], outcomes_due: dict[bytes, str]
            ) -> list[dict[str, Any]]:
    """A resumed instance's parked checkpoints, in order, before anything else of its advance:
    each inbox row consumed, each pending advance handled, as if it came now. Returns the
    pending advances (written like the leased ones)."""
    if parked is None:
        return []
    run.replayed = True
    handled = []
    for row in parked:
        if "source_event_id" in row:
            outcomes[row["id"]] = run.consume(row)
        else:
            handled.append(row)
            outcomes_due[row["id"]] = run.due(row)
    return handled


async def _parked(cur: Any, ns: bytes, instance_ids: Sequence[bytes]
                  ) -> dict[bytes, list[dict[str, Any]]]:
    """The parked checkpoints of ``instance_ids`` (resumed instances that still count some),
    locked, each instance's in the order they came: inbox rows by their writing, pending
    advances by their due time -- both database time."""
    if not instance_ids:
        return {}
    marks = placeholders(len(instance_ids))
    await cur.execute(PARKED_INBOX.format(ids=marks), (ns, *instance_ids))
    found: list[tuple[Any, int, dict[str, Any]]] = [
        (as_utc(r["created_at"]), 1, dict(r)) for r in await cur.fetchall()]
    await cur.execute(PARKED_ADVANCES.format(ids=marks), (ns, *instance_ids))
    for r in await cur.fetchall():
        row = dict(r)
        row["due_at"] = row["parked_due_at"]
        found.append((as_utc(row["parked_due_at"]), 0, row))
    replays: dict[bytes, list[dict[str, Any]]] = {i: [] for i in instance_ids}
    for _, _, row in sorted(found, key=lambda f: (f[0], f[1], f[2]["id"])):
        replays[row["instance_id"]].append(row)
    return replays


async def _restore(cur: Any, ns: bytes, instance_ids: Sequence[bytes],
                   advance_ids: Sequence[bytes], now: Any) -> None:
    """After a replay: the parked pending advances due again at their own time (then DONE,
    released or re-armed like any handled row), the RESUME rows DONE, the count zero."""
    if advance_ids:
        await cur.execute(RESTORE.format(ids=placeholders(len(advance_ids))),
                          (ns, *advance_ids))
    marks = placeholders(len(instance_ids))
    await cur.execute(RESUMED.format(ids=marks), (to_db(now), ns, *instance_ids))
    await cur.execute(REPLAYED.format(ids=marks), (ns, *instance_ids))


async def _park(cur: Any, ns: bytes, paused: Sequence[bytes],  # noqa: PLR0917
                rows_of: Mapping[bytes, Sequence[dict[str, Any]]],
                due: Sequence[dict[str, Any]], received: Sequence[dict[str, Any]]
                ) -> dict[str, int]:
    """The leased rows of paused instances: the inbox rows are already consumed as
    ``paused``; the pending advances and signals are parked; each instance counts its new
    checkpoints (the RESUME row itself is none)."""
    if due:
        await cur.execute(PARK_ADVANCES.format(ids=placeholders(len(due))),
                          (to_db(PARKED_AT), ns, *[r["id"] for r in due]))
    if received:
        await cur.execute(PARK_SIGNALS.format(ids=placeholders(len(received))),
                          (to_db(PARKED_AT), ns, *[r["id"] for r in received]))
    added = {i: len(rows_of.get(i, [])) for i in paused}
    for r in due:
        if r["kind"] != "RESUME" and r["parked_due_at"] is None:
            added[r["instance_id"]] += 1
    counted = sorted((i, n) for i, n in added.items() if n)
    if counted:
        await _update(cur, COUNT_CHECKPOINTS, {"n": counted}, (ns,),
                      ids=[i for i, _ in counted])
    return {k: v for k, v in (
        (PAUSED, len(due)),  # the inbox rows are counted with the other outcomes
        (f"signal_{PAUSED}", len(received))) if v}


_Rows = list[dict[str, Any]]
# (instance id, leased inbox rows, leased pending advances, leased signals)
Item = tuple[bytes, Sequence[dict[str, Any]], Sequence[dict[str, Any]],
             Sequence[dict[str, Any]]]


async def _write_signals(cur: Any, ns: bytes, runs: Sequence[_Advance],
                         orphans: Sequence[dict[str, Any]], now: Any) -> dict[str, int]:
    """The batch's signal changes (after its steps and consumed rows), and how its leased
    signals ended (``signal_<disposition>``, ``signal_later``)."""
    signals.sweep((run.book, not run.running) for run in runs)
    await signals.write(cur, ns, [(run.instance["id"], run.book) for run in runs], now)
    await signals.reject_orphans(cur, ns, orphans, now)
    counts: dict[str, int] = {}
    for run in runs:
        for signal in run.book.signals:
            if signal.leased:
                key = f"signal_{signal.disposition or 'later'}"
                counts[key] = counts.get(key, 0) + 1
    if orphans:
        counts[f"signal_{signals.INSTANCE_FINISHED}"] = len(orphans)
    return counts


def _by_instance(rows: Sequence[dict[str, Any]]) -> dict[bytes, list[dict[str, Any]]]:
    found: dict[bytes, list[dict[str, Any]]] = {}
    for r in rows:
        found.setdefault(r["instance_id"], []).append(r)
    return found


@attrs.frozen
class _Result:
    outcomes: dict[str, int]
    seconds: float
    latencies: tuple[float, ...]


class Engine:
    """One engine replica's work (the daemon ``orbit weave`` runs :meth:`run_once` in a loop)."""

    def __init__(self, db: Database, *, owner: str, lease_ms: int = 30_000,
                 batch: int = 32, concurrency: int = 4, per_transaction: int = 32,
                 recover_interval_s: float = 0.0) -> None:
        """``per_transaction``: instances advanced together in one transaction (at most);
        ``concurrency``: such transactions at once, over every round this engine runs (each
        its own connection); ``recover_interval_s``: the lease transaction scans for lapsed
        leases at most once per this many seconds (0: every time)."""
        if not owner or len(owner) > 128:
            raise ValueError("owner: 1-128 characters")
        self.db = db
        self.owner = owner
        self.lease_ms = lease_ms
        self.batch = batch
        self.concurrency = concurrency
        self.per_transaction = max(1, per_transaction)
        self._models: dict[tuple[bytes, bytes, int, bytes], _Model] = {}
        self.recover_interval_s = recover_interval_s
        self._slots = asyncio.Semaphore(concurrency)
        self._recovered_at: float | None = None  # monotonic time of the last lapsed scan

    async def run_once(self) -> Round:
        """Lease one round of work, then advance it (:meth:`lease_round`, :meth:`advance_round`)."""
        return await self.advance_round(await self.lease_round())

    async def lease_round(self) -> Leased:
        """Lease up to ``batch`` rows of each work source in one transaction; lapsed leases
        too when ``recover_interval_s`` has passed since the last scan for them."""
        now = time.monotonic()
        lapsed = (self._recovered_at is None
                  or now - self._recovered_at >= self.recover_interval_s)

        async def lease(cur: Any) -> tuple[_Rows, _Rows, _Rows]:
            inbox = await leasing.lease_inbox(cur, owner=self.owner, lease_ms=self.lease_ms,
                                              limit=self.batch, lapsed=lapsed)
            due = await leasing.lease_advances(cur, owner=self.owner, lease_ms=self.lease_ms,
                                               limit=self.batch, lapsed=lapsed)
            # At most REJECT_BATCH signals a round: each may be rejected, and a transaction
            # rejects at most that many (000025).
            sent = await leasing.lease_signals(cur, owner=self.owner, lease_ms=self.lease_ms,
                                               limit=min(self.batch, signals.REJECT_BATCH),
                                               lapsed=lapsed)
            return inbox, due, sent

        inbox, due, sent = await self.db.transaction("weave.lease", lease)
        if lapsed:
            self._recovered_at = now
        return Leased(inbox=inbox, advances=due, signals=sent)

    async def advance_round(self, leased: Leased) -> Round:
        """Advance what :meth:`lease_round` leased: the instances of each namespace in chunks of
        ``per_transaction``, up to ``concurrency`` transactions at once (shared by every
        round this engine runs)."""
        inbox, due, sent = leased.inbox, leased.advances, leased.signals
        work: dict[bytes, dict[bytes, tuple[_Rows, _Rows, _Rows]]] = {}
        for row in due:
            work.setdefault(row["namespace_id"], {}).setdefault(
                row["instance_id"], ([], [], []))[1].append(row)
        for row in sorted(inbox, key=lambda r: (r["created_at"], r["id"])):
            work.setdefault(row["namespace_id"], {}).setdefault(
                row["instance_id"], ([], [], []))[0].append(row)
        for row in sorted(sent, key=lambda r: (r["accepted_at"], r["id"])):
            work.setdefault(row["namespace_id"], {}).setdefault(
                row["instance_id"], ([], [], []))[2].append(row)
        chunks: list[tuple[bytes, list[Item]]] = []
        for ns, by_instance in work.items():
            items: list[Item] = [(instance_id, rows, advances, received)
                                 for instance_id, (rows, advances, received)
                                 in by_instance.items()]
            for start in range(0, len(items), self.per_transaction):
                chunks.append((ns, items[start:start + self.per_transaction]))
        outcomes: dict[str, int] = {}
        seconds: list[float] = []
        latencies: list[float] = []

        async def one(ns: bytes, items: list[Item]) -> _Result:
            async with self._slots:
                return await self.advance_many(ns, items)

        for result in await asyncio.gather(*(one(ns, items) for ns, items in chunks)):
            for outcome, n in result.outcomes.items():
                outcomes[outcome] = outcomes.get(outcome, 0) + n
            seconds.append(result.seconds)
            latencies.extend(result.latencies)
        return Round(inbox=len(inbox), advances=len(due), outcomes=outcomes, batch=self.batch,
                     advance_seconds=tuple(seconds), result_latency_seconds=tuple(latencies),
                     signals=len(sent))

    def _may_signal(self, instance: dict[str, Any]) -> bool:
        """Whether the instance's version may have SIGNAL steps (its waits and signals are
        loaded then): a version not cached yet is assumed to."""
        model = self._models.get((instance["namespace_id"], instance["definition_id"],
                                  instance["version"], instance["version_digest"]))
        return model is None or any(isinstance(step, SignalStep)
                                    for step in model.definition.all_steps.values())

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
                      advances: Sequence[dict[str, Any]],
                      received: Sequence[dict[str, Any]] = ()) -> _Result:
        """Advance one instance with the rows this engine leased (one transaction)."""
        return await self.advance_many(ns, [(instance_id, inbox, advances, received)])

    async def advance_many(self, ns: bytes, items: Sequence[Item]) -> _Result:
        """Advance the instances of ``items`` (``(instance id, leased inbox rows, leased
        advances)``, one namespace) in one transaction; each instance's advance is whole
        in it. If that transaction fails, each instance is advanced alone (a refusal, or an
        error that is not one, then holds up only its own instance)."""
        if len(items) > 1:
            try:
                return await self._advance(ns, items)
            except Exception:  # noqa: BLE001 - isolated below, instance by instance
                results = [await self.advance_many(ns, [item]) for item in items]
                merged: dict[str, int] = {}
                for result in results:
                    for outcome, n in result.outcomes.items():
                        merged[outcome] = merged.get(outcome, 0) + n
                return _Result(outcomes=merged, seconds=sum(r.seconds for r in results),
                               latencies=tuple(x for r in results for x in r.latencies))
        ((instance_id, inbox, advances, received),) = items
        try:
            return await self._advance(ns, items)
        except _Rejected as exc:
            began = time.monotonic()
            refusal = exc
            counts = await self.db.transaction(
                "weave.reject", lambda cur: self._reject(cur, ns, instance_id, inbox, advances,
                                                         refusal, received))
            return _Result(outcomes=counts, seconds=time.monotonic() - began, latencies=())
        except Exception:
            # One instance's failure does not hold up the others: its rows' leases lapse and
            # a later round leases them again.
            log.exception("advance failed", extra={"instance": instance_id.hex()})
            return _Result(outcomes={FAILED_ADVANCE: len(inbox) + len(advances) + len(received)},
                           seconds=0.0, latencies=())

    async def _advance(self, ns: bytes, items: Sequence[Item]) -> _Result:
        began = time.monotonic()
        latencies: list[float] = []
        leased_rows = [r for _, rows, _, _ in items for r in rows]
        leased_due = [r for _, _, due, _ in items for r in due]

        async def body(cur: Any) -> dict[str, int]:
            latencies.clear()
            instance_ids = sorted(instance_id for instance_id, _, _, _ in items)
            await cur.execute(LOCK_INSTANCES.format(ids=placeholders(len(instance_ids))),
                              (ns, *instance_ids))
            found = {r["id"]: dict(r) for r in await cur.fetchall()}
            rows = await _fence(cur, "weave_inbox", ns, leased_rows, self.owner)
            due = await _fence(cur, "weave_pending_advances", ns, leased_due, self.owner)
            received = await signals.fence(cur, ns, [r for *_, sent in items for r in sent],
                                           self.owner)
            counts = {FENCED: len(leased_rows) + len(leased_due) - len(rows) - len(due)
                      + sum(len(sent) for *_, sent in items) - len(received)}
            now = await db_now(cur)
            rows_of, due_of, received_of = (_by_instance(rows), _by_instance(due),
                                             _by_instance(received))
            outcomes_due: dict[bytes, str] = {r["id"]: INSTANCE_ENDED for r in due}
            outcomes, running, paused = _classify(instance_ids, found, rows_of, due_of,
                                                  received_of)
            parked_due = [r for i in paused for r in due_of.get(i, [])]
            parked_ids = {r["id"] for r in parked_due}
            # Resumed instances with parked checkpoints replay them first, in order.
            replays = await _parked(cur, ns, [i for i in running if found[i]["checkpoints"]])
            runs = await self._prepare(cur, ns, running, found, now,
                                       [i for i in running if i in received_of
                                        or self._may_signal(found[i])],
                                       [r["id"] for r in received])
            changed: list[_Advance] = []
            replayed_due: list[dict[str, Any]] = []
            for run in runs:
                instance_id = run.instance["id"]
                replayed_due += _replay(run, replays.get(instance_id), outcomes, outcomes_due)
                for row in due_of.get(instance_id, []):
                    outcomes_due[row["id"]] = run.due(row)
                for row in rows_of.get(instance_id, []):
                    outcome = outcomes[row["id"]] = run.consume(row)
                    if outcome == ADVANCED:
                        latencies.append((now - as_utc(row["created_at"])).total_seconds())
                run.receive_signals()
                if run.changed:
                    changed.append(run)
            if replays:
                await _restore(cur, ns, sorted(replays), [r["id"] for r in replayed_due], now)
            if changed:
                await _write(cur, ns, changed, now)
            handled = [r for r in (*due, *replayed_due) if r["id"] not in parked_ids]
            early = [r["id"] for r in handled if outcomes_due[r["id"]] == timers.EARLY]
            await _consume(cur, ns, outcomes, [r["id"] for r in handled
                                               if r["id"] not in early], now)
            await timers.release(cur, ns, early)
            if paused:
                counts.update(await _park(cur, ns, paused, rows_of, parked_due, [
                    r for r in received if r["instance_id"] in paused]))
            counts.update(await _write_signals(cur, ns, runs, [  # of ended instances
                r for r in received
                if r["instance_id"] not in running and r["instance_id"] not in paused], now))
            await polls.rearm(cur, ns, [run.polls for run in runs])
            await _insert_tasks(cur, ns, changed, now)
            await _stopped_advances(cur, ns, runs, now)
            for row_id, outcome in (*outcomes.items(), *outcomes_due.items()):
                if row_id not in parked_ids:
                    counts[outcome] = counts.get(outcome, 0) + 1
            return {k: v for k, v in counts.items() if v}

        counts = await self.db.transaction("weave.advance", body)
        return _Result(outcomes=counts, seconds=time.monotonic() - began,
                       latencies=tuple(latencies))

    async def _prepare(self, cur: Any, ns: bytes, running: Sequence[bytes],  # noqa: PLR0917
                       found: Mapping[bytes, dict[str, Any]], now: Any,
                       signalled: Sequence[bytes], received: Sequence[bytes]
                       ) -> list[_Advance]:
        """The advances of the ``running`` instances (locked, in id order) with their rows,
        pinned versions, signal books (for ``signalled``; ``received``: the leased signals)
        and poll books, before any row or event is applied."""
        loaded = await _load_steps(cur, ns, running)
        books = await signals.load(cur, ns, signalled, now, received)
        poll_books = await _load_polls(cur, ns, found, loaded, now)
        runs: list[_Advance] = []
        for instance_id in running:
            instance = found[instance_id]
            try:
                model = await self._version(cur, instance)
            except DETERMINISTIC as exc:
                raise _Rejected(VERSION_UNUSABLE, str(exc)) from exc
            steps, made = loaded[instance_id]
            run = _Advance(instance, model, steps, made)
            run.now = now
            run.book = books.get(instance_id) or signals.Book(now=now)
            run.adopt(poll_books[instance_id])
            runs.append(run)
        # At most one task per TASK or POLL step of each version in one advance (a step runs
        # once per advance; a PARALLEL block starts each branch once).
        task_ids = TaskIds(min(TASK_IDS_POOL_MAX, sum(run.model.task_steps for run in runs)))
        for run in runs:  # in instance id order: each instance's tasks take a run of ids
            run.task_ids = task_ids
        return runs

    async def _reject(self, cur: Any, ns: bytes, instance_id: bytes,  # noqa: PLR0917
                      inbox: Sequence[dict[str, Any]], advances: Sequence[dict[str, Any]],
                      refusal: _Rejected, received: Sequence[dict[str, Any]] = ()
                      ) -> dict[str, int]:
        """The instance fails with the refusal; its rows are consumed as ``rejected``, its
        leased signals rejected as ``instance_finished``."""
        await cur.execute(LOCK_INSTANCE, (ns, instance_id))
        instance = await cur.fetchone()
        rows = await _fence(cur, "weave_inbox", ns, inbox, self.owner)
        due = await _fence(cur, "weave_pending_advances", ns, advances, self.owner)
        held = await signals.fence(cur, ns, received, self.owner)
        now = await db_now(cur)
        outcome = REJECTED
        book: signals.Book | None = None
        run: _Advance | None = None
        parked: list[dict[str, Any]] = []
        if instance is None or instance["state"] not in ("RUNNING", "STOPPING"):
            outcome = INSTANCE_ENDED if instance else STALE
        elif rows or due or held:
            instance = dict(instance)
            # Its parked checkpoints end with it: consumed as rejected, the RESUME row DONE.
            if instance["checkpoints"]:
                parked = (await _parked(cur, ns, [instance_id]))[instance_id]
            loaded = await _load_steps(cur, ns, [instance_id])
            books = await _load_polls(cur, ns, {instance_id: instance}, loaded, now)
            steps, made = loaded[instance_id]
            run = _Advance(instance, None, steps, made)
            book = run.book = (await signals.load(cur, ns, [instance_id], now,
                                                  [r["id"] for r in held]))[instance_id]
            run.adopt(books[instance_id])
            run.now = now
            run.rejected([*rows, *(r for r in parked if "source_event_id" in r)])
            run.fail(refusal.reason, refusal.cause)
            run.receive_signals()
            signals.sweep([(book, True)])
            await _write(cur, ns, [run], now)
            parked_due = [r["id"] for r in parked if "source_event_id" not in r]
            await _restore(cur, ns, [instance_id], parked_due, now)
            rows = [*rows, *(r for r in parked if "source_event_id" in r)]
            due = [*due, *(r for r in parked if "source_event_id" not in r)]
        await _consume(cur, ns, {r["id"]: outcome for r in rows}, [r["id"] for r in due], now)
        if run is not None:
            await _stopped_advances(cur, ns, [run], now)
        if book is not None:
            await signals.write(cur, ns, [(instance_id, book)], now)
        else:
            await signals.reject_orphans(cur, ns, held, now)
        counts = {outcome: len(rows) + len(due),
                  FENCED: len(inbox) + len(advances) + len(received) - len(rows) - len(due)
                  - len(held) + len(parked)}
        return {k: v for k, v in counts.items() if v}


GAUGE_INBOX = ("SELECT COUNT(*) AS n, TIMESTAMPDIFF(MICROSECOND, MIN(created_at),"
               " UTC_TIMESTAMP(6)) AS age_us FROM weave_inbox FORCE INDEX (ix_weave_inbox_scan)"
               " WHERE state IN ('PENDING', 'LEASED')")
GAUGE_QUARANTINED = ("SELECT COUNT(*) AS n FROM weave_inbox FORCE INDEX (ix_weave_inbox_scan)"
                     " WHERE state = 'QUARANTINED'")
GAUGE_ADVANCES = ("SELECT COUNT(*) AS n FROM weave_pending_advances"
                  " FORCE INDEX (ix_weave_advances_due)"
                  " WHERE (state = 'PENDING' AND due_at <= UTC_TIMESTAMP(6)) OR state = 'LEASED'")
GAUGE_INSTANCES = ("SELECT state, COUNT(*) AS n, SUM(paused) AS paused,"
                   " SUM(checkpoints) AS checkpoints FROM weave_instances GROUP BY state")
GAUGE_SIGNALS = ("SELECT COUNT(*) AS n FROM weave_signals FORCE INDEX (ix_weave_signals_scan)"
                 " WHERE state IN ('PENDING', 'LEASED')")
GAUGE_OVERDUE = ("SELECT TIMESTAMPDIFF(MICROSECOND, MIN(due_at), UTC_TIMESTAMP(6)) AS lag_us"
                 " FROM weave_pending_advances FORCE INDEX (ix_weave_advances_due)"
                 " WHERE state = 'PENDING' AND due_at <= UTC_TIMESTAMP(6)")


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
        states = await cur.fetchall()
        by_state = {r["state"]: int(r["n"]) for r in states}
        await cur.execute(GAUGE_SIGNALS)
        pending_signals = (await cur.fetchone())["n"]
        await cur.execute(GAUGE_OVERDUE)
        overdue = (await cur.fetchone())["lag_us"]
        return Gauges(inbox_backlog=int(inbox["n"]),
                      inbox_oldest_age_s=max(0, int(inbox["age_us"] or 0)) / 1e6,
                      advances_due=int(due), quarantined=int(quarantined),
                      instances=by_state, signals_pending=int(pending_signals),
                      advances_overdue_s=max(0, int(overdue or 0)) / 1e6,
                      paused=sum(int(r["paused"] or 0) for r in states),
                      checkpoints=sum(int(r["checkpoints"] or 0) for r in states))

    return await db.read("weave.gauges", body)

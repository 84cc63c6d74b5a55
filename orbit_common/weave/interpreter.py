"""An in-memory reference interpreter of the workflow language (docs/weave/language.md § 执行语义).

It shares nothing with the engine but the validated model and the expression evaluator: given a
definition, an input and a function that says how each task ends, it computes the tasks each
advance creates and the instance's final state and output. Tests compare the engine with it.

An *advance* is what the engine does in one transaction: the start, or the consumption of one
task's result. Within an advance, CHOICE, PARALLEL, SUCCEED and FAIL steps are passed at once;
every path stops at a TASK (its task is created), a POLL (its first round's task is created),
a TIMER (its timer is set) or at the end of its scope. Timers always fire: each set timer fires
as an advance of its own, oldest first, before the next task result is delivered (tests give
them short durations, so that the engine, whose timers fire when due, sees them in that order).
Results are then delivered one at a time, by default in the order the tasks were created
(``choose`` picks another order: the engine sees results in whatever order workers finish).

A SIGNAL step asks ``signals`` (the test decides) when it is entered: a signal that arrived
(:class:`SignalArrived`, as if it was sent before the wait existed: the engine consumes such a
signal in the advance that opens the wait) completes the step at once; none means the wait
times out -- after every task result has been delivered and every timer has fired, in its own
advance -- and continues at ``on_timeout`` (a wait without a timeout then waits for ever: the
instance stays RUNNING).

A POLL step's rounds are tasks too (``TaskCall.round`` numbers them): ``outcome`` says how each
round ends, so a test gives a sequence of round results. A round whose result does not satisfy
``until`` makes the next round at once, in the same advance (the engine makes it in an advance
of its own once the interval has passed); the interpreter has no clock, so it never exhausts a
query by its deadline -- only by ``max_rounds``.

A failure or timeout transition to ``$hold`` holds its step (docs/weave/recovery.md): the path
stops there and the step waits for a person; :attr:`Run.held` lists the held steps (with the
error each would have propagated) whose block has not closed since.
A failure that ends the top-level scope is a *failure settlement* (docs/weave/stop.md): the
tasks in flight -- those pending when the advance began (a block the failure closed in the same
advance included), not those the advance itself created (the engine cancels them before any
worker sees them) -- are still delivered, in the order ``choose`` gives, and recorded without
advancing: a success completes its step (its result is kept; a POLL round's only when ``until``
holds), anything else records nothing. Timers and signal timeouts no longer fire. The instance
is FAILED, with the failure that ended the scope, once the last of them is delivered (at once
when there is none).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from orbit_common.pulse.tasks import iso
from orbit_common.weave import expressions, timers, types
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

EXPRESSION_FAILED = "expression_failed"
RESULT_SHAPE = "result_shape_mismatch"
SIGNAL_TIMEOUT = "signal_timeout"
CORRELATION_MAX_BYTES = 512
POLL_EXHAUSTED = "poll_exhausted"


class InstanceState(enum.StrEnum):
    RUNNING = "RUNNING"  # a task is held (NEEDS_REVIEW) and nothing else can move
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@attrs.frozen(kw_only=True)
class TaskCall:
    """A task the instance creates: ``seq`` counts tasks of the instance from 1; ``branch`` is the
    path of PARALLEL branches it runs in (``("fulfil.pay",)``), empty at the top level;
    ``round`` the POLL round it runs (from 1; 0 for a TASK step's task)."""

    seq: int
    step: str
    queue: str
    handler: str
    input: Any
    branch: tuple[str, ...]
    round: int = 0


@attrs.frozen(kw_only=True)
class Succeeded:
    result: Any


@attrs.frozen(kw_only=True)
class Failed:
    error: Any


@attrs.frozen(kw_only=True)
class NeedsReview:
    """The task ended in NEEDS_REVIEW: its step holds until a person decides (part 3)."""


Outcome = Succeeded | Failed | NeedsReview


@attrs.frozen(kw_only=True)
class SignalArrived:
    """A signal that satisfies a SIGNAL step's wait; ``result`` is the step's result
    (``{"signal_id", "payload", "payload_version", "accepted_at"}``)."""

    result: Any


Signals = Callable[[SignalStep, bytes], SignalArrived | None]


@attrs.frozen(kw_only=True)
class TimerCall:
    """A timer the instance sets: its step, due time and branch path (as ``TaskCall``'s)."""

    step: str
    due_at: dt.datetime
    branch: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Advance:
    """One advance: ``trigger`` is ``0`` for the start and for a timer's firing (``timer``: its
    step), else the ``seq`` of the task whose result was consumed; ``created`` the tasks it
    created; ``ignored`` when the result belonged to a branch that a FAIL_FAST join had already
    closed (kept, never advanced)."""

    trigger: int
    created: tuple[TaskCall, ...]
    ignored: bool = False
    timeout: str | None = None  # the SIGNAL step whose wait timed out (trigger 0)
    timer: str | None = None


@attrs.frozen(kw_only=True)
class Run:
    state: InstanceState
    output: Any  # SUCCEEDED: the SUCCEED step's output
    error: Any  # FAILED: {"error": code, "cause": value, "step": name}
    advances: tuple[Advance, ...]
    results: dict[str, Any]  # step name -> result, for every step that completed
    held: dict[str, Any] = attrs.field(factory=dict)  # held step -> its held error

    @property
    def tasks(self) -> list[TaskCall]:
        return [call for advance in self.advances for call in advance.created]


@attrs.define
class _Block:
    """One running PARALLEL step."""

    step: ParallelStep
    frame: _Frame
    outcomes: dict[str, tuple[bool, Any]] = attrs.field(factory=dict)
    closed: bool = False


@attrs.frozen
class _Frame:
    """Where a path runs: the top level (``block`` None) or one branch of a running block."""

    block: _Block | None
    branch: str = ""

    def alive(self) -> bool:
        frame: _Frame = self
        while frame.block is not None:
            if frame.block.closed:
                return False
            frame = frame.block.frame
        return True

    def labels(self) -> tuple[str, ...]:
        found: list[str] = []
        frame: _Frame = self
        while frame.block is not None:
            found.append(f"{frame.block.step.name}.{frame.branch}")
            frame = frame.block.frame
        return tuple(reversed(found))


class _Instance:
    def __init__(self, definition: Definition, workflow_input: Any,
                 signals: Signals | None = None) -> None:
        self.definition = definition
        self.signals = signals
        self.timeouts: list[tuple[SignalStep, _Frame]] = []
        self.input = types.cel_input(definition.input_schema, workflow_input)
        self.results: dict[str, Any] = {}
        self.cel_results: dict[str, Any] = {}
        self.state = InstanceState.RUNNING
        self.output: Any = None
        self.error: Any = None
        self.seq = 0
        self.pending: list[tuple[TaskCall, TaskStep | PollStep, _Frame]] = []
        self.created: list[TaskCall] = []
        self.timers: list[tuple[TimerCall, TimerStep, _Frame]] = []
        self.held: list[tuple[str, Any, _Frame]] = []
        self.now = dt.datetime.now(dt.UTC)
        # The failure settlement: the in-flight tasks (by seq) still to be delivered; ``alive``
        # the pending tasks of live frames when the current advance began.
        self.stopping = False
        self.in_flight: set[int] = set()
        self.alive: set[int] = set()

    def begin_advance(self) -> None:
        self.created = []
        self.alive = {call.seq for call, _, frame in self.pending if frame.alive()}

    def evaluate(self, source: str) -> Any:
        return expressions.evaluate(source, {"input": self.input, "steps": self.cel_results})

    def run_path(self, name: str | None, frame: _Frame) -> None:
        """Pass steps from ``name`` until the path creates a task or ends its scope."""
        while name is not None:
            step: Step = self.definition.all_steps[name]
            try:
                name = self._pass(step, frame)
            except expressions.ExpressionError as exc:
                failure = _failure(EXPRESSION_FAILED, exc.message, step.name)
                if isinstance(step, TaskStep | PollStep):
                    self.task_failed(step, frame, failure)
                else:
                    self.scope_ended(frame, False, failure)
                return

    def _pass(self, step: Step, frame: _Frame) -> str | None:
        """Run one step; the next step of the same path, or None where the path stops."""
        if isinstance(step, ChoiceStep):
            return self.choose(step)
        if isinstance(step, TaskStep):
            self.create_task(step, frame)
        elif isinstance(step, PollStep):
            self.create_task(step, frame, 1)
        elif isinstance(step, ParallelStep):
            block = _Block(step=step, frame=frame)
            for branch in step.branches:
                if block.closed or not frame.alive():
                    break
                self.run_path(branch.start, _Frame(block, branch.name))
        elif isinstance(step, SucceedStep):
            value = None if step.output is None else self.evaluate(step.output)
            self.scope_ended(frame, True, value)
        elif isinstance(step, FailStep):
            cause = None if step.cause is None else self.evaluate(step.cause)
            self.scope_ended(frame, False, {"error": step.error, "cause": cause,
                                            "step": step.name})
        elif isinstance(step, TimerStep):
            due = timers.due_at(step, self.now, self.evaluate)
            self.timers.append((TimerCall(step=step.name, due_at=due, branch=frame.labels()),
                                step, frame))
        else:  # SignalStep: every kind of the language is handled above
            return self.wait(step, frame)
        return None

    def wait(self, step: SignalStep, frame: _Frame) -> str | None:
        value = "" if step.correlation is None else self.evaluate(step.correlation)
        if not isinstance(value, str):
            raise expressions.ExpressionError("the correlation is not a string")
        key = value.encode("utf-8", errors="surrogatepass")
        if len(key) > CORRELATION_MAX_BYTES:
            raise expressions.ExpressionError(
                f"the correlation key is {len(key)} bytes; at most {CORRELATION_MAX_BYTES}")
        arrived = None if self.signals is None else self.signals(step, key)
        if arrived is not None:
            self.completed(step.name, arrived.result, None)
            return step.next
        if step.on_timeout is not None:
            self.timeouts.append((step, frame))
        return None

    def create_task(self, step: TaskStep | PollStep, frame: _Frame, round_: int = 0) -> None:
        task_input = {} if step.input is None else self.evaluate(step.input)
        if not isinstance(task_input, dict):
            raise expressions.ExpressionError("the task input is not an object")
        self.seq += 1
        call = TaskCall(seq=self.seq, step=step.name, queue=step.queue, handler=step.handler,
                        input=task_input, branch=frame.labels(), round=round_)
        self.created.append(call)
        self.pending.append((call, step, frame))

    def choose(self, step: ChoiceStep) -> str:
        for choice in step.choices:
            holds = self.evaluate(choice.when)
            if not isinstance(holds, bool):
                raise expressions.ExpressionError("the condition is not a bool")
            if holds:
                return choice.next
        return step.default

    def timer_fired(self, call: TimerCall, step: TimerStep, frame: _Frame) -> None:
        """The timer fires on time (``late_ms`` 0): its result, then its ``next``."""
        when = iso(call.due_at)
        self.completed(step.name, {"due_at": when, "fired_at": when, "late_ms": 0}, None)
        self.run_path(step.next, frame)

    def completed(self, name: str, result: Any, schema: types.Schema | None) -> None:
        self.results[name] = result
        self.cel_results[name] = {"result": types.cel_input(schema, result)}

    def task_succeeded(self, step: TaskStep, frame: _Frame, result: Any) -> None:
        if step.result_schema is not None:
            found: list[dict[str, str]] = []
            types.value_problems(step.result_schema, result, "$.result", found)
            if found:
                self.task_failed(step, frame, _failure(
                    RESULT_SHAPE, f"{found[0]['path']}: {found[0]['message']}", step.name))
                return
        self.completed(step.name, result, step.result_schema)
        self.run_path(step.next, frame)

    def round_succeeded(self, step: PollStep, frame: _Frame, call: TaskCall,
                        result: Any) -> None:
        """A POLL round's task succeeded: the condition decides; not yet, the next round (or
        the query is exhausted by its rounds)."""
        if step.result_schema is not None:
            found: list[dict[str, str]] = []
            types.value_problems(step.result_schema, result, "$.result", found)
            if found:
                self.task_failed(step, frame, _failure(
                    RESULT_SHAPE, f"{found[0]['path']}: {found[0]['message']}", step.name))
                return
        try:
            holds = expressions.evaluate(step.until, {
                "input": self.input, "steps": self.cel_results,
                "round": {"result": types.cel_input(step.result_schema, result)}})
        except expressions.ExpressionError as exc:
            self.task_failed(step, frame, _failure(EXPRESSION_FAILED, exc.message, step.name))
            return
        if not isinstance(holds, bool):
            self.task_failed(step, frame, _failure(
                EXPRESSION_FAILED, "the condition is not a bool", step.name))
            return
        if holds:
            self.completed(step.name, result, step.result_schema)
            self.run_path(step.next, frame)
            return
        if call.round < step.max_rounds:
            try:
                self.create_task(step, frame, call.round + 1)
            except expressions.ExpressionError as exc:
                self.task_failed(step, frame, _failure(EXPRESSION_FAILED, exc.message,
                                                       step.name))
            return
        failure = {"error": POLL_EXHAUSTED, "rounds": call.round, "reason": "max_rounds",
                   "step": step.name}
        target = step.on_exhausted or step.on_failure
        if target == HOLD:
            self.held.append((step.name, failure, frame))
        elif target is not None:
            self.run_path(target, frame)
        else:
            self.scope_ended(frame, False, failure)

    def task_failed(self, step: TaskStep | ParallelStep | PollStep, frame: _Frame,
                    error: Any) -> None:
        if isinstance(error, dict) and "step" not in error:
            error = {**error, "step": step.name}
        if step.on_failure == HOLD:
            self.held.append((step.name, error, frame))
        elif step.on_failure is not None:
            self.run_path(step.on_failure, frame)
        else:
            self.scope_ended(frame, False, error)

    def scope_ended(self, frame: _Frame, ok: bool, value: Any) -> None:
        block = frame.block
        if block is None:
            if ok:
                self.state = InstanceState.SUCCEEDED
                self.output = value
                return
            self.error = value
            self.in_flight = {call.seq for call, _, _ in self.pending if call.seq in self.alive}
            self.timers.clear()
            self.timeouts.clear()
            if self.in_flight:
                self.stopping = True
            else:
                self.state = InstanceState.FAILED
            return
        if block.closed:
            return
        block.outcomes[frame.branch] = (ok, value)
        step = block.step
        if not ok and step.policy == "FAIL_FAST":
            block.closed = True
            self.task_failed(step, block.frame, value)
            return
        if len(block.outcomes) < len(step.branches):
            return
        block.closed = True
        for branch in step.branches:
            ok_branch, found = block.outcomes[branch.name]
            if not ok_branch:
                self.task_failed(step, block.frame, found)
                return
        result = {branch.name: block.outcomes[branch.name][1] for branch in step.branches}
        self.completed(step.name, result, None)
        self.run_path(step.next, block.frame)


def _stopped(instance: _Instance, call: TaskCall, step: TaskStep | PollStep,
             ended: Outcome) -> None:
    """An in-flight task's result while the instance stops: a success is recorded (a TASK
    step's result if its shape holds, a POLL round's if ``until`` holds); nothing advances."""
    instance.in_flight.discard(call.seq)
    if isinstance(ended, Succeeded):
        result = ended.result
        found: list[dict[str, str]] = []
        if step.result_schema is not None:
            types.value_problems(step.result_schema, result, "$.result", found)
        if not found:
            holds: Any = True
            if isinstance(step, PollStep):
                try:
                    holds = expressions.evaluate(step.until, {
                        "input": instance.input, "steps": instance.cel_results,
                        "round": {"result": types.cel_input(step.result_schema, result)}})
                except expressions.ExpressionError:
                    holds = False
            if holds is True:
                instance.results[step.name] = result
    if not instance.in_flight:
        instance.stopping = False
        instance.state = InstanceState.FAILED


def _failure(code: str, message: str, step: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"error": code, "cause": message}
    if step is not None:
        found["step"] = step
    return found


def run(definition: Definition, workflow_input: Any, outcome: Callable[[TaskCall], Outcome],
        choose: Callable[[Sequence[TaskCall]], int] | None = None, *,
        signals: Signals | None = None,
        fire: Callable[[Sequence[TimerCall]], int] | None = None) -> Run:
    """Run an instance to its end (or until only held tasks and waits without a timeout
    remain).

    ``workflow_input`` must match the definition's input schema (:meth:`Definition.input_problems`
    is the check the start does). ``outcome`` says how each task ends; ``choose`` picks the index
    of the next result to deliver among the tasks still running (default: the oldest);
    ``signals`` says whether a SIGNAL step's signal arrives (default: none does); ``fire`` the
    index of the next timer to fire among those set (default: the oldest; timers set by one
    advance are due at the same instant, and the engine fires those in its own order)."""
    instance = _Instance(definition, workflow_input, signals)
    instance.run_path(definition.start, _Frame(None))
    advances = [Advance(trigger=0, created=tuple(instance.created))]
    held: list[TaskCall] = []

    def waiting() -> bool:
        # A timer whose block closed was cancelled with it (the engine cancels its wait in the
        # advance that closes the block): it never fires, and ``fire`` never chooses it.
        instance.timers = [t for t in instance.timers if t[2].alive()]
        return bool(instance.pending or instance.timers or instance.timeouts)

    while instance.state is InstanceState.RUNNING and waiting():
        instance.begin_advance()
        if instance.stopping:
            index = 0 if choose is None else choose([call for call, _, _ in instance.pending])
            call, step, _ = instance.pending.pop(index)
            if call.seq in instance.in_flight:
                _stopped(instance, call, step, outcome(call))
                advances.append(Advance(trigger=call.seq, created=()))
            else:
                advances.append(Advance(trigger=call.seq, created=(), ignored=True))
            continue
        if instance.timers:
            timer, timer_step, timer_frame = instance.timers.pop(
                0 if fire is None else fire([t for t, _, _ in instance.timers]))
            instance.timer_fired(timer, timer_step, timer_frame)
            advances.append(Advance(trigger=0, created=tuple(instance.created),
                                    timer=timer.step))
            continue
        if not instance.pending:
            advances.append(_time_out(instance))
            continue
        index = 0 if choose is None else choose([call for call, _, _ in instance.pending])
        call, step, frame = instance.pending.pop(index)
        if not frame.alive():
            advances.append(Advance(trigger=call.seq, created=(), ignored=True))
            continue
        ended = outcome(call)
        if isinstance(ended, NeedsReview):
            held.append(call)
            continue
        if isinstance(ended, Failed):
            instance.task_failed(step, frame, {"error": "task_failed", "cause": ended.error})
        elif isinstance(step, PollStep):
            instance.round_succeeded(step, frame, call, ended.result)
        else:
            instance.task_succeeded(step, frame, ended.result)
        advances.append(Advance(trigger=call.seq, created=tuple(instance.created)))
    held_steps = ({name: error for name, error, frame in instance.held if frame.alive()}
                  if instance.state is InstanceState.RUNNING else {})
    return Run(state=instance.state, output=instance.output, error=instance.error,
               advances=tuple(advances), results=dict(instance.results), held=held_steps)


def _time_out(instance: _Instance) -> Advance:
    """The oldest SIGNAL wait with a timeout times out: ``signal_timeout``, then
    ``on_timeout`` (ignored when its block has closed)."""
    step, frame = instance.timeouts.pop(0)
    if not frame.alive():
        return Advance(trigger=0, created=(), ignored=True, timeout=step.name)
    if step.on_timeout == HOLD:
        instance.held.append((step.name, {"error": SIGNAL_TIMEOUT, "step": step.name}, frame))
    else:
        instance.run_path(step.on_timeout, frame)
    return Advance(trigger=0, created=tuple(instance.created), timeout=step.name)

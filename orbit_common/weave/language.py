"""Workflow definitions: parse, validate, canonical form (docs/weave/language.md).

:func:`parse_definition` takes the document's bytes and returns an immutable
:class:`Definition` or raises :class:`errors.DefinitionInvalid` whose ``errors`` list every
problem with the JSON path of the offending part and a per-problem ``code``. Checks, in order:

1. shape: known fields only, kinds, names, limits, TASK options (the rules of task submission,
   :func:`orbit_common.pulse.tasks.validate`), schemas;
2. the graph of each scope (the top-level steps, and each PARALLEL branch's own steps):
   every target exists in the same scope (a branch never jumps out of its block or into
   another: joins are structured), every step is reachable from the scope's start, no cycle
   (a loop is written as a POLL step, the bounded loop; a step runs at most once per
   activation of its scope);
3. expressions: each compiles and type-checks against the declared input schema and the result
   shapes of the steps that have certainly completed before it (the ``steps`` a CHOICE sees after
   a TASK's failure transition do not include that TASK), with the result type its place needs.

Queue existence is not checked here: the publish transaction checks :attr:`Definition.queues`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import attrs
from cel_expr_python import cel

from orbit_common import errors
from orbit_common.model import digests, jsondoc, strict
from orbit_common.pulse import tasks
from orbit_common.weave import expressions, types
from orbit_common.weave.types import Schema

FORMAT = "orbit.weave/1"
MAX_DOCUMENT_BYTES = 256 * 1024
MAX_STEPS = 200
MAX_BRANCHES = 64
MAX_CHOICES = 32
MAX_PARALLEL_DEPTH = 4
MAX_DESCRIPTION_CHARS = 1024
KINDS = ("TASK", "CHOICE", "PARALLEL", "SUCCEED", "FAIL", "TIMER", "SIGNAL", "POLL")
MAX_WAIT_MS = 366 * 24 * 3600 * 1000  # a TIMER's duration, a SIGNAL's timeout, a POLL's deadline
MAX_INTERVAL_MS = 24 * 3600 * 1000
MIN_INTERVAL_MS = 100
MAX_ROUNDS = 10_000
MAX_PAYLOAD_VERSIONS = 16
MAX_PAYLOAD_VERSION = 1_000_000
MAX_BACKOFF_MULTIPLIER = 10
POLICIES = ("ALL_SUCCEED", "FAIL_FAST")
# The reserved target of a failure or timeout transition (TASK and POLL ``on_failure``, SIGNAL
# ``on_timeout``, POLL ``on_exhausted``): instead of transitioning, the step is *held* -- it
# stays WAITING with its activation LIVE until a person decides (docs/weave/recovery.md). It is
# not a step: it has no reachability or visibility effect.
HOLD = "$hold"
ERROR_CODE = re.compile(r"\A[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z")
ERROR_CODE_RULE = ("1-64 characters: lowercase letters, digits, '.', '_' or '-', "
                   "starting and ending with a letter or digit")
# The task submission options a TASK step carries (tasks.SubmitRequest's names and rules).
TASK_OPTIONS = ("priority", "deadline_ms", "start_deadline_ms", "attempt_timeout_ms", "retry",
                "rerun_safe", "offer_lease_ms", "execution_lease_ms", "concurrency_key")

_COMMON = ("kind", "description")
_FIELDS: dict[str, frozenset[str]] = {
    "TASK": frozenset((*_COMMON, "queue", "handler", "input", "result_schema", "next",
                       "on_failure", *TASK_OPTIONS)),
    "CHOICE": frozenset((*_COMMON, "choices", "default")),
    "PARALLEL": frozenset((*_COMMON, "branches", "join", "next", "on_failure")),
    "SUCCEED": frozenset((*_COMMON, "output")),
    "FAIL": frozenset((*_COMMON, "error", "cause")),
    "TIMER": frozenset((*_COMMON, "duration_ms", "until", "next")),
    "SIGNAL": frozenset((*_COMMON, "signal", "correlation", "payload_versions", "timeout_ms",
                         "on_timeout", "next")),
    "POLL": frozenset((*_COMMON, "queue", "handler", "input", "result_schema", "until",
                       "interval_ms", "backoff", "max_rounds", "query_deadline_ms", "next",
                       "on_exhausted", "on_failure", *TASK_OPTIONS)),
}
_TOP_FIELDS = frozenset({"format", "description", "input_schema", "start", "steps"})


# --- the model ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TaskOptions:
    """What a TASK step's task is submitted with besides queue, handler and input."""

    priority: int
    deadline_ms: int | None
    start_deadline_ms: int | None
    attempt_timeout_ms: int | None
    retry: tasks.RetryOverrides
    rerun_safe: bool
    offer_lease_ms: int | None
    execution_lease_ms: int | None
    concurrency_key: bytes | None


@attrs.frozen(kw_only=True)
class TaskStep:
    name: str
    path: str
    queue: str
    handler: str
    input: str | None  # a CEL expression building the task's input object; None: {}
    options: TaskOptions
    result_schema: Schema | None
    next: str
    on_failure: str | None
    kind: Literal["TASK"] = "TASK"


@attrs.frozen(kw_only=True)
class Choice:
    when: str
    next: str


@attrs.frozen(kw_only=True)
class ChoiceStep:
    name: str
    path: str
    choices: tuple[Choice, ...]
    default: str
    kind: Literal["CHOICE"] = "CHOICE"


@attrs.frozen(kw_only=True)
class Branch:
    name: str
    path: str
    start: str
    steps: Mapping[str, Step]


@attrs.frozen(kw_only=True)
class ParallelStep:
    name: str
    path: str
    branches: tuple[Branch, ...]
    policy: Literal["ALL_SUCCEED", "FAIL_FAST"]
    next: str
    on_failure: str | None
    kind: Literal["PARALLEL"] = "PARALLEL"


@attrs.frozen(kw_only=True)
class SucceedStep:
    name: str
    path: str
    output: str | None  # None: the output is null
    kind: Literal["SUCCEED"] = "SUCCEED"


@attrs.frozen(kw_only=True)
class FailStep:
    name: str
    path: str
    error: str
    cause: str | None
    kind: Literal["FAIL"] = "FAIL"


@attrs.frozen(kw_only=True)
class TimerStep:
    """Wait ``duration_ms`` from the step's start, or until the instant ``until`` gives (a CEL
    expression of an RFC 3339 string); exactly one of the two."""

    name: str
    path: str
    duration_ms: int | None
    until: str | None
    next: str
    kind: Literal["TIMER"] = "TIMER"


@attrs.frozen(kw_only=True)
class SignalStep:
    """Wait for one signal named ``signal`` whose correlation key is the bytes (UTF-8) of the
    ``correlation`` expression's string ("" when absent) and whose payload version is one of
    ``payload_versions``; after ``timeout_ms`` (if given) continue at ``on_timeout``."""

    name: str
    path: str
    signal: str
    correlation: str | None
    payload_versions: tuple[int, ...]
    timeout_ms: int | None
    on_timeout: str | None
    next: str
    kind: Literal["SIGNAL"] = "SIGNAL"


@attrs.frozen(kw_only=True)
class Backoff:
    multiplier: float
    max_interval_ms: int


@attrs.frozen(kw_only=True)
class PollStep:
    """A task repeated, one round at a time, until ``until`` (a CEL condition over ``result``,
    the round's task result) holds: at most ``max_rounds`` rounds, ``interval_ms`` between a
    round's end and the next (grown by ``backoff``), the whole query within ``query_deadline_ms``
    of the step's start; each round's task has the step's options (``retry.max_attempts`` is the
    attempts per round, ``deadline_ms`` each request's deadline). Exhausted: ``on_exhausted``,
    else the step fails with ``poll_exhausted``."""

    name: str
    path: str
    queue: str
    handler: str
    input: str | None
    options: TaskOptions
    result_schema: Schema | None
    until: str
    interval_ms: int
    backoff: Backoff | None
    max_rounds: int
    query_deadline_ms: int | None
    next: str
    on_exhausted: str | None
    on_failure: str | None
    kind: Literal["POLL"] = "POLL"


Step = (TaskStep | ChoiceStep | ParallelStep | SucceedStep | FailStep | TimerStep | SignalStep
        | PollStep)


@attrs.frozen(kw_only=True)
class Definition:
    """A validated definition. ``steps`` is the top-level scope; ``all_steps`` every step by its
    (document-wide unique) name; ``canonical`` the canonical JSON bytes, ``digest`` their
    SHA-256; ``queues`` the distinct queues of its TASK steps, sorted."""

    input_schema: Schema
    start: str
    steps: Mapping[str, Step]
    all_steps: Mapping[str, Step]
    queues: tuple[str, ...]  # of TASK and POLL steps
    canonical: bytes
    digest: bytes
    document: Any = attrs.field(eq=False, repr=False)

    def input_problems(self, value: Any) -> list[dict[str, str]]:
        """Where a workflow input (normal parse) does not match the input schema."""
        found: list[dict[str, str]] = []
        types.value_problems(self.input_schema, value, "$.input", found)
        return found


def targets(step: Step) -> list[tuple[str, str]]:
    """The transitions of ``step`` in its scope: (JSON path of the field, target name). A
    ``$hold`` target (:data:`HOLD`) is no transition: it is left out."""
    return [(where, target) for where, target in _targets(step) if target != HOLD]


def _targets(step: Step) -> list[tuple[str, str]]:
    if isinstance(step, TaskStep | ParallelStep):
        found = [(f"{step.path}.next", step.next)]
        if step.on_failure is not None:
            found.append((f"{step.path}.on_failure", step.on_failure))
        return found
    if isinstance(step, ChoiceStep):
        return [*((f"{step.path}.choices[{i}].next", c.next) for i, c in enumerate(step.choices)),
                (f"{step.path}.default", step.default)]
    if isinstance(step, TimerStep):
        return [(f"{step.path}.next", step.next)]
    if isinstance(step, SignalStep):
        found = [(f"{step.path}.next", step.next)]
        if step.on_timeout is not None:
            found.append((f"{step.path}.on_timeout", step.on_timeout))
        return found
    if isinstance(step, PollStep):
        found = [(f"{step.path}.next", step.next)]
        for key in ("on_exhausted", "on_failure"):
            target = getattr(step, key)
            if target is not None:
                found.append((f"{step.path}.{key}", target))
        return found
    return []


# --- problems -----------------------------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.found: list[dict[str, str]] = []

    def __call__(self, path: str, code: str, message: str) -> None:
        self.found.append({"path": path, "code": code, "message": message})

    def raise_if_any(self) -> None:
        if self.found:
            raise errors.DefinitionInvalid(self.found)


def _fields(raw: dict[str, Any], allowed: frozenset[str], required: tuple[str, ...], path: str,
            problem: _Problems) -> None:
    for key in raw:
        if key not in allowed:
            problem(types.member(path, key), "unknown_field", "unknown field")
    for key in required:
        if key not in raw:
            problem(f"{path}.{key}", "missing_field", "required")


def _string(raw: dict[str, Any], key: str, path: str, problem: _Problems) -> str | None:
    if key not in raw:
        return None
    value = raw[key]
    if not isinstance(value, str):
        problem(f"{path}.{key}", "invalid_value", "expected a string")
        return None
    return value


def _expression(raw: dict[str, Any], key: str, path: str, problem: _Problems) -> str | None:
    source = _string(raw, key, path, problem)
    if source is not None and not 1 <= len(source) <= expressions.MAX_EXPRESSION_CHARS:
        problem(f"{path}.{key}", "limit_exceeded",
                f"an expression of 1-{expressions.MAX_EXPRESSION_CHARS} characters")
        return None
    return source


def _name_of(raw: dict[str, Any], key: str, path: str, problem: _Problems) -> str:
    value = _string(raw, key, path, problem)
    if value is None:
        return ""
    if not types.is_identifier(value):
        problem(f"{path}.{key}", "invalid_name", types.IDENTIFIER_RULE)
    return value


# --- shape --------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, problem: _Problems) -> None:
        self.problem = problem
        self.all_steps: dict[str, Step] = {}
        self.count = 0

    def scope(self, raw: Any, path: str, depth: int) -> dict[str, Step]:
        problem = self.problem
        if not isinstance(raw, dict) or not raw:
            problem(path, "invalid_value", "expected a JSON object of at least one step")
            return {}
        steps: dict[str, Step] = {}
        for name, body in raw.items():
            where = types.member(path, name)
            self.count += 1
            if self.count == MAX_STEPS + 1:
                problem(where, "limit_exceeded", f"a definition has at most {MAX_STEPS} steps")
            if not types.is_identifier(name):
                problem(where, "invalid_name", types.IDENTIFIER_RULE)
                continue
            if name in self.all_steps or name in steps:
                problem(where, "duplicate_name",
                        "another step has this name (step names are unique in a definition)")
                continue
            step = self.step(name, body, where, depth)
            if step is not None:
                steps[name] = step
                self.all_steps[name] = step
        return steps

    def step(self, name: str, raw: Any, path: str, depth: int) -> Step | None:
        problem = self.problem
        if not isinstance(raw, dict):
            problem(path, "invalid_value", "expected a JSON object (a step)")
            return None
        kind = raw.get("kind")
        if kind not in KINDS:
            problem(f"{path}.kind", "invalid_value", f"one of {', '.join(KINDS)}")
            return None
        required = {"TASK": ("queue", "handler", "next"), "CHOICE": ("choices", "default"),
                    "PARALLEL": ("branches", "join", "next"), "SUCCEED": (),
                    "FAIL": ("error",), "TIMER": ("next",), "SIGNAL": ("signal", "next"),
                    "POLL": ("queue", "handler", "until", "interval_ms", "max_rounds",
                             "next")}[kind]
        _fields(raw, _FIELDS[kind], required, path, problem)
        description = raw.get("description")
        if description is not None and (not isinstance(description, str)
                                        or len(description) > MAX_DESCRIPTION_CHARS):
            problem(f"{path}.description", "invalid_value",
                    f"a string of at most {MAX_DESCRIPTION_CHARS} characters")
        if kind == "TASK":
            return self.task(name, raw, path)
        if kind == "CHOICE":
            return self.choice(name, raw, path)
        if kind == "PARALLEL":
            return self.parallel(name, raw, path, depth)
        if kind == "TIMER":
            return self.timer(name, raw, path)
        if kind == "SIGNAL":
            return self.signal(name, raw, path)
        if kind == "POLL":
            return self.poll(name, raw, path)
        if kind == "SUCCEED":
            return SucceedStep(name=name, path=path,
                               output=_expression(raw, "output", path, problem))
        error = _string(raw, "error", path, problem) or ""
        if "error" in raw and isinstance(raw["error"], str) and not ERROR_CODE.match(error):
            problem(f"{path}.error", "invalid_value", ERROR_CODE_RULE)
        return FailStep(name=name, path=path, error=error,
                        cause=_expression(raw, "cause", path, problem))

    def task(self, name: str, raw: dict[str, Any], path: str) -> TaskStep:
        return TaskStep(
            name=name, path=path, queue=str(raw.get("queue", "")),
            handler=str(raw.get("handler", "")),
            input=_expression(raw, "input", path, self.problem),
            options=self.options(raw, path), result_schema=self.result_schema(raw, path),
            next=_name_of(raw, "next", path, self.problem),
            on_failure=self.optional_target(raw, "on_failure", path, hold=True))

    def optional_target(self, raw: dict[str, Any], key: str, path: str, *,
                        hold: bool = False) -> str | None:
        """A transition's target if given; ``hold``: ``$hold`` is allowed here."""
        if key not in raw:
            return None
        if raw[key] == HOLD:
            if hold:
                return HOLD
            self.problem(f"{path}.{key}", "invalid_value",
                         f"{HOLD} is allowed only as on_failure of a TASK or POLL step, "
                         "on_timeout of a SIGNAL step and on_exhausted of a POLL step")
            return ""
        return _name_of(raw, key, path, self.problem)

    def result_schema(self, raw: dict[str, Any], path: str) -> Schema | None:
        if "result_schema" not in raw:
            return None
        return types.parse_schema(raw["result_schema"], f"{path}.result_schema", self.problem)

    def options(self, raw: dict[str, Any], path: str) -> TaskOptions:
        """A TASK or POLL step's task options, checked by the rules of task submission."""
        problem = self.problem
        submit = {key: raw[key] for key in ("queue", "handler", *TASK_OPTIONS) if key in raw}
        options = None
        try:
            dto = strict.structure({"queue": "", "handler": "", **submit}, tasks.SubmitRequest)
        except errors.ValidationFailed as exc:
            for found in exc.errors:
                extra = found["message"].startswith("extra fields found")
                problem(path + found["path"][1:], "unknown_field" if extra else "invalid_value",
                        found["message"])
        else:
            spec, found_problems = tasks.validate(dto, {}, path)
            missing = {f"{path}.{key}" for key in ("queue", "handler") if key not in raw}
            for found in found_problems:
                if found["path"] not in missing:  # reported as missing_field already
                    problem(found["path"], "invalid_value", found["message"])
            if spec is not None:
                options = TaskOptions(
                    priority=spec.priority, deadline_ms=spec.deadline_ms,
                    start_deadline_ms=spec.start_deadline_ms,
                    attempt_timeout_ms=spec.attempt_timeout_ms, retry=spec.retry,
                    rerun_safe=spec.rerun_safe, offer_lease_ms=spec.offer_lease_ms,
                    execution_lease_ms=spec.execution_lease_ms,
                    concurrency_key=spec.concurrency_key)
        return options or TaskOptions(
            priority=0, deadline_ms=None, start_deadline_ms=None, attempt_timeout_ms=None,
            retry=tasks.RetryOverrides(), rerun_safe=False, offer_lease_ms=None,
            execution_lease_ms=None, concurrency_key=None)

    def milliseconds(self, raw: dict[str, Any], key: str, path: str, low: int,
                     high: int) -> int | None:
        if key not in raw:
            return None
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.problem(f"{path}.{key}", "invalid_value", f"an integer {low}-{high}")
            return None
        return value

    def timer(self, name: str, raw: dict[str, Any], path: str) -> TimerStep:
        if ("duration_ms" in raw) == ("until" in raw):
            self.problem(path, "invalid_value", "exactly one of duration_ms and until")
        return TimerStep(
            name=name, path=path,
            duration_ms=self.milliseconds(raw, "duration_ms", path, 1, MAX_WAIT_MS),
            until=_expression(raw, "until", path, self.problem),
            next=_name_of(raw, "next", path, self.problem))

    def signal(self, name: str, raw: dict[str, Any], path: str) -> SignalStep:
        problem = self.problem
        versions: tuple[int, ...] = (1,)
        if "payload_versions" in raw:
            found = raw["payload_versions"]
            if (not isinstance(found, list) or not 1 <= len(found) <= MAX_PAYLOAD_VERSIONS
                    or any(isinstance(v, bool) or not isinstance(v, int)
                           or not 1 <= v <= MAX_PAYLOAD_VERSION for v in found)
                    or len(set(found)) != len(found)):
                problem(f"{path}.payload_versions", "invalid_value",
                        f"an array of 1-{MAX_PAYLOAD_VERSIONS} distinct integers "
                        f"1-{MAX_PAYLOAD_VERSION}")
            else:
                versions = tuple(sorted(found))
        timeout_ms = self.milliseconds(raw, "timeout_ms", path, 1, MAX_WAIT_MS)
        if ("timeout_ms" in raw) != ("on_timeout" in raw):
            problem(path, "invalid_value", "timeout_ms and on_timeout go together")
        return SignalStep(
            name=name, path=path, signal=_name_of(raw, "signal", path, problem),
            correlation=_expression(raw, "correlation", path, problem),
            payload_versions=versions, timeout_ms=timeout_ms,
            on_timeout=self.optional_target(raw, "on_timeout", path, hold=True),
            next=_name_of(raw, "next", path, problem))

    def poll(self, name: str, raw: dict[str, Any], path: str) -> PollStep:
        problem = self.problem
        backoff = None
        if "backoff" in raw:
            found = raw["backoff"]
            where = f"{path}.backoff"
            if not isinstance(found, dict):
                problem(where, "invalid_value", "expected a JSON object")
            else:
                _fields(found, frozenset({"multiplier", "max_interval_ms"}),
                        ("multiplier", "max_interval_ms"), where, problem)
                multiplier = found.get("multiplier")
                if (isinstance(multiplier, bool) or not isinstance(multiplier, int | float)
                        or not 1 <= multiplier <= MAX_BACKOFF_MULTIPLIER):
                    problem(f"{where}.multiplier", "invalid_value",
                            f"a number 1-{MAX_BACKOFF_MULTIPLIER}")
                    multiplier = None
                ceiling = self.milliseconds(found, "max_interval_ms", where, MIN_INTERVAL_MS,
                                            MAX_INTERVAL_MS)
                if multiplier is not None and ceiling is not None:
                    backoff = Backoff(multiplier=float(multiplier), max_interval_ms=ceiling)
        interval = self.milliseconds(raw, "interval_ms", path, MIN_INTERVAL_MS, MAX_INTERVAL_MS)
        if interval is not None and backoff is not None and backoff.max_interval_ms < interval:
            problem(f"{path}.backoff.max_interval_ms", "invalid_value",
                    "at least interval_ms")
        return PollStep(
            name=name, path=path, queue=str(raw.get("queue", "")),
            handler=str(raw.get("handler", "")),
            input=_expression(raw, "input", path, problem), options=self.options(raw, path),
            result_schema=self.result_schema(raw, path),
            until=_expression(raw, "until", path, problem) or "",
            interval_ms=interval or MIN_INTERVAL_MS, backoff=backoff,
            max_rounds=self.milliseconds(raw, "max_rounds", path, 1, MAX_ROUNDS) or 1,
            query_deadline_ms=self.milliseconds(raw, "query_deadline_ms", path, 1,
                                                MAX_WAIT_MS),
            next=_name_of(raw, "next", path, problem),
            on_exhausted=self.optional_target(raw, "on_exhausted", path, hold=True),
            on_failure=self.optional_target(raw, "on_failure", path, hold=True))

    def choice(self, name: str, raw: dict[str, Any], path: str) -> ChoiceStep:
        problem = self.problem
        found = raw.get("choices")
        choices: list[Choice] = []
        if not isinstance(found, list) or not 1 <= len(found) <= MAX_CHOICES:
            problem(f"{path}.choices", "invalid_value",
                    f"expected an array of 1-{MAX_CHOICES} choices")
            found = []
        for index, item in enumerate(found):
            where = f"{path}.choices[{index}]"
            if not isinstance(item, dict):
                problem(where, "invalid_value", "expected a JSON object (a choice)")
                continue
            _fields(item, frozenset({"when", "next"}), ("when", "next"), where, problem)
            when = _expression(item, "when", where, problem)
            choices.append(Choice(when=when or "", next=_name_of(item, "next", where, problem)))
        return ChoiceStep(name=name, path=path, choices=tuple(choices),
                          default=_name_of(raw, "default", path, problem))

    def parallel(self, name: str, raw: dict[str, Any], path: str, depth: int) -> ParallelStep:
        problem = self.problem
        if depth >= MAX_PARALLEL_DEPTH:
            problem(path, "limit_exceeded",
                    f"PARALLEL steps nest at most {MAX_PARALLEL_DEPTH} levels")
        join = raw.get("join")
        policy = "ALL_SUCCEED"
        if isinstance(join, dict):
            _fields(join, frozenset({"policy"}), ("policy",), f"{path}.join", problem)
            if "policy" in join and join["policy"] not in POLICIES:
                problem(f"{path}.join.policy", "invalid_value", f"one of {', '.join(POLICIES)}")
            elif "policy" in join:
                policy = join["policy"]
        elif "join" in raw:
            problem(f"{path}.join", "invalid_value", "expected a JSON object")
        found = raw.get("branches")
        if not isinstance(found, list) or not 1 <= len(found) <= MAX_BRANCHES:
            problem(f"{path}.branches", "invalid_value",
                    f"expected an array of 1-{MAX_BRANCHES} branches")
            found = []
        branches: list[Branch] = []
        names: set[str] = set()
        for index, item in enumerate(found):
            where = f"{path}.branches[{index}]"
            if not isinstance(item, dict):
                problem(where, "invalid_value", "expected a JSON object (a branch)")
                continue
            _fields(item, frozenset({"name", "start", "steps"}), ("name", "start", "steps"),
                    where, problem)
            branch_name = _name_of(item, "name", where, problem)
            if branch_name in names:
                problem(f"{where}.name", "duplicate_name", "another branch has this name")
            names.add(branch_name)
            steps = self.scope(item.get("steps"), f"{where}.steps", depth + 1)
            branches.append(Branch(name=branch_name, path=where,
                                   start=_name_of(item, "start", where, problem),
                                   steps=MappingProxyType(steps)))
        return ParallelStep(name=name, path=path, branches=tuple(branches),
                            policy=policy,  # type: ignore[arg-type]
                            next=_name_of(raw, "next", path, problem),
                            on_failure=self.optional_target(raw, "on_failure", path))


# --- the graph ----------------------------------------------------------------------------------


@attrs.frozen
class _Scope:
    path: str  # the JSON path of the object holding ``start`` and ``steps``
    start: str
    steps: Mapping[str, Step]


def _scopes(top: _Scope) -> list[_Scope]:
    found = [top]
    for step in top.steps.values():
        if isinstance(step, ParallelStep):
            for branch in step.branches:
                found.extend(_scopes(_Scope(branch.path, branch.start, branch.steps)))
    return found


def _check_graph(scope: _Scope, all_steps: Mapping[str, Step], problem: _Problems) -> bool:
    """Targets, reachability and cycles of one scope; True when it has no such problem."""
    before = len(problem.found)
    if scope.start not in scope.steps:
        _missing(f"{scope.path}.start", scope.start, all_steps, problem)
        return False
    incoming: set[str] = set()
    for step in scope.steps.values():
        for where, target in targets(step):
            if target in scope.steps:
                incoming.add(target)
            else:
                _missing(where, target, all_steps, problem)
    if len(problem.found) > before:
        return False
    _reach(scope, incoming, problem)
    _cycles(scope, problem)
    return len(problem.found) == before



def _reach(scope: _Scope, incoming: set[str], problem: _Problems) -> None:
    seen = {scope.start}
    todo = [scope.start]
    while todo:
        for _, target in targets(scope.steps[todo.pop()]):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    for name, step in scope.steps.items():
        if name in seen:
            continue
        if name in incoming:
            problem(step.path, "unreachable_step", "no path from the start step leads here")
        else:
            problem(step.path, "orphan_step", "no transition leads to this step")


def _cycles(scope: _Scope, problem: _Problems) -> None:
    """Depth-first search; the transition that closes a cycle is the offending part."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for root in [scope.start, *scope.steps]:  # from the start first: the closing edge is the
        # one that leads back, whatever order the document lists the steps in
        if root in state:
            continue
        stack: list[tuple[str, list[tuple[str, str]]]] = [(root, targets(scope.steps[root]))]
        state[root] = 1
        trail = [root]
        while stack:
            name, edges = stack[-1]
            if not edges:
                state[name] = 2
                stack.pop()
                trail.pop()
                continue
            where, target = edges.pop(0)
            if state.get(target) == 1:
                loop = [*trail[trail.index(target):], target]
                problem(where, "cycle",
                        f"this transition closes a cycle ({' → '.join(loop)}) that passes "
                        "through no wait step")
            elif target not in state:
                state[target] = 1
                trail.append(target)
                stack.append((target, targets(scope.steps[target])))


def _missing(where: str, target: str, all_steps: Mapping[str, Step], problem: _Problems) -> None:
    if target in all_steps:
        problem(where, "unstructured_join",
                f"step {target!r} is in another block: a transition stays inside its own "
                "PARALLEL branch (or the top level); a branch ends with SUCCEED or FAIL and "
                "the block's join continues")
    else:
        problem(where, "missing_target", f"no step named {target!r}")


def _available(scope: _Scope, inherited: frozenset[str],
               out: dict[str, frozenset[str]]) -> None:
    """For each step of an acyclic scope, the steps whose results exist on every path to it."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:  # post-order; the scope is acyclic and small (≤ MAX_STEPS)
        seen.add(name)
        for _, target in targets(scope.steps[name]):
            if target not in seen:
                visit(target)
        order.append(name)

    visit(scope.start)
    order.reverse()  # topological
    into: dict[str, frozenset[str]] = {scope.start: inherited}
    for name in order:
        step = scope.steps[name]
        here = into[name]
        out[name] = here
        for where, target in targets(step):
            carried = here | {name} if where.endswith(".next") and not isinstance(
                step, ChoiceStep) else here
            into[target] = into[target] & carried if target in into else carried
        if isinstance(step, ParallelStep):
            for branch in step.branches:
                _available(_Scope(branch.path, branch.start, branch.steps), here, out)


# --- expressions --------------------------------------------------------------------------------

_UNSERIALISABLE = ("BYTES", "DURATION", "TIMESTAMP", "TYPE")


class _Environments:
    """The CEL checking environment of each *view* (the set of steps whose results an expression
    may read). Each view gets its own small descriptor pool: cel-cpp builds its type provider from
    the whole pool at an environment's first compile, so one pool holding every view would cost
    O(steps²) per environment (seconds for a 200-step chain)."""

    def __init__(self, steps: Mapping[str, Step], input_schema: Schema) -> None:
        self.input_schema = input_schema
        self.results = {name: step.result_schema or types.ANY
                        if isinstance(step, TaskStep | PollStep) else types.FREE_OBJECT
                        for name, step in steps.items()
                        if isinstance(step, TaskStep | ParallelStep | TimerStep | SignalStep
                                      | PollStep)}
        self.envs: dict[frozenset[str], Any] = {}
        self.poll_envs: dict[tuple[frozenset[str], str], Any] = {}

    def view(self, available: frozenset[str]) -> frozenset[str]:
        return frozenset(n for n in available if n in self.results)

    def env(self, view: frozenset[str]) -> Any:
        if view not in self.envs:
            messages = types.MessageTypes()
            input_type = messages.cel_type(self.input_schema)
            records = {name: messages.message("R", {"result": self.results[name]})
                       for name in sorted(view)}
            steps_type = messages.message("V", records)
            self.envs[view] = cel.NewEnv(messages.pool(), variables={
                "input": cel.Type(input_type), "steps": cel.Type(steps_type)})
        return self.envs[view]

    def poll_env(self, view: frozenset[str], step: PollStep) -> Any:
        """A POLL step's ``until`` also reads ``result``, the round's task result."""
        key = (view, step.name)
        if key not in self.poll_envs:
            messages = types.MessageTypes()
            input_type = messages.cel_type(self.input_schema)
            records = {name: messages.message("R", {"result": self.results[name]})
                       for name in sorted(view)}
            steps_type = messages.message("V", records)
            round_type = messages.message("P", {"result": step.result_schema or types.ANY})
            self.poll_envs[key] = cel.NewEnv(messages.pool(), variables={
                "input": cel.Type(input_type), "steps": cel.Type(steps_type),
                "round": cel.Type(round_type)})
        return self.poll_envs[key]

    def check(self, source: str, view: frozenset[str]) -> str:
        """The result type of ``source`` where ``view`` is readable (or ExpressionError). Tried
        first where no step is readable: most expressions read none, and share that one."""
        if view:
            try:
                return expressions.compile_checked(self.env(frozenset()), source)
            except expressions.ExpressionError:
                pass
        return expressions.compile_checked(self.env(view), source)


def _check_expressions(definition_steps: Mapping[str, Step], input_schema: Schema,
                       available: Mapping[str, frozenset[str]], problem: _Problems) -> None:
    environments = _Environments(definition_steps, input_schema)
    for name, step in definition_steps.items():
        view = environments.view(available.get(name, frozenset()))
        for where, source, want in _expressions_of(step):
            try:
                if where.endswith(".until") and isinstance(step, PollStep):
                    found = expressions.compile_checked(environments.poll_env(view, step),
                                                        source)
                else:
                    found = environments.check(source, view)
            except expressions.ExpressionError as exc:
                syntax = "Syntax error" in exc.message
                problem(where, "expression_invalid" if syntax else "expression_type",
                        exc.message)
                continue
            message = _type_problem(want, found)
            if message is not None:
                problem(where, "expression_type", message)


def _expressions_of(step: Step) -> list[tuple[str, str, str]]:
    if isinstance(step, TaskStep) and step.input is not None:
        return [(f"{step.path}.input", step.input, "object")]
    if isinstance(step, ChoiceStep):
        return [(f"{step.path}.choices[{i}].when", c.when, "bool")
                for i, c in enumerate(step.choices) if c.when]
    if isinstance(step, SucceedStep) and step.output is not None:
        return [(f"{step.path}.output", step.output, "json")]
    if isinstance(step, FailStep) and step.cause is not None:
        return [(f"{step.path}.cause", step.cause, "json")]
    if isinstance(step, TimerStep) and step.until is not None:
        return [(f"{step.path}.until", step.until, "string")]
    if isinstance(step, SignalStep) and step.correlation is not None:
        return [(f"{step.path}.correlation", step.correlation, "string")]
    if isinstance(step, PollStep):
        found = [(f"{step.path}.until", step.until, "bool")] if step.until else []
        if step.input is not None:
            found.insert(0, (f"{step.path}.input", step.input, "object"))
        return found
    return []


def _type_problem(want: str, found: str) -> str | None:
    if want == "bool":
        if found in ("BOOL", "DYN"):
            return None
        return f"a condition must be a bool; this expression is {found}"
    if want == "string":
        if found in ("STRING", "DYN"):
            return None
        return f"the value must be a string; this expression is {found}"
    if any(token in found for token in _UNSERIALISABLE):
        return f"the value must be JSON; this expression is {found}"
    if want == "object" and not (found == "DYN" or found.startswith("MAP<STRING,")
                                 or found.startswith(types.PACKAGE)
                                 or found == "google.protobuf.Struct"):
        return f"a task input must be an object (a map with string keys); this is {found}"
    return None


# --- the whole ----------------------------------------------------------------------------------


def parse_definition(data: bytes | str) -> Definition:
    """Parse and validate a definition document (strict JSON)."""
    size = len(data.encode("utf-8") if isinstance(data, str) else data)
    if size > MAX_DOCUMENT_BYTES:
        problem = _Problems()
        problem("$", "limit_exceeded",
                f"a definition document has at most {MAX_DOCUMENT_BYTES} bytes")
        problem.raise_if_any()
    return validate_document(jsondoc.loads_strict(data))


def validate_document(document: Any) -> Definition:
    """Validate a parsed document (normal parse of :func:`jsondoc.loads_strict`)."""
    problem = _Problems()
    if not isinstance(document, dict):
        problem("$", "invalid_value", "expected a JSON object (a definition)")
        problem.raise_if_any()
    _fields(document, _TOP_FIELDS, ("format", "start", "steps"), "$", problem)
    if "format" in document and document["format"] != FORMAT:
        problem("$.format", "unsupported_format", f"the only format is {FORMAT!r}")
    if "description" in document and not (isinstance(document["description"], str)
                                          and len(document["description"])
                                          <= MAX_DESCRIPTION_CHARS):
        problem("$.description", "invalid_value",
                f"a string of at most {MAX_DESCRIPTION_CHARS} characters")
    input_schema = types.FREE_OBJECT
    if "input_schema" in document:
        input_schema = types.parse_schema(document["input_schema"], "$.input_schema", problem)
        if input_schema.type != "object":
            problem("$.input_schema.type", "invalid_value", "the workflow input is an object")
            input_schema = types.FREE_OBJECT
    parser = _Parser(problem)
    steps = parser.scope(document.get("steps"), "$.steps", 0)
    start = _name_of(document, "start", "$", problem)
    problem.raise_if_any()
    top = _Scope("$", start, steps)
    for scope in _scopes(top):
        _check_graph(scope, parser.all_steps, problem)
    problem.raise_if_any()
    available: dict[str, frozenset[str]] = {}
    _available(top, frozenset(), available)
    _check_expressions(parser.all_steps, input_schema, available, problem)
    problem.raise_if_any()
    canonical = jsondoc.canonical(document)
    queues = sorted({s.queue for s in parser.all_steps.values()
                     if isinstance(s, TaskStep | PollStep)})
    return Definition(input_schema=input_schema, start=start, steps=MappingProxyType(steps),
                      all_steps=MappingProxyType(parser.all_steps), queues=tuple(queues),
                      canonical=canonical, digest=digests.sha256(canonical), document=document)

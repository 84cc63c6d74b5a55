"""Workflow DTOs (``docs/api/workflows.md``): tolerant frozen attrs classes, like ``models``.

A field the server leaves out is ``None`` (or its default); everything the server sent is kept
in ``raw``. Times are aware ``datetime`` objects in UTC. A definition ``document`` stays a plain
JSON object (docs/weave/language.md): the server validates it and answers
``definition_invalid`` with each problem's path (:class:`~orbit_sdk.ValidationError`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs

from orbit_sdk._fields import integer as _int
from orbit_sdk._fields import objects as _objects
from orbit_sdk._fields import string as _str
from orbit_sdk.models import parse_time

__all__ = [
    "WorkflowActivation",
    "WorkflowDefinition",
    "WorkflowInstance",
    "WorkflowPollRound",
    "WorkflowPollRounds",
    "WorkflowPollState",
    "WorkflowSignal",
    "WorkflowStart",
    "WorkflowStep",
    "WorkflowValidation",
    "WorkflowVersion",
    "WorkflowWait",
]


@attrs.frozen(kw_only=True)
class WorkflowVersion:
    """One immutable published version; ``document`` is set when one version is read
    (:meth:`~orbit_sdk.Client.get_workflow_version`), ``None`` in a definition's list."""

    version: int
    digest: str = ""
    definition: str | None = None
    document: dict[str, Any] | None = None
    created_by: str | None = None
    created_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowVersion:
        document = raw.get("document")
        return cls(
            version=_int(raw, "version") or 0, digest=_str(raw, "digest") or "",
            definition=_str(raw, "definition"),
            document=dict(document) if isinstance(document, Mapping) else None,
            created_by=_str(raw, "created_by"), created_at=parse_time(raw.get("created_at")),
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowDefinition:
    """A definition; ``versions`` is filled by get, create and publish (list items leave it
    empty); ``published_version`` is the new version's number in a publish's answer."""

    id: str
    name: str
    description: str = ""
    revision: int = 0
    latest_version: int | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    versions: tuple[WorkflowVersion, ...] = ()
    published_version: int | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowDefinition:
        return cls(
            id=_str(raw, "id") or "", name=_str(raw, "name") or "",
            description=_str(raw, "description") or "", revision=_int(raw, "revision") or 0,
            latest_version=_int(raw, "latest_version"),
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")),
            versions=tuple(WorkflowVersion.from_json(v) for v in _objects(raw, "versions")),
            published_version=_int(raw, "published_version"), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowValidation:
    """A document that passed validation: its canonical digest and the queues it uses."""

    digest: str
    queues: tuple[str, ...] = ()
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowValidation:
        queues = raw.get("queues")
        return cls(digest=_str(raw, "digest") or "",
                   queues=tuple(q for q in queues if isinstance(q, str))
                   if isinstance(queues, list) else (), raw=dict(raw))


@attrs.frozen(kw_only=True)
class WorkflowActivation:
    """One run of a step. For an activation with a task: ``task_state`` (the task's state now)
    and ``result``: ``"none"`` (no result yet), ``"recorded"`` (the task has a result the
    engine has not consumed yet: orchestration has not advanced), ``"advanced"`` or
    ``"quarantined"`` (its links were incomplete)."""

    id: str
    sequence: int = 0
    state: str = ""
    task_id: str | None = None
    task_state: str | None = None
    result: str = "none"
    created_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowActivation:
        return cls(
            id=_str(raw, "id") or "", sequence=_int(raw, "sequence") or 0,
            state=_str(raw, "state") or "", task_id=_str(raw, "task_id"),
            task_state=_str(raw, "task_state"), result=_str(raw, "result") or "none",
            created_at=parse_time(raw.get("created_at")),
            ended_at=parse_time(raw.get("ended_at")), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowPollState:
    """A POLL step's bounded query: ``state`` (ROUND, WAITING, SATISFIED, EXHAUSTED, FAILED,
    CANCELLED), rounds used of ``max_rounds``, the stored next interval, the next round's time
    (while WAITING) and the absolute ``deadline_at`` fixed when the step started."""

    state: str = ""
    used_rounds: int = 0
    max_rounds: int = 0
    next_interval_ms: int = 0
    next_round_at: dt.datetime | None = None
    deadline_at: dt.datetime | None = None
    activation_id: str = ""
    granted_rounds: int = 0  # rounds granted by continues (the budget is max + granted)
    continued_deadline_at: dt.datetime | None = None  # a continue's query deadline, in force
    first_round: int = 1  # the current activation's first round
    first_round_attempts_used: int = 0  # what that round had used in older activations
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowPollState:
        return cls(
            state=_str(raw, "state") or "", used_rounds=_int(raw, "used_rounds") or 0,
            max_rounds=_int(raw, "max_rounds") or 0,
            next_interval_ms=_int(raw, "next_interval_ms") or 0,
            next_round_at=parse_time(raw.get("next_round_at")),
            deadline_at=parse_time(raw.get("deadline_at")),
            activation_id=_str(raw, "activation_id") or "",
            granted_rounds=_int(raw, "granted_rounds") or 0,
            continued_deadline_at=parse_time(raw.get("continued_deadline_at")),
            first_round=_int(raw, "first_round") or 1,
            first_round_attempts_used=_int(raw, "first_round_attempts_used") or 0,
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowPollRound:
    """One round of a query: its task, ``state`` (RUNNING, MET, NOT_MET, FAILED, CANCELLED),
    the task's state now and the round's result (when its task succeeded)."""

    round: int
    activation_id: str = ""
    task_id: str = ""
    state: str = ""
    task_state: str | None = None
    result: Any = None
    created_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowPollRound:
        return cls(
            round=_int(raw, "round") or 0, activation_id=_str(raw, "activation_id") or "",
            task_id=_str(raw, "task_id") or "", state=_str(raw, "state") or "",
            task_state=_str(raw, "task_state"), result=raw.get("result"),
            created_at=parse_time(raw.get("created_at")),
            ended_at=parse_time(raw.get("ended_at")), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowTask:
    """A task the instance created (``GET …/workflows/{id}/tasks``): its state now, and the
    step, activation (sequence and state) and POLL ``round`` that reference it -- all ``None``
    when ``verified`` is false (no activation of the instance references it)."""

    task_id: str
    queue: str = ""
    handler: str = ""
    state: str = ""
    retry_of: str | None = None
    created_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    verified: bool = False
    step: str | None = None
    step_kind: str | None = None
    activation_id: str | None = None
    activation_sequence: int | None = None
    activation_state: str | None = None
    round: int | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowTask:
        return cls(
            task_id=_str(raw, "task_id") or "", queue=_str(raw, "queue") or "",
            handler=_str(raw, "handler") or "", state=_str(raw, "state") or "",
            retry_of=_str(raw, "retry_of"), created_at=parse_time(raw.get("created_at")),
            completed_at=parse_time(raw.get("completed_at")),
            verified=raw.get("verified") is True, step=_str(raw, "step"),
            step_kind=_str(raw, "step_kind"), activation_id=_str(raw, "activation_id"),
            activation_sequence=_int(raw, "activation_sequence"),
            activation_state=_str(raw, "activation_state"), round=_int(raw, "round"),
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowWait:
    """A wait of a TIMER or SIGNAL step (docs/weave/waits.md). ``state``: WAITING, FIRED (a
    timer), SIGNALLED, TIMED_OUT or CANCELLED. ``first_deadline_at`` never moves; a timer that
    fired late (its engine was down) says by how much in ``late_ms``. ``correlation_key`` is
    the key's UTF-8 text, or base64 when ``correlation_key_encoding`` is ``"base64"``."""

    id: str
    kind: str = ""
    state: str = ""
    step: str | None = None
    step_id: str = ""
    activation_id: str = ""
    activation_sequence: int | None = None
    generation: int = 1
    first_deadline_at: dt.datetime | None = None
    deadline_at: dt.datetime | None = None
    signal_name: str | None = None
    correlation_key: str | None = None
    correlation_key_encoding: str | None = None
    payload_versions: tuple[int, ...] | None = None
    winner_signal_id: str | None = None
    fired_at: dt.datetime | None = None
    late_ms: int | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowWait:
        versions = raw.get("payload_versions")
        return cls(
            id=_str(raw, "id") or "", kind=_str(raw, "kind") or "",
            state=_str(raw, "state") or "", step=_str(raw, "step"),
            step_id=_str(raw, "step_id") or "", activation_id=_str(raw, "activation_id") or "",
            activation_sequence=_int(raw, "activation_sequence"),
            generation=_int(raw, "generation") or 1,
            first_deadline_at=parse_time(raw.get("first_deadline_at")),
            deadline_at=parse_time(raw.get("deadline_at")),
            signal_name=_str(raw, "signal_name"), correlation_key=_str(raw, "correlation_key"),
            correlation_key_encoding=_str(raw, "correlation_key_encoding"),
            payload_versions=(tuple(v for v in versions if isinstance(v, int))
                              if isinstance(versions, list) else None),
            winner_signal_id=_str(raw, "winner_signal_id"),
            fired_at=parse_time(raw.get("fired_at")), late_ms=_int(raw, "late_ms"),
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowPollRounds:
    """A POLL step's query and its rounds in round order."""

    workflow_id: str
    step: str
    poll: WorkflowPollState
    rounds: tuple[WorkflowPollRound, ...] = ()


@attrs.frozen(kw_only=True)
class WorkflowStep:
    """A step of an instance (``$root`` is the internal first one), its activations (the
    current one, ``current_activation``; every one when asked for all) and (in the detail) its
    waits: a TIMER or SIGNAL step's ``weave_waits`` rows."""

    id: str
    name: str
    kind: str = ""
    state: str = ""
    revision: int = 0
    output: Any = None
    error: Any = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    activations: tuple[WorkflowActivation, ...] = ()
    activation_count: int = 0
    current_activation: int | None = None  # the current (newest) activation's sequence
    poll: WorkflowPollState | None = None  # a POLL step's query
    waits: tuple[WorkflowWait, ...] = ()
    workflow_id: str = ""  # in the answers of step recovery (retry, resolve)
    held_at: dt.datetime | None = None  # held ($hold): waits for a person's decision
    held_error: Any = None  # while held: the error the step would have propagated
    resolution: Any = None  # the logical conclusion an operator recorded (resolve)
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowStep:
        poll = raw.get("poll")
        return cls(
            id=_str(raw, "id") or "", name=_str(raw, "name") or "",
            kind=_str(raw, "kind") or "", state=_str(raw, "state") or "",
            revision=_int(raw, "revision") or 0, output=raw.get("output"),
            error=raw.get("error"), created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")),
            activations=tuple(WorkflowActivation.from_json(a)
                              for a in _objects(raw, "activations")),
            activation_count=_int(raw, "activation_count") or 0,
            current_activation=_int(raw, "current_activation"),
            poll=WorkflowPollState.from_json(poll) if isinstance(poll, Mapping) else None,
            waits=tuple(WorkflowWait.from_json(w) for w in _objects(raw, "waits")),
            workflow_id=_str(raw, "workflow_id") or "",
            held_at=parse_time(raw.get("held_at")), held_error=raw.get("held_error"),
            resolution=raw.get("resolution"), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowStart:
    """One start of :meth:`~orbit_sdk.Client.start_workflows` (the arguments of
    :meth:`~orbit_sdk.Client.start_workflow`): ``input`` is a JSON object (``RawJson`` is sent
    byte-exact); ``idempotency_key`` is generated when not given, so the batch is retried
    safely."""

    definition: str
    input: Any = None
    version: int | None = None
    business_key: str | None = None
    idempotency_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"definition": self.definition,
                                "input": {} if self.input is None else self.input}
        if self.version is not None:
            body["version"] = self.version
        if self.business_key is not None:
            body["business_key"] = self.business_key
        return body


@attrs.frozen(kw_only=True)
class WorkflowInstance:
    """A workflow instance: the start receipt, a list item or the detail (``steps`` only in
    the detail). It always runs the ``version`` it started on."""

    id: str
    definition: str = ""
    version: int = 0
    version_digest: str = ""
    state: str = ""
    revision: int = 0
    paused: bool = False  # apart from state: its gate holds its tasks back (pause / resume)
    control_revision: int = 0  # +1 on each pause, resume and cancel (their CAS)
    checkpoints: int = 0  # parked checkpoints a resume replays
    # The stop intent, frozen once recorded: "CANCEL" (a user's cancel) or "FAILURE" (a
    # failure settlement); None when the instance has none. STOPPING until in-flight steps end.
    stop_kind: str | None = None
    stop_requested_at: dt.datetime | None = None
    cancel_requested_at: dt.datetime | None = None  # a user asked to cancel
    business_key: str | None = None
    input: Any = None
    output: Any = None
    error: Any = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    steps: tuple[WorkflowStep, ...] = ()
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowInstance:
        return cls(
            id=_str(raw, "id") or "", definition=_str(raw, "definition") or "",
            version=_int(raw, "version") or 0,
            version_digest=_str(raw, "version_digest") or "", state=_str(raw, "state") or "",
            revision=_int(raw, "revision") or 0, paused=raw.get("paused") is True,
            control_revision=_int(raw, "control_revision") or 0,
            checkpoints=_int(raw, "checkpoints") or 0, stop_kind=_str(raw, "stop_kind"),
            stop_requested_at=parse_time(raw.get("stop_requested_at")),
            cancel_requested_at=parse_time(raw.get("cancel_requested_at")),
            business_key=_str(raw, "business_key"),
            input=raw.get("input"), output=raw.get("output"), error=raw.get("error"),
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")),
            completed_at=parse_time(raw.get("completed_at")),
            steps=tuple(WorkflowStep.from_json(s) for s in _objects(raw, "steps")),
            raw=dict(raw),
        )

    @property
    def finished(self) -> bool:
        """True in a final state (SUCCEEDED, FAILED, CANCELLED); a STOPPING instance (a cancel
        or a failure settlement waiting for its in-flight steps) is not finished yet."""
        return self.state in {"SUCCEEDED", "FAILED", "CANCELLED"}


@attrs.frozen(kw_only=True)
class WorkflowEvent:
    """One event of an instance's timeline: the instance's own events (``aggregate_type``
    ``workflow_instance``: ``workflow.started``, ``workflow.advanced``, …) and its signals'
    (``workflow_signal``). ``occurred_at`` is database time; the timeline is a history view,
    not a consumption watermark (docs/api/workflows.md § 时间线)."""

    id: str
    type: str = ""
    aggregate_type: str = ""
    aggregate_id: str = ""
    aggregate_revision: int = 0
    from_state: str | None = None
    to_state: str | None = None
    payload: Any = None
    occurred_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowEvent:
        return cls(
            id=_str(raw, "id") or "", type=_str(raw, "type") or "",
            aggregate_type=_str(raw, "aggregate_type") or "",
            aggregate_id=_str(raw, "aggregate_id") or "",
            aggregate_revision=_int(raw, "aggregate_revision") or 0,
            from_state=_str(raw, "from_state"), to_state=_str(raw, "to_state"),
            payload=raw.get("payload"), occurred_at=parse_time(raw.get("occurred_at")),
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class WorkflowSignal:
    """A signal sent to an instance: the send receipt (``state`` PENDING), a history item or
    one signal. ``disposition`` says how it ended (``consumed``, or why it can never win:
    ``payload_version``, ``instance_finished``, ``correlation_mismatch``, ``wait_closed``,
    ``unknown_signal``, ``expired``); ``wait_id`` names the wait it won."""

    id: str
    workflow_id: str = ""
    name: str = ""
    correlation_key: str = ""
    payload: Any = None
    payload_version: int = 0
    evidence_ref: str | None = None
    state: str = ""
    disposition: str | None = None
    wait_id: str | None = None
    target_activation_sequence: int | None = None
    accepted_at: dt.datetime | None = None
    expires_at: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WorkflowSignal:
        return cls(
            id=_str(raw, "id") or "", workflow_id=_str(raw, "workflow_id") or "",
            name=_str(raw, "name") or "", correlation_key=_str(raw, "correlation_key") or "",
            payload=raw.get("payload"), payload_version=_int(raw, "payload_version") or 0,
            evidence_ref=_str(raw, "evidence_ref"), state=_str(raw, "state") or "",
            disposition=_str(raw, "disposition"), wait_id=_str(raw, "wait_id"),
            target_activation_sequence=_int(raw, "target_activation_sequence"),
            accepted_at=parse_time(raw.get("accepted_at")),
            expires_at=parse_time(raw.get("expires_at")),
            resolved_at=parse_time(raw.get("resolved_at")),
            raw=dict(raw),
        )

    @property
    def resolved(self) -> bool:
        """True once CONSUMED or REJECTED."""
        return self.state in {"CONSUMED", "REJECTED"}

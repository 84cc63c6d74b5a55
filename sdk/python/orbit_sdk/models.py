"""The SDK's own data transfer objects: frozen attrs classes read from the API's JSON.

They are deliberately tolerant: a field the server leaves out is ``None`` (or its default), a
field the SDK does not know yet is still in ``raw``, so a newer server never breaks an older
SDK. Times are aware ``datetime`` objects in UTC.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from typing import Any

import attrs

from orbit_sdk._fields import boolean as _bool
from orbit_sdk._fields import integer as _int
from orbit_sdk._fields import mapping as _dict
from orbit_sdk._fields import string as _str

__all__ = [
    "ApplicationResources",
    "Attempt",
    "Delivery",
    "DeliveryAttempt",
    "Evidence",
    "LeasedDelivery",
    "Queue",
    "QueueUsage",
    "ResultDelivery",
    "RetryPolicy",
    "SecretRotation",
    "Settlement",
    "Subscription",
    "SubscriptionFilters",
    "Task",
    "TaskEvent",
    "TaskSource",
    "Whoami",
    "parse_time",
]


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 time from the API (``None`` stays ``None``)."""
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    parsed = dt.datetime.fromisoformat(text)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _decimal(value: Any) -> decimal.Decimal | None:
    """A policy decimal from the API (a JSON number) or from the caller (number or text)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, int | float | str):
        return decimal.Decimal(str(value))
    return None


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """A retry policy. ``multiplier`` and ``jitter`` are exact decimals: the API writes them as
    JSON numbers (``2``, ``0.2``); given as ``2``, ``1.5`` or ``"1.5"`` they are kept exact and
    sent as numbers."""

    max_attempts: int | None = None
    initial_ms: int | None = None
    max_ms: int | None = None
    multiplier: decimal.Decimal | None = attrs.field(default=None, converter=_decimal)
    jitter: decimal.Decimal | None = attrs.field(default=None, converter=_decimal)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RetryPolicy:
        return cls(max_attempts=_int(raw, "max_attempts"), initial_ms=_int(raw, "initial_ms"),
                   max_ms=_int(raw, "max_ms"), multiplier=raw.get("multiplier"),
                   jitter=raw.get("jitter"))

    def to_json(self) -> dict[str, Any]:
        """Only the fields that are set (the others take the queue's defaults)."""
        return {k: v for k, v in attrs.asdict(self).items() if v is not None}


@attrs.frozen(kw_only=True)
class Whoami:
    """``GET /v1/whoami``: the calling credential and what it may see."""

    application: dict[str, Any]
    credential: dict[str, Any]
    grants: list[dict[str, Any]]
    namespaces: list[str]
    raw: dict[str, Any] = attrs.field(repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Whoami:
        grants = raw.get("grants")
        namespaces = raw.get("namespaces")
        return cls(
            application=_dict(raw, "application"), credential=_dict(raw, "credential"),
            grants=[g for g in grants if isinstance(g, dict)] if isinstance(grants, list) else [],
            namespaces=[n for n in namespaces if isinstance(n, str)]
            if isinstance(namespaces, list) else [],
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class QueueUsage:
    """What a queue holds now (``GET`` of one queue): counters kept by the server's
    transactions, its start window, and its backlog of due WAITING tasks. ``measured_at`` is the
    database's time of the reading."""

    measured_at: dt.datetime | None = None
    unfinished_tasks: int = 0
    active_attempts: int = 0
    starts_in_window: int = 0
    start_window_until: dt.datetime | None = None
    waiting_tasks: int = 0
    oldest_waiting_age_ms: int = 0

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> QueueUsage:
        return cls(
            measured_at=parse_time(raw.get("measured_at")),
            unfinished_tasks=_int(raw, "unfinished_tasks") or 0,
            active_attempts=_int(raw, "active_attempts") or 0,
            starts_in_window=_int(raw, "starts_in_window") or 0,
            start_window_until=parse_time(raw.get("start_window_until")),
            waiting_tasks=_int(raw, "waiting_tasks") or 0,
            oldest_waiting_age_ms=_int(raw, "oldest_waiting_age_ms") or 0,
        )

    @property
    def oldest_waiting_age(self) -> dt.timedelta:
        return dt.timedelta(milliseconds=self.oldest_waiting_age_ms)


@attrs.frozen(kw_only=True)
class Queue:
    """A queue with its gate and runtime counters (``docs/api/queues.md``). ``usage`` is set
    only by :meth:`Client.get_queue`; ``None`` limits are unlimited."""

    id: str
    name: str
    description: str = ""
    revision: int = 0
    offer_lease_ms: int | None = None
    execution_lease_ms: int | None = None
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    max_concurrent_attempts: int | None = None
    max_unfinished_tasks: int | None = None
    max_starts_per_second: int | None = None
    active_attempts: int | None = None
    usage: QueueUsage | None = None
    paused: bool = False
    gate_state: str | None = None
    gate_reason: str | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Queue:
        gate = _dict(raw, "gate")
        return cls(
            id=_str(raw, "id") or "", name=_str(raw, "name") or "",
            description=_str(raw, "description") or "", revision=_int(raw, "revision") or 0,
            offer_lease_ms=_int(raw, "offer_lease_ms"),
            execution_lease_ms=_int(raw, "execution_lease_ms"),
            retry=RetryPolicy.from_json(_dict(raw, "retry")),
            max_concurrent_attempts=_int(raw, "max_concurrent_attempts"),
            max_unfinished_tasks=_int(raw, "max_unfinished_tasks"),
            max_starts_per_second=_int(raw, "max_starts_per_second"),
            active_attempts=_int(raw, "active_attempts"),
            usage=QueueUsage.from_json(raw["usage"])
            if isinstance(raw.get("usage"), Mapping) else None,
            paused=_bool(raw, "paused"),
            gate_state=_str(gate, "state"), gate_reason=_str(gate, "reason"),
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class ApplicationResources:
    """An application's shared quotas (``docs/flow-control.md``): the limits every namespace of
    the application shares (``None``: unlimited), their configuration ``revision``, and the
    usage at ``measured_at`` (database time)."""

    application: str
    application_id: str = ""
    revision: int = 0
    max_unfinished_tasks: int | None = None
    max_active_attempts: int | None = None
    max_reserved_attempts: int | None = None
    max_starts_per_second: int | None = None
    measured_at: dt.datetime | None = None
    unfinished_tasks: int = 0
    active_attempts: int = 0
    reserved_attempts: int = 0
    starts_in_window: int = 0
    start_window_until: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ApplicationResources:
        usage = _dict(raw, "usage")
        return cls(
            application=_str(raw, "application") or "",
            application_id=_str(raw, "application_id") or "",
            revision=_int(raw, "revision") or 0,
            max_unfinished_tasks=_int(raw, "max_unfinished_tasks"),
            max_active_attempts=_int(raw, "max_active_attempts"),
            max_reserved_attempts=_int(raw, "max_reserved_attempts"),
            max_starts_per_second=_int(raw, "max_starts_per_second"),
            measured_at=parse_time(usage.get("measured_at")),
            unfinished_tasks=_int(usage, "unfinished_tasks") or 0,
            active_attempts=_int(usage, "active_attempts") or 0,
            reserved_attempts=_int(usage, "reserved_attempts") or 0,
            starts_in_window=_int(usage, "starts_in_window") or 0,
            start_window_until=parse_time(usage.get("start_window_until")),
            updated_at=parse_time(raw.get("updated_at")), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class Task:
    """A task: the acceptance receipt, a list item or the full detail.

    The detail-only fields (``input``, ``result``, ``error``, ``source``, …) are ``None`` on
    receipts and list items. ``replayed`` is true when a submit was answered from its
    idempotency record. ``source`` (detail) is who made the task, verified
    (:class:`TaskSource`: a workflow's task names its instance, step and activation).
    """

    id: str
    queue: str
    handler: str
    state: str
    revision: int = 0
    priority: int = 0
    business_key: str | None = None
    concurrency_key: str | None = None
    rerun_safe: bool = False
    created_at: dt.datetime | None = None
    available_at: dt.datetime | None = None
    deadline_at: dt.datetime | None = None
    start_deadline_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    attempts_used: int | None = None
    starts_used: int | None = None
    offer_lapses: int | None = None
    effect_uncertain: bool = False
    outcome_reason: str | None = None
    cancel_requested_at: dt.datetime | None = None
    cancel_reason: str | None = None
    current_attempt_id: str | None = None
    lease_expires_at: dt.datetime | None = None
    retry_of: str | None = None
    input: Any = None
    result: Any = None
    error: Any = None
    source: TaskSource | None = None
    replayed: bool = False
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Task:
        source = raw.get("source")
        return cls(
            id=_str(raw, "id") or "", queue=_str(raw, "queue") or "",
            handler=_str(raw, "handler") or "", state=_str(raw, "state") or "",
            revision=_int(raw, "revision") or 0, priority=_int(raw, "priority") or 0,
            business_key=_str(raw, "business_key"),
            concurrency_key=_str(raw, "concurrency_key"), rerun_safe=_bool(raw, "rerun_safe"),
            created_at=parse_time(raw.get("created_at")),
            available_at=parse_time(raw.get("available_at")),
            deadline_at=parse_time(raw.get("deadline_at")),
            start_deadline_at=parse_time(raw.get("start_deadline_at")),
            updated_at=parse_time(raw.get("updated_at")),
            completed_at=parse_time(raw.get("completed_at")),
            attempts_used=_int(raw, "attempts_used"),
            starts_used=_int(raw, "starts_used"), offer_lapses=_int(raw, "offer_lapses"),
            effect_uncertain=_bool(raw, "effect_uncertain"),
            outcome_reason=_str(raw, "outcome_reason"),
            cancel_requested_at=parse_time(raw.get("cancel_requested_at")),
            cancel_reason=_str(raw, "cancel_reason"),
            current_attempt_id=_str(raw, "current_attempt_id"),
            lease_expires_at=parse_time(raw.get("lease_expires_at")),
            retry_of=_str(raw, "retry_of"), input=raw.get("input"), result=raw.get("result"),
            error=raw.get("error"),
            source=TaskSource.from_json(source) if isinstance(source, Mapping) else None,
            replayed=_bool(raw, "replayed"), raw=dict(raw),
        )

    @property
    def finished(self) -> bool:
        """True in a terminal state (SUCCEEDED, FAILED, CANCELLED)."""
        return self.state in {"SUCCEEDED", "FAILED", "CANCELLED"}


@attrs.frozen(kw_only=True)
class Attempt:
    """One execution attempt of a task."""

    id: str
    generation: int
    state: str
    worker_instance_id: str | None = None
    worker_session_id: str | None = None
    offered_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    lease_expires_at: dt.datetime | None = None
    renewals: int | None = None
    concurrency_token: int | None = None  # the fencing token of a task with a concurrency key
    finished_at: dt.datetime | None = None
    retryable: bool | None = None
    result: Any = None
    error: Any = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Attempt:
        retryable = raw.get("retryable")
        return cls(
            id=_str(raw, "id") or "", generation=_int(raw, "generation") or 0,
            state=_str(raw, "state") or "",
            worker_instance_id=_str(raw, "worker_instance_id"),
            worker_session_id=_str(raw, "worker_session_id"),
            offered_at=parse_time(raw.get("offered_at")),
            started_at=parse_time(raw.get("started_at")),
            lease_expires_at=parse_time(raw.get("lease_expires_at")),
            renewals=_int(raw, "renewals"), concurrency_token=_int(raw, "concurrency_token"),
            finished_at=parse_time(raw.get("finished_at")),
            retryable=retryable if isinstance(retryable, bool) else None,
            result=raw.get("result"), error=raw.get("error"), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class TaskEvent:
    """A state event of a task (``task.accepted``, ``task.started``, …)."""

    id: str
    type: str
    revision: int | None = None
    from_state: str | None = None
    to_state: str | None = None
    payload: Any = None
    occurred_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TaskEvent:
        return cls(
            id=_str(raw, "id") or "", type=_str(raw, "type") or "",
            revision=_int(raw, "revision"), from_state=_str(raw, "from_state"),
            to_state=_str(raw, "to_state"), payload=raw.get("payload"),
            occurred_at=parse_time(raw.get("occurred_at")), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class TaskSource:
    """A task's direct source (``GET …/tasks/{id}/source``). ``kind`` says which fields are set:

    - ``"submitted"``: a client's submission; no other field;
    - ``"retry"``: a manual retry; ``retry_of`` is the task it retries;
    - ``"schedule"``: a schedule's occurrence (rule, backfill or trigger): ``schedule_id``,
      ``schedule_name``, ``version``, ``occurrence_id`` and its planned ``fire_at``;
    - ``"workflow"``: an activation of a workflow instance's step: ``workflow_id``,
      ``definition``, ``version`` (the instance's), ``step``, ``activation`` and its
      ``sequence``; ``round`` for a POLL round's task; ``retry_of`` for a task a step's manual
      retry made (its direct parent).

    Fields of the other kinds are ``None``. In a task's detail (``Task.source``) ``verified``
    says every link was checked; when one does not hold it is ``False``, ``problem`` says which,
    and only what the task itself claims is set (``workflow_id``, ``schedule_id``,
    ``retry_of``). :meth:`Client.task_source` raises instead (``source_link_missing``).
    """

    kind: str
    retry_of: str | None = None
    schedule_id: str | None = None
    schedule_name: str | None = None
    version: int | None = None
    occurrence_id: str | None = None
    fire_at: dt.datetime | None = None
    workflow_id: str | None = None
    definition: str | None = None
    step: str | None = None
    activation: str | None = None
    sequence: int | None = None
    round: int | None = None
    verified: bool = True
    problem: str | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TaskSource:
        return cls(
            kind=_str(raw, "kind") or "", retry_of=_str(raw, "retry_of"),
            schedule_id=_str(raw, "schedule_id"), schedule_name=_str(raw, "schedule_name"),
            version=_int(raw, "version"), occurrence_id=_str(raw, "occurrence_id"),
            fire_at=parse_time(raw.get("fire_at")), workflow_id=_str(raw, "workflow_id"),
            definition=_str(raw, "definition"), step=_str(raw, "step"),
            activation=_str(raw, "activation"), sequence=_int(raw, "sequence"),
            round=_int(raw, "round"), verified=raw.get("verified", True) is not False,
            problem=_str(raw, "problem"), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class Evidence:
    """A late report about an attempt, kept for review (it changed nothing)."""

    id: str
    attempt_id: str
    task_id: str | None = None
    generation: int | None = None
    kind: str | None = None
    retryable: bool | None = None
    payload: Any = None
    rejected_because: str | None = None
    received_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Evidence:
        retryable = raw.get("retryable")
        return cls(
            id=_str(raw, "id") or "", attempt_id=_str(raw, "attempt_id") or "",
            task_id=_str(raw, "task_id"), generation=_int(raw, "generation"),
            kind=_str(raw, "kind"), retryable=retryable if isinstance(retryable, bool) else None,
            payload=raw.get("payload"), rejected_because=_str(raw, "rejected_because"),
            received_at=parse_time(raw.get("received_at")), raw=dict(raw),
        )


# --- result subscriptions (docs/api/subscriptions.md) ---------------------------------------


def _strs(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = raw.get(key)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


@attrs.frozen(kw_only=True)
class SubscriptionFilters:
    """What a subscription delivers: results of these queues, states and handlers (an empty
    tuple does not restrict; all three must match)."""

    queues: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    handlers: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SubscriptionFilters:
        return cls(queues=_strs(raw, "queues"), states=_strs(raw, "states"),
                   handlers=_strs(raw, "handlers"))

    def to_json(self) -> dict[str, Any]:
        return {"queues": list(self.queues), "states": list(self.states),
                "handlers": list(self.handlers)}


@attrs.frozen(kw_only=True)
class Subscription:
    """A result subscription (``PULL`` or ``WEBHOOK``). ``secret`` is set only on the answer
    that created it (the server shows a webhook secret once; a replay has none)."""

    id: str
    name: str
    kind: str = ""  # PULL | WEBHOOK
    endpoint_url: str | None = None
    filters: SubscriptionFilters = attrs.field(factory=SubscriptionFilters)
    max_attempts: int | None = None
    backoff_initial_ms: int | None = None
    backoff_max_ms: int | None = None
    lease_ms: int | None = None
    start_after_sequence: int | None = None
    scan_after_sequence: int | None = None
    backlog: int = 0
    state: str = ""  # ACTIVE | PAUSED | DISABLED
    revision: int = 0
    owner_application_id: str | None = None
    previous_secret_valid_until: dt.datetime | None = None
    circuit_state: str | None = None  # CLOSED | OPEN | HALF_OPEN
    circuit_open_until: dt.datetime | None = None
    consecutive_failures: int = 0
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    disabled_at: dt.datetime | None = None
    secret: str | None = attrs.field(default=None, repr=False)
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Subscription:
        circuit = _dict(raw, "circuit")
        return cls(
            id=_str(raw, "id") or "", name=_str(raw, "name") or "",
            kind=_str(raw, "kind") or "", endpoint_url=_str(raw, "endpoint_url"),
            filters=SubscriptionFilters.from_json(_dict(raw, "filters")),
            max_attempts=_int(raw, "max_attempts"),
            backoff_initial_ms=_int(raw, "backoff_initial_ms"),
            backoff_max_ms=_int(raw, "backoff_max_ms"), lease_ms=_int(raw, "lease_ms"),
            start_after_sequence=_int(raw, "start_after_sequence"),
            scan_after_sequence=_int(raw, "scan_after_sequence"),
            backlog=_int(raw, "backlog") or 0, state=_str(raw, "state") or "",
            revision=_int(raw, "revision") or 0,
            owner_application_id=_str(raw, "owner_application_id"),
            previous_secret_valid_until=parse_time(raw.get("previous_secret_valid_until")),
            circuit_state=_str(circuit, "state"),
            circuit_open_until=parse_time(circuit.get("open_until")),
            consecutive_failures=_int(circuit, "consecutive_failures") or 0,
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")),
            disabled_at=parse_time(raw.get("disabled_at")), secret=_str(raw, "secret"),
            raw={k: v for k, v in raw.items() if k != "secret"},
        )


@attrs.frozen(kw_only=True)
class SecretRotation:
    """The answer of a secret rotation: the new ``secret`` (shown once; ``None`` on a replay)
    and until when the previous one still signs."""

    subscription: Subscription
    rotation_id: str | None = None
    previous_secret_valid_until: dt.datetime | None = None
    secret: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SecretRotation:
        return cls(subscription=Subscription.from_json(_dict(raw, "subscription")),
                   rotation_id=_str(raw, "rotation_id"),
                   previous_secret_valid_until=parse_time(
                       raw.get("previous_secret_valid_until")),
                   secret=_str(raw, "secret"))


@attrs.frozen(kw_only=True)
class DeliveryAttempt:
    """One attempt of a delivery: ``outcome`` ACKNOWLEDGED, FAILED or LAPSED."""

    attempt: int = 0
    outcome: str = ""
    status_code: int | None = None
    error: str | None = None
    duration_ms: int | None = None
    ended_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DeliveryAttempt:
        return cls(attempt=_int(raw, "attempt") or 0, outcome=_str(raw, "outcome") or "",
                   status_code=_int(raw, "status_code"), error=_str(raw, "error"),
                   duration_ms=_int(raw, "duration_ms"),
                   ended_at=parse_time(raw.get("ended_at")), raw=dict(raw))


@attrs.frozen(kw_only=True)
class Delivery:
    """A delivery in the history (``list_deliveries``) or its detail (``get_delivery``: then
    ``subscription``, ``queue``, ``result_state``, ``committed_at``, ``snapshot`` and
    ``attempts`` are set too). Never a secret or a lease token."""

    id: str
    subscription_id: str = ""
    event_id: str = ""
    sequence: int = 0
    task_id: str = ""
    task_revision: int = 0
    state: str = ""  # PENDING | LEASED | ACKNOWLEDGED | EXHAUSTED
    attempts_used: int = 0
    max_attempts: int = 0
    available_at: dt.datetime | None = None
    lease_expires_at: dt.datetime | None = None
    last_error: dict[str, Any] | None = None  # {"status_code", "body", "duration_ms"}
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    acknowledged_at: dt.datetime | None = None
    exhausted_at: dt.datetime | None = None
    subscription: str | None = None
    queue: str | None = None
    result_state: str | None = None
    committed_at: dt.datetime | None = None
    snapshot: Any = None
    attempts: tuple[DeliveryAttempt, ...] = ()
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Delivery:
        last_error = raw.get("last_error")
        attempts = raw.get("attempts")
        return cls(
            id=_str(raw, "id") or "", subscription_id=_str(raw, "subscription_id") or "",
            event_id=_str(raw, "event_id") or "", sequence=_int(raw, "sequence") or 0,
            task_id=_str(raw, "task_id") or "", task_revision=_int(raw, "task_revision") or 0,
            state=_str(raw, "state") or "", attempts_used=_int(raw, "attempts_used") or 0,
            max_attempts=_int(raw, "max_attempts") or 0,
            available_at=parse_time(raw.get("available_at")),
            lease_expires_at=parse_time(raw.get("lease_expires_at")),
            last_error=dict(last_error) if isinstance(last_error, Mapping) else None,
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")),
            acknowledged_at=parse_time(raw.get("acknowledged_at")),
            exhausted_at=parse_time(raw.get("exhausted_at")),
            subscription=_str(raw, "subscription"), queue=_str(raw, "queue"),
            result_state=_str(raw, "result_state"),
            committed_at=parse_time(raw.get("committed_at")), snapshot=raw.get("snapshot"),
            attempts=tuple(DeliveryAttempt.from_json(a) for a in attempts
                           if isinstance(a, Mapping)) if isinstance(attempts, list) else (),
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class ResultDelivery:
    """The ``task.result`` body a consumer receives (the same body the pump POSTs to a
    webhook): one result event of one task, for one subscription. ``attempt`` counts this
    delivery's tries (a redelivery has a higher one); ``snapshot`` is the task as frozen at the
    result (``state``, ``result``, ``error``, ``handler``, ``outcome_reason``, …). ``raw`` is
    the body as parsed (with ``exact_numbers`` when the consumer asked for it)."""

    id: str
    subscription_id: str = ""
    subscription: str = ""
    namespace: str = ""
    sequence: int = 0
    event_id: str = ""
    task_id: str = ""
    queue: str = ""
    task_revision: int = 0
    state: str = ""
    committed_at: dt.datetime | None = None
    attempt: int = 0
    snapshot: Any = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ResultDelivery:
        return cls(
            id=_str(raw, "id") or "", subscription_id=_str(raw, "subscription_id") or "",
            subscription=_str(raw, "subscription") or "",
            namespace=_str(raw, "namespace") or "", sequence=_int(raw, "sequence") or 0,
            event_id=_str(raw, "event_id") or "", task_id=_str(raw, "task_id") or "",
            queue=_str(raw, "queue") or "", task_revision=_int(raw, "task_revision") or 0,
            state=_str(raw, "state") or "", committed_at=parse_time(raw.get("committed_at")),
            attempt=_int(raw, "attempt") or 0, snapshot=raw.get("snapshot"), raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class LeasedDelivery:
    """A delivery leased to this consumer: the body, the lease token (needed to acknowledge or
    fail it; shown only to the holder) and when the lease lapses (database time)."""

    delivery: ResultDelivery
    lease_token: str = attrs.field(repr=False)
    lease_expires_at: dt.datetime | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LeasedDelivery:
        return cls(delivery=ResultDelivery.from_json(_dict(raw, "delivery")),
                   lease_token=_str(raw, "lease_token") or "",
                   lease_expires_at=parse_time(raw.get("lease_expires_at")))


@attrs.frozen(kw_only=True)
class Settlement:
    """The outcome of one acknowledgement or failure report. ``settled`` false: not applied,
    ``code`` says why (``delivery_not_found``, ``delivery_lease_lost``) -- only in a batch
    :meth:`Client.settle_deliveries` answer; the single calls raise instead."""

    delivery_id: str
    settled: bool = False
    state: str | None = None  # ACKNOWLEDGED | PENDING | EXHAUSTED
    attempts_used: int | None = None
    repeated: bool = False
    code: str | None = None
    detail: str | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Settlement:
        return cls(delivery_id=_str(raw, "delivery_id") or "", settled=_bool(raw, "settled"),
                   state=_str(raw, "state"), attempts_used=_int(raw, "attempts_used"),
                   repeated=_bool(raw, "repeated"), code=_str(raw, "code"),
                   detail=_str(raw, "detail"))

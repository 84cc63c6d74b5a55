"""Pulse rows and values: states, retry policies, and frozen row classes with ``from_row``."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import random
from typing import Any

import attrs

from orbit_common.db.clock import as_utc


class TaskState(enum.StrEnum):
    """The specification's task state machine (000 §2)."""

    WAITING = "WAITING"
    LEASED = "LEASED"
    RUNNING = "RUNNING"
    NEEDS_REVIEW = "NEEDS_REVIEW"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_TASK_STATES

    @property
    def unfinished(self) -> bool:
        return not self.terminal


TERMINAL_TASK_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})

# Every edge of the specification's diagram, and no other.
TASK_TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset({
    (TaskState.WAITING, TaskState.LEASED),
    (TaskState.LEASED, TaskState.RUNNING),
    (TaskState.LEASED, TaskState.WAITING),
    (TaskState.LEASED, TaskState.FAILED),
    (TaskState.WAITING, TaskState.CANCELLED),
    (TaskState.LEASED, TaskState.CANCELLED),
    (TaskState.WAITING, TaskState.FAILED),
    (TaskState.RUNNING, TaskState.SUCCEEDED),
    (TaskState.RUNNING, TaskState.WAITING),
    (TaskState.RUNNING, TaskState.FAILED),
    (TaskState.RUNNING, TaskState.NEEDS_REVIEW),
    (TaskState.RUNNING, TaskState.CANCELLED),
    (TaskState.NEEDS_REVIEW, TaskState.SUCCEEDED),
    (TaskState.NEEDS_REVIEW, TaskState.FAILED),
})

# Two edges the diagram does not draw, taken only by a task that carries an uncertain effect
# from an earlier attempt (effect_uncertain = 1). The specification forbids that flag on
# SUCCEEDED/FAILED/CANCELLED and forbids dropping it, so a cancel or a deadline that would end
# such a task automatically sends it to a human instead (docs/api/tasks-lifecycle.md).
UNCERTAIN_TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset({
    (TaskState.WAITING, TaskState.NEEDS_REVIEW),
    (TaskState.LEASED, TaskState.NEEDS_REVIEW),
})


class AttemptState(enum.StrEnum):
    OFFERED = "OFFERED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    CANCELLED = "CANCELLED"
    OFFER_EXPIRED = "OFFER_EXPIRED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    WITHDRAWN = "WITHDRAWN"

    @property
    def active(self) -> bool:
        return self in {AttemptState.OFFERED, AttemptState.RUNNING}


class GateState(enum.StrEnum):
    OPEN = "OPEN"
    PAUSED = "PAUSED"


def decimal_number(value: decimal.Decimal) -> int | float:
    """The canonical JSON number of a policy decimal (docs/api/README.md, "数值"): an ``int``
    when whole, otherwise the ``float`` whose shortest spelling is the decimal's shortest plain
    spelling (``Decimal('2.000')`` → ``2``, ``Decimal('0.200')`` → ``0.2``). Exact for the
    DECIMAL(6,3) and DECIMAL(4,3) columns: far fewer than 15 significant digits."""
    if value == value.to_integral_value():
        return int(value)
    return float(value)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Attempts and exponential backoff with a cap and jitter (frozen into each task)."""

    max_attempts: int = 3
    initial_ms: int = 1000
    max_ms: int = 60_000
    multiplier: decimal.Decimal = decimal.Decimal("2")
    jitter: decimal.Decimal = decimal.Decimal("0.2")

    def backoff_ms(self, failed_attempts: int, rng: random.Random | None = None) -> int:
        """Delay before the next attempt after ``failed_attempts`` (>= 1) attempts ended."""
        exponent = max(failed_attempts - 1, 0)
        base = min(decimal.Decimal(self.max_ms),
                   decimal.Decimal(self.initial_ms) * self.multiplier ** exponent)
        spread = float(base * self.jitter)
        draw = (rng or random).uniform(-spread, spread)
        return max(0, min(self.max_ms, round(float(base) + draw)))

    def to_json(self) -> dict[str, Any]:
        """The internal form (request digests, event payloads): decimals as strings."""
        return {"max_attempts": self.max_attempts, "initial_ms": self.initial_ms,
                "max_ms": self.max_ms, "multiplier": str(self.multiplier),
                "jitter": str(self.jitter)}

    def view(self) -> dict[str, Any]:
        """The public representation: decimals as canonical JSON numbers."""
        return {"max_attempts": self.max_attempts, "initial_ms": self.initial_ms,
                "max_ms": self.max_ms, "multiplier": decimal_number(self.multiplier),
                "jitter": decimal_number(self.jitter)}


@attrs.frozen(kw_only=True)
class Queue:
    namespace_id: bytes
    id: bytes
    name: str
    gate_id: bytes
    description: str
    revision: int
    offer_lease_ms: int
    execution_lease_ms: int
    retry: RetryPolicy
    max_concurrent_attempts: int | None
    active_attempts: int
    created_at: dt.datetime
    updated_at: dt.datetime
    gate_state: GateState | None = None

    COLUMNS = (
        "q.namespace_id, q.id, q.name, q.gate_id, q.description, q.revision, q.offer_lease_ms,"
        " q.execution_lease_ms, q.max_attempts, q.retry_initial_ms, q.retry_max_ms,"
        " q.retry_multiplier, q.retry_jitter, q.max_concurrent_attempts, q.active_attempts,"
        " q.created_at, q.updated_at"
    )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Queue:
        return cls(
            namespace_id=row["namespace_id"], id=row["id"], name=row["name"],
            gate_id=row["gate_id"], description=row["description"], revision=row["revision"],
            offer_lease_ms=row["offer_lease_ms"], execution_lease_ms=row["execution_lease_ms"],
            retry=RetryPolicy(max_attempts=row["max_attempts"],
                              initial_ms=row["retry_initial_ms"], max_ms=row["retry_max_ms"],
                              multiplier=row["retry_multiplier"], jitter=row["retry_jitter"]),
            max_concurrent_attempts=row["max_concurrent_attempts"],
            active_attempts=row["active_attempts"],
            created_at=as_utc(row["created_at"]), updated_at=as_utc(row["updated_at"]),
            gate_state=GateState(row["gate_state"]) if row.get("gate_state") else None,
        )


def _opt_time(value: dt.datetime | None) -> dt.datetime | None:
    return as_utc(value) if value is not None else None


@attrs.frozen(kw_only=True)
class Task:
    namespace_id: bytes
    id: bytes
    queue_id: bytes
    handler: str
    input: str
    state: TaskState
    revision: int
    priority: int
    available_at: dt.datetime
    business_key: bytes | None
    concurrency_key: bytes | None
    deadline_at: dt.datetime | None
    start_deadline_at: dt.datetime | None
    attempt_timeout_ms: int | None
    retry: RetryPolicy
    offer_lease_ms: int
    execution_lease_ms: int
    rerun_safe: bool
    attempts_used: int
    starts_used: int
    offer_lapses: int
    current_attempt_id: bytes | None
    lease_expires_at: dt.datetime | None
    cancel_requested_at: dt.datetime | None
    cancel_reason: str | None
    effect_uncertain: bool
    outcome_reason: str | None
    result: str | None
    error: str | None
    retry_of: bytes | None
    created_at: dt.datetime
    updated_at: dt.datetime
    first_started_at: dt.datetime | None
    completed_at: dt.datetime | None
    owner_kind: str | None = None  # SCHEDULE | WORKFLOW: who made the task (migration 0015)
    owner_id: bytes | None = None

    COLUMNS = (
        "t.namespace_id, t.id, t.queue_id, t.handler, t.input, t.state, t.revision, t.priority,"
        " t.available_at, t.business_key, t.concurrency_key, t.deadline_at,"
        " t.start_deadline_at,"
        " t.attempt_timeout_ms, t.max_attempts, t.retry_initial_ms, t.retry_max_ms,"
        " t.retry_multiplier, t.retry_jitter, t.offer_lease_ms, t.execution_lease_ms,"
        " t.rerun_safe, t.attempts_used, t.starts_used, t.offer_lapses, t.current_attempt_id,"
        " t.lease_expires_at,"
        " t.cancel_requested_at, t.cancel_reason, t.effect_uncertain, t.outcome_reason,"
        " t.result, t.error, t.retry_of, t.created_at, t.updated_at, t.first_started_at,"
        " t.completed_at, t.owner_kind, t.owner_id"
    )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        return cls(
            namespace_id=row["namespace_id"], id=row["id"], queue_id=row["queue_id"],
            handler=row["handler"], input=row["input"], state=TaskState(row["state"]),
            revision=row["revision"], priority=row["priority"],
            available_at=as_utc(row["available_at"]), business_key=row["business_key"],
            concurrency_key=row["concurrency_key"],
            deadline_at=_opt_time(row["deadline_at"]),
            start_deadline_at=_opt_time(row["start_deadline_at"]),
            attempt_timeout_ms=row["attempt_timeout_ms"],
            retry=RetryPolicy(max_attempts=row["max_attempts"],
                              initial_ms=row["retry_initial_ms"], max_ms=row["retry_max_ms"],
                              multiplier=row["retry_multiplier"], jitter=row["retry_jitter"]),
            offer_lease_ms=row["offer_lease_ms"], execution_lease_ms=row["execution_lease_ms"],
            rerun_safe=bool(row["rerun_safe"]), attempts_used=row["attempts_used"],
            starts_used=row["starts_used"], offer_lapses=row["offer_lapses"],
            current_attempt_id=row["current_attempt_id"],
            lease_expires_at=_opt_time(row["lease_expires_at"]),
            cancel_requested_at=_opt_time(row["cancel_requested_at"]),
            cancel_reason=row["cancel_reason"], effect_uncertain=bool(row["effect_uncertain"]),
            outcome_reason=row["outcome_reason"], result=row["result"], error=row["error"],
            retry_of=row["retry_of"], created_at=as_utc(row["created_at"]),
            updated_at=as_utc(row["updated_at"]),
            first_started_at=_opt_time(row["first_started_at"]),
            completed_at=_opt_time(row["completed_at"]),
            owner_kind=row["owner_kind"], owner_id=row["owner_id"],
        )


@attrs.frozen(kw_only=True)
class Attempt:
    namespace_id: bytes
    id: bytes
    task_id: bytes
    queue_id: bytes
    generation: int
    token_digest: bytes
    worker_instance_id: bytes
    worker_session_id: bytes
    state: AttemptState
    offered_at: dt.datetime
    started_at: dt.datetime | None
    lease_expires_at: dt.datetime
    renewals: int
    finished_at: dt.datetime | None
    retryable: bool | None
    result: str | None
    error: str | None

    COLUMNS = (
        "a.namespace_id, a.id, a.task_id, a.queue_id, a.generation, a.token_digest,"
        " a.worker_instance_id, a.worker_session_id, a.state, a.offered_at, a.started_at,"
        " a.lease_expires_at, a.renewals, a.finished_at, a.retryable, a.result, a.error"
    )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Attempt:
        return cls(
            namespace_id=row["namespace_id"], id=row["id"], task_id=row["task_id"],
            queue_id=row["queue_id"], generation=row["generation"],
            token_digest=row["token_digest"], worker_instance_id=row["worker_instance_id"],
            worker_session_id=row["worker_session_id"], state=AttemptState(row["state"]),
            offered_at=as_utc(row["offered_at"]), started_at=_opt_time(row["started_at"]),
            lease_expires_at=as_utc(row["lease_expires_at"]), renewals=row["renewals"],
            finished_at=_opt_time(row["finished_at"]),
            retryable=None if row["retryable"] is None else bool(row["retryable"]),
            result=row["result"], error=row["error"],
        )

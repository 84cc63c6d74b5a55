"""Queues: create, get, list, update (revision CAS), pause and resume through the execution gate.

A queue is the dispatch scope of tasks and holds their default execution policy (offer lease,
execution lease, retry policy) and its flow-control limits (``max_concurrent_attempts``,
``max_unfinished_tasks``, ``max_starts_per_second``; resources.py says where each is enforced).
Each queue owns one execution gate (``pulse_execution_gates``, ``owner_kind = 'QUEUE'``), created
with it in the same transaction.

Invariants kept here:

* Configuration changes are compare-and-set on ``revision``: one guarded
  ``UPDATE … WHERE namespace_id = … AND id = … AND revision = …`` whose matched-row count is
  checked; a miss is ``409 stale_revision`` and writes nothing. ``revision`` counts
  configuration versions only.
* The runtime counters -- ``active_attempts``, ``unfinished_tasks``, ``start_window_until`` and
  ``starts_in_window`` (:data:`RUNTIME_COLUMNS`) -- are owned by the submit and lease
  transactions (resources.py). No statement here writes them: a configuration change can never
  reset or overwrite them, and a concurrent claim, submit or start that moves them does not
  invalidate a caller's ``revision``. Lowering a limit below the current usage is allowed: it
  refuses new work until usage falls, and never deletes tasks or revokes grants.
  ``tests/unit/test_queue_statements.py`` holds the statements to this.
* Pause and resume change only the gate: ``state`` and ``control_revision + 1`` under the gate's
  row lock. Pausing a paused queue (resuming an open one) changes nothing and writes nothing. The
  lease protocol reads the gate with a shared lock, so it serialises with these updates: a paused
  gate grants no new lease and approves no new start; results of attempts in flight are still
  recorded.
* Every change commits with a state event (``orbit_events``) and an audit event carrying the
  actor, the reason and the before/after documents.
* Authorization is decided inside each transaction (:func:`_authorize`). A queue the credential
  may neither read nor manage is reported as ``404 queue_not_found``, exactly like one that does
  not exist.

Lock order: the one order of docs/architecture.md. Create takes the idempotency identity, then
the new gate row, then the new queue row; update takes the queue row; pause/resume take the gate
row only (a control row: read shared by claims and starts).
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import re
from typing import Any, Literal, TypeVar

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc, names
from orbit_common.platform import authz, idempotency
from orbit_common.platform import credentials as creds
from orbit_common.platform.audit import AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import IdempotencyRequest, Replay
from orbit_common.platform.namespaces import Namespace
from orbit_common.pulse import usage
from orbit_common.pulse.model import GateState, Queue, RetryPolicy

T = TypeVar("T")

PAGE_MAX = 500
SCAN_BATCHES = 10  # a list page reads at most this many batches of rows it may have to skip
DESCRIPTION_MAX = 512
REASON_MAX = 1024
INT_MAX = 2_147_483_647  # the columns are INT
# Flow-control limits a caller sets: null is "unlimited", otherwise 1..INT_MAX (the CHECK
# constraints of migrations 0004 and 0009).
LIMIT_FIELDS = ("max_concurrent_attempts", "max_unfinished_tasks", "max_starts_per_second")

# Bounds of the CHECK constraints in migrations/0004_queues_and_gates.sql.
OFFER_LEASE_MS = (100, 3_600_000)
EXECUTION_LEASE_MS = (100, 86_400_000)
MAX_ATTEMPTS = (1, 1000)
MULTIPLIER = (decimal.Decimal(1), decimal.Decimal("999.999"))  # DECIMAL(6,3)
JITTER = (decimal.Decimal(0), decimal.Decimal(1))  # DECIMAL(4,3)
DECIMAL_PLACES = 3
_DECIMAL_TEXT = re.compile(r"\A[0-9]{1,3}(?:\.[0-9]{1,3})?\Z")

DEFAULT_OFFER_LEASE_MS = 30_000
DEFAULT_EXECUTION_LEASE_MS = 60_000
DEFAULT_RETRY = RetryPolicy(
    max_attempts=3, initial_ms=1000, max_ms=60_000,
    multiplier=decimal.Decimal("2"), jitter=decimal.Decimal("0.2"),
)


# --- values ------------------------------------------------------------------------------------


def decimal_text(value: decimal.Decimal) -> str:
    """The shortest plain spelling: ``Decimal('2.000')`` → ``"2"``, ``0.200`` → ``"0.2"``."""
    return format(value.normalize(), "f")


def _retry_json(retry: RetryPolicy) -> dict[str, Any]:
    return {"max_attempts": retry.max_attempts, "initial_ms": retry.initial_ms,
            "max_ms": retry.max_ms, "multiplier": decimal_text(retry.multiplier),
            "jitter": decimal_text(retry.jitter)}


Problems = list[dict[str, str]]


def _check_int(problems: Problems, path: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        problems.append({"path": path, "message": f"an integer from {low} to {high}"})


def _check_decimal(
    problems: Problems, path: str, value: decimal.Decimal, bounds: tuple[decimal.Decimal, ...]
) -> None:
    low, high = bounds
    exponent = value.as_tuple().exponent
    if (
        not value.is_finite()
        or not isinstance(exponent, int)
        or exponent < -DECIMAL_PLACES
        or not low <= value <= high
    ):
        problems.append({
            "path": path,
            "message": f"a decimal from {decimal_text(low)} to {decimal_text(high)} "
            f"with at most {DECIMAL_PLACES} digits after the point",
        })


def parse_decimal(value: Any, path: str, problems: Problems) -> decimal.Decimal | None:
    """A decimal from a request, or None plus a problem: a JSON number (``2``, ``1.5``; the body
    parser keeps fractions as exact Decimals), or, accepted for compatibility, a decimal string
    (``"2"``, ``"0.25"``). Range and places are checked with the settings."""
    if isinstance(value, int | decimal.Decimal) and not isinstance(value, bool):
        number = decimal.Decimal(value)
        if not number.is_finite():
            problems.append({"path": path, "message": "a finite number"})
            return None
        return number.normalize()  # 2.0000 has no more places than 2
    if not isinstance(value, str) or not _DECIMAL_TEXT.match(value):
        problems.append({
            "path": path,
            "message": f"a number such as 2 or 0.25 (at most {DECIMAL_PLACES} digits after the "
            "point)",
        })
        return None
    return decimal.Decimal(value)


def check_queue_name(name: str) -> Problems:
    if names.is_valid_name(name):
        return []
    return [{"path": "$.name", "message": f"queue name must be {names.NAME_RULE}"}]


@attrs.frozen(kw_only=True)
class QueueSettings:
    """The configuration a caller controls: what create sets and PATCH changes."""

    description: str = ""
    offer_lease_ms: int = DEFAULT_OFFER_LEASE_MS
    execution_lease_ms: int = DEFAULT_EXECUTION_LEASE_MS
    retry: RetryPolicy = DEFAULT_RETRY
    max_concurrent_attempts: int | None = None
    max_unfinished_tasks: int | None = None
    max_starts_per_second: int | None = None

    @classmethod
    def of(cls, record: QueueRecord) -> QueueSettings:
        queue, flow = record.queue, record.flow
        return cls(description=queue.description, offer_lease_ms=queue.offer_lease_ms,
                   execution_lease_ms=queue.execution_lease_ms, retry=queue.retry,
                   max_concurrent_attempts=queue.max_concurrent_attempts,
                   max_unfinished_tasks=flow.max_unfinished_tasks,
                   max_starts_per_second=flow.max_starts_per_second)

    def problems(self) -> Problems:
        """Every value the CHECK constraints would refuse, with its request path."""
        found: Problems = []
        if len(self.description) > DESCRIPTION_MAX:
            found.append({"path": "$.description",
                          "message": f"at most {DESCRIPTION_MAX} characters"})
        _check_int(found, "$.offer_lease_ms", self.offer_lease_ms, *OFFER_LEASE_MS)
        _check_int(found, "$.execution_lease_ms", self.execution_lease_ms, *EXECUTION_LEASE_MS)
        retry = self.retry
        _check_int(found, "$.retry.max_attempts", retry.max_attempts, *MAX_ATTEMPTS)
        _check_int(found, "$.retry.initial_ms", retry.initial_ms, 0, INT_MAX)
        if 0 <= retry.initial_ms <= INT_MAX:
            # The bound is the merged initial_ms, so a PATCH of one of the two is judged whole.
            _check_int(found, "$.retry.max_ms", retry.max_ms, retry.initial_ms, INT_MAX)
        _check_decimal(found, "$.retry.multiplier", retry.multiplier, MULTIPLIER)
        _check_decimal(found, "$.retry.jitter", retry.jitter, JITTER)
        for name in LIMIT_FIELDS:  # null is "unlimited"; 0 would stop the queue silently
            value = getattr(self, name)
            if value is not None:
                _check_int(found, f"$.{name}", value, 1, INT_MAX)
        return found

    def check(self) -> QueueSettings:
        found = self.problems()
        if found:
            raise errors.ValidationFailed(found)
        return self

    def request_json(self) -> dict[str, Any]:
        """What the idempotency digest of a create covers. The limits added by migration 0009
        appear only when set, so a create recorded before them still replays."""
        doc = self.to_json()
        for name in ("max_unfinished_tasks", "max_starts_per_second"):
            if doc[name] is None:
                del doc[name]
        return doc

    def to_json(self) -> dict[str, Any]:
        return {"description": self.description, "offer_lease_ms": self.offer_lease_ms,
                "execution_lease_ms": self.execution_lease_ms, "retry": _retry_json(self.retry),
                "max_concurrent_attempts": self.max_concurrent_attempts,
                "max_unfinished_tasks": self.max_unfinished_tasks,
                "max_starts_per_second": self.max_starts_per_second}


class Unset(enum.Enum):
    """Marks a PATCH field the caller did not send (``None`` is a value: "unlimited")."""

    UNSET = "unset"


UNSET = Unset.UNSET


@attrs.frozen(kw_only=True)
class QueuePatch:
    """A partial change. ``None`` leaves a field as it is, except for the limits
    (:data:`LIMIT_FIELDS`), where ``None`` means "unlimited" and :data:`UNSET` "unchanged"."""

    description: str | None = None
    offer_lease_ms: int | None = None
    execution_lease_ms: int | None = None
    max_attempts: int | None = None
    initial_ms: int | None = None
    max_ms: int | None = None
    multiplier: decimal.Decimal | None = None
    jitter: decimal.Decimal | None = None
    max_concurrent_attempts: int | Literal[Unset.UNSET] | None = UNSET
    max_unfinished_tasks: int | Literal[Unset.UNSET] | None = UNSET
    max_starts_per_second: int | Literal[Unset.UNSET] | None = UNSET

    def apply(self, current: QueueSettings) -> QueueSettings:
        retry = current.retry
        return QueueSettings(
            description=_pick(self.description, current.description),
            offer_lease_ms=_pick(self.offer_lease_ms, current.offer_lease_ms),
            execution_lease_ms=_pick(self.execution_lease_ms, current.execution_lease_ms),
            retry=RetryPolicy(
                max_attempts=_pick(self.max_attempts, retry.max_attempts),
                initial_ms=_pick(self.initial_ms, retry.initial_ms),
                max_ms=_pick(self.max_ms, retry.max_ms),
                multiplier=_pick(self.multiplier, retry.multiplier),
                jitter=_pick(self.jitter, retry.jitter),
            ),
            max_concurrent_attempts=_limit(self.max_concurrent_attempts,
                                           current.max_concurrent_attempts),
            max_unfinished_tasks=_limit(self.max_unfinished_tasks, current.max_unfinished_tasks),
            max_starts_per_second=_limit(self.max_starts_per_second,
                                         current.max_starts_per_second),
        )

    def problems(self) -> Problems:
        """Problems of the fields given, judged alone (the merged whole is checked later)."""
        # Apply to the defaults with max_ms at its ceiling: only the cross-field rule
        # (max_ms >= initial_ms) depends on the current values, and it is checked after merging.
        base = QueueSettings(retry=attrs.evolve(DEFAULT_RETRY, initial_ms=0, max_ms=INT_MAX))
        return self.apply(base).problems()


def _pick(value: T | None, current: T) -> T:
    return current if value is None else value


def _limit(value: int | Literal[Unset.UNSET] | None, current: int | None) -> int | None:
    return current if value is UNSET else value


@attrs.frozen(kw_only=True)
class Gate:
    """A queue's execution gate, as joined to the queue row."""

    id: bytes
    state: GateState
    control_revision: int
    reason: str | None
    updated_at: dt.datetime

    COLUMNS = (
        "g.id AS gate_row_id, g.state AS gate_state, g.control_revision AS gate_control_revision,"
        " g.reason AS gate_reason, g.updated_at AS gate_updated_at"
    )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Gate:
        return cls(id=row["gate_row_id"], state=GateState(row["gate_state"]),
                   control_revision=row["gate_control_revision"], reason=row["gate_reason"],
                   updated_at=as_utc(row["gate_updated_at"]))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "control_revision": self.control_revision,
                "reason": self.reason}


@attrs.frozen(kw_only=True)
class QueueFlow:
    """The queue row's flow-control columns (migration 0009): two limits a caller sets and the
    runtime counters the submit and lease transactions keep (read here, never written)."""

    max_unfinished_tasks: int | None
    max_starts_per_second: int | None
    unfinished_tasks: int
    start_window_until: dt.datetime | None
    starts_in_window: int

    COLUMNS = (
        "q.max_unfinished_tasks, q.unfinished_tasks, q.max_starts_per_second,"
        " q.start_window_until, q.starts_in_window"
    )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QueueFlow:
        until = row["start_window_until"]
        return cls(max_unfinished_tasks=row["max_unfinished_tasks"],
                   max_starts_per_second=row["max_starts_per_second"],
                   unfinished_tasks=row["unfinished_tasks"],
                   start_window_until=None if until is None else as_utc(until),
                   starts_in_window=row["starts_in_window"])

    def open_window(self, now: dt.datetime) -> dt.datetime | None:
        """The end of the current start window, or None once it has passed (``now`` is the
        database's time): a passed window counts no starts, whatever the row still holds."""
        until = self.start_window_until
        return until if until is not None and until > now else None


@attrs.frozen(kw_only=True)
class QueueRecord:
    """A queue row with its gate."""

    queue: Queue
    gate: Gate
    flow: QueueFlow

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QueueRecord:
        return cls(queue=Queue.from_row(row), gate=Gate.from_row(row),
                   flow=QueueFlow.from_row(row))

    @property
    def paused(self) -> bool:
        return self.gate.state is GateState.PAUSED

    def usage_view(self, backlog: usage.Backlog) -> dict[str, Any]:
        """The runtime side (docs/api/queues.md#usage): the counters as read with the queue row,
        its start window judged by the database time of ``backlog``, and the backlog."""
        until = self.flow.open_window(backlog.measured_at)
        return {
            "measured_at": backlog.measured_at.isoformat(timespec="microseconds"),
            "unfinished_tasks": self.flow.unfinished_tasks,
            "active_attempts": self.queue.active_attempts,
            "starts_in_window": 0 if until is None else self.flow.starts_in_window,
            "start_window_until": None if until is None
            else until.isoformat(timespec="microseconds"),
            "waiting_tasks": backlog.due_tasks,
            "oldest_waiting_age_ms": backlog.oldest_age_ms,
        }

    def view(self) -> dict[str, Any]:
        """The public representation (docs/api/queues.md)."""
        q = self.queue
        return {
            "id": q.id.hex(),
            "name": q.name,
            "description": q.description,
            "revision": q.revision,
            "offer_lease_ms": q.offer_lease_ms,
            "execution_lease_ms": q.execution_lease_ms,
            "retry": q.retry.view(),
            "max_concurrent_attempts": q.max_concurrent_attempts,
            "max_unfinished_tasks": self.flow.max_unfinished_tasks,
            "max_starts_per_second": self.flow.max_starts_per_second,
            "active_attempts": q.active_attempts,
            "paused": self.paused,
            "gate": self.gate.to_json(),
            "created_at": q.created_at.isoformat(timespec="microseconds"),
            "updated_at": q.updated_at.isoformat(timespec="microseconds"),
        }


# --- SQL ---------------------------------------------------------------------------------------

INSERT_GATE = """
INSERT INTO pulse_execution_gates (namespace_id, id, owner_kind, owner_id, state,
  control_revision, reason, created_at, updated_at)
VALUES (%s, %s, 'QUEUE', %s, 'OPEN', 1, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
# The runtime counters start at zero (their column defaults); a new queue has no start window.
INSERT_QUEUE = """
INSERT INTO pulse_queues (namespace_id, id, name, gate_id, description, revision, offer_lease_ms,
  execution_lease_ms, max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier,
  retry_jitter, max_concurrent_attempts, max_unfinished_tasks, max_starts_per_second,
  active_attempts, created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, 1, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, UTC_TIMESTAMP(6),
  UTC_TIMESTAMP(6))
"""
_SELECT_JOINED = f"""
SELECT {Queue.COLUMNS}, {QueueFlow.COLUMNS}, {Gate.COLUMNS}
FROM pulse_queues q
JOIN pulse_execution_gates g ON g.namespace_id = q.namespace_id AND g.id = q.gate_id
"""
# Hot: every queue request and every submit resolves its queue by name (uq_queues_name).
SELECT_BY_NAME = _SELECT_JOINED + "WHERE q.namespace_id = %s AND q.name = %s"
SELECT_BY_ID = _SELECT_JOINED + "WHERE q.namespace_id = %s AND q.id = %s"
# Keyset page by name within a namespace, in uq_queues_name order (no filesort).
LIST_BY_NAME = _SELECT_JOINED + """WHERE q.namespace_id = %s AND q.name > %s
ORDER BY q.name
LIMIT %s"""
# Lost-COMMIT re-check of a create without an idempotency key: waits for an in-flight commit.
SELECT_ID_SHARED = """
SELECT id FROM pulse_queues WHERE namespace_id = %s AND id = %s LOCK IN SHARE MODE
"""
# The columns of runtime state that no configuration statement may write (the module docstring;
# tests/unit/test_queue_statements.py checks INSERT_QUEUE and UPDATE_SETTINGS_IF_REVISION).
RUNTIME_COLUMNS = frozenset({"active_attempts", "unfinished_tasks", "start_window_until",
                             "starts_in_window"})
# Compare-and-set of the configuration. The runtime counters are deliberately absent.
UPDATE_SETTINGS_IF_REVISION = """
UPDATE pulse_queues
SET description = %s, offer_lease_ms = %s, execution_lease_ms = %s, max_attempts = %s,
    retry_initial_ms = %s, retry_max_ms = %s, retry_multiplier = %s, retry_jitter = %s,
    max_concurrent_attempts = %s, max_unfinished_tasks = %s, max_starts_per_second = %s,
    revision = revision + 1, updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id = %s AND revision = %s
"""
SELECT_GATE_FOR_UPDATE = """
SELECT state, control_revision FROM pulse_execution_gates
WHERE namespace_id = %s AND id = %s
FOR UPDATE
"""
SET_GATE_STATE_IF_REVISION = """
UPDATE pulse_execution_gates
SET state = %s, reason = %s, control_revision = control_revision + 1,
    updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id = %s AND state = %s AND control_revision = %s
"""
# Lost-COMMIT re-check of an update: the transition event is unique per (queue, revision).
SELECT_UPDATE_EVENT_SHARED = """
SELECT payload FROM orbit_events
WHERE namespace_id = %s AND aggregate_type = 'queue' AND aggregate_id = %s
  AND aggregate_revision = %s AND event_type = 'queue.updated'
LOCK IN SHARE MODE
"""


# --- transactions (each takes the caller's cursor and never commits) ---------------------------


async def insert_queue(
    cur: Any,
    *,
    namespace_id: bytes,
    queue_id: bytes,
    gate_id: bytes,
    name: str,
    settings: QueueSettings,
) -> QueueRecord:
    """Insert the gate (OPEN) and then the queue. Locks: the new gate row, the new queue row
    (a concurrent insert of the same name waits on ``uq_queues_name``, then gets 409)."""
    retry = settings.retry
    await cur.execute(INSERT_GATE, (ids.check_id(namespace_id), ids.check_id(gate_id),
                                    ids.check_id(queue_id)))
    try:
        await cur.execute(INSERT_QUEUE, (
            namespace_id, queue_id, name, gate_id, settings.description, settings.offer_lease_ms,
            settings.execution_lease_ms, retry.max_attempts, retry.initial_ms, retry.max_ms,
            retry.multiplier, retry.jitter, settings.max_concurrent_attempts,
            settings.max_unfinished_tasks, settings.max_starts_per_second,
        ))
    except Exception as exc:
        if dberrors.is_duplicate(exc, "uq_queues_name"):
            raise errors.AlreadyExists(f"queue {name!r} already exists") from exc
        raise
    return await get_queue_by_id(cur, namespace_id, queue_id)


async def find_queue(cur: Any, namespace_id: bytes, name: str) -> QueueRecord | None:
    """The queue named ``name`` with its gate, read without locks."""
    await cur.execute(SELECT_BY_NAME, (namespace_id, name))
    row = await cur.fetchone()
    return QueueRecord.from_row(row) if names.found(row, "name", name) else None


async def get_queue_by_id(cur: Any, namespace_id: bytes, queue_id: bytes) -> QueueRecord:
    await cur.execute(SELECT_BY_ID, (namespace_id, queue_id))
    row = await cur.fetchone()
    if row is None:
        raise errors.QueueNotFound()
    return QueueRecord.from_row(row)


async def list_by_name(
    cur: Any, namespace_id: bytes, *, after_name: str, limit: int
) -> list[QueueRecord]:
    """Queues of a namespace after ``after_name``, by name (keyset on uq_queues_name)."""
    await cur.execute(LIST_BY_NAME, (namespace_id, after_name, limit))
    return [QueueRecord.from_row(r) for r in await cur.fetchall()]


async def update_settings_if_revision(
    cur: Any, record: QueueRecord, *, revision: int, settings: QueueSettings
) -> QueueRecord:
    """Write ``settings`` if the queue is still at ``revision``; raises StaleRevision otherwise.

    Locks: the queue row (exclusive, by the guarded UPDATE). The runtime counters
    (:data:`RUNTIME_COLUMNS`) are not touched.
    """
    retry = settings.retry
    q = record.queue
    await cur.execute(UPDATE_SETTINGS_IF_REVISION, (
        settings.description, settings.offer_lease_ms, settings.execution_lease_ms,
        retry.max_attempts, retry.initial_ms, retry.max_ms, retry.multiplier, retry.jitter,
        settings.max_concurrent_attempts, settings.max_unfinished_tasks,
        settings.max_starts_per_second, q.namespace_id, q.id, revision,
    ))
    if cur.rowcount != 1:  # FOUND_ROWS: matched rows, so 0 means the guard did not hold
        raise errors.StaleRevision(
            f"queue {q.name!r} is no longer at revision {revision}; read it again",
        )
    return await get_queue_by_id(cur, q.namespace_id, q.id)


async def set_gate_state(
    cur: Any, record: QueueRecord, *, to: GateState, reason: str | None
) -> tuple[QueueRecord, QueueRecord | None]:
    """Move the queue's gate to ``to``; returns (before, after), ``after`` None if it already was.

    Locks: the gate row (exclusive), read with FOR UPDATE first, so the returned "before" is the
    state this change replaced. The queue row is not locked.
    """
    q = record.queue
    await cur.execute(SELECT_GATE_FOR_UPDATE, (q.namespace_id, q.gate_id))
    row = await cur.fetchone()
    if row is None:
        raise errors.DatabaseError(f"queue {q.name!r} has no execution gate")
    before = await get_queue_by_id(cur, q.namespace_id, q.id)
    if row["state"] == to.value:
        return before, None
    await cur.execute(SET_GATE_STATE_IF_REVISION, (
        to.value, reason, q.namespace_id, q.gate_id, row["state"], row["control_revision"],
    ))
    if cur.rowcount != 1:
        raise errors.DatabaseError("the locked gate row changed inside its own transaction")
    return before, await get_queue_by_id(cur, q.namespace_id, q.id)


# --- use cases: authorization, idempotency and one transaction each ----------------------------


async def _authorize(
    cur: Any,
    principal: creds.Principal,
    action: authz.Action,
    namespace_name: str,
    queue_name: str | None,
    *,
    hide: bool,
) -> Namespace:
    """:func:`creds.authorize` for a queue, in the caller's transaction.

    With ``hide``, a queue the credential may neither read nor manage is ``queue_not_found``
    (the same answer as for a queue that does not exist); one it can see but not act on stays
    ``403 forbidden``.
    """
    try:
        return await creds.authorize(cur, principal, action, namespace_name, queue=queue_name)
    except errors.Forbidden:
        if not hide or queue_name is None:
            raise
        grants = await creds.recheck_principal(cur, principal)
        if not any(
            authz.allowed(grants, seen.value, namespace_name, queue_name)
            for seen in (authz.Action.QUEUES_READ, authz.Action.QUEUES_MANAGE)
        ):
            raise errors.QueueNotFound(_not_found(namespace_name, queue_name)) from None
        raise


def _not_found(namespace_name: str, queue_name: str) -> str:
    return f"no queue {queue_name!r} in namespace {namespace_name!r} for this credential"


def _check_namespace_name(namespace_name: str) -> None:
    # Only valid names reach SQL (a path segment can hold anything, lone surrogates included).
    if not names.is_valid_name(namespace_name):
        raise errors.NamespaceNotFound(f"no namespace {namespace_name!r} for this credential")


async def _require(cur: Any, namespace: Namespace, queue_name: str) -> QueueRecord:
    found = None
    if names.is_valid_name(queue_name):
        found = await find_queue(cur, namespace.id, queue_name)
    if found is None:
        raise errors.QueueNotFound(_not_found(namespace.name, queue_name))
    return found


def _audit(
    principal: creds.Principal,
    namespace: Namespace,
    action: str,
    after: QueueRecord,
    *,
    before: QueueRecord | None = None,
    reason: str | None = None,
    request_id: str | None = None,
) -> AuditRecord:
    return AuditRecord(
        actor=principal.actor, action=action, resource_type="queue", resource_id=after.queue.id,
        resource_revision=after.queue.revision, namespace_id=namespace.id,
        application_id=principal.application_id, reason=reason,
        before=None if before is None else before.view(), after=after.view(),
        request_id=request_id or None,
    )


async def create_queue(
    db: Database,
    principal: creds.Principal,
    *,
    namespace: str,
    name: str,
    settings: QueueSettings,
    idempotency_key: str | None,
    request_id: str | None = None,
) -> Replay:
    """``POST /v1/namespaces/{namespace}/queues``.

    Locks, in order: the idempotency identity (if a key is given), the new gate row, the new
    queue row. Ids and the request digest are made before the runner, so a re-run after a
    conflict or a lost COMMIT carries the same identity.
    """
    _check_namespace_name(namespace)
    found = check_queue_name(name) + settings.problems()
    if found:
        raise errors.ValidationFailed(found)
    queue_id, gate_id = ids.new_id(), ids.new_id()
    idem_template = None
    if idempotency_key is not None:
        # The namespace id is resolved inside the transaction; the digest does not depend on it.
        # The scope is the queue's name, the unit of authorization: a receipt or a conflict is
        # only seen by a caller that may manage that queue.
        idem_template = IdempotencyRequest.build(
            namespace_id=bytes(16), operation="queues.create", scope=name.encode(),
            key=idempotency_key,
            request={"name": name, **settings.request_json()},
            credential_id=principal.credential_id,
        )
    resolved: dict[str, bytes] = {}

    async def body(cur: Any) -> Replay:
        ns = await _authorize(cur, principal, authz.Action.QUEUES_MANAGE, namespace, name,
                              hide=False)
        resolved["namespace_id"] = ns.id

        async def effect() -> Replay:
            record = await insert_queue(cur, namespace_id=ns.id, queue_id=queue_id,
                                        gate_id=gate_id, name=name, settings=settings)
            view = record.view()
            await append_event(
                cur, namespace_id=ns.id, aggregate_type="queue", aggregate_id=queue_id,
                aggregate_revision=record.queue.revision, event_type="queue.created",
                from_state=None, to_state=record.gate.state.value, payload=view,
            )
            await append_audit(cur, _audit(principal, ns, "queue.create", record,
                                           request_id=request_id))
            return Replay(status=201, body=view, resource_id=queue_id)

        return await idempotency.once(
            cur, None if idem_template is None else attrs.evolve(idem_template,
                                                                 namespace_id=ns.id), effect)

    async def recheck(cur: Any) -> Replay | None:
        namespace_id = resolved["namespace_id"]  # set: the body ran up to COMMIT
        if idem_template is not None:
            return await idempotency.lookup(
                cur, attrs.evolve(idem_template, namespace_id=namespace_id)
            )
        await cur.execute(SELECT_ID_SHARED, (namespace_id, queue_id))
        if await cur.fetchone() is None:
            return None
        record = await get_queue_by_id(cur, namespace_id, queue_id)
        return Replay(status=201, body=record.view(), resource_id=queue_id)

    return await db.transaction("queues.create", body, recheck=recheck)


async def get_queue(
    db: Database, principal: creds.Principal, *, namespace: str, name: str
) -> dict[str, Any]:
    """``GET /v1/namespaces/{namespace}/queues/{queue}``: the queue with its ``usage``."""
    _check_namespace_name(namespace)

    async def body(cur: Any) -> dict[str, Any]:
        ns = await _authorize(cur, principal, authz.Action.QUEUES_READ, namespace, name,
                              hide=True)
        record = await _require(cur, ns, name)
        found = await usage.backlog(cur, ns.id, record.queue.id, count=True)
        return {**record.view(), "usage": record.usage_view(found)}

    return await db.read("queues.get", body)


@attrs.frozen(kw_only=True)
class Page:
    items: list[dict[str, Any]]
    # Where the next page starts (exclusive); None when the list is exhausted.
    next_after: str | None


async def list_queues(
    db: Database, principal: creds.Principal, *, namespace: str, after_name: str, limit: int
) -> Page:
    """``GET /v1/namespaces/{namespace}/queues``: the queues the credential may read, by name.

    Rows it may not read are skipped; at most :data:`SCAN_BATCHES` batches are read per page, so
    a page can be short (even empty) and still have a next cursor.
    """
    _check_namespace_name(namespace)
    if not 1 <= limit <= PAGE_MAX:
        raise errors.ValidationFailed([{"path": "?limit",
                                        "message": f"an integer from 1 to {PAGE_MAX}"}])

    async def body(cur: Any) -> Page:
        ns = await _authorize(cur, principal, authz.Action.QUEUES_READ, namespace, None,
                              hide=False)
        grants = await creds.recheck_principal(cur, principal)
        items: list[dict[str, Any]] = []
        position = after_name
        fetch = limit + 1  # one more than a page: tells "more rows" from "exhausted"
        for _ in range(SCAN_BATCHES):
            batch = await list_by_name(cur, ns.id, after_name=position, limit=fetch)
            for record in batch:
                if len(items) == limit:  # a further row exists
                    return Page(items=items, next_after=position)
                position = record.queue.name
                if authz.allowed(grants, authz.Action.QUEUES_READ.value, namespace, position):
                    items.append(record.view())
            if len(batch) < fetch:
                return Page(items=items, next_after=None)
        return Page(items=items, next_after=position)

    return await db.read("queues.list", body)


async def update_queue(
    db: Database,
    principal: creds.Principal,
    *,
    namespace: str,
    name: str,
    revision: int,
    patch: QueuePatch,
    request_id: str | None = None,
) -> dict[str, Any]:
    """``PATCH /v1/namespaces/{namespace}/queues/{queue}``: compare-and-set on ``revision``.

    Locks: the queue row (the guarded UPDATE). A patch that changes nothing writes nothing and
    keeps the revision, but still answers 409 when ``revision`` is not the current one.
    """
    _check_namespace_name(namespace)
    found = patch.problems()
    if revision < 1:
        found.insert(0, {"path": "$.revision", "message": "an integer of at least 1"})
    if found:
        raise errors.ValidationFailed(found)
    target: dict[str, Any] = {}

    async def body(cur: Any) -> dict[str, Any]:
        ns = await _authorize(cur, principal, authz.Action.QUEUES_MANAGE, namespace, name,
                              hide=True)
        before = await _require(cur, ns, name)
        if before.queue.revision != revision:
            raise errors.StaleRevision(
                f"queue {name!r} is at revision {before.queue.revision}, not {revision}"
            )
        current = QueueSettings.of(before)
        settings = patch.apply(current).check()
        target.update(namespace_id=ns.id, queue_id=before.queue.id, settings=settings)
        if settings == current:
            return before.view()
        after = await update_settings_if_revision(cur, before, revision=revision,
                                                  settings=settings)
        await append_event(
            cur, namespace_id=ns.id, aggregate_type="queue", aggregate_id=after.queue.id,
            aggregate_revision=after.queue.revision, event_type="queue.updated",
            from_state=None, to_state=None,
            payload={"name": name, "before": current.to_json(), "after": settings.to_json()},
        )
        await append_audit(cur, _audit(principal, ns, "queue.update", after, before=before,
                                       request_id=request_id))
        return after.view()

    async def recheck(cur: Any) -> dict[str, Any] | None:
        if not target:
            return None
        await cur.execute(SELECT_UPDATE_EVENT_SHARED,
                          (target["namespace_id"], target["queue_id"], revision + 1))
        row = await cur.fetchone()
        if row is None:
            return None  # not committed (or a no-op): re-run the body with the same revision
        if jsondoc.loads_strict(row["payload"])["after"] != target["settings"].to_json():
            raise errors.StaleRevision(f"queue {name!r} was changed by another request")
        return (await get_queue_by_id(cur, target["namespace_id"], target["queue_id"])).view()

    return await db.transaction("queues.update", body, recheck=recheck)


async def set_paused(
    db: Database,
    principal: creds.Principal,
    *,
    namespace: str,
    name: str,
    paused: bool,
    reason: str | None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """``POST …/queues/{queue}/pause`` and ``…/resume``; idempotent.

    Locks: the queue's gate row. Pausing a paused queue (resuming an open one) returns it
    unchanged: no new control revision, no event, no audit. A pause or resume is an operator's
    intervention, so it needs a reason (specification 000 §1 invariant 8).
    """
    _check_namespace_name(namespace)
    if reason is not None and len(reason) > REASON_MAX:
        raise errors.ValidationFailed([{"path": "$.reason",
                                        "message": f"at most {REASON_MAX} characters"}])
    to = GateState.PAUSED if paused else GateState.OPEN
    verb = "pause" if paused else "resume"

    async def body(cur: Any) -> dict[str, Any]:
        ns = await _authorize(cur, principal, authz.Action.QUEUES_MANAGE, namespace, name,
                              hide=True)
        record = await _require(cur, ns, name)
        if not reason:  # checked after the lookup: an unknown queue is a 404 first
            raise errors.ValidationFailed([{"path": "$.reason", "message": "required"}])
        before, after = await set_gate_state(cur, record, to=to, reason=reason)
        if after is None:
            return before.view()
        gate = after.gate
        await append_event(
            cur, namespace_id=ns.id, aggregate_type="execution_gate", aggregate_id=gate.id,
            aggregate_revision=gate.control_revision, event_type=f"queue.{verb}d",
            from_state=before.gate.state.value, to_state=gate.state.value,
            payload={"queue_id": after.queue.id.hex(), "queue": name, "reason": reason},
        )
        await append_audit(cur, _audit(principal, ns, f"queue.{verb}", after, before=before,
                                       reason=reason, request_id=request_id))
        return after.view()

    async def recheck(_cur: Any) -> dict[str, Any] | None:
        # Re-running is safe: the body is idempotent, and its first statement on the gate waits
        # for a COMMIT the server may still be finishing.
        return None

    return await db.transaction(f"queues.{verb}", body, recheck=recheck)

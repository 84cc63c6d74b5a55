"""Task submission: ``POST …/tasks`` (one) and ``POST …/tasks/batch`` (1–500), one transaction.

Identities
    Each item gets its task id and event id, and (when it carries an idempotency key) its
    idempotency record id and request digest, *before* the transaction runner is entered, so a
    re-run after a deadlock or a lost connection carries the same identity. The idempotency
    identity is ``(namespace id, "tasks.submit", queue name bytes, key)``; the digest covers the
    normalised request (``delay_ms`` and ``not_before`` as given, never the computed times).

Transaction (READ COMMITTED; the one lock order of docs/architecture.md)
    1. Authorization: the credential, its application and the namespace are re-read
       (:func:`authorize`); every queue of the batch must be covered by a grant of
       ``tasks.submit``. An unknown queue and an uncovered one are both ``queue_not_found``.
    2. The queues by name (plain read, no lock): their defaults are frozen into the tasks.
    3. One read of every item's idempotency identity: same digest → the item is a replay of the
       original receipt; another digest → ``409 idempotency_conflict`` for the whole request.
    4. One database time read (``UTC_TIMESTAMP(6)``): ``created_at`` of every new task, and
       ``available_at = created_at + delay_ms`` (or ``not_before``, never earlier than
       ``created_at``). Checks that need the queue or the time (retry bounds with the queue's
       defaults, the deadline passing before the task is available, the ``not_before``
       horizon) fail the whole request with ``validation_failed`` before anything is written.
    5. The idempotency records are inserted *with their final response* in one statement, in
       key order: the batch form of the one protocol (``idempotency.find_many`` in step 3,
       ``idempotency.record_many`` here; platform/idempotency.py says how a concurrent first
       use of a key is answered).
    6. The tasks (WAITING, revision 1) and their ``task.accepted`` events, one multi-row INSERT
       each. A batch is a handful of statements, however many items it holds.
    7. The counters (resources.py), after the task rows: each queue's ``unfinished_tasks`` and
       then the application's, each a guarded UPDATE that refuses to pass the limit
       (``429 queue_full`` / ``429 application_quota_exceeded``: the transaction rolls back, so
       the whole request writes nothing); then the rows of concurrency keys seen for the first
       time.

Failure handling
    Validation errors and conflicts roll everything back: a batch is all or nothing. A commit
    whose outcome is unknown is re-checked by a locking read of one of the new task ids: found,
    the response computed by that run is returned; not found, the body runs again with the same
    ids (replays never re-time).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import placeholders
from orbit_common.db.clock import UTC, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc, names
from orbit_common.platform import authz, idempotency
from orbit_common.platform import credentials as creds
from orbit_common.platform.idempotency import IdempotencyRequest, Replay
from orbit_common.platform.namespaces import Namespace
from orbit_common.pulse import queues, resources
from orbit_common.pulse.model import Queue, RetryPolicy, TaskState

OPERATION = "tasks.submit"
MAX_BATCH = 500
DAY_MS = 24 * 3600 * 1000
MAX_DELAY_MS = 31 * DAY_MS
MAX_DEADLINE_MS = 366 * DAY_MS
BUSINESS_KEY_MAX_BYTES = 512
HANDLER_RULE = "1-128 characters: ASCII letters, digits, '.', '_', ':' or '-'"
_HANDLER = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")
# (field, low, high): integer fields and their bounds; None means "not given". Leases and the
# retry policy take the queue's bounds (= the CHECK constraints of both tables).
_INT_BOUNDS: tuple[tuple[str, int, int], ...] = (
    ("delay_ms", 0, MAX_DELAY_MS),
    ("priority", 0, 9),
    ("deadline_ms", 1, MAX_DEADLINE_MS),
    ("start_deadline_ms", 1, MAX_DEADLINE_MS),
    ("attempt_timeout_ms", 100, DAY_MS),
    ("offer_lease_ms", *queues.OFFER_LEASE_MS),
    ("execution_lease_ms", *queues.EXECUTION_LEASE_MS),
)
_RETRY_INT_BOUNDS: tuple[tuple[str, int, int], ...] = (
    ("max_attempts", *queues.MAX_ATTEMPTS),
    ("initial_ms", 0, queues.INT_MAX),
    ("max_ms", 0, queues.INT_MAX),  # and at least the policy's initial_ms, checked with it
)
# DECIMAL(6,3) and DECIMAL(4,3): three decimal places at most.
_RETRY_DECIMAL_BOUNDS: tuple[tuple[str, decimal.Decimal, decimal.Decimal], ...] = (
    ("multiplier", *queues.MULTIPLIER),
    ("jitter", *queues.JITTER),
)
_MILLI = decimal.Decimal(1).scaleb(-queues.DECIMAL_PLACES)


# --- the wire shape (structured strictly at the API edge) ---------------------------------------


@attrs.frozen(kw_only=True)
class RetryRequest:
    """Retry policy overrides; a field left out takes the queue's default."""

    max_attempts: int | None = None
    initial_ms: int | None = None
    max_ms: int | None = None
    multiplier: Any = None  # a JSON number: int or Decimal, checked by validate()
    jitter: Any = None


@attrs.frozen(kw_only=True)
class SubmitRequest:
    """``POST …/tasks``. ``input`` here is the normal parse; the stored text comes from the
    number-preserving parse of the same body (see :func:`validate`)."""

    queue: str
    handler: str
    input: Any = attrs.field(factory=dict)
    delay_ms: int | None = None
    not_before: str | None = None
    priority: int = 0
    business_key: str | None = None
    concurrency_key: str | None = None
    deadline_ms: int | None = None
    start_deadline_ms: int | None = None
    attempt_timeout_ms: int | None = None
    retry: RetryRequest | None = None
    rerun_safe: bool = False
    offer_lease_ms: int | None = None
    execution_lease_ms: int | None = None


@attrs.frozen(kw_only=True)
class BatchItemRequest(SubmitRequest):
    idempotency_key: str | None = None


@attrs.frozen(kw_only=True)
class BatchRequest:
    """``POST …/tasks/batch``."""

    tasks: list[BatchItemRequest]


# --- validated values ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RetryOverrides:
    max_attempts: int | None = None
    initial_ms: int | None = None
    max_ms: int | None = None
    multiplier: decimal.Decimal | None = None
    jitter: decimal.Decimal | None = None

    def merged(self, default: RetryPolicy) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=_or(self.max_attempts, default.max_attempts),
            initial_ms=_or(self.initial_ms, default.initial_ms),
            max_ms=_or(self.max_ms, default.max_ms),
            multiplier=_or(self.multiplier, default.multiplier),
            jitter=_or(self.jitter, default.jitter),
        )

    def to_json(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "initial_ms": self.initial_ms,
                "max_ms": self.max_ms,
                "multiplier": None if self.multiplier is None else str(self.multiplier),
                "jitter": None if self.jitter is None else str(self.jitter)}


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


@attrs.frozen(kw_only=True)
class TaskSpec:
    """One validated submission. ``input`` is the number-preserving tree (JsonNumber leaves)."""

    queue: str
    handler: str
    input: Any
    delay_ms: int | None
    not_before: dt.datetime | None
    priority: int
    business_key: bytes | None
    deadline_ms: int | None
    start_deadline_ms: int | None
    attempt_timeout_ms: int | None
    retry: RetryOverrides
    rerun_safe: bool
    offer_lease_ms: int | None
    execution_lease_ms: int | None
    concurrency_key: bytes | None = None

    def canonical_request(self) -> dict[str, Any]:
        """What the idempotency digest covers: the request as given, normalised. Fields added
        later appear only when set, so requests recorded before them still replay."""
        extra = ({} if self.concurrency_key is None
                 else {"concurrency_key": self.concurrency_key.hex()})
        return {**extra,
            "queue": self.queue, "handler": self.handler, "input": self.input,
            "delay_ms": self.delay_ms,
            "not_before": None if self.not_before is None else iso(self.not_before),
            "priority": self.priority,
            "business_key": None if self.business_key is None else self.business_key.hex(),
            "deadline_ms": self.deadline_ms, "start_deadline_ms": self.start_deadline_ms,
            "attempt_timeout_ms": self.attempt_timeout_ms, "retry": self.retry.to_json(),
            "rerun_safe": self.rerun_safe, "offer_lease_ms": self.offer_lease_ms,
            "execution_lease_ms": self.execution_lease_ms,
        }


def iso(value: dt.datetime) -> str:
    """The public spelling of a time: ISO 8601 in UTC with microseconds."""
    return value.astimezone(UTC).isoformat(timespec="microseconds")


_RFC3339 = re.compile(
    r"\A(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,  # \d would match other scripts' digits, which int() then reads
)


def parse_rfc3339(text: str) -> dt.datetime:
    """An RFC 3339 date-time *with* an offset, as an aware UTC datetime (sub-microsecond digits
    are truncated). Raises ValueError with a message fit for a problem document."""
    match = _RFC3339.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError("an RFC 3339 date-time with an offset, e.g. 2030-01-02T03:04:05.678Z")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    offset = dt.timedelta(0)
    if not zulu:
        if int(off_m) > 59:
            raise ValueError("not a valid date-time (offset minutes above 59)")
        offset = dt.timedelta(hours=int(off_h), minutes=int(off_m)) * (-1 if sign == "-" else 1)
    try:
        micro = int((fraction or "").ljust(6, "0")[:6])
        local = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                            micro, tzinfo=dt.timezone(offset))  # refuses offsets of 24 h or more
        return local.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise ValueError("not a valid date-time (or out of range)") from exc


def _problem(path: str, message: str) -> dict[str, str]:
    return {"path": path, "message": message}


def _decimal_field(value: Any, path: str, low: decimal.Decimal, high: decimal.Decimal,
                   problems: list[dict[str, str]]) -> decimal.Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | decimal.Decimal):
        problems.append(_problem(path, "expected a number"))
        return None
    number = decimal.Decimal(value)
    if not low <= number <= high:
        problems.append(_problem(path, f"a number from {low} to {high}"))
        return None
    if number != number.quantize(_MILLI):
        problems.append(_problem(path, "at most 3 decimal places"))
        return None
    return number.quantize(_MILLI)


def _double_range_problem(tree: Any) -> bool:
    """True when a number would overflow a double: MySQL's JSON_VALID refuses it, so the
    ``ck_tasks_input_json`` CHECK would (MariaDB keeps the text and would accept it)."""
    stack = [tree]
    while stack:
        value = stack.pop()
        children = (value if type(value) is list else list(value.values())
                    if type(value) is dict else [value])
        # Comprehensions, not a loop step per item: an input may hold 500,000 numbers. Without
        # an exponent a number overflows only with more than 308 digits; only the numbers with
        # one (or that long) are converted.
        numbers = [v for v in children if type(v) is jsondoc.JsonNumber]
        if numbers:
            text = "".join(numbers)
            if ("e" in text or "E" in text or max(map(len, numbers)) > 308) and any(
                    math.isinf(float(v)) for v in numbers):
                return True
        stack.extend([v for v in children if type(v) is list or type(v) is dict])
    return False


def _check_retry(raw: RetryRequest | None, path: str,
                 problems: list[dict[str, str]]) -> RetryOverrides:
    if raw is None:
        return RetryOverrides()
    for field, low, high in _RETRY_INT_BOUNDS:
        value = getattr(raw, field)
        if value is not None and not low <= value <= high:
            problems.append(_problem(f"{path}.{field}", f"an integer from {low} to {high}"))
    multiplier, jitter = (
        _decimal_field(getattr(raw, field), f"{path}.{field}", low, high, problems)
        for field, low, high in _RETRY_DECIMAL_BOUNDS
    )
    return RetryOverrides(max_attempts=raw.max_attempts, initial_ms=raw.initial_ms,
                          max_ms=raw.max_ms, multiplier=multiplier, jitter=jitter)


def _check_when(dto: SubmitRequest, path: str,
                problems: list[dict[str, str]]) -> dt.datetime | None:
    """``not_before`` parsed; the rules between delay, not_before and the deadline."""
    if (dto.deadline_ms is not None and dto.delay_ms is not None
            and dto.deadline_ms <= dto.delay_ms):
        problems.append(_problem(f"{path}.deadline_ms",
                                 "the deadline would pass before the delay ends"))
    if dto.not_before is None:
        return None
    if dto.delay_ms is not None:
        problems.append(_problem(f"{path}.not_before", "give delay_ms or not_before, not both"))
    try:
        return parse_rfc3339(dto.not_before)
    except ValueError as exc:
        problems.append(_problem(f"{path}.not_before", str(exc)))
        return None


def validate(dto: SubmitRequest, exact_input: Any, path: str
             ) -> tuple[TaskSpec | None, list[dict[str, str]]]:
    """Check the ranges and rules the types cannot express; ``path`` is the item's JSON path
    (``$`` or ``$.tasks[3]``). ``exact_input`` is ``input`` from the number-preserving parse
    (``{}`` when absent). Returns the spec, or the problems (each pointing at its field)."""
    problems: list[dict[str, str]] = []
    if not names.is_valid_name(dto.queue):
        problems.append(_problem(f"{path}.queue", names.NAME_RULE))
    if not _HANDLER.match(dto.handler):
        problems.append(_problem(f"{path}.handler", HANDLER_RULE))
    for field, low, high in _INT_BOUNDS:
        value = getattr(dto, field)
        if value is not None and not low <= value <= high:
            problems.append(_problem(f"{path}.{field}", f"an integer from {low} to {high}"))
    not_before = _check_when(dto, path, problems)
    business_key = None
    if dto.business_key is not None:
        business_key = dto.business_key.encode("utf-8")  # loads_strict refused lone surrogates
        if not 1 <= len(business_key) <= BUSINESS_KEY_MAX_BYTES:
            problems.append(_problem(f"{path}.business_key",
                                     f"1-{BUSINESS_KEY_MAX_BYTES} bytes of UTF-8"))
    concurrency_key = None
    if dto.concurrency_key is not None:
        concurrency_key = dto.concurrency_key.encode("utf-8")
        if not 1 <= len(concurrency_key) <= resources.KEY_MAX_BYTES:
            problems.append(_problem(f"{path}.concurrency_key",
                                     f"1-{resources.KEY_MAX_BYTES} bytes of UTF-8"))
    retry = _check_retry(dto.retry, f"{path}.retry", problems)
    if _double_range_problem(exact_input):
        problems.append(_problem(f"{path}.input",
                                 "a number is beyond the range of a double (about 1.8e308)"))
    if problems:
        return None, problems
    return TaskSpec(
        queue=dto.queue, handler=dto.handler, input=exact_input, delay_ms=dto.delay_ms,
        not_before=not_before, priority=dto.priority, business_key=business_key,
        deadline_ms=dto.deadline_ms, start_deadline_ms=dto.start_deadline_ms,
        attempt_timeout_ms=dto.attempt_timeout_ms, retry=retry, rerun_safe=dto.rerun_safe,
        offer_lease_ms=dto.offer_lease_ms, execution_lease_ms=dto.execution_lease_ms,
        concurrency_key=concurrency_key,
    ), []


# --- views --------------------------------------------------------------------------------------


def _opt_iso(value: dt.datetime | None) -> str | None:
    return None if value is None else iso(value)


def business_key_text(value: bytes | None) -> str | None:
    # Every key this API stores is UTF-8; "replace" only guards rows written some other way.
    return None if value is None else value.decode("utf-8", errors="replace")


def receipt_view(
    *, task_id: bytes, queue: str, handler: str, state: TaskState, priority: int,
    business_key: bytes | None, created_at: dt.datetime, available_at: dt.datetime,
    deadline_at: dt.datetime | None, start_deadline_at: dt.datetime | None, rerun_safe: bool,
    revision: int, concurrency_key: bytes | None = None,
) -> dict[str, Any]:
    """The acceptance receipt (docs/api/tasks.md); list items and the detail extend it."""
    return {
        "id": task_id.hex(), "queue": queue, "handler": handler, "state": state.value,
        "priority": priority, "business_key": business_key_text(business_key),
        "concurrency_key": business_key_text(concurrency_key),
        "created_at": iso(created_at), "available_at": iso(available_at),
        "deadline_at": _opt_iso(deadline_at), "start_deadline_at": _opt_iso(start_deadline_at),
        "rerun_safe": rerun_safe, "revision": revision,
    }


# --- authorization ------------------------------------------------------------------------------


async def authorize(
    cur: Any, principal: creds.Principal, action: authz.Action, namespace_name: str
) -> tuple[Namespace, tuple[authz.Grant, ...]]:
    """The namespace (visible, ``action`` granted for some queue of it) and the credential's
    current grants, both read in the caller's transaction, for per-queue decisions."""
    return await creds.authorize_with_grants(cur, principal, action, namespace_name)


async def authorize_submission(db: Database, principal: creds.Principal, namespace: str) -> None:
    """What the path alone decides, before the body is read: the namespace is visible to the
    caller and it may submit there for some queue (one short read: the credential, its
    application and the namespace). A caller that may not gets the 404, 403 or 401 of the
    submission itself without its body being parsed; the submission's transaction checks
    everything again, per queue."""
    await db.read("tasks.authorize_submission", lambda cur: creds.authorize(
        cur, principal, authz.Action.TASKS_SUBMIT, namespace))


def check_batch_size(raw: bytes) -> None:
    """Refuse a batch of more than :data:`MAX_BATCH` items while its array is read, before the
    items are materialised or validated (jsondoc.array_longer_than)."""
    if jsondoc.array_longer_than(raw, "tasks", MAX_BATCH):
        raise errors.ValidationFailed([_problem("$.tasks", f"1-{MAX_BATCH} items")])


def may(grants: Iterable[authz.Grant], action: authz.Action, namespace: str, queue: str) -> bool:
    return authz.allowed(grants, action.value, namespace, queue)


# Forced: with few queues per namespace the optimizer prefers the primary key's namespace prefix.
QUEUES_BY_NAME = (
    f"SELECT {Queue.COLUMNS} FROM pulse_queues q FORCE INDEX (uq_queues_name)"
    " WHERE q.namespace_id = %s AND q.name IN ({})"
)


async def queues_by_name(cur: Any, namespace_id: bytes, queue_names: Sequence[str]
                         ) -> dict[str, Queue]:
    await cur.execute(QUEUES_BY_NAME.format(placeholders(len(queue_names))),
                      (namespace_id, *queue_names))
    return {row["name"]: Queue.from_row(row) for row in await cur.fetchall()}


# --- submission ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Item:
    """One item of a submission, with the identities made before the transaction.

    ``owner_kind`` / ``owner_id`` name what made the task when Orbit made it (a schedule fire:
    ``SCHEDULE`` and the schedule id; a workflow step: ``WORKFLOW`` and the instance id); a
    client's submission has neither (ck_tasks_owner: both or none). ``workflow_gate_id`` is the
    owning instance's execution gate (a workflow step's task: claims and starts check it too)."""

    spec: TaskSpec
    path: str
    task_id: bytes = attrs.field(factory=ids.new_id)
    event_id: bytes = attrs.field(factory=ids.new_id)
    record_id: bytes = attrs.field(factory=ids.new_id)
    idem: IdempotencyRequest | None = None
    owner_kind: str | None = None
    owner_id: bytes | None = None
    workflow_gate_id: bytes | None = None


@attrs.frozen(kw_only=True)
class Accepted:
    task_id: bytes
    receipt: dict[str, Any]
    replayed: bool


def make_items(
    principal: creds.Principal, specs: Sequence[tuple[TaskSpec, str | None, str, str]]
) -> list[Item]:
    """Items for ``(spec, idempotency key, item path, key path)``; the digest of a keyed item is
    computed here, before the runner. The namespace id is filled in inside the transaction."""
    items = []
    seen: dict[tuple[str, bytes], str] = {}
    problems: list[dict[str, str]] = []
    for spec, key, path, key_path in specs:
        idem = None
        if key is not None:
            try:
                idem = IdempotencyRequest.build(
                    namespace_id=bytes(16),  # placeholder: replaced once the namespace is known
                    operation=OPERATION, scope=spec.queue.encode(), key=key,
                    request=spec.canonical_request(), credential_id=principal.credential_id,
                )
            except errors.ValidationFailed as exc:
                problems.extend(_problem(key_path, p["message"]) for p in exc.errors)
                continue
            identity = (spec.queue, idem.key)
            if identity in seen:
                problems.append(_problem(key_path, f"repeats the key of {seen[identity]}"))
                continue
            seen[identity] = key_path
        items.append(Item(spec=spec, path=path, idem=idem))
    if problems:
        raise errors.ValidationFailed(problems)
    return items


# Only placeholders in VALUES: executemany then sends one multi-row INSERT (split only when a
# statement would exceed the driver's max_stmt_length), not one statement per row.
INSERT_TASKS = """
INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, revision, priority,
  available_at, business_key, deadline_at, start_deadline_at, attempt_timeout_ms, max_attempts,
  retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter, offer_lease_ms,
  execution_lease_ms, rerun_safe, attempts_used, effect_uncertain, created_at, updated_at,
  concurrency_key, concurrency_key_digest, owner_kind, owner_id, workflow_gate_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
  %s, %s, %s, %s, %s, %s, %s, %s)
"""
INSERT_EVENTS = """
INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id, aggregate_revision,
  event_type, from_state, to_state, payload, occurred_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
TASK_EXISTS = "SELECT id FROM pulse_tasks WHERE namespace_id = %s AND id = %s LOCK IN SHARE MODE"


def _accepted(item: Item, replay: Replay) -> Accepted:
    """An earlier submission's receipt, replayed by the idempotency protocol."""
    if replay.status != 201 or replay.resource_id is None:
        # Recorded with its final receipt in one statement: never a placeholder.
        raise errors.DatabaseError(f"{item.path}: an idempotency record of tasks.submit has"
                                   " no receipt")
    return Accepted(task_id=replay.resource_id, replayed=True, receipt=replay.body)


@attrs.frozen(kw_only=True)
class _Row:
    item: Item
    queue: Queue
    receipt: dict[str, Any]
    task: tuple[Any, ...]


def _plan(item: Item, queue: Queue, now: dt.datetime, problems: list[dict[str, str]]) -> _Row:
    """The row of a new task: times from ``now`` and the queue's defaults frozen in."""
    spec = item.spec
    available_at = now
    if spec.delay_ms is not None:
        available_at = now + dt.timedelta(milliseconds=spec.delay_ms)
    elif spec.not_before is not None:
        if spec.not_before > now + dt.timedelta(milliseconds=MAX_DELAY_MS):
            problems.append(_problem(f"{item.path}.not_before",
                                     "at most 31 days after the time of acceptance"))
        available_at = max(spec.not_before, now)
    deadline_at = None
    if spec.deadline_ms is not None:
        deadline_at = now + dt.timedelta(milliseconds=spec.deadline_ms)
        if deadline_at <= available_at:
            problems.append(_problem(f"{item.path}.deadline_ms",
                                     "the deadline would pass before the task is available"))
    start_deadline_at = None
    if spec.start_deadline_ms is not None:
        start_deadline_at = available_at + dt.timedelta(milliseconds=spec.start_deadline_ms)
    retry = spec.retry.merged(queue.retry)
    if retry.max_ms < retry.initial_ms:
        problems.append(_problem(f"{item.path}.retry.max_ms",
                                 f"at least initial_ms ({retry.initial_ms}) of the policy"))
    receipt = receipt_view(
        task_id=item.task_id, queue=queue.name, handler=spec.handler, state=TaskState.WAITING,
        priority=spec.priority, business_key=spec.business_key, created_at=now,
        available_at=available_at, deadline_at=deadline_at,
        start_deadline_at=start_deadline_at, rerun_safe=spec.rerun_safe, revision=1,
        concurrency_key=spec.concurrency_key,
    )
    task = (
        queue.namespace_id, item.task_id, queue.id, spec.handler, jsondoc.dumps(spec.input),
        TaskState.WAITING.value, 1, spec.priority, to_db(available_at), spec.business_key,
        None if deadline_at is None else to_db(deadline_at),
        None if start_deadline_at is None else to_db(start_deadline_at),
        spec.attempt_timeout_ms, retry.max_attempts, retry.initial_ms, retry.max_ms,
        retry.multiplier, retry.jitter, _or(spec.offer_lease_ms, queue.offer_lease_ms),
        _or(spec.execution_lease_ms, queue.execution_lease_ms), int(spec.rerun_safe), 0, 0,
        to_db(now), to_db(now), spec.concurrency_key,
        None if spec.concurrency_key is None else resources.key_digest(spec.concurrency_key),
        item.owner_kind, item.owner_id, item.workflow_gate_id,
    )
    return _Row(item=item, queue=queue, receipt=receipt, task=task)


async def _claim_identities(cur: Any, rows: list[_Row],
                            replays: dict[bytes, Accepted]) -> list[_Row]:
    """Record the idempotency identities of the keyed new rows with their receipts (the one
    protocol's batch form, platform/idempotency.py); rows that a concurrent request committed
    first become replays. Returns the rows still to insert."""
    keyed = [r for r in rows if r.item.idem is not None]
    if not keyed:
        return rows
    outcomes = await idempotency.record_many(cur, [
        idempotency.Entry(request=r.item.idem, record_id=r.item.record_id,
                          response=Replay(status=201, body=r.receipt,
                                          resource_id=r.item.task_id))
        for r in keyed if r.item.idem is not None], where=[r.item.path for r in keyed])
    for r, outcome in zip(keyed, outcomes, strict=True):
        if isinstance(outcome, Replay):
            replays[r.item.task_id] = _accepted(r.item, outcome)
    return [r for r in rows if r.item.task_id not in replays]


async def _insert_rows(cur: Any, namespace_id: bytes, rows: Sequence[_Row],
                       now: dt.datetime) -> None:
    await cur.executemany(INSERT_TASKS, [r.task for r in rows])
    # The events before the counters: they are new rows no other transaction waits for, and
    # the queue row, the hottest lock, is then held only from its update to the commit.
    await cur.executemany(INSERT_EVENTS, [
        (namespace_id, r.item.event_id, "task", r.item.task_id, 1, "task.accepted", None,
         TaskState.WAITING.value, jsondoc.dumps(r.receipt), to_db(now))
        for r in rows
    ])
    # Counters last (the one lock order: queues, the new keys' rows, the application); a limit
    # refusal rolls everything back.
    keys = [r.item.spec.concurrency_key for r in rows if r.item.spec.concurrency_key is not None]
    await resources.apply(cur, namespace_id, resources.Usage(
        unfinished=Counter(r.queue.id for r in rows)), admit=True,
        between=lambda: resources.ensure_keys(cur, namespace_id, keys))


async def insert_generated(cur: Any, namespace_id: bytes,
                           planned: Sequence[tuple[Item, Queue]], now: dt.datetime,
                           payload: Sequence[dict[str, Any]] | None = None) -> list[bytes]:
    """Tasks made by Orbit itself (schedule fires), inside the caller's transaction: the same
    rows, counters, limits and ``task.accepted`` events as a submission, no idempotency records
    (the caller's own ledger is the identity). ``payload`` entries are merged into each
    accepted event (e.g. the schedule occurrence). Raises like :func:`submit` on a limit."""
    problems: list[dict[str, str]] = []
    rows = [_plan(item, queue, now, problems) for item, queue in planned]
    if problems:
        raise errors.ValidationFailed(problems)
    if payload is not None:
        rows = [attrs.evolve(r, receipt={**r.receipt, **extra})
                for r, extra in zip(rows, payload, strict=True)]
    if rows:
        await _insert_rows(cur, namespace_id, rows, now)
    return [r.item.task_id for r in rows]


async def submit(
    db: Database,
    principal: creds.Principal,
    *,
    namespace: str,
    items: Sequence[Item],
) -> list[Accepted]:
    """Accept ``items`` (already validated, identities made) in one transaction; see the module
    docstring. Returns one :class:`Accepted` per item, in order."""
    if not 1 <= len(items) <= MAX_BATCH:
        raise errors.ValidationFailed([_problem("$.tasks", f"1-{MAX_BATCH} items")])
    queue_names = list(dict.fromkeys(item.spec.queue for item in items))
    last: list[tuple[bytes, list[Accepted]]] = []

    async def body(cur: Any) -> list[Accepted]:
        ns, grants = await authorize(cur, principal, authz.Action.TASKS_SUBMIT, namespace)
        for name in queue_names:
            if not may(grants, authz.Action.TASKS_SUBMIT, ns.name, name):
                raise errors.QueueNotFound(f"no queue {name!r} in {ns.name!r} for this credential")
        queues = await queues_by_name(cur, ns.id, queue_names)
        for name in queue_names:
            if name not in queues:
                raise errors.QueueNotFound(f"no queue {name!r} in {ns.name!r} for this credential")
        scoped = [attrs.evolve(i, idem=attrs.evolve(i.idem, namespace_id=ns.id))
                  if i.idem is not None else i for i in items]
        replays: dict[bytes, Accepted] = {}
        keyed = [i for i in scoped if i.idem is not None]
        found = await idempotency.find_many(cur, [i.idem for i in keyed if i.idem is not None],
                                            where=[i.path for i in keyed])
        for index, replay in found.items():
            replays[keyed[index].task_id] = _accepted(keyed[index], replay)
        now = await db_now(cur)
        problems: list[dict[str, str]] = []
        rows = [_plan(item, queues[item.spec.queue], now, problems)
                for item in scoped if item.task_id not in replays]
        if problems:
            raise errors.ValidationFailed(problems)
        if rows:
            rows = await _claim_identities(cur, rows, replays)
        if rows:
            await _insert_rows(cur, ns.id, rows, now)
        created = {r.item.task_id: r.receipt for r in rows}
        result = [
            replays[i.task_id] if i.task_id in replays
            else Accepted(task_id=i.task_id, receipt=created[i.task_id], replayed=False)
            for i in scoped
        ]
        last[:] = [(ns.id, result)]
        return result

    async def recheck(cur: Any) -> list[Accepted] | None:
        if not last:
            return None
        namespace_id, result = last[0]
        new = [a.task_id for a in result if not a.replayed]
        if not new:  # nothing was written: running the body again replays the same receipts
            return None
        await cur.execute(TASK_EXISTS, (namespace_id, new[0]))
        return result if await cur.fetchone() is not None else None

    return await db.transaction("tasks.submit", body, recheck=recheck)

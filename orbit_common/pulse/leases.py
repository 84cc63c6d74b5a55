"""The lease protocol: claim, start, renew, finish, and the recovery scan.

Identities
    A *grant* is one attempt row: ``(attempt id, generation, secret token)``. The generation is the
    task's ``attempts_used`` after the grant (unique and increasing per task); only the SHA-256 of
    the token is stored. Every worker call carries all three; a call whose token or generation
    does not match, or whose attempt is no longer the task's live attempt, changes nothing.

State diagram (task; attempt in brackets)
    WAITING --claim--> LEASED [OFFERED, offer lease]
    LEASED --start--> RUNNING [RUNNING, execution lease]        only while the offer is valid,
                                                                the gate is OPEN, no cancel
    RUNNING --renew--> RUNNING (lease extended)                  only while the lease is valid
    RUNNING --finish--> SUCCEEDED | WAITING (retry) | FAILED | NEEDS_REVIEW | CANCELLED
    LEASED --offer expired--> WAITING | FAILED                   [OFFER_EXPIRED]
    RUNNING --lease lost--> WAITING (rerun_safe, budget left) | NEEDS_REVIEW  [LEASE_EXPIRED]
    WAITING --deadline--> FAILED | NEEDS_REVIEW (if an earlier attempt's effect is uncertain)

Invariants
    * At most one live attempt (OFFERED or RUNNING) per task: a claim only takes WAITING tasks
      and moves them to LEASED in the same guarded UPDATE that records the attempt.
    * Database time decides every lease: ``UTC_TIMESTAMP(6)`` read inside the transaction.
    * Communication failure is never business failure: a lost execution lease re-queues the task
      only when the task declared re-running safe and budget remains, and marks the effect
      uncertain; otherwise the task goes to NEEDS_REVIEW. Uncertainty is never dropped: a task
      carrying it cannot end FAILED or CANCELLED automatically (NEEDS_REVIEW instead); a later
      confirmed success clears it.
    * A retry needs explicit retryable evidence (``retryable=true`` on a failure report).
    * Terminal state, attempt result, queue counter release, state events and result events
      commit in one transaction.
    * A stale report (finished attempt, expired lease, wrong generation) changes nothing and is
      kept as late evidence (``pulse_attempt_evidence``).

Lock order (every transaction here)
    session (shared) → gate (shared) → tasks (by primary key, or SKIP LOCKED for claims and
    scans) → attempts → queue rows (counter increments, by primary key) → result stream (last).
    Queue counters are commutative increments taken after the task rows, so a claim never holds
    a queue row while it scans for tasks.

Failure handling
    Every function runs inside the transaction runner (READ COMMITTED); a deadlock or lock wait
    re-runs the whole batch. Guarded UPDATEs re-check state, revision and lease expiry even after
    the row locks, and a miss aborts the transaction rather than writing half a decision.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders, values_table
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import digests, ids, jsondoc
from orbit_common.platform import authz, credentials
from orbit_common.platform.events import EventRecord, append_events
from orbit_common.platform.results import ResultEvent, append_results
from orbit_common.pulse import control, resources
from orbit_common.pulse.model import AttemptState, RetryPolicy, TaskState
from orbit_common.pulse.resources import Usage
from orbit_common.pulse.workers import QueueRef, Session, check_active

MAX_BATCH = 256
TOKEN_DOMAIN = "orbit.lease-token.v1"  # noqa: S105 - a digest domain tag, not a secret


def token_digest(token: str) -> bytes:
    return digests.domain_digest(TOKEN_DOMAIN, token.encode("utf-8"))


def _ms(value: int) -> dt.timedelta:
    return dt.timedelta(milliseconds=value)


class BatchTooLarge(errors.BadRequest):
    code = "batch_too_large"
    title = "Too many items in one batch"


def _check_batch(items: Sequence[Any]) -> None:
    if len(items) > MAX_BATCH:
        raise BatchTooLarge(f"at most {MAX_BATCH} items per batch")


# Batched per-row updates (orbit_common/db/batch.values_table). The derived table of the
# batch drives the join (STRAIGHT_JOIN) and reaches each row by its full primary key: without
# it the optimizer may scan a whole namespace per batch on small or fresh tables.
# tests/schema/test_explain_leases.py pins these plans.
CLAIM_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.id"
    " SET t.state = 'LEASED', t.revision = t.revision + 1, t.attempts_used = v.generation,"
    "     t.current_attempt_id = v.attempt_id, t.lease_expires_at = v.expires,"
    "     t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.state = 'WAITING' AND t.revision = v.revision"
)
START_ATTEMPTS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_attempts a"
    " ON a.namespace_id = %s AND a.id = v.attempt_id"
    " SET a.state = 'RUNNING', a.started_at = %s, a.lease_expires_at = v.expires"
    " WHERE a.state = 'OFFERED'"
)
START_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.task_id"
    " SET t.state = 'RUNNING', t.revision = t.revision + 1, t.lease_expires_at = v.expires,"
    "     t.first_started_at = COALESCE(t.first_started_at, %s),"
    "     t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.state = 'LEASED' AND t.revision = v.revision"
    "   AND t.current_attempt_id = v.attempt_id"
)
RENEW_ATTEMPTS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_attempts a"
    " ON a.namespace_id = %s AND a.id = v.attempt_id"
    " SET a.lease_expires_at = v.expires, a.renewals = a.renewals + 1"
    " WHERE a.state = 'RUNNING'"
    "   AND a.lease_expires_at > UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
)
RENEW_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.task_id"
    " SET t.lease_expires_at = v.expires, t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.state = 'RUNNING'"
    "   AND t.current_attempt_id = v.attempt_id"
)
END_ATTEMPTS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_attempts a"
    " ON a.namespace_id = %s AND a.id = v.attempt_id"
    " SET a.state = v.state, a.retryable = v.retryable, a.result = v.result,"
    "     a.error = v.error, a.finished_at = %s"
    " WHERE a.state IN ('OFFERED', 'RUNNING')"
)
END_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.task_id"
    " SET t.state = v.state, t.revision = t.revision + 1,"
    "     t.available_at = COALESCE(v.available_at, t.available_at),"
    "     t.current_attempt_id = NULL, t.lease_expires_at = NULL,"
    "     t.effect_uncertain = v.uncertain, t.outcome_reason = v.reason,"
    "     t.result = COALESCE(v.result, t.result), t.error = COALESCE(v.error, t.error),"
    "     t.completed_at = IF(v.terminal = 1, %s, NULL), t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.revision = v.revision"
    "   AND t.current_attempt_id = v.attempt_id AND t.state IN ('LEASED', 'RUNNING')"
)


# --- claim -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Grant:
    """What a worker needs to run one attempt. ``token`` is shown only here."""

    namespace_id: bytes
    task_id: bytes
    attempt_id: bytes
    generation: int
    token: str = attrs.field(repr=False)
    queue: str
    handler: str
    input: str
    priority: int
    business_key: bytes | None
    rerun_safe: bool
    offer_expires_at: dt.datetime
    deadline_at: dt.datetime | None
    attempt_timeout_ms: int | None
    max_attempts: int
    concurrency_key: bytes | None = None
    concurrency_token: int | None = None  # fencing token: strictly increasing per key


GATE_SHARED = """
SELECT state FROM pulse_execution_gates WHERE namespace_id = %s AND id = %s LOCK IN SHARE MODE
"""


def _claim_sql(handler_count: int, concurrency_keys: bool) -> str:
    # ix_tasks_claim: (namespace_id, queue_id, state, dispatch_at, available_at, id). A task
    # whose concurrency key is held is skipped before the ordering picks (not after), so a run
    # of tasks on one busy key cannot block the keys behind it. So is a key at the token bound
    # (resources.acquire refuses it for good): the bound is a code constant, not a value.
    keys = (
        "  AND (t.concurrency_key_digest IS NULL OR NOT EXISTS ("
        "SELECT 1 FROM pulse_concurrency_limits l WHERE l.namespace_id = t.namespace_id"
        " AND l.key_digest = t.concurrency_key_digest AND (l.held_permits >= l.max_permits"
        f" OR l.revision > {resources.MAX_TOKEN - 2})))"
        if concurrency_keys else "  AND t.concurrency_key_digest IS NULL"
    )
    return f"""
SELECT t.id, t.handler, t.input, t.priority, t.business_key, t.rerun_safe, t.revision,
       t.attempts_used, t.max_attempts, t.offer_lease_ms, t.deadline_at, t.attempt_timeout_ms,
       t.concurrency_key, t.concurrency_key_digest
FROM pulse_tasks t
WHERE t.namespace_id = %s AND t.queue_id = %s AND t.state = 'WAITING'
  AND t.dispatch_at <= %s AND t.available_at <= %s
  AND (t.deadline_at IS NULL OR t.deadline_at > %s)
  AND (t.start_deadline_at IS NULL OR t.first_started_at IS NOT NULL OR t.start_deadline_at > %s)
  AND t.attempts_used < t.max_attempts
  AND t.handler IN ({placeholders(handler_count)})
{keys}
ORDER BY t.dispatch_at, t.available_at, t.id
LIMIT %s
FOR UPDATE SKIP LOCKED
"""


INSERT_ATTEMPTS = (
    "INSERT INTO pulse_attempts (namespace_id, id, task_id, queue_id, generation, token_digest,"
    " concurrency_token, worker_instance_id, worker_session_id, state, offered_at,"
    " lease_expires_at)"
)


async def _session_may_work(cur: Any, session: Session, queue: QueueRef) -> None:
    grants = await credentials.active_grants(cur, session.credential_id)
    if not authz.allowed(grants, authz.Action.WORKERS_WORK.value, session.namespace, queue.name):
        raise errors.Forbidden("the session's credential may no longer work this queue")


async def claim(cur: Any, session: Session, queue: QueueRef, limit: int) -> list[Grant]:
    """Grant up to ``limit`` due tasks of ``queue`` to ``session`` (step 1 of 2).

    Locks: the session row (shared), the queue's gate (shared), due WAITING tasks (SKIP LOCKED,
    in claim order), then (:func:`resources.grantable`, in the one lock order) the queue row,
    the concurrency keys' rows and the application's resource row when they must be counted
    under a lock; the counters at the end. Returns nothing when
    the gate is paused. A keyed grant carries the key's new fencing token, recorded on the
    attempt and its permit row. Run it with :func:`run_claim`, which re-runs the rare claim
    that raced a new concurrency limit.
    """
    limit = max(0, min(limit, MAX_BATCH))
    if limit == 0:
        return []
    await check_active(cur, session)
    await _session_may_work(cur, session, queue)
    await cur.execute(GATE_SHARED, (session.namespace_id, queue.gate_id))
    gate = await cur.fetchone()
    if gate is None or gate["state"] != "OPEN" or await control.dispatch_frozen(cur):
        return []
    now = await db_now(cur)
    when = to_db(now)
    await cur.execute(
        _claim_sql(len(session.handlers), session.concurrency_keys),
        (session.namespace_id, queue.id, when, when, when, when, *session.handlers, limit),
    )
    rows = list(await cur.fetchall())
    if not rows:
        return []
    rows, keyed, locked = await resources.grantable(cur, session.namespace_id, queue.id, rows)
    if not rows:
        return []

    grants: list[Grant] = []
    attempt_rows = []
    task_updates = []
    events = []
    permits = []
    for row in rows:
        attempt_id, token = ids.new_id(), secrets.token_urlsafe(32)
        generation = row["attempts_used"] + 1
        expires = now + _ms(row["offer_lease_ms"])
        key = keyed.get(row["concurrency_key_digest"]) if row["concurrency_key_digest"] else None
        attempt_rows.append((
            session.namespace_id, attempt_id, row["id"], queue.id, generation,
            token_digest(token), key.token if key else None, session.instance_id, session.id,
            "OFFERED", when, to_db(expires),
        ))
        if key is not None:
            permits.append((key.limit_id, attempt_id, row["id"], key.token))
        task_updates.append((row["id"], row["revision"], attempt_id, generation, to_db(expires)))
        events.append(task_event(
            session.namespace_id, row["id"], row["revision"] + 1, "task.leased",
            TaskState.WAITING, TaskState.LEASED,
            {"attempt_id": attempt_id.hex(), "generation": generation,
             **({"concurrency_token": key.token} if key else {})}))
        grants.append(Grant(
            namespace_id=session.namespace_id, task_id=row["id"], attempt_id=attempt_id,
            generation=generation, token=token, queue=queue.name, handler=row["handler"],
            input=row["input"], priority=row["priority"], business_key=row["business_key"],
            rerun_safe=bool(row["rerun_safe"]), offer_expires_at=expires,
            deadline_at=as_utc(row["deadline_at"]) if row["deadline_at"] else None,
            attempt_timeout_ms=row["attempt_timeout_ms"], max_attempts=row["max_attempts"],
            concurrency_key=row["concurrency_key"],
            concurrency_token=key.token if key else None,
        ))
    sql, params = multi_insert(INSERT_ATTEMPTS, "(" + ", ".join(["%s"] * 12) + ")", attempt_rows)
    await cur.execute(sql, params)
    table, values = values_table(["id", "revision", "attempt_id", "generation", "expires"],
                                 task_updates)
    await cur.execute(
        CLAIM_TASKS.format(table=table),
        (*values, session.namespace_id),
    )
    expect_rows(cur, len(task_updates), "claim")
    await resources.record_permits(cur, session.namespace_id, permits)
    await append_events(cur, events)
    # The counters last. Unless resources.grantable locked the queue row, the update checks
    # that no max_concurrent_attempts appeared since the plain read (ConcurrencyLimitRaced:
    # the caller re-runs the claim, see run_claim).
    await resources.apply(cur, session.namespace_id,
                          Usage(active=Counter({queue.id: len(grants)}), reserved=len(grants)),
                          cap_active=not locked)
    return grants


async def run_claim(db: Database, name: str, session: Session, queue: QueueRef,
                    limit: int) -> list[Grant]:
    """:func:`claim` in its own transaction, re-run (up to 3 times) when a concurrency limit
    was set on the queue while it ran: the rolled-back attempt then reads the limit and counts
    the room under the queue row's lock."""
    for _ in range(2):
        try:
            return await db.transaction(name, lambda cur: claim(cur, session, queue, limit))
        except resources.ConcurrencyLimitRaced:
            continue
    return await db.transaction(name, lambda cur: claim(cur, session, queue, limit))


# --- shared helpers --------------------------------------------------------------------------


def expect_rows(cur: Any, count: int, what: str) -> None:
    if cur.rowcount != count:
        raise errors.StaleRevision(f"{what}: {cur.rowcount} of {count} guarded rows matched")


def task_event(  # noqa: PLR0917 - one event's fields, positional for readability at call sites
    namespace_id: bytes, task_id: bytes, revision: int, event_type: str,
           from_state: TaskState | None, to_state: TaskState | None,
           payload: dict[str, Any]) -> EventRecord:
    return EventRecord(
        namespace_id=namespace_id, id=ids.new_id(), aggregate_type="task", aggregate_id=task_id,
        aggregate_revision=revision, event_type=event_type,
        from_state=from_state.value if from_state else None,
        to_state=to_state.value if to_state else None, payload=payload,
    )


@attrs.frozen(kw_only=True)
class AttemptRef:
    """What identifies a live grant in every worker call after the claim."""

    attempt_id: bytes
    token: str = attrs.field(repr=False)
    generation: int


@attrs.frozen(kw_only=True)
class Locked:
    """An attempt and its task, both locked FOR UPDATE."""

    attempt: dict[str, Any]
    task: dict[str, Any]

    def matches(self, ref: AttemptRef) -> bool:
        return (
            self.attempt["generation"] == ref.generation
            and secrets.compare_digest(self.attempt["token_digest"], token_digest(ref.token))
        )

    def is_live(self) -> bool:
        return (
            self.task["current_attempt_id"] == self.attempt["id"]
            and self.task["state"] in {TaskState.LEASED, TaskState.RUNNING}
        )


ATTEMPT_TASKS = "SELECT id, task_id FROM pulse_attempts WHERE namespace_id = %s AND id IN ({})"
TASK_COLUMNS = (
    "id, queue_id, handler, state, revision, attempts_used, max_attempts, retry_initial_ms,"
    " retry_max_ms, retry_multiplier, retry_jitter, execution_lease_ms, attempt_timeout_ms,"
    " deadline_at, rerun_safe, current_attempt_id, lease_expires_at, cancel_requested_at,"
    " effect_uncertain, first_started_at"
)
LOCK_TASKS = (
    f"SELECT {TASK_COLUMNS} FROM pulse_tasks WHERE namespace_id = %s AND id IN ({{}})"
    " ORDER BY id FOR UPDATE"
)
ATTEMPT_COLUMNS = (
    "id, task_id, queue_id, generation, token_digest, concurrency_token, state, started_at,"
    " lease_expires_at"
)
LOCK_ATTEMPTS = (
    f"SELECT {ATTEMPT_COLUMNS} FROM pulse_attempts WHERE namespace_id = %s AND id IN ({{}})"
    " ORDER BY id FOR UPDATE"
)


async def _lock(cur: Any, namespace_id: bytes, attempt_ids: Sequence[bytes]) -> dict[bytes, Locked]:
    """Lock the named attempts' tasks, then the attempts (the global lock order)."""
    if not attempt_ids:
        return {}
    unique = sorted(set(attempt_ids))
    marks = placeholders(len(unique))
    await cur.execute(ATTEMPT_TASKS.format(marks), (namespace_id, *unique))
    task_of = {row["id"]: row["task_id"] for row in await cur.fetchall()}
    if not task_of:
        return {}
    task_ids = sorted(set(task_of.values()))
    await cur.execute(LOCK_TASKS.format(placeholders(len(task_ids))), (namespace_id, *task_ids))
    tasks = {row["id"]: row for row in await cur.fetchall()}
    found = sorted(task_of)
    await cur.execute(LOCK_ATTEMPTS.format(placeholders(len(found))), (namespace_id, *found))
    return {
        row["id"]: Locked(attempt=row, task=tasks[row["task_id"]])
        for row in await cur.fetchall()
        if row["task_id"] in tasks
    }


# --- start -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StartOutcome:
    attempt_id: bytes
    approved: bool
    reason: str | None = None
    lease_expires_at: dt.datetime | None = None
    retry_after_ms: int | None = None  # start_rate_limited: when the window has room again


def _execution_lease(now: dt.datetime, task: dict[str, Any],
                     started_at: dt.datetime) -> dt.datetime:
    """Execution lease: ``execution_lease_ms`` from now, never past the attempt timeout."""
    expires = now + _ms(task["execution_lease_ms"])
    if task["attempt_timeout_ms"] is not None:
        expires = min(expires, started_at + _ms(task["attempt_timeout_ms"]))
    return expires


async def start(  # noqa: PLR0912, PLR0915 - one pass over the batch; each branch is a rule
    cur: Any, namespace_id: bytes, refs: Sequence[AttemptRef]
) -> list[StartOutcome]:
    """Approve starts (step 2 of 2), answered per item; a repeated start is approved again.

    A start is approved only while the offer is valid, the queue's gate is OPEN, no cancel is
    requested and the queue's and the application's one-second start windows have room (else
    ``start_rate_limited`` with ``retry_after_ms``; the offer stays valid, so the worker may ask
    again). Locks: tasks, attempts (FOR UPDATE), the queues' gates (shared), then the queue rows
    and the application's resource row (start windows and the reserved count).
    """
    _check_batch(refs)
    locked = await _lock(cur, namespace_id, [r.attempt_id for r in refs])
    now = await db_now(cur)
    queue_ids = {lk.attempt["queue_id"] for lk in locked.values()}
    gates, start_limited = await _gate_states(cur, namespace_id, queue_ids)
    frozen = bool(locked) and await control.dispatch_frozen(cur)
    outcomes: list[StartOutcome] = []
    approvals: list[tuple[Any, ...]] = []
    events: list[EventRecord] = []
    approved_ids: set[bytes] = set()
    windows: dict[bytes, resources.Window] | None = None
    app_window = resources.Window(limit=None, until=None, used=0)
    for ref in refs:
        lk = locked.get(ref.attempt_id)
        if lk is None or not lk.matches(ref):
            outcomes.append(StartOutcome(attempt_id=ref.attempt_id, approved=False,
                                         reason="invalid_attempt"))
            continue
        state = AttemptState(lk.attempt["state"])
        if state is AttemptState.RUNNING and lk.is_live():
            # A repeated start (its first answer was lost) is approved again only while the
            # execution lease is still valid: after that, recovery may be re-granting the task.
            lease = as_utc(lk.attempt["lease_expires_at"])
            if lease <= now:
                outcomes.append(StartOutcome(attempt_id=ref.attempt_id, approved=False,
                                             reason="lease_expired"))
            else:
                outcomes.append(StartOutcome(attempt_id=ref.attempt_id, approved=True,
                                             lease_expires_at=lease))
            continue
        reason = None
        if state is not AttemptState.OFFERED or not lk.is_live():
            reason = "attempt_finished"
        elif as_utc(lk.attempt["lease_expires_at"]) <= now:
            reason = "offer_expired"
        elif lk.task["cancel_requested_at"] is not None:
            reason = "cancel_requested"
        elif gates.get(lk.attempt["queue_id"]) != "OPEN":
            reason = "queue_paused"
        elif frozen:
            reason = control.FROZEN_REASON
        if reason is not None:
            outcomes.append(StartOutcome(attempt_id=ref.attempt_id, approved=False,
                                         reason=reason))
            continue
        if ref.attempt_id not in approved_ids:
            queue_id = lk.attempt["queue_id"]
            if windows is None:
                # Start windows: the queues' rows, then the application's (lock order).
                windows = await resources.queue_windows(cur, namespace_id, queue_ids,
                                                        start_limited)
                app_window = await resources.application_window(cur, namespace_id)
            blocking = [w for w in (windows[queue_id], app_window)
                        if w.room(now) is not None and w.room(now) == 0]
            if blocking:
                outcomes.append(StartOutcome(
                    attempt_id=ref.attempt_id, approved=False, reason="start_rate_limited",
                    retry_after_ms=max(w.retry_after_ms(now) for w in blocking)))
                continue
            windows[queue_id].take(now, 1)
            app_window.take(now, 1)
        expires = _execution_lease(now, lk.task, now)
        if ref.attempt_id not in approved_ids:
            approved_ids.add(ref.attempt_id)
            approvals.append((lk.task["id"], lk.task["revision"], lk.attempt["id"],
                              to_db(expires)))
            events.append(task_event(namespace_id, lk.task["id"], lk.task["revision"] + 1,
                                 "task.started", TaskState.LEASED, TaskState.RUNNING,
                                 {"attempt_id": lk.attempt["id"].hex(),
                                  "generation": lk.attempt["generation"]}))
        outcomes.append(StartOutcome(attempt_id=ref.attempt_id, approved=True,
                                     lease_expires_at=expires))
    if approvals:
        when = to_db(now)
        table, values = values_table(["task_id", "revision", "attempt_id", "expires"], approvals)
        await cur.execute(
            START_ATTEMPTS.format(table=table),
            (*values, namespace_id, when),
        )
        expect_rows(cur, len(approvals), "start attempts")
        await cur.execute(
            START_TASKS.format(table=table),
            (*values, namespace_id, when),
        )
        expect_rows(cur, len(approvals), "start tasks")
        await append_events(cur, events)
        # Counter rows last, so the application's row is held only for the commit.
        await resources.save_windows(
            cur, namespace_id, windows or {},
            touched={lk.attempt["queue_id"] for lk in locked.values()
                     if lk.attempt["id"] in approved_ids},
            app=app_window, started=len(approvals))
    return outcomes


async def _gate_states(cur: Any, namespace_id: bytes, queue_ids: set[bytes]
                       ) -> tuple[dict[bytes, str], set[bytes]]:
    """The queues' gate states (gates read with a shared lock), and which queues have a start
    limit (one plain read of the queue rows serves both)."""
    if not queue_ids:
        return {}, set()
    ordered = sorted(queue_ids)
    await cur.execute(
        f"SELECT id, gate_id, max_starts_per_second FROM pulse_queues WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(ordered))})",
        (namespace_id, *ordered),
    )
    rows = list(await cur.fetchall())
    gate_of = {row["id"]: row["gate_id"] for row in rows}
    limited = {row["id"] for row in rows if row["max_starts_per_second"] is not None}
    gate_ids = sorted(set(gate_of.values()))
    if not gate_ids:
        return {}, limited
    await cur.execute(
        f"SELECT id, state FROM pulse_execution_gates WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(gate_ids))}) LOCK IN SHARE MODE",
        (namespace_id, *gate_ids),
    )
    state_of = {row["id"]: row["state"] for row in await cur.fetchall()}
    return ({queue_id: state_of.get(gate_id, "PAUSED") for queue_id, gate_id in gate_of.items()},
            limited)


# --- renew -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RenewOutcome:
    attempt_id: bytes
    renewed: bool
    reason: str | None = None
    lease_expires_at: dt.datetime | None = None
    cancel_requested: bool = False


async def renew(cur: Any, namespace_id: bytes, refs: Sequence[AttemptRef]) -> list[RenewOutcome]:
    """Extend execution leases, answered per item. Only a live RUNNING attempt whose lease has
    not expired (database time) is renewed; the answer carries the task's cancel intent.

    Locks: tasks, attempts (FOR UPDATE). A stale renewal from an authentic holder is kept as
    late evidence.
    """
    _check_batch(refs)
    locked = await _lock(cur, namespace_id, [r.attempt_id for r in refs])
    now = await db_now(cur)
    outcomes: list[RenewOutcome] = []
    renewals: dict[bytes, tuple[Any, ...]] = {}
    evidence: list[tuple[Any, ...]] = []
    for ref in refs:
        lk = locked.get(ref.attempt_id)
        if lk is None or not lk.matches(ref):
            outcomes.append(RenewOutcome(attempt_id=ref.attempt_id, renewed=False,
                                         reason="invalid_attempt"))
            continue
        cancel = lk.task["cancel_requested_at"] is not None
        reason = None
        if lk.attempt["state"] != AttemptState.RUNNING or not lk.is_live():
            reason = "attempt_finished"
        elif as_utc(lk.attempt["lease_expires_at"]) <= now:
            reason = "lease_expired"
        if reason is not None:
            evidence.append(_evidence_row(namespace_id, lk, "RENEW", None, {}, reason))
            outcomes.append(RenewOutcome(attempt_id=ref.attempt_id, renewed=False,
                                         reason=reason, cancel_requested=cancel))
            continue
        expires = _execution_lease(now, lk.task, as_utc(lk.attempt["started_at"]))
        renewals[ref.attempt_id] = (lk.attempt["id"], lk.task["id"], to_db(expires))
        outcomes.append(RenewOutcome(attempt_id=ref.attempt_id, renewed=True,
                                     lease_expires_at=expires, cancel_requested=cancel))
    if renewals:
        table, values = values_table(["attempt_id", "task_id", "expires"], list(renewals.values()))
        await cur.execute(
            RENEW_ATTEMPTS.format(table=table),
            (*values, namespace_id),
        )
        expect_rows(cur, len(renewals), "renew attempts")
        await cur.execute(
            RENEW_TASKS.format(table=table),
            (*values, namespace_id),
        )
        expect_rows(cur, len(renewals), "renew tasks")
    await _insert_evidence(cur, evidence)
    return outcomes


# --- finish ----------------------------------------------------------------------------------

OUTCOMES = ("succeeded", "failed", "unknown", "cancelled")


@attrs.frozen(kw_only=True)
class FinishReport:
    """A worker's report that an attempt ended."""

    ref: AttemptRef
    report_id: bytes
    outcome: str  # one of OUTCOMES
    result: str | None = None  # JSON text, for succeeded
    error: dict[str, Any] | None = None  # for failed / unknown / cancelled
    retryable: bool = False  # failed only: explicit evidence that a retry is safe

    def digest(self) -> bytes:
        body = {"outcome": self.outcome, "result": self.result, "error": self.error,
                "retryable": self.retryable, "generation": self.ref.generation}
        return digests.domain_digest("orbit.finish.v1", self.ref.attempt_id,
                                     jsondoc.canonical(body))


@attrs.frozen(kw_only=True)
class FinishOutcome:
    attempt_id: bytes
    accepted: bool
    reason: str | None
    task_state: str | None
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"attempt_id": self.attempt_id.hex(), "accepted": self.accepted,
                "reason": self.reason, "task_state": self.task_state}


class ReportConflict(errors.Conflict):
    code = "report_conflict"
    title = "The report id was already used with a different report"


@attrs.frozen(kw_only=True)
class Decision:
    """What a finish (or a recovery) does to one task."""

    task_state: TaskState
    attempt_state: AttemptState
    outcome_reason: str
    available_at: dt.datetime | None = None
    effect_uncertain: bool = False


def decide_finish(report: FinishReport, task: dict[str, Any], now: dt.datetime) -> Decision:
    """The specification's safe-retry rules for a live attempt's report."""
    uncertain = bool(task["effect_uncertain"])
    cancel = task["cancel_requested_at"] is not None
    if report.outcome == "succeeded":
        return Decision(task_state=TaskState.SUCCEEDED, attempt_state=AttemptState.SUCCEEDED,
                        outcome_reason="succeeded")
    if report.outcome == "unknown":
        return Decision(task_state=TaskState.NEEDS_REVIEW, attempt_state=AttemptState.UNKNOWN,
                        outcome_reason="outcome_unknown", effect_uncertain=True)
    if report.outcome == "cancelled":
        if uncertain:
            return Decision(task_state=TaskState.NEEDS_REVIEW,
                            attempt_state=AttemptState.CANCELLED,
                            outcome_reason="cancelled_with_uncertain_effect",
                            effect_uncertain=True)
        return Decision(task_state=TaskState.CANCELLED, attempt_state=AttemptState.CANCELLED,
                        outcome_reason="cancelled")
    # failed
    retry_at = _retry_at(task, now) if report.retryable and not cancel else None
    if retry_at is not None:
        return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.FAILED,
                        outcome_reason="retry_scheduled", available_at=retry_at,
                        effect_uncertain=uncertain)
    reason = ("cancel_requested" if cancel and report.retryable
              else "attempts_exhausted" if report.retryable else "non_retryable")
    if uncertain:
        return Decision(task_state=TaskState.NEEDS_REVIEW, attempt_state=AttemptState.FAILED,
                        outcome_reason=f"{reason}_with_uncertain_effect", effect_uncertain=True)
    return Decision(task_state=TaskState.FAILED, attempt_state=AttemptState.FAILED,
                    outcome_reason=reason)


def _policy(task: dict[str, Any]) -> RetryPolicy:
    return RetryPolicy(max_attempts=task["max_attempts"], initial_ms=task["retry_initial_ms"],
                       max_ms=task["retry_max_ms"], multiplier=task["retry_multiplier"],
                       jitter=task["retry_jitter"])


def _retry_at(task: dict[str, Any], now: dt.datetime) -> dt.datetime | None:
    """When the next attempt may start, or None when the budget or the deadline is spent."""
    if task["attempts_used"] >= task["max_attempts"]:
        return None
    at = now + _ms(_policy(task).backoff_ms(task["attempts_used"]))
    if task["deadline_at"] is not None and at >= as_utc(task["deadline_at"]):
        return None
    return at


# Earlier receipts of a finish batch in one round trip: by report id (uq_receipts_report), and
# accepted ones by identical content under any report id (ix_receipts_operation).
EARLIER_RECEIPTS = """
SELECT 'report' AS found_by, attempt_id, report_id, request_digest, response
FROM pulse_attempt_receipts
WHERE namespace_id = %s AND (attempt_id, report_id) IN ({pairs})
UNION ALL
SELECT 'content', attempt_id, report_id, request_digest, response
FROM pulse_attempt_receipts
WHERE namespace_id = %s AND operation = 'finish' AND (attempt_id, request_digest) IN ({pairs})
  AND JSON_EXTRACT(response, '$.accepted') = true
"""
INSERT_RECEIPTS = (
    "INSERT INTO pulse_attempt_receipts (namespace_id, id, attempt_id, report_id, operation,"
    " request_digest, response, created_at)"
)
INSERT_EVIDENCE = (
    "INSERT INTO pulse_attempt_evidence (namespace_id, id, attempt_id, task_id, generation,"
    " kind, retryable, payload, rejected_because, received_at)"
)


def _evidence_row(  # noqa: PLR0917 - one evidence row's fields
    namespace_id: bytes, lk: Locked, kind: str, retryable: bool | None,
                  payload: dict[str, Any], reason: str) -> tuple[Any, ...]:
    return (namespace_id, ids.new_id(), lk.attempt["id"], lk.task["id"],
            lk.attempt["generation"], kind, retryable, jsondoc.dumps(payload), reason)


async def _insert_evidence(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    if rows:
        sql, params = multi_insert(
            INSERT_EVIDENCE, "(%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))", rows)
        await cur.execute(sql, params)


async def _replays(cur: Any, namespace_id: bytes,
                   reports: Sequence[FinishReport]) -> dict[int, FinishOutcome]:
    """Earlier receipts: by report id (a conflicting re-use raises), then by identical content
    under another report id (an already applied report returns its original receipt)."""
    found: dict[int, FinishOutcome] = {}
    marks = ", ".join(["(%s, %s)"] * len(reports))
    await cur.execute(EARLIER_RECEIPTS.format(pairs=marks), (
        namespace_id, *[v for r in reports for v in (r.ref.attempt_id, r.report_id)],
        namespace_id, *[v for r in reports for v in (r.ref.attempt_id, r.digest())]))
    by_report: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    by_digest: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    for row in await cur.fetchall():
        if row["found_by"] == "report":
            by_report[(row["attempt_id"], row["report_id"])] = row
        else:
            by_digest[(row["attempt_id"], row["request_digest"])] = row
    for index, report in enumerate(reports):
        row = by_report.get((report.ref.attempt_id, report.report_id))
        if row is None:
            continue
        if row["request_digest"] != report.digest():
            raise ReportConflict(f"report {report.report_id!r} of attempt "
                                 f"{report.ref.attempt_id.hex()} was used for another report")
        found[index] = _replayed(report, row["response"])
    for index, report in enumerate(reports):
        if index in found:
            continue
        row = by_digest.get((report.ref.attempt_id, report.digest()))
        if row is not None:
            found[index] = _replayed(report, row["response"])
    return found


def _replayed(report: FinishReport, response: str) -> FinishOutcome:
    doc = jsondoc.loads_strict(response)
    return FinishOutcome(attempt_id=report.ref.attempt_id, accepted=bool(doc["accepted"]),
                         reason=doc["reason"], task_state=doc["task_state"], replayed=True)


def _snapshot(  # noqa: PLR0917 - one snapshot's fields
    task: dict[str, Any], state: TaskState, revision: int, reason: str,
              result: str | None, error: dict[str, Any] | None,
              uncertain: bool) -> dict[str, Any]:
    return {
        "task_id": task["id"].hex(), "handler": task["handler"], "state": state.value,
        "revision": revision, "outcome_reason": reason, "attempts_used": task["attempts_used"],
        "effect_uncertain": uncertain,
        "result": jsondoc.loads_strict(result) if result is not None else None,
        "error": error,
    }


async def finish(  # noqa: PLR0912, PLR0915 - one pass over the batch; each branch is a rule
    cur: Any, namespace_id: bytes, reports: Sequence[FinishReport]
) -> list[FinishOutcome]:
    """Record finish reports, answered per item, in one transaction.

    Commits together: attempt results, task states, queue counter releases, state events, late
    evidence for stale reports, receipts, and result events for outcomes (result stream last).
    Locks: tasks, attempts (then the receipts are read), queue rows, the namespace's result
    stream.
    """
    _check_batch(reports)
    for report in reports:
        if report.outcome not in OUTCOMES:
            raise errors.ValidationFailed([{"path": "$.outcome",
                                            "message": f"one of {', '.join(OUTCOMES)}"}])
    if not reports:
        return []
    # Receipts are read under the attempts' locks: a concurrent finish of the same report (a
    # re-send on a new connection, or two frames of one socket) has committed its receipt by
    # the time this transaction holds the attempt, so it is answered from that receipt.
    locked = await _lock(cur, namespace_id, [r.ref.attempt_id for r in reports])
    replays = await _replays(cur, namespace_id, reports)
    pending, copies = _dedupe_batch([(i, r) for i, r in enumerate(reports) if i not in replays])
    now = await db_now(cur)
    outcomes: dict[int, FinishOutcome] = dict(replays)
    attempt_updates: list[tuple[Any, ...]] = []
    task_updates: list[tuple[Any, ...]] = []
    events: list[EventRecord] = []
    results: list[ResultEvent] = []
    evidence: list[tuple[Any, ...]] = []
    receipts: list[tuple[Any, ...]] = []
    usage = Usage()
    endings: dict[bytes, str] = {}
    done: set[bytes] = set()

    for index, report in pending:
        lk = locked.get(report.ref.attempt_id)
        if lk is None or not lk.matches(report.ref):
            outcomes[index] = FinishOutcome(attempt_id=report.ref.attempt_id, accepted=False,
                                            reason="invalid_attempt", task_state=None)
            continue
        reason = None
        if (
            report.ref.attempt_id in done
            or lk.attempt["state"] != AttemptState.RUNNING
            or not lk.is_live()
        ):
            reason = "attempt_finished"
        elif as_utc(lk.attempt["lease_expires_at"]) <= now:
            reason = "lease_expired"
        elif report.outcome == "cancelled" and lk.task["cancel_requested_at"] is None:
            reason = "cancel_not_requested"
        if reason is not None:
            outcome = FinishOutcome(attempt_id=report.ref.attempt_id, accepted=False,
                                    reason=reason, task_state=None)
            # An authentic but stale report: keep it as evidence for a human review.
            evidence.append(_evidence_row(
                namespace_id, lk, report.outcome.upper(),
                report.retryable if report.outcome == "failed" else None,
                {"result": jsondoc.loads_strict(report.result) if report.result else None,
                 "error": report.error}, reason))
            receipts.append(_receipt(namespace_id, report, outcome))
            outcomes[index] = outcome
            continue
        done.add(report.ref.attempt_id)
        task = lk.task
        decision = decide_finish(report, task, now)
        revision = task["revision"] + 1
        usage.active[lk.attempt["queue_id"]] -= 1
        if decision.task_state.terminal:
            usage.unfinished[lk.attempt["queue_id"]] -= 1
        if lk.attempt["concurrency_token"] is not None:
            endings[lk.attempt["id"]] = decision.attempt_state.value
        error_doc = report.error if report.outcome != "succeeded" else None
        attempt_updates.append((
            lk.attempt["id"], decision.attempt_state.value,
            1 if (report.outcome == "failed" and report.retryable) else
            (0 if report.outcome == "failed" else None),
            report.result if report.outcome == "succeeded" else None,
            jsondoc.dumps(error_doc) if error_doc is not None else None,
        ))
        terminal = decision.task_state.terminal
        task_updates.append((
            task["id"], task["revision"], lk.attempt["id"], decision.task_state.value,
            to_db(decision.available_at) if decision.available_at else None,
            1 if decision.effect_uncertain else 0, decision.outcome_reason,
            report.result if decision.task_state is TaskState.SUCCEEDED else None,
            jsondoc.dumps(error_doc) if error_doc is not None else None,
            1 if terminal else 0,
        ))
        event = task_event(namespace_id, task["id"], revision, "task." + decision.outcome_reason,
                       TaskState(task["state"]), decision.task_state,
                       {"attempt_id": lk.attempt["id"].hex(),
                        "generation": lk.attempt["generation"], "outcome": report.outcome})
        events.append(event)
        if terminal or decision.task_state is TaskState.NEEDS_REVIEW:
            results.append(ResultEvent(
                event_id=event.id, task_id=task["id"], queue_id=task["queue_id"],
                task_revision=revision, state=decision.task_state.value,
                snapshot=_snapshot(task, decision.task_state, revision, decision.outcome_reason,
                                   report.result if report.outcome == "succeeded" else None,
                                   error_doc, decision.effect_uncertain)))
        outcome = FinishOutcome(attempt_id=report.ref.attempt_id, accepted=True, reason=None,
                                task_state=decision.task_state.value)
        receipts.append(_receipt(namespace_id, report, outcome))
        outcomes[index] = outcome

    if attempt_updates:
        await _apply_attempt_endings(cur, namespace_id, attempt_updates, now)
        await _apply_task_endings(cur, namespace_id, task_updates, now)
        await append_events(cur, events)
    await _insert_evidence(cur, evidence)
    if receipts:
        sql, params = multi_insert(INSERT_RECEIPTS,
                                   "(%s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))", receipts)
        await cur.execute(sql, params)
    # The shared rows last (new rows above take no locks others wait for): queue and
    # application counters, concurrency keys, then the result stream.
    if attempt_updates:
        await resources.apply(cur, namespace_id, usage, between=lambda: resources.release(
            cur, namespace_id, endings, now))
    await append_results(cur, namespace_id, results)
    for index, original in copies.items():
        outcomes[index] = attrs.evolve(outcomes[original], replayed=True)
    return [outcomes[i] for i in range(len(reports))]


def _dedupe_batch(
    pending: list[tuple[int, FinishReport]],
) -> tuple[list[tuple[int, FinishReport]], dict[int, int]]:
    """Copies of a report inside one batch (a worker re-sent it before the first answer).

    A copy -- the same report id and content, or the same content under another report id --
    is answered like its first occurrence and gets no receipt of its own; one report id with
    two contents is a ReportConflict, as it is across batches.
    """
    unique: list[tuple[int, FinishReport]] = []
    copies: dict[int, int] = {}
    by_id: dict[tuple[bytes, bytes], tuple[int, bytes]] = {}
    by_content: dict[tuple[bytes, bytes], int] = {}
    for index, report in pending:
        digest = report.digest()
        id_key = (report.ref.attempt_id, report.report_id)
        if id_key in by_id:
            first, first_digest = by_id[id_key]
            if first_digest != digest:
                raise ReportConflict(f"report {report.report_id!r} appears twice in one batch "
                                     "with different contents")
            copies[index] = first
            continue
        content_key = (report.ref.attempt_id, digest)
        if content_key in by_content:
            copies[index] = by_content[content_key]
            continue
        by_id[id_key] = (index, digest)
        by_content[content_key] = index
        unique.append((index, report))
    return unique, copies


def _receipt(namespace_id: bytes, report: FinishReport,
             outcome: FinishOutcome) -> tuple[Any, ...]:
    return (namespace_id, ids.new_id(), report.ref.attempt_id, report.report_id, "finish",
            report.digest(), jsondoc.dumps(outcome.to_json()))


async def _apply_attempt_endings(cur: Any, namespace_id: bytes, rows: list[tuple[Any, ...]],
                                 now: dt.datetime) -> None:
    table, values = values_table(["attempt_id", "state", "retryable", "result", "error"], rows)
    await cur.execute(
        END_ATTEMPTS.format(table=table),
        (*values, namespace_id, to_db(now)),
    )
    expect_rows(cur, len(rows), "end attempts")


async def _apply_task_endings(cur: Any, namespace_id: bytes, rows: list[tuple[Any, ...]],
                              now: dt.datetime) -> None:
    """One guarded UPDATE for every task outcome (WAITING with a new available_at, or an end)."""
    table, values = values_table(
        ["task_id", "revision", "attempt_id", "state", "available_at", "uncertain", "reason",
         "result", "error", "terminal"], rows)
    await cur.execute(
        END_TASKS.format(table=table),
        (*values, namespace_id, to_db(now)),
    )
    expect_rows(cur, len(rows), "end tasks")


# --- recovery --------------------------------------------------------------------------------

EXPIRED_LEASES = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state IN ('LEASED', 'RUNNING') AND lease_expires_at <= %s
ORDER BY lease_expires_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""


def decide_expiry(task: dict[str, Any], attempt_state: AttemptState,
                  now: dt.datetime) -> Decision:
    """What a lapsed lease means (database time): the specification's recovery rules."""
    uncertain = bool(task["effect_uncertain"])
    cancel = task["cancel_requested_at"] is not None
    if attempt_state is AttemptState.OFFERED:
        # Nothing ran: the offer simply lapsed.
        retry_at = None if cancel else _offer_retry_at(task, now)
        if retry_at is not None:
            return Decision(task_state=TaskState.WAITING,
                            attempt_state=AttemptState.OFFER_EXPIRED,
                            outcome_reason="offer_expired", available_at=retry_at,
                            effect_uncertain=uncertain)
        reason = "offer_expired_budget_spent"
        if uncertain:
            return Decision(task_state=TaskState.NEEDS_REVIEW,
                            attempt_state=AttemptState.OFFER_EXPIRED,
                            outcome_reason=reason + "_with_uncertain_effect",
                            effect_uncertain=True)
        return Decision(task_state=TaskState.FAILED, attempt_state=AttemptState.OFFER_EXPIRED,
                        outcome_reason=reason)
    # RUNNING: the holder went silent. Its effect is unknown from here on.
    retry_at = _retry_at(task, now) if task["rerun_safe"] and not cancel else None
    if retry_at is not None:
        return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.LEASE_EXPIRED,
                        outcome_reason="lease_lost_retry", available_at=retry_at,
                        effect_uncertain=True)
    return Decision(task_state=TaskState.NEEDS_REVIEW, attempt_state=AttemptState.LEASE_EXPIRED,
                    outcome_reason="lease_lost", effect_uncertain=True)


def _offer_retry_at(task: dict[str, Any], now: dt.datetime) -> dt.datetime | None:
    if task["attempts_used"] >= task["max_attempts"]:
        return None
    if task["deadline_at"] is not None and now >= as_utc(task["deadline_at"]):
        return None
    return now


async def recover_expired(cur: Any, limit: int = 128) -> int:
    """Resolve lapsed leases (safe with many replicas: SKIP LOCKED, guarded updates).

    Locks: lapsed tasks (SKIP LOCKED), their attempts, queue rows, result streams (last).
    Returns the number of tasks handled.
    """
    now = await db_now(cur)
    await cur.execute(EXPIRED_LEASES, (to_db(now), limit))
    found = await cur.fetchall()
    by_namespace: dict[bytes, list[bytes]] = {}
    for row in found:
        by_namespace.setdefault(row["namespace_id"], []).append(row["id"])
    handled = 0
    for namespace_id, task_ids in sorted(by_namespace.items()):
        handled += await _recover_namespace(cur, namespace_id, sorted(task_ids), now)
    return handled


async def _recover_namespace(cur: Any, namespace_id: bytes, task_ids: list[bytes],
                             now: dt.datetime) -> int:
    await cur.execute(
        f"SELECT {TASK_COLUMNS} FROM pulse_tasks WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(task_ids))}) ORDER BY id FOR UPDATE",
        (namespace_id, *task_ids),
    )
    tasks = [row for row in await cur.fetchall()
             if row["state"] in ("LEASED", "RUNNING") and as_utc(row["lease_expires_at"]) <= now]
    if not tasks:
        return 0
    attempt_ids = sorted(t["current_attempt_id"] for t in tasks)
    await cur.execute(LOCK_ATTEMPTS.format(placeholders(len(attempt_ids))),
                      (namespace_id, *attempt_ids))
    attempts = {row["id"]: row for row in await cur.fetchall()}
    attempt_updates, task_updates, events, results = [], [], [], []
    usage = Usage()
    endings: dict[bytes, str] = {}
    for task in tasks:
        attempt = attempts[task["current_attempt_id"]]
        decision = decide_expiry(task, AttemptState(attempt["state"]), now)
        revision = task["revision"] + 1
        usage.active[attempt["queue_id"]] -= 1
        if attempt["state"] == AttemptState.OFFERED:
            usage.reserved -= 1
        if decision.task_state.terminal:
            usage.unfinished[attempt["queue_id"]] -= 1
        if attempt["concurrency_token"] is not None:
            endings[attempt["id"]] = decision.attempt_state.value
        error = {"type": decision.outcome_reason,
                 "message": "the lease lapsed before the worker reported"}
        attempt_updates.append((attempt["id"], decision.attempt_state.value, None, None,
                                jsondoc.dumps(error)))
        terminal = decision.task_state.terminal
        task_updates.append((
            task["id"], task["revision"], attempt["id"], decision.task_state.value,
            to_db(decision.available_at) if decision.available_at else None,
            1 if decision.effect_uncertain else 0, decision.outcome_reason, None,
            jsondoc.dumps(error), 1 if terminal else 0,
        ))
        event = task_event(namespace_id, task["id"], revision, "task." + decision.outcome_reason,
                       TaskState(task["state"]), decision.task_state,
                       {"attempt_id": attempt["id"].hex(), "generation": attempt["generation"]})
        events.append(event)
        if terminal or decision.task_state is TaskState.NEEDS_REVIEW:
            results.append(ResultEvent(
                event_id=event.id, task_id=task["id"], queue_id=task["queue_id"],
                task_revision=revision, state=decision.task_state.value,
                snapshot=_snapshot(task, decision.task_state, revision, decision.outcome_reason,
                                   None, error, decision.effect_uncertain)))
    await _apply_attempt_endings(cur, namespace_id, attempt_updates, now)
    # The guard re-checks revision and, through the attempt id, that no finish or renewal
    # slipped in; lease expiry was re-checked above under the row lock.
    await _apply_task_endings(cur, namespace_id, task_updates, now)
    await append_events(cur, events)
    await resources.apply(cur, namespace_id, usage, between=lambda: resources.release(
        cur, namespace_id, endings, now))
    await append_results(cur, namespace_id, results)
    return len(tasks)


WAITING_PAST_DEADLINE = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state = 'WAITING' AND deadline_at <= %s
ORDER BY deadline_at LIMIT %s FOR UPDATE SKIP LOCKED
"""
WAITING_PAST_START_DEADLINE = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state = 'WAITING' AND start_deadline_at <= %s AND first_started_at IS NULL
ORDER BY start_deadline_at LIMIT %s FOR UPDATE SKIP LOCKED
"""


async def expire_waiting(cur: Any, limit: int = 128) -> int:
    """WAITING tasks past their total or schedule-to-start deadline: FAILED (NEEDS_REVIEW when
    an earlier attempt's effect is uncertain). Safe with many replicas."""
    now = await db_now(cur)
    handled = 0
    for sql, reason in ((WAITING_PAST_DEADLINE, "deadline_exceeded"),
                        (WAITING_PAST_START_DEADLINE, "start_deadline_exceeded")):
        await cur.execute(sql, (to_db(now), limit))
        rows = await cur.fetchall()
        by_namespace: dict[bytes, list[bytes]] = {}
        for row in rows:
            by_namespace.setdefault(row["namespace_id"], []).append(row["id"])
        for namespace_id, task_ids in sorted(by_namespace.items()):
            handled += await _fail_waiting(cur, namespace_id, sorted(task_ids), reason, now)
    return handled


async def _fail_waiting(cur: Any, namespace_id: bytes, task_ids: list[bytes], reason: str,
                        now: dt.datetime) -> int:
    await cur.execute(
        f"SELECT {TASK_COLUMNS} FROM pulse_tasks WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(task_ids))}) AND state = 'WAITING' ORDER BY id",
        (namespace_id, *task_ids),
    )
    tasks = await cur.fetchall()
    events, results = [], []
    usage = Usage()
    for task in tasks:
        uncertain = bool(task["effect_uncertain"])
        if not uncertain:
            usage.unfinished[task["queue_id"]] -= 1
        state = TaskState.NEEDS_REVIEW if uncertain else TaskState.FAILED
        why = reason + ("_with_uncertain_effect" if uncertain else "")
        error = {"type": reason, "message": "the deadline passed before the task could run"}
        await cur.execute(
            "UPDATE pulse_tasks SET state = %s, revision = revision + 1, outcome_reason = %s,"
            " error = %s, completed_at = %s, updated_at = UTC_TIMESTAMP(6)"
            " WHERE namespace_id = %s AND id = %s AND state = 'WAITING' AND revision = %s",
            (state.value, why, jsondoc.dumps(error), None if uncertain else to_db(now),
             namespace_id, task["id"], task["revision"]),
        )
        expect_rows(cur, 1, "deadline")
        event = task_event(namespace_id, task["id"], task["revision"] + 1, "task." + why,
                       TaskState.WAITING, state, {})
        events.append(event)
        results.append(ResultEvent(
            event_id=event.id, task_id=task["id"], queue_id=task["queue_id"],
            task_revision=task["revision"] + 1, state=state.value,
            snapshot=_snapshot(task, state, task["revision"] + 1, why, None, error, uncertain)))
    await resources.apply(cur, namespace_id, usage)
    await append_events(cur, events)
    await append_results(cur, namespace_id, results)
    return len(tasks)

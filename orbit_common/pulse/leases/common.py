"""What every part of the lease protocol shares: grant identities, the row locks, the gates.

Identities (specification 000 §3, 001 §5)
    A *grant* is one attempt row: ``(attempt id, generation, secret token)``. The generation is the
    task's ``attempts_used`` after the grant (unique and increasing per task: it advances on every
    offer, fencing older holders); only the SHA-256 of the token is stored. The *execution
    identity* adds the worker session: the attempt records the session that currently holds it
    (``worker_session_id``), and start, renew and finish verify that the caller's session is
    ACTIVE, alive and of the attempt's worker instance. A new session of the same instance (a
    reconnecting worker) adopts the attempt on its next start or renew; a session of another
    instance cannot touch it; a fenced session's report is kept as late evidence. The session's
    credential is part of it too: an instance belongs to one credential (``workers.py``), and a
    session whose credential was revoked or whose application was disabled may not start, renew
    or finish anything (:func:`lock_for` raises ``invalid_credential``; nothing is recorded).

Locks
    Every transaction of the protocol follows the one lock order of ``docs/architecture.md``
    ("锁顺序"): session (shared, or exclusive in a claim) → gates (shared) → tasks → attempts →
    queue rows → concurrency keys and permits → application row → result stream.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.model import digests, ids, jsondoc
from orbit_common.platform.events import EventRecord
from orbit_common.pulse import control
from orbit_common.pulse.model import RetryPolicy, TaskState

MAX_BATCH = 256
TOKEN_DOMAIN = "orbit.lease-token.v1"  # noqa: S105 - a digest domain tag, not a secret


def token_digest(token: str) -> bytes:
    return digests.domain_digest(TOKEN_DOMAIN, token.encode("utf-8"))


def ms(value: int) -> dt.timedelta:
    return dt.timedelta(milliseconds=value)


class BatchTooLarge(errors.BadRequest):
    code = "batch_too_large"
    title = "Too many items in one batch"


def check_batch(items: Sequence[Any]) -> None:
    if len(items) > MAX_BATCH:
        raise BatchTooLarge(f"at most {MAX_BATCH} items per batch")


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


TASK_COLUMNS = (
    "id, queue_id, handler, state, revision, attempts_used, starts_used, offer_lapses,"
    " max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter,"
    " execution_lease_ms, attempt_timeout_ms, deadline_at, start_deadline_at, rerun_safe,"
    " current_attempt_id, lease_expires_at, cancel_requested_at, effect_uncertain,"
    " first_started_at, workflow_gate_id, owner_kind, owner_id"
)
ATTEMPT_COLUMNS = (
    "id, task_id, queue_id, generation, token_digest, concurrency_token, worker_instance_id,"
    " worker_session_id, state, started_at, lease_expires_at"
)
# The caller session's liveness, and its credential's (the credential and its application
# ACTIVE): uncorrelated subqueries by primary key, NULL when the session does not exist.
ATTEMPT_TASKS_AND_SESSION = (
    "SELECT a.id, a.task_id, (SELECT s.state = 'ACTIVE' AND s.expires_at > UTC_TIMESTAMP(6)"
    " FROM pulse_worker_sessions s WHERE s.namespace_id = %s AND s.id = %s) AS session_live,"
    " (SELECT c.state = 'ACTIVE' AND p.state = 'ACTIVE' FROM pulse_worker_sessions s"
    "  JOIN orbit_credentials c ON c.id = s.credential_id"
    "  JOIN orbit_applications p ON p.id = c.application_id"
    "  WHERE s.namespace_id = %s AND s.id = %s) AS credential_active"
    " FROM pulse_attempts a WHERE a.namespace_id = %s AND a.id IN ({})"
)
LOCK_TASKS = (
    f"SELECT {TASK_COLUMNS} FROM pulse_tasks WHERE namespace_id = %s AND id IN ({{}})"
    " ORDER BY id FOR UPDATE"
)
LOCK_ATTEMPTS = (
    f"SELECT {ATTEMPT_COLUMNS} FROM pulse_attempts WHERE namespace_id = %s AND id IN ({{}})"
    " ORDER BY id FOR UPDATE"
)


async def lock_for(cur: Any, session: SessionIdentity,
                   attempt_ids: Sequence[bytes]) -> tuple[dict[bytes, Locked], bool]:
    """Lock the named attempts' tasks, then the attempts (the lock order); and whether the
    caller's ``session`` is ACTIVE and alive, read by the same first statement (a plain read:
    a fence that commits after it is caught by the task rows -- fence-all expires the leases
    under their locks -- and a reconnect's fence leaves the same instance, which may act).

    The same statement re-reads the session's credential: when it was revoked or its
    application disabled, :class:`errors.InvalidCredential` (401) and the transaction changes
    nothing -- no start, renewal, result, receipt or evidence is taken from a revoked key."""
    namespace_id = session.namespace_id
    if not attempt_ids:
        return {}, False
    unique = sorted(set(attempt_ids))
    await cur.execute(ATTEMPT_TASKS_AND_SESSION.format(placeholders(len(unique))),
                      (namespace_id, session.id, namespace_id, session.id, namespace_id,
                       *unique))
    rows = list(await cur.fetchall())
    if rows and rows[0]["credential_active"] is not None and not rows[0]["credential_active"]:
        raise errors.InvalidCredential("the session's credential was revoked or its"
                                       " application disabled")
    live = bool(rows) and bool(rows[0]["session_live"])
    return await _lock_found(cur, namespace_id, {row["id"]: row["task_id"] for row in rows}), live


async def _lock_found(cur: Any, namespace_id: bytes,
                      task_of: dict[bytes, bytes]) -> dict[bytes, Locked]:
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


async def lock_tasks(cur: Any, namespace_id: bytes, task_ids: Sequence[bytes],
                     *, states: Iterable[str] | None = None,
                     skip_locked: bool = False) -> list[dict[str, Any]]:
    """Lock tasks by id (FOR UPDATE, in id order), optionally only those in ``states``; with
    ``skip_locked`` a task another transaction holds is left out (scans)."""
    if not task_ids:
        return []
    ordered = sorted(set(task_ids))
    sql = LOCK_TASKS.format(placeholders(len(ordered)))
    if skip_locked:
        sql += " SKIP LOCKED"
    await cur.execute(sql, (namespace_id, *ordered))
    rows = list(await cur.fetchall())
    if states is not None:
        wanted = set(states)
        rows = [r for r in rows if r["state"] in wanted]
    return rows


async def lock_attempts(cur: Any, namespace_id: bytes,
                        attempt_ids: Sequence[bytes]) -> dict[bytes, dict[str, Any]]:
    """Lock attempts by id (after their tasks: the lock order)."""
    if not attempt_ids:
        return {}
    ordered = sorted(set(attempt_ids))
    await cur.execute(LOCK_ATTEMPTS.format(placeholders(len(ordered))), (namespace_id, *ordered))
    return {row["id"]: row for row in await cur.fetchall()}


# --- sessions: the execution identity ---------------------------------------------------------


class SessionIdentity(Protocol):
    """The caller of start, renew and finish: a worker session (``workers.Session`` is one)."""

    @property
    def namespace_id(self) -> bytes: ...
    @property
    def id(self) -> bytes: ...
    @property
    def instance_id(self) -> bytes: ...


@attrs.frozen(kw_only=True)
class SessionRef:
    """A session identity by value (tools and tests that act as a known session)."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes


def identity_refusal(lk: Locked, session: SessionIdentity, live: bool) -> str | None:
    """Why ``session`` may not act on the attempt, or None (001 §5: the execution entry
    verifies process, session, generation, task and attempt)."""
    if lk.attempt["worker_instance_id"] != session.instance_id:
        return "session_mismatch"
    if not live:
        return "session_fenced"
    return None


# --- gates ------------------------------------------------------------------------------------


async def gate_states(cur: Any, namespace_id: bytes, gate_ids: Iterable[bytes]) -> dict[bytes, str]:
    """The named execution gates' states, read with a shared lock (a pause or resume waits for
    this transaction, and this transaction sees any pause committed before it)."""
    ordered = sorted(set(gate_ids))
    if not ordered:
        return {}
    await cur.execute(
        f"SELECT id, state FROM pulse_execution_gates WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(ordered))}) ORDER BY id LOCK IN SHARE MODE",
        (namespace_id, *ordered),
    )
    found = {row["id"]: row["state"] for row in await cur.fetchall()}
    return {gate_id: found.get(gate_id, "PAUSED") for gate_id in ordered}


GATES_AND_DISPATCH = (
    "SELECT g.id, g.state, c.dispatch_state FROM pulse_execution_gates g"
    " JOIN orbit_platform_controls c ON c.scope = %s"
    " WHERE g.namespace_id = %s AND g.id IN ({}) ORDER BY g.id LOCK IN SHARE MODE"
)


async def gates_and_dispatch(cur: Any, namespace_id: bytes,
                             gate_ids: Iterable[bytes]) -> tuple[dict[bytes, str], bool]:
    """The named gates' states and whether the platform's dispatch is frozen, in one read
    with shared locks on the gates and the platform control row: a pause, a resume or a
    freeze waits for this transaction, and this transaction sees any committed before it."""
    ordered = sorted(set(gate_ids))
    if not ordered:
        return {}, await control.dispatch_frozen(cur)
    await cur.execute(GATES_AND_DISPATCH.format(placeholders(len(ordered))),
                      (control.SCOPE, namespace_id, *ordered))
    rows = list(await cur.fetchall())
    if not rows:  # no gate found (or no control row): the control row answers alone
        return dict.fromkeys(ordered, "PAUSED"), await control.dispatch_frozen(cur)
    found = {row["id"]: row["state"] for row in rows}
    frozen = rows[0]["dispatch_state"] == control.DispatchState.FROZEN
    return {gate_id: found.get(gate_id, "PAUSED") for gate_id in ordered}, frozen


# --- retry budget -----------------------------------------------------------------------------


def policy(task: dict[str, Any]) -> RetryPolicy:
    return RetryPolicy(max_attempts=task["max_attempts"], initial_ms=task["retry_initial_ms"],
                       max_ms=task["retry_max_ms"], multiplier=task["retry_multiplier"],
                       jitter=task["retry_jitter"])


# --- late evidence ----------------------------------------------------------------------------

INSERT_EVIDENCE = (
    "INSERT INTO pulse_attempt_evidence (namespace_id, id, attempt_id, task_id, generation,"
    " kind, retryable, payload, rejected_because, received_at)"
)


def evidence_row(  # noqa: PLR0917 - one evidence row's fields
    namespace_id: bytes, lk: Locked, kind: str, retryable: bool | None,
        payload: dict[str, Any], reason: str) -> tuple[Any, ...]:
    return (namespace_id, ids.new_id(), lk.attempt["id"], lk.task["id"],
            lk.attempt["generation"], kind, retryable, jsondoc.dumps(payload), reason)


async def insert_evidence(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    if rows:
        sql, params = multi_insert(
            INSERT_EVIDENCE, "(%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))", rows)
        await cur.execute(sql, params)

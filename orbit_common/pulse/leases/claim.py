"""Claim: step 1 of the two-step dispatch (specification 000 §3, §5 "领取").

    WAITING --claim--> LEASED [attempt OFFERED, offer lease]

A claim grants due WAITING tasks of one queue to one worker session: per task a new attempt
row (the next generation, a secret token of which only the SHA-256 is stored), the task LEASED
with a short offer lease, a ``task.leased`` event, and the counters (queue active attempts,
the application's reserved count, a concurrency key's permit and fencing token). Nothing runs
until the worker's start is approved (:mod:`start`).

Rules
    * Only tasks whose gates are OPEN: the queue's gate (read with a shared lock before the task
      scan) and, for a task a workflow owns, its workflow's gate (shared lock after the scan):
      a pause racing a claim either commits first (the claim sees it) or waits for the claim.
    * Only tasks with budget left (``starts_used < max_attempts``: the budget counts approved
      starts) and before their deadlines.
    * At most the session's ``max_in_flight`` live attempts (OFFERED or RUNNING) per session:
      the claim locks the session row, so two claims of one session count against each other.
    * The queue's, the application's and the concurrency keys' limits (``resources.grantable``).
    * Nothing while the platform's dispatch is frozen (``control.dispatch_frozen``: after a
      restore, docs/runbooks/restore.md).

Locks (the lock order of docs/architecture.md): the session row (exclusive), the queue's gate
and the platform control row (shared), due WAITING tasks (SKIP LOCKED, in claim order), their
workflow gates (shared), then -- only when something must be counted under a lock
(``resources.grantable``) -- the queue row, the concurrency keys' rows, the application's row;
the counters at the end.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections import Counter
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders, values_table
from orbit_common.db.clock import as_utc, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import authz, credentials
from orbit_common.platform.events import append_events
from orbit_common.pulse import resources
from orbit_common.pulse.leases.common import (
    MAX_BATCH,
    expect_rows,
    gate_states,
    gates_and_dispatch,
    ms,
    task_event,
    token_digest,
)
from orbit_common.pulse.model import TaskState
from orbit_common.pulse.resources import Usage
from orbit_common.pulse.workers import QueueRef, Session, SessionLost


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


# Batched per-row update (orbit_common/db/batch.values_table). The derived table of the batch
# drives the join (STRAIGHT_JOIN) and reaches each row by its full primary key: without it the
# optimizer may scan a whole namespace per batch on small or fresh tables.
# tests/schema/test_explain_leases.py pins these plans.
CLAIM_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.id"
    " SET t.state = 'LEASED', t.revision = t.revision + 1, t.attempts_used = v.generation,"
    "     t.current_attempt_id = v.attempt_id, t.lease_expires_at = v.expires,"
    "     t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.state = 'WAITING' AND t.revision = v.revision"
)

SESSION_FOR_CLAIM = """
SELECT expires_at > UTC_TIMESTAMP(6) AS alive FROM pulse_worker_sessions
WHERE namespace_id = %s AND id = %s AND state = 'ACTIVE' FOR UPDATE
"""
# The claim's clock is read with the count (a plain read after the session's lock): one round
# trip fewer. The gates' shared locks read after it wait only while a pause commits, so a clock
# read before that wait can only shorten the offer and see fewer tasks due.
SESSION_LIVE_ATTEMPTS = """
SELECT COUNT(*) AS n, UTC_TIMESTAMP(6) AS now FROM pulse_attempts
WHERE namespace_id = %s AND worker_session_id = %s AND state IN ('OFFERED', 'RUNNING')
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
       t.concurrency_key, t.concurrency_key_digest, t.workflow_gate_id
FROM pulse_tasks t
WHERE t.namespace_id = %s AND t.queue_id = %s AND t.state = 'WAITING'
  AND t.dispatch_at <= %s AND t.available_at <= %s
  AND (t.deadline_at IS NULL OR t.deadline_at > %s)
  AND (t.start_deadline_at IS NULL OR t.first_started_at IS NOT NULL OR t.start_deadline_at > %s)
  AND t.starts_used < t.max_attempts
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


async def _session_room(cur: Any, session: Session) -> tuple[int, dt.datetime]:
    """Lock the session (it must be ACTIVE and alive) and count the room its ``max_in_flight``
    leaves next to its live attempts; with the database's clock."""
    await cur.execute(SESSION_FOR_CLAIM, (session.namespace_id, session.id))
    row = await cur.fetchone()
    if row is None or not row["alive"]:
        raise SessionLost()
    await cur.execute(SESSION_LIVE_ATTEMPTS, (session.namespace_id, session.id))
    found = await cur.fetchone()
    return max(0, session.max_in_flight - int(found["n"])), as_utc(found["now"])


async def _session_may_work(cur: Any, session: Session, queue: QueueRef) -> None:
    grants = await credentials.active_grants(cur, session.credential_id,
                                             namespace_id=session.namespace_id)
    if not authz.allowed(grants, authz.Action.WORKERS_WORK.value, session.namespace, queue.name):
        raise errors.Forbidden("the session's credential may no longer work this queue")


async def _open_workflow_gates(cur: Any, namespace_id: bytes,
                               rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop candidates whose workflow's gate is not OPEN (gates read with a shared lock)."""
    gated = {r["workflow_gate_id"] for r in rows if r["workflow_gate_id"] is not None}
    if not gated:
        return rows
    states = await gate_states(cur, namespace_id, gated)
    return [r for r in rows
            if r["workflow_gate_id"] is None or states[r["workflow_gate_id"]] == "OPEN"]


async def claim(cur: Any, session: Session, queue: QueueRef, limit: int) -> list[Grant]:
    """Grant up to ``limit`` due tasks of ``queue`` to ``session`` (the module docstring).

    Returns nothing when a gate is paused. A keyed grant carries the key's new fencing token,
    recorded on the attempt and its permit row. Run it with :func:`run_claim`, which re-runs the
    rare claim that raced a new concurrency limit.
    """
    limit = max(0, min(limit, MAX_BATCH))
    if limit == 0:
        return []
    room, now = await _session_room(cur, session)
    limit = min(limit, room)
    if limit == 0:
        return []
    await _session_may_work(cur, session, queue)
    gates, frozen = await gates_and_dispatch(cur, session.namespace_id, [queue.gate_id])
    if gates[queue.gate_id] != "OPEN" or frozen:
        return []
    when = to_db(now)
    await cur.execute(
        _claim_sql(len(session.handlers), session.concurrency_keys),
        (session.namespace_id, queue.id, when, when, when, when, *session.handlers, limit),
    )
    rows = await _open_workflow_gates(cur, session.namespace_id, list(await cur.fetchall()))
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
        expires = now + ms(row["offer_lease_ms"])
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
             "session_id": session.id.hex(),
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
    await cur.execute(CLAIM_TASKS.format(table=table), (*values, session.namespace_id))
    expect_rows(cur, len(task_updates), "claim")
    await resources.record_permits(cur, session.namespace_id, permits)
    await append_events(cur, events)
    # The counters last. Unless _grantable locked the queue row, the update checks that no
    # max_concurrent_attempts appeared since the plain read (resources.ConcurrencyLimitRaced:
    # the caller re-runs the claim, see run_claim).
    await resources.apply(cur, session.namespace_id,
                          Usage(active=Counter({queue.id: len(grants)}), reserved=len(grants)),
                          cap_active=not locked)
    return grants


# A superset of every claim's filter on the claim index (ix_tasks_claim): nothing here means
# no claim of this queue would grant anything now.
ANY_DUE = """
SELECT 1 AS due FROM pulse_tasks
WHERE namespace_id = %s AND queue_id = %s AND state = 'WAITING'
  AND dispatch_at <= UTC_TIMESTAMP(6) AND available_at <= UTC_TIMESTAMP(6)
LIMIT 1
"""


async def any_due(cur: Any, namespace_id: bytes, queue_id: bytes) -> bool:
    """Whether ``queue`` has a WAITING task due now: a plain read (no lock, one statement),
    the cheap check before a claim of a queue that was empty a moment ago. Only a hint: a
    task committed just after it is found by the next claim."""
    await cur.execute(ANY_DUE, (namespace_id, queue_id))
    return await cur.fetchone() is not None


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

"""Recovery: lapsed leases and passed deadlines (specification 000 §3 "租约恢复", §2).

    LEASED --offer lapsed--> WAITING | FAILED (offer_lapses_exhausted, a deadline) | CANCELLED
    RUNNING --lease lost--> WAITING (re-run-safe, budget left) | NEEDS_REVIEW
    WAITING --deadline--> FAILED | NEEDS_REVIEW (an earlier attempt's effect is uncertain)

Database time decides. Safe with any number of dispatcher replicas: candidates are taken with
``SKIP LOCKED``, re-checked under the row lock, and written through the ending writer, whose
guards re-check revision, state and the live attempt. Decisions: :func:`decisions.decide_expiry`
and :func:`decisions.decide_waiting_deadline`.

Locks: lapsed tasks (found by a plain read, then locked by primary key with SKIP LOCKED and
re-checked), their attempts, then the ending writer's queue
rows, keys, application row and result stream.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.pulse.leases import decisions, endings
from orbit_common.pulse.leases.common import lock_attempts, lock_tasks
from orbit_common.pulse.model import AttemptState

# Candidates are read without a lock, then locked by primary key with SKIP LOCKED: a locking
# scan of the secondary index would also hold index entries it skipped, which deadlocked with
# starts and claims (InnoDB's deadlock report, the lock-order load test).
EXPIRED_LEASES = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state IN ('LEASED', 'RUNNING') AND lease_expires_at <= %s
ORDER BY lease_expires_at
LIMIT %s
"""
WAITING_PAST_DEADLINE = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state = 'WAITING' AND deadline_at <= %s
ORDER BY deadline_at LIMIT %s
"""
WAITING_PAST_START_DEADLINE = """
SELECT namespace_id, id FROM pulse_tasks
WHERE state = 'WAITING' AND start_deadline_at <= %s AND first_started_at IS NULL
ORDER BY start_deadline_at LIMIT %s
"""


def _by_namespace(rows: list[dict[str, Any]]) -> list[tuple[bytes, list[bytes]]]:
    grouped: dict[bytes, list[bytes]] = {}
    for row in rows:
        grouped.setdefault(row["namespace_id"], []).append(row["id"])
    return sorted(grouped.items())


async def recover_expired(cur: Any, limit: int = 128,
                          max_offer_lapses: int = decisions.DEFAULT_MAX_OFFER_LAPSES) -> int:
    """Resolve lapsed leases; returns the number of tasks handled."""
    now = await db_now(cur)
    await cur.execute(EXPIRED_LEASES, (to_db(now), limit))
    handled = 0
    for namespace_id, task_ids in _by_namespace(list(await cur.fetchall())):
        tasks = [t for t in await lock_tasks(cur, namespace_id, task_ids,
                                             states=("LEASED", "RUNNING"), skip_locked=True)
                 if as_utc(t["lease_expires_at"]) <= now]
        if not tasks:
            continue
        attempts = await lock_attempts(cur, namespace_id,
                                       [t["current_attempt_id"] for t in tasks])
        ends = []
        for task in tasks:
            attempt = attempts[task["current_attempt_id"]]
            decision = decisions.decide_expiry(task, AttemptState(attempt["state"]), now,
                                               max_offer_lapses)
            ends.append(endings.Ending(
                task=task, attempt=attempt, decision=decision,
                payload={"attempt_id": attempt["id"].hex(), "generation": attempt["generation"]},
                error={"type": decision.outcome_reason,
                       "message": "the lease lapsed before the worker reported"}))
        await endings.write(cur, namespace_id, ends, now)
        handled += len(ends)
    return handled


async def expire_waiting(cur: Any, limit: int = 128) -> int:
    """WAITING tasks past their total or schedule-to-start deadline: FAILED (NEEDS_REVIEW when
    an earlier attempt's effect is uncertain). Returns the number of tasks handled."""
    now = await db_now(cur)
    handled = 0
    for sql, reason in ((WAITING_PAST_DEADLINE, "deadline_exceeded"),
                        (WAITING_PAST_START_DEADLINE, "start_deadline_exceeded")):
        await cur.execute(sql, (to_db(now), limit))
        for namespace_id, task_ids in _by_namespace(list(await cur.fetchall())):
            handled += await _end_waiting(cur, namespace_id, task_ids, reason, now)
    return handled


def _past(task: dict[str, Any], reason: str, now: dt.datetime) -> bool:
    """Re-checked under the row lock: the deadline really passed (a retry or an edit between
    the unlocked read and the lock cannot end a task early)."""
    if reason == "deadline_exceeded":
        return task["deadline_at"] is not None and as_utc(task["deadline_at"]) <= now
    return (task["start_deadline_at"] is not None and task["first_started_at"] is None
            and as_utc(task["start_deadline_at"]) <= now)


async def _end_waiting(cur: Any, namespace_id: bytes, task_ids: list[bytes], reason: str,
                       now: dt.datetime) -> int:
    tasks = [t for t in await lock_tasks(cur, namespace_id, task_ids, states=("WAITING",),
                                         skip_locked=True)
             if _past(t, reason, now)]
    await endings.write(cur, namespace_id, [
        endings.Ending(task=task, attempt=None,
                       decision=decisions.decide_waiting_deadline(task, reason),
                       error={"type": reason,
                              "message": "the deadline passed before the task could run"})
        for task in tasks], now)
    return len(tasks)

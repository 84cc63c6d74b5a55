"""Applying a task result to the receiving application's database, effectively once.

Orbit delivers at least once: a lost 2xx, a receiver restart or a lease that lapsed mean the same
result event can arrive again, and results of one task can arrive out of order (a redelivery of
revision 3 after revision 5). :func:`apply` makes that harmless with one transaction:

1. insert the event into ``receiver_inbox`` -- its primary key is the event id, so a second
   copy of the event fails the insert (MySQL error 1062) and the transaction applies nothing;
2. move ``receiver_task_views`` forward -- insert the task's row, or update it only
   ``WHERE task_revision < <this revision>``: a late or duplicate result never rolls it back
   (the inbox row then records ``STALE``);
3. run the caller's business step (``on_applied``) on the same connection, only when the view
   moved;
4. commit. Only after the commit does the webhook receiver answer 2xx.

Any failure before the commit rolls everything back, inbox row included, so the next delivery
of the event applies it. Deadlocks and lock-wait timeouts (two results of one task at once)
re-run the whole transaction (:func:`apply_with_retry`).

The functions take a connection (aiomysql) and a :class:`TaskResult`; they do not care whether
the result came from a webhook (receiver.py) or a pull consumer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiomysql
import pymysql
from orbit_sdk import jsonvalue

DUPLICATE_KEY = 1062
RETRYABLE = frozenset({1213, 1205})  # deadlock, lock wait timeout: re-run the transaction
STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW"})

INSERT_INBOX = """
INSERT INTO receiver_inbox (event_id, delivery_id, subscription, namespace, task_id,
                            task_revision, state, outcome, received_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, 'APPLIED', UTC_TIMESTAMP(6))
"""
MARK_STALE = "UPDATE receiver_inbox SET outcome = 'STALE' WHERE event_id = %s"
INSERT_VIEW = """
INSERT INTO receiver_task_views (namespace, task_id, queue, handler, state, task_revision,
                                 outcome_reason, attempts_used, effect_uncertain, result,
                                 error, event_id, committed_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))
"""
# The guard is the point: only a higher revision moves the view.
ADVANCE_VIEW = """
UPDATE receiver_task_views
SET queue = %s, handler = %s, state = %s, task_revision = %s, outcome_reason = %s,
    attempts_used = %s, effect_uncertain = %s, result = %s, error = %s, event_id = %s,
    committed_at = %s, updated_at = UTC_TIMESTAMP(6)
WHERE namespace = %s AND task_id = %s AND task_revision < %s
"""


class BadDelivery(ValueError):
    """The (authentic) body is not a task.result delivery this receiver understands."""


class Applied(enum.StrEnum):
    APPLIED = "applied"  # the view moved to this revision
    STALE = "stale"  # recorded; the view already holds a newer revision
    DUPLICATE = "duplicate"  # this event was applied before: nothing changed


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """The parts of a ``task.result`` delivery the receiver stores."""

    event_id: str
    delivery_id: str
    subscription: str
    namespace: str
    task_id: str
    queue: str
    task_revision: int
    state: str
    committed_at: dt.datetime  # naive UTC, as DATETIME(6) stores it
    handler: str | None
    outcome_reason: str | None
    attempts_used: int | None
    effect_uncertain: bool
    result_json: str | None  # JSON text, numbers as Orbit sent them
    error_json: str | None

    @classmethod
    def from_delivery(cls, body: Mapping[str, Any]) -> TaskResult:
        """Read a delivery body (parsed with ``exact_numbers=True`` to keep result digits)."""
        try:
            snapshot = body["snapshot"]
            if not isinstance(snapshot, Mapping):
                raise BadDelivery("snapshot is not an object")
            state = _text(body, "state")
            if state not in STATES:
                raise BadDelivery(f"unknown result state {state!r}")
            revision = body["task_revision"]
            if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
                raise BadDelivery("task_revision is not a positive integer")
            committed = dt.datetime.fromisoformat(_text(body, "committed_at"))
            if committed.tzinfo is None:
                raise BadDelivery("committed_at has no time zone")
            attempts = snapshot.get("attempts_used")
            return cls(
                event_id=_text(body, "event_id"), delivery_id=_text(body, "id"),
                subscription=_text(body, "subscription"), namespace=_text(body, "namespace"),
                task_id=_text(body, "task_id"), queue=_text(body, "queue"),
                task_revision=revision, state=state,
                committed_at=committed.astimezone(dt.UTC).replace(tzinfo=None),
                handler=snapshot.get("handler"), outcome_reason=snapshot.get("outcome_reason"),
                attempts_used=attempts if isinstance(attempts, int) else None,
                effect_uncertain=bool(snapshot.get("effect_uncertain", False)),
                result_json=_json(snapshot.get("result")),
                error_json=_json(snapshot.get("error")))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BadDelivery):
                raise
            raise BadDelivery(f"not a task.result delivery: {exc!r}") from None


def _text(body: Mapping[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str) or not value:
        raise BadDelivery(f"{key} is not a non-empty string")
    return value


def _json(value: Any) -> str | None:
    return None if value is None else jsonvalue.dumps(value)


OnApplied = Callable[[aiomysql.Cursor, TaskResult], Awaitable[None]]


async def apply(conn: aiomysql.Connection, result: TaskResult, *,
                on_applied: OnApplied | None = None) -> Applied:
    """Apply ``result`` in one transaction on ``conn`` (see the module docstring)."""
    async with conn.cursor() as cur:
        # For the next transaction only (it must precede BEGIN): READ COMMITTED takes no gap
        # locks, so two first results of one task do not deadlock on an empty key range.
        await cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    await conn.begin()
    try:
        async with conn.cursor() as cur:
            try:
                await cur.execute(INSERT_INBOX, (
                    result.event_id, result.delivery_id, result.subscription, result.namespace,
                    result.task_id, result.task_revision, result.state))
            except pymysql.err.IntegrityError as exc:
                if exc.args[0] != DUPLICATE_KEY:
                    raise
                await conn.rollback()
                return Applied.DUPLICATE
            moved = await _advance_view(cur, result)
            if moved and on_applied is not None:
                await on_applied(cur, result)
            if not moved:
                await cur.execute(MARK_STALE, (result.event_id,))
        await conn.commit()
    except BaseException:
        await conn.rollback()
        raise
    return Applied.APPLIED if moved else Applied.STALE


async def _advance_view(cur: aiomysql.Cursor, r: TaskResult) -> bool:
    """Insert the task's view row, or move it forward to ``r``'s revision; False if newer."""
    columns = (r.queue, r.handler, r.state, r.task_revision, r.outcome_reason, r.attempts_used,
               r.effect_uncertain, r.result_json, r.error_json, r.event_id, r.committed_at)
    try:
        await cur.execute(INSERT_VIEW, (r.namespace, r.task_id, *columns))
        return True
    except pymysql.err.IntegrityError as exc:
        if exc.args[0] != DUPLICATE_KEY:
            raise
    await cur.execute(ADVANCE_VIEW, (*columns, r.namespace, r.task_id, r.task_revision))
    return bool(cur.rowcount)


async def apply_with_retry(pool: aiomysql.Pool, result: TaskResult, *,
                           on_applied: OnApplied | None = None, attempts: int = 5) -> Applied:
    """:func:`apply` on a pooled connection, re-run on deadlock or lock-wait timeout."""
    for attempt in range(1, attempts + 1):
        async with pool.acquire() as conn:
            try:
                return await apply(conn, result, on_applied=on_applied)
            except pymysql.err.OperationalError as exc:
                if exc.args[0] not in RETRYABLE or attempt == attempts:
                    raise
        await asyncio.sleep(0.01 * attempt)  # back off before re-running the transaction
    raise AssertionError("unreachable")

"""Fan-out: result events → deliveries, one transaction per subscription batch.

Protocol (001 §13): a fan-out transaction

1. locks **only** the subscription row (``FOR UPDATE SKIP LOCKED``: a subscription another
   pump is fanning out is skipped, so any number of pumps run without a leader), and only if
   it is still ACTIVE;
2. reads the namespace's committed ``next_sequence`` with a plain read — never the stream row
   lock, nor a task, queue or application row;
3. reads the result events with ``scan_after_sequence < sequence < next_sequence`` in sequence
   order (a bounded batch, plain read);
4. inserts one delivery per event that passes the filter; the unique key
   ``uq_deliveries_event (namespace_id, subscription_id, event_id)`` makes a replay a no-op
   (``ON DUPLICATE KEY UPDATE`` that changes nothing);
5. advances ``scan_after_sequence`` past every event read, matching or not, and adds the number
   of deliveries inserted to ``backlog`` — in the same commit as the deliveries.

Why the sequence is a safe cursor (000 §6.2 forbids "the largest auto-increment id seen" as
"everything before it was processed"): sequences are allocated by ``UPDATE … SET next_sequence
= next_sequence + n`` on the stream row, which the producer holds locked until its transaction
ends, and its result events are inserted in that same transaction. So a producer's sequences
become visible (committed) together with its events, and no later producer can allocate, let
alone commit, until the earlier one has committed or rolled back — a rollback undoes its
advance, so the next producer re-uses the numbers. The committed ``next_sequence`` N therefore
promises that every sequence below N is a committed event, and a plain read of the events
*after* reading N (READ COMMITTED: each statement sees every commit before it started) sees all
of them: the prefix below N has no gap that a late commit could fill. An auto-increment id has
no such property (ids are taken at insert and committed in any order). The bound rests the
cursor's safety on the stream row alone: whatever else a producer's transaction writes, the
scan never moves past a sequence the committed counter has not covered.

A crash anywhere rolls the whole batch back (scan position, deliveries and backlog together),
and the next pump starts from the committed scan position: no gap, no duplicate.
"""

from __future__ import annotations

from typing import Any

import attrs

from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import results
from orbit_common.relay import model

DEFAULT_EVENTS = 500
DEFAULT_SUBSCRIPTIONS = 50

# The pump's to-do list (plain read, one statement): the due subscriptions after a position in
# (namespace_id, id) order, then wrapping round to those at or before it, so successive passes
# take turns round the subscriptions instead of always serving the first. (The due test is not
# indexable -- it compares with the stream's counter -- so every ACTIVE subscription is read
# either way; ordering by "at or before the position" first costs nothing more.)
DUE_FROM_START = """
SELECT s.namespace_id, s.id FROM orbit_subscriptions s
JOIN orbit_event_streams e ON e.namespace_id = s.namespace_id
WHERE s.state = 'ACTIVE' AND s.scan_after_sequence < e.next_sequence - 1
ORDER BY s.namespace_id, s.id LIMIT %s
"""
DUE_AFTER = """
SELECT s.namespace_id, s.id FROM orbit_subscriptions s
JOIN orbit_event_streams e ON e.namespace_id = s.namespace_id
WHERE s.state = 'ACTIVE' AND s.scan_after_sequence < e.next_sequence - 1
ORDER BY (s.namespace_id, s.id) <= (%s, %s), s.namespace_id, s.id LIMIT %s
"""
LOCK = """
SELECT namespace_id, id, filters, scan_after_sequence, max_attempts FROM orbit_subscriptions
WHERE namespace_id = %s AND id = %s AND state = 'ACTIVE' FOR UPDATE SKIP LOCKED
"""
# The handler comes from the task row (immutable, primary key); the snapshot's copy is the
# fallback when the task row is gone.
EVENTS = """
SELECT r.id, r.sequence, r.task_id, r.queue_id, r.task_revision, r.state,
       COALESCE(t.handler, JSON_VALUE(r.snapshot, '$.handler')) AS handler
FROM orbit_result_events r
LEFT JOIN pulse_tasks t ON t.namespace_id = r.namespace_id AND t.id = r.task_id
WHERE r.namespace_id = %s AND r.sequence > %s AND r.sequence < %s
ORDER BY r.sequence LIMIT %s
"""
EXISTING = """
SELECT event_id FROM orbit_deliveries
WHERE namespace_id = %s AND subscription_id = %s AND event_id IN ({})
"""
INSERT_DELIVERIES = (
    "INSERT INTO orbit_deliveries (namespace_id, id, subscription_id, event_id, sequence,"
    " task_id, task_revision, state, attempts_used, max_attempts, available_at, created_at,"
    " updated_at)"
)
DELIVERY_ROW = ("(%s, %s, %s, %s, %s, %s, %s, 'PENDING', 0, %s, UTC_TIMESTAMP(6),"
                " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
ON_DUPLICATE = " ON DUPLICATE KEY UPDATE id = id"
ADVANCE = """
UPDATE orbit_subscriptions SET scan_after_sequence = %s, backlog = backlog + %s
WHERE namespace_id = %s AND id = %s
"""


@attrs.frozen(kw_only=True)
class Outcome:
    """What one subscription batch did."""

    scanned: int  # events read (the scan position moved past them)
    created: int  # deliveries inserted
    caught_up: bool  # no committed event left past the new scan position


async def due(cur: Any, limit: int = DEFAULT_SUBSCRIPTIONS,
              after: tuple[bytes, bytes] | None = None) -> list[tuple[bytes, bytes]]:
    """``(namespace_id, subscription_id)`` of active subscriptions with unscanned results,
    after ``after`` in key order (None: from the start), wrapping round to the start when
    fewer than ``limit`` follow it."""
    if after is None:
        await cur.execute(DUE_FROM_START, (limit,))
    else:
        await cur.execute(DUE_AFTER, (after[0], after[1], limit))
    return [(r["namespace_id"], r["id"]) for r in await cur.fetchall()]


async def fan_out_subscription(cur: Any, namespace_id: bytes, subscription_id: bytes,
                               events: int = DEFAULT_EVENTS) -> Outcome | None:
    """One batch for one subscription in the caller's transaction (see the module docstring);
    None when the subscription is not ACTIVE or another pump holds it."""
    await cur.execute(LOCK, (namespace_id, subscription_id))
    sub = await cur.fetchone()
    if sub is None:
        return None
    upper = await results.committed_next_sequence(cur, namespace_id)
    await cur.execute(EVENTS, (namespace_id, sub["scan_after_sequence"], upper, events))
    rows = list(await cur.fetchall())
    if not rows:
        return Outcome(scanned=0, created=0, caught_up=True)
    filters = jsondoc.loads_strict(sub["filters"])
    wanted = [r for r in rows if model.matches(filters, r["queue_id"], r["state"], r["handler"])]
    created = 0
    if wanted:
        # Under the subscription lock no other transaction inserts this subscription's
        # deliveries, so what exists now is what the insert would find duplicated.
        await cur.execute(EXISTING.format(placeholders(len(wanted))),
                          (namespace_id, subscription_id, *[r["id"] for r in wanted]))
        existing = {r["event_id"] for r in await cur.fetchall()}
        fresh = [r for r in wanted if r["id"] not in existing]
        if fresh:
            sql, params = multi_insert(INSERT_DELIVERIES, DELIVERY_ROW, [
                (namespace_id, ids.new_id(), subscription_id, r["id"], r["sequence"],
                 r["task_id"], r["task_revision"], sub["max_attempts"]) for r in fresh])
            await cur.execute(sql + ON_DUPLICATE, params)
        created = len(fresh)
    last = rows[-1]["sequence"]
    await cur.execute(ADVANCE, (last, created, namespace_id, subscription_id))
    return Outcome(scanned=len(rows), created=created,
                   caught_up=len(rows) < events or last >= upper - 1)


@attrs.frozen(kw_only=True)
class Pass:
    """What one :func:`fan_out` pass did, and where the next pass starts."""

    created: int
    subscriptions: int  # subscriptions served
    next_after: tuple[bytes, bytes] | None


async def fan_out(db: Database, batch: int = DEFAULT_EVENTS,
                  subscriptions: int = DEFAULT_SUBSCRIPTIONS,
                  after: tuple[bytes, bytes] | None = None) -> Pass:
    """One pass: a batch of up to ``batch`` events for each of up to ``subscriptions`` due
    subscriptions after ``after`` (pass the previous pass's ``next_after`` to take turns), one
    transaction each."""
    targets = await db.read("relay.fan_out.due", lambda cur: due(cur, subscriptions, after))
    created = 0
    for namespace_id, subscription_id in targets:

        async def one(cur: Any, n: bytes = namespace_id, s: bytes = subscription_id
                      ) -> Outcome | None:
            return await fan_out_subscription(cur, n, s, batch)

        outcome = await db.transaction("relay.fan_out", one)
        if outcome is not None:
            created += outcome.created
    return Pass(created=created, subscriptions=len(targets),
                next_after=targets[-1] if targets else None)

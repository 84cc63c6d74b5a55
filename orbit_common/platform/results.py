"""Per-namespace result streams (``orbit_event_streams``) and result events.

Protocol: a transaction that gives tasks an outcome (terminal or NEEDS_REVIEW) appends their
raw state events and, in the same transaction, result events with a gap-free per-namespace
sequence. The sequence is allocated under the namespace's stream row lock, taken **last** in the
one lock order (docs/architecture.md) and held only until commit, so producers serialise
per namespace only for the few statements at the end of their transaction. A result event
reuses the id of its raw state event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common.db import errors as dberrors
from orbit_common.db.batch import multi_insert
from orbit_common.model import jsondoc


@attrs.frozen(kw_only=True)
class ResultEvent:
    event_id: bytes
    task_id: bytes
    queue_id: bytes
    task_revision: int
    state: str
    snapshot: dict[str, Any]


CREATE_STREAM = """
INSERT INTO orbit_event_streams (namespace_id, next_sequence, revision, created_at, updated_at)
VALUES (%s, 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
# Locks the stream row and advances it in one statement: LAST_INSERT_ID(expr) hands the new
# next_sequence back in the statement's answer (the driver's lastrowid), so no locking read is
# needed first (MySQL and MariaDB alike).
ADVANCE_STREAM = """
UPDATE orbit_event_streams
SET next_sequence = LAST_INSERT_ID(next_sequence + %s), revision = revision + 1,
    updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s
"""
INSERT_RESULTS = (
    "INSERT INTO orbit_result_events (namespace_id, id, sequence, task_id, queue_id,"
    " task_revision, state, snapshot, committed_at)"
)


async def _advance_stream(cur: Any, namespace_id: bytes, count: int) -> int:
    """Reserve ``count`` sequences (the stream row stays locked); returns the first."""
    await cur.execute(ADVANCE_STREAM, (count, namespace_id))
    if cur.rowcount != 1:  # the namespace's first result: make its stream, then advance it
        try:
            await cur.execute(CREATE_STREAM, (namespace_id,))
        except Exception as exc:
            if not dberrors.is_duplicate(exc):
                raise
        await cur.execute(ADVANCE_STREAM, (count, namespace_id))
        if cur.rowcount != 1:
            raise RuntimeError("the namespace's result stream row is missing")
    return int(cur.lastrowid) - count


async def append_results(cur: Any, namespace_id: bytes, events: Sequence[ResultEvent]) -> int:
    """Append result events with consecutive sequences; returns the first sequence used.

    Must be the last lock the caller's transaction takes (it serialises the namespace).
    """
    if not events:
        return 0
    first = await _advance_stream(cur, namespace_id, len(events))
    rows = [
        (namespace_id, e.event_id, first + i, e.task_id, e.queue_id, e.task_revision, e.state,
         jsondoc.dumps(e.snapshot))
        for i, e in enumerate(events)
    ]
    sql, params = multi_insert(
        INSERT_RESULTS, "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))", rows
    )
    await cur.execute(sql, params)
    return first


COMMITTED_NEXT = "SELECT next_sequence FROM orbit_event_streams WHERE namespace_id = %s"


async def committed_next_sequence(cur: Any, namespace_id: bytes) -> int:
    """The namespace's committed ``next_sequence`` (1 before its first result), by a plain,
    non-locking read: never the stream row lock, which producers hold while they commit.

    Every sequence below the returned value belongs to a committed result event: a producer
    allocates sequences under the stream row lock and holds it until its commit, and a
    producer that rolls back also rolls back its advance, so the committed counter only ever
    covers committed events (the visible prefix has no gaps). Readers use it as their upper
    bound (subscription fan-out, orbit_common/relay/fanout.py)."""
    await cur.execute(COMMITTED_NEXT, (namespace_id,))
    row = await cur.fetchone()
    return 1 if row is None else int(row["next_sequence"])

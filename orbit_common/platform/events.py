"""Raw state events (``orbit_events``): appended in the same transaction as the state change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common.db.batch import multi_insert
from orbit_common.model import ids, jsondoc

INSERT_EVENT = """
INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id, aggregate_revision,
  event_type, from_state, to_state, payload, occurred_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))
"""

# Readers of the stream, keyset-paged by time and id (the timeline by ``workflow_at``, which is
# ``occurred_at`` for a workflow's events) and EXPLAIN-checked
# (tests/schema/test_explain_events.py). ``workflow_id`` is the generated column decoded from
# the payload's ``$.workflow_id`` (migration 0014): a workflow's timeline is every event that
# names the workflow, whatever its aggregate (the instance, its steps, its tasks).
# Parameters: namespace id, workflow id, position occurred_at (twice), position id, limit.
SELECT_WORKFLOW_TIMELINE = """
SELECT id, aggregate_type, aggregate_id, aggregate_revision, event_type, from_state, to_state,
       payload, occurred_at
FROM orbit_events
WHERE namespace_id = %s AND workflow_id = %s
  AND (workflow_at > %s OR (workflow_at = %s AND id > %s))
ORDER BY workflow_at, id
LIMIT %s
"""
# The sampler's read: events of one type across namespaces, oldest first from a position.
# Parameters: event type, position occurred_at (twice), position id, limit.
SELECT_BY_TYPE = """
SELECT namespace_id, id, aggregate_type, aggregate_id, aggregate_revision, from_state, to_state,
       payload, occurred_at
FROM orbit_events
WHERE event_type = %s
  AND (occurred_at > %s OR (occurred_at = %s AND id > %s))
ORDER BY occurred_at, id
LIMIT %s
"""


async def append_event(
    cur: Any,
    *,
    namespace_id: bytes,
    aggregate_type: str,
    aggregate_id: bytes,
    aggregate_revision: int,
    event_type: str,
    from_state: str | None,
    to_state: str | None,
    payload: dict[str, Any],
) -> bytes:
    """Append one event; the caller's transaction commits it with the change it records."""
    event_id = ids.new_id()
    await cur.execute(
        INSERT_EVENT,
        (
            ids.check_id(namespace_id),
            event_id,
            aggregate_type,
            ids.check_id(aggregate_id),
            aggregate_revision,
            event_type,
            from_state,
            to_state,
            jsondoc.dumps(payload),
        ),
    )
    return event_id


@attrs.frozen(kw_only=True)
class EventRecord:
    """One raw state event for :func:`append_events` (the id is chosen by the caller)."""

    namespace_id: bytes
    id: bytes
    aggregate_type: str
    aggregate_id: bytes
    aggregate_revision: int
    event_type: str
    from_state: str | None
    to_state: str | None
    payload: dict[str, Any]


async def append_events(cur: Any, events: Sequence[EventRecord]) -> None:
    """Append many events in one statement, inside the caller's transaction."""
    if not events:
        return
    sql, params = multi_insert(
        "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
        " aggregate_revision, event_type, from_state, to_state, payload, occurred_at)",
        "(%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))",
        [
            (e.namespace_id, ids.check_id(e.id), e.aggregate_type, ids.check_id(e.aggregate_id),
             e.aggregate_revision, e.event_type, e.from_state, e.to_state,
             jsondoc.dumps(e.payload))
            for e in events
        ],
    )
    await cur.execute(sql, params)

"""Raw state events (``orbit_events``): appended in the same transaction as the state change."""

from __future__ import annotations

from typing import Any

from orbit_common.model import ids, jsondoc

INSERT_EVENT = """
INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id, aggregate_revision,
  event_type, from_state, to_state, payload, occurred_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))
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

"""A workflow instance's timeline: its raw state events in database-time order (a history view).

The timeline is the union of two indexed reads of ``orbit_events`` (each keyset-paged by
``(occurred_at, id)``, EXPLAIN-checked in tests/schema/test_explain_weave_timeline.py):

- the instance's own events (aggregate ``workflow_instance``: ``workflow.started``,
  ``workflow.advanced``, ``workflow.succeeded``, ``workflow.failed``, and whatever later
  commands append to the instance), by ``ix_events_aggregate``;
- every other event that names the instance in its payload's ``workflow_id`` (its signals'
  ``workflow.signal.accepted`` / ``.consumed`` / ``.rejected``, its steps' manual recoveries
  such as ``workflow.step.rearmed`` / ``.continued``), by ``ix_events_workflow``
  (the generated ``workflow_id``/``workflow_at`` of migration 0014).

Task events are not part of it: a step's tasks are named (``task_id``) by the
``workflow.advanced`` event that created them, and each task's own history is its events. A
page reads at most ``limit + 1`` rows from each index and merges them (an event found by both
reads appears once).

A history view, not a consumption watermark: ``occurred_at`` is the database time of the
statement that wrote the event, and transactions commit in another order than their times, so
an event may appear behind a position a reader has already passed. Consumers that must see
every event use result subscriptions, not this timeline.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from orbit_common import errors
from orbit_common.db.clock import as_utc, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids, jsondoc
from orbit_common.platform import authz, credentials
from orbit_common.weave import instances

LIMIT_MAX = 100
ORDERS = ("asc", "desc")
ID_MAX = b"\xff" * 16
ID_MIN = b"\x00" * 16
COLUMNS = ("id, aggregate_type, aggregate_id, aggregate_revision, event_type, from_state,"
           " to_state, payload, occurred_at")

# The instance's own events. Parameters: namespace id, instance id, position time (twice),
# position id, limit.
INSTANCE_EVENTS = {
    "asc": f"SELECT {COLUMNS} FROM orbit_events FORCE INDEX (ix_events_aggregate)"
           " WHERE namespace_id = %s AND aggregate_type = 'workflow_instance'"
           " AND aggregate_id = %s"
           " AND (occurred_at > %s OR (occurred_at = %s AND id > %s))"
           " ORDER BY occurred_at, id LIMIT %s",
    "desc": f"SELECT {COLUMNS} FROM orbit_events FORCE INDEX (ix_events_aggregate)"
            " WHERE namespace_id = %s AND aggregate_type = 'workflow_instance'"
            " AND aggregate_id = %s"
            " AND (occurred_at < %s OR (occurred_at = %s AND id < %s))"
            " ORDER BY occurred_at DESC, id DESC LIMIT %s",
}
# Events naming the instance in their payload (``workflow_at`` is ``occurred_at`` for them).
# Parameters: as INSTANCE_EVENTS.
NAMED_EVENTS = {
    "asc": f"SELECT {COLUMNS} FROM orbit_events FORCE INDEX (ix_events_workflow)"
           " WHERE namespace_id = %s AND workflow_id = %s"
           " AND (workflow_at > %s OR (workflow_at = %s AND id > %s))"
           " ORDER BY workflow_at, id LIMIT %s",
    "desc": f"SELECT {COLUMNS} FROM orbit_events FORCE INDEX (ix_events_workflow)"
            " WHERE namespace_id = %s AND workflow_id = %s"
            " AND (workflow_at < %s OR (workflow_at = %s AND id < %s))"
            " ORDER BY workflow_at DESC, id DESC LIMIT %s",
}


def event_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(), "type": row["event_type"],
        "aggregate_type": row["aggregate_type"], "aggregate_id": row["aggregate_id"].hex(),
        "aggregate_revision": row["aggregate_revision"], "from_state": row["from_state"],
        "to_state": row["to_state"], "payload": jsondoc.RawJson(row["payload"]),
        "occurred_at": as_utc(row["occurred_at"]).isoformat(timespec="microseconds"),
    }


def _key(row: dict[str, Any]) -> tuple[dt.datetime, bytes]:
    return as_utc(row["occurred_at"]), row["id"]


def start_position(order: str) -> tuple[dt.datetime, bytes]:
    """The first page's position: before every event in ``order``."""
    return (cursors.TIME_MIN, ID_MIN) if order == "asc" else (cursors.TIME_MAX, ID_MAX)


async def page(cur: Any, namespace_id: bytes, instance_id: bytes, *, order: str, limit: int,
               position: tuple[dt.datetime, bytes] | None,
               filters: dict[str, Any]) -> cursors.Page:
    """One page of the instance's timeline after ``position`` (None: from the start) in
    ``order``; the next cursor is bound to ``filters``."""
    at, after = position or start_position(order)
    params = (namespace_id, instance_id, to_db(at), to_db(at), after, limit + 1)
    rows: dict[bytes, dict[str, Any]] = {}
    for statement in (INSTANCE_EVENTS[order], NAMED_EVENTS[order]):
        await cur.execute(statement, params)
        for r in await cur.fetchall():
            rows[r["id"]] = dict(r)
    merged = sorted(rows.values(), key=_key, reverse=order == "desc")
    more = len(merged) > limit
    merged = merged[:limit]
    next_cursor = None
    if more:
        last_at, last_id = _key(merged[-1])
        next_cursor = cursors.encode("workflow_timeline", filters,
                                     [last_at.isoformat(), last_id.hex()])
    return cursors.Page(items=[event_view(r) for r in merged], next_cursor=next_cursor)


def check(instance_id: str, order: str, limit: int) -> bytes:
    """The instance's id once ``order`` and ``limit`` are valid (``validation_failed``; an id
    that is not one is ``workflow_instance_not_found``, like an unknown one)."""
    problems = []
    if order not in ORDERS:
        problems.append({"path": "order", "message": "asc or desc"})
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        problems.append({"path": "limit", "message": f"1-{LIMIT_MAX}"})
    if problems:
        raise errors.ValidationFailed(problems)
    try:
        return ids.from_hex(instance_id)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc


async def exists(cur: Any, namespace_id: bytes, instance_id: bytes) -> None:
    await cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s",
                      (namespace_id, instance_id))
    if await cur.fetchone() is None:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")


async def get_timeline(db: Database, principal: credentials.Principal, *, namespace: str,
                       instance_id: str, order: str = "asc", limit: int = LIMIT_MAX,
                       cursor: str | None = None) -> cursors.Page:
    """The instance's timeline, oldest first (``order`` ``asc``) or newest first (``desc``),
    cursor-paged; the cursor is bound to the namespace, the instance and the order."""
    raw_id = check(instance_id, order, limit)
    filters = {"namespace": namespace, "workflow_id": raw_id.hex(), "order": order}
    position = (cursors.time_position(cursors.decode(cursor, "workflow_timeline", filters))
                if cursor else None)

    async def body(cur: Any) -> cursors.Page:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        await exists(cur, ns.id, raw_id)
        return await page(cur, ns.id, raw_id, order=order, limit=limit, position=position,
                          filters=filters)

    return await db.read("workflows.timeline", body)

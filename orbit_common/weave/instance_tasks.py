"""The tasks of a workflow instance (``GET …/workflows/{id}/tasks``): the workflow → task
direction of the task source view (the other one is the task's ``source``,
orbit_common.pulse.queries.source_of).

Every task the instance created -- each TASK step activation's task, each POLL round's task, a
step retry's new task -- carries the instance as its owner (``owner_kind = 'WORKFLOW'``,
``owner_id``, migration 0015), so the list reads ``ix_tasks_owner``
``(namespace_id, owner_kind, owner_id)``; InnoDB appends the primary key's ``id`` to it, so the
page is read in task id order from the cursor, with no sort (EXPLAIN-checked in
tests/schema/test_explain_weave.py). The order is stable but not chronological: each item has
its ``created_at``, and the instance's timeline is the chronological view. No index of its own
(no migration): an instance makes tens to hundreds of tasks.

Each task is verified back to the instance, never guessed: the activation that references it
(``uq_weave_activations_task``), or the POLL round whose task it is
(``uq_weave_poll_rounds_task``) and that round's activation (``uq_weave_activations_id``);
the activation must belong to the instance and its step must exist. Otherwise the item says
``verified: false`` with its step and activation fields null.
"""

from __future__ import annotations

from typing import Any

from orbit_common import errors
from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids
from orbit_common.platform import authz, credentials
from orbit_common.weave import instances

LIST_MAX = 100
ID_MIN = bytes(16)

# One page of the instance's tasks after a task id, in id order. Parameters: namespace id,
# instance id, position (task id), limit.
TASKS = """
SELECT STRAIGHT_JOIN t.id, t.handler, t.state, t.retry_of, t.created_at, t.completed_at,
       q.name AS queue_name,
       a.instance_id AS a_instance_id, a.step_id AS a_step_id, a.id AS a_id,
       a.sequence AS a_sequence, a.state AS a_state,
       r.round AS round,
       ra.instance_id AS ra_instance_id, ra.step_id AS ra_step_id, ra.id AS ra_id,
       ra.sequence AS ra_sequence, ra.state AS ra_state
FROM pulse_tasks t FORCE INDEX (ix_tasks_owner)
JOIN pulse_queues q FORCE INDEX (PRIMARY)
  ON q.namespace_id = t.namespace_id AND q.id = t.queue_id
LEFT JOIN weave_activations a FORCE INDEX (uq_weave_activations_task)
  ON a.namespace_id = t.namespace_id AND a.task_id = t.id
LEFT JOIN weave_poll_rounds r FORCE INDEX (uq_weave_poll_rounds_task)
  ON r.namespace_id = t.namespace_id AND r.task_id = t.id
LEFT JOIN weave_activations ra FORCE INDEX (uq_weave_activations_id)
  ON ra.namespace_id = r.namespace_id AND ra.id = r.activation_id
WHERE t.namespace_id = %s AND t.owner_kind = 'WORKFLOW' AND t.owner_id = %s AND t.id > %s
ORDER BY t.id
LIMIT %s
"""
# The instance's steps by id (their primary key's prefix). Parameters: namespace id, instance id.
STEPS = "SELECT id, name, kind FROM weave_steps WHERE namespace_id = %s AND instance_id = %s"


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


def item_view(row: dict[str, Any], instance_id: bytes,
              steps: dict[bytes, dict[str, Any]]) -> dict[str, Any]:
    """One task of the instance with the activation that references it, verified back."""
    # Through its round when it has one: a POLL activation names only its current round's task.
    prefix = "ra_" if row["round"] is not None else "a_"
    activation_id = row[prefix + "id"]
    step = steps.get(row[prefix + "step_id"]) if activation_id is not None else None
    verified = (activation_id is not None and row[prefix + "instance_id"] == instance_id
                and step is not None
                and (row["a_id"] is None or row["a_id"] == activation_id))
    return {
        "task_id": row["id"].hex(), "queue": row["queue_name"], "handler": row["handler"],
        "state": row["state"],
        "retry_of": None if row["retry_of"] is None else row["retry_of"].hex(),
        "created_at": _iso(row["created_at"]), "completed_at": _iso(row["completed_at"]),
        "verified": verified,
        "step": step["name"] if verified and step else None,
        "step_kind": step["kind"] if verified and step else None,
        "activation_id": activation_id.hex() if verified and activation_id else None,
        "activation_sequence": row[prefix + "sequence"] if verified else None,
        "activation_state": row[prefix + "state"] if verified else None,
        "round": row["round"] if verified else None,
    }


async def page(cur: Any, namespace_id: bytes, instance_id: bytes, *, after: bytes,
               limit: int, filters: dict[str, Any]) -> cursors.Page:
    """One page of the instance's tasks after task id ``after``; the next cursor is bound to
    ``filters``. ``workflow_instance_not_found`` when the instance is not in the namespace."""
    await cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s",
                      (namespace_id, instance_id))
    if await cur.fetchone() is None:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")
    await cur.execute(TASKS, (namespace_id, instance_id, after, limit + 1))
    rows = [dict(r) for r in await cur.fetchall()]
    more = len(rows) > limit
    rows = rows[:limit]
    await cur.execute(STEPS, (namespace_id, instance_id))
    steps = {r["id"]: dict(r) for r in await cur.fetchall()}
    next_cursor = (cursors.encode("workflow_tasks", filters, [rows[-1]["id"].hex()])
                   if more else None)
    return cursors.Page(items=[item_view(r, instance_id, steps) for r in rows],
                        next_cursor=next_cursor)


def check(instance_id: str, limit: int) -> bytes:
    """The instance's id once ``limit`` is valid (``validation_failed``; an id that is not one
    is ``workflow_instance_not_found``, like an unknown one)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_MAX:
        raise errors.ValidationFailed([{"path": "limit", "message": f"1-{LIST_MAX}"}])
    try:
        return ids.from_hex(instance_id)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc


def position(cursor: str | None, filters: dict[str, Any]) -> bytes:
    """The task id a cursor continues after (the first page: before every id)."""
    if cursor is None:
        return ID_MIN
    found = cursors.decode(cursor, "workflow_tasks", filters)
    if len(found) != 1 or not isinstance(found[0], str):
        raise errors.InvalidCursor()
    try:
        return ids.from_hex(found[0])
    except ValueError as exc:
        raise errors.InvalidCursor() from exc


async def list_tasks(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str, limit: int = LIST_MAX, cursor: str | None = None
                     ) -> cursors.Page:
    """Every task the instance created, in task id order, cursor-paged (the cursor is bound to
    the namespace and the instance); ``workflows.read``."""
    raw_id = check(instance_id, limit)
    filters = {"namespace": namespace, "workflow_id": raw_id.hex()}
    after = position(cursor, filters)

    async def body(cur: Any) -> cursors.Page:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await page(cur, ns.id, raw_id, after=after, limit=limit, filters=filters)

    return await db.read("workflows.tasks", body)

"""Pulse → Weave: the internal inbox rows the single ending writer adds (000 §6.3).

The producing side lives in Pulse, next to the ending writer (as the result stream does): Weave
imports Pulse, never the other way round; the engine (orbit_common/weave) consumes the rows.

When a task a workflow owns (``owner_kind = 'WORKFLOW'``) ends — SUCCEEDED, FAILED, CANCELLED
or NEEDS_REVIEW — :func:`record` inserts one ``weave_inbox`` row per task in the ending's own
transaction, with a frozen snapshot of the result (the same document as the result event's), at
most one per (source event, consumer). The engine consumes them later.

A row whose workflow links are incomplete — no instance, no workflow gate, no activation that
names the task, an instance that does not exist, or links that disagree — is written
QUARANTINED with the reason, never advanced on a guess.

The links are read by a plain (non-locking) read: an activation (or a POLL round) and its task
are created in one transaction, committed before the task could be claimed, so the ending's
snapshot sees them; no lock on workflow rows is taken from inside the task lock order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.model import ids, jsondoc

CONSUMER = "ENGINE"

INSERT_INBOX = (
    "INSERT INTO weave_inbox (namespace_id, id, source_event_id, consumer, task_id,"
    " task_revision, task_state, instance_id, activation_id, snapshot, state,"
    " quarantine_reason, created_at)"
)
INBOX_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))"
# The activation that names the task, or (a POLL step's earlier round, whose activation has
# moved on to a later round's task) the round that does (uq_weave_poll_rounds_task).
LINKS = (
    "SELECT a.task_id, a.id AS activation_id, a.instance_id, i.gate_id"
    " FROM weave_activations a LEFT JOIN weave_instances i"
    " ON i.namespace_id = a.namespace_id AND i.id = a.instance_id"
    " WHERE a.namespace_id = %s AND a.task_id IN ({ids})"
    " UNION ALL"
    " SELECT r.task_id, r.activation_id, r.instance_id, i.gate_id"
    " FROM weave_poll_rounds r FORCE INDEX (uq_weave_poll_rounds_task)"
    " LEFT JOIN weave_instances i"
    " ON i.namespace_id = r.namespace_id AND i.id = r.instance_id"
    " WHERE r.namespace_id = %s AND r.task_id IN ({ids})"
)


@attrs.frozen(kw_only=True)
class Source:
    """One ended workflow-owned task, as the ending writer knows it."""

    event_id: bytes  # the task's state event (orbit_events.id), also the result event's id
    task_id: bytes
    task_revision: int
    task_state: str
    instance_id: bytes | None  # pulse_tasks.owner_id
    gate_id: bytes | None  # pulse_tasks.workflow_gate_id
    snapshot: dict[str, Any]


def quarantine_reason(source: Source, link: dict[str, Any] | None) -> str | None:
    """Why ``source`` cannot be attributed to an activation (None when every link agrees)."""
    if source.instance_id is None:
        return "missing_instance_link"
    if source.gate_id is None:
        return "missing_gate_link"
    if link is None:
        return "missing_activation"
    if link["instance_id"] != source.instance_id:
        return "activation_of_other_instance"
    if link["gate_id"] is None:
        return "missing_instance"
    if link["gate_id"] != source.gate_id:
        return "gate_mismatch"
    return None


async def record(cur: Any, namespace_id: bytes, sources: Sequence[Source]) -> None:
    """Insert the inbox rows of ``sources`` (one statement to read the links, one to insert)."""
    if not sources:
        return
    task_ids = [s.task_id for s in sources]
    await cur.execute(LINKS.format(ids=placeholders(len(task_ids))),
                      (namespace_id, *task_ids, namespace_id, *task_ids))
    links = {r["task_id"]: r for r in await cur.fetchall()}
    rows = []
    for s in sources:
        link = links.get(s.task_id)
        reason = quarantine_reason(s, link)
        rows.append((namespace_id, ids.new_id(), s.event_id, CONSUMER, s.task_id,
                     s.task_revision, s.task_state, s.instance_id,
                     None if link is None or reason is not None else link["activation_id"],
                     jsondoc.dumps(s.snapshot), "QUARANTINED" if reason else "PENDING",
                     reason))
    sql, params = multi_insert(INSERT_INBOX, INBOX_ROW, rows)
    await cur.execute(sql, params)

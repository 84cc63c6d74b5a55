"""The console's overview of one namespace: bounded reads over queues, tasks, deliveries and the
workflow inbox, in one read-only transaction, authorised as the caller's credential.

Every figure is read from a counter or an index range and every count is capped at
:data:`COUNT_CAP` (shown as "≥ cap"), so a page costs the same with ten tasks or ten million:

* per queue (at most :data:`QUEUES_MAX`, by name): depth = the queue's unfinished counter;
  running and NEEDS_REVIEW by ``ix_tasks_claim`` (namespace, queue, state); the oldest due
  WAITING task's age (orbit_common/pulse/usage.py); starts in the last minute from the
  ``task.started`` events (``ix_events_type``, the last :data:`RATE_WINDOW_S` seconds);
* deliveries: the ACTIVE subscriptions' backlog counters and the EXHAUSTED deliveries
  (``ix_deliveries_lease``, whose first column is the state);
* the workflow inbox: PENDING and LEASED rows (``ix_weave_inbox_scan``);
* recent failures: FAILED tasks of the last :data:`FAILURE_WINDOW_S` seconds
  (``ix_tasks_state_completed``), the newest :data:`FAILURES_LISTED` listed and all (capped)
  counted into :data:`FAILURE_BUCKETS` buckets for the chart.

A section the credential may not read (no ``subscriptions.read`` or ``workflows.read``) is
``None``; queues and failures are filtered by the per-queue grants.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import names
from orbit_common.platform import authz
from orbit_common.platform import credentials as creds
from orbit_common.pulse import queues, usage

COUNT_CAP = 10_000
QUEUES_MAX = 50
RATE_WINDOW_S = 60
FAILURE_WINDOW_S = 3600
FAILURE_BUCKETS = 12
FAILURES_LISTED = 10

# ix_tasks_claim (namespace_id, queue_id, state, …): a capped count of one state of one queue.
QUEUE_STATE_COUNT = f"""
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM pulse_tasks
  WHERE namespace_id = %s AND queue_id = %s AND state = %s LIMIT {COUNT_CAP}
) capped
"""
# ix_events_type (event_type, occurred_at, id), then the tasks by primary key.
STARTS_BY_QUEUE = f"""
SELECT t.queue_id, COUNT(*) AS n FROM (
  SELECT e.aggregate_id FROM orbit_events e
  WHERE e.event_type = 'task.started' AND e.occurred_at >= %s - INTERVAL {RATE_WINDOW_S} SECOND
    AND e.namespace_id = %s
  LIMIT {COUNT_CAP}
) started
JOIN pulse_tasks t ON t.namespace_id = %s AND t.id = started.aggregate_id
GROUP BY t.queue_id
"""
# ix_subscriptions_state (state, namespace_id): the maintained backlog counters.
SUBSCRIPTION_BACKLOG = """
SELECT COUNT(*) AS subscriptions, COALESCE(SUM(backlog), 0) AS backlog
FROM orbit_subscriptions WHERE state = 'ACTIVE' AND namespace_id = %s
"""
# ix_deliveries_lease (state, lease_expires_at): filtered to the namespace, capped.
EXHAUSTED_DELIVERIES = f"""
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM orbit_deliveries WHERE state = 'EXHAUSTED' AND namespace_id = %s
  LIMIT {COUNT_CAP}
) capped
"""
# ix_weave_inbox_scan (state, created_at, namespace_id, id), capped.
INBOX_BACKLOG = f"""
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM weave_inbox WHERE state IN ('PENDING', 'LEASED') AND namespace_id = %s
  LIMIT {COUNT_CAP}
) capped
"""
INBOX_OLDEST = """
SELECT MIN(created_at) AS oldest FROM weave_inbox
WHERE state = 'PENDING' AND namespace_id = %s
"""
# ix_tasks_state_completed (state, completed_at, id): the window's failures, newest first.
RECENT_FAILURES = f"""
SELECT t.id, t.queue_id, t.handler, t.outcome_reason, t.completed_at
FROM pulse_tasks t
WHERE t.state = 'FAILED' AND t.completed_at >= %s - INTERVAL {FAILURE_WINDOW_S} SECOND
  AND t.namespace_id = %s
ORDER BY t.completed_at DESC, t.id DESC
LIMIT {COUNT_CAP}
"""


@attrs.frozen(kw_only=True)
class QueueLine:
    name: str
    paused: bool
    depth: int
    running: int
    needs_review: int
    waiting: int
    oldest_waiting_s: float
    starts_per_minute: int


@attrs.frozen(kw_only=True)
class Failure:
    task_id: str
    queue: str
    handler: str
    reason: str | None
    completed_at: dt.datetime


@attrs.frozen(kw_only=True)
class Overview:
    namespace: str
    measured_at: dt.datetime
    queues: list[QueueLine]
    queues_truncated: bool
    # None when the credential may not read subscriptions / workflows.
    delivery_backlog: int | None
    subscriptions: int | None
    exhausted_deliveries: int | None
    inbox_backlog: int | None
    inbox_oldest_s: float | None
    failures: list[Failure]
    failure_buckets: list[int]  # oldest first, FAILURE_WINDOW_S / FAILURE_BUCKETS each
    failures_counted: int
    cap: int = COUNT_CAP


async def _count(cur: Any, sql: str, params: tuple[Any, ...]) -> int:
    await cur.execute(sql, params)
    row = await cur.fetchone()
    return int(row["n"])


async def namespace_overview(db: Database, principal: creds.Principal, *,
                             namespace: str) -> Overview:
    """The overview of ``namespace`` as ``principal`` may see it (module docstring)."""
    if not names.is_valid_name(namespace):  # only valid names reach SQL
        raise errors.NamespaceNotFound(f"no namespace {namespace!r} for this credential")

    async def body(cur: Any) -> Overview:
        ns = await creds.authorize(cur, principal, authz.Action.QUEUES_READ, namespace)
        grants = await creds.recheck_principal(cur, principal)
        now = await db_now(cur)
        at = to_db(now)
        records = await queues.list_by_name(cur, ns.id, after_name="", limit=QUEUES_MAX + 1)
        truncated = len(records) > QUEUES_MAX
        readable = [r for r in records[:QUEUES_MAX]
                    if authz.allowed(grants, authz.Action.QUEUES_READ.value, namespace,
                                     r.queue.name)]
        await cur.execute(STARTS_BY_QUEUE, (at, ns.id, ns.id))
        starts = {row["queue_id"]: int(row["n"]) for row in await cur.fetchall()}
        lines = []
        for record in readable:
            qid = record.queue.id
            backlog = await usage.backlog(cur, ns.id, qid)
            lines.append(QueueLine(
                name=record.queue.name, paused=record.paused,
                depth=record.flow.unfinished_tasks,
                running=await _count(cur, QUEUE_STATE_COUNT, (ns.id, qid, "RUNNING")),
                needs_review=await _count(cur, QUEUE_STATE_COUNT, (ns.id, qid, "NEEDS_REVIEW")),
                waiting=await _count(cur, QUEUE_STATE_COUNT, (ns.id, qid, "WAITING")),
                oldest_waiting_s=backlog.oldest_age.total_seconds(),
                starts_per_minute=starts.get(qid, 0),
            ))
        names = {r.queue.id: r.queue.name for r in records}
        delivery_backlog = subscriptions = exhausted = None
        if authz.allowed(grants, authz.Action.SUBSCRIPTIONS_READ.value, namespace):
            await cur.execute(SUBSCRIPTION_BACKLOG, (ns.id,))
            row = await cur.fetchone()
            delivery_backlog, subscriptions = int(row["backlog"]), int(row["subscriptions"])
            exhausted = await _count(cur, EXHAUSTED_DELIVERIES, (ns.id,))
        inbox = inbox_oldest = None
        if authz.allowed(grants, authz.Action.WORKFLOWS_READ.value, namespace):
            inbox = await _count(cur, INBOX_BACKLOG, (ns.id,))
            await cur.execute(INBOX_OLDEST, (ns.id,))
            oldest = (await cur.fetchone())["oldest"]
            inbox_oldest = (0.0 if oldest is None
                            else max(0.0, (now - as_utc(oldest)).total_seconds()))
        await cur.execute(RECENT_FAILURES, (at, ns.id))
        failures: list[Failure] = []
        buckets = [0] * FAILURE_BUCKETS
        width = FAILURE_WINDOW_S / FAILURE_BUCKETS
        counted = 0
        for row in await cur.fetchall():
            queue_name = names.get(row["queue_id"])
            if queue_name is None:  # a queue past the listed ones: look it up
                found = await queues.get_queue_by_id(cur, ns.id, row["queue_id"])
                queue_name = names[row["queue_id"]] = found.queue.name
            if not authz.allowed(grants, authz.Action.TASKS_READ.value, namespace, queue_name):
                continue
            completed = as_utc(row["completed_at"])
            age = (now - completed).total_seconds()
            index = FAILURE_BUCKETS - 1 - min(FAILURE_BUCKETS - 1, max(0, int(age // width)))
            buckets[index] += 1
            counted += 1
            if len(failures) < FAILURES_LISTED:
                failures.append(Failure(task_id=row["id"].hex(), queue=queue_name,
                                        handler=row["handler"], reason=row["outcome_reason"],
                                        completed_at=completed))
        return Overview(
            namespace=namespace, measured_at=now, queues=lines, queues_truncated=truncated,
            delivery_backlog=delivery_backlog, subscriptions=subscriptions,
            exhausted_deliveries=exhausted, inbox_backlog=inbox, inbox_oldest_s=inbox_oldest,
            failures=failures, failure_buckets=buckets, failures_counted=counted,
        )

    return await db.read("console.overview", body)

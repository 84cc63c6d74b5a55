"""Usage: what the flow-control counters and the claim index say now, for operators.

Read-only. The counters themselves are kept by the submit and lease transactions
(resources.py); this module only reads them, plus two things no counter holds:

* a queue's **backlog** -- its due WAITING tasks (``available_at <= now``, database time) and
  the oldest one's ``available_at``, read from the claim index ``ix_tasks_claim``
  ``(namespace_id, queue_id, state, dispatch_at, available_at, id)``;
* the **held permits** of concurrency keys, per namespace.

The oldest due task is found without scanning the whole backlog. ``dispatch_at`` is
``available_at - priority × 30 s`` (migration 0005) with priority 0–9, so every task has
``available_at - 270 s <= dispatch_at <= available_at``. Let ``d0`` be the smallest
``dispatch_at`` of a due task (the head of the index range) and ``m`` the smallest
``available_at`` of one. Then ``d0 <= m`` and ``m <= d0 + 270 s``, so the task holding ``m`` has
``dispatch_at`` in ``[d0, d0 + 270 s]``: :data:`OLDEST_HEAD` reads ``d0`` and
:data:`OLDEST_IN_WINDOW` the minimum in that slice of the index. Counting the backlog
(:data:`DUE_COUNT`) is an index-only range scan proportional to it; only the API's one-queue
read does it.

Metrics (prometheus_client): ``orbit_backpressure_refusals_total`` counts 429 answers by problem
code (orbit_common/service/http/middleware.py). :class:`UsageGauges` sets
``orbit_queue_oldest_waiting_seconds``, ``orbit_queue_unfinished_tasks`` and
``orbit_permits_held`` from one :func:`read_snapshot`; a daemon calls
:meth:`UsageGauges.refresh` periodically. They are labelled by namespace and queue; with
per-tenant labels turned off (``[service] metrics_tenant_labels = false``) every gauge is one
series labelled :data:`ALL` (:func:`collapsed`), so ``/metrics`` names no tenant.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import prometheus_client

from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database

# The widest gap between a task's dispatch_at and its available_at: priority 9 × 30 s
# (the generated column of migrations/0005_tasks.sql).
PRIORITY_AGING = dt.timedelta(seconds=9 * 30)

# --- SQL -----------------------------------------------------------------------------------------

# ix_tasks_claim, in index order: the first due WAITING task (its dispatch_at is d0).
OLDEST_HEAD = """
SELECT t.dispatch_at FROM pulse_tasks t
WHERE t.namespace_id = %s AND t.queue_id = %s AND t.state = 'WAITING'
  AND t.dispatch_at <= %s AND t.available_at <= %s
ORDER BY t.dispatch_at, t.available_at, t.id
LIMIT 1
"""
# ix_tasks_claim, index only: the oldest due task has dispatch_at in [d0, d0 + 270 s].
OLDEST_IN_WINDOW = """
SELECT MIN(t.available_at) AS oldest FROM pulse_tasks t
WHERE t.namespace_id = %s AND t.queue_id = %s AND t.state = 'WAITING'
  AND t.dispatch_at >= %s AND t.dispatch_at <= %s AND t.available_at <= %s
"""
# ix_tasks_claim, index only: every due WAITING task of the queue (proportional to the backlog).
DUE_COUNT = """
SELECT COUNT(*) AS due FROM pulse_tasks t
WHERE t.namespace_id = %s AND t.queue_id = %s AND t.state = 'WAITING'
  AND t.dispatch_at <= %s AND t.available_at <= %s
"""
# Every queue with its namespace's name and its counter (pulse_queues holds one row per queue).
QUEUE_COUNTERS = """
SELECT q.namespace_id, n.name AS namespace, q.id, q.name, q.unfinished_tasks
FROM pulse_queues q
JOIN orbit_namespaces n ON n.id = q.namespace_id
"""
# Held permits by namespace: one row per concurrency key ever seen (rows are never deleted).
PERMITS_HELD = """
SELECT n.name AS namespace, SUM(l.held_permits) AS held
FROM pulse_concurrency_limits l
JOIN orbit_namespaces n ON n.id = l.namespace_id
WHERE l.held_permits > 0
GROUP BY n.name
"""


# --- reads (each takes the caller's cursor; no locks) ------------------------------------------


@attrs.frozen(kw_only=True)
class Backlog:
    """A queue's due WAITING tasks at ``measured_at`` (database time)."""

    measured_at: dt.datetime
    oldest_available_at: dt.datetime | None
    due_tasks: int | None = None  # None when not counted

    @property
    def oldest_age(self) -> dt.timedelta:
        """How long the oldest due task has been waiting; zero when none is."""
        if self.oldest_available_at is None:
            return dt.timedelta(0)
        return max(dt.timedelta(0), self.measured_at - self.oldest_available_at)

    @property
    def oldest_age_ms(self) -> int:
        return int(self.oldest_age / dt.timedelta(milliseconds=1))


async def oldest_due(cur: Any, namespace_id: bytes, queue_id: bytes,
                     now: dt.datetime) -> dt.datetime | None:
    """The smallest ``available_at`` of the queue's due WAITING tasks (two index reads)."""
    at = to_db(now)
    await cur.execute(OLDEST_HEAD, (namespace_id, queue_id, at, at))
    head = await cur.fetchone()
    if head is None:
        return None
    d0 = as_utc(head["dispatch_at"])
    upper = min(now, d0 + PRIORITY_AGING)
    await cur.execute(OLDEST_IN_WINDOW, (namespace_id, queue_id, to_db(d0), to_db(upper), at))
    row = await cur.fetchone()
    # The head is in the slice, unless a claim took it between the two reads (READ COMMITTED).
    return None if row["oldest"] is None else as_utc(row["oldest"])


async def backlog(cur: Any, namespace_id: bytes, queue_id: bytes, *,
                  count: bool = False) -> Backlog:
    """The queue's backlog now (database time); with ``count``, also how many tasks are due."""
    now = await db_now(cur)
    due = None
    if count:
        at = to_db(now)
        await cur.execute(DUE_COUNT, (namespace_id, queue_id, at, at))
        due = int((await cur.fetchone())["due"])
    return Backlog(measured_at=now, oldest_available_at=await oldest_due(cur, namespace_id,
                                                                          queue_id, now),
                   due_tasks=due)


@attrs.frozen(kw_only=True)
class QueueLag:
    namespace: str
    queue: str
    unfinished_tasks: int
    oldest_waiting: dt.timedelta


@attrs.frozen(kw_only=True)
class Snapshot:
    """Every queue's lag and counter, and the held permits of every namespace with queues."""

    measured_at: dt.datetime
    queues: tuple[QueueLag, ...]
    permits_held: dict[str, int]


async def read_snapshot(cur: Any) -> Snapshot:
    """One read of the whole installation: the queue table, two index reads per queue that has
    unfinished tasks, and the held permits by namespace."""
    now = await db_now(cur)
    await cur.execute(QUEUE_COUNTERS)
    rows = list(await cur.fetchall())
    lags = []
    for row in sorted(rows, key=lambda r: (r["namespace"], r["name"])):
        oldest = None
        if row["unfinished_tasks"] > 0:  # no unfinished task: nothing can be waiting
            oldest = await oldest_due(cur, row["namespace_id"], row["id"], now)
        age = dt.timedelta(0) if oldest is None else max(dt.timedelta(0), now - oldest)
        lags.append(QueueLag(namespace=row["namespace"], queue=row["name"],
                             unfinished_tasks=row["unfinished_tasks"], oldest_waiting=age))
    await cur.execute(PERMITS_HELD)
    held = {row["namespace"]: int(row["held"]) for row in await cur.fetchall()}
    permits = {lag.namespace: 0 for lag in lags} | held
    return Snapshot(measured_at=now, queues=tuple(lags), permits_held=permits)


# --- gauges ---------------------------------------------------------------------------------------


# The namespace and queue label of the collapsed series. Names start with [a-z0-9]
# (orbit_common/model/names.py), so no namespace or queue can be called this.
ALL = "_all"


def collapsed(snapshot: Snapshot) -> Snapshot:
    """The snapshot as one tenant-free series: the oldest wait is the maximum over every queue,
    unfinished tasks and held permits are sums (zero when there is no queue)."""
    oldest = max((lag.oldest_waiting for lag in snapshot.queues), default=dt.timedelta(0))
    unfinished = sum(lag.unfinished_tasks for lag in snapshot.queues)
    return Snapshot(measured_at=snapshot.measured_at,
                    queues=(QueueLag(namespace=ALL, queue=ALL, unfinished_tasks=unfinished,
                                     oldest_waiting=oldest),),
                    permits_held={ALL: sum(snapshot.permits_held.values())})


class UsageGauges:
    """The usage gauges, set from a :class:`Snapshot`. Label sets that disappear from the
    snapshot are removed, so a gauge never reports a queue that no longer exists. Without
    ``tenant_labels`` the snapshot is :func:`collapsed` first: one series, labelled
    :data:`ALL`.

    ``registry`` is for tests; by default the gauges live in the process-wide registry that
    ``/metrics`` serves (created once per process, on first use).
    """

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None, *,
                 tenant_labels: bool = True) -> None:
        if registry is None:
            self.oldest, self.unfinished, self.permits = _default_gauges()
        else:
            self.oldest, self.unfinished, self.permits = _make_gauges(registry)
        self.tenant_labels = tenant_labels
        self._queues: set[tuple[str, str]] = set()
        self._namespaces: set[str] = set()

    def set(self, snapshot: Snapshot) -> None:
        if not self.tenant_labels:
            snapshot = collapsed(snapshot)
        queues = set()
        for lag in snapshot.queues:
            labels = (lag.namespace, lag.queue)
            queues.add(labels)
            self.oldest.labels(*labels).set(lag.oldest_waiting.total_seconds())
            self.unfinished.labels(*labels).set(lag.unfinished_tasks)
        for gone in self._queues - queues:
            self.oldest.remove(*gone)
            self.unfinished.remove(*gone)
        for namespace, held in snapshot.permits_held.items():
            self.permits.labels(namespace).set(held)
        for gone_ns in self._namespaces - set(snapshot.permits_held):
            self.permits.remove(gone_ns)
        self._queues, self._namespaces = queues, set(snapshot.permits_held)

    async def refresh(self, db: Database) -> Snapshot:
        """Read a snapshot (one read-only transaction) and set the gauges from it."""
        snapshot = await db.read("usage.snapshot", read_snapshot)
        self.set(snapshot)
        return snapshot


Gauges = tuple[prometheus_client.Gauge, prometheus_client.Gauge, prometheus_client.Gauge]
_DEFAULT: list[Gauges] = []


def _make_gauges(registry: prometheus_client.CollectorRegistry) -> Gauges:
    return (
        prometheus_client.Gauge(
            "orbit_queue_oldest_waiting_seconds",
            "Age of the oldest due WAITING task of a queue (database time); 0 when none waits.",
            ["namespace", "queue"], registry=registry),
        prometheus_client.Gauge(
            "orbit_queue_unfinished_tasks",
            "Unfinished tasks of a queue (WAITING, LEASED, RUNNING, NEEDS_REVIEW): its counter.",
            ["namespace", "queue"], registry=registry),
        prometheus_client.Gauge(
            "orbit_permits_held",
            "Valid concurrency-key permits held in a namespace.",
            ["namespace"], registry=registry),
    )


def _default_gauges() -> Gauges:
    if not _DEFAULT:
        _DEFAULT.append(_make_gauges(prometheus_client.REGISTRY))
    return _DEFAULT[0]

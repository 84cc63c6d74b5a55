"""A queued backlog in Orbit's own tables, written fast, for ``orbit bench tasks --backlog N``.

Issue 12, target 3: claim and end-to-end throughput stay flat with a million tasks queued. The
backlog is what a submission writes for a WAITING task (orbit_common/pulse/tasks.py, steps 6
and 7): the ``pulse_tasks`` row (WAITING, revision 1, the queue's defaults frozen in), its
``task.accepted`` event in ``orbit_events`` (the receipt as payload), and the counters — the
queue's ``unfinished_tasks`` and, only while the application has a count limit
(``resources.TRACKED``), the application's. No idempotency records (the tasks carry no key) and
no concurrency keys.

Where it goes (:func:`split`): half in other queues of the namespace, which no worker serves;
half in the measured queues themselves (``kernel`` and ``bench``), *behind* the measured tasks.

How the backlog stays queued while the measured tasks run
    The claim reads ``ix_tasks_claim (namespace_id, queue_id, state, dispatch_at, available_at,
    id)`` in that order and takes only due tasks (``dispatch_at <= now AND available_at <=
    now``); ``dispatch_at`` is ``available_at`` less 30 s per priority level, so a priority-0
    task submitted later never sorts ahead of a due one submitted earlier. A due backlog in the
    measured queue would therefore be drained *before* the measured tasks, not behind them. The
    same-queue backlog is instead delayed work: accepted over the past day, available from a
    day after the run onwards (``available_at`` = now + 1 day + its position × spacing). It sits
    in the claim index after every measured task, and the claim's range ends before it, so the
    measured workers never take it, and the run ends when the measured tasks are SUCCEEDED.
    The other queues' backlog is due — accepted and available over the past day, every priority,
    a quarter with a deadline two days out — but nobody claims from those queues.

Speed: ids are made by the server (``RANDOM_BYTES(16)``, MySQL 8.4 and MariaDB 10.10+) into a
temporary table of one chunk, from a sequence that is a cross join of a ten-row digits derived
table (portable: no recursive CTE limit, no ``seq_`` engine); then one ``INSERT … SELECT`` of
the chunk's tasks (in primary-key order), one of their events (likewise) and the counter updates
commit together, chunk by chunk, on two connections in parallel (each seeds half of the queues;
the only row they share is the application's counter, updated last in each transaction).
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from orbit_common.db.pool import DatabaseUrl, connect_sync
from orbit_common.pulse import resources

CHUNK = 50_000
DAY_US = 86_400 * 1_000_000

DIGITS = ("(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3"
          " UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7"
          " UNION ALL SELECT 8 UNION ALL SELECT 9)")


def sequence_sql(count: int) -> str:
    """A derived table ``(SELECT n …)`` of the integers ``0 … count - 1`` (a cross join of
    digit tables, as many as ``count - 1`` has digits, filtered to ``n < count``)."""
    if count < 1:
        raise ValueError("a sequence needs at least one row")
    digits = len(str(count - 1))
    terms = " + ".join(f"d{k}.d * {10 ** k}" for k in range(digits))
    tables = " CROSS JOIN ".join(f"{DIGITS} d{k}" for k in range(digits))
    return f"(SELECT {terms} AS n FROM {tables}) s WHERE s.n < {int(count)}"


def split(total: int, other: list[str], same: list[str]) -> dict[str, int]:
    """How many backlog tasks each queue gets: half (rounded up) spread over ``other``, the
    rest over ``same``; the remainders go to the first queues of each list."""
    if total < 0 or not other or not same:
        raise ValueError("a backlog needs a size >= 0, other queues and the measured queues")
    shares: dict[str, int] = {}
    for names, part in ((other, total - total // 2), (same, total // 2)):
        for n, name in enumerate(names):
            shares[name] = part // len(names) + (1 if n < part % len(names) else 0)
    return shares


CREATE_IDS = """
CREATE TEMPORARY TABLE bench_backlog_ids (
  seq INT NOT NULL COMMENT '本批内序号（基准测试专用临时表）',
  id BINARY(16) NOT NULL COMMENT '任务 ID（基准测试专用临时表）',
  event_id BINARY(16) NOT NULL COMMENT '任务的受理事件 ID（基准测试专用临时表）',
  PRIMARY KEY (seq)
) ENGINE=InnoDB COMMENT='基准测试：积压造数时一批任务的 ID'
"""
FILL_IDS = ("INSERT INTO bench_backlog_ids (seq, id, event_id)"
            " SELECT s.n, RANDOM_BYTES(16), RANDOM_BYTES(16) FROM {}")

# Parameters: created base, created spacing (µs), available base, available spacing (µs),
# priority modulus (1: all priority 0), deadline every k-th task (0: none), namespace, queue.
# ``position`` is the task's place in the queue's whole backlog (chunk offset + seq).
INSERT_TASKS = """
INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, revision, priority,
  available_at, deadline_at, max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier,
  retry_jitter, offer_lease_ms, execution_lease_ms, rerun_safe, created_at, updated_at)
SELECT q.namespace_id, b.id, q.id, 'noop', '{}', 'WAITING', 1, MOD(b.seq + %s, %s),
  %s + INTERVAL ((b.seq + %s) * %s) MICROSECOND,
  CASE WHEN %s > 0 AND MOD(b.seq + %s, %s) = 0
       THEN %s + INTERVAL ((b.seq + %s) * %s) MICROSECOND + INTERVAL 2 DAY END,
  q.max_attempts, q.retry_initial_ms, q.retry_max_ms, q.retry_multiplier, q.retry_jitter,
  q.offer_lease_ms, q.execution_lease_ms, 0,
  %s + INTERVAL ((b.seq + %s) * %s) MICROSECOND, %s + INTERVAL ((b.seq + %s) * %s) MICROSECOND
FROM bench_backlog_ids b JOIN pulse_queues q ON q.namespace_id = %s AND q.id = %s
ORDER BY b.id
"""
# The receipt of tasks.receipt_view as the event's payload, built by the server.
INSERT_EVENTS = """
INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id, aggregate_revision,
  event_type, from_state, to_state, payload, occurred_at)
SELECT t.namespace_id, b.event_id, 'task', t.id, 1, 'task.accepted', NULL, 'WAITING',
  JSON_OBJECT('id', LOWER(HEX(t.id)), 'queue', %s, 'handler', t.handler, 'state', 'WAITING',
              'priority', t.priority, 'business_key', NULL, 'concurrency_key', NULL,
              'created_at', CONCAT(REPLACE(CAST(t.created_at AS CHAR), ' ', 'T'), '+00:00'),
              'available_at', CONCAT(REPLACE(CAST(t.available_at AS CHAR), ' ', 'T'), '+00:00'),
              'deadline_at', CASE WHEN t.deadline_at IS NOT NULL THEN
                CONCAT(REPLACE(CAST(t.deadline_at AS CHAR), ' ', 'T'), '+00:00') END,
              'start_deadline_at', NULL, 'rerun_safe', JSON_EXTRACT('false', '$'), 'revision', 1),
  t.created_at
FROM bench_backlog_ids b JOIN pulse_tasks t ON t.namespace_id = %s AND t.id = b.id
ORDER BY b.event_id
"""
QUEUE_COUNTER = ("UPDATE pulse_queues SET unfinished_tasks = unfinished_tasks + %s"
                 " WHERE namespace_id = %s AND id = %s")
APPLICATION_COUNTER = ("UPDATE orbit_application_resources SET unfinished_tasks ="
                       f" unfinished_tasks + %s WHERE application_id = %s AND {resources.TRACKED}")


def _queue_ids(cur: Any, namespace: str) -> tuple[bytes, bytes, dict[str, bytes]]:
    cur.execute("SELECT id, application_id FROM orbit_namespaces WHERE name = %s", (namespace,))
    namespace_id, application_id = cur.fetchone()
    cur.execute("SELECT name, id FROM pulse_queues WHERE namespace_id = %s", (namespace_id,))
    return namespace_id, application_id, dict(cur.fetchall())


@attrs.frozen(kw_only=True)
class _Target:
    namespace_id: bytes
    application_id: bytes
    now: dt.datetime


def _seed_queues(url: DatabaseUrl, target: _Target, queues: list[tuple[str, bytes, int, bool]],
                 ) -> None:
    """Queue the backlog of ``queues`` (name, id, count, behind the measured tasks?) on one
    connection of its own, a chunk per transaction."""
    conn = connect_sync(url)
    try:
        with conn.cursor() as cur:
            cur.execute(CREATE_IDS)
            past = target.now - dt.timedelta(days=1)
            for name, queue_id, count, behind in queues:
                spacing = max(1, DAY_US // count)  # the queue's backlog spans one day
                if behind:  # accepted over the past day, due a day after the run
                    created, available = past, target.now + dt.timedelta(days=1)
                    priorities, deadline_every = 1, 0
                else:  # accepted and due over the past day
                    created, available = past, past
                    priorities, deadline_every = 10, 4
                for offset in range(0, count, CHUNK):
                    size = min(CHUNK, count - offset)
                    cur.execute("DELETE FROM bench_backlog_ids")
                    cur.execute(FILL_IDS.format(sequence_sql(size)))
                    cur.execute(INSERT_TASKS, (
                        offset, priorities, available, offset, spacing,
                        deadline_every, offset, max(deadline_every, 1), available, offset,
                        spacing, created, offset, spacing, created, offset, spacing,
                        target.namespace_id, queue_id))
                    if cur.rowcount != size:
                        raise RuntimeError(f"backlog: {cur.rowcount} of {size} tasks inserted")
                    cur.execute(INSERT_EVENTS, (name, target.namespace_id))
                    cur.execute(QUEUE_COUNTER, (size, target.namespace_id, queue_id))
                    cur.execute(APPLICATION_COUNTER, (size, target.application_id))
                    conn.commit()
            cur.execute("DROP TEMPORARY TABLE bench_backlog_ids")
    finally:
        conn.close()


def seed(url: DatabaseUrl, namespace: str, other: list[str], same: list[str],
         total: int, connections: int = 2) -> dict[str, Any]:
    """Queue ``total`` WAITING tasks (the module docstring) in ``namespace``'s queues over
    ``connections`` parallel connections (each takes every ``connections``-th queue); returns
    the seconds it took and the shares."""
    shares = split(total, other, same)
    started = time.perf_counter()
    conn = connect_sync(url)
    try:
        with conn.cursor() as cur:
            namespace_id, application_id, queue_ids = _queue_ids(cur, namespace)
            cur.execute("SELECT UTC_TIMESTAMP(6)")
            target = _Target(namespace_id=namespace_id, application_id=application_id,
                             now=cur.fetchone()[0])
    finally:
        conn.close()
    work = [(name, queue_ids[name], count, name in same)
            for name, count in shares.items() if count]
    with ThreadPoolExecutor(connections) as pool:
        for done in [pool.submit(_seed_queues, url, target, work[n::connections])
                     for n in range(connections) if work[n::connections]]:
            done.result()
    return {"backlog": total, "backlog_seed_s": round(time.perf_counter() - started, 1),
            "backlog_shares": shares}

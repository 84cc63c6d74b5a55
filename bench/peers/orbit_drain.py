"""Orbit's two figures for ``orbit bench peers``, each on a fresh database of the same server.

- **drain** (like with like): N no-op tasks submitted through the API with no worker connected,
  InnoDB's purge of the submit waited out, then the SDK workers start (as in ``orbit bench
  tasks``: W processes, C concurrent handlers each) and the drain is timed from the first claim
  (``MIN(pulse_attempts.offered_at)``) to the last finish (``MAX(pulse_tasks.updated_at)``),
  both database time;
- **submit while draining**: ``orbit bench tasks``' end-to-end phase unchanged (workers first,
  the tasks submitted while they run; its ``tasks_per_s``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.tasks import _end_to_end, _Phase, _submit_all, _wait_purged, wait_succeeded
from orbit_common.db.pool import DatabaseUrl, connect_sync

BENCH_TASKS = ("SELECT t.id, t.namespace_id, t.state, t.updated_at FROM pulse_tasks t"
               " JOIN pulse_queues q ON q.namespace_id = t.namespace_id AND q.id = t.queue_id"
               " WHERE q.name = 'bench'")


def _drain_seconds(url: DatabaseUrl, tasks: int, timeout: float = 900) -> float:
    """Wait until ``tasks`` bench tasks SUCCEEDED; the first claim to the last finish."""
    conn = connect_sync(url, autocommit=True)
    try:
        wait_succeeded(conn, tasks, timeout)
        with conn.cursor() as cur:
            cur.execute(f"SELECT TIMESTAMPDIFF(MICROSECOND, MIN(a.offered_at), MAX(b.updated_at))"
                        f" FROM ({BENCH_TASKS}) b JOIN pulse_attempts a"
                        " ON a.namespace_id = b.namespace_id AND a.task_id = b.id")
            return int(cur.fetchone()[0]) / 1e6
    finally:
        conn.close()


def drain(server: DatabaseUrl, logs: Path, db_pid: int | None, tasks: int, workers: int,
          concurrency: int) -> float:
    """Tasks/s of the drain of ``tasks`` tasks submitted before any worker connected."""
    phase = _Phase(server, 1, logs, db_pid)
    try:
        key, namespace = phase.tenants[0]
        asyncio.run(_submit_all(phase.api, key, namespace, tasks, None))
        _wait_purged(phase.url)
        phase.start_workers(workers, concurrency)
        return round(tasks / _drain_seconds(phase.url, tasks), 1)
    finally:
        phase.close()


def submit_while_draining(server: DatabaseUrl, logs: Path, db_pid: int | None, tasks: int,
                          workers: int, concurrency: int) -> float:
    """``orbit bench tasks``' end-to-end ``tasks_per_s`` (no rate, no keys, one application)."""
    phase = _Phase(server, 1, logs, db_pid)
    try:
        return float(_end_to_end(phase, tasks, workers, None, concurrency, 0)["tasks_per_s"])
    finally:
        phase.close()

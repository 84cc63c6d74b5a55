"""``orbit bench latency``: start latency at half the measured maximum rate (issue 12, target 4).

Target: p99 submit → start < 50 ms at half of the measured maximum end-to-end rate, in 8 of 10
consecutive runs. Steps: the maximum rate is the end-to-end throughput of N tasks submitted as
fast as the API takes them (bench/tasks.py's ``_end_to_end``, rate unset), unless given with
``--max-rate``; then ``runs`` consecutive runs of N tasks submitted at half that rate, each on a
fresh database with its own API, dispatcher and workers (so no run inherits another's rows or
undo history). Start latency is ``attempt.started_at - task.created_at``, both database time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.common import bench_server
from bench.tasks import _end_to_end, _Phase, _wait_purged
from orbit_common.db.pool import DatabaseUrl

TARGET_MS = 50.0
REQUIRED = 8  # of 10 runs


def summary(p99s: list[float], target_ms: float = TARGET_MS,
            required_share: float = REQUIRED / 10) -> dict[str, Any]:
    """How many runs had p99 under ``target_ms``, and whether that is enough (8 of 10, or the
    same share of another number of runs, rounded up)."""
    under = sum(1 for p in p99s if p < target_ms)
    needed = math.ceil(round(required_share * len(p99s), 6))
    return {"runs": len(p99s), "runs_under_50ms": under, "runs_needed": needed,
            "target_met": bool(p99s) and under >= needed}


def _one(server: DatabaseUrl, logs: Path, db_pid: int | None, tasks: int, workers: int,
         rate: float | None, concurrency: int) -> dict[str, Any]:
    _wait_purged(server.with_database(""))
    phase = _Phase(server, 1, logs, db_pid)
    try:
        return _end_to_end(phase, tasks, workers, rate, concurrency, 0)
    finally:
        phase.close()


def run(url_text: str | None, tasks: int, runs: int, workers: int, concurrency: int,
        max_rate: float | None = None) -> dict[str, Any]:
    """The maximum rate (measured unless given), then ``runs`` runs at half of it."""
    with bench_server(url_text, "orbit-bench-latency-") as where:
        server, logs, db_pid = where.server, where.logs, where.db_pid
        measured = max_rate is None
        if max_rate is None:
            max_rate = _one(server, logs, db_pid, tasks, workers, None, concurrency)[
                "tasks_per_s"]
        rate = round(max_rate / 2, 1)
        results = [_one(server, logs, db_pid, tasks, workers, rate, concurrency)
                   for _ in range(runs)]
        p99s = [r["start_p99_ms"] for r in results]
        return {
            "tasks": tasks, "workers": workers, "worker_concurrency": concurrency,
            "max_rate": max_rate, "max_rate_measured": measured, "rate": rate,
            "start_p99_ms": p99s,
            "start_p50_ms": [r["start_p50_ms"] for r in results],
            "tasks_per_s": [r["tasks_per_s"] for r in results],
            **summary(p99s),
        }

"""``orbit bench workflows --waits``: timers and signals at volume (issue 15).

Each phase runs on a fresh database with its own API, dispatcher, SDK no-op workers and one
engine (bench/workflows.py's ``_WorkflowPhase``). Figures come from the database (database time).

1. **timers** -- N instances of ``TIMER (until input.at) → SUCCEED``, every ``at`` the same whole
   second ``due``, chosen after a calibration run of starts so that every instance is started
   (its wait written) before it: ``timers_all_fired_s`` is the last ``fired_at`` minus ``due``;
   ``timer_lateness_p50_ms`` / ``_p99_ms`` the waits' ``late_ms`` (fired_at - deadline);
   ``timers_early`` counts waits fired before their deadline (must be 0);
   ``timers_started_late`` counts waits written after ``due`` (the calibration missed; their
   lateness then includes the start); ``timer_duplicates`` counts instances with more than one
   advance event that completed the timer step, plus waits fired beyond one per instance (must
   be 0). The timer's step is the instance's last wait: what is measured is the firing (each
   instance then ends), not a task after it (``orbit bench workflows`` measures those).
2. **signals** -- bench/signals.py's phases on a fresh database (read its docstring): N single-task
   submissions and N signals through the HTTP API from the same concurrent clients
   (``signal_ratio`` = signals accepted per second ÷ tasks submitted per second, same run), then
   signals at half that rate: ``signal_advance_p50_ms`` / ``_p99_ms`` (signal accepted → its
   SIGNAL step ended, database time); ``signal_duplicates`` must be 0.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import signals
from bench.common import bench_server, percentile
from bench.tasks import _wait_purged
from bench.workflows import _one, _wait_finished, _WorkflowPhase, audit
from orbit_common.db.pool import DatabaseUrl, connect_sync

CALIBRATION = 300


def timer_document() -> dict[str, Any]:
    return {"format": "orbit.weave/1",
            "input_schema": {"type": "object", "properties": {"at": {"type": "string"}}},
            "start": "wait", "steps": {
                "wait": {"kind": "TIMER", "until": "input.at", "next": "done"},
                "done": {"kind": "SUCCEED"}}}


def _instant() -> dict[str, Any]:
    return {"format": "orbit.weave/1", "start": "done", "steps": {"done": {"kind": "SUCCEED"}}}


def _db_now(conn: Any) -> datetime:
    found: datetime = _one(conn, "SELECT UTC_TIMESTAMP(6)")
    return found.replace(tzinfo=UTC)


def _timers(server: DatabaseUrl, logs: Path, db_pid: int | None, count: int) -> dict[str, Any]:
    phase = _WorkflowPhase(server, logs, db_pid, {"timer": timer_document(),
                                                   "instant": _instant()})
    try:
        conn = connect_sync(phase.phase.url, autocommit=True)
        try:
            rate = phase.start("instant", CALIBRATION)
            # Every wait written before the due second: the calibrated start time, doubled (the
            # engine firing nothing yet, the timer starts cost about what the calibration's do).
            due = (_db_now(conn) + timedelta(seconds=2 * count / rate + 5)).replace(
                microsecond=0) + timedelta(seconds=1)
            at = due.isoformat().replace("+00:00", "Z")
            phase.start("timer", count, inputs=lambda _n: {"at": at})
            _wait_finished(conn, CALIBRATION + count)
            with conn.cursor() as cur:
                cur.execute("SELECT fired_at, late_ms, created_at, deadline_at FROM weave_waits"
                            " WHERE kind = 'TIMER'")
                waits = cur.fetchall()
            found = audit(conn)
            with conn.cursor() as cur:
                cur.execute("SELECT aggregate_id, payload FROM orbit_events"
                            " WHERE aggregate_type = 'workflow_instance'"
                            " AND event_type <> 'workflow.started'")
                completions: dict[bytes, int] = {}
                for instance_id, payload in cur.fetchall():
                    if "wait" in json.loads(payload).get("completed", []):
                        completions[instance_id] = completions.get(instance_id, 0) + 1
        finally:
            conn.close()
    finally:
        phase.close()
    fired = [w for w in waits if w[0] is not None]
    naive_due = due.replace(tzinfo=None)
    last = max((w[0] for w in fired), default=naive_due)
    lateness = [float(w[1]) for w in fired]
    return {"timers": count, "timer_due": at, "timers_fired": len(fired),
            "timers_all_fired_s": round((last - naive_due).total_seconds(), 2),
            "timer_lateness_p50_ms": round(percentile(lateness, 0.5), 1),
            "timer_lateness_p99_ms": round(percentile(lateness, 0.99), 1),
            "timers_early": sum(1 for w in fired if w[0] < w[3]),
            "timers_started_late": sum(1 for w in waits if w[2] > naive_due),
            "timer_duplicates": (sum(n - 1 for n in completions.values())
                                 + max(0, len(fired) - count)),
            "timers_completed_once": sum(1 for n in completions.values() if n == 1),
            "timer_instances_finished": found["finished"] - CALIBRATION}


def run(url_text: str | None, count: int) -> dict[str, Any]:
    with bench_server(url_text, "orbit-bench-waits-") as where:
        server, logs, db_pid = where.server, where.logs, where.db_pid
        timers = _timers(server, logs, db_pid, count)
        _wait_purged(server.with_database(""))
        found = signals.measure(server, logs, db_pid, count)
    return {**found, **timers, "instances": count}

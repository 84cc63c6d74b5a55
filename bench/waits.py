"""``orbit bench workflows --waits``: timers and signals at volume (issue 15).

Each phase runs on a fresh database with its own API, dispatcher, SDK no-op workers and one
engine (bench/workflows.py's ``_WorkflowPhase``). Figures come from the database (database time).

1. **timers** -- N instances of ``TIMER (until input.at) → TASK → SUCCEED``, every ``at`` the same
   whole second ``due``, chosen after a calibration run of starts so that every instance is
   started (its wait written) before it: ``timers_all_fired_s`` is the last ``fired_at`` minus
   ``due``; ``timer_lateness_p50_ms`` / ``_p99_ms`` the waits' ``late_ms`` (fired_at - deadline);
   ``timers_early`` counts waits fired before their deadline (must be 0);
   ``timers_started_late`` counts waits written after ``due`` (the calibration missed; their
   lateness then includes the start); ``timer_duplicates`` is bench/workflows.py's ``audit``
   (a step with two activations, a task two activations name, a workflow task no activation
   names) plus waits fired more than once (must be 0).
2. **signals** -- N instances of ``SIGNAL (go, correlation input.key) → SUCCEED`` started and
   waiting; then, through the HTTP API with SENDERS concurrent clients, N single-task
   submissions (``POST …/tasks``, one task per request, to a queue no worker serves) and N
   signals (``POST …/workflows/{id}/signals``, one per instance): ``signal_ratio`` = signals
   accepted per second ÷ tasks submitted per second, same run, same clients. Then N more
   instances, waiting, and one signal each at half the signal rate: ``signal_advance_p50_ms`` /
   ``_p99_ms`` are each signal's ``resolved_at`` (the advance that consumed it and moved its
   step, database time) minus its ``accepted_at``. ``signal_duplicates`` counts waits with a
   second consumed signal and signals consumed twice (must be 0).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import bench_server, percentile, poll_until
from bench.tasks import _wait_purged
from bench.workflows import _one, _wait_finished, _WorkflowPhase, audit
from orbit_common.db.pool import DatabaseUrl, connect_sync

SENDERS = 8
CALIBRATION = 300


def timer_document() -> dict[str, Any]:
    return {"format": "orbit.weave/1",
            "input_schema": {"type": "object", "properties": {"at": {"type": "string"}}},
            "start": "wait", "steps": {
                "wait": {"kind": "TIMER", "until": "input.at", "next": "work"},
                "work": {"kind": "TASK", "queue": "bench", "handler": "noop", "next": "done"},
                "done": {"kind": "SUCCEED"}}}


def signal_document() -> dict[str, Any]:
    return {"format": "orbit.weave/1",
            "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}},
            "start": "wait", "steps": {
                "wait": {"kind": "SIGNAL", "signal": "go", "correlation": "input.key",
                         "next": "done"},
                "done": {"kind": "SUCCEED"}}}


def _instant() -> dict[str, Any]:
    return {"format": "orbit.weave/1", "start": "done", "steps": {"done": {"kind": "SUCCEED"}}}


def _db_now(conn: Any) -> datetime:
    return _one(conn, "SELECT UTC_TIMESTAMP(6)").replace(tzinfo=UTC)


def _timers(server: DatabaseUrl, logs: Path, db_pid: int | None, count: int, workers: int,
            concurrency: int) -> dict[str, Any]:
    phase = _WorkflowPhase(server, logs, db_pid, {"timer": timer_document(),
                                                   "instant": _instant()})
    try:
        phase.phase.start_workers(workers, concurrency)
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
            "timer_duplicates": found["duplicates"] + max(0, len(fired) - count),
            "timer_instances_finished": found["finished"] - CALIBRATION}


async def _send(api: str, key: str, requests: list[tuple[str, dict[str, Any]]],
                rate: float | None) -> float:
    """POST each (path, body) from SENDERS clients (``rate`` per second at most); returns the
    requests per second. Any answer but 2xx stops the bench."""
    started = time.perf_counter()
    numbered = iter(enumerate(requests))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def sender() -> None:
            for n, (path, body) in numbered:
                if rate is not None:
                    await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
                async with session.post(api + path, json=body) as response:
                    if response.status // 100 != 2:
                        raise RuntimeError(f"{response.status}: {await response.text()}")
                    await response.read()

        await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return len(requests) / (time.perf_counter() - started)


def _waiting(conn: Any, count: int) -> None:
    poll_until(lambda: int(_one(conn, "SELECT COUNT(*) FROM weave_waits"
                                      " WHERE kind = 'SIGNAL' AND state = 'WAITING'")),
               lambda n: n >= count, f"{count} signal waits", 600)


def _signal_requests(conn: Any, namespace: str, skip: int) -> list[tuple[str, dict[str, Any]]]:
    with conn.cursor() as cur:
        cur.execute("SELECT i.id, i.input FROM weave_instances i JOIN weave_waits w"
                    " ON w.namespace_id = i.namespace_id AND w.instance_id = i.id"
                    " WHERE w.kind = 'SIGNAL' AND w.state = 'WAITING'"
                    " ORDER BY i.created_at, i.id")
        rows = cur.fetchall()[skip:]
    return [(f"/v1/namespaces/{namespace}/workflows/{instance_id.hex()}/signals",
             {"name": "go", "correlation_key": json.loads(text)["key"],
              "payload": {"n": n}, "payload_version": 1})
            for n, (instance_id, text) in enumerate(rows)]


def _signals(server: DatabaseUrl, logs: Path, db_pid: int | None, count: int) -> dict[str, Any]:
    phase = _WorkflowPhase(server, logs, db_pid, {"signal": signal_document()})
    api, key, namespace = phase.phase.api, phase.api_key, phase.namespace
    try:
        conn = connect_sync(phase.phase.url, autocommit=True)
        try:
            phase.start("signal", count, inputs=lambda n: {"key": f"k{n}"})
            _waiting(conn, count)
            tasks = [(f"/v1/namespaces/{namespace}/tasks",
                      {"queue": "kernel", "handler": "noop", "input": {"n": n}})
                     for n in range(count)]
            submit_rate = asyncio.run(_send(api, key, tasks, None))
            signal_rate = asyncio.run(_send(api, key, _signal_requests(conn, namespace, 0),
                                            None))
            _wait_finished(conn, count)
            phase.start("signal", count, inputs=lambda n: {"key": f"l{n}"})
            _waiting(conn, count)
            half = signal_rate / 2
            asyncio.run(_send(api, key, _signal_requests(conn, namespace, 0), half))
            _wait_finished(conn, 2 * count)
            with conn.cursor() as cur:
                cur.execute("SELECT TIMESTAMPDIFF(MICROSECOND, accepted_at, resolved_at)"
                            " FROM weave_signals WHERE state = 'CONSUMED'"
                            " ORDER BY accepted_at DESC LIMIT %s", (count,))
                lags = [int(r[0]) / 1000 for r in cur.fetchall()]
            twice = int(_one(conn, "SELECT COUNT(*) FROM (SELECT 1 FROM weave_signals"
                                   " WHERE state = 'CONSUMED' GROUP BY namespace_id, wait_id"
                                   " HAVING COUNT(*) > 1) x"))
            found = audit(conn)
        finally:
            conn.close()
    finally:
        phase.close()
    return {"signals": 2 * count, "submit_per_s": round(submit_rate, 1),
            "signals_per_s": round(signal_rate, 1),
            "signal_ratio": round(signal_rate / submit_rate, 3),
            "signal_latency_rate_per_s": round(half, 1),
            "signal_advance_p50_ms": round(percentile(lags, 0.5), 1),
            "signal_advance_p99_ms": round(percentile(lags, 0.99), 1),
            "signal_duplicates": twice + found["duplicates"],
            "signal_instances_finished": found["finished"]}


def run(url_text: str | None, count: int, workers: int, concurrency: int) -> dict[str, Any]:
    with bench_server(url_text, "orbit-bench-waits-") as where:
        server, logs, db_pid = where.server, where.logs, where.db_pid
        timers = _timers(server, logs, db_pid, count, workers, concurrency)
        _wait_purged(server.with_database(""))
        signals = _signals(server, logs, db_pid, count)
    return {"instances": count, **timers, **signals}

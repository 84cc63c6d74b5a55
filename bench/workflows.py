"""``orbit bench workflows``: workflow steps end to end against plain tasks (issue 14).

Every phase runs on a fresh database with its own API, dispatcher and SDK no-op workers
(bench/tasks.py's ``_Phase``); the workflow phases add one engine (``orbit weave``):

1. **plain** -- N no-op tasks end to end: the reference throughput (``plain_tasks_per_s``).
2. **linear** -- N/3 instances of a 3-step linear workflow (TASK → TASK → TASK → SUCCEED, the
   tasks no-ops on the same queue), started through the API's batch start (100 a request,
   like the plain phase's batch submissions) as fast as the starters go;
   ``linear_steps_per_s`` is the workflow tasks over the time from the first instance's start
   to the last instance's end (database time).
3. **parallel** -- N/10 instances of a 10-branch PARALLEL workflow (each branch one TASK, the
   join ALL_SUCCEED, then SUCCEED): ``parallel_steps_per_s`` likewise.
4. **latency** -- linear instances started at half of ``linear_steps_per_s`` (in steps),
   through the same batch start as the throughput phases, paced (``paced_batch``): a request
   every 1/``START_HZ`` s (10 a second) carrying that interval's instances:
   ``advance_p50_ms`` / ``advance_p99_ms`` are, for each task after the first of an instance,
   its ``created_at`` minus the commit of the previous task's result (its result event's
   ``committed_at``, the last row the ending transaction writes before its commit): result
   commit → next task created. ``advance_p99_ms_from_inbox`` measures from the inbox row's
   ``created_at`` instead, written earlier in the same transaction (before its counters).
   ``latency_cpu_busy`` is the share of the machine's cores the phase's processes used (the
   API, dispatcher, workers, engine and the bench's database; the bench's starter not
   counted), which shows whether half the rate is about half the load.
5. **latency, single starts** -- the same at the same rate, but one instance per start request
   (``advance_p50_ms_single_starts``, ``advance_p99_ms_single_starts``,
   ``latency_cpu_busy_single_starts``): what the latency is when the application does not
   batch its starts. A single start costs the API and the database ~15 round trips, so at this
   rate the starts alone take a large share of the two cores (bench/RESULTS.md).

``steps_ratio`` is the smaller of the two workflow rates over ``plain_tasks_per_s``.
``instances_finished`` counts SUCCEEDED instances over all workflow phases (it must equal
``instances_started``); ``duplicate_steps`` counts steps with more than one activation and
activations with more than one task, plus workflow tasks no activation references (must be 0).
``engine_cpu_us_per_step`` is the engine process's CPU over the linear and parallel phases per
workflow task; ``cpu_us_per_step_linear`` / ``_parallel`` give every process's CPU (by role: api,
dispatcher, workers, engine, the bench's own database) per workflow task in those phases (the
starts included: the API's batch start), beside the plain
phase's ``cpu_us_per_task_plain``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    bench_server,
    cpu_seconds,
    free_port,
    paced_batch,
    percentile,
    poll_until,
    wait_ready,
)
from bench.tasks import _end_to_end, _Phase, _wait_purged
from orbit_common.db.pool import DatabaseUrl, connect_sync, open_database
from orbit_common.platform import credentials
from orbit_common.weave import definitions

BRANCHES = 10
STARTERS = 4
START_HZ = 10  # the latency phase's start requests per second
START_BATCH = 100  # the batch start's limit (orbit_common.weave.starts.MAX_BATCH)


def linear_document() -> dict[str, Any]:
    step = {"kind": "TASK", "queue": "bench", "handler": "noop"}
    return {"format": "orbit.weave/1", "start": "a", "steps": {
        "a": {**step, "next": "b"}, "b": {**step, "next": "c"}, "c": {**step, "next": "done"},
        "done": {"kind": "SUCCEED"}}}


def parallel_document(branches: int = BRANCHES) -> dict[str, Any]:
    return {"format": "orbit.weave/1", "start": "fan", "steps": {
        "fan": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "done",
                "branches": [{"name": f"b{n}", "start": f"t{n}", "steps": {
                    f"t{n}": {"kind": "TASK", "queue": "bench", "handler": "noop",
                              "next": f"e{n}"},
                    f"e{n}": {"kind": "SUCCEED"}}} for n in range(branches)]},
        "done": {"kind": "SUCCEED"}}}


class _WorkflowPhase:
    """A ``_Phase`` with both definitions published and one engine running."""

    def __init__(self, server: DatabaseUrl, logs: Path, db_pid: int | None,
                 documents: dict[str, dict[str, Any]] | None = None) -> None:
        """``documents``: the definitions to publish by name (default: linear, parallel)."""
        self.phase = _Phase(server, 1, logs, db_pid)
        self.api_key, self.namespace = self.phase.tenants[0]
        self.documents = documents or {"linear": linear_document(),
                                       "parallel": parallel_document()}
        asyncio.run(self._define())
        ops = free_port()
        self.phase._spawn("engine", [sys.executable, "-m", "orbit_cli", "weave"], {
            "ORBIT_SERVICE_METRICS_PORT": str(ops), "ORBIT_SERVICE_LOG_LEVEL": "WARNING"})
        self.engine = self.phase.procs[-1]
        wait_ready(f"http://127.0.0.1:{ops}/readyz")

    async def _define(self) -> None:
        db = await open_database(self.phase.url, minsize=1, maxsize=2)
        try:
            who = await db.read("bench.auth",
                                lambda cur: credentials.authenticate(cur, self.api_key))
            for name, document in self.documents.items():
                await definitions.create_definition(db, who, namespace=self.namespace,
                                                    name=name)
                await definitions.publish_version(db, who, namespace=self.namespace, name=name,
                                                  revision=1,
                                                  document=json.dumps(document).encode())
        finally:
            await db.close()

    def start(self, definition: str, count: int, rate: float | None = None,
              inputs: Callable[[int], dict[str, Any]] | None = None,
              per_request: int = START_BATCH) -> float:
        """Start ``count`` instances of ``definition`` (``rate`` per second at most) through
        the API's batch start (``POST …/workflows/batch``, ``per_request`` a request, from
        STARTERS concurrent clients -- as the plain phase submits its tasks in batches);
        instance ``n``'s input is ``inputs(n)`` (default ``{"n": n}``). Returns the starts per
        second."""
        return asyncio.run(_start_all(self.phase.api, self.api_key, self.namespace,
                                      definition, count, rate, inputs, per_request))

    def close(self) -> None:
        self.phase.close()


async def _start_all(api: str, api_key: str, namespace: str, definition: str,
                     count: int, rate: float | None,
                     inputs: Callable[[int], dict[str, Any]] | None = None,
                     per_request: int = START_BATCH) -> float:
    url = f"{api}/v1/namespaces/{namespace}/workflows/batch"
    batch = max(1, min(START_BATCH, per_request))
    chunks = iter(range(0, count, batch))
    started = time.monotonic()

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {api_key}"}) as session:

        async def starter() -> None:
            for first in chunks:
                if rate is not None:
                    wait = started + first / rate - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                items = [{"definition": definition,
                          "input": inputs(n) if inputs else {"n": n}}
                         for n in range(first, min(count, first + batch))]
                async with session.post(url, json={"instances": items}) as response:
                    if response.status != 201:
                        raise RuntimeError(await response.text())

        await asyncio.gather(*(starter() for _ in range(STARTERS)))
    return count / (time.monotonic() - started)


def _one(conn: Any, sql: str, *params: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def _wait_finished(conn: Any, count: int, timeout: float = 900) -> None:
    def ended() -> tuple[int, int]:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*), COALESCE(SUM(state <> 'SUCCEEDED'), 0)"
                        " FROM weave_instances WHERE state <> 'RUNNING'")
            total, bad = cur.fetchone()
        if bad:
            raise RuntimeError(f"{bad} workflow instances ended other than SUCCEEDED")
        return int(total), int(bad)

    poll_until(ended, lambda found: found[0] >= count, f"{count} instances finished", timeout)


def _steps_per_s(conn: Any) -> tuple[int, float]:
    """Workflow tasks and their rate: first instance created → last instance completed."""
    steps = _one(conn, "SELECT COUNT(*) FROM pulse_tasks WHERE owner_kind = 'WORKFLOW'")
    elapsed_us = _one(conn, "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at),"
                            " MAX(completed_at)) FROM weave_instances")
    return int(steps), int(steps) / (int(elapsed_us) / 1e6)


def audit(conn: Any) -> dict[str, int]:
    """Instances by state and every way a step could have run twice."""
    with conn.cursor() as cur:
        cur.execute("SELECT state, COUNT(*) FROM weave_instances GROUP BY state")
        by_state = {state: int(n) for state, n in cur.fetchall()}
    twice = _one(conn, "SELECT COUNT(*) FROM (SELECT 1 FROM weave_activations"
                       " GROUP BY namespace_id, instance_id, step_id HAVING COUNT(*) > 1) x")
    shared = _one(conn, "SELECT COUNT(*) FROM (SELECT 1 FROM weave_activations"
                        " WHERE task_id IS NOT NULL GROUP BY namespace_id, task_id"
                        " HAVING COUNT(*) > 1) x")
    orphans = _one(conn, "SELECT COUNT(*) FROM pulse_tasks t WHERE t.owner_kind = 'WORKFLOW'"
                         " AND NOT EXISTS (SELECT 1 FROM weave_activations a"
                         " WHERE a.namespace_id = t.namespace_id AND a.task_id = t.id)")
    return {"started": sum(by_state.values()), "finished": by_state.get("SUCCEEDED", 0),
            "duplicates": int(twice) + int(shared) + int(orphans)}


def advance_lags(conn: Any, since: str = "result") -> list[float]:
    """Per instance, tasks in creation order: each task's creation minus the commit of the
    previous task's result, in ms. ``since``: ``result`` -- the result event's
    ``committed_at`` (the ending transaction's last row); ``inbox`` -- the inbox row's
    ``created_at`` (written before the counters of the same transaction)."""
    stamp = {"result": ("orbit_result_events", "committed_at", "state"),
             "inbox": ("weave_inbox", "created_at", "task_state")}[since]
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT t.owner_id, t.created_at, r.{stamp[1]} FROM pulse_tasks t"
            f" LEFT JOIN {stamp[0]} r ON r.namespace_id = t.namespace_id AND r.task_id = t.id"
            f" AND r.{stamp[2]} = 'SUCCEEDED' WHERE t.owner_kind = 'WORKFLOW'"
            " ORDER BY t.owner_id, t.created_at")
        rows = cur.fetchall()
    lags: list[float] = []
    previous: tuple[Any, Any] | None = None
    for owner, created, result_at in rows:
        if previous is not None and previous[0] == owner and previous[1] is not None:
            lags.append((created - previous[1]).total_seconds() * 1000)
        previous = (owner, result_at)
    return lags


def _throughput(server: DatabaseUrl, logs: Path, db_pid: int | None, definition: str,
                instances_count: int, workers: int, concurrency: int) -> dict[str, Any]:
    phase = _WorkflowPhase(server, logs, db_pid)
    try:
        phase.phase.start_workers(workers, concurrency)
        cpu_before = cpu_seconds(phase.engine.pid)
        roles_before = phase.phase.cpu()
        phase.start(definition, instances_count)
        conn = connect_sync(phase.phase.url, autocommit=True)
        try:
            _wait_finished(conn, instances_count)
            engine_cpu = cpu_seconds(phase.engine.pid) - cpu_before
            roles = {role: seconds - roles_before.get(role, 0.0)
                     for role, seconds in phase.phase.cpu().items()}
            steps, per_s = _steps_per_s(conn)
            found = audit(conn)
        finally:
            conn.close()
    finally:
        phase.close()
    return {"steps": steps, "steps_per_s": round(per_s, 1), "engine_cpu_s": engine_cpu,
            "cpu_us_per_step": {role: round(seconds * 1e6 / max(1, steps))
                                for role, seconds in sorted(roles.items())},
            **found}


def _latency(server: DatabaseUrl, logs: Path, db_pid: int | None,
             instances_count: int, steps_rate: float, workers: int, concurrency: int, *,
             single: bool = False) -> dict[str, Any]:
    """Linear instances at ``steps_rate`` (in steps): started ``START_HZ`` requests a second
    through the batch start, or with ``single`` one instance a request."""
    phase = _WorkflowPhase(server, logs, db_pid)
    try:
        phase.phase.start_workers(workers, concurrency)
        per_request = 1 if single else paced_batch(steps_rate / 3, START_HZ, START_BATCH)
        roles_before, began = phase.phase.cpu(), time.monotonic()
        phase.start("linear", instances_count, rate=steps_rate / 3, per_request=per_request)
        conn = connect_sync(phase.phase.url, autocommit=True)
        try:
            _wait_finished(conn, instances_count)
            busy = (sum(phase.phase.cpu().values()) - sum(roles_before.values())) / (
                (time.monotonic() - began) * (os.cpu_count() or 1))
            lags = advance_lags(conn)
            from_inbox = advance_lags(conn, "inbox")
            found = audit(conn)
        finally:
            conn.close()
    finally:
        phase.close()
    return {"rate_steps_per_s": round(steps_rate, 1), "cpu_busy": round(busy, 2),
            "per_request": per_request,
            "advance_p50_ms": round(percentile(lags, 0.5), 1),
            "advance_p99_ms": round(percentile(lags, 0.99), 1),
            "advance_p99_ms_from_inbox": round(percentile(from_inbox, 0.99), 1), **found}


def run(url_text: str | None, tasks: int, workers: int, concurrency: int) -> dict[str, Any]:
    with bench_server(url_text, "orbit-bench-workflows-") as where:
        server, logs, db_pid = where.server, where.logs, where.db_pid
        phase = _Phase(server, 1, logs, db_pid)
        try:
            plain = _end_to_end(phase, tasks, workers, None, concurrency, 0)
        finally:
            phase.close()
        _wait_purged(server.with_database(""))
        linear = _throughput(server, logs, db_pid, "linear", max(1, tasks // 3), workers,
                             concurrency)
        _wait_purged(server.with_database(""))
        parallel = _throughput(server, logs, db_pid, "parallel", max(1, tasks // BRANCHES),
                               workers, concurrency)
        _wait_purged(server.with_database(""))
        half = _latency(server, logs, db_pid, max(1, tasks // 3), linear["steps_per_s"] / 2,
                        workers, concurrency)
        _wait_purged(server.with_database(""))
        single = _latency(server, logs, db_pid, max(1, tasks // 3), linear["steps_per_s"] / 2,
                          workers, concurrency, single=True)
    plain_rate = plain["tasks_per_s"]
    phases = (linear, parallel, half, single)
    return {
        "tasks": tasks, "workers": workers, "worker_concurrency": concurrency,
        "plain_tasks_per_s": plain_rate,
        "linear_steps_per_s": linear["steps_per_s"],
        "parallel_steps_per_s": parallel["steps_per_s"],
        "linear_ratio": round(linear["steps_per_s"] / plain_rate, 3),
        "parallel_ratio": round(parallel["steps_per_s"] / plain_rate, 3),
        "steps_ratio": round(min(linear["steps_per_s"], parallel["steps_per_s"]) / plain_rate,
                             3),
        "latency_rate_steps_per_s": half["rate_steps_per_s"],
        "advance_p50_ms": half["advance_p50_ms"], "advance_p99_ms": half["advance_p99_ms"],
        "advance_p99_ms_from_inbox": half["advance_p99_ms_from_inbox"],
        "latency_starts_per_request": half["per_request"],
        "latency_cpu_busy": half["cpu_busy"],
        "advance_p50_ms_single_starts": single["advance_p50_ms"],
        "advance_p99_ms_single_starts": single["advance_p99_ms"],
        "latency_cpu_busy_single_starts": single["cpu_busy"],
        "cpu_us_per_task_plain": {k.removeprefix("cpu_us_per_task_"): v
                                  for k, v in plain.items() if k.startswith("cpu_us_per_task_")},
        "cpu_us_per_step_linear": linear["cpu_us_per_step"],
        "cpu_us_per_step_parallel": parallel["cpu_us_per_step"],
        "engine_cpu_us_per_step": round(
            (linear["engine_cpu_s"] + parallel["engine_cpu_s"]) * 1e6
            / max(1, linear["steps"] + parallel["steps"])),
        "instances_started": sum(p["started"] for p in phases),
        "instances_finished": sum(p["finished"] for p in phases),
        "duplicate_steps": sum(p["duplicates"] for p in phases),
    }

"""``orbit bench tasks``: no-op tasks end to end, against the raw queue cycle in the same run.

Steps: a fresh database on ``ORBIT_DATABASE_URL``'s server (or a private instance), migrated and
bootstrapped; the raw queue cycle (bench/rawqueue.py) on the same server; then the API, one
dispatcher and W SDK worker processes; N no-op tasks submitted through the HTTP API in batches of
500 (or at ``--rate`` tasks/s in small batches); wait until every task SUCCEEDED. Figures come
from the database, not from the processes' own counters: start latency is ``attempt.started_at -
task.created_at`` (both database time), commits per task are ``Com_commit`` deltas.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from bench.kernelcycle import run_kernel_cycle
from bench.rawqueue import run_raw_cycle
from orbit_cli import devdb
from orbit_common.db.migrator import Migrator
from orbit_common.db.pool import DatabaseUrl, connect_sync

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


def _com_commit(url: DatabaseUrl) -> int:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Com_commit'")
            return int(cur.fetchone()[1])
    finally:
        conn.close()


def _wait_purged(url: DatabaseUrl, timeout: float = 120) -> None:
    """Wait until InnoDB has purged the undo history of the previous phase.

    A phase that updates tens of thousands of rows leaves purge work that runs in the
    background for seconds; measured beside it, the next phase loses a quarter of its speed.
    """
    conn = connect_sync(url, autocommit=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with conn.cursor() as cur:
                cur.execute("SELECT COUNT FROM information_schema.INNODB_METRICS"
                            " WHERE NAME = 'trx_rseg_history_len'")
                row = cur.fetchone()
            if row is None or int(row[0]) < 1000:
                return
            time.sleep(0.5)
    finally:
        conn.close()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def _submit_all(api: str, key: str, namespace: str, tasks: int, rate: float | None,
                      submitters: int = 4, queue_name: str = "bench") -> float:
    """Submit ``tasks`` no-op tasks; returns submits/s."""
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{api}/v1/namespaces/{namespace}/tasks/batch"
    batch = 500 if rate is None else max(1, min(500, int(rate / 50)))
    chunks = [min(batch, tasks - i) for i in range(0, tasks, batch)]
    started = time.perf_counter()
    async with aiohttp.ClientSession(headers=headers) as session:
        if rate is None:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for size in chunks:
                queue.put_nowait(size)

            async def submitter() -> None:
                while not queue.empty():
                    size = queue.get_nowait()
                    body = {"tasks": [{"queue": queue_name, "handler": "noop", "input": {}}
                                      for _ in range(size)]}
                    async with session.post(url, json=body) as response:
                        if response.status not in (200, 201):
                            raise RuntimeError(await response.text())

            await asyncio.gather(*(submitter() for _ in range(submitters)))
        else:
            interval = batch / rate
            pending = []
            for n, size in enumerate(chunks):
                due = started + n * interval
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                body = {"tasks": [{"queue": queue_name, "handler": "noop", "input": {}}
                                  for _ in range(size)]}
                pending.append(asyncio.ensure_future(session.post(url, json=body)))
            for response in await asyncio.gather(*pending):
                if response.status not in (200, 201):
                    raise RuntimeError(await response.text())
                response.release()
    return tasks / (time.perf_counter() - started)


def run(url_text: str | None, tasks: int, workers: int, rate: float | None,
        concurrency: int) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="orbit-bench-tasks-")
    private = None
    if url_text:
        server = DatabaseUrl.parse(url_text).with_database("")
    else:
        private = Path(tmp.name) / "mysql"
        server = DatabaseUrl.parse(devdb.start(private).url())
    name = f"orbit_bench_{secrets.token_hex(4)}"
    admin = connect_sync(server, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")  # generated name
    url = server.with_database(name)
    procs: list[subprocess.Popen[Any]] = []
    try:
        Migrator(url).up(log=lambda _m: None)
        raw = asyncio.run(run_raw_cycle(url, min(tasks, 20_000), 4))
        _wait_purged(url)
        env = {**os.environ, "ORBIT_DATABASE_URL": url.render(hide_password=False),
               "PYTHONPATH": str(ROOT)}
        boot = json.loads(subprocess.run(
            [sys.executable, "-m", "orbit_cli", "admin", "bootstrap", "--application", "bench",
             "--namespace", "bench"], env=env, capture_output=True, text=True,
            check=True).stdout)
        key, namespace = boot["api_key"], boot["namespace"]
        api_port, dispatcher_port = _free_port(), _free_port()
        api, dispatcher = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{dispatcher_port}"
        logs = Path(tmp.name)
        for command, port_env in (("api", {"ORBIT_API_PORT": str(api_port)}),
                                  ("dispatcher", {"ORBIT_DISPATCHER_PORT":
                                                  str(dispatcher_port)})):
            with (logs / f"{command}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "orbit_cli", command],
                    env={**env, **port_env, "ORBIT_SERVICE_LOG_LEVEL": "WARNING"},
                    stdout=log, stderr=subprocess.STDOUT))
        _wait_ready(f"{api}/readyz")
        _wait_ready(f"{dispatcher}/readyz")
        for queue_name in ("bench", "kernel"):
            request = urllib.request.Request(  # noqa: S310 - loopback
                f"{api}/v1/namespaces/{namespace}/queues", method="POST",
                data=json.dumps({"name": queue_name}).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=10).close()  # noqa: S310
        # Orbit's lease kernel alone (bench/kernelcycle.py) on its own queue, before the workers
        # start; each phase begins once InnoDB has purged the previous phase's history.
        kernel_n = min(tasks, 20_000)
        asyncio.run(_submit_all(api, key, namespace, kernel_n, None, queue_name="kernel"))
        _wait_purged(url)
        kernel = asyncio.run(run_kernel_cycle(url, key, namespace, "kernel", kernel_n))
        _wait_purged(url)
        for i in range(workers):
            with (logs / f"worker-{i}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.noop_worker"],
                    env={**env, "ORBIT_DISPATCHER_URL": dispatcher, "ORBIT_API_KEY": key,
                         "ORBIT_NAMESPACE": namespace, "ORBIT_QUEUES": "bench",
                         "ORBIT_CONCURRENCY": str(concurrency)},
                    stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT)))
        time.sleep(1.0)  # let the workers register before the clock starts
        commits_before = _com_commit(url)
        conn = connect_sync(url, autocommit=True)
        with conn.cursor() as cur:
            cur.execute("SELECT UTC_TIMESTAMP(6)")
            db_started = cur.fetchone()[0]
        started = time.perf_counter()
        submit_per_s = asyncio.run(_submit_all(api, key, namespace, tasks, rate))
        try:
            # Poll a few times a second (the count is a scan; polling it faster would load the
            # server being measured); the end time is the last finish's database time.
            while True:
                with conn.cursor() as cur:
                    cur.execute("SELECT COUNT(*) FROM pulse_tasks WHERE state = 'SUCCEEDED'")
                    done = int(cur.fetchone()[0])
                if done >= tasks + kernel_n:
                    break
                if time.perf_counter() - started > 600:
                    raise RuntimeError(f"only {done} of {tasks} tasks succeeded in 600 s")
                time.sleep(0.25)
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, %s, MAX(t.updated_at)) FROM pulse_tasks t"
                    " JOIN pulse_queues q ON q.namespace_id = t.namespace_id AND q.id = t.queue_id"
                    " WHERE q.name = 'bench'", (db_started,))
                elapsed = int(cur.fetchone()[0]) / 1e6
            commits = _com_commit(url) - commits_before
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, t.created_at, a.started_at)"
                    " FROM pulse_tasks t JOIN pulse_attempts a ON a.namespace_id ="
                    " t.namespace_id AND a.task_id = t.id AND a.generation = 1"
                    " JOIN pulse_queues q ON q.namespace_id = t.namespace_id AND q.id = t.queue_id"
                    " WHERE q.name = 'bench'")
                latencies = [row[0] / 1000 for row in cur.fetchall()]
        finally:
            conn.close()
        result = {
            "tasks": tasks, "workers": workers, "worker_concurrency": concurrency,
            "rate": rate, "submit_per_s": round(submit_per_s, 1),
            "tasks_per_s": round(tasks / elapsed, 1),
            "start_p50_ms": round(_percentile(latencies, 0.5), 1),
            "start_p99_ms": round(_percentile(latencies, 0.99), 1),
            "start_mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
            "commits_per_task": round(commits / tasks, 3),
            **raw, **kernel,
        }
        result["ratio_to_raw"] = round(result["tasks_per_s"] / raw["raw_tasks_per_s"], 3)
        result["kernel_ratio_to_raw"] = round(
            kernel["kernel_tasks_per_s"] / raw["raw_tasks_per_s"], 3)
        result["ratio_to_kernel"] = round(
            result["tasks_per_s"] / kernel["kernel_tasks_per_s"], 3)
        return result
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()
        if private is not None:
            devdb.stop(private)
        tmp.cleanup()

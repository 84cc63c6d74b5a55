"""``orbit bench tasks``: no-op tasks end to end, against the raw queue cycle in the same run.

Steps: a fresh database on ``ORBIT_DATABASE_URL``'s server (or a private instance), migrated and
bootstrapped; the raw queue cycle (bench/rawqueue.py) and the same-shape cycle (bench/shape.py)
on the same server; Orbit's lease kernel alone (bench/kernelcycle.py); then the API, one
dispatcher and W SDK worker processes; N no-op tasks submitted through the HTTP API in batches of
500 (or at ``--rate`` tasks/s in small batches); wait until every task SUCCEEDED. Figures come
from the database, not from the processes' own counters: start latency is ``attempt.started_at -
task.created_at`` (both database time), commits per task are ``Com_commit`` deltas.

With ``--backlog N`` the kernel and end-to-end phases run a second time on a fresh database
holding N queued tasks (bench/backlog.py says where they are and why they stay queued);
``backlog_ratio`` and ``backlog_kernel_ratio`` compare those figures with the empty ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

import orbit_devdb as devdb
from bench import backlog as backlogs
from bench.common import (
    bench_server,
    cpu_seconds,
    free_port,
    paced_batch,
    percentile,
    poll_until,
    post_json,
    wait_ready,
)
from bench.kernelcycle import run_kernel_cycle
from bench.rawqueue import run_raw_cycle
from bench.shape import run_shape_cycle
from orbit_common.db.migrator import Migrator
from orbit_common.db.pool import DatabaseUrl, connect_sync

ROOT = Path(__file__).resolve().parents[1]
SUBMIT_BATCH = 500  # tasks a request when not paced (the API's batch limit is higher)


def _com_commit(url: DatabaseUrl) -> int:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Com_commit'")
            return int(cur.fetchone()[1])
    finally:
        conn.close()


def _statements(url: DatabaseUrl) -> dict[str, int]:
    """The server's statement counters (all clients): Questions and the Com_ kinds; and the
    InnoDB page reads from disk (the buffer pool's misses)."""
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_select',"
                        " 'Com_insert', 'Com_update', 'Com_update_multi', 'Com_delete',"
                        " 'Com_rollback', 'Com_begin', 'Com_set_option',"
                        " 'Innodb_buffer_pool_reads')")
            return {name.lower(): int(value) for name, value in cur.fetchall()}
    finally:
        conn.close()


def _wait_sessions(url: DatabaseUrl, count: int, timeout: float = 60) -> None:
    """Wait until ``count`` worker sessions are ACTIVE (read from the database)."""
    conn = connect_sync(url, autocommit=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM pulse_worker_sessions WHERE state = 'ACTIVE'")
                if int(cur.fetchone()[0]) >= count:
                    return
            time.sleep(0.05)
    finally:
        conn.close()
    raise RuntimeError(f"{count} worker sessions did not register in {timeout} s")


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


def _dirty_pages(cur: Any) -> int:
    cur.execute("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
    return int(cur.fetchone()[1])


def flush_settled(before: int, now: int) -> bool:
    """Whether the page cleaner's burst is over: few dirty pages left, or fewer than 1 % gone
    since the previous look."""
    return now < 1000 or now > before * 0.99


def _wait_flushed(url: DatabaseUrl, timeout: float = 180) -> None:
    """Wait until InnoDB's page cleaner has finished the burst a bulk insert leaves behind.

    After the backlog's million rows the cleaner writes back tens of thousands of pages for
    20-30 s, then settles (the rest stays dirty until it is needed); measured beside the burst,
    the kernel phase lost half its speed. Done when the dirty pages stop falling.
    """
    conn = connect_sync(url, autocommit=True)
    try:
        deadline = time.monotonic() + timeout
        with conn.cursor() as cur:
            before = _dirty_pages(cur)
            while time.monotonic() < deadline:
                time.sleep(2)
                now = _dirty_pages(cur)
                if flush_settled(before, now):
                    return
                before = now
    finally:
        conn.close()


def _sizes(url: DatabaseUrl) -> dict[str, int]:
    """The buffer pool and the task and event tables (data + indexes, InnoDB's estimate), MB."""
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@innodb_buffer_pool_size")
            pool = int(cur.fetchone()[0])
            cur.execute("SELECT COALESCE(SUM(data_length + index_length), 0)"
                        " FROM information_schema.TABLES WHERE table_schema = DATABASE()"
                        " AND table_name IN ('pulse_tasks', 'orbit_events')")
            tables = int(cur.fetchone()[0])
    finally:
        conn.close()
    return {"buffer_pool_mb": pool >> 20, "backlog_tables_mb": tables >> 20}


def _task_body(queue_name: str, size: int, first: int, keys: int) -> dict[str, Any]:
    return {"tasks": [{"queue": queue_name, "handler": "noop", "input": {},
                       **({"concurrency_key": f"key-{(first + i) % keys}"} if keys else {})}
                      for i in range(size)]}


async def _submit_all(api: str, key: str, namespace: str, tasks: int, rate: float | None,
                      submitters: int = 4, queue_name: str = "bench", keys: int = 0,
                      hz: int = 50) -> float:
    """Submit ``tasks`` no-op tasks (key ``key-<n mod keys>`` when ``keys``); returns submits/s.
    At a ``rate``, ``hz`` requests a second (each ``rate / hz`` tasks)."""
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{api}/v1/namespaces/{namespace}/tasks/batch"
    batch = SUBMIT_BATCH if rate is None else paced_batch(rate, hz, SUBMIT_BATCH)
    chunks = [(i, min(batch, tasks - i)) for i in range(0, tasks, batch)]
    started = time.perf_counter()
    async with aiohttp.ClientSession(headers=headers) as session:
        if rate is None:
            queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
            for chunk in chunks:
                queue.put_nowait(chunk)

            async def submitter() -> None:
                while not queue.empty():
                    first, size = queue.get_nowait()
                    body = _task_body(queue_name, size, first, keys)
                    async with session.post(url, json=body) as response:
                        if response.status not in (200, 201):
                            raise RuntimeError(await response.text())

            await asyncio.gather(*(submitter() for _ in range(submitters)))
        else:
            interval = batch / rate
            pending = []
            for n, (first, size) in enumerate(chunks):
                due = started + n * interval
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                body = _task_body(queue_name, size, first, keys)
                pending.append(asyncio.ensure_future(session.post(url, json=body)))
            for response in await asyncio.gather(*pending):
                if response.status not in (200, 201):
                    raise RuntimeError(await response.text())
                response.release()
    return tasks / (time.perf_counter() - started)


class _Phase:
    """A fresh database on the server, migrated, with ``apps`` bootstrapped applications (one
    namespace and one ``bench`` queue each), the API and one dispatcher running."""

    def __init__(self, server: DatabaseUrl, apps: int, logs: Path,
                 db_pid: int | None = None) -> None:
        self.server, self.logs, self.db_pid = server, logs, db_pid
        self.name = f"orbit_bench_{secrets.token_hex(4)}"
        self.procs: list[subprocess.Popen[Any]] = []
        self.labels: list[str] = []
        self.extra_cpu: dict[str, int] = {}
        admin = connect_sync(server, autocommit=True)
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {devdb.database_identifier(self.name)}")
        admin.close()
        self.url = server.with_database(self.name)
        Migrator(self.url).up(log=lambda _m: None)
        self.env = {**os.environ, "ORBIT_DATABASE_URL": self.url.render(hide_password=False),
                    "PYTHONPATH": str(ROOT)}
        self.tenants: list[tuple[str, str]] = []
        for n in range(apps):
            boot = json.loads(subprocess.run(
                [sys.executable, "-m", "orbit_cli", "admin", "bootstrap", "--application",
                 f"bench-{n}", "--namespace", f"bench-{n}"], env=self.env, capture_output=True,
                text=True, check=True).stdout)
            self.tenants.append((boot["api_key"], boot["namespace"]))
        api_port, dispatcher_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{api_port}"
        self.dispatcher = f"http://127.0.0.1:{dispatcher_port}"
        for command, port_env in (("api", {"ORBIT_API_PORT": str(api_port)}),
                                  ("dispatcher", {"ORBIT_DISPATCHER_PORT":
                                                  str(dispatcher_port)})):
            self._spawn(command, [sys.executable, "-m", "orbit_cli", command],
                        {**port_env, "ORBIT_SERVICE_LOG_LEVEL": "WARNING"})
        wait_ready(f"{self.api}/readyz")
        wait_ready(f"{self.dispatcher}/readyz")
        for key, namespace in self.tenants:
            for queue_name in ("bench", "kernel"):
                post_json(f"{self.api}/v1/namespaces/{namespace}/queues", key,
                           {"name": queue_name})

    def _spawn(self, label: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.logs / f"{self.name}-{label}-{len(self.procs)}.log").open("wb") as log:
            self.procs.append(subprocess.Popen(argv, env={**self.env, **env}, stdout=log,
                                               stderr=subprocess.STDOUT, cwd=str(ROOT)))
        self.labels.append(label)

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by role: api, dispatcher, workers (summed), the processes
        in ``extra_cpu`` (label -> pid, e.g. a bench's own receiver) and, for a private server,
        database."""
        used: dict[str, float] = {label: cpu_seconds(pid) for label, pid in self.extra_cpu.items()}
        for label, proc in zip(self.labels, self.procs, strict=True):
            role = "workers" if label == "worker" else label
            used[role] = used.get(role, 0.0) + cpu_seconds(proc.pid)
        if self.db_pid is not None:
            used["database"] = cpu_seconds(self.db_pid)
        return used

    def start_workers(self, workers: int, concurrency: int) -> None:
        """``workers`` SDK worker processes, spread round-robin over the applications."""
        for i in range(max(workers, len(self.tenants))):
            key, namespace = self.tenants[i % len(self.tenants)]
            self._spawn("worker", [sys.executable, "-m", "bench.noop_worker"], {
                "ORBIT_DISPATCHER_URL": self.dispatcher, "ORBIT_API_KEY": key,
                "ORBIT_NAMESPACE": namespace, "ORBIT_QUEUES": "bench",
                "ORBIT_CONCURRENCY": str(concurrency)})

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        admin = connect_sync(self.server, autocommit=True)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {devdb.database_identifier(self.name)}")
        admin.close()


def wait_succeeded(conn: Any, tasks: int, timeout: float = 900) -> None:
    """Until ``tasks`` tasks of the ``bench`` queues SUCCEEDED, or RuntimeError at ``timeout``.
    Polled a few times a second: the count is a scan, and polling it faster would load the
    server being measured."""
    def succeeded() -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pulse_tasks t JOIN pulse_queues q"
                        " ON q.namespace_id = t.namespace_id AND q.id = t.queue_id"
                        " WHERE q.name = 'bench' AND t.state = 'SUCCEEDED'")
            return int(cur.fetchone()[0])

    poll_until(succeeded, lambda done: done >= tasks, f"{tasks} tasks succeeded", timeout)


def _end_to_end(phase: _Phase, tasks: int, workers: int, rate: float | None, concurrency: int,
                keys: int, settle: Callable[[Any], None] | None = None, *,
                submit_hz: int = 50) -> dict[str, Any]:
    """Workers up, N tasks submitted (split evenly over the applications, in parallel), wait
    until all SUCCEEDED; figures from the database. ``settle(conn)``, when given, waits for
    work that follows the tasks (e.g. their deliveries) before the CPU and statement counts
    are read: those figures then cover it too (the throughput still ends at the last task)."""
    phase.start_workers(workers, concurrency)
    url = phase.url
    _wait_sessions(url, max(workers, len(phase.tenants)))  # registered before the clock starts
    commits_before = _com_commit(url)
    cpu_before = phase.cpu()
    statements_before = _statements(url)
    conn = connect_sync(url, autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SELECT UTC_TIMESTAMP(6)")
        db_started = cur.fetchone()[0]
    apps = len(phase.tenants)
    shares = [tasks // apps + (1 if n < tasks % apps else 0) for n in range(apps)]

    async def submit_everything() -> list[float]:
        return list(await asyncio.gather(*(
            _submit_all(phase.api, key, namespace, share,
                        None if rate is None else rate / apps, max(1, 4 // apps), keys=keys,
                        hz=submit_hz)
            for (key, namespace), share in zip(phase.tenants, shares, strict=True))))

    submit_rates = asyncio.run(submit_everything())
    # The SUCCEEDED tasks of the bench queues: the measured ones (a backlog stays WAITING).
    bench_queues = ("SELECT t.updated_at, t.created_at, t.namespace_id, t.id FROM pulse_tasks t"
                    " JOIN pulse_queues q ON q.namespace_id = t.namespace_id"
                    " AND q.id = t.queue_id WHERE q.name = 'bench' AND t.state = 'SUCCEEDED'")
    try:
        # The end time is the last finish's database time.
        wait_succeeded(conn, tasks)
        if settle is not None:
            settle(conn)
        with conn.cursor() as cur:
            cur.execute(f"SELECT TIMESTAMPDIFF(MICROSECOND, %s, MAX(b.updated_at))"
                        f" FROM ({bench_queues}) b", (db_started,))
            elapsed = int(cur.fetchone()[0]) / 1e6
        commits = _com_commit(url) - commits_before
        statements = {name: count - statements_before.get(name, 0)
                      for name, count in _statements(url).items()}
        cpu_used = {role: seconds - cpu_before.get(role, 0.0)
                    for role, seconds in phase.cpu().items()}
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT TIMESTAMPDIFF(MICROSECOND, b.created_at, a.started_at),"
                f" TIMESTAMPDIFF(MICROSECOND, b.created_at, a.offered_at) FROM"
                f" ({bench_queues}) b JOIN pulse_attempts a ON a.namespace_id = b.namespace_id"
                " AND a.task_id = b.id AND a.generation = 1")
            found = cur.fetchall()
            latencies = [row[0] / 1000 for row in found]
            offers = [row[1] / 1000 for row in found]
    finally:
        conn.close()
    return {
        "tasks": tasks, "workers": max(workers, apps), "worker_concurrency": concurrency,
        "rate": rate, "keys": keys, "apps": apps,
        "submit_per_s": round(sum(submit_rates), 1),
        "tasks_per_s": round(tasks / elapsed, 1),
        "start_p50_ms": round(percentile(latencies, 0.5), 1),
        "start_p99_ms": round(percentile(latencies, 0.99), 1),
        "start_mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
        # submit -> lease offered (the claim's database time): the dispatcher's share of the
        # start latency; the rest is the push, the worker's start request and its commit.
        "offer_p50_ms": round(percentile(offers, 0.5), 1),
        "offer_p99_ms": round(percentile(offers, 0.99), 1),
        # lease offered -> start approved: the claim's commit, the push, the worker's start
        # request and the start transaction up to its clock read
        "offer_to_start_p50_ms": round(percentile(
            [s - o for s, o in zip(latencies, offers, strict=True)], 0.5), 1),
        "offer_to_start_p99_ms": round(percentile(
            [s - o for s, o in zip(latencies, offers, strict=True)], 0.99), 1),
        "commits_per_task": round(commits / tasks, 3),
        # CPU per task by process role over the measured interval (the end-to-end cost that
        # the throughput figure hides on a machine with fewer cores than processes)
        **{f"cpu_us_per_task_{role}": round(seconds * 1e6 / tasks)
           for role, seconds in sorted(cpu_used.items())},
        # statements per task, all clients: each is a round trip of some process
        **{f"{name}_per_task": round(count / tasks, 2)
           for name, count in sorted(statements.items())},
    }


BACKLOG_QUEUES = [f"backlog-{n}" for n in range(4)]


@contextlib.contextmanager
def _cpu_per_task(prefix: str, tasks: int, db_pid: int | None) -> Iterator[dict[str, int]]:
    """CPU per task of an in-process phase: this process (the phase's client) and, for a
    private server, the database; filled in when the block ends."""
    figures: dict[str, int] = {}
    client, database = time.process_time(), cpu_seconds(db_pid) if db_pid else 0.0
    yield figures
    figures[f"{prefix}_cpu_us_per_task_client"] = round(
        (time.process_time() - client) * 1e6 / tasks)
    if db_pid:
        figures[f"{prefix}_cpu_us_per_task_database"] = round(
            (cpu_seconds(db_pid) - database) * 1e6 / tasks)


def _bound_by_database(database_us_per_task: float, shape_tasks_per_s: float) -> float:
    """The highest ``ratio_to_shape`` the database's own CPU per task allows: even if every
    other process cost nothing, the machine's cores could run at most ``cores / database CPU
    per task`` tasks per second end to end."""
    ceiling = (os.cpu_count() or 1) * 1e6 / max(database_us_per_task, 1)
    return round(ceiling / shape_tasks_per_s, 3)


def _kernel_and_end_to_end(phase: _Phase, tasks: int, workers: int, rate: float | None,
                           concurrency: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Orbit's lease kernel alone (bench/kernelcycle.py) on its own queue, before any worker
    runs, then end to end; each begins once InnoDB has purged the previous one's history."""
    kernel_n = min(tasks, 20_000)
    key, namespace = phase.tenants[0]
    asyncio.run(_submit_all(phase.api, key, namespace, kernel_n, None, queue_name="kernel"))
    _wait_purged(phase.url)
    reads = _statements(phase.url)["innodb_buffer_pool_reads"]
    with _cpu_per_task("kernel", kernel_n, phase.db_pid) as kernel_cpu:
        kernel = asyncio.run(run_kernel_cycle(phase.url, key, namespace, "kernel", kernel_n))
    kernel.update(kernel_cpu)
    kernel["kernel_pool_reads_per_task"] = round(
        (_statements(phase.url)["innodb_buffer_pool_reads"] - reads) / kernel_n, 2)
    _wait_purged(phase.url)
    return kernel, _end_to_end(phase, tasks, workers, rate, concurrency, 0)


def _with_backlog(server: DatabaseUrl, logs: Path, db_pid: int | None, size: int, tasks: int,
                  workers: int, rate: float | None, concurrency: int) -> dict[str, Any]:
    """A fresh database with ``size`` tasks queued (bench/backlog.py), then the kernel and end
    to end phases again; their figures prefixed ``backlog_``."""
    _wait_purged(server.with_database(""))
    phase = _Phase(server, 1, logs, db_pid)
    try:
        key, namespace = phase.tenants[0]
        for name in BACKLOG_QUEUES:
            post_json(f"{phase.api}/v1/namespaces/{namespace}/queues", key, {"name": name})
        seeded = backlogs.seed(phase.url, namespace, BACKLOG_QUEUES, ["kernel", "bench"], size)
        _wait_purged(phase.url)
        _wait_flushed(phase.url)
        sizes = _sizes(phase.url)
        kernel, measured = _kernel_and_end_to_end(phase, tasks, workers, rate, concurrency)
    finally:
        phase.close()
    return {"backlog": size, "backlog_seed_s": seeded["backlog_seed_s"], **sizes,
            "backlog_kernel_tasks_per_s": kernel["kernel_tasks_per_s"],
            "backlog_kernel_pool_reads_per_task": kernel["kernel_pool_reads_per_task"],
            **{f"backlog_{name}": measured[name] for name in (
                "tasks_per_s", "start_p50_ms", "start_p99_ms", "commits_per_task",
                "questions_per_task", "innodb_buffer_pool_reads_per_task")}}


def run(url_text: str | None, tasks: int, workers: int, rate: float | None,
        concurrency: int, keys: int = 0, apps: int = 1, backlog: int = 0) -> dict[str, Any]:
    """The raw cycle, the same-shape cycle, the kernel, then end to end; with ``keys`` or
    ``apps`` also a plain end to end phase first (its own fresh database), so the flow-control
    ratio compares two figures from the same run; with ``backlog`` the kernel and end to end
    once more over a fresh database holding that many queued tasks."""
    if backlog and (keys or apps > 1):
        raise ValueError("a backlog run measures the plain phase: no keys, one application")
    with bench_server(url_text, "orbit-bench-tasks-") as where:
        server, logs, db_pid = where.server, where.logs, where.db_pid
        phase = _Phase(server, 1, logs, db_pid)
        try:
            raw = asyncio.run(run_raw_cycle(phase.url, min(tasks, 20_000), 4))
            _wait_purged(phase.url)
            # The same-shape reference (bench/shape.py): Orbit's kind of rows, no more.
            with _cpu_per_task("shape", tasks, db_pid) as shape_cpu:
                shape = asyncio.run(run_shape_cycle(phase.url, tasks, 4))
            shape.update(shape_cpu)
            _wait_purged(phase.url)
            flow_control = keys > 0 or apps > 1
            kernel, plain = _kernel_and_end_to_end(phase, tasks, workers, rate, concurrency)
        finally:
            phase.close()
        result: dict[str, Any] = {**plain, **raw, **shape, **kernel}
        if flow_control:
            _wait_purged(server.with_database(""))
            phase = _Phase(server, apps, logs, db_pid)
            try:
                controlled = _end_to_end(phase, tasks, workers, rate, concurrency, keys)
            finally:
                phase.close()
            result = {**controlled, **raw, **shape, **kernel,
                      "plain_tasks_per_s": plain["tasks_per_s"],
                      "flow_control_ratio": round(controlled["tasks_per_s"]
                                                  / plain["tasks_per_s"], 3)}
        result["ratio_to_raw"] = round(result["tasks_per_s"] / raw["raw_tasks_per_s"], 3)
        result["kernel_ratio_to_raw"] = round(
            kernel["kernel_tasks_per_s"] / raw["raw_tasks_per_s"], 3)
        result["ratio_to_kernel"] = round(
            result["tasks_per_s"] / kernel["kernel_tasks_per_s"], 3)
        result["ratio_to_shape"] = round(result["tasks_per_s"] / shape["shape_tasks_per_s"], 3)
        if "cpu_us_per_task_database" in plain:
            result["ratio_to_shape_bound_by_database"] = _bound_by_database(
                plain["cpu_us_per_task_database"], shape["shape_tasks_per_s"])
        if backlog:
            loaded = _with_backlog(server, logs, db_pid, backlog, tasks, workers, rate,
                                   concurrency)
            result.update(loaded)
            result["backlog_ratio"] = round(loaded["backlog_tasks_per_s"] / plain["tasks_per_s"],
                                            3)
            result["backlog_kernel_ratio"] = round(
                loaded["backlog_kernel_tasks_per_s"] / kernel["kernel_tasks_per_s"], 3)
        return result

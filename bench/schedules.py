"""``orbit bench schedules``: the scheduler under a burst and under a steady stream.

Steps: a fresh database on ``ORBIT_DATABASE_URL``'s server (or a private instance), migrated and
bootstrapped, one queue; N schedules created in bulk (the rows ``schedule_commands`` writes,
inserted by multi-row statements: setup is not what is measured).

1. Burst: every schedule's version 1 is an hourly interval rule whose first instant is the same
   moment T0, a few seconds ahead. R ``orbit scheduler`` processes drain it.
   ``burst_fires_per_s`` = N / (last ``fired_at`` − T0), from the ledger.
2. Steady: version 2 of every schedule is published (in bulk, effective at once): a
   one-minute interval rule, the N schedules' instants spread evenly over the minute, for at
   least two minutes. Lateness = ``fired_at`` − planned instant, from the ledger.

``duplicates`` and ``missed`` come from the ledger and the tasks, not from the scheduler: the
expected instants are computed here from the rules, independently of the scheduler's code.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orbit_devdb as devdb
from bench.common import free_port, percentile, post_json, wait_ready
from orbit_common.db.migrator import Migrator
from orbit_common.db.pool import DatabaseUrl, connect_sync
from orbit_common.model import ids, jsondoc

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = '{"handler": "noop", "input": {}}'


def _iso(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _rule(interval_ms: int, start: dt.datetime) -> str:
    return jsondoc.dumps({"interval_ms": interval_ms, "start_at": _iso(start),
                          "timezone": "UTC"})


def _db_now(conn: Any) -> dt.datetime:
    with conn.cursor() as cur:
        cur.execute("SELECT UTC_TIMESTAMP(6)")
        now: dt.datetime = cur.fetchone()[0]
        return now.replace(tzinfo=dt.UTC)


def _bulk(conn: Any, sql: str, rows: list[tuple[Any, ...]], width: int) -> None:
    with conn.cursor() as cur:
        for start in range(0, len(rows), 1000):
            chunk = rows[start:start + 1000]
            marks = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(chunk))
            cur.execute(sql + " VALUES " + marks, [v for row in chunk for v in row])
    conn.commit()


def _create(conn: Any, namespace_id: bytes, queue_id: bytes, n: int,
            t0: dt.datetime) -> list[bytes]:
    now = _db_now(conn).replace(tzinfo=None)
    schedule_ids = [ids.new_id() for _ in range(n)]
    _bulk(conn, "INSERT INTO pulse_schedules (namespace_id, id, queue_id, name, state, revision,"
          " current_version, processing_version, covered_until, next_fire_at, check_at,"
          " created_at, updated_at)",
          [(namespace_id, sid, queue_id, f"s{i:06d}", "ACTIVE", 1, 1, 1, now,
            t0.replace(tzinfo=None), t0.replace(tzinfo=None), now, now)
           for i, sid in enumerate(schedule_ids)], 13)
    rule = _rule(3_600_000, t0)
    _bulk(conn, "INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule,"
          " template, misfire_policy, overlap_policy, catchup_window_ms, grace_ms,"
          " effective_from, created_by, created_at)",
          [(namespace_id, sid, 1, rule, TEMPLATE, "EACH", "ALLOW", 3_600_000, 60_000, now,
            "bench", now) for sid in schedule_ids], 12)
    return schedule_ids


def _publish_steady(conn: Any, namespace_id: bytes, schedule_ids: list[bytes],
                    t1: dt.datetime) -> dict[bytes, dt.datetime]:
    """Version 2: one-minute interval, instants spread over the minute starting at ``t1``."""
    now = _db_now(conn).replace(tzinfo=None)
    n = len(schedule_ids)
    starts = {sid: t1 + dt.timedelta(microseconds=60_000_000 * i // n)
              for i, sid in enumerate(schedule_ids)}
    _bulk(conn, "INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule,"
          " template, misfire_policy, overlap_policy, catchup_window_ms, grace_ms,"
          " effective_from, created_by, created_at)",
          [(namespace_id, sid, 2, _rule(60_000, starts[sid]), TEMPLATE, "EACH", "ALLOW",
            3_600_000, 60_000, now, "bench", now) for sid in schedule_ids], 12)
    with conn.cursor() as cur:
        cur.execute("UPDATE pulse_schedules SET current_version = 2, revision = revision + 1,"
                    " check_at = %s WHERE namespace_id = %s", (now, namespace_id))
    conn.commit()
    return starts


def _wait_fired(conn: Any, namespace_id: bytes, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                        " AND version = 1", (namespace_id,))
            if int(cur.fetchone()[0]) >= expected:
                return
        conn.commit()
        time.sleep(0.2)
    raise RuntimeError(f"the burst did not drain in {timeout} s")


def _ledger_checks(conn: Any, namespace_id: bytes, version: int,
                   expected: set[tuple[bytes, dt.datetime]],
                   cutoff: dt.datetime | None = None) -> dict[str, int]:
    """Compare the ledger of ``version`` with the expected instants (up to ``cutoff``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT schedule_id, fire_at, outcome, task_id FROM"
                    " pulse_schedule_occurrences WHERE namespace_id = %s AND version = %s",
                    (namespace_id, version))
        rows = cur.fetchall()
        cur.execute("SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s", (namespace_id,))
        tasks_total = int(cur.fetchone()[0])
    conn.commit()
    seen: dict[tuple[bytes, dt.datetime], int] = {}
    for sid, at, _outcome, _task in rows:
        key = (sid, at.replace(tzinfo=dt.UTC))
        if cutoff is not None and key[1] > cutoff:
            continue  # fired after the measurement window: not judged
        seen[key] = seen.get(key, 0) + 1
    return {
        "duplicates": sum(c - 1 for c in seen.values() if c > 1),
        "missed": len(expected - set(seen)),
        "unexpected": len(set(seen) - expected),
        "skipped": sum(1 for r in rows if r[2] == "SKIPPED"),
        "tasks_total": tasks_total,
    }


def run(url_text: str | None, n: int, replicas: int, steady_s: float) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="orbit-bench-schedules-")
    private = None
    if url_text:
        server = DatabaseUrl.parse(url_text).with_database("")
    else:
        private = Path(tmp.name) / "mysql"
        server = DatabaseUrl.parse(devdb.start(private).url())
    name = f"orbit_bench_{secrets.token_hex(4)}"
    admin = connect_sync(server, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {devdb.database_identifier(name)}")
    url = server.with_database(name)
    procs: list[subprocess.Popen[Any]] = []
    logs = Path(tmp.name)
    try:
        Migrator(url).up(log=lambda _m: None)
        env = {**os.environ, "ORBIT_DATABASE_URL": url.render(hide_password=False),
               "PYTHONPATH": str(ROOT), "ORBIT_SERVICE_LOG_LEVEL": "WARNING"}
        boot = json.loads(subprocess.run(
            [sys.executable, "-m", "orbit_cli", "admin", "bootstrap", "--application", "bench",
             "--namespace", "bench"], env=env, capture_output=True, text=True,
            check=True).stdout)
        api_port = free_port()
        with (logs / "api.log").open("wb") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "orbit_cli", "api"],
                                          env={**env, "ORBIT_API_PORT": str(api_port)},
                                          stdout=log, stderr=subprocess.STDOUT))
        api = f"http://127.0.0.1:{api_port}"
        wait_ready(f"{api}/readyz")
        post_json(f"{api}/v1/namespaces/{boot['namespace']}/queues", boot["api_key"],
                   {"name": "bench"})
        conn = connect_sync(url)
        with conn.cursor() as cur:
            cur.execute("SELECT n.id, q.id FROM orbit_namespaces n JOIN pulse_queues q"
                        " ON q.namespace_id = n.id WHERE n.name = %s", (boot["namespace"],))
            namespace_id, queue_id = cur.fetchone()
        conn.commit()
        t0 = _db_now(conn) + dt.timedelta(seconds=8)
        schedule_ids = _create(conn, namespace_id, queue_id, n, t0)
        for i in range(replicas):
            with (logs / f"scheduler-{i}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "orbit_cli", "scheduler"],
                    env={**env, "ORBIT_SERVICE_METRICS_PORT": str(free_port())},
                    stdout=log, stderr=subprocess.STDOUT))
        _wait_fired(conn, namespace_id, n, timeout=600)
        with conn.cursor() as cur:
            cur.execute("SELECT TIMESTAMPDIFF(MICROSECOND, %s, MAX(fired_at)) FROM"
                        " pulse_schedule_occurrences WHERE namespace_id = %s AND version = 1",
                        (t0.replace(tzinfo=None), namespace_id))
            burst_s = int(cur.fetchone()[0]) / 1e6
        conn.commit()
        burst = _ledger_checks(conn, namespace_id, 1, {(sid, t0) for sid in schedule_ids})

        t1 = _db_now(conn) + dt.timedelta(seconds=5)
        starts = _publish_steady(conn, namespace_id, schedule_ids, t1)
        time.sleep(max(0.0, (t1 - _db_now(conn)).total_seconds()) + steady_s)
        stop_at = _db_now(conn)
        cutoff = stop_at - dt.timedelta(seconds=5)  # instants the scheduler had time to reach
        expected = set()
        for sid, first in starts.items():
            at = first
            while at <= cutoff:
                expected.add((sid, at))
                at += dt.timedelta(minutes=1)
        steady = _ledger_checks(conn, namespace_id, 2, expected, cutoff)
        with conn.cursor() as cur:
            cur.execute("SELECT lateness_ms FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                        " AND version = 2 AND outcome = 'FIRED' AND fire_at <= %s",
                        (namespace_id, cutoff.replace(tzinfo=None)))
            lateness = [float(r[0]) for r in cur.fetchall()]
            cur.execute("SELECT COUNT(*) FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                        " AND outcome <> 'SKIPPED'", (namespace_id,))
            runs = int(cur.fetchone()[0])
            cur.execute("SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                        (namespace_id,))
            tasks_total = int(cur.fetchone()[0])
        conn.commit()
        conn.close()
        return {
            "schedules": n, "replicas": replicas,
            "burst_seconds": round(burst_s, 3),
            "burst_fires_per_s": round(n / burst_s, 1) if burst_s > 0 else None,
            "steady_seconds": round((stop_at - t1).total_seconds(), 1),
            "steady_fires": len(lateness),
            "steady_lateness_p50_ms": round(percentile(lateness, 0.5), 1),
            "steady_lateness_p99_ms": round(percentile(lateness, 0.99), 1),
            "steady_lateness_max_ms": round(max(lateness), 1) if lateness else None,
            # A ledger row twice, or a task without its ledger row, is a duplicate run.
            "duplicates": burst["duplicates"] + steady["duplicates"]
            + abs(tasks_total - runs),
            "missed": burst["missed"] + steady["missed"],
            "unexpected": burst["unexpected"] + steady["unexpected"],
            "skipped": burst["skipped"] + steady["skipped"],
            "tasks": tasks_total, "runs_in_ledger": runs,
        }
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
            cur.execute(f"DROP DATABASE IF EXISTS {devdb.database_identifier(name)}")
        admin.close()
        if private is not None:
            devdb.stop(private)
        tmp.cleanup()

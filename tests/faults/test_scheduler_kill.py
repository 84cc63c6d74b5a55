"""Two scheduler replicas, one killed with SIGKILL every few seconds and restarted, while many
schedules fire every two seconds: every expected instant is in the ledger exactly once, and
every run has exactly one task. The expected instants are computed here from the rules.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from orbit_common.model import ids
from tests.support.processes import Daemon, free_port, wait_until
from tests.support.stack import Stack

SCHEDULES = int(os.environ.get("ORBIT_SCHEDULER_FAULT_SCHEDULES", "300"))
INTERVAL = dt.timedelta(seconds=2)
RUN_FOR = dt.timedelta(seconds=20)


def scheduler(stack: Stack, tmp: Path, n: int) -> Daemon:
    return Daemon(["scheduler"], db_url=stack.url, log=tmp / f"scheduler-{n}.log", env={
        "ORBIT_SERVICE_METRICS_PORT": str(free_port()),
        "ORBIT_SCHEDULER_BATCH": "32",
        "ORBIT_SERVICE_DRAIN_TIMEOUT_S": "5",
    })


def test_killed_replicas_neither_lose_nor_repeat_a_fire(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    daemons: list[Daemon] = []
    try:
        stack.create_queue("ticks")
        with stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT n.id, q.id FROM orbit_namespaces n JOIN pulse_queues q"
                        " ON q.namespace_id = n.id WHERE n.name = %s", (stack.namespace,))
            namespace_id, queue_id = cur.fetchone()
            cur.execute("SELECT UTC_TIMESTAMP(6)")
            now = cur.fetchone()[0]
            start = now + dt.timedelta(seconds=3)
            end = start + RUN_FOR  # the rules end here (exclusive): a closed set of instants
            rows, versions, firsts = [], [], []
            for i in range(SCHEDULES):
                sid = ids.new_id()
                offset = dt.timedelta(microseconds=2_000_000 * i // SCHEDULES)
                rule = json.dumps({"interval_ms": 2000, "timezone": "UTC",
                                   "start_at": (start + offset).isoformat() + "Z",
                                   "end_at": end.isoformat() + "Z"})
                rows.append((namespace_id, sid, queue_id, f"tick-{i:04d}", now, start, now, now))
                versions.append((namespace_id, sid, rule, now, now))
                firsts.append((sid, start + offset))
            cur.executemany(
                "INSERT INTO pulse_schedules (namespace_id, id, queue_id, name, state, revision,"
                " current_version, processing_version, covered_until, check_at, created_at,"
                " updated_at) VALUES (%s, %s, %s, %s, 'ACTIVE', 1, 1, 1, %s, %s, %s, %s)",
                rows)
            cur.executemany(
                "INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule,"
                " template, misfire_policy, overlap_policy, catchup_window_ms, grace_ms,"
                " effective_from, created_by, created_at) VALUES (%s, %s, 1, %s,"
                " '{\"handler\": \"noop\", \"input\": {}}', 'EACH', 'ALLOW', 3600000, 3600000,"
                " %s, 'test', %s)",
                versions)
        expected: set[tuple[bytes, dt.datetime]] = set()
        for sid, first in firsts:
            at = first
            while at < end:
                expected.add((sid, at))
                at += INTERVAL

        daemons = [scheduler(stack, tmp_path, 0), scheduler(stack, tmp_path, 1)]
        kills = 0
        deadline = time.monotonic() + RUN_FOR.total_seconds() + 6
        while time.monotonic() < deadline:
            time.sleep(2.5)
            victim = kills % 2
            daemons[victim].proc.send_signal(signal.SIGKILL)
            daemons[victim].proc.wait(timeout=10)
            daemons[victim] = scheduler(stack, tmp_path, 2 + kills)
            kills += 1
        assert kills >= 8

        def ledger() -> list[tuple[Any, ...]] | None:
            with stack.sql() as conn, conn.cursor() as cur:
                cur.execute("SELECT schedule_id, fire_at, outcome, task_id FROM"
                            " pulse_schedule_occurrences WHERE namespace_id = %s",
                            (namespace_id,))
                found = list(cur.fetchall())
            return found if len(found) >= len(expected) else None

        rows_found = wait_until(ledger, timeout=60, interval=0.5,
                                message=f"{len(expected)} ledger rows")
        seen = [(sid, at) for sid, at, _o, _t in rows_found]
        assert len(seen) == len(set(seen)), "an instant was fired twice"
        assert set(seen) == expected, (
            f"missing {len(expected - set(seen))}, unexpected {len(set(seen) - expected)}")
        assert {o for *_x, o, _t in rows_found} == {"FIRED"}
        task_ids = [t for *_x, t in rows_found]
        assert len(set(task_ids)) == len(task_ids)
        with stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                        (namespace_id,))
            assert cur.fetchone()[0] == len(expected), "every run has exactly one task"
            cur.execute("SELECT COUNT(*) FROM pulse_tasks t LEFT JOIN"
                        " pulse_schedule_occurrences o ON o.namespace_id = t.namespace_id"
                        " AND o.task_id = t.id WHERE t.namespace_id = %s AND o.id IS NULL",
                        (namespace_id,))
            assert cur.fetchone()[0] == 0, "a task without its ledger row"
        print(f"\nscheduler kill test: {len(expected)} instants, {kills} kills, "
              "0 duplicates, 0 missed")
    finally:
        for daemon in daemons:
            daemon.stop()
        stack.close()

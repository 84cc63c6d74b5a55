"""A database outage longer than the execution lease is Orbit's communication failure (§1b.2).

kill -9 of mariadbd for about 6 s under load, with a 4 s execution lease and re-run-unsafe
tasks: no lease may expire for the time nobody could renew, so every task ends SUCCEEDED with
one attempt, no handler runs twice, and the gap is compensated exactly once although two
dispatchers see it. Runs on a private MariaDB instance of its own.
"""

from __future__ import annotations

import collections
import random
import time
from pathlib import Path

import pytest

import orbit_devdb as devdb
from orbit_common.db.pool import DatabaseUrl
from tests.support.invariants import check
from tests.support.processes import kill_and_wait, wait_until
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

SEED = 1002
OUTAGE_S = 6.0


def test_outage_longer_than_the_lease_loses_no_lease(private_server: Path,
                                                     tmp_path: Path) -> None:
    rng = random.Random(SEED)
    instance = devdb.load(private_server)
    assert instance is not None
    stack = Stack(tmp_path, dispatchers=2, server=DatabaseUrl.parse(instance.url()))
    effects = tmp_path / "effects.log"
    try:
        stack.create_queue("outage", execution_lease_ms=4000, offer_lease_ms=4000,
                           retry={"max_attempts": 3, "initial_ms": 0, "max_ms": 0,
                                  "multiplier": "1", "jitter": "0"})
        total = 240
        accepted = stack.submit("outage", "sleep",
                                [{"ms": rng.randint(300, 900)} for _ in range(total)])
        for i in range(2):
            stack.start_worker("-m", "tests.support.sdk_worker", log_name=f"worker-{i}.log",
                               dispatcher=i, env={
                                   "ORBIT_QUEUES": "outage", "ORBIT_CONCURRENCY": "8",
                                   "ORBIT_INSTANCE_KEY": f"w-{i}",
                                   "ORBIT_SIDE_EFFECTS": str(effects)})
        wait_until(lambda: stack.states().get("SUCCEEDED", 0) >= 30, timeout=60,
                   message="work under way")
        running = stack.states().get("RUNNING", 0)
        assert running > 0  # the kill lands on leases that are live

        killed_at = time.monotonic()
        kill_and_wait(int(instance.pidfile.read_text()))
        time.sleep(OUTAGE_S - (time.monotonic() - killed_at))  # the outage's length (the fault)
        devdb.start(private_server)
        outage_s = time.monotonic() - killed_at

        states = stack.wait_settled(total, timeout=120)
        with stack.sql() as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT state, COUNT(*) FROM pulse_attempts GROUP BY state")
                attempts = dict(cur.fetchall())
                cur.execute("SELECT gap_us, tasks_extended FROM pulse_dispatch_outages")
                outages = cur.fetchall()
                cur.execute("SELECT LOWER(HEX(id)) FROM pulse_tasks")
                stored = {row[0] for row in cur.fetchall()}
            violations = check(conn, quiescent=True)
        runs = collections.Counter(line.split()[0] for line in effects.read_text().splitlines())
        rerun = {task: n for task, n in runs.items() if n > 1}
        print(f"FIGURES outage {outage_s:.1f} s; tasks {states}; attempts {attempts}; "
              f"outages compensated {outages}; tasks run twice {len(rerun)}")

        assert violations == []
        assert set(accepted) <= stored
        assert attempts.get("LEASE_EXPIRED", 0) == 0, attempts
        assert states == {"SUCCEEDED": total}, states
        assert rerun == {}
        # Compensated exactly once, by the length of the gap (at least the time the server was
        # down, at most that plus a heartbeat interval and the dispatchers' reconnect time).
        assert len(outages) == 1, outages
        gap_s, extended = outages[0][0] / 1e6, outages[0][1]
        assert OUTAGE_S - 1.0 <= gap_s <= outage_s + 6.0, (gap_s, outage_s)
        assert extended > 0
        assert all(d.proc.poll() is None for d in stack.dispatchers)
    finally:
        stack.close()

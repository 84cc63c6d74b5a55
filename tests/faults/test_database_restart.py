"""kill -9 of the database server mid-flow, then a restart: nothing acknowledged is lost.

Runs on a private MariaDB instance of its own (the shared test server stays up). The API, the
dispatcher and the SDK worker keep running through the outage and reconnect by themselves.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import orbit_devdb as devdb
from orbit_common.db.pool import DatabaseUrl
from tests.support.invariants import check
from tests.support.processes import kill_and_wait
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_database_killed_and_restarted_mid_flow(private_server: Path, tmp_path: Path) -> None:
    instance = devdb.load(private_server)
    assert instance is not None
    stack = Stack(tmp_path, dispatchers=1, server=DatabaseUrl.parse(instance.url()))
    try:
        stack.create_queue("db", execution_lease_ms=5000, offer_lease_ms=3000,
                           retry={"max_attempts": 10, "initial_ms": 0, "max_ms": 0,
                                  "multiplier": "1", "jitter": "0"})
        accepted = stack.submit("db", "sleep", [{"ms": 20} for _ in range(400)],
                                rerun_safe=True)
        stack.start_worker("-m", "tests.support.sdk_worker", log_name="worker.log", env={
            "ORBIT_QUEUES": "db", "ORBIT_CONCURRENCY": "8",
            "ORBIT_SIDE_EFFECTS": str(tmp_path / "effects.log")})
        deadline = time.monotonic() + 30
        while stack.states().get("SUCCEEDED", 0) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)

        kill_and_wait(int(instance.pidfile.read_text()))
        time.sleep(1.0)  # an outage long enough for every daemon to notice
        devdb.start(private_server)

        states = stack.wait_settled(len(accepted), timeout=120)
        assert states == {"SUCCEEDED": len(accepted)}
        with stack.sql() as conn:
            assert check(conn, quiescent=True) == []
            with conn.cursor() as cur:
                cur.execute("SELECT LOWER(HEX(id)) FROM pulse_tasks")
                stored = {row[0] for row in cur.fetchall()}
        assert set(accepted) <= stored  # every acknowledged submit survived the crash
        assert stack.api.proc.poll() is None
        assert stack.dispatchers[0].proc.poll() is None
    finally:
        stack.close()

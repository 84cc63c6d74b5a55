"""The daemons as real processes under the least-privileged runtime user (rows only, as the dev
stack runs them): the scheduler fires a schedule into tasks that a worker runs through the
dispatcher. (tests/e2e/test_tasks_e2e.py runs its whole task lifecycle the same way.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import Daemon, http
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_the_scheduler_and_the_dispatcher_work_as_the_runtime_user(tmp_path: Path) -> None:
    stack = Stack(tmp_path, runtime_user=True)
    scheduler: Daemon | None = None
    try:
        assert stack.runtime_user is not None
        assert stack.daemon_url.user == stack.runtime_user
        stack.create_queue("ticks")
        with stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT UTC_TIMESTAMP(6)")
            now = cur.fetchone()[0]
        status, body = stack.api_call("POST", "/schedules", {
            "name": "tick", "queue": "ticks",
            "rule": {"interval_ms": 1000, "timezone": "UTC",
                     "start_at": now.isoformat() + "Z"},
            "template": {"handler": "sleep", "input": {"ms": 1}}})
        assert status == 201, body
        scheduler = Daemon(["scheduler"], db_url=stack.daemon_url,
                           log=tmp_path / "scheduler.log")
        stack.start_worker("-m", "tests.support.sdk_worker", log_name="worker.log",
                           env={"ORBIT_QUEUES": "ticks", "ORBIT_CONCURRENCY": "4"})
        stack.wait_settled(2, timeout=30, settled=frozenset({"SUCCEEDED"}))
        status, details = http("GET", f"{scheduler.ops_url}/readyz")
        assert status == 200, details
        for daemon in (stack.api, *stack.dispatchers, scheduler):
            assert "Access denied" not in daemon.output()
            assert "command denied" not in daemon.output()
    finally:
        if scheduler is not None:
            scheduler.stop()
        stack.close()

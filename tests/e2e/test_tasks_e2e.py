"""Tasks end to end with real processes: the API, a dispatcher and an SDK worker process.

Through the SDK client: submit, see it run on a worker and see the result; cancel a running task;
review an uncertain one; retry a failed one. Then the invariant checker over the real tables.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from orbit_sdk import Client

from tests.support.stack import Stack

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # The daemons run as a least-privileged runtime user (rows only), as the dev stack runs them:
    # every path below works without DDL privileges.
    s = Stack(tmp_path, dispatchers=1, runtime_user=True)
    try:
        yield s
    finally:
        s.close()


async def wait_state(orbit: Client, task_id: str, *states: str, timeout: float = 30) -> str:
    async with asyncio.timeout(timeout):
        while True:
            task = await orbit.get_task(task_id)
            if task.state in states:
                return task.state
            await asyncio.sleep(0.1)


async def test_submit_run_cancel_review_retry(stack: Stack, tmp_path: Path) -> None:
    stack.create_queue("e2e", execution_lease_ms=3000)
    worker = stack.start_worker("-m", "tests.support.sdk_worker", log_name="worker.log",
                                env={"ORBIT_QUEUES": "e2e", "ORBIT_CONCURRENCY": "8",
                                     "ORBIT_SIDE_EFFECTS": str(tmp_path / "effects.log")})
    async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
        # Submit and see the result.
        done = await orbit.submit("e2e", "sleep", {"ms": 50, "n": 12345678901234567890.123456789},
                                  rerun_safe=True)
        assert await wait_state(orbit, done.id, "SUCCEEDED") == "SUCCEEDED"
        task = await orbit.get_task(done.id)
        assert task.result == {"slept": 50}
        attempts = await orbit.task_attempts(done.id)
        assert [a.generation for a in attempts] == [1]

        # Cancel a running one: the worker is told, stops, and confirms.
        running = await orbit.submit("e2e", "wait_cancel", {})
        assert await wait_state(orbit, running.id, "RUNNING") == "RUNNING"
        cancelled = await orbit.cancel_task(running.id, "operator changed their mind")
        assert cancelled.state == "RUNNING"
        assert await wait_state(orbit, running.id, "CANCELLED") == "CANCELLED"

        # An uncertain outcome waits for a human, who reviews it.
        uncertain = await orbit.submit("e2e", "unknown", {})
        assert await wait_state(orbit, uncertain.id, "NEEDS_REVIEW") == "NEEDS_REVIEW"
        judged = await orbit.get_task(uncertain.id)
        reviewed = await orbit.review_task(uncertain.id, "succeeded", "checked the ledger",
                                           evidence_ref="TICKET-1", execution_ended=True,
                                           revision=judged.revision, result={"ok": True})
        assert reviewed.state == "SUCCEEDED"

        # A failed task is retried by hand as a new task.
        failed = await orbit.submit("e2e", "fail", {"retryable": False})
        assert await wait_state(orbit, failed.id, "FAILED") == "FAILED"
        successor = await orbit.retry_task(failed.id, "fixed the input", rerun_confirmed=True)
        assert successor.id != failed.id
        assert await wait_state(orbit, successor.id, "FAILED") == "FAILED"

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    from tests.support.invariants import check

    with stack.sql() as conn:
        assert check(conn, quiescent=True) == []

"""Fault test for keyed concurrency with real processes: the API, two dispatchers and SDK workers
(tests/support/sdk_worker.py), and kill -9 of the worker that holds a key's permit.

A dead holder keeps its key: no other task with that key is granted, while the other keys and
unkeyed tasks keep running, until the recovery scan ends the lapsed lease (database time). The
next holder's fencing token is larger, the permits of the key never overlap in time, and the
invariant checker is green at quiescence.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.invariants import check
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

WORKER = ("-m", "tests.support.sdk_worker")
KEY = "acct-1"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, dispatchers=2)
    try:
        yield s
    finally:
        s.close()


def worker(stack: Stack, tmp_path: Path, name: str, *, dispatcher: int) -> Any:
    return stack.start_worker(*WORKER, log_name=f"{name}.log", dispatcher=dispatcher, env={
        "ORBIT_QUEUES": "keyed", "ORBIT_CONCURRENCY": "4", "ORBIT_INSTANCE_KEY": name,
        "ORBIT_SIDE_EFFECTS": str(tmp_path / "effects.log")})


def one(stack: Stack, sql: str, *params: Any) -> tuple[Any, ...]:
    """One row of one statement (a statement reads one consistent snapshot)."""
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
        assert row is not None
        return tuple(row)


def state(stack: Stack, task: str) -> tuple[str, int]:
    found = one(stack, "SELECT state, attempts_used FROM pulse_tasks WHERE id = UNHEX(%s)", task)
    return str(found[0]), int(found[1])


# Whether ``held``'s permit is still valid, and how many attempts ``blocked`` has, at one instant.
HOLD_AND_WAIT = """
SELECT (SELECT COUNT(*) FROM pulse_permits WHERE task_id = UNHEX(%s) AND released_at IS NULL),
       (SELECT attempts_used FROM pulse_tasks WHERE id = UNHEX(%s)),
       (SELECT state FROM pulse_tasks WHERE id = UNHEX(%s))
"""


def poll(condition: Any, *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # a poll interval: every decision is read from the database
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_kill9_of_a_key_holder_keeps_the_key_until_recovery(stack: Stack,
                                                            tmp_path: Path) -> None:
    stack.create_queue("keyed", offer_lease_ms=2000, execution_lease_ms=2000,
                       retry={"max_attempts": 2, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    # The handler waits until cancelled: only the kill ends this attempt.
    (held,) = stack.submit("keyed", "wait_cancel", [{}], concurrency_key=KEY,
                           execution_lease_ms=1500)
    victim = worker(stack, tmp_path, "victim", dispatcher=0)
    poll(lambda: state(stack, held) == ("RUNNING", 1), timeout=30, what="the holder to run")
    worker(stack, tmp_path, "healthy", dispatcher=1)
    (blocked,) = stack.submit("keyed", "sleep", [{"ms": 10}], concurrency_key=KEY)
    others = (stack.submit("keyed", "sleep", [{"ms": 10}] * 3)
              + stack.submit("keyed", "sleep", [{"ms": 10}], concurrency_key="acct-2"))

    # Work goes on around the held key while its holder lives (and renews)...
    def others_done() -> bool:
        valid, attempts, _ = one(stack, HOLD_AND_WAIT, held, blocked, blocked)
        assert (valid, attempts) == (1, 0), "the key was granted twice"
        return all(state(stack, t)[0] == "SUCCEEDED" for t in others)

    poll(others_done, timeout=30, what="the other tasks to finish")
    assert state(stack, held) == ("RUNNING", 1)

    # ... and after it dies, until recovery ends its lapsed lease.
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)

    def handed_over() -> bool:
        valid, attempts, _ = one(stack, HOLD_AND_WAIT, held, blocked, blocked)
        if valid:
            assert attempts == 0, "granted while the dead holder's permit was valid"
        return attempts > 0

    poll(handed_over, timeout=30, what="the key to pass to the next task")
    poll(lambda: state(stack, blocked)[0] == "SUCCEEDED", timeout=30,
         what="the next holder to finish")
    # Not rerun-safe: the dead holder's task awaits review; it never ran twice.
    assert state(stack, held) == ("NEEDS_REVIEW", 1)
    effects = [line.split()[0] for line in (tmp_path / "effects.log").read_text().splitlines()]
    assert (effects.count(held), effects.count(blocked)) == (1, 1)

    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT LOWER(HEX(p.task_id)), p.token, a.concurrency_token,"
                    " p.release_reason, p.acquired_at, p.released_at FROM pulse_permits p"
                    " JOIN pulse_attempts a ON a.namespace_id = p.namespace_id"
                    " AND a.id = p.attempt_id JOIN pulse_concurrency_limits l"
                    " ON l.namespace_id = p.namespace_id AND l.id = p.limit_id"
                    " WHERE l.scope_key = %s ORDER BY p.token", (KEY.encode(),))
        permits = cur.fetchall()
        cur.execute("SELECT revision, held_permits FROM pulse_concurrency_limits"
                    " WHERE scope_key = %s", (KEY.encode(),))
        key = cur.fetchone()
    assert [(p[0], p[3]) for p in permits] == [(held, "LEASE_EXPIRED"), (blocked, "SUCCEEDED")]
    (first, second) = permits
    assert first[1] == first[2] == 1
    assert second[1] == second[2] == 3 > first[1]  # the next holder's token is larger
    assert first[5] <= second[4]  # never two holders at one instant
    assert key == (4, 0)  # two grants, two releases
    with stack.sql() as conn:
        assert check(conn, quiescent=True) == []

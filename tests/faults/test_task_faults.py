"""Fault tests for tasks with real processes (API, dispatchers, SDK workers) and kill -9.

Every test ends with the invariant checker at quiescence and, where workers ran handlers, a
comparison of the side-effect log (task, attempt, generation as the handler saw them) with the
database: every effect belongs to an attempt the database granted, and a task reported
SUCCEEDED by a generation that was superseded is impossible.
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


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, dispatchers=2)
    try:
        yield s
    finally:
        s.close()


def worker(stack: Stack, tmp_path: Path, name: str, *, queues: str, dispatcher: int = 0,
           concurrency: int = 8) -> Any:
    return stack.start_worker(*WORKER, log_name=f"{name}.log", dispatcher=dispatcher, env={
        "ORBIT_QUEUES": queues, "ORBIT_CONCURRENCY": str(concurrency),
        "ORBIT_INSTANCE_KEY": name, "ORBIT_SIDE_EFFECTS": str(tmp_path / "effects.log")})


def kill9(proc: Any) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def effects(tmp_path: Path) -> list[tuple[str, str, int]]:
    path = tmp_path / "effects.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        task, attempt, generation = line.split()
        rows.append((task, attempt, int(generation)))
    return rows


def compare_effects(stack: Stack, tmp_path: Path) -> None:
    """Each handler run belongs to a granted attempt of its task with the same generation."""
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT LOWER(HEX(task_id)), LOWER(HEX(id)), generation, state"
                    " FROM pulse_attempts")
        attempts = {row[1]: (row[0], row[2], row[3]) for row in cur.fetchall()}
    for task, attempt, generation in effects(tmp_path):
        assert attempt in attempts, f"effect of an attempt the database never granted: {attempt}"
        assert attempts[attempt][:2] == (task, generation)
        # An effect only comes from an attempt that was approved to start.
        assert attempts[attempt][2] not in {"OFFERED", "OFFER_EXPIRED", "WITHDRAWN"}


def assert_invariants(stack: Stack) -> None:
    with stack.sql() as conn:
        violations = check(conn, quiescent=True)
    assert violations == []


def wait_running(stack: Stack, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stack.states().get("RUNNING", 0) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"never saw {count} RUNNING tasks: {stack.states()}")


def test_kill9_worker_mid_task_reruns_safe_and_reviews_unsafe(stack: Stack,
                                                              tmp_path: Path) -> None:
    stack.create_queue("faults", execution_lease_ms=1500, offer_lease_ms=1500,
                       retry={"max_attempts": 3, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    safe = stack.submit("faults", "sleep", [{"ms": 4000} for _ in range(4)], rerun_safe=True)
    unsafe = stack.submit("faults", "sleep", [{"ms": 4000} for _ in range(4)],
                          rerun_safe=False)
    victim = worker(stack, tmp_path, "victim", queues="faults")
    wait_running(stack, 8)
    kill9(victim)
    # A healthy worker picks up what recovery hands back.
    worker(stack, tmp_path, "healthy", queues="faults", dispatcher=1)
    states = stack.wait_settled(8, timeout=60)
    assert states == {"SUCCEEDED": 4, "NEEDS_REVIEW": 4}
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT LOWER(HEX(id)), state, attempts_used, effect_uncertain"
                    " FROM pulse_tasks")
        rows = {row[0]: row[1:] for row in cur.fetchall()}
    for task_id in safe:
        assert rows[task_id][0] == "SUCCEEDED"
        assert rows[task_id][1] == 2  # re-run once after the lost lease
        assert rows[task_id][2] == 0  # the later success cleared the carried uncertainty
    for task_id in unsafe:
        assert rows[task_id][0] == "NEEDS_REVIEW"
        assert rows[task_id][1] == 1  # never silently re-run
        assert rows[task_id][2] == 1
    compare_effects(stack, tmp_path)
    assert_invariants(stack)


def test_kill9_dispatcher_another_replica_recovers(stack: Stack, tmp_path: Path) -> None:
    stack.create_queue("faults", execution_lease_ms=1500, offer_lease_ms=1500)
    stack.submit("faults", "sleep", [{"ms": 3000} for _ in range(6)], rerun_safe=True)
    first = worker(stack, tmp_path, "on-d0", queues="faults", dispatcher=0, concurrency=6)
    wait_running(stack, 6)
    # The dispatcher holding every session dies; its workers lose their channel (and with it
    # the renewals), so the leases lapse and the surviving replica's recovery scan requeues.
    stack.dispatchers[0].proc.send_signal(signal.SIGKILL)
    stack.dispatchers[0].proc.wait(timeout=10)
    kill9(first)
    worker(stack, tmp_path, "on-d1", queues="faults", dispatcher=1, concurrency=6)
    states = stack.wait_settled(6, timeout=60)
    assert states == {"SUCCEEDED": 6}
    compare_effects(stack, tmp_path)
    assert_invariants(stack)


def test_racing_dispatchers_and_workers_with_kills_never_double_grant(
    stack: Stack, tmp_path: Path
) -> None:
    stack.create_queue("race", execution_lease_ms=1500, offer_lease_ms=1000,
                       retry={"max_attempts": 10, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    total = 600
    stack.submit("race", "sleep", [{"ms": i % 7} for i in range(total)], rerun_safe=True)
    workers = [worker(stack, tmp_path, f"w{i}", queues="race", dispatcher=i % 2, concurrency=8)
               for i in range(4)]
    # Kill a worker now and then while the others keep going; replace it.
    for round_ in range(3):
        time.sleep(0.7)
        kill9(workers[round_])
        workers[round_] = worker(stack, tmp_path, f"w{round_}-{round_}", queues="race",
                                 dispatcher=round_ % 2)
    states = stack.wait_settled(total, timeout=120)
    # Every task is rerun-safe with a budget of 10: lost leases are re-run, never reviewed.
    assert states == {"SUCCEEDED": total}
    compare_effects(stack, tmp_path)
    assert_invariants(stack)


def test_sigstopped_worker_is_fenced_and_its_late_result_becomes_evidence(
    stack: Stack, tmp_path: Path
) -> None:
    stack.create_queue("stop", execution_lease_ms=1000, offer_lease_ms=1000,
                       retry={"max_attempts": 3, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    (task_id,) = stack.submit("stop", "sleep", [{"ms": 2500}], rerun_safe=True)
    frozen = worker(stack, tmp_path, "frozen", queues="stop", dispatcher=0, concurrency=1)
    wait_running(stack, 1)
    os.killpg(frozen.pid, signal.SIGSTOP)  # past its lease: no renewals, no result
    worker(stack, tmp_path, "healthy", queues="stop", dispatcher=1, concurrency=1)
    stack.wait_settled(1, timeout=60)
    os.killpg(frozen.pid, signal.SIGCONT)  # the stale holder wakes up and reports

    def evidence() -> int:
        with stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pulse_attempt_evidence e JOIN pulse_attempts a"
                        " ON a.namespace_id = e.namespace_id AND a.id = e.attempt_id"
                        " WHERE a.generation = 1 AND LOWER(HEX(a.task_id)) = %s", (task_id,))
            return int(cur.fetchone()[0])

    deadline = time.monotonic() + 30
    while evidence() == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert evidence() >= 1, "the stale holder's late report was not kept as evidence"
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT state, attempts_used FROM pulse_tasks WHERE LOWER(HEX(id)) = %s",
                    (task_id,))
        state, attempts_used = cur.fetchone()
    assert state == "SUCCEEDED"
    assert attempts_used == 2  # the second grant finished it; the first was fenced
    compare_effects(stack, tmp_path)
    assert_invariants(stack)


def test_limits_hold_with_racing_dispatchers_and_killed_workers(
    stack: Stack, tmp_path: Path
) -> None:
    """Flow control under concurrent load from two dispatchers: a queue cap, a start window and
    concurrency keys, with workers killed mid-run. The invariant checker (counters, windows,
    permits: one valid permit per key, tokens strictly increasing) decides."""
    stack.create_queue("limited", execution_lease_ms=1500, offer_lease_ms=1000,
                       max_concurrent_attempts=6, max_starts_per_second=400,
                       retry={"max_attempts": 10, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    total = 300
    status, body = stack.api_call("POST", "/tasks/batch", {"tasks": [
        {"queue": "limited", "handler": "sleep", "input": {"ms": i % 5}, "rerun_safe": True,
         **({"concurrency_key": f"acct-{i % 10}"} if i % 2 == 0 else {})}
        for i in range(total)]})
    assert status == 201, body
    workers = [worker(stack, tmp_path, f"l{i}", queues="limited", dispatcher=i % 2,
                      concurrency=8) for i in range(4)]
    for round_ in range(2):
        time.sleep(0.7)
        kill9(workers[round_])
        workers[round_] = worker(stack, tmp_path, f"l{round_}-{round_}", queues="limited",
                                 dispatcher=round_ % 2)
    states = stack.wait_settled(total, timeout=120)
    assert states == {"SUCCEEDED": total}
    with stack.sql() as conn, conn.cursor() as cur:
        # Every keyed attempt got a token, and per key the tokens are distinct.
        cur.execute("SELECT COUNT(*), COUNT(DISTINCT t.concurrency_key, a.concurrency_token)"
                    " FROM pulse_attempts a JOIN pulse_tasks t ON t.namespace_id ="
                    " a.namespace_id AND t.id = a.task_id WHERE t.concurrency_key IS NOT NULL")
        keyed, distinct = cur.fetchone()
        assert keyed >= total // 2
        assert keyed == distinct
        cur.execute("SELECT active_attempts, unfinished_tasks FROM pulse_queues"
                    " WHERE name = 'limited'")
        assert cur.fetchone() == (0, 0)
    compare_effects(stack, tmp_path)
    assert_invariants(stack)

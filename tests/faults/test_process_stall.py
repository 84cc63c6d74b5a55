"""One frozen process must not stall the whole queue (§1b.1).

Two dispatchers, the API (a submitter keeps it busy) and, in the scheduler case, a scheduler
firing into the same queue share one queue under load from SDK workers, one worker per
dispatcher. One process (a dispatcher, the API, the scheduler) is SIGSTOPped for 10 s at a
moment when it is inside a write transaction (stopped at seeded random moments until the server
shows one of its transactions open, idle and holding written rows -- the frozen holder of the
scenario), then SIGCONTed. Meanwhile the worker on the healthy dispatcher must keep finishing
(largest gap between its consecutive completions, by the database's finished_at, under 2 s),
must lose no lease, and no task may go to NEEDS_REVIEW because of the stall. The frozen
dispatcher's own worker cannot renew while its dispatcher is stopped; its leases may lapse
(that is the stopped process's own failure), so its tasks are not counted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.invariants import check
from tests.support.processes import Daemon, free_port, wait_until
from tests.support.stack import Stack

# alone: the throughput-gap figure (< 2 s) is the platform's, not the test machine's; beside
# another xdist worker's CPU-heavy tests on two cores it measured 2.04 s once (0.4-1.0 s alone).
# The whole test's budget covers its own deadlines: catching the victim inside a transaction
# (up to 80 tries), the stop, and the settle wait (120 s) -- the default 120 s did not (one run
# was cut off by pytest-timeout while its settle wait still had most of its 120 s).
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(420)]

STOP_S = 10.0
MAX_GAP_S = 2.0
LEASE_MS = 4000
BACKLOG = 500
HEALTHY = "healthy"
FROZEN = "frozen"

# Transactions holding rows they wrote whose connection is idle: the server waits for the
# client's next statement. Seen twice 0.1 s apart, it is a stopped client's (a running one's
# transactions last milliseconds).
IDLE_WRITERS = """
SELECT t.trx_id FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE p.DB = DATABASE() AND p.COMMAND = 'Sleep' AND t.trx_rows_modified > 0
"""


class StallStack(Stack):
    """The stack, plus daemons a scenario adds (stopped with it)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, dispatchers=2)
        self.extra_daemons: list[Daemon] = []

    def close(self) -> None:
        for daemon in self.extra_daemons:
            daemon.signal(signal.SIGCONT)
            daemon.stop()
        super().close()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StallStack]:
    s = StallStack(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _db_now(stack: Stack) -> dt.datetime:
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT UTC_TIMESTAMP(6)")
        return cur.fetchone()[0]  # type: ignore[no-any-return]


def _frozen_holders(stack: Stack) -> set[Any]:
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute(IDLE_WRITERS)
        first = {row[0] for row in cur.fetchall()}
        time.sleep(0.1)  # two samples apart: "idle" means idle in both (a measurement, no wait)
        cur.execute(IDLE_WRITERS)
        return first & {row[0] for row in cur.fetchall()}


def _freeze_inside_a_transaction(stack: Stack, daemon: Daemon,
                                 rng: random.Random) -> tuple[dt.datetime, int]:
    """SIGSTOP ``daemon`` at seeded random moments until it is caught holding written rows;
    returns the database time of the stop that caught it and how many stops it took."""
    for tries in range(1, 81):
        time.sleep(rng.uniform(0.02, 0.25))  # the seeded stop cadence (fault injection)
        stopped_at = _db_now(stack)
        daemon.signal(signal.SIGSTOP)
        # The server finishes the statement the process was running; then a transaction it
        # holds shows as idle with written rows. Polled with a deadline, not assumed.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: _frozen_holders(stack), timeout=0.5, interval=0.02,
                       message="the stopped process holding written rows")
            return stopped_at, tries
        daemon.signal(signal.SIGCONT)
    raise AssertionError("never caught the process inside a write transaction")


def _work(rng: random.Random, n: int) -> list[dict[str, int]]:
    """Handlers of 1-2 s: with a 4 s lease every one is renewed at least once, and 32 slots
    still finish one about every 0.1 s."""
    return [{"ms": rng.randint(1000, 2000)} for _ in range(n)]


class Submitter(threading.Thread):
    """Submits through the API back to back while the victim is being caught (the API's
    submits hold the queue's counter row), so that the API is often inside a transaction."""

    def __init__(self, stack: Stack, queue: str, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.stack, self.queue, self.rng = stack, queue, rng
        self.stop = threading.Event()
        self.accepted: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            # An API call may time out while the API is stopped.
            with contextlib.suppress(OSError, AssertionError):
                self.accepted += self.stack.submit(self.queue, "sleep", _work(self.rng, 1))


def _scheduler(stack: StallStack, tmp_path: Path) -> Daemon:
    """A scheduler firing short tasks into the same queue: 20 schedules every second, their
    instants spread over the second, so the scheduler is often inside a firing transaction
    (which holds the queue's counter row)."""
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT UTC_TIMESTAMP(6)")
        now = cur.fetchone()[0]
    for i in range(20):
        start = now + dt.timedelta(milliseconds=50 * i)
        status, body = stack.api_call("POST", "/schedules", {
            "name": f"tick-{i}", "queue": "stall",
            "rule": {"interval_ms": 1000, "timezone": "UTC",
                     "start_at": start.isoformat() + "Z"},
            "template": {"handler": "sleep", "input": {"ms": 1}}})
        assert status == 201, body
    daemon = Daemon(["scheduler"], db_url=stack.url, log=tmp_path / "scheduler.log", env={
        "ORBIT_SERVICE_METRICS_PORT": str(free_port()), "ORBIT_SERVICE_DRAIN_TIMEOUT_S": "5"})
    stack.extra_daemons.append(daemon)
    return daemon


def _run(stack: StallStack, tmp_path: Path, *, victim: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    began = time.monotonic()
    stack.create_queue("stall", execution_lease_ms=LEASE_MS, offer_lease_ms=LEASE_MS,
                       retry={"max_attempts": 3, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    # A backlog that outlasts the stop: the healthy side always has work to finish.
    stack.submit("stall", "sleep", _work(rng, BACKLOG))
    for index, name in ((0, FROZEN), (1, HEALTHY)):
        stack.start_worker("-m", "tests.support.sdk_worker", log_name=f"worker-{name}.log",
                           dispatcher=index, env={
                               "ORBIT_QUEUES": "stall", "ORBIT_CONCURRENCY": "16",
                               "ORBIT_INSTANCE_KEY": name,
                               "ORBIT_SIDE_EFFECTS": str(tmp_path / "effects.log")})
    scheduler = _scheduler(stack, tmp_path) if victim == "scheduler" else None
    wait_until(lambda: stack.states().get("SUCCEEDED", 0) >= 30, timeout=60,
               message="work under way")
    submitter = Submitter(stack, "stall", random.Random(seed + 1))
    submitter.start()

    daemon = {"dispatcher": stack.dispatchers[0], "api": stack.api,
              "scheduler": scheduler}[victim]
    assert daemon is not None
    stopped_at, tries = _freeze_inside_a_transaction(stack, daemon, rng)
    submitter.stop.set()  # its call in flight ends once the API runs again
    # The stop lasts STOP_S of database time from the moment it began (the fault's length).
    time.sleep(max(0.0, STOP_S - (_db_now(stack) - stopped_at).total_seconds()))
    daemon.signal(signal.SIGCONT)
    resumed_at = _db_now(stack)
    waiting_at_resume = stack.states().get("WAITING", 0)
    submitter.join(timeout=30)
    if scheduler is not None:
        scheduler.signal(signal.SIGTERM)  # no more fires: the task count is final
        scheduler.wait(timeout=30)
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM pulse_tasks")
        total = int(cur.fetchone()[0])
    assert total >= len(submitter.accepted) + BACKLOG
    stack.wait_settled(total, timeout=120)

    with stack.sql() as conn:
        with conn.cursor() as cur:
            # Completions by the healthy worker around the stop (database time).
            cur.execute(
                "SELECT a.finished_at FROM pulse_attempts a JOIN pulse_worker_instances w"
                " ON w.namespace_id = a.namespace_id AND w.id = a.worker_instance_id"
                " WHERE w.instance_key = %s AND a.state = 'SUCCEEDED'"
                " AND a.finished_at BETWEEN %s AND %s ORDER BY a.finished_at",
                (HEALTHY, stopped_at - dt.timedelta(seconds=1), resumed_at))
            done = [row[0] for row in cur.fetchall()]
            cur.execute(
                "SELECT w.instance_key, a.state, COUNT(*) FROM pulse_attempts a"
                " JOIN pulse_worker_instances w"
                " ON w.namespace_id = a.namespace_id AND w.id = a.worker_instance_id"
                " GROUP BY w.instance_key, a.state")
            attempts = {(key.decode(), state): n for key, state, n in cur.fetchall()}
            cur.execute(
                "SELECT w.instance_key, COUNT(*) FROM pulse_tasks t JOIN pulse_attempts a"
                " ON a.namespace_id = t.namespace_id AND a.task_id = t.id"
                " AND a.generation = t.attempts_used"
                " JOIN pulse_worker_instances w"
                " ON w.namespace_id = a.namespace_id AND w.id = a.worker_instance_id"
                " WHERE t.state = 'NEEDS_REVIEW' GROUP BY w.instance_key")
            review = {key.decode(): n for key, n in cur.fetchall()}
            cur.execute("SELECT outcome_reason, COUNT(*) FROM pulse_tasks"
                        " WHERE state = 'NEEDS_REVIEW' GROUP BY outcome_reason")
            reasons = dict(cur.fetchall())
        violations = check(conn, quiescent=True)
    edges = [stopped_at, *done, resumed_at]
    gap = max((b - a).total_seconds() for a, b in itertools.pairwise(edges))
    figures = {"victim": victim, "stops_to_catch": tries, "healthy_completions": len(done),
               "waiting_at_resume": waiting_at_resume,
               "max_gap_s": round(gap, 2),
               "healthy_lease_expired": attempts.get((HEALTHY, "LEASE_EXPIRED"), 0),
               "frozen_lease_expired": attempts.get((FROZEN, "LEASE_EXPIRED"), 0),
               "needs_review": review, "review_reasons": reasons, "violations": violations}
    figures["seconds"] = round(time.monotonic() - began, 1)
    print("FIGURES", figures)
    return figures


@pytest.mark.parametrize(("victim", "seed"), [("dispatcher", 11), ("api", 12),
                                              ("scheduler", 13)])
def test_a_stopped_process_does_not_stall_the_others(stack: StallStack, tmp_path: Path,
                                                     victim: str, seed: int) -> None:
    figures = _run(stack, tmp_path, victim=victim, seed=seed)
    assert figures["waiting_at_resume"] > 0  # work was there to do all along
    assert figures["violations"] == []
    assert figures["healthy_lease_expired"] == 0
    assert figures["max_gap_s"] < MAX_GAP_S
    # Only the stopped dispatcher's own worker may have lost leases (it could not renew).
    assert set(figures["needs_review"]) <= ({FROZEN} if victim == "dispatcher" else set())
    if victim != "dispatcher":
        assert figures["frozen_lease_expired"] == 0

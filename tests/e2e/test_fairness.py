"""Fair dispatch with real processes: a flood from one application does not starve another.

Application A submits a flood (``ORBIT_FAIRNESS_FLOOD`` tasks, 3,000 by default so CI stays
fast; the issue's 20,000 is for a manual or benchmark run) and runs four SDK worker processes
with 128 slots each; application B runs one worker with 64 slots and submits 200 tasks once A's
flood is being worked. Everything is read back from the database (``pulse_attempts.offered_at``
and ``started_at`` per application), so the assertions are about order and shares, not timings.

Why this set-up and these bounds
    The dispatcher runs with ``claim_batch=1`` (every grant is one claim turn, so the grant share
    is the turn share), ``claim_concurrency=1`` and a small database pool (``pool_max=4``), so
    claiming, not the workers, is the scarce resource: the workers keep free slots, every
    session stays hungry. The pool alternates turns between applications, so while both have
    waiting tasks B's share of grants is about 1/2 (measured 0.50). The per-session claimers
    this replaced let A's four sessions hold the connections and gave B 0.075 in the same set-up,
    finishing B only after A's backlog had drained. The test asserts B >= 35 %: well below the
    round-robin 1/2 (B's worker may now and then be out of credit) and far above both the
    per-session 1/5 and the measured starvation. And B's 200 tasks must all have started before
    A's backlog is drained (A's last offer).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.invariants import check
from tests.support.processes import http, wait_until
from tests.support.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FLOOD = int(os.environ.get("ORBIT_FAIRNESS_FLOOD", "3000"))
SMALL = 200
A_WORKERS, A_SLOTS, B_SLOTS = 4, 128, 64
MIN_B_SHARE = 0.35


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    # Read by the daemons (the Stack passes its environment on): see the module docstring.
    monkeypatch.setenv("ORBIT_DISPATCHER_CLAIM_BATCH", "1")
    monkeypatch.setenv("ORBIT_DISPATCHER_CLAIM_CONCURRENCY", "1")
    monkeypatch.setenv("ORBIT_DATABASE_POOL_MAX", "4")
    s = Stack(tmp_path, dispatchers=1)
    try:
        yield s
    finally:
        s.close()


def bootstrap_second_application(stack: Stack) -> dict[str, Any]:
    """Application B: its own namespace and all-access key, on the same database."""
    boot = subprocess.run(
        [sys.executable, "-m", "orbit_cli", "admin", "bootstrap", "--application", "small",
         "--namespace", "small"],
        env={**os.environ, "ORBIT_DATABASE_URL": stack.url.render(hide_password=False)},
        capture_output=True, text=True, check=True)
    return dict(json.loads(boot.stdout))


def sdk_worker(stack: Stack, name: str, *, queue: str, slots: int,
               app: dict[str, Any] | None = None) -> subprocess.Popen[Any]:
    env = {"ORBIT_QUEUES": queue, "ORBIT_CONCURRENCY": str(slots), "ORBIT_INSTANCE_KEY": name}
    if app is not None:
        env |= {"ORBIT_API_KEY": app["api_key"], "ORBIT_NAMESPACE": app["namespace"]}
    return stack.start_worker("-m", "tests.support.sdk_worker", log_name=f"{name}.log", env=env)


def count(stack: Stack, sql: str, *params: Any) -> int:
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return int(cur.fetchone()[0])


def attempts_by_application(stack: Stack) -> list[tuple[str, dt.datetime, dt.datetime | None,
                                                        bytes]]:
    """(application name, offered_at, started_at, session) for every attempt, in offer order."""
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT p.name, a.offered_at, a.started_at, a.worker_session_id"
            " FROM pulse_attempts a JOIN orbit_namespaces n ON n.id = a.namespace_id"
            " JOIN orbit_applications p ON p.id = n.application_id"
            " ORDER BY a.offered_at, a.id")
        return list(cur.fetchall())


def test_a_flood_does_not_starve_a_small_application(stack: Stack) -> None:
    small = bootstrap_second_application(stack)
    stack.create_queue("flood")
    status, body = http("POST", f"{stack.api.url}/v1/namespaces/{small['namespace']}/queues",
                        headers={"Authorization": f"Bearer {small['api_key']}"},
                        body={"name": "small"})
    assert status == 201, body
    stack.submit("flood", "sleep", [{"ms": 5} for _ in range(FLOOD)], rerun_safe=True)
    workers = [sdk_worker(stack, f"flood-{i}", queue="flood", slots=A_SLOTS)
               for i in range(A_WORKERS)]
    workers.append(sdk_worker(stack, "small-0", queue="small", slots=B_SLOTS, app=small))

    # B submits once A's flood is being worked and B's worker is connected (and idle).
    wait_until(lambda: count(stack, "SELECT COUNT(*) FROM pulse_worker_sessions s"
                                    " JOIN orbit_namespaces n ON n.id = s.namespace_id"
                                    " WHERE n.name = %s AND s.state = 'ACTIVE'",
                             small["namespace"]) >= 1,
               timeout=60, message="application B's worker to register")
    wait_until(lambda: stack.states().get("SUCCEEDED", 0) >= 100, timeout=120,
               message="the flood to be under way")
    status, body = http(
        "POST", f"{stack.api.url}/v1/namespaces/{small['namespace']}/tasks/batch",
        headers={"Authorization": f"Bearer {small['api_key']}"},
        body={"tasks": [{"queue": "small", "handler": "sleep", "input": {"ms": 5, "n": i},
                         "rerun_safe": True} for i in range(SMALL)]}, timeout=30)
    assert status in {200, 201}, body
    stack.wait_settled(FLOOD + SMALL, timeout=480)

    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(timeout=60) == 0

    rows = attempts_by_application(stack)
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT MIN(t.created_at) FROM pulse_tasks t"
                    " JOIN orbit_namespaces n ON n.id = t.namespace_id WHERE n.name = %s",
                    (small["namespace"],))
        b_submitted = cur.fetchone()[0]
    a_rows = [r for r in rows if r[0] == "stack"]
    b_rows = [r for r in rows if r[0] == "small"]
    assert len(b_rows) >= SMALL
    assert len(a_rows) >= FLOOD
    b_first_offer, b_last_offer = b_rows[0][1], b_rows[-1][1]
    b_starts = sorted(r[2] for r in b_rows if r[2] is not None)
    a_last_offer = a_rows[-1][1]

    # While both had waiting tasks: from B's first grant to B's last, A's backlog never ran dry.
    window = [r for r in rows if b_first_offer <= r[1] <= b_last_offer]
    grants = Counter(r[0] for r in window)
    turns = Counter(r[0] for r in {(r[0], r[3], r[1]) for r in window})
    b_share = grants["small"] / sum(grants.values())
    b_turn_share = turns["small"] / sum(turns.values())
    a_left_after_b = sum(1 for r in a_rows if r[1] > b_last_offer)

    def ms(moment: dt.datetime) -> float:
        return (moment - b_submitted).total_seconds() * 1000

    figures = {
        "flood": FLOOD, "small": SMALL,
        "b_first_start_ms": round(ms(b_starts[0])),
        "b_last_start_ms": round(ms(b_starts[-1])),
        "a_backlog_drained_ms": round(ms(a_last_offer)),
        "window_grants": dict(grants), "b_grant_share": round(b_share, 3),
        "b_turn_share": round(b_turn_share, 3),
        "a_offers_after_b_done": a_left_after_b,
    }
    print("fairness figures:", json.dumps(figures, sort_keys=True))

    assert b_starts[-1] < a_last_offer, figures  # B done before A's backlog drained
    assert a_left_after_b > 0, figures
    assert b_share >= MIN_B_SHARE, figures
    with stack.sql() as conn:
        assert check(conn, quiescent=True) == []

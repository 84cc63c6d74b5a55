"""The stop of workflow instances under real processes (docs/weave/stop.md): the API, a
dispatcher, an SDK worker subprocess and two ``orbit weave`` engines on a database of their own.

Each instance is inside a PARALLEL block whose branches all run a task the worker holds until it
is cancelled (``wait_cancel``). The instances are cancelled over HTTP while every branch runs:
the cancel intents reach the worker process (its handlers are cancelled and it reports
``cancelled``: a RUNNING task ends CANCELLED only by its worker's report), every instance settles
CANCELLED exactly once (one ``workflow.cancelled`` event), no branch advances after the stop
(no task of a step after the branch tasks, every result consumed as ``stopping``), and the
invariant checker is green at quiescence. One engine is killed with ``kill -9`` while the
results arrive: the other settles what it left.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.faults.test_task_faults import effects, worker
from tests.faults.test_weave_engine import _start
from tests.integration.weave.engine_support import doc
from tests.support.invariants import check
from tests.support.processes import WeaveDaemon, wait_until
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

INSTANCES = 4
BRANCHES = 4


def _document() -> dict[str, Any]:
    branches = [{"name": f"b{i}", "start": f"hold{i}", "steps": {
        f"hold{i}": {"kind": "TASK", "queue": "stop", "handler": "wait_cancel",
                     "next": f"then{i}"},
        f"then{i}": {"kind": "TASK", "queue": "stop", "handler": "sleep",
                     "input": "{'ms': 1}", "next": f"ok{i}"},
        f"ok{i}": {"kind": "SUCCEED"}}} for i in range(BRANCHES)]
    return doc({
        "fan": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "after",
                "branches": branches},
        "after": {"kind": "TASK", "queue": "stop", "handler": "sleep", "next": "done"},
        "done": {"kind": "SUCCEED"},
    }, "fan")


def _rows(stack: Stack, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def _count(stack: Stack, sql: str, *params: Any) -> int:
    return int(_rows(stack, sql, *params)[0][0])


def test_cancel_during_a_parallel_block_reaches_the_workers_and_settles_once(
        tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    engines: list[WeaveDaemon] = []
    try:
        stack.create_queue("stop")
        started = asyncio.run(_start(stack, _document(), INSTANCES))
        engines = [WeaveDaemon(stack.daemon_url, tmp_path / f"stop-engine-{i}.log",
                               f"stop-engine-{i}") for i in range(2)]
        worker(stack, tmp_path, "holder", queues="stop", concurrency=INSTANCES * BRANCHES)
        total = INSTANCES * BRANCHES
        wait_until(lambda: stack.states().get("RUNNING", 0) == total, timeout=60,
                   interval=0.1, message="every branch task running in the worker")
        # A task is RUNNING once its start is approved; its handler records the effect after.
        wait_until(lambda: len(effects(tmp_path)) >= total, timeout=30, interval=0.05,
                   message="every branch handler started")
        assert len(effects(tmp_path)) == total  # each handler started once
        receipts = []
        for instance_id in started:
            status, body = stack.api_call("POST", f"/workflows/{instance_id.hex()}/cancel",
                                          {"reason": "order withdrawn"},
                                          headers={"Idempotency-Key": instance_id.hex()})
            assert status == 202, body
            assert (body["state"], body["stop_kind"]) == ("STOPPING", "CANCEL")
            receipts.append(body)
        # The results arrive while the engines consume them; one engine dies meanwhile.
        wait_until(lambda: _count(stack, "SELECT COUNT(*) FROM weave_inbox") >= 1,
                   timeout=30, interval=0.02, message="the first cancelled result")
        engines[0].kill()

        def settled() -> bool:
            return _count(stack, "SELECT COUNT(*) FROM weave_instances"
                                 " WHERE state = 'CANCELLED'") == INSTANCES

        wait_until(settled, timeout=60, interval=0.1, message="every instance CANCELLED")
        # The worker saw every cancel: RUNNING tasks end CANCELLED only by its report.
        tasks = _rows(stack, "SELECT state, handler, first_started_at IS NOT NULL,"
                             " cancel_requested_at IS NOT NULL FROM pulse_tasks")
        assert sorted(set(tasks)) == [("CANCELLED", "wait_cancel", 1, 1)], tasks
        assert len(tasks) == total  # no task of a later step: nothing advanced
        assert _count(stack, "SELECT COUNT(*) FROM pulse_attempts WHERE state = 'CANCELLED'"
                             ) == total
        outcomes = _rows(stack, "SELECT outcome, COUNT(*) FROM weave_inbox GROUP BY outcome")
        assert outcomes == [("stopping", total)]
        # Settled once each: one cancelled event per instance, nothing advanced.
        events = _rows(stack, "SELECT aggregate_id, event_type, payload FROM orbit_events"
                              " WHERE aggregate_type = 'workflow_instance'"
                              " ORDER BY aggregate_id, aggregate_revision")
        cancelled = [e[0] for e in events if e[1] == "workflow.cancelled"]
        assert sorted(cancelled) == sorted(started)
        by_instance: dict[bytes, list[tuple[str, Any]]] = {}
        for aggregate_id, event_type, payload in events:
            by_instance.setdefault(aggregate_id, []).append((event_type, json.loads(payload)))
        for history in by_instance.values():
            types = [t for t, _ in history]
            assert types[:3] == ["workflow.started", "workflow.advanced",
                                 "workflow.cancel_requested"], types
            assert types[-1] == "workflow.cancelled"
            assert set(types[3:-1]) <= {"workflow.advanced"}
            after = [p for _, p in history[3:]]  # the engine's, after the stop intent
            assert all(p["tasks"] == [] and p["completed"] == [] for p in after), after
        steps = {row[0] for row in _rows(stack, "SELECT name FROM weave_steps")}
        assert steps.isdisjoint({*(f"then{i}" for i in range(BRANCHES)), "after"}), steps
        states = _rows(stack, "SELECT state, COUNT(*) FROM weave_steps WHERE kind = 'TASK'"
                              " GROUP BY state")
        assert states == [("CANCELLED", total)]
        gates = _rows(stack, "SELECT g.state, COUNT(*) FROM pulse_execution_gates g"
                             " JOIN weave_instances i ON i.namespace_id = g.namespace_id"
                             " AND i.gate_id = g.id GROUP BY g.state")
        assert gates == [("STOPPED", INSTANCES)]
        # A replay of a cancel returns its original receipt; the stop is not repeated.
        status, body = stack.api_call("POST", f"/workflows/{started[0].hex()}/cancel",
                                      {"reason": "order withdrawn"},
                                      headers={"Idempotency-Key": started[0].hex()})
        assert (status, body) == (202, receipts[0])
        with stack.sql() as conn:
            assert check(conn, quiescent=True) == []
    finally:
        for e in engines:
            e.stop()
        stack.close()

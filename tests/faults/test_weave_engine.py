"""The workflow engine as real ``orbit weave`` processes on a database of their own; the test
process plays the worker with the kernel's lease protocol (claim, start, finish):

* kill -9 of an engine between leasing a row and committing its advance (the test holds the
  instance row's lock, so the engine is provably inside the advance, blocked after its lease
  committed): the row's lease lapses, another engine advances it once -- exactly one task per
  step, the instance finishes, the invariant checker is green;
* a PARALLEL block of 50 branches joins exactly once while two engine processes race over its
  results (both advance it), and SIGTERM drains them to a clean exit;
* the whole stack (API, dispatcher, SDK workers, engines): a worker and an engine killed with
  SIGKILL mid-run still leave exactly one task per step and every instance finished.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pymysql
import pytest

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from tests.conftest import make_tenant
from tests.integration.weave.engine_support import Flow, begin, doc, task
from tests.support import database
from tests.support.invariants import check, check_db
from tests.support.processes import WeaveDaemon, wait_until
from tests.support.waiting import statements_waiting, until

pytestmark = pytest.mark.slow


url, db = database.own_database("orbit_weave_faults", pool_max=4, scope="function",
                                 names=("url", "db"))


LINEAR = doc({
    "a": task("w.a", "b", input="{'n': input.n}"),
    "b": task("w.b", "done", input="{'a': steps.a.result}"),
    "done": {"kind": "SUCCEED", "output": "{'b': steps.b.result}"},
}, "a")


class InstanceLock:
    """The instance row locked FOR UPDATE on a connection of the test's own: an engine that
    leased one of the instance's rows blocks at the first statement of its advance."""

    def __init__(self, url: DatabaseUrl, flow: Flow) -> None:
        self.conn: pymysql.connections.Connection[Any] = connect_sync(url, autocommit=False)
        with self.conn.cursor() as cur:
            cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s"
                        " FOR UPDATE", (flow.tenant.namespace_id, flow.instance_id))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def blocked_in_advance(url: DatabaseUrl) -> bool:
    conn = connect_sync(url, autocommit=True)
    try:
        return statements_waiting(conn, "SELECT id, namespace_id, definition_id%FOR UPDATE") > 0
    finally:
        conn.close()


def leased_rows(url: DatabaseUrl, owner: str) -> int:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT (SELECT COUNT(*) FROM weave_inbox WHERE lease_owner = %s"
                        " AND state = 'LEASED') + (SELECT COUNT(*) FROM weave_pending_advances"
                        " WHERE lease_owner = %s AND state = 'LEASED')", (owner, owner))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


async def kill_inside_advance(url: DatabaseUrl, flow: Flow, tmp_path: Path, owner: str
                              ) -> None:
    """Start an engine while the instance is locked; once it leased a row and waits inside
    its advance, SIGKILL it and release the lock."""
    lock = InstanceLock(url, flow)
    engine = WeaveDaemon(url, tmp_path / f"{owner}.log", owner)
    try:
        wait_until(lambda: leased_rows(url, owner) > 0 and blocked_in_advance(url),
                   timeout=20, interval=0.02, message=f"{owner} blocked inside its advance")
        engine.kill()
    finally:
        engine.stop()
        lock.release()


async def test_kill_9_between_lease_and_commit_advances_each_row_once(
        db: Database, url: DatabaseUrl, tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR, {"n": 3})
    # The ROOT advance: leased by the first engine, which dies inside the advance.
    await kill_inside_advance(url, flow, tmp_path, "engine-1")
    survivor = WeaveDaemon(url, tmp_path / "engine-2.log", "engine-2")
    try:
        made = await until(lambda: _tasks_of(flow, 1), timeout=20)
    finally:
        survivor.stop()
    # Task a's result: leased by the next engine, which dies inside the advance too.
    await flow.end(made[0]["id"], "ok", {"v": 1})
    await kill_inside_advance(url, flow, tmp_path, "engine-3")
    last = WeaveDaemon(url, tmp_path / "engine-4.log", "engine-4")
    try:
        made = await until(lambda: _tasks_of(flow, 2), timeout=20)
        await flow.end(made[1]["id"], "ok", {"v": 2})
        await until(lambda: _state(flow, "SUCCEEDED"), timeout=20)
    finally:
        last.stop()
    assert [t["handler"] for t in await flow.tasks()] == ["w.a", "w.b"]  # one per step
    instance = await flow.instance()
    assert json.loads(instance["output"]) == {"b": {"v": 2}}
    rows = await flow.inbox()
    assert [(r["outcome"], r["attempts"]) for r in rows] == [("advanced", 2), ("advanced", 1)]
    assert await check_db(db, [tenant.namespace_id]) == []


async def _tasks_of(flow: Flow, count: int) -> list[dict[str, Any]] | None:
    made = await flow.tasks()
    return made if len(made) >= count else None


async def _state(flow: Flow, state: str) -> bool:
    return bool((await flow.instance())["state"] == state)


BRANCHES = 50


async def test_a_50_branch_block_joins_once_under_two_racing_engines(
        db: Database, url: DatabaseUrl, tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "fan": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "after",
                "branches": [{"name": f"b{i}", "start": f"t{i}", "steps": {
                    f"t{i}": task("w.a", f"ok{i}", input=f"{{'i': {i}}}"),
                    f"ok{i}": {"kind": "SUCCEED", "output": f"steps.t{i}.result"}}}
                    for i in range(BRANCHES)]},
        "after": task("w.b", "done", input="{'n': size(steps.fan.result)}"),
        "done": {"kind": "SUCCEED", "output": "steps.after.result"},
    }, "fan")
    flow = await begin(db, tenant, document)
    engines = [WeaveDaemon(url, tmp_path / f"race-{i}.log", f"race-{i}", batch="4")
               for i in range(2)]
    try:
        for e in engines:
            e.wait_ready()
        made = await until(lambda: _tasks_of(flow, BRANCHES), timeout=30)
        for t in made:
            await flow.end(t["id"], "ok", t["sequence"])
        after = await until(lambda: _tasks_of(flow, BRANCHES + 1), timeout=30)
        await flow.end(after[-1]["id"], "ok", "joined")
        await until(lambda: _state(flow, "SUCCEEDED"), timeout=30)
        advanced = [e.metric("orbit_weave_advances_total", outcome="advanced") for e in engines]
        # The gauges read the database (this database holds this one instance).
        wait_until(lambda: engines[0].metric("orbit_weave_instances", state="SUCCEEDED") == 1
                   and engines[0].metric("orbit_weave_inbox_backlog") == 0, timeout=10,
                   message="the gauges to show the finished instance")
        for e in engines:  # SIGTERM drains: the round in flight finishes, the process exits 0
            e.signal(signal.SIGTERM)
            assert e.wait(timeout=15) == 0, e.output()
    finally:
        for e in engines:
            e.stop()
    handlers = [t["handler"] for t in await flow.tasks()]
    assert handlers.count("w.b") == 1  # the join happened once
    assert len(handlers) == BRANCHES + 1
    steps = await flow.steps()
    assert json.loads(steps["fan"]["output"]) == {f"b{i}": i + 1 for i in range(BRANCHES)}
    assert {r["outcome"] for r in await flow.inbox()} == {"advanced"}
    assert sum(advanced) == BRANCHES + 2  # the start, 50 results, the last task's result
    assert all(n > 0 for n in advanced), advanced  # both engines advanced the instance
    assert await check_db(db, [tenant.namespace_id]) == []


STEPS = 3
INSTANCES = 8


def test_kill_9_of_workers_and_engines_mid_run_leaves_one_task_per_step(tmp_path: Path) -> None:
    """The whole stack as processes (API, dispatcher, SDK workers, two engines): instances of a
    three-step workflow run while a worker is killed mid-step (its rerun-safe tasks run again
    after their leases lapse) and an engine is killed mid-run; every instance succeeds with
    exactly one task per step, and the invariant checker is green."""
    from tests.faults.test_task_faults import kill9, wait_running, worker
    from tests.support.stack import Stack

    stack = Stack(tmp_path)
    engines: list[WeaveDaemon] = []
    try:
        stack.create_queue("flow", execution_lease_ms=1500, offer_lease_ms=1500,
                           retry={"max_attempts": 5, "initial_ms": 0, "max_ms": 0,
                                  "multiplier": "1", "jitter": "0"})
        steps = {f"s{i}": {"kind": "TASK", "queue": "flow", "handler": "sleep",
                           "input": "{'ms': 700}", "rerun_safe": True,
                           "next": f"s{i + 1}" if i + 1 < STEPS else "done"}
                 for i in range(STEPS)}
        steps["done"] = {"kind": "SUCCEED", "output": "steps.s2.result"}
        started = asyncio.run(_start(stack, doc(steps, "s0"), INSTANCES))
        engines = [WeaveDaemon(stack.daemon_url, tmp_path / f"stack-engine-{i}.log",
                               f"stack-engine-{i}") for i in range(2)]
        victim = worker(stack, tmp_path, "victim", queues="flow", concurrency=INSTANCES)
        wait_running(stack, INSTANCES)  # every instance's first step is running
        kill9(victim)
        engines[0].kill()
        worker(stack, tmp_path, "healthy", queues="flow", concurrency=INSTANCES)

        def finished() -> bool:
            with stack.sql() as conn, conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM weave_instances WHERE state = 'SUCCEEDED'")
                return int(cur.fetchone()[0]) == INSTANCES

        wait_until(finished, timeout=90, interval=0.2, message="every instance to succeed")
        with stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT owner_id, COUNT(*), COUNT(DISTINCT JSON_EXTRACT(e.payload,"
                        " '$.workflow.step')) FROM pulse_tasks t JOIN orbit_events e"
                        " ON e.namespace_id = t.namespace_id AND e.aggregate_type = 'task'"
                        " AND e.aggregate_id = t.id AND e.aggregate_revision = 1"
                        " WHERE t.owner_kind = 'WORKFLOW' GROUP BY owner_id")
            per_instance = {row[0]: row[1:] for row in cur.fetchall()}
            cur.execute("SELECT MAX(attempts_used) FROM pulse_tasks")
            most_attempts = cur.fetchone()[0]
        assert sorted(per_instance) == sorted(started)
        assert set(per_instance.values()) == {(STEPS, STEPS)}  # one task per step
        assert most_attempts >= 2  # the killed worker's steps ran again
        with stack.sql() as conn:
            assert check(conn, quiescent=True) == []
    finally:
        for e in engines:
            e.stop()
        stack.close()


async def _start(stack: Any, document: dict[str, Any], count: int) -> list[bytes]:
    from orbit_common.platform import credentials
    from orbit_common.weave import definitions, instances

    db = await open_database(stack.url, minsize=1, maxsize=2)
    try:
        who = await db.read("test.auth",
                            lambda cur: credentials.authenticate(cur, stack.api_key))
        await definitions.create_definition(db, who, namespace=stack.namespace, name="flow")
        await definitions.publish_version(db, who, namespace=stack.namespace, name="flow",
                                          revision=1, document=json.dumps(document).encode())
        return [bytes.fromhex((await instances.start_instance(
            db, who, namespace=stack.namespace, definition="flow",
            input_json=json.dumps({"n": i}).encode())).body["id"]) for i in range(count)]
    finally:
        await db.close()

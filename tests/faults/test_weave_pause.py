"""Pause and resume under real ``orbit weave`` processes on a database of their own
(docs/weave/pause.md):

100 instances each have a step running (its task claimed and started by a worker) when they are
paused. The workers finish all 100: every result is recorded and parked by the running engine
(CONSUMED ``paused``), no new task is created or granted, no instance advances (its revision is
the one it had when paused). Then all 100 are resumed while the engine is held inside a replay
(the test holds one instance's row lock) and killed with ``kill -9``; two fresh engines finish:
every instance advanced exactly once per result -- one ``advanced`` outcome per inbox row, one
event completing the step, one next task, every RESUME row DONE, no checkpoint left, the
invariant checker green.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.weave import controls, instances
from tests.conftest import make_tenant
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.engine_support import HANDLERS, doc, publish, task
from tests.integration.weave.support import principal
from tests.support import database
from tests.support.invariants import check_db
from tests.support.lease_fixtures import make_queue, open_session
from tests.support.processes import WeaveDaemon, wait_until
from tests.support.waiting import statements_waiting

pytestmark = pytest.mark.slow

COUNT = 100
FLOW = doc({
    "a": task("w.a", "after"),
    "after": task("w.b", "done"),
    "done": {"kind": "SUCCEED"},
}, "a")


url, db = database.own_database("orbit_weave_pause_faults", pool_max=8, scope="function",
                                 names=("url", "db"))


def scalar(url: DatabaseUrl, sql: str, *params: Any) -> Any:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0]
    finally:
        conn.close()


def tasks_of(url: DatabaseUrl, ns: bytes, handler: str) -> int:
    return int(scalar(url, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s"
                           " AND handler = %s", ns, handler))


def inbox(url: DatabaseUrl, ns: bytes, outcome: str) -> int:
    return int(scalar(url, "SELECT COUNT(*) FROM weave_inbox WHERE namespace_id = %s"
                           " AND state = 'CONSUMED' AND outcome = %s", ns, outcome))


def blocked_in_advance(url: DatabaseUrl) -> bool:
    conn = connect_sync(url, autocommit=True)
    try:
        return statements_waiting(conn, "SELECT id, namespace_id, definition_id%FOR UPDATE") > 0
    finally:
        conn.close()


async def test_pause_while_100_steps_run_then_resume_through_a_kill_9(
        db: Database, url: DatabaseUrl, tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    ns = tenant.namespace_id
    queue = await make_queue(db, tenant, max_attempts=1)
    name = await publish(db, tenant, queue.name, FLOW)
    who = await principal(db, tenant.api_key)
    started = [bytes.fromhex((await instances.start_instance(
        db, who, namespace=tenant.namespace, definition=name,
        input_json=b'{"n": 1}')).body["id"]) for _ in range(COUNT)]
    session = await open_session(db, tenant, [queue], handlers=HANDLERS, max_in_flight=256)
    engine = WeaveDaemon(url, tmp_path / "pause-1.log", "pause-1")
    try:
        wait_until(lambda: tasks_of(url, ns, "w.a") == COUNT, timeout=60,
                   message="every first step's task")
        grants = []
        while len(grants) < COUNT:  # a claim grants at most 32
            more = await claim(db, session, queue)
            assert more, "the first steps' tasks can be claimed"
            await start(db, tenant, more)
            grants += more
        for instance_id in started:
            await controls.set_paused(db, who, namespace=tenant.namespace,
                                      instance_id=instance_id.hex(), paused=True,
                                      reason="fault test")
        revisions = {r[0]: r[1] for r in _rows(url, "SELECT id, revision FROM weave_instances"
                                                    " WHERE namespace_id = %s", ns)}
        await finish(db, tenant, [report(g, "succeeded", result=json.dumps({"ok": True}))
                                  for g in grants])
        wait_until(lambda: inbox(url, ns, "paused") == COUNT, timeout=60,
                   message="every result recorded and parked")
        assert tasks_of(url, ns, "w.b") == 0  # nothing advanced: no next task
        assert await claim(db, session, queue) == []
        assert {r[0]: r[1] for r in _rows(url, "SELECT id, revision FROM weave_instances"
                                               " WHERE namespace_id = %s", ns)} == revisions
        assert int(scalar(url, "SELECT SUM(checkpoints) FROM weave_instances"
                               " WHERE namespace_id = %s", ns)) == COUNT
    finally:
        engine.stop()
    # Resume all 100 while no engine runs, then hold one instance's row: the next engine's
    # replay of that instance's batch waits on it, provably inside an advance, and is killed.
    for instance_id in started:
        await controls.set_paused(db, who, namespace=tenant.namespace,
                                  instance_id=instance_id.hex(), paused=False,
                                  reason="fault test")
    middle = started[COUNT // 2]
    lock = connect_sync(url, autocommit=False)
    with lock.cursor() as cur:
        cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s"
                    " FOR UPDATE", (ns, middle))
    killed = WeaveDaemon(url, tmp_path / "pause-2.log", "pause-2")
    try:
        wait_until(lambda: blocked_in_advance(url), timeout=60, interval=0.02,
                   message="the engine inside a replay")
        killed.kill()
    finally:
        killed.stop()
        lock.rollback()
        lock.close()
    replayed_before = inbox(url, ns, "advanced")
    assert replayed_before < COUNT  # the killed engine's advance in flight died with it
    survivors = [WeaveDaemon(url, tmp_path / f"pause-{i}.log", f"pause-{i}") for i in (3, 4)]
    try:
        wait_until(lambda: inbox(url, ns, "advanced") == COUNT, timeout=90, interval=0.2,
                   message="every parked result replayed")
        wait_until(lambda: tasks_of(url, ns, "w.b") == COUNT, timeout=30,
                   message="every next task")
    finally:
        for s in survivors:
            s.stop()
    assert inbox(url, ns, "paused") == 0
    assert int(scalar(url, "SELECT SUM(checkpoints) FROM weave_instances"
                           " WHERE namespace_id = %s", ns)) == 0
    assert int(scalar(url, "SELECT COUNT(*) FROM weave_pending_advances WHERE namespace_id = %s"
                           " AND kind = 'RESUME' AND state <> 'DONE'", ns)) == 0
    # Exactly once per result: one event completing "a" per instance, one next task each.
    completing: dict[bytes, int] = {}
    for aggregate_id, payload in _rows(url, "SELECT aggregate_id, payload FROM orbit_events"
                                            " WHERE namespace_id = %s AND aggregate_type ="
                                            " 'workflow_instance' AND event_type <>"
                                            " 'workflow.started'", ns):
        if "a" in json.loads(payload)["completed"]:
            completing[aggregate_id] = completing.get(aggregate_id, 0) + 1
    assert sorted(completing) == sorted(started)
    assert set(completing.values()) == {1}
    assert int(scalar(url, "SELECT COUNT(DISTINCT owner_id) FROM pulse_tasks"
                           " WHERE namespace_id = %s AND handler = 'w.b'", ns)) == COUNT
    assert await check_db(db, [ns]) == []


def _rows(url: DatabaseUrl, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    finally:
        conn.close()

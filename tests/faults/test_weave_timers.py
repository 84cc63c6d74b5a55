"""TIMER steps under real ``orbit weave`` processes on a database of their own
(docs/weave/waits.md § 计时（TIMER）):

* kill -9 of the engine in the middle of a burst of 1,000 timers due at the same instant (the
  test holds one instance's row lock, so the engine is provably inside an advance, with rows
  leased, when it dies; that instance's timer is in the middle of the lease order): two fresh
  engines finish the burst and every timer fires exactly once -- 1,000 FIRED waits, 1,000
  SUCCEEDED TIMER steps, one advance event completing each, the survivors' ``advanced``
  outcomes equal to the timers the killed engine had not fired, every pending advance DONE,
  the invariant checker green;
* timers that came due while no engine ran fire when one returns: once, late, and recorded as
  late (``late_ms`` at least the time they waited past their due time).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.weave import instances
from orbit_common.weave.engine import Engine
from tests.conftest import Tenant, make_tenant
from tests.integration.weave.engine_support import doc, drain, publish
from tests.integration.weave.support import principal
from tests.support import database
from tests.support.invariants import check_db
from tests.support.lease_fixtures import db_time, make_queue
from tests.support.processes import WeaveDaemon, wait_until
from tests.support.waiting import statements_waiting

pytestmark = pytest.mark.slow

BURST = 1000
# How long the engine stays down past the timers' due time: the issue's 30 s (longer than the
# engine's lease). ORBIT_TEST_TIMER_DOWNTIME_S shortens it for a quick local run.
DOWNTIME_S = float(os.environ.get("ORBIT_TEST_TIMER_DOWNTIME_S", "30"))
# Starting 1,000 instances and setting their timers takes about 4.5 s on two idle cores; the
# burst's due time leaves room for a machine four times slower (the test asserts that none was
# due before all were set).
SET_WITHIN_S = 20


url, db = database.own_database("orbit_weave_timer_faults", pool_max=8, scope="function",
                                 names=("url", "db"))


AT = doc({
    "pause": {"kind": "TIMER", "until": "input.at", "next": "done"},
    "done": {"kind": "SUCCEED", "output": "steps.pause.result"},
}, "pause", input_schema={"type": "object", "properties": {"at": {"type": "string"}},
                          "required": ["at"]})


async def start_many(db: Database, tenant: Tenant, count: int, at: dt.datetime) -> list[bytes]:
    """``count`` instances of :data:`AT` due at ``at`` (started 8 at a time)."""
    queue = await make_queue(db, tenant, max_attempts=1)
    name = await publish(db, tenant, queue.name, AT)
    who = await principal(db, tenant.api_key)
    slots = asyncio.Semaphore(8)
    body = json.dumps({"at": at.isoformat()}).encode()

    async def one() -> bytes:
        async with slots:
            started = await instances.start_instance(db, who, namespace=tenant.namespace,
                                                     definition=name, input_json=body)
            return bytes.fromhex(started.body["id"])

    return list(await asyncio.gather(*(one() for _ in range(count))))


def scalar(url: DatabaseUrl, sql: str, *params: Any) -> Any:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0]
    finally:
        conn.close()


def waits(url: DatabaseUrl, ns: bytes, state: str) -> int:
    return int(scalar(url, "SELECT COUNT(*) FROM weave_waits WHERE namespace_id = %s"
                           " AND state = %s", ns, state))


def blocked_in_advance(url: DatabaseUrl) -> bool:
    conn = connect_sync(url, autocommit=True)
    try:
        return statements_waiting(conn, "SELECT id, namespace_id, definition_id%FOR UPDATE") > 0
    finally:
        conn.close()


def leased_by(url: DatabaseUrl, owner: str) -> int:
    return int(scalar(url, "SELECT COUNT(*) FROM weave_pending_advances WHERE lease_owner = %s"
                           " AND state = 'LEASED'", owner))


async def fired_once_each(db: Database, tenant: Tenant, started: list[bytes]) -> None:
    """Every instance: one FIRED wait, its TIMER step SUCCEEDED, exactly one advance event
    that completed it, every pending advance DONE, the instance SUCCEEDED with the result."""
    ns = tenant.namespace_id

    async def body(cur: Any) -> dict[str, Any]:
        found: dict[str, Any] = {}
        await cur.execute("SELECT kind, state, COUNT(*) AS n FROM weave_waits"
                          " WHERE namespace_id = %s GROUP BY kind, state", (ns,))
        found["waits"] = {(r["kind"], r["state"]): r["n"] for r in await cur.fetchall()}
        await cur.execute("SELECT COUNT(DISTINCT instance_id) AS n FROM weave_waits"
                          " WHERE namespace_id = %s", (ns,))
        found["waiting_instances"] = (await cur.fetchone())["n"]
        await cur.execute("SELECT state, COUNT(*) AS n FROM weave_steps WHERE namespace_id = %s"
                          " AND kind = 'TIMER' GROUP BY state", (ns,))
        found["steps"] = {r["state"]: r["n"] for r in await cur.fetchall()}
        await cur.execute("SELECT kind, state, COUNT(*) AS n FROM weave_pending_advances"
                          " WHERE namespace_id = %s GROUP BY kind, state", (ns,))
        found["advances"] = {(r["kind"], r["state"]): r["n"] for r in await cur.fetchall()}
        await cur.execute("SELECT aggregate_id, payload FROM orbit_events WHERE namespace_id = %s"
                          " AND aggregate_type = 'workflow_instance'"
                          " AND event_type <> 'workflow.started'", (ns,))
        completing: dict[bytes, int] = {}
        for r in await cur.fetchall():
            if "pause" in json.loads(r["payload"])["completed"]:
                completing[r["aggregate_id"]] = completing.get(r["aggregate_id"], 0) + 1
        found["completing"] = completing
        await cur.execute("SELECT i.state, i.output, w.late_ms, w.fired_at, w.deadline_at"
                          " FROM weave_instances i JOIN weave_waits w"
                          " ON w.namespace_id = i.namespace_id AND w.instance_id = i.id"
                          " WHERE i.namespace_id = %s", (ns,))
        found["instances"] = [dict(r) for r in await cur.fetchall()]
        return found

    found = await db.read("test.timer_faults", body)
    n = len(started)
    assert found["waits"] == {("TIMER", "FIRED"): n}
    assert found["waiting_instances"] == n
    assert found["steps"] == {"SUCCEEDED": n}
    assert found["advances"] == {("ROOT", "DONE"): n, ("TIMER", "DONE"): n}
    assert sorted(found["completing"]) == sorted(started)
    assert set(found["completing"].values()) == {1}  # no timer fired twice
    for row in found["instances"]:
        assert row["state"] == "SUCCEEDED"
        assert json.loads(row["output"])["late_ms"] == row["late_ms"]
        assert row["fired_at"] >= row["deadline_at"]  # never early (database time)
    assert await check_db(db, [ns]) == []


async def test_kill_9_during_a_burst_of_1000_due_timers_fires_each_once(
        db: Database, url: DatabaseUrl, tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    ns = tenant.namespace_id
    at = (await db_time(db)).replace(tzinfo=dt.UTC) + dt.timedelta(seconds=SET_WITHIN_S)
    started = await start_many(db, tenant, BURST, at)
    # The timers are set by an engine in this process (1,000 ROOT advances), before they are due.
    await drain(Engine(db, owner="burst-setter", batch=64, per_transaction=64))
    assert waits(url, ns, "WAITING") == BURST, "the timers were not all set before their due time"
    assert waits(url, ns, "FIRED") == 0
    # The instance whose TIMER row is in the middle of the lease order (due_at, then id): its
    # row lock stops the engine process inside an advance half-way through the burst.
    middle = scalar(url, "SELECT instance_id FROM weave_pending_advances"
                         " WHERE namespace_id = %s AND kind = 'TIMER'"
                         " ORDER BY due_at, namespace_id, id LIMIT 1 OFFSET %s", ns, BURST // 2)
    lock = connect_sync(url, autocommit=False)
    with lock.cursor() as cur:
        cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s"
                    " FOR UPDATE", (ns, middle))
    first = WeaveDaemon(url, tmp_path / "burst-1.log", "burst-1")
    try:
        wait_until(lambda: blocked_in_advance(url) and leased_by(url, "burst-1") > 0,
                   timeout=60, interval=0.02, message="the engine inside an advance mid-burst")
        first.kill()
    finally:
        first.stop()
        lock.rollback()
        lock.close()
    # What the killed engine committed (its advance in flight died with it).
    fired_before = waits(url, ns, "FIRED")
    assert 0 < fired_before < BURST
    survivors = [WeaveDaemon(url, tmp_path / f"burst-{i}.log", f"burst-{i}") for i in (2, 3)]
    try:
        wait_until(lambda: waits(url, ns, "FIRED") == BURST, timeout=90, interval=0.2,
                   message="every timer fired")
        wait_until(lambda: scalar(url, "SELECT COUNT(*) FROM weave_pending_advances"
                                       " WHERE namespace_id = %s AND state <> 'DONE'", ns) == 0,
                   timeout=30, message="every pending advance done")
        # Each of the rest was advanced once by a survivor: no advanced outcome twice.
        advanced = sum(s.metric("orbit_weave_advances_total", outcome="advanced")
                       for s in survivors)
        assert advanced == BURST - fired_before
    finally:
        for s in survivors:
            s.stop()
    await fired_once_each(db, tenant, started)


async def test_timers_due_while_the_engine_was_down_fire_on_return_once_and_late(
        db: Database, url: DatabaseUrl, tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    ns = tenant.namespace_id
    due = (await db_time(db)).replace(tzinfo=dt.UTC) + dt.timedelta(seconds=6)
    started = await start_many(db, tenant, 10, due)
    await drain(Engine(db, owner="down-setter"))  # the timers set, not yet due
    assert waits(url, ns, "WAITING") == len(started)
    engine = WeaveDaemon(url, tmp_path / "down-1.log", "down-1")
    try:
        engine.wait_ready()
        engine.kill()  # down before the due time (the engine fired nothing: checked below)
    finally:
        engine.stop()
    back_at = due + dt.timedelta(seconds=DOWNTIME_S)
    wait_until(lambda: scalar(url, "SELECT UTC_TIMESTAMP(6) > %s",
                              back_at.replace(tzinfo=None)), timeout=DOWNTIME_S + 30,
               interval=0.2, message="the downtime to pass")
    assert waits(url, ns, "FIRED") == 0  # nothing fires without an engine
    back = WeaveDaemon(url, tmp_path / "down-2.log", "down-2")
    try:
        wait_until(lambda: waits(url, ns, "FIRED") == len(started), timeout=30,
                   message="the timers fired on return")
    finally:
        back.stop()
    await fired_once_each(db, tenant, started)
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT late_ms, fired_at, deadline_at FROM weave_waits"
                        " WHERE namespace_id = %s", (ns,))
            for late_ms, fired_at, deadline_at in cur.fetchall():
                assert deadline_at == due.replace(tzinfo=None)
                assert fired_at > back_at.replace(tzinfo=None)
                assert late_ms >= DOWNTIME_S * 1000  # late, and recorded as late
                assert late_ms == (fired_at - deadline_at) // dt.timedelta(milliseconds=1)
    finally:
        conn.close()

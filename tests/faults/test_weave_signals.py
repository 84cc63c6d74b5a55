"""SIGNAL waits with real ``orbit weave`` processes on a database of their own: kill -9 of an
engine between leasing a signal and committing its consumption (the test holds the instance
row's lock, so the engine is provably inside the advance, after its lease committed): the
signal's lease lapses and another engine consumes it once -- one winner, the step advanced once,
the invariant checker green; and a burst of signals to one wait while two engine processes race
over them leaves exactly one winner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.weave import signals
from tests.conftest import make_tenant
from tests.faults.test_weave_engine import InstanceLock, blocked_in_advance
from tests.integration.weave.engine_support import Flow, begin, doc
from tests.integration.weave.support import principal
from tests.support import database
from tests.support.invariants import check_db
from tests.support.processes import WeaveDaemon, wait_until
from tests.support.waiting import until

pytestmark = pytest.mark.slow

WAITING = doc({
    "wait": {"kind": "SIGNAL", "signal": "paid", "correlation": "'o-1'", "next": "done"},
    "done": {"kind": "SUCCEED", "output": "steps.wait.result.payload"},
}, "wait")


# The instance keeps running after the burst's winner (it then waits for another signal).
HOLDING = doc({
    "wait": {"kind": "SIGNAL", "signal": "paid", "correlation": "'o-1'", "next": "hold"},
    "hold": {"kind": "SIGNAL", "signal": "never", "next": "done"},
    "done": {"kind": "SUCCEED", "output": "steps.wait.result.payload"},
}, "wait")


url, db = database.own_database("orbit_weave_signal_faults", pool_max=4, scope="function",
                                 names=("url", "db"))


async def send(flow: Flow, payload: Any) -> str:
    request = signals.SignalRequest.check(
        name="paid", correlation_key="o-1", payload_text=json.dumps(payload), payload_version=1,
        evidence_ref=None, expires_in_ms=None)
    sent = await signals.send_signal(
        flow.db, await principal(flow.db, flow.tenant.api_key), namespace=flow.tenant.namespace,
        target=signals.Target(instance_id=flow.instance_id), signal=request)
    return str(sent.body["id"])


def leased_signals(url: DatabaseUrl, owner: str) -> int:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM weave_signals WHERE lease_owner = %s"
                        " AND state = 'LEASED'", (owner,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


async def _signals(flow: Flow) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("SELECT * FROM weave_signals WHERE namespace_id = %s"
                          " AND instance_id = %s", (flow.tenant.namespace_id, flow.instance_id))
        return [dict(r) for r in await cur.fetchall()]
    return await flow.db.read("test.signals", body)


async def _waiting(flow: Flow) -> bool:
    step = (await flow.steps()).get("wait")
    return step is not None and step["state"] == "WAITING"


async def _ended(flow: Flow) -> bool:
    return bool((await flow.instance())["state"] != "RUNNING")


async def test_kill_9_between_leasing_a_signal_and_consuming_it(
        db: Database, url: DatabaseUrl, tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, WAITING)
    first = WeaveDaemon(url, tmp_path / "engine-1.log", "engine-1")
    try:
        await until(lambda: _waiting(flow), timeout=20)
    finally:
        first.stop()
    signal_id = await send(flow, {"paid": 1})
    lock = InstanceLock(url, flow)
    doomed = WeaveDaemon(url, tmp_path / "engine-2.log", "engine-2")
    try:
        wait_until(lambda: leased_signals(url, "engine-2") > 0 and blocked_in_advance(url),
                   timeout=20, interval=0.02, message="engine-2 blocked inside its advance")
        doomed.kill()
    finally:
        doomed.stop()
        lock.release()
    survivor = WeaveDaemon(url, tmp_path / "engine-3.log", "engine-3")
    try:
        await until(lambda: _ended(flow), timeout=20)
    finally:
        survivor.stop()
    instance = await flow.instance()
    assert instance["state"] == "SUCCEEDED"
    assert json.loads(instance["output"]) == {"paid": 1}
    (row,) = await _signals(flow)
    assert row["id"].hex() == signal_id
    assert (row["state"], row["disposition"], row["attempts"]) == ("CONSUMED", "consumed", 2)
    assert await check_db(db, [tenant.namespace_id]) == []


async def test_a_burst_under_two_engines_has_one_winner(db: Database, url: DatabaseUrl,
                                                       tmp_path: Path) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, HOLDING)
    engines = [WeaveDaemon(url, tmp_path / f"racer-{n}.log", f"racer-{n}") for n in (1, 2)]
    try:
        await until(lambda: _waiting(flow), timeout=20)
        sent = [await send(flow, n) for n in range(40)]

        async def settled() -> bool:
            return all(r["state"] in ("CONSUMED", "REJECTED") for r in await _signals(flow))

        await until(settled, timeout=30)
    finally:
        for engine in engines:
            engine.stop()
    found = await _signals(flow)
    assert sorted(r["id"].hex() for r in found) == sorted(sent)
    winners = [r for r in found if r["state"] == "CONSUMED"]
    assert len(winners) == 1
    assert {r["disposition"] for r in found if r["state"] == "REJECTED"} == {"wait_closed"}
    result = json.loads((await flow.steps())["wait"]["output"])
    assert result["signal_id"] == winners[0]["id"].hex()
    assert (await flow.steps())["hold"]["state"] == "WAITING"
    assert await check_db(db, [tenant.namespace_id]) == []

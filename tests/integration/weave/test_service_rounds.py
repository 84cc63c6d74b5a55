"""The engine daemon's rounds (orbit_weave.service): the next lease does not wait for a round
that is still advancing (``[weave] rounds_in_flight``), and a drain waits for the rounds in
flight. On a database of its own: the daemon leases every namespace's rows."""

from __future__ import annotations

from typing import Any

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.service.config import DatabaseConfig, OrbitConfig, WeaveConfig
from orbit_common.service.health import ReadinessGate, SchemaChecker
from orbit_weave.metrics import EngineMetrics
from orbit_weave.service import WeaveService
from tests.conftest import make_tenant
from tests.integration.weave.engine_support import Flow, begin, doc, task
from tests.support import database
from tests.support.waiting import until

own_url, db = database.own_database("orbit_weave_rounds", names=("own_url", "db"))

ONE_STEP = doc({
    "a": task("w.a", "done"),
    "done": {"kind": "SUCCEED", "output": "{'ok': true}"},
}, "a")


def _service(db: Database, url: DatabaseUrl, rounds_in_flight: int) -> WeaveService:
    import prometheus_client

    config = OrbitConfig(database=DatabaseConfig(url=url.render(hide_password=False)),
                         weave=WeaveConfig(owner=f"rounds-{rounds_in_flight}",
                                           rounds_in_flight=rounds_in_flight))
    return WeaveService(config, db, ReadinessGate(SchemaChecker(db)),
                        metrics=EngineMetrics(prometheus_client.CollectorRegistry()))


async def _advance_state(db: Database, flow: Flow) -> str:
    """The state of the instance's ROOT pending advance."""
    async def body(cur: Any) -> str:
        await cur.execute("SELECT state FROM weave_pending_advances WHERE namespace_id = %s"
                          " AND instance_id = %s AND kind = 'ROOT'",
                          (flow.tenant.namespace_id, flow.instance_id))
        return str((await cur.fetchone())["state"])
    return await db.read("test.root_state", body)


async def test_a_round_that_cannot_commit_does_not_hold_up_the_next_lease(
        db: Database, own_url: DatabaseUrl) -> None:
    tenant = await make_tenant(db)
    held = await begin(db, tenant, ONE_STEP)
    # Another transaction holds the first instance's row: the round that leased its ROOT
    # advance waits on that lock inside its advance transaction.
    async with db.pool.acquire() as conn, conn.cursor() as cur:
        await cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s"
                          " FOR UPDATE", (tenant.namespace_id, held.instance_id))
        service = _service(db, own_url, rounds_in_flight=2)
        await service.gate.refresh()
        await service.start()
        try:
            await until(lambda: _is(db, held, "LEASED"),
                        message="the first round leased the held instance's advance")
            # A second instance started now is leased and advanced by the next round
            # while the first round still waits.
            free = await begin(db, tenant, ONE_STEP)
            await until(free.tasks, message="the second instance advanced")
            assert await held.tasks() == []
            assert await _advance_state(db, held) == "LEASED"
        finally:
            await conn.rollback()
        # The lock released, the first round commits too; the drain waited for it.
        await service.drain()
    assert await held.tasks() != []
    assert await _advance_state(db, held) == "DONE"


async def _is(db: Database, flow: Flow, state: str) -> bool:
    return await _advance_state(db, flow) == state

"""The delivery pump (in process, orbit_delivery/service.py) against examples/result-inbox's
receiver on a real socket: results of a task in two revisions (NEEDS_REVIEW, then the review's
outcome), the receiver down and then back -- every event applied once, each task's view at its
last revision, and within a batch a task's revisions sent in order (none arrives stale)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import prometheus_client
from aiohttp import web
from aiohttp.test_utils import TestServer
from result_inbox.receiver import PATH, create_app

from orbit_common.db.pool import Database
from orbit_common.db.schema import SchemaChecker
from orbit_common.model.endpoints import EndpointPolicy
from orbit_common.model.sealing import Sealer, new_key_text
from orbit_common.pulse import interventions
from orbit_common.relay import circuit
from orbit_common.relay.model import RelaySettings
from orbit_common.service.config import DeliveryConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.service import DeliveryService
from tests.conftest import Tenant
from tests.support import relay
from tests.support.lease_fixtures import make_queue, task_row
from tests.support.processes import free_port

KEY = new_key_text()
SETTINGS = RelaySettings(sealer=Sealer.from_config(KEY),
                         policy=EndpointPolicy(allow_http=True, allow_loopback=True))
CONFIG = DeliveryConfig(secret_key=KEY, allow_http=True, allow_loopback=True,
                        circuit_failure_threshold=100, lease_batch=10, timeout_s=5,
                        endpoint_concurrency=6)


@web.middleware
async def slow_on_review(request: web.Request, handler: Any) -> web.StreamResponse:
    """The receiver takes longer over a NEEDS_REVIEW result than over the next revision: sent
    side by side, the newer revision would be applied first and the older one arrive stale."""
    if json.loads(await request.read()).get("state") == "NEEDS_REVIEW":
        await asyncio.sleep(0.2)  # the receiver's own processing time
    return await handler(request)


async def reviewed_results(db: Database, tenant: Tenant, count: int) -> list[bytes]:
    """``count`` tasks with two result events each: NEEDS_REVIEW, then FAILED by review."""
    queue = await make_queue(db, tenant)
    task_ids = await relay.finished_results(db, tenant, queue, ["unknown"] * count)
    who = await relay.principal_of(db, tenant.api_key)
    for task_id in task_ids:
        assert (await task_row(db, tenant, task_id))["state"] == "NEEDS_REVIEW"
        await interventions.review_task(
            db, who, namespace=tenant.namespace, task_id=task_id, decision="failed",
            reason="checked", evidence_ref="T-1", execution_ended=True,
            revision=(await task_row(db, tenant, task_id))["revision"])
    return task_ids


async def test_a_receiver_back_from_an_outage_applies_every_revision_once_in_order(
        db: Database, tenant: Tenant, pool: Any) -> None:
    task_ids = await reviewed_results(db, tenant, 3)
    port = free_port()
    created = await relay.subscribe(db, tenant, "inbox", kind="WEBHOOK", settings=SETTINGS,
                                    endpoint_url=f"http://127.0.0.1:{port}{PATH}",
                                    start_after_sequence=0)
    assert created.secret is not None
    await relay.fan_out_all(db, tenant)
    assert len(await relay.delivery_rows(db, tenant)) == 6
    service = DeliveryService(OrbitConfig(delivery=CONFIG), db,
                              ReadinessGate(SchemaChecker(db), 60),
                              metrics=PumpMetrics(prometheus_client.CollectorRegistry()))
    server: TestServer | None = None
    try:
        row = await target(db, tenant)
        down = await service.batch(row)  # nothing listens: every attempt is refused
        assert (down.sent, down.released) == (6, 0)
        assert {d["state"] for d in await relay.delivery_rows(db, tenant)} == {"PENDING"}
        app = create_app(pool, [created.secret])
        app.middlewares.append(slow_on_review)
        server = TestServer(app, host="127.0.0.1", port=port)
        await server.start_server()  # back
        await relay.make_due(db, tenant)
        back = await service.batch(await target(db, tenant))
        assert back.sent == 6
    finally:
        await service.close()
        if server is not None:
            await server.close()
    assert {(d["state"], d["attempts_used"]) for d in await relay.delivery_rows(db, tenant)} \
        == {("ACKNOWLEDGED", 2)}
    async with pool.acquire() as conn, conn.cursor() as cur:
        await conn.commit()
        hexes = [t.hex() for t in task_ids]
        marks = ", ".join(["%s"] * len(hexes))
        await cur.execute(f"SELECT task_id, task_revision, outcome FROM receiver_inbox"
                          f" WHERE task_id IN ({marks})", hexes)
        inbox = list(await cur.fetchall())
        await cur.execute(f"SELECT task_id, task_revision, state FROM receiver_task_views"
                          f" WHERE task_id IN ({marks})", hexes)
        views = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
        await conn.commit()
    assert len(inbox) == 6
    # In order within the batch: the older revision first, so nothing arrived stale.
    assert {outcome for _t, _r, outcome in inbox} == {"APPLIED"}
    for task_id in task_ids:
        final = await task_row(db, tenant, task_id)
        assert views[task_id.hex()] == (final["revision"], "FAILED")


async def target(db: Database, tenant: Tenant) -> dict[str, Any]:
    rows = await db.read("test.targets", lambda cur: circuit.webhook_targets(cur, 10_000))
    sub = await relay.subscription_row(db, tenant, "inbox")
    return next(r for r in rows if r["id"] == sub["id"])

"""The delivery pump's batches (orbit_delivery/service.py) against the real database and a real
loopback receiver: signed relay payload bytes, acknowledgements, the endpoint circuit on the
subscription row, release without spending attempts, one probe among pumps, drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs
import prometheus_client
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from orbit_sdk import webhooks

from orbit_common.db.pool import Database
from orbit_common.db.schema import SchemaChecker
from orbit_common.model.endpoints import EndpointPolicy
from orbit_common.model.sealing import Sealer, new_key_text
from orbit_common.relay import circuit, payload
from orbit_common.relay.model import RelaySettings
from orbit_common.service.config import DeliveryConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.service import DeliveryService
from tests.conftest import Tenant
from tests.support import relay
from tests.support.lease_fixtures import make_queue

KEY = new_key_text()
LOOPBACK = EndpointPolicy(allow_http=True, allow_loopback=True)
SETTINGS = RelaySettings(sealer=Sealer.from_config(KEY), policy=LOOPBACK)
CONFIG = DeliveryConfig(secret_key=KEY, allow_http=True, allow_loopback=True,
                        circuit_failure_threshold=2, circuit_open_s=60,
                        endpoint_concurrency=1, lease_batch=10, timeout_s=5)


class Receiver:
    """Verifies each request's signature over the exact bytes received; answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.secret = ""
        self.bodies: list[bytes] = []
        self.documents: list[dict[str, Any]] = []
        self.server: TestServer | None = None
        self.url = ""
        self.hold: asyncio.Event | None = None  # set: requests wait for it before answering

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.hold is not None:
            await self.hold.wait()
        self.documents.append(webhooks.verify(self.secret, request.headers, body))
        self.bodies.append(body)
        return web.Response(status=self.status, text="nope" * 400 if self.status >= 300 else "")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        self.url = f"http://127.0.0.1:{self.server.port}/hook"


@pytest.fixture
async def receivers() -> AsyncIterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for r in made:
        if r.server is not None:
            await r.server.close()


async def receiver(made: list[Receiver], status: int = 200) -> Receiver:
    r = Receiver(status)
    await r.start()
    made.append(r)
    return r


async def hook(db: Database, tenant: Tenant, name: str, r: Receiver,
               **fields: Any) -> dict[str, Any]:
    created = await relay.subscribe(db, tenant, name, kind="WEBHOOK", endpoint_url=r.url,
                                    settings=SETTINGS, **fields)
    assert created.secret is not None
    r.secret = created.secret
    return await relay.subscription_row(db, tenant, name)


def pump(db: Database, config: DeliveryConfig = CONFIG) -> DeliveryService:
    gate = ReadinessGate(SchemaChecker(db), 60)
    return DeliveryService(OrbitConfig(delivery=config), db, gate,
                           metrics=PumpMetrics(prometheus_client.CollectorRegistry()))


async def target(db: Database, tenant: Tenant, name: str) -> dict[str, Any] | None:
    rows = await db.read("test.targets", lambda cur: circuit.webhook_targets(cur, 10_000))
    sub = await relay.subscription_row(db, tenant, name)
    return next((r for r in rows if r["id"] == sub["id"]), None)


def sample(service: DeliveryService, name: str, **labels: str) -> float:
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_batch_signs_the_relay_payload_bytes_and_acknowledges(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers)
    await hook(db, tenant, "hook", r)
    await relay.cancelled_results(db, tenant, queue, 3)
    await relay.fan_out_all(db, tenant)
    service = pump(db)
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        done = await service.batch(row)
    finally:
        await service.close()
    assert (done.leased, done.sent, done.released) == (3, 3, 0)
    rows = await relay.delivery_rows(db, tenant)
    assert {d["state"] for d in rows} == {"ACKNOWLEDGED"}
    assert (await relay.subscription_row(db, tenant, "hook"))["backlog"] == 0
    # The receiver got exactly the bytes relay.payload.body gives for the leased payload.
    by_id = {d["id"]: d for d in r.documents}
    assert sorted(by_id) == sorted(d["id"].hex() for d in rows)
    for body, document in zip(r.bodies, r.documents, strict=True):
        assert document["type"] == "task.result"
        assert body == payload.body(_as_payload(document))
    assert sample(service, "orbit_delivery_ack_lag_seconds_count") == 3
    assert sample(service, "orbit_delivery_attempts_total", outcome="delivered") == 3
    assert await target(db, tenant, "hook") is None  # nothing due any more


def _as_payload(document: dict[str, Any]) -> dict[str, Any]:
    """The verified document rebuilt in contract order (the snapshot re-encoded compactly)."""
    from orbit_common.model import jsondoc

    return {**document, "snapshot": jsondoc.RawJson(jsondoc.dumps(document["snapshot"]))}


async def test_a_failing_endpoint_opens_its_circuit_and_the_rest_is_released(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    bad, good = await receiver(receivers, 503), await receiver(receivers)
    await hook(db, tenant, "bad", bad)
    await hook(db, tenant, "good", good)
    await relay.cancelled_results(db, tenant, queue, 5)
    await relay.fan_out_all(db, tenant)
    service = pump(db)
    try:
        rows = [await target(db, tenant, "bad"), await target(db, tenant, "good")]
        assert all(rows)
        assert service.start_batches([r for r in rows if r is not None]) == 2
        by_subscription = {key[1]: list(running) for key, running in service.busy.items()}
        first = {sub_id: (await asyncio.gather(*running))[0]
                 for sub_id, running in by_subscription.items()}
        # SKIP LOCKED may pass over a row the other subscription's lease scan holds for an
        # instant (InnoDB locks the record just past its range); the pump's next batch takes
        # it, as it does here.
        good_row = await target(db, tenant, "good")
        extra = 0
        while good_row is not None:
            extra += (await service.batch(good_row)).sent
            good_row = await target(db, tenant, "good")
    finally:
        await service.close()
    bad_id = (await relay.subscription_row(db, tenant, "bad"))["id"]
    good_id = (await relay.subscription_row(db, tenant, "good"))["id"]
    bad_batch, good_batch = first[bad_id], first[good_id]
    # endpoint_concurrency=1: the bad endpoint got exactly threshold (2) requests, then the
    # circuit opened and its other leases went back unsent; the good one took all 5.
    assert bad_batch.sent == 2
    assert bad_batch.leased >= 3
    assert bad_batch.released == bad_batch.leased - 2
    assert (good_batch.sent, good_batch.released) == (good_batch.leased, 0)
    assert good_batch.sent + extra == 5
    assert len(bad.bodies) == 2
    assert len(good.bodies) == 5
    sub = await relay.subscription_row(db, tenant, "bad")
    assert (sub["circuit_state"], sub["consecutive_failures"]) == ("OPEN", 2)
    assert sub["backlog"] == 5
    deliveries = [d for d in await relay.delivery_rows(db, tenant)
                  if d["subscription_id"] == sub["id"]]
    assert sorted(d["attempts_used"] for d in deliveries) == [0, 0, 0, 1, 1]
    assert {d["state"] for d in deliveries} == {"PENDING"}
    failed = [d for d in deliveries if d["attempts_used"] == 1]
    # The stored failure text is the body cut to 1024 characters (the sender read 4096 bytes).
    assert all(d["last_status_code"] == 503 and len(d["last_error"]) == 1024 for d in failed)
    assert sample(service, "orbit_delivery_released_total",
                  reason="circuit_open") == bad_batch.released
    await relay.make_due(db, tenant)
    assert await target(db, tenant, "bad") is None  # open: not a target although due
    await service.refresh_gauges()
    assert sample(service, "orbit_delivery_endpoint_circuits", state="open") >= 1


async def test_one_pump_of_two_sends_the_probe_and_its_success_closes_the_circuit(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers)
    sub = await hook(db, tenant, "hook", r)
    await relay.cancelled_results(db, tenant, queue, 3)
    await relay.fan_out_all(db, tenant)

    async def opened_and_due(cur: Any) -> None:
        await cur.execute("UPDATE orbit_subscriptions SET circuit_state = 'OPEN',"
                          " consecutive_failures = 2, circuit_open_until = UTC_TIMESTAMP(6)"
                          " - INTERVAL 1 SECOND WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, sub["id"]))

    await db.transaction("test.open", opened_and_due)
    first, second = pump(db), pump(db)
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        results = await asyncio.gather(first.batch(row), second.batch(row))
        assert sorted(b.sent for b in results) == [0, 1]  # one probe, one pump
        assert len(r.bodies) == 1
        closed = await relay.subscription_row(db, tenant, "hook")
        assert (closed["circuit_state"], closed["consecutive_failures"]) == ("CLOSED", 0)
        row = await target(db, tenant, "hook")
        assert row is not None
        assert (await first.batch(row)).sent == 2  # closed: the rest flows
    finally:
        await first.close()
        await second.close()
    assert len(r.bodies) == 3


async def test_a_draining_pump_releases_its_leases_without_spending_attempts(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers)
    await hook(db, tenant, "hook", r)
    await relay.cancelled_results(db, tenant, queue, 2)
    await relay.fan_out_all(db, tenant)
    service = pump(db, attrs.evolve(CONFIG, release_delay_ms=0))
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        service.stopping.set()
        done = await service.batch(row)
    finally:
        await service.close()
    assert (done.leased, done.sent, done.released) == (2, 0, 2)
    assert r.bodies == []
    rows = await relay.delivery_rows(db, tenant)
    assert [(d["state"], d["attempts_used"]) for d in rows] == [("PENDING", 0)] * 2
    assert await target(db, tenant, "hook") is not None  # due again at once


async def test_without_a_secret_key_nothing_is_leased(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers)
    await hook(db, tenant, "hook", r)
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    service = pump(db, attrs.evolve(CONFIG, secret_key=""))
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        assert (await service.batch(row)).leased == 0
    finally:
        await service.close()
    assert [d["state"] for d in await relay.delivery_rows(db, tenant)] == ["PENDING"]


async def test_a_subscription_waiting_out_its_backoff_is_not_a_target(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers, 500)
    await hook(db, tenant, "hook", r)
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    service = pump(db, attrs.evolve(CONFIG, circuit_failure_threshold=5))
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        assert (await service.batch(row)).sent == 1
    finally:
        await service.close()
    sub = await relay.subscription_row(db, tenant, "hook")
    assert (sub["circuit_state"], sub["backlog"]) == ("CLOSED", 1)
    assert await target(db, tenant, "hook") is None  # in backoff: no lease transactions
    await relay.make_due(db, tenant)
    assert await target(db, tenant, "hook") is not None


async def test_a_request_ends_before_its_lease_does(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    """A receiver slower than the lease: the request is cut off before the lease ends (and its
    failure recorded while the lease is live), so no other pump re-leases it while it is out."""
    queue = await make_queue(db, tenant)
    r = await receiver(receivers)
    r.hold = asyncio.Event()  # never answers until the test ends
    await hook(db, tenant, "hook", r, lease_ms=1000)
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    service = pump(db, attrs.evolve(CONFIG, timeout_s=30))
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        started = asyncio.get_running_loop().time()
        done = await asyncio.wait_for(service.batch(row), timeout=10)
        took = asyncio.get_running_loop().time() - started
    finally:
        r.hold.set()
        await service.close()
    assert done.sent == 1
    assert took < 1.0  # bounded by the 1 s lease, not the 30 s timeout
    (delivery,) = await relay.delivery_rows(db, tenant)
    assert (delivery["state"], delivery["attempts_used"]) == ("PENDING", 1)
    assert delivery["last_error"].startswith("timeout")
    attempts = await relay.rows(db, "SELECT outcome FROM orbit_delivery_attempts"
                                " WHERE namespace_id = %s", tenant.namespace_id)
    assert [a["outcome"] for a in attempts] == ["FAILED"]  # recorded, not lapsed


async def test_two_batches_of_one_subscription_run_at_once_but_one_probe(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers)
    r.hold = asyncio.Event()  # the first batch stays on the wire while the next one starts
    await hook(db, tenant, "hook", r)
    await relay.cancelled_results(db, tenant, queue, 4)
    await relay.fan_out_all(db, tenant)
    service = pump(db, attrs.evolve(CONFIG, lease_batch=2, batches_per_subscription=2))
    try:
        row = await target(db, tenant, "hook")
        assert row is not None
        assert service.start_batches([row]) == 1
        await until_leased(db, tenant, 2)
        assert service.start_batches([row]) == 1
        assert service.start_batches([row]) == 0  # two in flight: the most per subscription
        await until_leased(db, tenant, 4)
        assert len(r.bodies) == 0
        r.hold.set()
        results = await asyncio.gather(*service.batches())
        assert sorted(b.sent for b in results) == [2, 2]
        assert service.busy == {}
        probing = {**row, "circuit_state": "OPEN"}
        assert service.start_batches([probing]) == 1
        assert service.start_batches([probing]) == 0  # a probe is one batch
        await asyncio.gather(*service.batches())
    finally:
        r.hold.set()
        await service.close()
    assert {d["state"] for d in await relay.delivery_rows(db, tenant)} == {"ACKNOWLEDGED"}


async def until_leased(db: Database, tenant: Tenant, count: int) -> None:
    from tests.support.waiting import until

    async def leased() -> bool:
        rows = await relay.delivery_rows(db, tenant)
        return sum(1 for d in rows if d["state"] == "LEASED") >= count

    await until(leased, message=f"{count} leased deliveries")


async def test_exhaustion_and_the_backlog_reach_the_metrics(
        db: Database, tenant: Tenant, receivers: list[Receiver]) -> None:
    queue = await make_queue(db, tenant)
    r = await receiver(receivers, 500)
    await hook(db, tenant, "hook", r, max_attempts=1)
    await relay.cancelled_results(db, tenant, queue, 2)
    await relay.fan_out_all(db, tenant)
    service = pump(db, attrs.evolve(CONFIG, circuit_failure_threshold=10))
    try:
        await service.refresh_gauges()
        # Without tenant labels: one summed series and the largest backlog, no names.
        assert sample(service, "orbit_delivery_backlog") >= 2
        assert sample(service, "orbit_delivery_backlog_max") >= 2
        row = await target(db, tenant, "hook")
        assert row is not None
        assert (await service.batch(row)).sent == 2
    finally:
        await service.close()
    assert [d["state"] for d in await relay.delivery_rows(db, tenant)] == ["EXHAUSTED"] * 2
    assert (await relay.subscription_row(db, tenant, "hook"))["backlog"] == 0
    assert sample(service, "orbit_delivery_exhausted_total") == 2
    assert sample(service, "orbit_delivery_attempts_total", outcome="http_5xx") == 2
    text = prometheus_client.generate_latest(service.metrics.registry).decode()
    assert tenant.namespace not in text

"""One webhook attempt end to end (orbit_delivery/pushing.py): signed, sent to a real loopback
server, the endpoint's circuit opening on failures and refusing without a request."""

from __future__ import annotations

import base64
import datetime as dt
import os
from typing import Any

import prometheus_client
from aiohttp import web
from aiohttp.test_utils import TestServer
from orbit_sdk import webhooks

from orbit_common.model.jsondoc import RawJson
from orbit_delivery.circuits import CircuitBreakers, CircuitPolicy, CircuitState
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.payload import ResultDelivery
from orbit_delivery.pushing import CircuitRefused, WebhookPusher
from orbit_delivery.sender import SenderLimits, SendOutcome, WebhookSender
from orbit_delivery.signing import SigningSecrets


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


DELIVERY = ResultDelivery(
    delivery_id="d" * 32, subscription_id="s" * 32, subscription="billing", namespace="prod",
    sequence=1, event_id="e" * 32, task_id="t" * 32, queue="payments", task_revision=3,
    state="SUCCEEDED", committed_at=dt.datetime(2026, 12, 1, tzinfo=dt.UTC), attempt=1,
    snapshot=RawJson('{"task_id":"' + "t" * 32 + '","result":{"n":1.50}}'))


class Receiver:
    """A loopback receiver that verifies signatures and answers ``status``."""

    def __init__(self, secret: str, status: int = 204) -> None:
        self.secret = secret
        self.status = status
        self.received: list[dict[str, Any]] = []
        self.signatures: list[str] = []
        self.server: TestServer | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append(webhooks.verify(self.secret, request.headers, body))
        self.signatures.append(request.headers["webhook-signature"])
        return web.Response(status=self.status)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}/hook"

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()


async def test_a_push_is_signed_with_both_secrets_during_rotation() -> None:
    current, previous = new_secret(), new_secret()
    old_receiver = Receiver(previous)  # still knows only the previous secret
    url = await old_receiver.start()
    try:
        async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
            pusher = WebhookPusher(sender, CircuitBreakers())
            outcome = await pusher.push(url, DELIVERY,
                                        SigningSecrets(current=current, previous=previous))
        assert isinstance(outcome, SendOutcome)
        assert outcome.delivered
        assert old_receiver.received[0]["id"] == "d" * 32
        assert old_receiver.received[0]["snapshot"]["result"] == {"n": 1.5}
        assert len(old_receiver.signatures[0].split(" ")) == 2
    finally:
        await old_receiver.close()


async def test_a_failing_endpoint_opens_its_circuit_and_others_keep_going() -> None:
    secret = new_secret()
    broken, healthy = Receiver(secret, status=500), Receiver(secret)
    broken_url, healthy_url = await broken.start(), await healthy.start()
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry)
    clock = [100.0]
    breakers = CircuitBreakers(CircuitPolicy(failure_threshold=2, open_base_s=30))
    keys = SigningSecrets(current=secret)
    try:
        async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
            pusher = WebhookPusher(sender, breakers, metrics=metrics,
                                   monotonic=lambda: clock[0])
            for _ in range(2):
                outcome = await pusher.push(broken_url, DELIVERY, keys)
                assert isinstance(outcome, SendOutcome)
                assert outcome.status == 500
            refused = await pusher.push(broken_url, DELIVERY, keys)
            assert isinstance(refused, CircuitRefused)
            assert refused.retry_in_s == 30
            assert len(broken.received) == 2  # the refusal made no request
            # Another endpoint is not held up by the open circuit.
            assert isinstance(await pusher.push(healthy_url, DELIVERY, keys), SendOutcome)
            assert len(healthy.received) == 1
            assert registry.get_sample_value("orbit_delivery_endpoint_circuits",
                                             {"state": "open"}) == 1
            # After the open period one probe goes through; the endpoint recovered: closed.
            clock[0] += 30
            broken.status = 200
            probe = await pusher.push(broken_url, DELIVERY, keys)
            assert isinstance(probe, SendOutcome)
            assert probe.delivered
            assert breakers.state(refused.endpoint) is CircuitState.CLOSED
    finally:
        await broken.close()
        await healthy.close()
    samples = {labels: registry.get_sample_value("orbit_delivery_attempts_total",
                                                 {"outcome": labels})
               for labels in ("http_5xx", "circuit_open", "delivered")}
    assert samples == {"http_5xx": 2, "circuit_open": 1, "delivered": 2}
    assert registry.get_sample_value("orbit_delivery_endpoint_circuits", {"state": "open"}) == 0


async def test_a_push_to_a_non_url_is_an_invalid_url_outcome() -> None:
    async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
        outcome = await WebhookPusher(sender, CircuitBreakers()).push(
            "not a url", DELIVERY, SigningSecrets(current=new_secret()))
    assert isinstance(outcome, SendOutcome)
    assert outcome.kind == "invalid_url"

"""One webhook attempt end to end (orbit_delivery/pushing.py): the relay payload's bytes, signed
(two secrets while rotating), sent to a real loopback server, counted by outcome. The endpoint
circuit is the database's (tests/integration/relay/test_pump.py)."""

from __future__ import annotations

import base64
import datetime as dt
import os
from typing import Any

import prometheus_client
from aiohttp import web
from aiohttp.test_utils import TestServer
from orbit_sdk import webhooks

from orbit_common.relay import payload
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.pushing import WebhookPusher
from orbit_delivery.sender import SenderLimits, WebhookSender
from orbit_delivery.signing import SigningSecrets


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


DELIVERY = payload.build(
    delivery_id=b"\xdd" * 16, subscription_id=b"\x55" * 16, subscription="billing",
    namespace="prod", sequence=1, event_id=b"\xee" * 16, task_id=b"\x77" * 16,
    queue="payments", task_revision=3, state="SUCCEEDED",
    committed_at=dt.datetime(2026, 12, 1, tzinfo=dt.UTC), attempt=1,
    snapshot='{"task_id":"' + "77" * 16 + '","result":{"n":1.50}}')


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
            pusher = WebhookPusher(sender)
            outcome = await pusher.push(url, DELIVERY,
                                        SigningSecrets(current=current, previous=previous))
        assert outcome.delivered
        assert old_receiver.received[0]["id"] == "dd" * 16
        assert old_receiver.received[0]["snapshot"]["result"] == {"n": 1.5}
        assert len(old_receiver.signatures[0].split(" ")) == 2
    finally:
        await old_receiver.close()


async def test_attempts_are_counted_by_outcome() -> None:
    secret = new_secret()
    broken, healthy = Receiver(secret, status=500), Receiver(secret)
    broken_url, healthy_url = await broken.start(), await healthy.start()
    registry = prometheus_client.CollectorRegistry()
    keys = SigningSecrets(current=secret)
    try:
        async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
            pusher = WebhookPusher(sender, metrics=PumpMetrics(registry))
            assert (await pusher.push(broken_url, DELIVERY, keys)).status == 500
            assert (await pusher.push(healthy_url, DELIVERY, keys)).delivered
    finally:
        await broken.close()
        await healthy.close()
    samples = {outcome: registry.get_sample_value("orbit_delivery_attempts_total",
                                                  {"outcome": outcome})
               for outcome in ("http_5xx", "delivered")}
    assert samples == {"http_5xx": 1, "delivered": 1}


async def test_a_push_to_a_non_url_is_an_invalid_url_outcome() -> None:
    async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
        outcome = await WebhookPusher(sender).push(
            "not a url", DELIVERY, SigningSecrets(current=new_secret()))
    assert outcome.kind == "invalid_url"

"""``orbit_sdk.outbox.send`` against the scripted fake API: every send of a stored request is the
same bytes under the same key; a request that does not match what was written, or a receipt
that does not match the request, is refused. (Writing rows: tests/integration/test_task_outbox.py
in the repository, on a real database.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_client import NS, RECEIPT, FakeApi, ok

from orbit_sdk import Client, RawJson, TaskRequest
from orbit_sdk.outbox import OutboxEntry, OutboxMismatch, prepare, send


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, Client]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app)
    await server.start_server()
    client = Client(str(server.make_url("")), "key-123", "team-a", max_retries=0)
    yield fake, client
    await client.close()
    await server.close()


def entry(**request: Any) -> OutboxEntry:
    fields: dict[str, Any] = {"queue": "emails", "handler": "send",
              "input": RawJson('{"amount": 12345678901234567890.123456789}'),
              "priority": 3, "retry": {"multiplier": Decimal("1.50")}, **request}
    written, _params = prepare(TaskRequest(**fields),
                               namespace="team-a", business_table="orders", business_id="7")
    return written


async def test_every_send_is_the_written_request_under_its_original_key(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok(RECEIPT, status=201))
    written = entry()
    first = await send(client, written)
    again = await send(client, written)
    assert first.id == again.id == RECEIPT["id"]
    assert len(fake.seen) == 2
    bodies = {s.body for s in fake.seen}
    keys = {s.headers["Idempotency-Key"] for s in fake.seen}
    assert len(bodies) == 1
    assert keys == {written.idempotency_key}
    body = bodies.pop().decode()
    assert '"input":{"amount": 12345678901234567890.123456789}' in body
    assert json.loads(body, parse_float=Decimal)["retry"] == {"multiplier": Decimal("1.50")}


async def test_a_request_that_does_not_match_what_was_written_is_not_sent(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok(RECEIPT, status=201))
    written = entry()
    for changed in (attrs.evolve(written, input_json='{"amount": 1}'),
                    attrs.evolve(written, namespace="team-b"),
                    attrs.evolve(written, operation="workflows.start")):
        with pytest.raises(OutboxMismatch):
            await send(client, changed)
    assert fake.seen == []


async def test_a_receipt_for_another_request_is_refused(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok({**RECEIPT, "handler": "other"}, status=201))
    with pytest.raises(OutboxMismatch) as caught:
        await send(client, entry())
    assert caught.value.code == "outbox_mismatch"


def test_options_are_stored_sorted_and_the_digest_covers_them() -> None:
    a = entry(priority=3, business_key="o-7")
    b = entry(business_key="o-7", priority=3)
    c = entry(priority=4, business_key="o-7")
    assert a.options_json == b.options_json
    assert a.options_json.startswith('{"business_key":"o-7","priority":3')
    assert a.request_digest == b.request_digest
    assert a.request_digest != c.request_digest
    assert a.idempotency_key != b.idempotency_key

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

from orbit_sdk import Client, RawJson, TaskRequest, WorkflowInstance, WorkflowSignal
from orbit_sdk.outbox import (
    OPERATION_SIGNAL,
    OPERATION_START,
    OutboxEntry,
    OutboxMismatch,
    SignalRequest,
    WorkflowStartRequest,
    prepare,
    send,
)


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


START_RECEIPT = {"id": "ab" * 16, "definition": "orders", "version": 2, "state": "RUNNING",
                 "business_key": "order-7", "revision": 1}
SIGNAL_RECEIPT = {"id": "cd" * 16, "workflow_id": "ab" * 16, "name": "paid",
                  "correlation_key": "order-7", "payload_version": 1, "state": "PENDING"}


def start_entry(**request: Any) -> OutboxEntry:
    fields: dict[str, Any] = {"definition": "orders", "version": 2, "business_key": "order-7",
                              "input": RawJson('{"amount": 1.10}'), **request}
    written, _params = prepare(WorkflowStartRequest(**fields), namespace="team-a",
                               business_table="orders", business_id="7")
    return written


def signal_entry(**request: Any) -> OutboxEntry:
    fields: dict[str, Any] = {"definition": "orders", "name": "paid",
                              "payload": RawJson('{"paid": 1.10}'), "workflow_id": "ab" * 16,
                              "correlation_key": "order-7", **request}
    written, _params = prepare(SignalRequest(**fields), namespace="team-a",
                               business_table="orders", business_id="7")
    return written


async def test_a_stored_workflow_start_is_sent_the_same_under_its_original_key(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/workflows", ok(START_RECEIPT, status=201))
    written = start_entry()
    assert (written.operation, written.queue, written.handler) == (
        OPERATION_START, "orders", "")
    first = await send(client, written)
    again = await send(client, written)
    assert isinstance(first, WorkflowInstance)
    assert first.id == again.id == START_RECEIPT["id"]
    assert {s.headers["Idempotency-Key"] for s in fake.seen} == {written.idempotency_key}
    assert len({s.body for s in fake.seen}) == 1
    body = fake.seen[0].body.decode()
    assert '"input":{"amount": 1.10}' in body
    assert json.loads(body) == {"definition": "orders", "input": {"amount": 1.1},
                                "version": 2, "business_key": "order-7"}


async def test_a_stored_signal_goes_to_its_instance_or_its_business_key(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/workflows/{'ab' * 16}/signals", ok(SIGNAL_RECEIPT, status=201))
    fake.on("POST", f"{NS}/workflow-signals", ok(SIGNAL_RECEIPT, status=201))
    by_id = signal_entry()
    assert (by_id.operation, by_id.queue, by_id.handler) == (OPERATION_SIGNAL, "orders", "paid")
    receipt = await send(client, by_id)
    assert isinstance(receipt, WorkflowSignal)
    assert receipt.id == SIGNAL_RECEIPT["id"]
    by_key = signal_entry(workflow_id=None, business_key="order-7")
    await send(client, by_key)
    first, second = fake.seen
    assert first.path == f"{NS}/workflows/{'ab' * 16}/signals"
    assert json.loads(first.body) == {"name": "paid", "payload": {"paid": 1.1},
                                      "payload_version": 1, "correlation_key": "order-7"}
    assert first.headers["Idempotency-Key"] == by_id.idempotency_key
    assert second.path == f"{NS}/workflow-signals"
    assert json.loads(second.body) == {"definition": "orders", "business_key": "order-7",
                                       "name": "paid", "payload": {"paid": 1.1},
                                       "payload_version": 1, "correlation_key": "order-7"}
    assert second.headers["Idempotency-Key"] == by_key.idempotency_key


async def test_a_workflow_receipt_for_another_request_is_refused(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/workflows", ok({**START_RECEIPT, "business_key": "order-8"},
                                          status=201))
    fake.on("POST", f"{NS}/workflows/{'ab' * 16}/signals",
            ok({**SIGNAL_RECEIPT, "name": "shipped"}, status=201))
    for written in (start_entry(), signal_entry()):
        with pytest.raises(OutboxMismatch):
            await send(client, written)


def test_a_signal_names_exactly_one_target() -> None:
    for target in ({"workflow_id": None}, {"business_key": "order-7"}):
        with pytest.raises(ValueError, match="one of them"):
            signal_entry(**target)

"""examples/result-inbox against a real database: each result applied once, never backwards.

The receiver is served on a real socket and fed by Orbit's own signer and webhook sender
(orbit_delivery), so what is tested is what the pump would send.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from result_inbox import inbox
from result_inbox.receiver import PATH, create_app

from orbit_delivery import signing
from orbit_delivery.sender import SenderLimits, TransportError, WebhookSender
from tests.support.webhook_payload import Delivery as ResultDelivery


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def hex_id() -> str:
    return secrets.token_hex(16)


def delivery(task_id: str, revision: int, *, state: str = "SUCCEEDED",
             result: str = '{"amount":12345678901234567890.10}',
             event_id: str | None = None) -> ResultDelivery:
    snapshot = json.dumps({
        "task_id": task_id, "handler": "charge", "state": state, "revision": revision,
        "outcome_reason": "completed", "attempts_used": 1, "effect_uncertain": False,
        "error": None}).removesuffix("}") + f',"result":{result}}}'

    return ResultDelivery(
        delivery_id=hex_id(), subscription_id=hex_id(), subscription="billing",
        namespace="prod", sequence=revision, event_id=event_id or hex_id(), task_id=task_id,
        queue="payments", task_revision=revision, state=state,
        committed_at=dt.datetime(2026, 12, 1, 8, 0, revision, tzinfo=dt.UTC), attempt=1,
        snapshot=snapshot)


def parsed(d: ResultDelivery) -> inbox.TaskResult:
    from orbit_sdk import jsonvalue

    return inbox.TaskResult.from_delivery(jsonvalue.loads(d.body(), exact_numbers=True))


async def rows(pool: Any, task_id: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(inbox rows, view rows) of one task, read outside any test transaction."""
    async with pool.acquire() as conn:
        await conn.commit()  # a fresh snapshot
        async with conn.cursor() as cur:
            await cur.execute("SELECT event_id, task_revision, outcome FROM receiver_inbox"
                              " WHERE task_id = %s ORDER BY task_revision, event_id", (task_id,))
            inbox_rows = list(await cur.fetchall())
            await cur.execute("SELECT task_revision, state, result, event_id"
                              " FROM receiver_task_views WHERE task_id = %s", (task_id,))
            view_rows = list(await cur.fetchall())
        await conn.commit()
    return inbox_rows, view_rows


async def test_a_duplicate_delivery_is_applied_once(pool: Any) -> None:
    task = hex_id()
    first = delivery(task, 2)
    calls: list[str] = []

    async def business(_cur: Any, result: inbox.TaskResult) -> None:
        calls.append(result.event_id)

    assert await inbox.apply_with_retry(pool, parsed(first), on_applied=business) == "applied"
    # The same event again (another delivery of it, or a retry of the same delivery).
    again = first.again(delivery_id=hex_id(), attempt=2)
    assert await inbox.apply_with_retry(pool, parsed(again), on_applied=business) == "duplicate"
    inbox_rows, view_rows = await rows(pool, task)
    assert inbox_rows == [(first.event_id, 2, "APPLIED")]
    assert view_rows == [(2, "SUCCEEDED", '{"amount":12345678901234567890.10}', first.event_id)]
    assert calls == [first.event_id]


async def test_an_older_revision_after_a_newer_one_changes_nothing(pool: Any) -> None:
    task = hex_id()
    newer = delivery(task, 5, state="FAILED", result="null")
    older = delivery(task, 3, state="SUCCEEDED")
    assert await inbox.apply_with_retry(pool, parsed(newer)) == "applied"
    assert await inbox.apply_with_retry(pool, parsed(older)) == "stale"
    inbox_rows, view_rows = await rows(pool, task)
    assert sorted(inbox_rows) == sorted([(newer.event_id, 5, "APPLIED"),
                                         (older.event_id, 3, "STALE")])
    assert view_rows == [(5, "FAILED", None, newer.event_id)]
    # A higher revision still moves it forward.
    newest = delivery(task, 7, state="SUCCEEDED", result='{"ok":true}')
    assert await inbox.apply_with_retry(pool, parsed(newest)) == "applied"
    assert (await rows(pool, task))[1] == [(7, "SUCCEEDED", '{"ok":true}', newest.event_id)]


async def test_a_failed_transaction_leaves_neither_row(pool: Any) -> None:
    task = hex_id()
    d = delivery(task, 1)

    async def business_fails(cur: Any, _result: inbox.TaskResult) -> None:
        await cur.execute("SELECT 1")
        raise RuntimeError("the business update failed")

    with pytest.raises(RuntimeError):
        await inbox.apply_with_retry(pool, parsed(d), on_applied=business_fails)
    assert await rows(pool, task) == ([], [])
    # Nothing was recorded, so the redelivery applies it.
    assert await inbox.apply_with_retry(pool, parsed(d)) == "applied"
    assert len((await rows(pool, task))[0]) == 1


async def test_concurrent_results_of_one_task_end_on_the_highest_revision(pool: Any) -> None:
    task = hex_id()
    deliveries = [delivery(task, revision) for revision in range(1, 9)]
    outcomes = await asyncio.gather(*(inbox.apply_with_retry(pool, parsed(d))
                                      for d in reversed(deliveries)))
    assert "applied" in outcomes
    inbox_rows, view_rows = await rows(pool, task)
    assert len(inbox_rows) == 8
    assert view_rows[0][0] == 8
    assert view_rows[0][3] == deliveries[-1].event_id


def test_a_malformed_body_is_refused() -> None:
    good = json.loads(delivery(hex_id(), 1).body())
    for change in ({"state": "RUNNING"}, {"task_revision": "3"}, {"task_revision": 0},
                   {"snapshot": []}, {"committed_at": "2026-12-01T08:00:00"},
                   {"event_id": ""}):
        with pytest.raises(inbox.BadDelivery):
            inbox.TaskResult.from_delivery({**good, **change})
    without = dict(good)
    del without["task_id"]
    with pytest.raises(inbox.BadDelivery):
        inbox.TaskResult.from_delivery(without)


# --- the webhook receiver ---------------------------------------------------------------------


@pytest.fixture
async def receiver(pool: Any) -> AsyncIterator[Callable[..., Any]]:
    """Serve the receiver app on 127.0.0.1; ``start(secret, **kwargs)`` returns its URL."""
    servers: list[TestServer] = []

    async def start(secret: str, *, middlewares: tuple[Any, ...] = ()) -> str:
        app = create_app(pool, [secret])
        app.middlewares.extend(middlewares)  # before the server freezes the app
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}{PATH}"

    yield start
    for server in servers:
        await server.close()


def signed(secret: str, d: ResultDelivery) -> tuple[bytes, dict[str, str]]:
    body = d.body()
    return body, signing.headers(signing.SigningSecrets(current=secret),
                                 msg_id=d.delivery_id, timestamp=int(time.time()), body=body)


async def test_a_signed_delivery_is_applied_and_acknowledged(receiver: Any, pool: Any) -> None:
    secret = new_secret()
    url = await receiver(secret)
    task = hex_id()
    d = delivery(task, 4)
    async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
        outcome = await sender.send(url, *signed(secret, d))
    assert outcome.delivered, outcome
    assert json.loads(outcome.body) == {"outcome": "applied"}
    # The result's digits survive the trip: stored exactly as the worker reported them.
    assert (await rows(pool, task))[1] == [
        (4, "SUCCEEDED", '{"amount":12345678901234567890.10}', d.event_id)]


async def test_a_bad_signature_gets_401_and_writes_nothing(receiver: Any, pool: Any) -> None:
    url = await receiver(new_secret())
    task = hex_id()
    d = delivery(task, 1)
    body, headers = signed(new_secret(), d)  # signed with a secret the receiver does not know
    async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
        outcome = await sender.send(url, body, headers)
        assert outcome.status == 401
        unsigned = {k: v for k, v in headers.items() if k != "webhook-signature"}
        assert (await sender.send(url, body, unsigned)).status == 401
    assert await rows(pool, task) == ([], [])


async def test_a_lost_2xx_is_redelivered_and_applied_once(receiver: Any, pool: Any) -> None:
    """The receiver commits, its answer never reaches the sender (timeout), the pump retries
    the same delivery: the retry is acknowledged as a duplicate and nothing is applied twice."""
    secret = new_secret()
    task = hex_id()
    answer_lost = asyncio.Event()
    held: list[int] = []

    @web.middleware
    async def lose_first_answer(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)  # committed by now
        if not held:
            held.append(1)
            await answer_lost.wait()  # the answer is held until the sender has given up
        return response

    url = await receiver(secret, middlewares=(lose_first_answer,))
    d = delivery(task, 3)
    limits = SenderLimits(total_timeout_s=0.5)
    async with WebhookSender(limits, address_refused=lambda _ip: False) as sender:
        first = await sender.send(url, *signed(secret, d))
        assert first.error is TransportError.TIMEOUT
        # Committed before answering: the rows are there although the sender saw no 2xx.
        assert len((await rows(pool, task))[0]) == 1
        retry = d.again(attempt=2)  # same delivery id, next attempt
        second = await sender.send(url, *signed(secret, retry))
    answer_lost.set()
    assert second.delivered, second
    assert json.loads(second.body) == {"outcome": "duplicate"}
    inbox_rows, view_rows = await rows(pool, task)
    assert inbox_rows == [(d.event_id, 3, "APPLIED")]
    assert len(view_rows) == 1


async def test_a_malformed_but_signed_body_gets_400(receiver: Any, pool: Any) -> None:
    secret = new_secret()
    url = await receiver(secret)
    task = hex_id()
    document = json.loads(delivery(task, 1).body())
    document["task_revision"] = -1
    body = json.dumps(document).encode()
    headers = signing.headers(signing.SigningSecrets(current=secret), msg_id=hex_id(),
                              timestamp=int(time.time()), body=body)
    async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
        outcome = await sender.send(url, body, headers)
    assert outcome.status == 400
    assert await rows(pool, task) == ([], [])

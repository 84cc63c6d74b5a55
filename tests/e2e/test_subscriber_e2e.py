"""Result subscriptions through the SDK against real API and dispatcher processes: the client's
management and pull-consumption calls, and the Subscriber (WebSocket with credit, HTTP
long-poll fallback, failures and budgets, graceful drain). Results come from tasks an SDK
Worker runs; the pump's fan-out step runs in-process (tests/support/results.py)."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from orbit_sdk import (
    Client,
    Conflict,
    DeliveryReport,
    NotFound,
    OrbitError,
    ResultDelivery,
    StaleRevision,
    Subscriber,
    SubscriptionFilters,
    ValidationError,
)

from orbit_common.model.sealing import new_key_text
from tests.support.processes import ApiDaemon
from tests.support.results import expire_leases, producing
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("subscriber"), dispatchers=1,
              api_env={"ORBIT_DELIVERY_SECRET_KEY": new_key_text()})
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def orbit(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.api.url, stack.api_key, stack.namespace) as client:
        yield client


async def deliveries_of(orbit: Client, name: str, state: str | None = None) -> list[Any]:
    return [d async for d in orbit.list_deliveries(name, state=state)]


async def all_in(orbit: Client, name: str, state: str, count: int) -> bool:
    return len(await deliveries_of(orbit, name, state)) == count


class Consumer:
    """A Subscriber running in the background, recording what its handler saw."""

    def __init__(self, stack: Stack, name: str, *, base_url: str | None = None,
                 fail_when: Any = None, gate: asyncio.Event | None = None,
                 work_s: Any = 0.01, **options: Any) -> None:
        self.work_s = work_s
        self.seen: list[ResultDelivery] = []
        self.running = 0
        self.peak = 0
        self.fail_when = fail_when
        self.gate = gate
        self.subscriber = Subscriber(base_url or stack.api.url, stack.api_key, stack.namespace,
                                     name, self.handle, **options)
        self.task = asyncio.get_running_loop().create_task(
            self.subscriber.run(install_signal_handlers=False))

    async def handle(self, delivery: ResultDelivery) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            self.seen.append(delivery)
            # some work, so handlers overlap
            await asyncio.sleep(self.work_s(delivery) if callable(self.work_s) else self.work_s)
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_when is not None and self.fail_when(delivery):
                raise ValueError(f"cannot handle {delivery.task_id} yet")
        finally:
            self.running -= 1

    def tasks_seen(self) -> set[str]:
        return {d.task_id for d in self.seen}

    async def stop(self) -> None:
        self.subscriber.stop()
        await asyncio.wait_for(self.task, 30)


async def test_management_round_trip(stack: Stack, orbit: Client) -> None:
    await orbit.create_queue("mgmt")
    created = await orbit.create_subscription(
        "mgmt-a", filters=SubscriptionFilters(queues=("mgmt",), states=("SUCCEEDED",)),
        max_attempts=3, backoff_initial_ms=0, lease_ms=60_000, idempotency_key="create-a")
    assert (created.kind, created.state, created.revision) == ("PULL", "ACTIVE", 1)
    assert created.filters == SubscriptionFilters(queues=("mgmt",), states=("SUCCEEDED",))
    assert created.secret is None  # a pull subscription has no secret
    # The same key replays the original answer.
    again = await orbit.create_subscription("mgmt-a", idempotency_key="create-a",
                                            filters={"queues": ["mgmt"],
                                                     "states": ["SUCCEEDED"]},
                                            max_attempts=3, backoff_initial_ms=0,
                                            lease_ms=60_000)
    assert again.id == created.id
    with pytest.raises(Conflict) as exists:
        await orbit.create_subscription("mgmt-a")
    assert exists.value.code == "already_exists"
    await orbit.create_subscription("mgmt-b", filters={"queues": ["mgmt"]})
    with pytest.raises(NotFound) as no_queue:
        await orbit.create_subscription("mgmt-c", filters={"queues": ["nope"]})
    assert no_queue.value.code == "queue_not_found"

    names = [s.name async for s in orbit.list_subscriptions(page_size=1)]
    assert {"mgmt-a", "mgmt-b"} <= set(names)
    assert names == sorted(names)
    assert (await orbit.get_subscription("mgmt-a")).lease_ms == 60_000

    updated = await orbit.update_subscription("mgmt-a", revision=1, max_attempts=2)
    assert (updated.revision, updated.max_attempts) == (2, 2)
    with pytest.raises(StaleRevision) as stale:
        await orbit.update_subscription("mgmt-a", revision=1, max_attempts=5)
    assert stale.value.code == "stale_revision"
    with pytest.raises(ValidationError) as invalid:
        await orbit.update_subscription("mgmt-a", revision=2, max_attempts=0)
    assert invalid.value.code == "validation_failed"
    with pytest.raises(ValidationError):
        await orbit.rotate_subscription_secret("mgmt-a")  # a pull subscription has none

    hook = await orbit.create_subscription(
        "mgmt-hook", "WEBHOOK", endpoint_url="https://receiver.example.com/orbit",
        idempotency_key="create-hook")
    assert hook.secret is not None
    assert hook.secret.startswith("whsec_")
    assert "secret" not in hook.raw
    assert hook.secret not in repr(hook)
    replayed = await orbit.create_subscription(
        "mgmt-hook", "WEBHOOK", endpoint_url="https://receiver.example.com/orbit",
        idempotency_key="create-hook")
    assert (replayed.id, replayed.secret) == (hook.id, None)  # shown once only
    rotation = await orbit.rotate_subscription_secret("mgmt-hook", window_s=60)
    assert rotation.secret is not None
    assert rotation.secret != hook.secret
    assert rotation.previous_secret_valid_until is not None
    assert rotation.subscription.previous_secret_valid_until is not None
    assert (await orbit.get_subscription("mgmt-hook")).secret is None
    with pytest.raises(Conflict) as not_pull:
        await orbit.lease_deliveries("mgmt-hook")
    assert not_pull.value.code == "subscription_not_pull"

    paused = await orbit.pause_subscription("mgmt-a", "maintenance")
    assert paused.state == "PAUSED"
    with pytest.raises(Conflict) as not_active:
        await orbit.lease_deliveries("mgmt-a")
    assert not_active.value.code == "subscription_not_active"
    assert (await orbit.resume_subscription("mgmt-a")).state == "ACTIVE"

    # Low-level consumption: results of two tasks, one acknowledged, one failed.
    async with producing(stack, ["mgmt"]):
        stack.submit("mgmt", "echo", [{"n": 1}, {"n": 2}])
        await until(lambda: all_in(orbit, "mgmt-a", "PENDING", 2), timeout=30,
                    message="two pending deliveries")
    leased = await orbit.lease_deliveries("mgmt-a", max=10, wait_ms=1000)
    assert len(leased) == 2
    first, second = leased
    assert first.delivery.state == "SUCCEEDED"
    assert first.delivery.attempt == 1
    assert first.delivery.snapshot["result"] in ({"n": 1}, {"n": 2})
    acked = await orbit.ack_delivery("mgmt-a", first.delivery.id, first.lease_token)
    assert (acked.settled, acked.state, acked.repeated) == (True, "ACKNOWLEDGED", False)
    repeated = await orbit.ack_delivery("mgmt-a", first.delivery.id, first.lease_token)
    assert repeated.repeated
    with pytest.raises(Conflict) as lost:
        await orbit.fail_delivery("mgmt-a", second.delivery.id, "not-the-token", "x")
    assert lost.value.code == "delivery_lease_lost"
    failed = await orbit.fail_delivery("mgmt-a", second.delivery.id, second.lease_token,
                                       "downstream refused")
    assert (failed.state, failed.attempts_used) == ("PENDING", 1)
    # Due again at once (no backoff): the batch settle fails it for good (budget 2).
    (retry,) = await orbit.lease_deliveries("mgmt-a", wait_ms=2000)
    assert retry.delivery.id == second.delivery.id
    assert retry.delivery.attempt == 2
    answers = await orbit.settle_deliveries("mgmt-a", [
        DeliveryReport(delivery_id=retry.delivery.id, token=retry.lease_token,
                       acknowledged=False, error="still refused"),
        DeliveryReport(delivery_id=first.delivery.id, token="stale-token")])
    assert (answers[0].settled, answers[0].state) == (True, "EXHAUSTED")
    assert (answers[1].settled, answers[1].code) == (False, "delivery_lease_lost")

    history = await deliveries_of(orbit, "mgmt-a")
    assert {d.state for d in history} == {"ACKNOWLEDGED", "EXHAUSTED"}
    detail = await orbit.get_delivery("mgmt-a", second.delivery.id)
    assert [a.outcome for a in detail.attempts] == ["FAILED", "FAILED"]
    assert detail.last_error is not None
    assert detail.last_error["body"] == "still refused"
    assert detail.snapshot["result"] == second.delivery.snapshot["result"]
    with pytest.raises(Conflict) as not_exhausted:
        await orbit.add_delivery_budget("mgmt-a", first.delivery.id, 1, "test")
    assert not_exhausted.value.code == "delivery_not_exhausted"
    more = await orbit.add_delivery_budget("mgmt-a", second.delivery.id, 2, "fixed it")
    assert (more.state, more.max_attempts, more.attempts_used) == ("PENDING", 4, 2)
    with pytest.raises(NotFound) as gone:
        await orbit.get_delivery("mgmt-a", "0" * 32)
    assert gone.value.code == "delivery_not_found"

    disabled = await orbit.disable_subscription("mgmt-b", "not needed")
    assert disabled.state == "DISABLED"
    assert disabled.disabled_at is not None
    with pytest.raises(Conflict) as is_disabled:
        await orbit.pause_subscription("mgmt-b")
    assert is_disabled.value.code == "subscription_disabled"


async def test_every_result_once_with_bounded_concurrency(stack: Stack, orbit: Client
                                                          ) -> None:
    await orbit.create_queue("ws")
    await orbit.create_subscription("ws-all", filters={"queues": ["ws"]})
    async with producing(stack, ["ws"]):
        ids = stack.submit("ws", "echo", [{"i": i} for i in range(15)])
        ids += stack.submit("ws", "boom", [{}])
        await until(lambda: all_in(orbit, "ws-all", "PENDING", 16), timeout=60,
                    message="every task's result delivered (pending)")
    # Sixteen deliveries due at once: only the credit keeps the consumer at three.
    # Some handlers are slow, so finished ones free slots while others still run.
    consumer = Consumer(stack, "ws-all", concurrency=3,
                        work_s=lambda d: 0.3 if d.sequence % 4 == 0 else 0.02)
    try:
        await until(lambda: consumer.tasks_seen() == set(ids), timeout=60,
                    message="every task's result")
        assert consumer.subscriber.channel_kind == "websocket"
        await until(lambda: all_in(orbit, "ws-all", "ACKNOWLEDGED", 16), timeout=30,
                    message="every delivery acknowledged")
    finally:
        await consumer.stop()
    per_delivery = collections.Counter(d.id for d in consumer.seen)
    assert len(per_delivery) == 16
    assert set(per_delivery.values()) == {1}
    assert {d.attempt for d in consumer.seen} == {1}
    assert consumer.peak == 3
    states = {d.task_id: d.state for d in consumer.seen}
    assert sorted(states.values()).count("FAILED") == 1
    assert consumer.subscriber.acknowledged == 16


async def test_credit_is_granted_in_steps_of_a_quarter_of_the_slots(
        stack: Stack, orbit: Client) -> None:
    await orbit.create_queue("steps")
    await orbit.create_subscription("steps-all", filters={"queues": ["steps"]})
    async with producing(stack, ["steps"]):
        ids = stack.submit("steps", "echo", [{"i": i} for i in range(24)])
        await until(lambda: all_in(orbit, "steps-all", "PENDING", 24), timeout=60,
                    message="every task's result delivered (pending)")
    # Handlers end one at a time (staggered durations): without steps each would free one
    # slot and grant one credit.
    consumer = Consumer(stack, "steps-all", concurrency=8,
                        work_s=lambda d: 0.01 + 0.013 * (d.sequence % 8))
    try:
        await until(lambda: consumer.tasks_seen() == set(ids), timeout=60,
                    message="every task's result")
        await until(lambda: all_in(orbit, "steps-all", "ACKNOWLEDGED", 24), timeout=30,
                    message="every delivery acknowledged")
    finally:
        await consumer.stop()
    subscriber = consumer.subscriber
    assert subscriber.largest_grant == 8  # the first grant: every slot free
    assert subscriber.smallest_grant is not None
    assert subscriber.smallest_grant >= 2  # a quarter of eight slots
    assert subscriber.credit_frames < 24  # fewer frames than deliveries: steps, not one by one
    assert consumer.peak <= 8


async def test_failures_are_redelivered_then_exhausted_and_budget_brings_them_back(
        stack: Stack, orbit: Client) -> None:
    await orbit.create_queue("flaky")
    await orbit.create_subscription("flaky-sub", filters={"queues": ["flaky"]},
                                    max_attempts=2, backoff_initial_ms=0)
    healed = False

    def fail_when(d: ResultDelivery) -> bool:
        kind = d.snapshot["result"]["kind"]
        return (kind == "poison" and not healed) or (kind == "flaky" and d.attempt == 1)

    consumer = Consumer(stack, "flaky-sub", concurrency=2, fail_when=fail_when)
    try:
        async with producing(stack, ["flaky"]):
            flaky, poison = stack.submit("flaky", "echo", [{"kind": "flaky"},
                                                           {"kind": "poison"}])
            await until(lambda: all_in(orbit, "flaky-sub", "EXHAUSTED", 1), timeout=30,
                        message="the poison delivery exhausted")
            await until(lambda: all_in(orbit, "flaky-sub", "ACKNOWLEDGED", 1), timeout=30,
                        message="the flaky delivery acknowledged")
            attempts = {(d.task_id, d.attempt) for d in consumer.seen}
            assert attempts == {(flaky, 1), (flaky, 2), (poison, 1), (poison, 2)}
            (exhausted,) = await deliveries_of(orbit, "flaky-sub", "EXHAUSTED")
            assert exhausted.task_id == poison
            assert exhausted.last_error is not None
            assert exhausted.last_error["body"] == f"ValueError: cannot handle {poison} yet"
            healed = True
            await orbit.add_delivery_budget("flaky-sub", exhausted.id, 1, "handler fixed")
            await until(lambda: all_in(orbit, "flaky-sub", "ACKNOWLEDGED", 2), timeout=30,
                        message="the poison delivery acknowledged after more budget")
    finally:
        await consumer.stop()
    assert (poison, 3) in {(d.task_id, d.attempt) for d in consumer.seen}
    assert consumer.subscriber.failed == 3
    assert consumer.subscriber.acknowledged == 2


async def test_graceful_drain_settles_held_deliveries_and_leaves_no_lease(
        stack: Stack, orbit: Client) -> None:
    await orbit.create_queue("drain")
    await orbit.create_subscription("drain-sub", filters={"queues": ["drain"]},
                                    backoff_initial_ms=0, lease_ms=600_000)
    gate = asyncio.Event()
    consumer = Consumer(stack, "drain-sub", concurrency=2, gate=gate, drain_timeout=20)
    async with producing(stack, ["drain"]):
        stack.submit("drain", "echo", [{"i": i} for i in range(5)])

        async def two_held_three_waiting() -> bool:
            states = collections.Counter(d.state for d in await deliveries_of(orbit,
                                                                             "drain-sub"))
            return states == {"LEASED": 2, "PENDING": 3} and consumer.running == 2

        await until(two_held_three_waiting, timeout=30,
                    message="two held and three waiting deliveries")
    consumer.subscriber.stop()  # drain: no more credit; the two held ones finish
    gate.set()
    await asyncio.wait_for(consumer.task, 30)
    assert await deliveries_of(orbit, "drain-sub", "LEASED") == []
    assert len(await deliveries_of(orbit, "drain-sub", "ACKNOWLEDGED")) == 2
    assert len(await deliveries_of(orbit, "drain-sub", "PENDING")) == 3
    assert len(consumer.seen) == 2

    # A handler that outlives the drain time is cancelled and its delivery reported failed.
    stuck = Consumer(stack, "drain-sub", concurrency=1, gate=asyncio.Event(),
                     drain_timeout=0.3)
    await until(lambda: stuck.running == 1, timeout=30, message="a stuck handler")
    await stuck.stop()
    assert await deliveries_of(orbit, "drain-sub", "LEASED") == []
    (cut,) = [d for d in await deliveries_of(orbit, "drain-sub") if d.attempts_used == 1
              and d.last_error is not None]
    assert cut.state == "PENDING"
    assert cut.last_error is not None
    assert "stopped before the handler finished" in cut.last_error["body"]


@pytest.fixture
def proxied() -> list[tuple[str, bytes]]:
    """(path, body) of every request no_upgrade_proxy forwarded."""
    return []


@pytest.fixture
async def no_upgrade_proxy(stack: Stack, proxied: list[tuple[str, bytes]]
                           ) -> AsyncIterator[str]:
    """An HTTP proxy in front of the API that refuses WebSocket upgrades (400), as some
    corporate proxies do, and forwards everything else."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return web.Response(status=400, text="upgrades are not allowed here")
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in {"authorization", "content-type", "idempotency-key"}}
        body = await request.read()
        proxied.append((request.path, body))
        async with session.request(request.method, stack.api.url + request.path_qs,
                                   headers=headers, data=body) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
        await session.close()


@pytest.mark.parametrize("how", ["refused-upgrade", "flag"])
async def test_http_long_poll_fallback_consumes_too(stack: Stack, orbit: Client,
                                                    no_upgrade_proxy: str, how: str) -> None:
    name = f"poll-{how}"
    await orbit.create_queue(name)
    await orbit.create_subscription(name, filters={"queues": [name]})
    if how == "flag":
        consumer = Consumer(stack, name, concurrency=2, transport="long-poll",
                            poll_wait_ms=500)
    else:
        consumer = Consumer(stack, name, base_url=no_upgrade_proxy, concurrency=2,
                            poll_wait_ms=500)
    try:
        async with producing(stack, [name]):
            ids = stack.submit(name, "echo", [{"i": i} for i in range(6)])
            await until(lambda: consumer.tasks_seen() == set(ids), timeout=60,
                        message="every result over HTTP")
            await until(lambda: all_in(orbit, name, "ACKNOWLEDGED", 6), timeout=30,
                        message="every delivery acknowledged")
        assert consumer.subscriber.channel_kind == "long-poll"
    finally:
        await consumer.stop()
    assert len({d.id for d in consumer.seen}) == len(consumer.seen) == 6
    assert consumer.peak <= 2
    assert consumer.subscriber.connections == 0  # never a WebSocket


async def test_http_settlements_ready_together_share_one_settle_request(
        stack: Stack, orbit: Client, no_upgrade_proxy: str,
        proxied: list[tuple[str, bytes]]) -> None:
    name = "poll-batch"
    await orbit.create_queue(name)
    await orbit.create_subscription(name, filters={"queues": [name]})
    gate = asyncio.Event()
    ids: list[str] = []
    consumer = Consumer(stack, name, base_url=no_upgrade_proxy, concurrency=4,
                        poll_wait_ms=500, gate=gate,
                        fail_when=lambda d: d.task_id == ids[3])
    try:
        async with producing(stack, [name]):
            ids.extend(stack.submit(name, "echo", [{"i": i} for i in range(4)]))
            await until(lambda: len(consumer.seen) == 4, timeout=60,
                        message="four deliveries held")
            gate.set()  # the four handlers end in one instant
            await until(lambda: consumer.subscriber.acknowledged == 3
                        and consumer.subscriber.failed == 1, timeout=30,
                        message="three acknowledged, one failed")
    finally:
        await consumer.stop()
    settles = [json.loads(body)["items"] for path, body in proxied
               if path.endswith("/settle")]
    assert not [path for path, _ in proxied if path.endswith(("/ack", "/fail"))]
    assert len(settles) == 1
    assert sorted(item["outcome"] for item in settles[0]) == ["acknowledged"] * 3 + ["failed"]
    assert await all_in(orbit, name, "ACKNOWLEDGED", 3)


async def test_a_lapsed_lease_is_delivered_again_with_a_higher_attempt(
        stack: Stack, orbit: Client) -> None:
    await orbit.create_queue("lapse")
    await orbit.create_subscription("lapse-sub", filters={"queues": ["lapse"]},
                                    backoff_initial_ms=0)
    async with producing(stack, ["lapse"]) as db:
        (task_id,) = stack.submit("lapse", "echo", [{"x": 1}])
        await until(lambda: all_in(orbit, "lapse-sub", "PENDING", 1), timeout=30,
                    message="a pending delivery")
        (held,) = await orbit.lease_deliveries("lapse-sub", wait_ms=1000)
        await expire_leases(db)  # the holder crashed before acknowledging
        consumer = Consumer(stack, "lapse-sub", concurrency=1)
        try:
            await until(lambda: all_in(orbit, "lapse-sub", "ACKNOWLEDGED", 1), timeout=30,
                        message="the redelivery acknowledged")
        finally:
            await consumer.stop()
    (again,) = consumer.seen
    assert (again.id, again.task_id, again.attempt) == (held.delivery.id, task_id, 2)
    with pytest.raises(Conflict) as lost:
        await orbit.ack_delivery("lapse-sub", held.delivery.id, held.lease_token)
    assert lost.value.code == "delivery_lease_lost"


async def test_a_subscriber_reconnects_after_the_api_restarts(stack: Stack, orbit: Client,
                                                              tmp_path: Path) -> None:
    await orbit.create_queue("restart")
    await orbit.create_subscription("restart-sub", filters={"queues": ["restart"]},
                                    backoff_initial_ms=0)
    consumer = Consumer(stack, "restart-sub", concurrency=4, reconnect_max=0.5)
    try:
        async with producing(stack, ["restart"]):
            before = stack.submit("restart", "echo", [{"i": i} for i in range(4)])
            await until(lambda: all_in(orbit, "restart-sub", "ACKNOWLEDGED", 4), timeout=30,
                        message="the first results acknowledged")
            assert consumer.subscriber.connections == 1
            # kill -9 of the API under the open stream, and a new API on the same port.
            port, key = stack.api.port, new_key_text()
            stack.api.stop()
            stack.api = ApiDaemon(db_url=stack.daemon_url, log=tmp_path / "api-2.log",
                                  port=port, env={"ORBIT_DELIVERY_SECRET_KEY": key})
            stack.api.wait_listening()
            after = stack.submit("restart", "echo", [{"i": i} for i in range(4, 8)])
            await until(lambda: consumer.tasks_seen() == set(before + after), timeout=30,
                        message="the results after the restart")
            await until(lambda: all_in(orbit, "restart-sub", "ACKNOWLEDGED", 8), timeout=30,
                        message="every result acknowledged")
    finally:
        await consumer.stop()
    assert consumer.subscriber.connections >= 2
    assert len({d.id for d in consumer.seen}) == len(consumer.seen) == 8


async def test_a_subscriber_stops_on_a_refusal_it_cannot_retry(stack: Stack,
                                                               orbit: Client) -> None:
    await orbit.create_subscription("refused-hook", "WEBHOOK",
                                    endpoint_url="https://receiver.example.com/refused")
    hook = Subscriber(stack.api.url, stack.api_key, stack.namespace, "refused-hook",
                      lambda d: asyncio.sleep(0))
    with pytest.raises(Conflict) as not_pull:
        await asyncio.wait_for(hook.run(install_signal_handlers=False), 30)
    assert not_pull.value.code == "subscription_not_pull"
    missing = Subscriber(stack.api.url, stack.api_key, stack.namespace, "no-such-sub",
                         lambda d: asyncio.sleep(0))
    with pytest.raises(NotFound) as not_found:
        await asyncio.wait_for(missing.run(install_signal_handlers=False), 30)
    assert not_found.value.code == "subscription_not_found"

    # Disabled while streaming: the server closes the stream (4403) and run() ends with it.
    await orbit.create_subscription("soon-disabled")
    streaming = Consumer(stack, "soon-disabled")
    await until(lambda: streaming.subscriber.channel_kind == "websocket", timeout=30,
                message="an open stream")
    await orbit.disable_subscription("soon-disabled", "retired")
    with pytest.raises(OrbitError) as disabled:
        await asyncio.wait_for(streaming.task, 30)
    assert disabled.value.code == "subscription_disabled"

"""The WebSocket consumer stream of a pull subscription (orbit_api/routes/subscription_stream.py):
credit, delivery frames, ack and fail frames, redelivery after a lapse, refusals."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import prometheus_client
import pytest
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_api.routes import subscription_stream
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.platform import credentials
from orbit_common.platform.audit import Actor
from orbit_common.relay import consumer, deliveries, subscriptions
from orbit_common.relay.model import SubscriptionState
from orbit_common.service.health import ReadinessGate
from tests.conftest import Tenant, api_config, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.support import relay
from tests.support.contract import assert_documented
from tests.support.lease_fixtures import make_queue
from tests.support.servers import ServiceTestServer
from tests.support.waiting import until

QUIET_S = 0.5  # how long a test listens to prove that nothing more arrives


def _stream(tenant: Tenant, sub: str = "sub") -> str:
    return f"/v1/namespaces/{tenant.namespace}/subscriptions/{sub}/stream"


async def _setup(db: Database, tenant: Tenant, count: int, **fields: Any) -> list[bytes]:
    queue = await make_queue(db, tenant, name="q1")
    await relay.subscribe(db, tenant, **fields)
    tasks = await relay.cancelled_results(db, tenant, queue, count)
    await relay.fan_out_all(db, tenant)
    return tasks


async def _frame(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10) -> dict[str, Any]:
    message = await ws.receive(timeout=timeout)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    frame: dict[str, Any] = json.loads(message.data)
    return frame


async def _nothing_more(ws: aiohttp.ClientWebSocketResponse) -> None:
    with pytest.raises(TimeoutError):
        await ws.receive(timeout=QUIET_S)


async def _closed_as_disabled(ws: aiohttp.ClientWebSocketResponse) -> None:
    """The stream's last frame says the subscription is disabled, then it closes (4403)."""
    closed = await _frame(ws)
    assert closed["code"] == "subscription_disabled"
    message = await ws.receive(timeout=10)
    assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert ws.close_code == subscription_stream.CLOSE_FORBIDDEN


async def _set_state(db: Database, tenant: Tenant, target: SubscriptionState) -> None:
    """Pause, resume or disable the tenant's subscription ``sub`` as its own credential."""
    who = await relay.principal_of(db, tenant.api_key)
    await subscriptions.set_state(db, who, namespace=tenant.namespace, name="sub", target=target)


async def _states(db: Database, tenant: Tenant) -> list[str]:
    return [r["state"] for r in await relay.delivery_rows(db, tenant)]


def _documented(frame: dict[str, Any]) -> None:
    """A delivery frame carries what an HTTP lease answers (the LeasedDelivery schema)."""
    body = {k: v for k, v in frame.items() if k != "type"}
    assert_documented("/v1/namespaces/{namespace}/subscriptions/{subscription}/lease", "post",
                      200, {"items": [body]})


async def test_credit_bounds_what_is_pushed_and_frames_settle(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    tasks = await _setup(db, tenant, 5, backoff_initial_ms=0)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 2})
        first, second = await _frame(ws), await _frame(ws)
        await _nothing_more(ws)
        assert (first["type"], second["type"]) == ("delivery", "delivery")
        _documented(first)
        assert [f["delivery"]["task_id"] for f in (first, second)] == [
            t.hex() for t in tasks[:2]]
        assert (await _states(db, tenant)).count("LEASED") == 2

        await ws.send_json({"type": "ack", "id": "a1", "delivery_id": first["delivery"]["id"],
                            "token": first["lease_token"]})
        assert await _frame(ws) == {
            "type": "settled", "id": "a1", "delivery_id": first["delivery"]["id"],
            "settled": True, "state": "ACKNOWLEDGED", "attempts_used": 1, "repeated": False}
        await ws.send_json({"type": "ack", "id": "a2", "delivery_id": second["delivery"]["id"],
                            "token": first["lease_token"]})
        lost = await _frame(ws)
        assert (lost["type"], lost["id"], lost["code"]) == ("error", "a2", "delivery_lease_lost")
        await ws.send_json({"type": "fail", "id": "f1", "delivery_id": second["delivery"]["id"],
                            "token": second["lease_token"], "error": "not now"})
        failed = await _frame(ws)
        assert (failed["type"], failed["state"]) == ("settled", "PENDING")
        # Settling gives no credit back: nothing arrives until the consumer grants more.
        await _nothing_more(ws)

        await ws.send_json({"type": "ready", "credit": 10})
        rest = [await _frame(ws) for _ in range(4)]
        await _nothing_more(ws)
        assert sorted(f["delivery"]["task_id"] for f in rest) == sorted(
            t.hex() for t in tasks[1:])
        again = next(f for f in rest if f["delivery"]["id"] == second["delivery"]["id"])
        assert again["delivery"]["attempt"] == 2


async def test_new_deliveries_are_pushed_while_credit_lasts(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant, name="q1")
    await relay.subscribe(db, tenant)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 1})
        await _nothing_more(ws)
        (task_id,) = await relay.cancelled_results(db, tenant, queue, 1)
        await relay.fan_out_all(db, tenant)
        pushed = await _frame(ws)
        assert pushed["delivery"]["task_id"] == task_id.hex()
        await relay.cancelled_results(db, tenant, queue, 1)
        await relay.fan_out_all(db, tenant)
        await _nothing_more(ws)  # no credit left
        assert (await _states(db, tenant)).count("PENDING") == 1


async def test_a_lapsed_delivery_is_pushed_again_after_a_reconnect(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1, lease_ms=1000, backoff_initial_ms=0)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 1})
        first = await _frame(ws)
    # The connection is gone without an acknowledgement: the lease lapses (the pump's recovery).
    await until(lambda: db.transaction("test.recover", deliveries.recover_lapsed), timeout=10,
                message="the lease lapsed")
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 1})
        again = await _frame(ws)
        assert again["delivery"]["id"] == first["delivery"]["id"]
        assert again["delivery"]["attempt"] == 2
        assert again["lease_token"] != first["lease_token"]


async def test_leases_never_pushed_are_handed_back(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 2)
    who = await relay.principal_of(db, tenant.api_key)
    target = await consumer.locate(db, who, namespace=tenant.namespace, name="sub")
    conn = subscription_stream.Stream(db, who, namespace=tenant.namespace, name="sub",
                                      ws=None, target=target)  # type: ignore[arg-type]
    conn.closing = True  # the socket closed between the lease and the push
    leased = await deliveries.lease_deliveries(db, who, namespace=tenant.namespace, name="sub",
                                               limit=2)
    await conn.push(leased)
    rows = await relay.delivery_rows(db, tenant)
    assert [(r["state"], r["attempts_used"]) for r in rows] == [("PENDING", 0)] * 2


async def test_bad_frames_get_error_frames(api: TestClient[Any, Any], db: Database,
                                           tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        for frame, code, path in [
            ("not json", "malformed_json", None),
            ({"type": "ready", "credit": 0}, "validation_failed", "$.credit"),
            ({"type": "ready", "credit": 1, "x": 1}, "validation_failed", "$.x"),
            ({"type": "ready", "credit": subscription_stream.CREDIT_MAX + 1},
             "validation_failed", "$.credit"),
            ({"type": "ack", "delivery_id": "0" * 32, "token": "t"}, "validation_failed",
             "$.id"),
            ({"type": "ack", "id": "b", "delivery_id": "nope", "token": "t"},
             "validation_failed", "$.delivery_id"),
            ({"type": "ack", "id": "c", "delivery_id": "0" * 32, "token": "t", "error": "x"},
             "validation_failed", "$.error"),
            ({"type": "dance"}, "validation_failed", "$.type"),
        ]:
            if isinstance(frame, str):
                await ws.send_str(frame)
            else:
                await ws.send_json(frame)
            answer = await _frame(ws)
            assert (answer["type"], answer["code"]) == ("error", code), answer
            if path is not None:
                assert [e["path"] for e in answer["errors"]] == [path], answer
        await ws.send_json({"type": "ack", "id": "d", "delivery_id": "0" * 32, "token": "t"})
        missing = await _frame(ws)
        assert (missing["id"], missing["code"]) == ("d", "delivery_not_found")
        assert await _states(db, tenant) == ["PENDING"]  # nothing was leased or changed


async def test_too_many_bad_frames_close_the_stream(api: TestClient[Any, Any], db: Database,
                                                    tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        for _ in range(subscription_stream.MAX_INVALID_FRAMES):
            await ws.send_json({"type": "dance"})
        while (message := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
            pass
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 1008


async def test_a_binary_frame_closes_the_stream(api: TestClient[Any, Any], db: Database,
                                                tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_bytes(b"\x00")
        answer = await _frame(ws)
        assert answer["code"] == "binary_frame_unsupported"
        message = await ws.receive(timeout=10)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 1003


async def test_an_oversized_frame_closes_the_stream(api: TestClient[Any, Any], db: Database,
                                                    tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_str(json.dumps({"type": "ready", "credit": 1,
                                      "pad": "x" * subscription_stream.MAX_FRAME_BYTES}))
        message = await ws.receive(timeout=10)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 1009
    assert await _states(db, tenant) == ["PENDING"]


async def test_the_upgrade_is_refused_like_the_other_routes(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    reader = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["subscriptions.read"],
                                          "queues": ["*"]}])
    other = await make_tenant(db)
    cases = [
        (_stream(tenant), {"Authorization": f"Bearer {reader}"}, 403, "forbidden"),
        (_stream(tenant, "nope"), tenant.auth, 404, "subscription_not_found"),
        (_stream(other), tenant.auth, 404, "namespace_not_found"),
        (_stream(tenant), {}, 401, "unauthenticated"),
        (_stream(tenant) + "?x=1", tenant.auth, 400, "validation_failed"),
    ]
    for url, headers, status, code in cases:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await api.ws_connect(url, headers=headers)
        assert refused.value.status == status, url
        await assert_problem(await api.get(url, headers=headers), status, code)
    await relay.subscribe(db, tenant, "hook", kind="WEBHOOK",
                          endpoint_url="https://hooks.example.com/x")
    await assert_problem(await api.get(_stream(tenant, "hook"), headers=tenant.auth),
                         409, "subscription_not_pull")


async def test_a_revoked_credential_closes_the_stream(api: TestClient[Any, Any], db: Database,
                                                      tenant: Tenant) -> None:
    await _setup(db, tenant, 0)
    key = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["subscriptions.*"],
                                       "queues": ["*"]}])
    async with api.ws_connect(_stream(tenant), headers={"Authorization": f"Bearer {key}"}) as ws:
        await ws.send_json({"type": "ready", "credit": 1})
        await db.transaction("test.revoke", lambda cur: credentials.revoke_credential(
            cur, prefix=key.split("_")[1], actor=Actor.operator("pytest"), reason="leaked"))
        queue = await make_queue(db, tenant, name="q2")
        await relay.cancelled_results(db, tenant, queue, 1)
        await relay.fan_out_all(db, tenant)
        answer = await _frame(ws)
        assert answer["code"] == "invalid_credential"
        message = await ws.receive(timeout=10)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == subscription_stream.CLOSE_CREDENTIAL
    assert await _states(db, tenant) == ["PENDING"]


async def test_a_paused_stream_waits_and_a_disabled_one_closes(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1)

    await _set_state(db, tenant, SubscriptionState.PAUSED)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 5})
        await _nothing_more(ws)  # paused: nothing is leased, the stream stays open
        await _set_state(db, tenant, SubscriptionState.ACTIVE)
        resumed = await _frame(ws)
        assert resumed["type"] == "delivery"
        await _set_state(db, tenant, SubscriptionState.DISABLED)
        await _closed_as_disabled(ws)


async def test_an_idle_stream_polls_a_cheap_read_with_back_off(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 0)
    before = {"poll": _transactions("relay.poll"), "lease": _transactions("relay.lease")}

    def calls() -> dict[str, float]:
        return {name: _transactions(f"relay.{name}") - n for name, n in before.items()}

    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await _nothing_more(ws)  # no credit: not even the cheap read
        assert calls() == {"poll": 0, "lease": 0}
        await ws.send_json({"type": "ready", "credit": 10})
        await _nothing_more(ws)
    # QUIET_S of waiting with nothing pending: 50, 100, 200, 400 ms between reads, no lease.
    assert calls()["lease"] == 0
    assert 1 <= calls()["poll"] <= 6


async def test_a_draining_api_closes_its_streams(api: TestClient[Any, Any], db: Database,
                                                 tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 1})
        assert (await _frame(ws))["type"] == "delivery"
        await subscription_stream.close_streams(api.server.app)
        message = await ws.receive(timeout=10)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == subscription_stream.CLOSE_GOING_AWAY
    await until(lambda: not api.server.app[subscription_stream.STREAMS],
                message="the stream is gone")


async def test_a_full_lease_is_followed_by_the_next_lease_without_the_read(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    """While leases come back full the stream leases again at once; a lease refused because
    the subscription stopped being ACTIVE sends it back to the read, which tells paused (wait)
    from disabled (close)."""
    await _setup(db, tenant, 6)
    before = {"poll": _transactions("relay.poll"), "lease": _transactions("relay.lease")}

    def calls() -> dict[str, float]:
        return {name: _transactions(f"relay.{name}") - n for name, n in before.items()}

    async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 2})
        assert [(await _frame(ws))["type"] for _ in range(2)] == ["delivery"] * 2
        assert calls() == {"poll": 1, "lease": 1}
        await ws.send_json({"type": "ready", "credit": 2})  # the last lease was full
        assert [(await _frame(ws))["type"] for _ in range(2)] == ["delivery"] * 2
        assert calls() == {"poll": 1, "lease": 2}

        await _set_state(db, tenant, SubscriptionState.PAUSED)
        await ws.send_json({"type": "ready", "credit": 2})
        await _nothing_more(ws)  # refused, then the read finds it paused: the stream waits
        assert calls()["lease"] == 3
        assert calls()["poll"] >= 2
        assert (await _states(db, tenant)).count("LEASED") == 4

        await _set_state(db, tenant, SubscriptionState.DISABLED)
        await _closed_as_disabled(ws)


def _transactions(name: str) -> float:
    """How many transactions named ``name`` this process ran so far (the API is served
    in-process, so its transaction metric counts the stream's reads, leases and settles)."""
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_db_transaction_seconds_count", {"transaction": name}) or 0.0


@contextlib.asynccontextmanager
async def _api_with_window(db: Database, db_url: DatabaseUrl,
                           window_ms: int) -> AsyncIterator[TestClient[Any, Any]]:
    """The API served with a wide settle window (so frames sent together surely share one)."""
    app = create_app(api_config(db_url, stream_settle_window_ms=window_ms), db,
                     ReadinessGate(SchemaChecker(db)))
    client = TestClient(ServiceTestServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def test_frames_sent_together_settle_in_one_transaction_each_answered(
        db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    await _setup(db, tenant, 4, backoff_initial_ms=0)
    settles = _transactions("relay.settle")
    async with _api_with_window(db, db_url, 300) as api, \
            api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 4})
        pushed = [await _frame(ws) for _ in range(4)]
        ids = [f["delivery"]["id"] for f in pushed]
        for n, frame in enumerate(pushed):
            token = pushed[0]["lease_token"] if n == 2 else frame["lease_token"]  # n=2: wrong
            kind = "fail" if n == 3 else "ack"
            await ws.send_json({"type": kind, "id": f"r{n}", "delivery_id": ids[n],
                                "token": token})
        answers = {f["id"]: f for f in [await _frame(ws) for _ in range(4)]}
        await _nothing_more(ws)
    assert _transactions("relay.settle") - settles == 1  # the four frames, one transaction
    assert {k: (f["type"], f.get("state") or f.get("code")) for k, f in answers.items()} == {
        "r0": ("settled", "ACKNOWLEDGED"), "r1": ("settled", "ACKNOWLEDGED"),
        "r2": ("error", "delivery_lease_lost"), "r3": ("settled", "PENDING")}
    assert all(answers[f"r{n}"]["delivery_id"] == ids[n] for n in (0, 1, 3))
    rows = {r["id"].hex(): r["state"] for r in await relay.delivery_rows(db, tenant)}
    assert rows == {ids[0]: "ACKNOWLEDGED", ids[1]: "ACKNOWLEDGED", ids[2]: "LEASED",
                    ids[3]: "PENDING"}


async def test_a_second_frame_for_one_delivery_goes_into_the_next_batch(
        db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    await _setup(db, tenant, 2)
    settles = _transactions("relay.settle")
    async with _api_with_window(db, db_url, 300) as api, \
            api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "credit": 2})
        first, second = await _frame(ws), await _frame(ws)
        a, b = first["delivery"]["id"], second["delivery"]["id"]
        for n, frame in enumerate((first, first, second)):
            await ws.send_json({"type": "ack", "id": f"r{n}", "delivery_id":
                                frame["delivery"]["id"], "token": frame["lease_token"]})
        answers = {f["id"]: f for f in [await _frame(ws) for _ in range(3)]}
    # Two transactions: [a], then [a again, b] -- the repeat was settled after the first ack
    # (it answers repeated), b with it.
    assert _transactions("relay.settle") - settles == 2
    assert [answers[f"r{n}"]["repeated"] for n in range(3)] == [False, True, False]
    assert (answers["r0"]["delivery_id"], answers["r2"]["delivery_id"]) == (a, b)


async def test_frames_received_before_a_disconnect_are_settled(
        db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    await _setup(db, tenant, 3)
    settles = _transactions("relay.settle")
    async with _api_with_window(db, db_url, 2000) as api:
        async with api.ws_connect(_stream(tenant), headers=tenant.auth) as ws:
            await ws.send_json({"type": "ready", "credit": 3})
            pushed = [await _frame(ws) for _ in range(3)]
            for n, frame in enumerate(pushed):
                await ws.send_json({"type": "ack", "id": f"r{n}", "delivery_id":
                                    frame["delivery"]["id"], "token": frame["lease_token"]})
            await until(lambda: len(api.server.app[subscription_stream.STREAMS]) == 1
                        and len(next(iter(api.server.app[subscription_stream.STREAMS])).reports)
                        == 3, message="the three frames are queued")
        # The socket closed while the batch waited for its window: it is settled all the same.

        async def settled() -> bool:
            return await _states(db, tenant) == ["ACKNOWLEDGED"] * 3

        await until(settled, message="the three deliveries are acknowledged")
    assert _transactions("relay.settle") - settles == 1

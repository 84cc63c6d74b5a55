"""The dispatcher's worker protocol in-process (real database, real HTTP and WebSocket)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.health import ReadinessGate
from orbit_dispatcher.service import OPS_IN_FLIGHT, DispatcherService
from tests.conftest import Tenant, api_config
from tests.support.database import connect_sync
from tests.support.lease_fixtures import add_tasks, make_queue, scalar, task_row
from tests.support.servers import ServiceTestServer
from tests.support.waiting import statements_waiting, until
from tests.support.worker_calls import next_frame


@pytest.fixture
async def dispatcher(db: Database, db_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    gate = ReadinessGate(SchemaChecker(db))
    await gate.refresh()
    service = DispatcherService(api_config(db_url), db, gate)
    client = TestClient(ServiceTestServer(service.app))
    await client.start_server()
    try:
        yield client
    finally:
        service.draining = True
        await client.close()


def base(tenant: Tenant) -> str:
    return f"/v1/namespaces/{tenant.namespace}/worker/sessions"


async def register(client: TestClient[Any, Any], tenant: Tenant, queue: str,
                   handlers: list[str] | None = None) -> str:
    response = await client.post(base(tenant), headers=tenant.auth, json={
        "instance_key": "w-1", "queues": [queue], "handlers": handlers or ["noop"],
        "max_in_flight": 8})
    assert response.status == 201, await response.text()
    return str((await response.json())["session_id"])



async def test_websocket_session_runs_a_task_end_to_end(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, input_json='{"n": 1}')
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "slots": 4})
        grants = (await next_frame(ws, "grants"))["grants"]
        assert [g["task_id"] for g in grants] == [task_id.hex()]
        grant = grants[0]
        assert grant["input"] == {"n": 1}
        assert grant["generation"] == 1
        ref = {k: grant[k] for k in ("attempt_id", "token", "generation")}
        await ws.send_json({"type": "start", "id": "s1", "items": [ref]})
        reply = await next_frame(ws, "reply")
        assert reply["id"] == "s1"
        assert reply["items"][0]["approved"] is True
        await ws.send_json({"type": "renew", "id": "r1", "items": [ref]})
        assert (await next_frame(ws, "reply"))["items"][0]["renewed"] is True
        await ws.send_json({"type": "finish", "id": "f1", "items": [
            {**ref, "report_id": "rep-1", "outcome": "succeeded", "result": {"ok": True}}]})
        reply = await next_frame(ws, "reply")
        assert reply["items"][0]["accepted"] is True
        assert reply["items"][0]["task_state"] == "SUCCEEDED"
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "SUCCEEDED"
    assert json.loads(row["result"]) == {"ok": True}


async def test_a_slow_request_does_not_hold_up_the_next_one_on_the_same_socket(
    dispatcher: TestClient[Any, Any], db: Database, db_url: DatabaseUrl, tenant: Tenant
) -> None:
    """Frames of one WebSocket run concurrently (answers matched by id): a finish waiting for a
    row lock does not delay a renew sent after it."""
    queue = await make_queue(db, tenant)
    first, second = await add_tasks(db, tenant, queue, 2)
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "slots": 2})
        grants: dict[str, dict[str, Any]] = {}
        while len(grants) < 2:
            grants.update({g["task_id"]: g for g in (await next_frame(ws, "grants"))["grants"]})
        refs = {task: {k: g[k] for k in ("attempt_id", "token", "generation")}
                for task, g in grants.items()}
        await ws.send_json({"type": "start", "id": "s", "items": list(refs.values())})
        assert all(i["approved"] for i in (await next_frame(ws, "reply"))["items"])
        blocker = connect_sync(db_url, autocommit=False)
        try:
            with blocker.cursor() as cur:  # hold the first task's row lock
                cur.execute("SELECT id FROM pulse_tasks WHERE namespace_id = %s AND id = %s"
                            " FOR UPDATE", (tenant.namespace_id, first))
            await ws.send_json({"type": "finish", "id": "slow", "items": [
                {**refs[first.hex()], "report_id": "rep-1", "outcome": "succeeded",
                 "result": None}]})
            await ws.send_json({"type": "renew", "id": "quick", "items": [refs[second.hex()]]})
            reply = await next_frame(ws, "reply")
            assert reply["id"] == "quick"  # answered while the finish still waits
            assert reply["items"][0]["renewed"] is True
            assert (await task_row(db, tenant, first))["state"] == "RUNNING"
        finally:
            blocker.rollback()
            blocker.close()
        reply = await next_frame(ws, "reply")
        assert reply["id"] == "slow"
        assert reply["items"][0]["accepted"] is True
    assert (await task_row(db, tenant, first))["state"] == "SUCCEEDED"


async def test_a_renewal_never_waits_behind_finishes_stuck_on_a_counter_row(
    dispatcher: TestClient[Any, Any], db: Database, db_url: DatabaseUrl, tenant: Tenant
) -> None:
    """A frozen process holding the queue's counter row blocks finishes (they update it); the
    socket's whole frame budget may be finishes waiting there, and a renewal sent after them is
    still answered at once: renewals have their own budget and their own connection lane, and
    touch no counter row (docs/runbooks/liveness.md)."""
    queue = await make_queue(db, tenant)
    tasks = await add_tasks(db, tenant, queue, OPS_IN_FLIGHT + 1)
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "slots": len(tasks)})
        grants: dict[str, dict[str, Any]] = {}
        while len(grants) < len(tasks):
            grants.update({g["task_id"]: g for g in (await next_frame(ws, "grants"))["grants"]})
        refs = [{k: grants[t.hex()][k] for k in ("attempt_id", "token", "generation")}
                for t in tasks]
        await ws.send_json({"type": "start", "id": "s", "items": refs})
        assert all(i["approved"] for i in (await next_frame(ws, "reply"))["items"])
        blocker = connect_sync(db_url, autocommit=False)
        try:
            with blocker.cursor() as cur:  # the frozen holder of the queue's counter row
                cur.execute("SELECT id FROM pulse_queues WHERE namespace_id = %s AND id = %s"
                            " FOR UPDATE", (tenant.namespace_id, queue.id))
            for n, ref in enumerate(refs[:OPS_IN_FLIGHT]):
                await ws.send_json({"type": "finish", "id": f"finish-{n}", "items": [
                    {**ref, "report_id": f"rep-{n}", "outcome": "succeeded", "result": None}]})
            await until(lambda: statements_waiting(blocker, "%UPDATE pulse_queues%")
                        == OPS_IN_FLIGHT, message="every finish waiting on the counter row")
            await ws.send_json({"type": "renew", "id": "renew", "items": [refs[-1]]})
            reply = await next_frame(ws, "reply")
            assert reply["id"] == "renew"  # answered while all the finishes still wait
            assert reply["items"][0]["renewed"] is True
        finally:
            blocker.rollback()
            blocker.close()
        answered = {(await next_frame(ws, "reply"))["id"] for _ in range(OPS_IN_FLIGHT)}
        assert answered == {f"finish-{n}" for n in range(OPS_IN_FLIGHT)}


async def test_the_grant_carries_the_input_byte_exact(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    raw = '{"n": 12345678901234567890.123456789, "e": 1E+5}'
    await add_tasks(db, tenant, queue, input_json=raw)
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "slots": 1})
        async with asyncio.timeout(10):
            message = await ws.receive()
    assert raw in message.data


async def test_malformed_frames_get_error_frames_and_change_nothing(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        for frame in ["not json", '{"type": "explode"}', '{"type": "ready", "slots": -1}',
                      '{"type": "start", "id": "x", "items": [{"attempt_id": "zz"}]}',
                      '{"type": "finish", "id": "y", "items": []}',
                      '{"a": 1, "a": 2}']:
            await ws.send_str(frame)
            error = await next_frame(ws, "error")
            assert error["code"] in {"malformed_json", "validation_failed", "duplicate_json_key"}
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempts WHERE namespace_id = %s",
                        tenant.namespace_id) == 0


async def test_a_request_frame_without_id_is_refused_and_does_nothing(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    [task_id] = await add_tasks(db, tenant, queue, 1)
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        await ws.send_json({"type": "ready", "slots": 1})  # ready has no reply: id optional
        grant = (await next_frame(ws, "grants"))["grants"][0]
        ref = {k: grant[k] for k in ("attempt_id", "token", "generation")}
        for frame in [{"type": "start", "items": [ref]}, {"type": "start", "id": None,
                                                          "items": [ref]}]:
            await ws.send_json(frame)
            error = await next_frame(ws, "error")
            assert error["id"] is None
            assert error["code"] == "validation_failed"
            assert error["errors"][0]["path"] == "$.id"
        # Nothing was started: the attempt is still only offered, and a start with an id works.
        assert (await task_row(db, tenant, task_id))["state"] == "LEASED"
        assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempts WHERE namespace_id = %s"
                            " AND state = 'RUNNING'", tenant.namespace_id) == 0
        await ws.send_json({"type": "start", "id": "s-1", "items": [ref]})
        reply = await next_frame(ws, "reply")
        assert reply["id"] == "s-1"
        assert reply["items"][0]["approved"] is True


async def test_a_binary_frame_gets_an_error_and_the_socket_closes_1003(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    session_id = await register(dispatcher, tenant, queue.name)
    async with dispatcher.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
        await ws.send_bytes(b'{"type": "ready", "id": "r", "slots": 1}')
        error = await next_frame(ws, "error")
        assert error["code"] == "binary_frame_unsupported"
        async with asyncio.timeout(10):
            closing = await ws.receive()
        assert closing.type in {aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED}
        assert ws.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA


async def test_long_poll_fallback(dispatcher: TestClient[Any, Any], db: Database,
                                  tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session_id = await register(dispatcher, tenant, queue.name)
    url = f"{base(tenant)}/{session_id}"
    response = await dispatcher.post(f"{url}/poll", headers=tenant.auth,
                                     json={"max": 4, "wait_ms": 2000})
    assert response.status == 200
    grants = (await response.json())["grants"]
    assert [g["task_id"] for g in grants] == [task_id.hex()]
    ref = {k: grants[0][k] for k in ("attempt_id", "token", "generation")}
    started = await (await dispatcher.post(f"{url}/start", headers=tenant.auth,
                                           json={"items": [ref]})).json()
    assert started["items"][0]["approved"]
    finished = await (await dispatcher.post(f"{url}/finish", headers=tenant.auth, json={
        "items": [{**ref, "report_id": "a", "outcome": "failed", "retryable": False,
                   "error": {"type": "Boom"}}]})).json()
    assert finished["items"][0]["task_state"] == "FAILED"
    empty = await (await dispatcher.post(f"{url}/poll", headers=tenant.auth,
                                         json={"max": 1, "wait_ms": 50})).json()
    assert empty == {"grants": [], "cancel": []}


async def test_another_tenant_cannot_use_a_session(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    from tests.conftest import make_tenant

    other = await make_tenant(db)
    queue = await make_queue(db, tenant)
    session_id = await register(dispatcher, tenant, queue.name)
    response = await dispatcher.post(
        f"/v1/namespaces/{other.namespace}/worker/sessions/{session_id}/poll",
        headers=other.auth, json={"max": 1})
    assert response.status == 404
    assert (await response.json())["code"] == "session_not_found"
    response = await dispatcher.post(
        f"/v1/namespaces/{tenant.namespace}/worker/sessions/{session_id}/poll",
        headers=other.auth, json={"max": 1})
    assert response.status == 404


async def test_registration_validates_input(dispatcher: TestClient[Any, Any], db: Database,
                                            tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    cases = [
        {"instance_key": "w", "queues": [queue.name]},
        {"instance_key": "w", "queues": [], "handlers": ["x"]},
        {"instance_key": "w", "queues": [queue.name], "handlers": ["bad name"]},
        {"instance_key": "w", "queues": [queue.name], "handlers": ["x"], "extra": 1},
        {"instance_key": "w", "queues": ["no-such-queue"], "handlers": ["x"]},
    ]
    for body in cases:
        response = await dispatcher.post(base(tenant), headers=tenant.auth, json=body)
        assert response.status in {400, 404}, body
        assert response.content_type == "application/problem+json"
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_worker_sessions"
                            " WHERE namespace_id = %s", tenant.namespace_id) == 0


@pytest.mark.parametrize(
    ("op", "body"),
    [
        ("start", {}),
        ("start", {"items": []}),
        ("start", {"items": [{"attempt_id": "x" * 32, "token": "t", "generation": 1}]}),
        ("start", {"items": [{"attempt_id": "0" * 32, "token": "", "generation": 1}]}),
        ("renew", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 0}]}),
        ("renew", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": True}]}),
        ("renew", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1, "x": 1}]}),
        ("finish", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1,
                               "report_id": "r", "outcome": "exploded"}]}),
        ("finish", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1,
                               "report_id": "", "outcome": "succeeded"}]}),
        ("finish", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1,
                               "report_id": "r", "outcome": "succeeded", "retryable": True}]}),
        ("finish", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1,
                               "report_id": "r", "outcome": "failed", "error": "text"}]}),
        ("finish", {"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1,
                               "report_id": "r", "outcome": "failed", "result": 1}]}),
        ("poll", {"max": 0}),
        ("poll", {"max": 1, "wait_ms": 999_999}),
        ("poll", {"max": 1, "other": 2}),
    ],
)
async def test_bad_worker_calls_are_problems_and_change_nothing(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant, op: str,
    body: dict[str, Any],
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session_id = await register(dispatcher, tenant, queue.name)
    response = await dispatcher.post(f"{base(tenant)}/{session_id}/{op}", headers=tenant.auth,
                                     json=body)
    assert response.status == 400
    assert response.content_type == "application/problem+json"
    assert (await response.json())["code"] == "validation_failed"
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["revision"]) == ("WAITING", 1)
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempts WHERE namespace_id = %s",
                        tenant.namespace_id) == 0


async def test_stale_tokens_and_generations_over_http_change_nothing(
    dispatcher: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session_id = await register(dispatcher, tenant, queue.name)
    url = f"{base(tenant)}/{session_id}"
    grants = (await (await dispatcher.post(f"{url}/poll", headers=tenant.auth,
                                           json={"max": 1, "wait_ms": 2000})).json())["grants"]
    good = {k: grants[0][k] for k in ("attempt_id", "token", "generation")}
    for forged in ({**good, "token": "forged-token"}, {**good, "generation": 2}):
        for op, extra in (("start", {}), ("renew", {}),
                          ("finish", {"report_id": "r", "outcome": "succeeded", "result": 1})):
            answer = await (await dispatcher.post(f"{url}/{op}", headers=tenant.auth,
                                                  json={"items": [{**forged, **extra}]})).json()
            item = answer["items"][0]
            assert item.get("approved", item.get("renewed", item.get("accepted"))) is False
            assert item["reason"] == "invalid_attempt"
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["revision"]) == ("LEASED", 2)
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempt_receipts"
                            " WHERE namespace_id = %s", tenant.namespace_id) == 0

"""The worker gateway's limits (docs/api/worker.md §7): message size, result size, parsing cost,
floods; and the dispatcher keeps answering everyone while one client sends its worst."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.config import MAX_RESULT_BYTES, DispatcherConfig
from orbit_common.service.health import ReadinessGate
from orbit_dispatcher.service import DispatcherService
from tests.conftest import Tenant, api_config
from tests.support.exhaustion import probed
from tests.support.lease_fixtures import make_queue, scalar, task_row
from tests.support.servers import ServiceTestServer
from tests.support.worker_calls import (
    MIB,
    base,
    next_frame,
    register,
    running_attempt,
    text_result,
    worst_frames,
)

# Waiting for the answer to a 1 MiB message: a second of CPU or so, which two cores shared with
# other test runs can stretch far past the usual 10 s.
LARGE_S = 60
Dispatcher = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def start_dispatcher(db: Database,
                           db_url: DatabaseUrl) -> AsyncIterator[Dispatcher]:
    """Start the dispatcher in-process with ``[dispatcher]`` settings of the test's choosing."""
    running: list[tuple[DispatcherService, TestClient[Any, Any]]] = []

    async def start(**settings: Any) -> TestClient[Any, Any]:
        gate = ReadinessGate(SchemaChecker(db))
        await gate.refresh()
        config = api_config(db_url)
        config = type(config)(database=config.database, api=config.api,
                              dispatcher=DispatcherConfig(**settings))
        service = DispatcherService(config, db, gate)
        client = TestClient(ServiceTestServer(service.app))
        await client.start_server()
        running.append((service, client))
        return client

    yield start
    for service, client in running:
        service.draining = True
        await client.close()


async def closed_with(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """Read until the socket closes; its close code."""
    async with asyncio.timeout(10):
        while True:
            message = await ws.receive()
            if message.type in {aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.CLOSING}:
                return ws.close_code


# --- message size --------------------------------------------------------------------------


async def test_a_frame_over_max_message_bytes_closes_1009_and_one_at_it_is_read(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    client = await start_dispatcher()
    queue = await make_queue(db, tenant)
    session_id = await register(client, tenant, queue.name)
    url = f"{base(tenant)}/{session_id}/ws"
    at_limit = '{"type": "ready", "id": "r1", "slots": -1}'
    at_limit += " " * (MIB - len(at_limit))
    async with client.ws_connect(url, headers=tenant.auth, max_msg_size=0) as ws:
        await ws.send_str(at_limit)  # read and answered: the connection stays
        error = await next_frame(ws, "error", timeout=LARGE_S)
        assert (error["id"], error["code"]) == ("r1", "validation_failed")
        await ws.send_str(at_limit + " ")
        assert await closed_with(ws) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


async def test_http_bodies_on_the_dispatcher_follow_max_message_bytes(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    client = await start_dispatcher(max_message_bytes=64 * 1024)
    queue = await make_queue(db, tenant)
    session_id = await register(client, tenant, queue.name)
    body = json.dumps({"items": [{"attempt_id": "0" * 32, "token": "t", "generation": 1}]})
    response = await client.post(f"{base(tenant)}/{session_id}/renew", headers={
        **tenant.auth, "Content-Type": "application/json"}, data=body + " " * 64 * 1024)
    assert response.status == 413
    assert (await response.json())["code"] == "payload_too_large"


# --- result size ---------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_result_over_the_limit_is_refused_and_the_lease_goes_on(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant, transport: str
) -> None:
    """A result one byte over max_result_bytes: ``result_too_large``, nothing written, the task
    still RUNNING with its lease; the worker then reports it failed, which is accepted."""
    client = await start_dispatcher()
    url, (task_id,), (ref,) = await running_attempt(client, db, tenant)
    too_large = {**ref, "report_id": "big", "outcome": "succeeded",
                 "result": text_result(MAX_RESULT_BYTES + 1)}
    failed = {**ref, "report_id": "instead", "outcome": "failed", "retryable": False,
              "error": {"type": "ResultTooLarge"}}
    if transport == "websocket":
        async with client.ws_connect(f"{url}/ws", headers=tenant.auth) as ws:
            await ws.send_json({"type": "finish", "id": "f1", "items": [too_large]})
            error = await next_frame(ws, "error", timeout=LARGE_S)
            assert (error["id"], error["code"]) == ("f1", "result_too_large")
            assert error["path"] == "$.items[0].result"
            assert error["max_result_bytes"] == MAX_RESULT_BYTES
            assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"
            await ws.send_json({"type": "finish", "id": "f2", "items": [failed]})
            reply = await next_frame(ws, "reply")
    else:
        response = await client.post(f"{url}/finish", headers=tenant.auth,
                                      json={"items": [too_large]})
        assert response.status == 413
        problem = await response.json()
        assert problem["code"] == "result_too_large"
        assert problem["path"] == "$.items[0].result"
        assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"
        reply = await (await client.post(f"{url}/finish", headers=tenant.auth,
                                         json={"items": [failed]})).json()
    assert reply["items"][0]["accepted"] is True
    assert (await task_row(db, tenant, task_id))["state"] == "FAILED"
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempt_receipts"
                            " WHERE namespace_id = %s AND report_id = 'big'",
                        tenant.namespace_id) == 0


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_result_at_the_limit_is_stored_and_read_back(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant, transport: str
) -> None:
    client = await start_dispatcher()
    url, (task_id,), (ref,) = await running_attempt(client, db, tenant)
    result = text_result(MAX_RESULT_BYTES)
    item = {**ref, "report_id": "at-limit", "outcome": "succeeded", "result": result}
    if transport == "websocket":
        async with client.ws_connect(f"{url}/ws", headers=tenant.auth) as ws:
            await ws.send_json({"type": "finish", "id": "f1", "items": [item]})
            reply = await next_frame(ws, "reply", timeout=LARGE_S)
    else:
        reply = await (await client.post(f"{url}/finish", headers=tenant.auth,
                                         json={"items": [item]})).json()
    assert reply["items"][0]["accepted"] is True, reply
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "SUCCEEDED"
    assert len(row["result"].encode()) == MAX_RESULT_BYTES
    assert json.loads(row["result"]) == result
    snapshot = await scalar(db, "SELECT snapshot AS n FROM orbit_result_events"
                                " WHERE namespace_id = %s AND task_id = %s",
                            tenant.namespace_id, task_id)
    assert json.loads(snapshot)["result"] == result


async def test_the_results_of_one_finish_count_together(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    """Two results that each fit but not together: refused whole (the statement carrying the
    batch stays under max_result_bytes), each alone is accepted."""
    client = await start_dispatcher(max_result_bytes=4096)
    url, task_ids, refs = await running_attempt(client, db, tenant, 2)
    items = [{**ref, "report_id": f"r{i}", "outcome": "succeeded", "result": text_result(3000)}
             for i, ref in enumerate(refs)]
    response = await client.post(f"{url}/finish", headers=tenant.auth, json={"items": items})
    assert response.status == 413
    problem = await response.json()
    assert (problem["code"], problem["path"]) == ("result_too_large", "$.items[1].result")
    for item in items:
        answer = await (await client.post(f"{url}/finish", headers=tenant.auth,
                                          json={"items": [item]})).json()
        assert answer["items"][0]["accepted"] is True
    for task_id in task_ids:
        assert (await task_row(db, tenant, task_id))["state"] == "SUCCEEDED"


# --- parsing cost --------------------------------------------------------------------------


async def test_pathological_frames_are_protocol_errors_and_the_socket_stays(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    """1 MiB of ``[`` (a RecursionError in the parser before), unbalanced or too deep objects,
    and 350,000 arrays (as batch items) are each answered with an error frame, without being
    parsed; the session goes on."""
    client = await start_dispatcher(max_invalid_frames=100)
    queue = await make_queue(db, tenant)
    session_id = await register(client, tenant, queue.name)
    many_items = '{"type": "start", "id": "s", "items": [' + "[]," * 349_000 + "[]]}"
    frames = {
        "[" * MIB: "json_too_complex",
        "[" * 40_000: "malformed_json",
        '{"a":' * 40_000: "malformed_json",
        "[" * 40 + "]" * 40: "json_too_deep",
        many_items: "json_too_complex",
    }
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws", headers=tenant.auth,
                                 max_msg_size=0) as ws:
        for frame, code in frames.items():
            assert len(frame) <= MIB
            await ws.send_str(frame)
            error = await next_frame(ws, "error", timeout=LARGE_S)
            assert error["code"] == code, error
        await ws.send_str('{"type": "finish", "id": "last", "items": []}')
        assert (await next_frame(ws, "error"))["id"] == "last"


# --- floods --------------------------------------------------------------------------------


async def test_a_session_over_max_frames_per_second_is_closed_1008(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    client = await start_dispatcher(max_frames_per_second=20)
    queue = await make_queue(db, tenant)
    session_id = await register(client, tenant, queue.name)
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws", headers=tenant.auth) as ws:
        for _ in range(40):  # well within one second
            await ws.send_json({"type": "ready", "slots": 0})
        error = await next_frame(ws, "error")
        assert (error["id"], error["code"]) == (None, "too_many_frames")
        assert await closed_with(ws) == aiohttp.WSCloseCode.POLICY_VIOLATION


async def test_a_session_that_keeps_sending_invalid_frames_is_closed_1008(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    client = await start_dispatcher(max_invalid_frames=3)
    queue = await make_queue(db, tenant)
    session_id = await register(client, tenant, queue.name)
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws", headers=tenant.auth) as ws:
        for n in range(3):  # up to the limit: answered, the socket stays
            await ws.send_str("not json")
            assert (await next_frame(ws, "error"))["code"] == "malformed_json", n
        await ws.send_json({"type": "ready", "slots": 0})  # valid frames do not count
        await ws.send_str("not json")
        assert (await next_frame(ws, "error"))["code"] == "malformed_json"
        error = await next_frame(ws, "error")
        assert (error["id"], error["code"]) == (None, "too_many_invalid_frames")
        assert await closed_with(ws) == aiohttp.WSCloseCode.POLICY_VIOLATION


# --- the dispatcher keeps answering --------------------------------------------------------


@pytest.mark.alone
async def test_health_probes_are_answered_while_one_client_sends_its_worst(
    start_dispatcher: Dispatcher, db: Database, tenant: Tenant
) -> None:
    """A prober asks ``/healthz`` every 10 ms while one worker sends the largest frames the
    dispatcher accepts, of the content that costs it most: 1 MiB of ``[``, 1 MiB of tiny batch
    items (both refused), and a finish whose result at the limit holds as many arrays as a
    message may (the parser's cost) and exact decimals after them, and is stored. Every probe is
    answered; the slowest is asserted < 1 s here, in-process (the < 100 ms figure of issue 11
    is asserted against a real process by tests/e2e/test_dispatcher_exhaustion.py). Alone, as
    every test that asserts a latency: beside another worker's CPU-heavy tests on the two cores
    the slowest probe took 1.5 s once."""
    client = await start_dispatcher(max_invalid_frames=100)
    url, (task_id,), (ref,) = await running_attempt(client, db, tenant)
    frames, worst_result = worst_frames(ref)
    # The prober is a process of its own; it asks every 10 ms until the frames are done.
    async with (probed(client.host, client.port, minimum=10) as probe,
                client.ws_connect(f"{url}/ws", headers=tenant.auth, max_msg_size=0) as ws):
        for round_ in range(3):
            for frame in frames[:2]:
                await ws.send_str(frame)
                assert (await next_frame(ws, "error"))["code"] in {
                    "malformed_json", "json_too_complex"}, round_
        began = time.perf_counter()
        await ws.send_str(frames[2])
        # About a second of CPU (parsing, re-encoding 200,000 decimals, three 1 MiB
        # statements); the two shared cores may be busy with other work.
        reply = await next_frame(ws, "reply", timeout=LARGE_S)
        finish_s = time.perf_counter() - began
    assert reply["items"][0]["accepted"] is True, reply
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "SUCCEEDED"
    assert len(row["result"]) == len(worst_result)
    assert probe.failures == []  # every probe answered 200
    assert len(probe.latencies) >= 10
    slowest = probe.worst
    print(f"\n/healthz: {len(probe.latencies)} probes, slowest {slowest * 1000:.1f} ms, "
          f"median {sorted(probe.latencies)[len(probe.latencies) // 2] * 1000:.1f} ms; "
          f"the worst finish answered in {finish_s * 1000:.0f} ms")
    assert slowest < 1.0

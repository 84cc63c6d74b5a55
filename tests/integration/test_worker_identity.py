"""Worker identity is bound to its credential (issue 11 §4, §6), through the real dispatcher.

§4: a worker instance belongs to the credential that registered it; another credential of the
same application cannot register it (and so cannot fence its sessions); a revoked owner hands it
over. §6: a revoked credential or a disabled application reaches an open WebSocket: its start,
renew and finish are refused in their transaction, the socket is closed (4401) -- at once after
such a frame, and within ``credential_check_s`` when the worker sends nothing -- and its leases
take the lost-session path (expiry, recovery), never a result from the revoked key.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.platform import applications, credentials
from orbit_common.platform.audit import Actor
from orbit_common.pulse import leases
from orbit_common.service.config import DatabaseConfig, DispatcherConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_dispatcher.service import CREDENTIAL_CLOSE_CODE, DispatcherService
from tests.conftest import Tenant, make_key
from tests.support.lease_fixtures import add_tasks, make_queue, scalar, task_row
from tests.support.servers import ServiceTestServer
from tests.support.waiting import until
from tests.support.worker_calls import next_frame

Client = TestClient[Any, Any]
Ref = dict[str, Any]


async def granted(ws: aiohttp.ClientWebSocketResponse, *, start: bool = True) -> dict[str, Any]:
    """Ask for one task on the socket and take its grant (and, with ``start``, have its start
    approved); the attempt reference."""
    await ws.send_json({"type": "ready", "slots": 1})
    grant = (await next_frame(ws, "grants"))["grants"][0]
    ref = {k: grant[k] for k in ("attempt_id", "token", "generation")}
    if start:
        await ws.send_json({"type": "start", "id": "s1", "items": [ref]})
        assert (await next_frame(ws, "reply"))["items"][0]["approved"] is True
    return ref


@pytest.fixture
async def start_dispatcher(
    db: Database, db_url: DatabaseUrl
) -> AsyncIterator[Callable[[float], Awaitable[Client]]]:
    """Start dispatchers in-process with a given ``credential_check_s``."""
    started: list[tuple[DispatcherService, Client]] = []

    async def start(credential_check_s: float) -> Client:
        gate = ReadinessGate(SchemaChecker(db))
        await gate.refresh()
        config = OrbitConfig(
            database=DatabaseConfig(url=db_url.render(hide_password=False)),
            dispatcher=DispatcherConfig(credential_check_s=credential_check_s))
        service = DispatcherService(config, db, gate)
        client = TestClient(ServiceTestServer(service.app))
        await client.start_server()
        started.append((service, client))
        return client

    yield start
    for service, client in started:
        service.draining = True
        await client.close()


def base(tenant: Tenant) -> str:
    return f"/v1/namespaces/{tenant.namespace}/worker/sessions"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def all_queues(tenant: Tenant) -> list[dict[str, Any]]:
    return [{"namespaces": [tenant.namespace], "actions": ["workers.work"], "queues": ["*"]}]


async def register(client: Client, tenant: Tenant, key: str, queue: str,
                   instance_key: str) -> aiohttp.ClientResponse:
    return await client.post(base(tenant), headers=bearer(key), json={
        "instance_key": instance_key, "queues": [queue], "handlers": ["noop"],
        "max_in_flight": 8})


async def registered(client: Client, tenant: Tenant, key: str, queue: str,
                     instance_key: str) -> str:
    response = await register(client, tenant, key, queue, instance_key)
    assert response.status == 201, await response.text()
    return str((await response.json())["session_id"])


async def started_grant(client: Client, tenant: Tenant, key: str, session_id: str) -> Ref:
    """Claim one task over the long poll and start it; its attempt ref."""
    url = f"{base(tenant)}/{session_id}"
    polled = await (await client.post(f"{url}/poll", headers=bearer(key),
                                      json={"max": 1, "wait_ms": 5000})).json()
    assert len(polled["grants"]) == 1, polled
    ref = {k: polled["grants"][0][k] for k in ("attempt_id", "token", "generation")}
    started = await (await client.post(f"{url}/start", headers=bearer(key),
                                       json={"items": [ref]})).json()
    assert started["items"][0]["approved"], started
    return ref




async def closed(ws: aiohttp.ClientWebSocketResponse, within: float) -> list[dict[str, Any]]:
    """The frames the dispatcher sends until it closes the socket (which must happen within
    ``within`` seconds); the close code is then ``ws.close_code``."""
    frames = []
    async with asyncio.timeout(within):
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                frames.append(json.loads(message.data))
                continue
            assert message.type in {aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED}, message
            return frames


async def revoke(db: Database, key: str) -> None:
    prefix = key.split("_")[1]
    await db.transaction("test.revoke", lambda cur: credentials.revoke_credential(
        cur, prefix=prefix, actor=Actor.operator("pytest"), reason="leaked"))


async def disable(db: Database, tenant: Tenant) -> None:
    await db.transaction("test.disable", lambda cur: applications.disable_application(
        cur, name=tenant.application, actor=Actor.operator("pytest"), reason="offboarded"))


async def instance_row(db: Database, tenant: Tenant, instance_key: str) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM pulse_worker_instances WHERE namespace_id = %s"
                          " AND instance_key = %s", (tenant.namespace_id, instance_key.encode()))
        return dict(await cur.fetchone())

    return await db.read("test.instance", body)


async def session_state(db: Database, tenant: Tenant, session_id: str) -> str:
    return str(await scalar(db, "SELECT state FROM pulse_worker_sessions WHERE namespace_id = %s"
                                " AND id = %s", tenant.namespace_id, bytes.fromhex(session_id)))


async def session_closed(db: Database, tenant: Tenant, session_id: str) -> bool:
    return await session_state(db, tenant, session_id) == "CLOSED"


async def rows_of(db: Database, table: str, tenant: Tenant) -> int:
    assert table in {"pulse_attempt_receipts", "pulse_attempt_evidence"}  # fixed whitelist
    return int(await scalar(db, f"SELECT COUNT(*) AS n FROM {table}"
                                " WHERE namespace_id = %s", tenant.namespace_id))


# --- §4: an instance belongs to its credential -------------------------------------------------


async def test_another_credential_cannot_register_an_instance_and_fence_its_session(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """A key scoped to one queue of the same application registers the victim's instance_key:
    409 instance_owned_elsewhere, and nothing changes -- the victim's session stays ACTIVE,
    its socket keeps receiving work."""
    client = await start_dispatcher(60.0)
    victim_queue = await make_queue(db, tenant)
    attacker_queue = await make_queue(db, tenant)
    victim_key = await make_key(db, tenant, all_queues(tenant))
    attacker_key = await make_key(db, tenant, [{
        "namespaces": [tenant.namespace], "actions": ["workers.work"],
        "queues": [attacker_queue.name]}])
    session_id = await registered(client, tenant, victim_key, victim_queue.name, "w-victim")
    before = await instance_row(db, tenant, "w-victim")
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                 headers=bearer(victim_key)) as ws:
        response = await register(client, tenant, attacker_key, attacker_queue.name, "w-victim")
        assert response.status == 409
        problem = await response.json()
        assert problem["code"] == "instance_owned_elsewhere"
        assert await instance_row(db, tenant, "w-victim") == before
        assert await session_state(db, tenant, session_id) == "ACTIVE"
        assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_worker_sessions"
                                " WHERE namespace_id = %s", tenant.namespace_id) == 1
        (task_id,) = await add_tasks(db, tenant, victim_queue)
        await ws.send_json({"type": "ready", "slots": 1})
        grants = (await next_frame(ws, "grants"))["grants"]
        assert [g["task_id"] for g in grants] == [task_id.hex()]


async def test_the_owner_re_registering_fences_its_old_session(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """Adoption stays the owner's: a new session of the same credential fences the old one and
    takes over its running attempt."""
    client = await start_dispatcher(60.0)
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue)
    key = await make_key(db, tenant, all_queues(tenant))
    first = await registered(client, tenant, key, queue.name, "w-1")
    ref = await started_grant(client, tenant, key, first)
    second = await registered(client, tenant, key, queue.name, "w-1")
    assert await session_state(db, tenant, first) == "FENCED"
    renewed = await (await client.post(f"{base(tenant)}/{second}/renew", headers=bearer(key),
                                       json={"items": [ref]})).json()
    assert renewed["items"][0]["renewed"] is True


async def test_a_revoked_owner_hands_the_instance_to_the_rotated_key(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """Key rotation: once the owning key is revoked, the application's new key registers the
    same instance_key, becomes its owner (the revoked key's session is fenced) and adopts the
    running attempt; the old owner cannot take it back."""
    client = await start_dispatcher(60.0)
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    old_key = await make_key(db, tenant, all_queues(tenant))
    new_key = await make_key(db, tenant, all_queues(tenant))
    old_session = await registered(client, tenant, old_key, queue.name, "w-rotating")
    ref = await started_grant(client, tenant, old_key, old_session)
    refused = await register(client, tenant, new_key, queue.name, "w-rotating")
    assert refused.status == 409  # the owner is still valid
    await revoke(db, old_key)
    new_session = await registered(client, tenant, new_key, queue.name, "w-rotating")
    assert await session_state(db, tenant, old_session) == "FENCED"
    owner = (await instance_row(db, tenant, "w-rotating"))["credential_id"]
    new_credential = await scalar(db, "SELECT id FROM orbit_credentials WHERE prefix = %s",
                                  new_key.split("_")[1])
    assert owner == new_credential
    url = f"{base(tenant)}/{new_session}"
    finished = await (await client.post(f"{url}/finish", headers=bearer(new_key), json={
        "items": [{**ref, "report_id": "r-1", "outcome": "succeeded", "result": 1}]})).json()
    assert finished["items"][0]["accepted"] is True
    assert (await task_row(db, tenant, task_id))["state"] == "SUCCEEDED"


# --- §6: revocation reaches an open WebSocket ---------------------------------------------------


async def _recovered_and_finished_elsewhere(client: Client, db: Database, tenant: Tenant,
                                            queue: str, task_id: bytes) -> None:
    """The lost lease expires and the recovery scan re-queues the (re-run-safe) task; a worker
    with a valid key then runs it to the end."""

    async def recovered() -> bool:
        await db.transaction("test.recover", lambda cur: leases.recover_expired(cur, 1000))
        return (await task_row(db, tenant, task_id))["state"] == "WAITING"

    await until(recovered, timeout=15, interval=0.1, message="the task re-queued by recovery")
    assert (await task_row(db, tenant, task_id))["effect_uncertain"]
    other_key = await make_key(db, tenant, all_queues(tenant))
    other = await registered(client, tenant, other_key, queue, "w-other")
    ref = await started_grant(client, tenant, other_key, other)
    finished = await (await client.post(f"{base(tenant)}/{other}/finish",
                                        headers=bearer(other_key), json={"items": [
                                            {**ref, "report_id": "ok", "outcome": "succeeded",
                                             "result": {"by": "other"}}]})).json()
    assert finished["items"][0]["accepted"] is True
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "SUCCEEDED"
    assert json.loads(row["result"]) == {"by": "other"}


async def test_a_key_revoked_mid_task_is_refused_on_the_open_socket_and_over_http(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """The task is running on a WebSocket when its key is revoked: the finish sent on that
    socket is refused in its transaction (an ``error`` frame ``invalid_credential``, the socket
    closed with 4401 at once -- long before the periodic check), renew and finish over HTTP get
    401, nothing is recorded from the revoked key, the session is closed; the lease then takes
    the lost-session path and another worker finishes the task."""
    client = await start_dispatcher(60.0)  # the periodic check cannot be what closes it
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=True, execution_lease_ms=1000)
    key = await make_key(db, tenant, all_queues(tenant))
    session_id = await registered(client, tenant, key, queue.name, "w-revoked")
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                 headers=bearer(key)) as ws:
        ref = await granted(ws)
        await revoke(db, key)
        await ws.send_json({"type": "finish", "id": "f1", "items": [
            {**ref, "report_id": "r-1", "outcome": "succeeded", "result": {"by": "revoked"}}]})
        frames = await closed(ws, within=5)
        assert ws.close_code == CREDENTIAL_CLOSE_CODE
    assert [(f["type"], f["id"], f["code"]) for f in frames] == [
        ("error", "f1", "invalid_credential")]
    url = f"{base(tenant)}/{session_id}"
    for op, body in (("renew", {"items": [ref]}),
                     ("finish", {"items": [{**ref, "report_id": "r-2", "outcome": "succeeded",
                                            "result": None}]})):
        response = await client.post(f"{url}/{op}", headers=bearer(key), json=body)
        assert response.status == 401, op
        assert (await response.json())["code"] == "invalid_credential"
    assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"
    assert await rows_of(db, "pulse_attempt_receipts", tenant) == 0
    assert await rows_of(db, "pulse_attempt_evidence", tenant) == 0
    await until(lambda: session_closed(db, tenant, session_id), message="the session closed")
    await _recovered_and_finished_elsewhere(client, db, tenant, queue.name, task_id)


async def test_a_silent_socket_of_a_revoked_key_is_closed_within_the_check_interval(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """A worker that sends nothing after the revocation (its handler is still running) is
    closed by the periodic check: an ``error`` frame without ``id``, close code 4401."""
    interval = 0.3
    client = await start_dispatcher(interval)
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, rerun_safe=True, execution_lease_ms=1000)
    key = await make_key(db, tenant, all_queues(tenant))
    session_id = await registered(client, tenant, key, queue.name, "w-silent")
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                 headers=bearer(key)) as ws:
        await granted(ws)
        await revoke(db, key)
        loop = asyncio.get_running_loop()
        revoked_at = loop.time()
        frames = await closed(ws, within=5)
        elapsed = loop.time() - revoked_at
        assert ws.close_code == CREDENTIAL_CLOSE_CODE
    assert [(f["type"], f["id"], f["code"]) for f in frames] == [
        ("error", None, "invalid_credential")]
    assert elapsed < interval + 2.0  # one check interval, plus the close handshake's slack
    await until(lambda: session_closed(db, tenant, session_id), message="the session closed")
    await _recovered_and_finished_elsewhere(client, db, tenant, queue.name, task_id)


async def test_a_disabled_application_closes_its_sockets_and_refuses_their_frames(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """Disabling the application is a revocation of all its keys: the open socket's renew is
    refused and the socket closed, and an idle socket is closed by the periodic check."""
    client = await start_dispatcher(0.3)
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, rerun_safe=True)
    key = await make_key(db, tenant, all_queues(tenant))
    busy = await registered(client, tenant, key, queue.name, "w-busy")
    idle = await registered(client, tenant, key, queue.name, "w-idle")
    async with client.ws_connect(f"{base(tenant)}/{busy}/ws", headers=bearer(key)) as busy_ws, \
            client.ws_connect(f"{base(tenant)}/{idle}/ws", headers=bearer(key)) as idle_ws:
        ref = await granted(busy_ws)
        await disable(db, tenant)
        await busy_ws.send_json({"type": "renew", "id": "r1", "items": [ref]})
        busy_frames = await closed(busy_ws, within=5)
        idle_frames = await closed(idle_ws, within=5)
        assert busy_ws.close_code == idle_ws.close_code == CREDENTIAL_CLOSE_CODE
    assert [(f["type"], f["code"]) for f in busy_frames] == [("error", "invalid_credential")]
    assert [(f["type"], f["code"]) for f in idle_frames] == [("error", "invalid_credential")]
    assert await rows_of(db, "pulse_attempt_evidence", tenant) == 0


async def test_a_start_after_the_revocation_is_refused_on_the_open_socket(
    start_dispatcher: Callable[[float], Awaitable[Client]], db: Database, tenant: Tenant
) -> None:
    """The grant arrived before the revocation, the start after it: refused in the start
    transaction (the periodic check is far off), the socket closed with 4401, the task still
    LEASED with no start spent; its offer lapses and recovery re-queues it."""
    client = await start_dispatcher(60.0)
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, offer_lease_ms=500)
    key = await make_key(db, tenant, all_queues(tenant))
    session_id = await registered(client, tenant, key, queue.name, "w-start")
    async with client.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                 headers=bearer(key)) as ws:
        ref = await granted(ws, start=False)
        await revoke(db, key)
        await ws.send_json({"type": "start", "id": "s1", "items": [ref]})
        frames = await closed(ws, within=5)
        assert ws.close_code == CREDENTIAL_CLOSE_CODE
    assert [(f["type"], f["id"], f["code"]) for f in frames] == [
        ("error", "s1", "invalid_credential")]
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["starts_used"]) == ("LEASED", 0)

    async def requeued() -> bool:
        await db.transaction("test.recover", lambda cur: leases.recover_expired(cur, 1000))
        return (await task_row(db, tenant, task_id))["state"] == "WAITING"

    await until(requeued, timeout=15, interval=0.1, message="the lapsed offer re-queued")

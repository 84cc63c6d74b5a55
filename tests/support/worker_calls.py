"""Worker-protocol calls over the dispatcher's HTTP routes, for tests of the gateway."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.service.config import MAX_RESULT_BYTES
from orbit_dispatcher.protocol import MAX_CONTAINERS
from tests.conftest import Tenant
from tests.support.lease_fixtures import add_tasks, make_queue

# The in-process gateway's test client, or a session whose base_url is a dispatcher process.
Client = TestClient[Any, Any] | aiohttp.ClientSession


MIB = 1024 * 1024


def base(tenant: Tenant) -> str:
    return f"/v1/namespaces/{tenant.namespace}/worker/sessions"


async def register(client: Client, tenant: Tenant, queue: str) -> str:
    response = await client.post(base(tenant), headers=tenant.auth, json={
        "instance_key": "w-1", "queues": [queue], "handlers": ["noop"], "max_in_flight": 8})
    assert response.status == 201, await response.text()
    return str((await response.json())["session_id"])


async def running_attempt(client: Client, db: Database, tenant: Tenant,
                          count: int = 1) -> tuple[str, list[bytes], list[dict[str, Any]]]:
    """A session with ``count`` started attempts (over HTTP): its URL, task ids and refs."""
    queue = await make_queue(db, tenant)
    task_ids = await add_tasks(db, tenant, queue, count)
    session_id = await register(client, tenant, queue.name)
    url = f"{base(tenant)}/{session_id}"
    grants: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while len(grants) < count:
            answer = await (await client.post(f"{url}/poll", headers=tenant.auth,
                                              json={"max": count, "wait_ms": 2000})).json()
            grants.extend(answer["grants"])
    by_task = {g["task_id"]: {k: g[k] for k in ("attempt_id", "token", "generation")}
               for g in grants}
    refs = [by_task[t.hex()] for t in task_ids]
    started = await (await client.post(f"{url}/start", headers=tenant.auth,
                                       json={"items": refs})).json()
    assert all(i["approved"] for i in started["items"])
    return url, list(task_ids), refs


def text_result(size: int) -> str:
    """A JSON string of exactly ``size`` bytes (compact), of characters SQL must escape: a
    result at the limit is also the worst case for the statement that carries it."""
    return "'" * (size - 2)


async def next_frame(ws: aiohttp.ClientWebSocketResponse, kind: str, *,
                     timeout: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            message = await ws.receive()
            assert message.type == aiohttp.WSMsgType.TEXT, message
            frame: dict[str, Any] = json.loads(message.data)
            if frame["type"] == kind:
                return frame


def worst_frames(ref: dict[str, Any]) -> tuple[list[str], str]:
    """The largest frames the dispatcher accepts, of the content that costs it most: 1 MiB of
    ``[`` and 1 MiB of tiny batch items (both refused with an error frame), and a finish of the
    attempt ``ref`` whose result at the limit holds as many arrays as a message may (the
    parser's cost) and exact decimals after them (stored). Returns the frames and that result."""
    arrays = MAX_CONTAINERS - 4  # the frame, its items, the item and the result are four
    decimals = (MAX_RESULT_BYTES - 1 - 3 * arrays) // 4
    worst_result = "[" + ",".join(["[]"] * arrays + ["1.5"] * decimals) + "]"
    assert MAX_RESULT_BYTES - 4 < len(worst_result) <= MAX_RESULT_BYTES
    finish = ('{"type": "finish", "id": "f", "items": [' + json.dumps(
        {**ref, "report_id": "worst", "outcome": "succeeded"})[:-1] + ', "result": '
        + worst_result + "}]}")
    frames = ["[" * MIB, '{"type": "start", "id": "s", "items": [' + "[]," * 349_000 + "[]]}",
              finish]
    assert all(len(f) <= MIB for f in frames)
    return frames, worst_result

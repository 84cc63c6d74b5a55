"""Worker-protocol calls over the dispatcher's HTTP routes, for tests of the gateway."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant
from tests.support.lease_fixtures import add_tasks, make_queue


def base(tenant: Tenant) -> str:
    return f"/v1/namespaces/{tenant.namespace}/worker/sessions"


async def register(client: TestClient[Any, Any], tenant: Tenant, queue: str) -> str:
    response = await client.post(base(tenant), headers=tenant.auth, json={
        "instance_key": "w-1", "queues": [queue], "handlers": ["noop"], "max_in_flight": 8})
    assert response.status == 201, await response.text()
    return str((await response.json())["session_id"])


async def running_attempt(client: TestClient[Any, Any], db: Database, tenant: Tenant,
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

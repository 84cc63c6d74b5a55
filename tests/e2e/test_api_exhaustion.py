"""Resource exhaustion of the API daemon (issue 11, "keep it so"): the worst requests it accepts
and a crowd of slow clients do not stall it for everyone.

A real ``orbit api`` process with its default limits gets, at the same time:

* the largest bodies it reads (1 MiB, the default ``[api].max_body_bytes``), each list-shaped:
  a batch of 349,000 empty items (refused while its array is read), a batch of 500 items whose
  inputs nest to the 32-level limit, and single tasks whose input is a list of 500,000 numbers
  (or of 151,000 distinct ones);
* 100 clients trickling a request head a line at a time and 100 trickling a batch body, each
  reconnecting when the server cuts it, so that about 200 connections stay open.

Meanwhile a probe on its own thread and connection asks ``/healthz`` every 10 ms: its slowest
answer bounds how long the event loop was blocked. The process's RSS is read before and after.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from orbit_common.db.pool import Database, DatabaseUrl
from tests.conftest import Tenant
from tests.support import pulse
from tests.support.exhaustion import (
    RSS_BOUND_KIB,
    SLOW_BODIES,
    SLOW_HEADS,
    post_head,
    rss_kib,
    running,
    under_attack,
)
from tests.support.processes import ApiDaemon

pytestmark = [pytest.mark.slow, pytest.mark.alone]

MAX_BODY = 1024 * 1024
ROUNDS = 3


def nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


def worst_bodies() -> dict[str, tuple[str, bytes, int]]:
    """name → (path suffix, body, expected status); every body just under the size limit."""
    empty_items = b'{"tasks": [' + b",".join([b"{}"] * 349_000) + b"]}"
    item_room = MAX_BODY // 500 - 120
    item = ('{"queue": "work", "handler": "h", "input": '
            + nested(29, json.dumps("x" * item_room)) + "}")
    deep_batch = ('{"tasks": [' + ",".join([item] * 500) + "]}").encode()
    numbers = ('{"queue": "work", "handler": "h", "input": ['
               + ",".join(["0"] * 500_000) + "]}").encode()
    distinct = ('{"queue": "work", "handler": "h", "input": ['
                + ",".join(str(n) for n in range(151_000)) + "]}").encode()
    bodies = {
        "batch-349000-empty-items": ("/batch", empty_items, 400),
        "batch-500-items-32-deep": ("/batch", deep_batch, 201),
        "task-input-500000-numbers": ("", numbers, 201),
        "task-input-151000-distinct-numbers": ("", distinct, 201),
    }
    for _, body, _ in bodies.values():
        assert MAX_BODY * 0.9 < len(body) <= MAX_BODY, len(body)
    return bodies


def batch_head(tenant: Tenant) -> bytes:
    """A 1 MiB batch request's head and the body's first bytes, for the slow body senders."""
    return post_head(f"/v1/namespaces/{tenant.namespace}/tasks/batch", MAX_BODY,
                     tenant.auth) + b'{"tasks": ['


@pytest.fixture
async def api_process(db_url: DatabaseUrl, tmp_path: Path) -> AsyncIterator[ApiDaemon]:
    daemon = ApiDaemon(db_url=db_url, log=tmp_path / "api.log",
                       env={"ORBIT_SERVICE_LOG_LEVEL": "WARNING"})
    async with running(daemon, daemon.wait_listening):
        yield daemon


async def test_the_worst_requests_and_slow_clients_do_not_stall_healthz(
    api_process: ApiDaemon, db: Database, tenant: Tenant,
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "work")
    bodies = worst_bodies()
    host, port = "127.0.0.1", api_process.port
    pid = api_process.proc.pid
    tasks_url = f"{api_process.url}/v1/namespaces/{tenant.namespace}/tasks"
    headers = {**tenant.auth, "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as client:
        # Warm up every route once, so the baseline holds the imports and first allocations.
        async with client.post(tasks_url, headers=headers,
                               json={"queue": "work", "handler": "h"}) as response:
            assert response.status == 201, await response.text()
        rss_before = rss_kib(pid)

        timings: dict[str, list[float]] = {name: [] for name in bodies}
        async with under_attack(host, port, batch_head(tenant), b"{}," * 33) as probe:
            for _ in range(ROUNDS):
                for name, (suffix, body, status) in bodies.items():
                    started = time.perf_counter()
                    async with client.post(tasks_url + suffix, data=body,
                                           headers=headers) as response:
                        answer = await response.read()
                    timings[name].append(time.perf_counter() - started)
                    assert response.status == status, (name, answer[:500])
                    assert len(answer) < 256 * 1024, (name, len(answer))  # bounded answers
        rss_after = rss_kib(pid)

    print(f"\nslow connections held: {SLOW_HEADS + SLOW_BODIES}", end="")
    print(f"\n{probe.summary()}; "
          f"RSS {rss_before // 1024} -> {rss_after // 1024} MiB; "
          + "; ".join(f"{name} {max(t) * 1000:.0f} ms" for name, t in timings.items()))
    probe.assert_unblocked()
    assert rss_after - rss_before < RSS_BOUND_KIB, (rss_before, rss_after)
    assert "Traceback" not in api_process.output()

"""Flow control end to end through the SDK: real API and dispatcher processes, an SDK Worker.

A queue's start window refuses starts (``start_rate_limited``) and the SDK sends them again
while the offer is valid, so every task runs on its first grant; handlers see their concurrency
key and fencing token, the same ones the attempts show; a full queue is a typed 429.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orbit_sdk import Client, Context, QueueFull, Worker

from tests.support.processes import wait_until
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, dispatchers=1)
    try:
        yield s
    finally:
        s.close()


async def settled(orbit: Client, task_ids: list[str], timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while True:
            tasks = [await orbit.get_task(t) for t in task_ids]
            if all(t.finished for t in tasks):
                return
            await asyncio.sleep(0.2)


async def test_rate_limited_starts_are_resent_and_tokens_reach_the_handler(stack: Stack) -> None:
    stack.create_queue("flow", max_starts_per_second=2, offer_lease_ms=20_000)
    worker = Worker(stack.dispatchers[0].url, stack.api_key, stack.namespace, queues=["flow"],
                    concurrency=8, instance_key="e2e-flow", drain_timeout=5)

    @worker.handler("fence")
    async def fence(ctx: Context, data: Any) -> Any:
        await asyncio.sleep(0.05)
        return {"key": ctx.concurrency_key, "token": ctx.concurrency_token}

    running = asyncio.get_running_loop().create_task(worker.run(install_signal_handlers=False))
    try:
        async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
            keys = [f"账户:{i}" for i in range(6)] + ["账户:0"]
            ids = [(await orbit.submit("flow", "fence", {}, concurrency_key=k)).id
                   for k in keys]
            await settled(orbit, ids)
            started: list[dt.datetime] = []
            tokens: dict[str, list[int]] = {}
            for task_id, key in zip(ids, keys, strict=True):
                task = await orbit.get_task(task_id)
                assert task.state == "SUCCEEDED", task
                assert task.concurrency_key == key
                (attempt,) = await orbit.task_attempts(task_id)  # first grant, never re-granted
                assert attempt.concurrency_token is not None
                assert task.result == {"key": key, "token": attempt.concurrency_token}
                assert attempt.started_at is not None
                started.append(attempt.started_at)
                tokens.setdefault(key, []).append(attempt.concurrency_token)
            # Seven starts at two per one-second window take at least three windows.
            assert max(started) - min(started) >= dt.timedelta(seconds=1.9)
            assert worker.starts_deferred >= 1
            # Two tasks on one key: the later grant has the larger token.
            first, second = tokens["账户:0"]
            assert second > first
            queue = await orbit.get_queue("flow")
            assert queue.usage is not None
            assert (queue.usage.unfinished_tasks, queue.usage.active_attempts) == (0, 0)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


async def test_a_full_queue_is_a_typed_refusal_with_retry_after(stack: Stack) -> None:
    async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
        await orbit.create_queue("tight", max_unfinished_tasks=1)
        await orbit.submit("tight", "h", {})
        with pytest.raises(QueueFull) as caught:
            await orbit.submit("tight", "h", {})
        assert caught.value.retry_after is not None
        assert caught.value.retry_after >= 1
        queue = await orbit.get_queue("tight")
        assert queue.usage is not None
        assert queue.usage.unfinished_tasks == 1
        resources = await orbit.get_application_resources()
        assert resources.unfinished_tasks == 1
        lifted = await orbit.update_application_resources(revision=resources.revision,
                                                          max_unfinished_tasks=10)
        assert lifted.max_unfinished_tasks == 10
        await orbit.update_queue("tight", revision=queue.revision, max_unfinished_tasks=None)
        await orbit.submit("tight", "h", {})
        assert (await orbit.get_application_resources()).unfinished_tasks == 2
    # The refusal and the queue's usage reach the operators' metrics (each daemon's operator
    # listener): the API counts the 429, the dispatcher's gauges (refreshed every 0.5 s in this
    # stack) show the queue's counter.
    status, text = http_text(f"{stack.api.ops_url}/metrics")
    assert status == 200
    assert 'orbit_backpressure_refusals_total{code="queue_full"} 1.0' in text

    def gauge_shows_two() -> bool:
        _, body = http_text(f"{stack.dispatchers[0].ops_url}/metrics")
        return (f'orbit_queue_unfinished_tasks{{namespace="{stack.namespace}",queue="tight"}} 2.0'
                in body)

    wait_until(gauge_shows_two, timeout=20, message="the dispatcher's unfinished-tasks gauge")


def http_text(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
        return response.status, response.read().decode()

"""Fixtures for the SDK's unit tests: a fake dispatcher and workers running against it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fake_dispatcher import API_KEY, FakeDispatcher

from orbit_sdk import Worker


@pytest.fixture
async def fake() -> AsyncIterator[FakeDispatcher]:
    dispatcher = FakeDispatcher()
    await dispatcher.start()
    yield dispatcher
    await dispatcher.stop()


class Running:
    """A worker's ``run()`` as a background task."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task = asyncio.get_running_loop().create_task(
            worker.run(install_signal_handlers=False))

    async def stop(self, timeout: float = 10.0) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, timeout)


@pytest.fixture
async def make_worker(fake: FakeDispatcher) -> AsyncIterator[Callable[..., Worker]]:
    """``make_worker(**options)``: a Worker against the fake, with quick timings."""

    def make(**options: Any) -> Worker:
        settings: dict[str, Any] = {
            "concurrency": 8, "instance_key": "test-host:1", "batch_delay": 0.01,
            "reconnect_initial": 0.01, "reconnect_max": 0.05, "request_timeout": 2.0,
            "drain_timeout": 2.0, "finish_timeout": 2.0, "poll_wait_ms": 200,
        }
        settings.update(options)
        return Worker(fake.url, API_KEY, "default", queues=["q"], **settings)

    return make


@pytest.fixture
async def run_worker() -> AsyncIterator[Callable[[Worker], Running]]:
    """``run_worker(worker)``: start it; whatever is still running is stopped at the end."""
    running: list[Running] = []

    def start(worker: Worker) -> Running:
        handle = Running(worker)
        running.append(handle)
        return handle

    yield start
    for handle in running:
        if not handle.task.done():
            handle.worker.stop()
            handle.worker.stop()
        await asyncio.wait_for(handle.task, 10)

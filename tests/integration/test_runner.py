"""The process runner with a real database: health server, readiness gate, drain and close."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import aiohttp
import attrs
import pytest

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.service import runner
from orbit_common.service.config import DatabaseConfig, OrbitConfig, ServiceConfig
from orbit_common.service.health import ReadinessGate
from tests.support.processes import free_port


@attrs.define
class RecordingService:
    """A minimal daemon that records the runner's calls (a test seam, not a product daemon)."""

    db: Database
    gate: ReadinessGate
    name: str = "recording"
    calls: list[str] = attrs.field(factory=list)
    drain_seconds: float = 0.0

    async def start(self) -> None:
        self.calls.append("start")

    async def drain(self) -> None:
        self.calls.append("drain")
        await asyncio.sleep(self.drain_seconds)
        self.calls.append("drained")

    async def close(self) -> None:
        self.calls.append("close")


def _config(db_url: DatabaseUrl, port: int, drain_timeout_s: float = 5) -> OrbitConfig:
    return OrbitConfig(
        database=DatabaseConfig(url=db_url.render(hide_password=False), pool_max=2),
        service=ServiceConfig(metrics_port=port, readiness_interval_s=0.2,
                              drain_timeout_s=drain_timeout_s),
    )


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def _wait_up(session: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(10):
        while True:
            try:
                if (await _get(session, url))[0] == 200:
                    return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)


async def test_runner_serves_health_and_drains_then_closes(db_url: DatabaseUrl) -> None:
    port = free_port()
    services: list[RecordingService] = []

    def factory(config: OrbitConfig, db: Database, gate: ReadinessGate) -> RecordingService:
        services.append(RecordingService(db=db, gate=gate))
        return services[0]

    stop = asyncio.Event()
    serving = asyncio.create_task(runner.serve(factory, _config(db_url, port), stop=stop))
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        await _wait_up(session, f"{base}/healthz")
        status, body = await _get(session, f"{base}/readyz")
        assert status == 200
        assert body["foreign_keys"] == 0
        status, text = await _get(session, f"{base}/metrics")
        assert status == 200
        assert "orbit_ready 1.0" in text
        assert services[0].gate.is_ready
        stop.set()
        await asyncio.wait_for(serving, 10)
        with pytest.raises(aiohttp.ClientConnectionError):
            await _get(session, f"{base}/healthz")
    assert services[0].calls == ["start", "drain", "drained", "close"]


async def test_a_drain_that_overruns_is_cut_short_but_close_still_runs(
    db_url: DatabaseUrl,
) -> None:
    services: list[RecordingService] = []

    def factory(config: OrbitConfig, db: Database, gate: ReadinessGate) -> RecordingService:
        services.append(RecordingService(db=db, gate=gate, drain_seconds=30))
        return services[0]

    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(
        runner.serve(factory, _config(db_url, free_port(), drain_timeout_s=0.2), stop=stop), 10
    )
    assert services[0].calls == ["start", "drain", "close"]


async def test_a_second_signal_cuts_the_drain_short(db_url: DatabaseUrl) -> None:
    services: list[RecordingService] = []

    def factory(config: OrbitConfig, db: Database, gate: ReadinessGate) -> RecordingService:
        services.append(RecordingService(db=db, gate=gate, drain_seconds=60))
        return services[0]

    serving = asyncio.create_task(
        runner.serve(factory, _config(db_url, free_port(), drain_timeout_s=60))
    )
    async with asyncio.timeout(10):
        while not services or "start" not in services[0].calls:
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the runner's loop handler
        while "drain" not in services[0].calls:
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        await serving
    assert services[0].calls == ["start", "drain", "close"]

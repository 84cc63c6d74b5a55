"""The daemons' shared pacing (orbit_common/service/loops.py): a drain cuts a pause short, and a
failing periodic step is logged and run again instead of ending its loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from orbit_common.service.health import ReadinessGate
from orbit_common.service.loops import Pacer


class OpenGate:
    async def wait(self) -> None:
        return None


def pacer(stopping: asyncio.Event) -> Pacer:
    return Pacer(stopping, cast(ReadinessGate, OpenGate()), logging.getLogger("test.loops"),
                 "test")


async def test_a_drain_ends_a_pause_at_once() -> None:
    stopping = asyncio.Event()
    sleeping = asyncio.create_task(pacer(stopping).pause(3600))
    await asyncio.sleep(0)
    assert not sleeping.done()
    stopping.set()
    await asyncio.wait_for(sleeping, 5)  # not an hour: the drain ended it


async def test_a_failing_step_is_logged_and_run_again(caplog: Any) -> None:
    stopping = asyncio.Event()
    runs: list[int] = []

    async def step() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("first run fails")
        if len(runs) == 3:
            stopping.set()

    with caplog.at_level(logging.ERROR, logger="test.loops"):
        await asyncio.wait_for(pacer(stopping).every(0.001, step, "gauges"), 5)
    assert runs == [0, 1, 2]
    assert [r.getMessage() for r in caplog.records] == ["test gauges failed"]


async def test_a_cancelled_step_ends_the_loop() -> None:
    async def step() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await pacer(asyncio.Event()).every(0.001, step, "gauges")

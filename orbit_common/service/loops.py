"""The pacing every background daemon's loops share: a pause that a drain cuts short, and a
step run every N seconds while the readiness gate is open (the delivery pump and the workflow
engine use them; the scheduler's loop has its own due-time pacing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from orbit_common.service.health import ReadinessGate


class Pacer:
    """``stopping`` is the daemon's drain signal; ``gate`` its readiness gate."""

    def __init__(self, stopping: asyncio.Event, gate: ReadinessGate, log: logging.Logger,
                 daemon: str) -> None:
        self.stopping = stopping
        self.gate = gate
        self.log = log
        self.daemon = daemon

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the daemon starts draining."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def every(self, seconds: float, step: Callable[[], Awaitable[Any]], what: str) -> None:
        """Run ``step`` every ``seconds`` while the gate is open, until the drain; a failing
        step is logged and tried again next time."""
        while not self.stopping.is_set():
            try:
                await self.gate.wait()
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("%s %s failed", self.daemon, what)
            await self.pause(seconds)

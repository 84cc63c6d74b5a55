"""The example's handlers: what a handler returns, raises, and how it meets cancellation."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from orbit_sdk import Context, OutcomeUnknown, RetryableError, Worker

log = logging.getLogger("examples.worker")


async def greet(ctx: Context, data: Any) -> dict[str, Any]:
    """Pure and quick: the return value becomes the task's result."""
    name = data.get("name", "world") if isinstance(data, dict) else "world"
    return {"greeting": f"hello, {name}", "attempt": ctx.attempt}


async def charge(ctx: Context, data: Any) -> dict[str, Any]:
    """A slow call with an external effect, showing each outcome a handler can report.

    ``{"mode": "flaky"}`` fails retryably on the first attempt (a retry is safe: nothing was
    charged); ``{"mode": "timeout"}`` cannot tell whether the charge happened (the task goes to
    review); ``{"mode": "invalid"}`` fails for good. A cancel interrupts the ``sleep``.
    """
    mode = data.get("mode", "ok") if isinstance(data, dict) else "ok"
    amount = data.get("amount", 0) if isinstance(data, dict) else 0
    if mode == "flaky" and ctx.attempt == 1:
        raise RetryableError("the payment provider answered 503; nothing was charged")
    if mode == "invalid":
        raise ValueError("the amount must be positive")
    try:
        await asyncio.sleep(float(data.get("seconds", 1)) if isinstance(data, dict) else 1)
    except asyncio.CancelledError:
        log.info("charge for task %s cancelled before it was sent", ctx.task_id)
        raise  # reported as "cancelled": we stopped before charging
    if mode == "timeout":
        raise OutcomeUnknown("the provider timed out after receiving the request")
    # A real handler would pass the task id as the provider's idempotency key, so a re-run
    # after a lost lease cannot charge twice.
    return {"charged": amount, "reference": f"ch_{ctx.task_id[:12]}"}


def register(worker: Worker) -> None:
    worker.add_handler("greet", greet)
    worker.add_handler("charge", charge)

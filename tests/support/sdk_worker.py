"""An SDK worker process for end-to-end and fault tests.

Handlers (the input is a JSON object):
* ``sleep`` {"ms": n}: appends "task attempt generation" to $ORBIT_SIDE_EFFECTS (the side-effect
  log the fault tests compare with the database), sleeps, returns {"slept": n}.
* ``fail`` {"retryable": bool}: raises RetryableError or a plain error.
* ``unknown``: raises OutcomeUnknown (the effect is not known).
* ``wait_cancel``: waits until cancelled (the SDK then reports ``cancelled``).

Run: ``python -m tests.support.sdk_worker`` with ORBIT_DISPATCHER_URL, ORBIT_API_KEY,
ORBIT_NAMESPACE, ORBIT_QUEUES (comma-separated), ORBIT_CONCURRENCY, ORBIT_INSTANCE_KEY.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from orbit_sdk import Context, OutcomeUnknown, RetryableError, Worker


def _log_effect(ctx: Context) -> None:
    path = os.environ.get("ORBIT_SIDE_EFFECTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{ctx.task_id} {ctx.attempt_id} {ctx.generation}\n")
            f.flush()
            os.fsync(f.fileno())


def build() -> Worker:
    worker = Worker(
        os.environ["ORBIT_DISPATCHER_URL"], os.environ["ORBIT_API_KEY"],
        os.environ["ORBIT_NAMESPACE"], queues=os.environ["ORBIT_QUEUES"].split(","),
        concurrency=int(os.environ.get("ORBIT_CONCURRENCY", "8")),
        instance_key=os.environ.get("ORBIT_INSTANCE_KEY") or None,
        drain_timeout=float(os.environ.get("ORBIT_DRAIN_TIMEOUT", "10")),
    )

    @worker.handler("sleep")
    async def sleep(ctx: Context, data: Any) -> Any:
        _log_effect(ctx)
        ms = int(data.get("ms", 0)) if isinstance(data, dict) else 0
        await asyncio.sleep(ms / 1000)
        return {"slept": ms}

    @worker.handler("fail")
    async def fail(ctx: Context, data: Any) -> Any:
        _log_effect(ctx)
        if isinstance(data, dict) and data.get("retryable"):
            raise RetryableError("transient failure")
        raise ValueError("permanent failure")

    @worker.handler("unknown")
    async def unknown(ctx: Context, data: Any) -> Any:
        _log_effect(ctx)
        raise OutcomeUnknown("the downstream call timed out")

    @worker.handler("wait_cancel")
    async def wait_cancel(ctx: Context, data: Any) -> Any:
        _log_effect(ctx)
        while True:
            await asyncio.sleep(0.05)

    return worker


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    build().run_forever()

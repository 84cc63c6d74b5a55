"""Task results for consumer tests on a real stack: an SDK Worker runs the tasks on the stack's
dispatcher, and a relay loop (the delivery pump's fan-out and lease-recovery steps, run
in-process: the pump daemon is not part of the stack) turns their result events into
deliveries and lapsed leases into redeliveries."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from orbit_sdk import Context, Worker

from orbit_common.db.pool import Database, open_database
from orbit_common.relay import deliveries, fanout
from tests.support.stack import Stack

FAN_OUT_PAUSE_S = 0.05  # between passes that found nothing (the pump's idle pause)


async def _fan_out_forever(db: Database) -> None:
    after = None
    while True:
        done = await fanout.fan_out(db, after=after)
        after = done.next_after
        lapsed = await db.transaction("test.recover_lapsed", deliveries.recover_lapsed)
        if done.created == 0 and lapsed == 0:
            await asyncio.sleep(FAN_OUT_PAUSE_S)


@contextlib.asynccontextmanager
async def producing(stack: Stack, queues: list[str]) -> AsyncIterator[Database]:
    """While open: a Worker that runs ``echo`` (returns its input) and ``boom`` (fails) on
    ``queues``, and a fan-out loop over every subscription of the stack."""
    worker = Worker(stack.dispatchers[0].url, stack.api_key, stack.namespace, queues=queues,
                    concurrency=8, instance_key="results-producer", drain_timeout=5)

    @worker.handler("echo")
    async def echo(ctx: Context, data: Any) -> Any:
        return data

    @worker.handler("boom")
    async def boom(ctx: Context, data: Any) -> Any:
        raise ValueError("the task failed")

    db = await open_database(stack.url, minsize=1, maxsize=4)
    loop = asyncio.get_running_loop()
    working = loop.create_task(worker.run(install_signal_handlers=False))
    fanning = loop.create_task(_fan_out_forever(db))
    try:
        yield db
    finally:
        fanning.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fanning
        worker.stop()
        await asyncio.wait_for(working, 30)
        await db.close()


async def expire_leases(db: Database) -> None:
    """Move every delivery lease into the past (as if its holder crashed before acknowledging)."""

    async def body(cur: Any) -> None:
        await cur.execute("UPDATE orbit_deliveries SET lease_expires_at = UTC_TIMESTAMP(6)"
                          " - INTERVAL 1 SECOND WHERE state = 'LEASED'")

    await db.transaction("test.expire_delivery_leases", body)

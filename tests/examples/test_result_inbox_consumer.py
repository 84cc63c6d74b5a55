"""examples/result-inbox as a pull consumer against a real API and dispatcher: each result is
applied once even when it is delivered again after the receiver committed (its
acknowledgement lost), and a delivery is acknowledged only after its commit."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orbit_sdk import Client
from result_inbox import inbox
from result_inbox.consumer import InboxConsumer

from tests.support.results import expire_leases, producing
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "result-inbox"


@pytest.fixture
def stack(tmp_path: Any) -> Iterator[Stack]:
    s = Stack(tmp_path, dispatchers=1)
    try:
        yield s
    finally:
        s.close()


async def inbox_rows(pool: Any, task_ids: list[str]) -> list[tuple[Any, ...]]:
    async with pool.acquire() as conn:
        await conn.commit()  # a fresh snapshot
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT task_id, event_id, outcome FROM receiver_inbox WHERE task_id IN"
                f" ({', '.join(['%s'] * len(task_ids))}) ORDER BY task_id", task_ids)
            found = list(await cur.fetchall())
        await conn.commit()
    return found


async def view_results(pool: Any, task_ids: list[str]) -> dict[str, str]:
    async with pool.acquire() as conn:
        await conn.commit()
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT task_id, result FROM receiver_task_views WHERE task_id IN"
                f" ({', '.join(['%s'] * len(task_ids))})", task_ids)
            found = {row[0]: row[1] for row in await cur.fetchall()}
        await conn.commit()
    return found


async def test_the_pull_consumer_applies_a_redelivered_result_once(stack: Stack,
                                                                   pool: Any) -> None:
    async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
        await orbit.create_queue("billing")
        await orbit.create_subscription("inbox", filters={"queues": ["billing"]},
                                        backoff_initial_ms=0)

        async def acknowledged(count: int) -> bool:
            return len([d async for d in orbit.list_deliveries("inbox",
                                                               state="ACKNOWLEDGED")]) == count

        async with producing(stack, ["billing"]) as db:
            task_ids = stack.submit("billing", "echo", [
                {"n": 1}, {"n": 2}, {"n": 3}])
            await until(lambda: orbit_pending(orbit, 3), timeout=30,
                        message="three pending deliveries")
            # A receiver commits one result, then crashes before acknowledging it.
            (held,) = await orbit.lease_deliveries("inbox", max=1)
            first = inbox.TaskResult.from_delivery(held.delivery.raw)
            assert await inbox.apply_with_retry(pool, first) == inbox.Applied.APPLIED
            await expire_leases(db)

            # The business step fails once for another task: nothing is committed for it and
            # its delivery is not acknowledged (it comes again and is applied then).
            failing = {next(t for t in task_ids if t != first.task_id)}

            async def business(_cur: Any, result: inbox.TaskResult) -> None:
                if result.task_id in failing:
                    failing.discard(result.task_id)
                    raise RuntimeError("the ledger is busy")

            consumer = InboxConsumer(pool, api_url=stack.api.url, api_key=stack.api_key,
                                     namespace=stack.namespace, subscription="inbox",
                                     on_applied=business, concurrency=2)
            running = asyncio.get_running_loop().create_task(
                consumer.run(install_signal_handlers=False))
            try:
                await until(lambda: acknowledged(3), timeout=30,
                            message="every delivery acknowledged")
            finally:
                consumer.stop()
                await asyncio.wait_for(running, 30)

        assert consumer.outcomes == {"applied": 2, "duplicate": 1}
        assert consumer.subscriber.failed == 1
        rows = await inbox_rows(pool, task_ids)
        assert sorted(r[0] for r in rows) == sorted(task_ids)  # one inbox row per result
        assert all(r[2] == "APPLIED" for r in rows)
        redelivered = await orbit.get_delivery("inbox", held.delivery.id)
        assert (redelivered.state, redelivered.attempts_used) == ("ACKNOWLEDGED", 2)
        assert [a.outcome for a in redelivered.attempts] == ["LAPSED", "ACKNOWLEDGED"]
        views = await view_results(pool, task_ids)
        assert {t: json.loads(v) for t, v in views.items()} == {
            t: {"n": n} for n, t in enumerate(task_ids, start=1)}


async def orbit_pending(orbit: Client, count: int) -> bool:
    return len([d async for d in orbit.list_deliveries("inbox", state="PENDING")]) == count


async def test_the_consume_command_runs_until_sigterm_and_drains(stack: Stack, pool: Any,
                                                                 inbox_url: str) -> None:
    async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
        await orbit.create_queue("cli")
        await orbit.create_subscription("cli-inbox", filters={"queues": ["cli"]})
        proc = stack.start_worker(
            "-m", "result_inbox", "consume", "--concurrency", "2", log_name="consume.log",
            env={"RESULT_INBOX_DATABASE_URL": inbox_url,
                 "RESULT_INBOX_SUBSCRIPTION": "cli-inbox",
                 "PYTHONPATH": str(EXAMPLE)})
        async with producing(stack, ["cli"]):
            task_ids = stack.submit("cli", "echo", [{"n": 1}, {"n": 2}])

            async def acknowledged() -> bool:
                found = [d async for d in orbit.list_deliveries("cli-inbox",
                                                                state="ACKNOWLEDGED")]
                return len(found) == 2

            await until(acknowledged, timeout=30, message="both results acknowledged")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        assert len(await inbox_rows(pool, task_ids)) == 2
        assert [d async for d in orbit.list_deliveries("cli-inbox", state="LEASED")] == []

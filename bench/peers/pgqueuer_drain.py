"""PgQueuer drains N no-op jobs from a durable PostgreSQL (runs in the peers' virtualenv).

``python -m bench.peers.pgqueuer_drain DSN --tasks N --workers W --batch B`` installs PgQueuer's
schema in the (empty) database, enqueues N jobs of the entrypoint ``noop`` in batches of 1,000,
then starts W consumer processes (``consume DSN --batch B``: one ``QueueManager`` each, drain
mode: it exits once the queue is empty and its finished jobs are logged) and waits for them.
The figure is N over the time from the first ``picked`` to the last ``successful`` row of
``pgqueuer_log``, both the database's ``now()`` of their transactions; the tables are the
shipped ``durable`` ones (logged). Prints one JSON line: ``{"pgqueuer_tasks_per_s": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

FILL_BATCH = 1000


async def fill(dsn: str, tasks: int) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        for first in range(0, tasks, FILL_BATCH):
            size = min(FILL_BATCH, tasks - first)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    finally:
        await connection.close()


async def consume(dsn: str, batch: int) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        # No periodic folding of pgqueuer_log into statistics: the log rows are the figure.
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain,
                          dequeue_timeout=timedelta(seconds=1),
                          log_aggregation_interval=timedelta(0))
    finally:
        await connection.close()


async def measure(dsn: str, tasks: int) -> dict[str, float]:
    connection = await asyncpg.connect(dsn)
    try:
        unlogged = await connection.fetchval(
            "SELECT COUNT(*) FROM pg_class WHERE relname IN ('pgqueuer', 'pgqueuer_log')"
            " AND relpersistence <> 'p'")
        if unlogged:
            raise RuntimeError("pgqueuer: its tables are not durable (UNLOGGED)")
        left = await connection.fetchval("SELECT COUNT(*) FROM pgqueuer")
        done = await connection.fetchval(
            "SELECT COUNT(*) FROM pgqueuer_log WHERE status = 'successful'")
        if left or done != tasks:
            raise RuntimeError(f"pgqueuer: {done} of {tasks} successful, {left} left")
        seconds = await connection.fetchval(
            "SELECT EXTRACT(EPOCH FROM MAX(created) FILTER (WHERE status = 'successful')"
            " - MIN(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log")
    finally:
        await connection.close()
    return {"pgqueuer_tasks_per_s": round(tasks / float(seconds), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("run", "consume"))
    parser.add_argument("dsn")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if args.mode == "consume":
        asyncio.run(consume(args.dsn, args.batch))
        return
    asyncio.run(fill(args.dsn, args.tasks))
    consumers = [subprocess.Popen([sys.executable, "-m", "bench.peers.pgqueuer_drain", "consume",
                                   args.dsn, "--batch", str(args.batch)])
                 for _ in range(args.workers)]
    for consumer in consumers:
        if consumer.wait(timeout=900) != 0:
            raise RuntimeError(f"a pgqueuer consumer exited with {consumer.returncode}")
    print(json.dumps(asyncio.run(measure(args.dsn, args.tasks))))


if __name__ == "__main__":
    main()

"""The raw queue cycle: the yardstick ``orbit bench tasks`` compares Orbit with.

The same transaction shape as Orbit's worker path with nothing else: claim (``SELECT … FOR UPDATE
SKIP LOCKED`` + ``UPDATE``), start and finish, each one transaction per batch of 32, in a table
of its own in the benchmark's scratch database, over aiomysql, on the same server and in the
same run as the Orbit measurement.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiomysql

from orbit_common.db.pool import DatabaseUrl

BATCH = 32

CREATE = """
CREATE TABLE bench_raw_jobs (
  id BINARY(16) NOT NULL COMMENT '任务 ID（基准测试专用表）',
  state VARCHAR(16) NOT NULL COMMENT '状态（基准测试专用表）',
  run_at DATETIME(6) NOT NULL COMMENT '可执行时间（基准测试专用表）',
  lease_until DATETIME(6) NULL COMMENT '租约到期（基准测试专用表）',
  PRIMARY KEY (id),
  KEY ix_claim (state, run_at, id)
) ENGINE=InnoDB COMMENT='基准测试：原始队列循环'
"""


async def run_raw_cycle(url: DatabaseUrl, tasks: int, workers: int) -> dict[str, Any]:
    """Run ``tasks`` jobs through claim/start/finish with ``workers`` concurrent loops."""
    kwargs = url.connect_kwargs()
    pool = await aiomysql.create_pool(minsize=workers, maxsize=workers + 1,
                                      db=url.database, **kwargs)
    try:
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute("DROP TABLE IF EXISTS bench_raw_jobs")
            await cur.execute(CREATE)
            rows = [(os.urandom(16),) for _ in range(tasks)]
            for start in range(0, tasks, 1000):
                await cur.executemany(
                    "INSERT INTO bench_raw_jobs (id, state, run_at) VALUES"
                    " (%s, 'WAITING', UTC_TIMESTAMP(6))", rows[start:start + 1000])
            await conn.commit()
        done = 0
        started = time.perf_counter()

        async def loop() -> None:
            nonlocal done
            async with pool.acquire() as conn:
                await conn.query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                while True:
                    async with conn.cursor() as cur:
                        await cur.execute("START TRANSACTION")
                        await cur.execute(
                            "SELECT id FROM bench_raw_jobs WHERE state = 'WAITING'"
                            " AND run_at <= UTC_TIMESTAMP(6) ORDER BY run_at, id LIMIT %s"
                            " FOR UPDATE SKIP LOCKED", (BATCH,))
                        ids = [row[0] for row in await cur.fetchall()]
                        if not ids:
                            await conn.commit()
                            return
                        marks = ", ".join(["%s"] * len(ids))
                        await cur.execute(
                            "UPDATE bench_raw_jobs SET state = 'LEASED', lease_until ="
                            f" UTC_TIMESTAMP(6) + INTERVAL 30 SECOND WHERE id IN ({marks})", ids)
                        await conn.commit()
                        for state, previous in (("RUNNING", "LEASED"), ("DONE", "RUNNING")):
                            await cur.execute("START TRANSACTION")
                            await cur.execute(
                                f"UPDATE bench_raw_jobs SET state = %s WHERE id IN ({marks})"
                                " AND state = %s", (state, *ids, previous))
                            await conn.commit()
                        done += len(ids)

        await asyncio.gather(*(loop() for _ in range(workers)))
        elapsed = time.perf_counter() - started
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute("SELECT COUNT(*) FROM bench_raw_jobs WHERE state = 'DONE'")
            (finished,) = await cur.fetchone()
            await cur.execute("DROP TABLE bench_raw_jobs")
        if finished != tasks:
            raise RuntimeError(f"raw cycle finished {finished} of {tasks}")
        return {"raw_tasks_per_s": round(done / elapsed, 1)}
    finally:
        pool.close()
        await pool.wait_closed()

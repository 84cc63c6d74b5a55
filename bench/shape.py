"""The same-shape reference cycle: a minimal durable queue with Orbit's kind of rows.

``orbit bench tasks`` runs it after the raw cycle (bench/rawqueue.py), on the same server, in
the same scratch database, over the same number of tasks; ``ratio_to_shape`` is Orbit's end to
end throughput over this one (issue 12, target 1). Where the raw cycle moves one row of a
one-index table per task, this cycle writes the rows a real durable queue writes: the task, an
attempt per grant, an append-only event per ending.

Tables (its own, created and dropped here; Chinese COMMENTs like every table):

* ``bench_shape_tasks``: the task, with a claim index ``(state, run_at, id)``;
* ``bench_shape_attempts``: one row per grant, unique ``(task_id, generation)``;
* ``bench_shape_events``: append-only (only ever inserted), one row per finished task.

Each of ``loops`` concurrent sessions (aiomysql, READ COMMITTED, one connection each) repeats
three transactions per claimed batch of up to 32 tasks until nothing is due:

1. **claim**: ``SELECT id, revision, attempts FROM bench_shape_tasks WHERE state = 'WAITING'
   AND run_at <= now ORDER BY run_at, id LIMIT 32 FOR UPDATE SKIP LOCKED``; one ``UPDATE`` of
   those rows to LEASED (revision + 1, attempts + 1, a 30 s lease); one multi-row ``INSERT`` of
   their attempts (generation = the new attempt count, state OFFERED); commit.
2. **start**: one guarded ``UPDATE`` of the batch to RUNNING (``WHERE id IN (…) AND state =
   'LEASED'``, revision + 1, a 60 s lease; every row must match); commit.
3. **finish**: one guarded ``UPDATE`` of the batch to SUCCEEDED (``AND state = 'RUNNING'``,
   revision + 1, lease cleared); one multi-row ``INSERT`` of a ``task.succeeded`` event per
   task; commit.

Multi-row statements are used where a real queue would batch its per-item writes; the guards
check affected rows (the pool's FOUND_ROWS flag makes them matched rows). The figure is
``shape_tasks_per_s``: tasks drained per second, from the first claim to the last commit.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiomysql

from orbit_common.db.pool import DatabaseUrl

BATCH = 32

CREATE = (
    """
CREATE TABLE bench_shape_tasks (
  id BINARY(16) NOT NULL COMMENT '任务 ID（基准测试专用表）',
  state VARCHAR(16) NOT NULL COMMENT '状态：WAITING、LEASED、RUNNING、SUCCEEDED（基准测试专用表）',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本（基准测试专用表）',
  run_at DATETIME(6) NOT NULL COMMENT '可执行时间（基准测试专用表）',
  attempts INT NOT NULL DEFAULT 0 COMMENT '已授予的尝试数（基准测试专用表）',
  lease_until DATETIME(6) NULL COMMENT '租约到期（基准测试专用表）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（基准测试专用表）',
  PRIMARY KEY (id),
  KEY ix_claim (state, run_at, id)
) ENGINE=InnoDB COMMENT='基准测试：同形队列循环的任务表'
""",
    """
CREATE TABLE bench_shape_attempts (
  id BINARY(16) NOT NULL COMMENT '尝试 ID（基准测试专用表）',
  task_id BINARY(16) NOT NULL COMMENT '任务 ID（基准测试专用表）',
  generation INT NOT NULL COMMENT '执行代次（基准测试专用表）',
  state VARCHAR(16) NOT NULL COMMENT '尝试状态（基准测试专用表）',
  offered_at DATETIME(6) NOT NULL COMMENT '授予时间（基准测试专用表）',
  PRIMARY KEY (id),
  UNIQUE KEY uq_attempt (task_id, generation)
) ENGINE=InnoDB COMMENT='基准测试：同形队列循环的尝试表'
""",
    """
CREATE TABLE bench_shape_events (
  id BINARY(16) NOT NULL COMMENT '事件 ID（基准测试专用表）',
  task_id BINARY(16) NOT NULL COMMENT '任务 ID（基准测试专用表）',
  revision BIGINT NOT NULL COMMENT '事件产生后的任务状态版本（基准测试专用表）',
  event_type VARCHAR(64) NOT NULL COMMENT '事件类型（基准测试专用表）',
  occurred_at DATETIME(6) NOT NULL COMMENT '发生时间（基准测试专用表）',
  PRIMARY KEY (id)
) ENGINE=InnoDB COMMENT='基准测试：同形队列循环的只追加事件表'
""",
)
TABLES = ("bench_shape_events", "bench_shape_attempts", "bench_shape_tasks")

CLAIM = (
    "SELECT id, revision, attempts FROM bench_shape_tasks WHERE state = 'WAITING'"
    " AND run_at <= UTC_TIMESTAMP(6) ORDER BY run_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
LEASE = (
    "UPDATE bench_shape_tasks SET state = 'LEASED', revision = revision + 1,"
    " attempts = attempts + 1, lease_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,"
    " updated_at = UTC_TIMESTAMP(6) WHERE id IN ({})"
)
INSERT_ATTEMPTS = ("INSERT INTO bench_shape_attempts (id, task_id, generation, state, offered_at)"
                   " VALUES {}")
ATTEMPT_ROW = "(%s, %s, %s, 'OFFERED', UTC_TIMESTAMP(6))"
START = (
    "UPDATE bench_shape_tasks SET state = 'RUNNING', revision = revision + 1,"
    " lease_until = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND, updated_at = UTC_TIMESTAMP(6)"
    " WHERE id IN ({}) AND state = 'LEASED'"
)
FINISH = (
    "UPDATE bench_shape_tasks SET state = 'SUCCEEDED', revision = revision + 1,"
    " lease_until = NULL, updated_at = UTC_TIMESTAMP(6) WHERE id IN ({}) AND state = 'RUNNING'"
)
INSERT_EVENTS = ("INSERT INTO bench_shape_events (id, task_id, revision, event_type, occurred_at)"
                 " VALUES {}")
EVENT_ROW = "(%s, %s, %s, 'task.succeeded', UTC_TIMESTAMP(6))"


def rows_sql(template: str, count: int) -> str:
    """``template`` repeated ``count`` times, comma-separated (a multi-row VALUES list)."""
    if count < 1:
        raise ValueError("a VALUES list needs at least one row")
    return ", ".join([template] * count)


async def _cycle(conn: Any) -> int:
    """One claim / start / finish round on ``conn``; returns the tasks finished (0: none due)."""
    async with conn.cursor() as cur:
        await cur.execute("START TRANSACTION")
        await cur.execute(CLAIM, (BATCH,))
        found = list(await cur.fetchall())
        if not found:
            await conn.commit()
            return 0
        ids = [row[0] for row in found]
        marks = ", ".join(["%s"] * len(ids))
        await cur.execute(LEASE.format(marks), ids)
        attempts: list[Any] = []
        for task_id, _revision, used in found:
            attempts += [os.urandom(16), task_id, used + 1]
        await cur.execute(INSERT_ATTEMPTS.format(rows_sql(ATTEMPT_ROW, len(ids))), attempts)
        await conn.commit()

        await cur.execute("START TRANSACTION")
        if await cur.execute(START.format(marks), ids) != len(ids):
            raise RuntimeError("shape cycle: a start missed its LEASED row")
        await conn.commit()

        await cur.execute("START TRANSACTION")
        if await cur.execute(FINISH.format(marks), ids) != len(ids):
            raise RuntimeError("shape cycle: a finish missed its RUNNING row")
        events: list[Any] = []
        for task_id, revision, _used in found:
            events += [os.urandom(16), task_id, revision + 3]
        await cur.execute(INSERT_EVENTS.format(rows_sql(EVENT_ROW, len(ids))), events)
        await conn.commit()
    return len(ids)


async def run_shape_cycle(url: DatabaseUrl, tasks: int, loops: int = 4) -> dict[str, Any]:
    """Drain ``tasks`` WAITING tasks through claim/start/finish with ``loops`` sessions."""
    pool = await aiomysql.create_pool(minsize=loops, maxsize=loops + 1, db=url.database,
                                      **url.connect_kwargs())
    try:
        async with pool.acquire() as conn, conn.cursor() as cur:
            for statement in CREATE:  # a fresh scratch database: the tables are new
                await cur.execute(statement)
            rows = [(os.urandom(16),) for _ in range(tasks)]
            for start in range(0, tasks, 1000):
                await cur.executemany(
                    "INSERT INTO bench_shape_tasks (id, state, run_at, updated_at) VALUES"
                    " (%s, 'WAITING', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                    rows[start:start + 1000])
            await conn.commit()
        done = 0

        async def loop() -> None:
            nonlocal done
            async with pool.acquire() as conn:
                await conn.query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                while finished := await _cycle(conn):
                    done += finished

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(loops)))
        elapsed = time.perf_counter() - started
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute("SELECT COUNT(*) FROM bench_shape_tasks WHERE state = 'SUCCEEDED'")
            (succeeded,) = await cur.fetchone()
            await cur.execute("SELECT COUNT(*) FROM bench_shape_attempts")
            (attempts,) = await cur.fetchone()
            await cur.execute("SELECT COUNT(*) FROM bench_shape_events")
            (events,) = await cur.fetchone()
            for table in TABLES:  # fixed names
                await cur.execute(f"DROP TABLE {table}")
        if not succeeded == attempts == events == tasks:
            raise RuntimeError(f"shape cycle: {succeeded} succeeded, {attempts} attempts,"
                               f" {events} events of {tasks} tasks")
        return {"shape_tasks_per_s": round(done / elapsed, 1)}
    finally:
        pool.close()
        await pool.wait_closed()

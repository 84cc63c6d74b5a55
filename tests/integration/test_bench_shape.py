"""``orbit bench tasks``' same-shape reference cycle drains every task through its three rows.

bench/shape.py: claim (LEASED + an attempt), start (RUNNING), finish (SUCCEEDED + an event), in
batches of 32 over several sessions; it checks its own counts before dropping its tables.
"""

from __future__ import annotations

from typing import Any

from bench import shape
from orbit_common.db.pool import DatabaseUrl


async def test_the_shape_cycle_drains_every_task(db_url: DatabaseUrl, sync_conn: Any) -> None:
    result = await shape.run_shape_cycle(db_url, 100, loops=3)  # not a multiple of 32
    assert result["shape_tasks_per_s"] > 0
    with sync_conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.TABLES"
                    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'bench\\_shape\\_%'")
        assert cur.fetchone()[0] == 0  # its own tables, dropped at the end


async def test_one_round_writes_the_three_kinds_of_rows(db_url: DatabaseUrl,
                                                        sync_conn: Any) -> None:
    import aiomysql

    with sync_conn.cursor() as cur:
        for statement in shape.CREATE:
            cur.execute(statement)
        try:
            cur.executemany("INSERT INTO bench_shape_tasks (id, state, run_at, updated_at)"
                            " VALUES (%s, 'WAITING', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                            [(bytes([n]) * 16,) for n in range(1, 41)])
            conn = await aiomysql.connect(db=db_url.database, **db_url.connect_kwargs())
            try:
                assert await shape._cycle(conn) == shape.BATCH
            finally:
                conn.close()
            cur.execute("SELECT state, revision, attempts, COUNT(*) FROM bench_shape_tasks"
                        " GROUP BY state, revision, attempts ORDER BY state")
            assert cur.fetchall() == (("SUCCEEDED", 4, 1, 32), ("WAITING", 1, 0, 8))
            cur.execute("SELECT COUNT(*), MIN(generation), MAX(generation), MIN(state)"
                        " FROM bench_shape_attempts")
            assert cur.fetchone() == (32, 1, 1, "OFFERED")
            cur.execute("SELECT COUNT(*), MIN(revision), MAX(revision), MIN(event_type)"
                        " FROM bench_shape_events")
            assert cur.fetchone() == (32, 4, 4, "task.succeeded")
        finally:
            for table in shape.TABLES:
                cur.execute(f"DROP TABLE IF EXISTS {table}")


def test_rows_sql_repeats_the_row_template() -> None:
    assert shape.rows_sql("(%s, 1)", 3) == "(%s, 1), (%s, 1), (%s, 1)"

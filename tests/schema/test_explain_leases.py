"""The lease protocol's batched UPDATEs reach each row by its full primary key.

They join a derived table of per-row values (orbit_common/db/batch.values_table) to
pulse_tasks / pulse_attempts. Without a pinned join order MariaDB chose, on a small or fresh
table, to read every row of the namespace and probe the derived table per row -- a full
namespace scan per batch. STRAIGHT_JOIN makes the derived table drive; this test checks the
plan on empty tables, the case where the optimizer was most tempted.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from orbit_common.db.batch import values_table
from orbit_common.db.pool import DatabaseUrl, connect_sync
from tests.support import database

MODULES: dict[str, str] = {  # the lease module that owns each statement
    "CLAIM_TASKS": "claim", "START_ATTEMPTS": "start", "START_TASKS": "start",
    "RENEW_ATTEMPTS": "renew", "RENEW_TASKS": "renew", "END_ATTEMPTS": "endings",
    "END_TASKS": "endings",
}
COLUMNS: dict[str, list[str]] = {
    "CLAIM_TASKS": ["id", "revision", "attempt_id", "generation", "expires"],
    "START_ATTEMPTS": ["task_id", "revision", "attempt_id", "expires"],
    "START_TASKS": ["task_id", "revision", "attempt_id", "expires"],
    "RENEW_ATTEMPTS": ["attempt_id", "task_id", "expires"],
    "RENEW_TASKS": ["attempt_id", "task_id", "expires"],
    "END_ATTEMPTS": ["attempt_id", "state", "retryable", "result", "error"],
    "END_TASKS": ["task_id", "revision", "from_state", "attempt_id", "state", "available_at",
                  "uncertain", "reason", "lapse", "result", "error", "cancel", "cancel_reason",
                  "terminal"],
}


@pytest.fixture(scope="module")
def empty_db() -> Iterator[pymysql.connections.Connection[Any]]:
    server = database.server_url()
    name = database.scratch_name("orbit_explain_leases")
    url: DatabaseUrl = database.create_database(server, name)
    conn = connect_sync(url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()
        database.drop_database(server, name)


def _value(column: str, i: int) -> Any:
    if column.endswith("id"):
        return bytes([i]) * 16
    if column in {"expires", "available_at"}:
        return dt.datetime(2030, 1, 1)  # noqa: DTZ001 - a DATETIME(6) value, UTC by convention
    if column in {"state", "reason", "from_state", "cancel_reason"}:
        return "RUNNING"
    if column in {"result", "error"}:
        return "{}"
    return 1


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_batched_update_uses_the_primary_key(
    empty_db: pymysql.connections.Connection[Any], name: str
) -> None:
    module = importlib.import_module(f"orbit_common.pulse.leases.{MODULES[name]}")
    template: str = getattr(module, name)
    columns = COLUMNS[name]
    table, values = values_table(columns, [[_value(c, i) for c in columns] for i in (1, 2)])
    sql = template.format(table=table)
    extra = sql.count("%s") - len(values) - 1  # parameters after the namespace id
    with empty_db.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("EXPLAIN " + sql, (*values, bytes(16), *[_value("expires", 0)] * extra))
        plan = cur.fetchall()
    target = next(row for row in plan if row["table"] in {"t", "a"})
    assert target["type"] == "eq_ref", plan
    assert target["key"] == "PRIMARY", plan
    order = [row["table"] for row in plan if row["table"]]
    assert order.index(target["table"]) > order.index(next(t for t in order if "derived" in t))

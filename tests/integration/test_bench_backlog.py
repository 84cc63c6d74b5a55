"""``orbit bench tasks --backlog``: the backlog is valid queued work that stays queued.

bench/backlog.py writes what a submission writes for a WAITING task (the task row, its
``task.accepted`` event, the queue's and a tracked application's counters), half in other queues
and half behind the measured tasks of the measured queues. A claim of a measured queue takes the
measured tasks and none of the backlog.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from bench import backlog
from bench.kernelcycle import run_kernel_cycle
from orbit_common.db.pool import Database, DatabaseUrl
from tests.conftest import Tenant
from tests.support.lease_fixtures import (
    add_tasks,
    application_counters,
    db_time,
    make_queue,
    queue_counters,
    scalar,
    set_application_limits,
)

TOTAL = 1_001  # odd: the halves and the per-queue shares have remainders


@pytest.mark.parametrize("count", [1, 9, 10, 11, 1000, 12_345])
def test_the_sequence_is_every_integer_below_count(sync_conn: Any, count: int) -> None:
    with sync_conn.cursor() as cur:
        cur.execute("SELECT COUNT(*), COUNT(DISTINCT s.n), MIN(s.n), MAX(s.n) FROM "
                    + backlog.sequence_sql(count))
        assert cur.fetchone() == (count, count, 0, count - 1)


async def test_the_backlog_is_queued_work_that_the_measured_claims_leave_alone(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
) -> None:
    same = [await make_queue(db, tenant, name=name) for name in ("kernel", "bench")]
    other = [await make_queue(db, tenant, name=f"backlog-{n}") for n in range(3)]
    await set_application_limits(db, tenant, max_unfinished_tasks=10 * TOTAL)  # tracked
    measured = await add_tasks(db, tenant, same[1], 40)  # more than one claim batch
    now = await db_time(db)

    result = backlog.seed(db_url, tenant.namespace, [q.name for q in other],
                          [q.name for q in same], TOTAL)

    shares = result["backlog_shares"]
    assert sum(shares.values()) == TOTAL
    assert sum(shares[q.name] for q in other) == TOTAL - TOTAL // 2
    for queue in [*same, *other]:
        extra = len(measured) if queue is same[1] else 0
        assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
                            " AND queue_id = %s AND state = 'WAITING'", tenant.namespace_id,
                            queue.id) == shares[queue.name] + extra
        assert (await queue_counters(db, tenant, queue.id))["unfinished_tasks"] == (
            shares[queue.name] + extra)
    assert (await application_counters(db, tenant))["unfinished_tasks"] == TOTAL + len(measured)

    # One task.accepted event per backlog task, its payload the task's receipt.
    events = await _rows(db, "SELECT t.id, t.priority, e.payload, e.occurred_at, t.created_at"
                             " FROM pulse_tasks t JOIN orbit_events e"
                             " ON e.namespace_id = t.namespace_id AND e.aggregate_type = 'task'"
                             " AND e.aggregate_id = t.id AND e.event_type = 'task.accepted'"
                             " WHERE t.namespace_id = %s", tenant.namespace_id)
    assert len(events) == TOTAL
    for row in events[:50]:
        receipt = json.loads(row["payload"])
        assert receipt["id"] == row["id"].hex()
        assert receipt["state"] == "WAITING"
        assert receipt["priority"] == row["priority"]
        assert receipt["rerun_safe"] is False
        assert row["occurred_at"] == row["created_at"]

    # The other queues' backlog is due, over every priority, a quarter with a later deadline.
    due = await _rows(db, "SELECT available_at, priority, deadline_at FROM pulse_tasks"
                          " WHERE namespace_id = %s AND queue_id IN (%s, %s, %s)",
                      tenant.namespace_id, *[q.id for q in other])
    assert all(r["available_at"] <= now for r in due)
    assert {r["priority"] for r in due} == set(range(10))
    with_deadline = [r for r in due if r["deadline_at"] is not None]
    assert len(due) // 4 - 3 <= len(with_deadline) <= len(due) // 4 + 3
    assert all(r["deadline_at"] > now + dt.timedelta(hours=23) for r in with_deadline)

    # The measured queue drains its own tasks; the backlog behind them stays WAITING.
    claimed = await run_kernel_cycle(db_url, tenant.api_key, tenant.namespace, "bench",
                                     tasks=len(measured), loops=1)
    assert claimed["kernel_tasks"] == len(measured)
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
                        " AND queue_id = %s AND state = 'SUCCEEDED' AND id IN ("
                        + ", ".join(["%s"] * len(measured)) + ")", tenant.namespace_id,
                        same[1].id, *measured) == len(measured)
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
                        " AND state = 'WAITING'", tenant.namespace_id) == TOTAL
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempts WHERE namespace_id = %s",
                        tenant.namespace_id) == len(measured)


async def _rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]

    return await db.read("test.rows", body)


def test_split_halves_the_backlog_between_other_and_measured_queues() -> None:
    assert backlog.split(10, ["a", "b"], ["k", "m"]) == {"a": 3, "b": 2, "k": 3, "m": 2}
    assert backlog.split(7, ["a"], ["k", "m"]) == {"a": 4, "k": 2, "m": 1}
    assert backlog.split(0, ["a"], ["k"]) == {"a": 0, "k": 0}
    with pytest.raises(ValueError, match="backlog"):
        backlog.split(5, [], ["k"])

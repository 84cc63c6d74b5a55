"""The usage reads use their indexes (DESIGN §7: every hot query under EXPLAIN).

The backlog of a queue is read from the claim index ``ix_tasks_claim`` alone (no table rows, no
sort), and the application's resource row by its primary key. The statements are the production
constants, EXPLAINed with real parameter values on a database holding thousands of tasks over
several namespaces, queues, states and priorities.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.pulse import quotas, usage
from tests.schema.test_explain import explain
from tests.support import migrations, pulse

NAMESPACES = 4
QUEUES_PER_NAMESPACE = 6
TASKS_PER_QUEUE = 150
STATES = ("WAITING", "WAITING", "WAITING", "SUCCEEDED", "FAILED", "CANCELLED")
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@attrs.frozen(kw_only=True)
class UsageSeed:
    namespace_id: bytes
    queue_id: bytes
    application_id: bytes


def seed(cur: Any) -> UsageSeed:
    task_rows, queue_rows, gate_rows = [], [], []
    for _ns in range(NAMESPACES):
        namespace_id = secrets.token_bytes(16)
        for q in range(QUEUES_PER_NAMESPACE):
            queue_id, gate, queue = pulse.queue_rows(namespace_id, f"queue-{q}")
            gate_rows.append(gate)
            queue_rows.append(queue)
            for n in range(TASKS_PER_QUEUE):
                # Half due, half in the future; every priority.
                available = to_db(NOW + dt.timedelta(seconds=(n % 2) * 3600 - n))
                terminal = STATES[n % len(STATES)] != "WAITING"
                task_rows.append((namespace_id, secrets.token_bytes(16), queue_id,
                                  STATES[n % len(STATES)], n % 10, available,
                                  available if terminal else None))
    cur.executemany(pulse.INSERT_GATE, gate_rows)
    cur.executemany(pulse.INSERT_QUEUE, queue_rows)
    cur.executemany(
        "INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, priority,"
        " available_at, completed_at, max_attempts, retry_initial_ms, retry_max_ms,"
        " retry_multiplier, retry_jitter, offer_lease_ms, execution_lease_ms, rerun_safe,"
        " created_at, updated_at) VALUES (%s, %s, %s, 'h', '{}', %s, %s, %s, %s, 3, 1000,"
        " 60000, 2, 0.2, 30000, 60000, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        task_rows,
    )
    app_ids = [secrets.token_bytes(16) for _ in range(300)]
    cur.executemany("INSERT INTO orbit_applications (id, name, state, revision, created_at,"
                    " updated_at) VALUES (%s, %s, 'ACTIVE', 1, UTC_TIMESTAMP(6),"
                    " UTC_TIMESTAMP(6))", [(a, f"app-{a.hex()}") for a in app_ids])
    cur.executemany("INSERT INTO orbit_application_resources (application_id, updated_at)"
                    " VALUES (%s, UTC_TIMESTAMP(6))", [(a,) for a in app_ids])
    for table in ("pulse_tasks", "pulse_queues", "orbit_applications",
                  "orbit_application_resources"):  # fixed names
        cur.execute(f"ANALYZE TABLE {table}")
        cur.fetchall()
    middle = task_rows[len(task_rows) // 2]
    return UsageSeed(namespace_id=middle[0], queue_id=middle[2],
                     application_id=app_ids[len(app_ids) // 2])


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, UsageSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def _at(seconds: int = 0) -> dt.datetime:
    return to_db(NOW + dt.timedelta(seconds=seconds))


BACKLOG_READS = {
    "usage.OLDEST_HEAD": (usage.OLDEST_HEAD, lambda s: (s.namespace_id, s.queue_id, _at(),
                                                        _at())),
    "usage.OLDEST_IN_WINDOW": (usage.OLDEST_IN_WINDOW,
                               lambda s: (s.namespace_id, s.queue_id, _at(-400), _at(-130),
                                          _at())),
    "usage.DUE_COUNT": (usage.DUE_COUNT, lambda s: (s.namespace_id, s.queue_id, _at(), _at())),
}


@pytest.mark.parametrize("name", list(BACKLOG_READS))
def test_the_backlog_is_read_from_the_claim_index_alone(
    seeded: tuple[DatabaseUrl, UsageSeed], name: str,
) -> None:
    url, s = seeded
    sql, params = BACKLOG_READS[name]
    plan = explain(url, sql, params(s))
    text = "\n".join(map(str, plan))
    (row,) = plan
    assert row["key"] == "ix_tasks_claim", text
    assert row["type"] == "range", text
    extra = row["Extra"] or ""
    assert "Using index" in extra, text  # covered: no table row is read
    assert "filesort" not in extra, text
    assert "temporary" not in extra, text
    # Bounded by one queue's WAITING tasks, never the table.
    assert int(row["rows"]) <= TASKS_PER_QUEUE, text


PRIMARY_KEY_READS = {
    "quotas.SELECT_RESOURCES": (quotas.SELECT_RESOURCES, lambda s: (s.application_id,),
                                {"r": "PRIMARY", "a": "PRIMARY"}),
    "quotas.UPDATE_LIMITS_IF_REVISION": (
        quotas.UPDATE_LIMITS_IF_REVISION,
        lambda s: (None, None, None, None, s.application_id, 1),
        {"orbit_application_resources": "PRIMARY"}),
}


@pytest.mark.parametrize("name", list(PRIMARY_KEY_READS))
def test_the_application_row_is_reached_by_its_primary_key(
    seeded: tuple[DatabaseUrl, UsageSeed], name: str,
) -> None:
    url, s = seeded
    sql, params, keys = PRIMARY_KEY_READS[name]
    plan = explain(url, sql, params(s))
    assert {row["table"]: row["key"] for row in plan} == keys, plan

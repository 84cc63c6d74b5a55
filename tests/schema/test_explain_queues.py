"""The queue queries use their indexes (DESIGN §7: every hot query is checked with EXPLAIN).

The statements are the production constants of ``orbit_common.pulse.queues``, EXPLAINed with
real parameter values on a database holding a thousand queues (and their gates) spread over many
namespaces, so a table scan is never the cheap choice.
"""

from __future__ import annotations

import decimal
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.pool import DatabaseUrl
from orbit_common.pulse import queues
from tests.schema.test_explain import explain
from tests.support import migrations

NAMESPACES = 40
QUEUES_PER_NAMESPACE = 25
SEEDED_TABLES = ("pulse_queues", "pulse_execution_gates", "orbit_events")


@attrs.frozen(kw_only=True)
class QueueSeed:
    namespace_id: bytes
    queue_id: bytes
    queue_name: str
    gate_id: bytes


@attrs.frozen(kw_only=True)
class HotQuery:
    name: str
    sql: str
    params: Any  # Callable[[QueueSeed], tuple[Any, ...]]
    keys: dict[str, str]  # EXPLAIN's table (or alias) → the index it must use


HOT_QUERIES = (
    HotQuery(name="queues.SELECT_BY_NAME", sql=queues.SELECT_BY_NAME,
             params=lambda s: (s.namespace_id, s.queue_name),
             keys={"q": "uq_queues_name", "g": "PRIMARY"}),
    HotQuery(name="queues.LIST_BY_NAME (first page)", sql=queues.LIST_BY_NAME,
             params=lambda s: (s.namespace_id, "", 101),
             keys={"q": "uq_queues_name", "g": "PRIMARY"}),
    HotQuery(name="queues.LIST_BY_NAME (after a cursor)", sql=queues.LIST_BY_NAME,
             params=lambda s: (s.namespace_id, s.queue_name, 11),
             keys={"q": "uq_queues_name", "g": "PRIMARY"}),
    HotQuery(name="queues.SELECT_BY_ID", sql=queues.SELECT_BY_ID,
             params=lambda s: (s.namespace_id, s.queue_id),
             keys={"q": "PRIMARY", "g": "PRIMARY"}),
    HotQuery(name="queues.SELECT_ID_SHARED", sql=queues.SELECT_ID_SHARED,
             params=lambda s: (s.namespace_id, s.queue_id),
             keys={"pulse_queues": "PRIMARY"}),
    HotQuery(name="queues.SELECT_GATE_FOR_UPDATE", sql=queues.SELECT_GATE_FOR_UPDATE,
             params=lambda s: (s.namespace_id, s.gate_id),
             keys={"pulse_execution_gates": "PRIMARY"}),
    HotQuery(name="queues.SELECT_UPDATE_EVENT_SHARED", sql=queues.SELECT_UPDATE_EVENT_SHARED,
             params=lambda s: (s.namespace_id, s.queue_id, 2),
             keys={"orbit_events": "uq_events_transition"}),
)
# The guarded writes go through the primary key, never a scan that would lock a range.
GUARDED_WRITES = (
    HotQuery(name="queues.UPDATE_SETTINGS_IF_REVISION", sql=queues.UPDATE_SETTINGS_IF_REVISION,
             params=lambda s: ("", 30000, 60000, 3, 1000, 60000, decimal.Decimal(2),
                               decimal.Decimal("0.2"), None, None, None, s.namespace_id,
                               s.queue_id, 1),
             keys={"pulse_queues": "PRIMARY"}),
    HotQuery(name="queues.SET_GATE_STATE_IF_REVISION", sql=queues.SET_GATE_STATE_IF_REVISION,
             params=lambda s: ("PAUSED", None, s.namespace_id, s.gate_id, "OPEN", 1),
             keys={"pulse_execution_gates": "PRIMARY"}),
)


def seed(cur: Any) -> QueueSeed:
    settings = queues.QueueSettings()
    retry = settings.retry
    gate_rows, queue_rows, event_rows = [], [], []
    picked: QueueSeed | None = None
    for n in range(NAMESPACES):
        namespace_id = secrets.token_bytes(16)
        for q in range(QUEUES_PER_NAMESPACE):
            queue_id, gate_id = secrets.token_bytes(16), secrets.token_bytes(16)
            name = f"queue-{q:03d}"
            gate_rows.append((namespace_id, gate_id, queue_id))
            queue_rows.append((namespace_id, queue_id, name, gate_id, "", settings.offer_lease_ms,
                               settings.execution_lease_ms, retry.max_attempts, retry.initial_ms,
                               retry.max_ms, retry.multiplier, retry.jitter, None, None,
                               None))
            for revision, event_type in ((1, "queue.created"), (2, "queue.updated")):
                event_rows.append((namespace_id, secrets.token_bytes(16), queue_id, revision,
                                   event_type))
            if n == NAMESPACES // 2 and q == QUEUES_PER_NAMESPACE // 2:
                picked = QueueSeed(namespace_id=namespace_id, queue_id=queue_id,
                                   queue_name=name, gate_id=gate_id)
    cur.executemany(queues.INSERT_GATE, gate_rows)
    cur.executemany(queues.INSERT_QUEUE, queue_rows)
    cur.executemany(
        "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
        " aggregate_revision, event_type, payload, occurred_at)"
        " VALUES (%s, %s, 'queue', %s, %s, %s, '{}', UTC_TIMESTAMP(6))",
        event_rows,
    )
    for table in SEEDED_TABLES:  # fixed names above
        cur.execute(f"ANALYZE TABLE {table}")
        cur.fetchall()
    assert picked is not None
    return picked


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, QueueSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def test_the_seed_is_large_enough(seeded: tuple[DatabaseUrl, QueueSeed]) -> None:
    url, _ = seeded
    for table in SEEDED_TABLES:
        (row,) = migrations.query(url, f"SELECT COUNT(*) AS n FROM {table}")
        assert row["n"] >= NAMESPACES * QUEUES_PER_NAMESPACE, table


@pytest.mark.parametrize("hot", HOT_QUERIES + GUARDED_WRITES,
                         ids=[q.name for q in HOT_QUERIES + GUARDED_WRITES])
def test_queue_query_uses_its_index(
    seeded: tuple[DatabaseUrl, QueueSeed], hot: HotQuery
) -> None:
    url, values = seeded
    plan = explain(url, hot.sql, hot.params(values))
    used = {row["table"]: row["key"] for row in plan}
    assert used == hot.keys, f"{hot.name}: EXPLAIN says\n" + "\n".join(map(str, plan))
    filesorts = [row for row in plan if "filesort" in (row["Extra"] or "")]
    assert not filesorts, f"{hot.name} sorts instead of reading in index order: {filesorts}"
    temporary = [row for row in plan if "temporary" in (row["Extra"] or "")]
    assert not temporary, f"{hot.name} builds a temporary table: {temporary}"


def test_the_list_reads_only_its_namespace(seeded: tuple[DatabaseUrl, QueueSeed]) -> None:
    # The keyset range is (namespace_id, name > ?): the estimate is bounded by one namespace's
    # queues, not the table.
    url, values = seeded
    plan = explain(url, queues.LIST_BY_NAME, (values.namespace_id, "", 101))
    (queue_row,) = [row for row in plan if row["table"] == "q"]
    assert queue_row["type"] == "range"
    assert int(queue_row["rows"]) <= 2 * QUEUES_PER_NAMESPACE, queue_row

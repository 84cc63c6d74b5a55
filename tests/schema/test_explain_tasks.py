"""The task queries use their indexes: all eight filter combinations of the list, and the reads of
one task, its attempts, events and late evidence (DESIGN §7: every hot query under EXPLAIN).

The statements are the production constants, EXPLAINed with real parameter values on a database
holding thousands of tasks over several namespaces, queues, states and business keys.
"""

from __future__ import annotations

import datetime as dt
import itertools
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.batch import placeholders
from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.platform import idempotency
from orbit_common.pulse import queries, tasks
from tests.schema.test_explain import explain
from tests.support import migrations, pulse

NAMESPACES = 4
QUEUES_PER_NAMESPACE = 6
TASKS_PER_QUEUE = 150
STATES = ("WAITING", "WAITING", "WAITING", "SUCCEEDED", "FAILED", "CANCELLED", "RUNNING")
SEEDED_TABLES = ("pulse_tasks", "pulse_queues", "pulse_attempts", "pulse_attempt_evidence",
                 "orbit_events", "orbit_idempotency_keys")


@attrs.frozen(kw_only=True)
class TaskSeed:
    namespace_id: bytes
    queue_id: bytes
    queue_name: str
    task_id: bytes
    attempt_id: bytes
    business_key: bytes
    created_at: dt.datetime
    idempotency_identity: tuple[bytes, bytes]


def _task_row(namespace_id: bytes, queue_id: bytes, n: int, created: dt.datetime,
              key: bytes | None) -> tuple[Any, ...]:
    state = STATES[n % len(STATES)]
    terminal = state in {"SUCCEEDED", "FAILED", "CANCELLED"}
    live = state == "RUNNING"
    return (
        namespace_id, secrets.token_bytes(16), queue_id, "h", "{}", state, n % 10, created, key,
        secrets.token_bytes(16) if live else None, created if live else None,
        created if terminal else None, created, created,
    )


def seed(cur: Any) -> TaskSeed:
    base = to_db(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))  # DATETIME(6) parameters are naive UTC
    tasks_rows, queue_rows, gate_rows = [], [], []
    for ns in range(NAMESPACES):
        namespace_id = secrets.token_bytes(16)
        for q in range(QUEUES_PER_NAMESPACE):
            queue_id, gate, queue = pulse.queue_rows(namespace_id, f"queue-{q}")
            gate_rows.append(gate)
            queue_rows.append(queue)
            for n in range(TASKS_PER_QUEUE):
                created = base + dt.timedelta(seconds=n, microseconds=ns * 1000 + q)
                # A few tasks per business key; most tasks have none.
                key = f"order-{n // 3}".encode() if n % 5 == 0 else None
                tasks_rows.append(_task_row(namespace_id, queue_id, n, created, key))
    cur.executemany(pulse.INSERT_GATE, gate_rows)
    cur.executemany(pulse.INSERT_QUEUE, queue_rows)
    cur.executemany(
        "INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, priority,"
        " available_at, business_key, current_attempt_id, lease_expires_at, completed_at,"
        " max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter,"
        " offer_lease_ms, execution_lease_ms, rerun_safe, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 3, 1000, 60000, 2, 0.2, 30000,"
        " 60000, 0, %s, %s)",
        tasks_rows,
    )
    attempt_rows, evidence_rows, event_rows, idem_rows = [], [], [], []
    for row in tasks_rows[::3]:
        namespace_id, task_id, queue_id = row[0], row[1], row[2]
        attempt_id = secrets.token_bytes(16)
        attempt_rows.append((namespace_id, attempt_id, task_id, queue_id))
        evidence_rows.append((namespace_id, secrets.token_bytes(16), attempt_id, task_id))
        event_rows.append((namespace_id, secrets.token_bytes(16), task_id))
        idem_rows.append((namespace_id, secrets.token_bytes(16), b"queue-0",
                          secrets.token_bytes(8), task_id))
    cur.executemany(
        "INSERT INTO pulse_attempts (namespace_id, id, task_id, queue_id, generation,"
        " token_digest, worker_instance_id, worker_session_id, state, offered_at, started_at,"
        " lease_expires_at, finished_at) VALUES (%s, %s, %s, %s, 1, REPEAT('x', 32),"
        " REPEAT('w', 16), REPEAT('s', 16), 'FAILED', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),"
        " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        attempt_rows,
    )
    cur.executemany(
        "INSERT INTO pulse_attempt_evidence (namespace_id, id, attempt_id, task_id, generation,"
        " kind, payload, rejected_because, received_at) VALUES (%s, %s, %s, %s, 1, 'UNKNOWN',"
        " '{}', 'attempt_finished', UTC_TIMESTAMP(6))",
        evidence_rows,
    )
    cur.executemany(
        "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
        " aggregate_revision, event_type, to_state, payload, occurred_at) VALUES (%s, %s,"
        " 'task', %s, 1, 'task.accepted', 'WAITING', '{}', UTC_TIMESTAMP(6))",
        event_rows,
    )
    cur.executemany(
        "INSERT INTO orbit_idempotency_keys (namespace_id, id, operation, scope, idem_key,"
        " request_digest, credential_id, resource_id, response_status, response_body,"
        " created_at, expires_at) VALUES (%s, %s, 'tasks.submit', %s, %s, REPEAT('d', 32),"
        " REPEAT('c', 16), %s, 201, '{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)",
        idem_rows,
    )
    for table in SEEDED_TABLES:  # fixed names above
        cur.execute(f"ANALYZE TABLE {table}")
        cur.fetchall()
    # A row from the middle: its namespace, queue, key and time.
    middle = tasks_rows[len(tasks_rows) // 2 + 5 * 3]
    attempt = attempt_rows[len(attempt_rows) // 2]
    idem = idem_rows[len(idem_rows) // 2]
    ns_queues = [q for q in queue_rows if q[0] == middle[0]]
    queue = next(q for q in ns_queues if q[1] == middle[2])
    return TaskSeed(
        namespace_id=middle[0], queue_id=middle[2], queue_name=queue[2], task_id=middle[1],
        attempt_id=attempt[1], business_key=middle[8] or b"order-1",
        created_at=middle[12], idempotency_identity=(idem[0], idem[3]),
    )


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, TaskSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def _plan(url: DatabaseUrl, sql: str, params: tuple[Any, ...]) -> tuple[dict[str, Any], str]:
    plan = explain(url, sql, params)
    used = {row["table"]: row["key"] for row in plan}
    return used, "\n".join(map(str, plan))


def _assert_no_sort(url: DatabaseUrl, sql: str, params: tuple[Any, ...]) -> None:
    plan = explain(url, sql, params)
    sorts = [row for row in plan if "filesort" in (row["Extra"] or "")
             or "temporary" in (row["Extra"] or "")]
    assert not sorts, sorts


def test_the_seed_is_large_enough(seeded: tuple[DatabaseUrl, TaskSeed]) -> None:
    url, _ = seeded
    (row,) = migrations.query(url, "SELECT COUNT(*) AS n FROM pulse_tasks")
    assert row["n"] >= 3000


COMBINATIONS = list(itertools.product((False, True), repeat=3))
EXPECTED_INDEX = {
    (False, False, False): "ix_tasks_created",
    (True, False, False): "ix_tasks_queue_created",
    (False, True, False): "ix_tasks_state_created",
    (True, True, False): "ix_tasks_queue_state_created",
}


@pytest.mark.parametrize("first_page", [True, False], ids=["first-page", "after-cursor"])
@pytest.mark.parametrize(
    "combination", COMBINATIONS,
    ids=["+".join(n for n, on in zip(("queue", "state", "business_key"), c, strict=True) if on)
         or "none" for c in COMBINATIONS],
)
def test_every_list_filter_combination_reads_its_index_in_order(
    seeded: tuple[DatabaseUrl, TaskSeed], combination: tuple[bool, bool, bool], first_page: bool
) -> None:
    url, s = seeded
    queue, state, business_key = combination
    sql = queries.LIST_SQL[combination]
    head: list[Any] = [s.namespace_id]
    head += [s.queue_id] if queue else []
    head += ["WAITING"] if state else []
    head += [s.business_key] if business_key else []
    at, last = ((to_db(queries.TIME_MAX), queries.ID_MAX) if first_page
                else (s.created_at, s.task_id))
    params = (*head, to_db(queries.TIME_MIN), at, at, last, 100)
    used, plan = _plan(url, sql, params)
    expected = "ix_tasks_business_key" if business_key else EXPECTED_INDEX[combination]
    assert used == {"t": expected, "q": "PRIMARY"}, plan
    _assert_no_sort(url, sql, params)


def test_the_created_range_narrows_the_index_read(seeded: tuple[DatabaseUrl, TaskSeed]) -> None:
    url, s = seeded
    sql = queries.LIST_SQL[(True, True, False)]
    params = (s.namespace_id, s.queue_id, "WAITING", s.created_at - dt.timedelta(seconds=5),
              s.created_at, s.created_at, queries.ID_MIN, 100)
    used, plan = _plan(url, sql, params)
    assert used == {"t": "ix_tasks_queue_state_created", "q": "PRIMARY"}, plan
    (t_row,) = [row for row in explain(url, sql, params) if row["table"] == "t"]
    assert t_row["type"] == "range", plan
    assert int(t_row["rows"]) < 50, plan


ONE_ROW_READS = {
    "queries.SELECT_TASK": (queries.SELECT_TASK,
                            lambda s: (s.namespace_id, s.task_id),
                            {"t": "PRIMARY", "q": "PRIMARY"}),
    "queries.SELECT_ATTEMPTS": (queries.SELECT_ATTEMPTS,
                                lambda s: (s.namespace_id, s.task_id, 0, 100),
                                {"a": "uq_attempts_generation"}),
    "queries.SELECT_EVENTS": (queries.SELECT_EVENTS,
                              lambda s: (s.namespace_id, s.task_id, to_db(queries.TIME_MIN),
                                         to_db(queries.TIME_MIN), queries.ID_MIN, 100),
                              {"orbit_events": "ix_events_aggregate"}),
    "queries.SELECT_ATTEMPT_TASK": (queries.SELECT_ATTEMPT_TASK,
                                    lambda s: (s.namespace_id, s.attempt_id),
                                    {"pulse_attempts": "PRIMARY"}),
    "queries.SELECT_EVIDENCE": (queries.SELECT_EVIDENCE,
                                lambda s: (s.namespace_id, s.attempt_id,
                                           to_db(queries.TIME_MIN), to_db(queries.TIME_MIN),
                                           queries.ID_MIN, 100),
                                {"pulse_attempt_evidence": "ix_evidence_attempt"}),
    "tasks.QUEUES_BY_NAME": (tasks.QUEUES_BY_NAME.format(placeholders(2)),
                             lambda s: (s.namespace_id, s.queue_name, "queue-1"),
                             {"q": "uq_queues_name"}),
    "tasks.TASK_EXISTS": (tasks.TASK_EXISTS, lambda s: (s.namespace_id, s.task_id),
                          {"pulse_tasks": "PRIMARY"}),
    "idempotency.SELECT_IDENTITY (tasks.submit)": (
        idempotency.SELECT_IDENTITY,
        lambda s: (s.idempotency_identity[0], "tasks.submit", b"queue-0",
                   s.idempotency_identity[1]),
        {"orbit_idempotency_keys": "uq_idempotency_identity"}),
}


@pytest.mark.parametrize("name", list(ONE_ROW_READS))
def test_task_reads_use_their_index(seeded: tuple[DatabaseUrl, TaskSeed], name: str) -> None:
    url, s = seeded
    sql, params, keys = ONE_ROW_READS[name]
    used, plan = _plan(url, sql, params(s))
    assert used == keys, plan
    _assert_no_sort(url, sql, params(s))


def test_the_batch_idempotency_read_uses_the_identity_index(
    seeded: tuple[DatabaseUrl, TaskSeed],
) -> None:
    url, s = seeded
    namespace_id, key = s.idempotency_identity
    where = " OR ".join([idempotency.IDENTITY_GROUP.format(placeholders(3))] * 2)
    sql = idempotency.SELECT_IDENTITIES.format(where)
    params = (namespace_id, "tasks.submit", b"queue-0", key, b"k2", b"k3",
              b"queue-1", b"k4", b"k5", b"k6")
    used, plan = _plan(url, sql, params)
    assert used == {"orbit_idempotency_keys": "uq_idempotency_identity"}, plan

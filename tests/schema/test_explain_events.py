"""The event and task-state indexes of migration 0014 serve the reads that need them (DESIGN §7:
every hot query under EXPLAIN): a workflow's timeline (``ix_events_workflow``), the event-type
sampler (``ix_events_type``), and tasks of one state in ``available_at`` / ``completed_at``
order (``ix_tasks_state_available`` / ``ix_tasks_state_completed``). Each reads its index in
order (no sort) and only the rows it returns, on a database holding thousands of events and
tasks over several namespaces, workflows, event types and states.

Also proves the generated ``workflow_id``: the payload's 32-hex ``workflow_id`` decoded to its
16 bytes, NULL for anything else, and no payload makes an insert fail.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.platform import events
from orbit_common.pulse import queries
from orbit_common.pulse.leases import recovery
from tests.schema.test_explain import explain
from tests.support import migrations, pulse

NAMESPACES = 4
WORKFLOWS_PER_NAMESPACE = 40
EVENTS_PER_WORKFLOW = 12
PLAIN_EVENTS = 3000  # events of tasks outside any workflow
EVENT_TYPES = ("task.accepted", "task.leased", "task.started", "task.succeeded",
               "task.failed", "workflow.step_completed", "namespace.created", "queue.paused")
TASKS = 4000
STATES = ("WAITING", "WAITING", "SUCCEEDED", "FAILED", "CANCELLED", "RUNNING", "NEEDS_REVIEW")
BASE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PAGE = 50


@attrs.frozen(kw_only=True)
class EventSeed:
    namespace_id: bytes
    workflow_id: bytes
    task_namespace_id: bytes
    queue_id: bytes


def _event(namespace_id: bytes, n: int, payload: dict[str, Any]) -> tuple[Any, ...]:
    return (namespace_id, secrets.token_bytes(16), secrets.token_bytes(16),
            EVENT_TYPES[n % len(EVENT_TYPES)], json.dumps(payload),
            to_db(BASE + dt.timedelta(milliseconds=n * 7)))


def seed(cur: Any) -> EventSeed:
    rows = []
    workflows = []
    n = 0
    for _ in range(NAMESPACES):
        namespace_id = secrets.token_bytes(16)
        for _ in range(WORKFLOWS_PER_NAMESPACE):
            workflow_id = secrets.token_bytes(16)
            workflows.append((namespace_id, workflow_id))
            for _ in range(EVENTS_PER_WORKFLOW):
                rows.append(_event(namespace_id, n, {"workflow_id": workflow_id.hex()}))
                n += 1
        for _ in range(PLAIN_EVENTS // NAMESPACES):
            rows.append(_event(namespace_id, n, {"state": "WAITING"}))
            n += 1
    cur.executemany(
        "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
        " aggregate_revision, event_type, to_state, payload, occurred_at)"
        " VALUES (%s, %s, 'task', %s, 1, %s, NULL, %s, %s)", rows)
    namespace_id = secrets.token_bytes(16)
    queue_id, gate, queue = pulse.queue_rows(namespace_id, "queue-0")
    cur.execute(pulse.INSERT_GATE, gate)
    cur.execute(pulse.INSERT_QUEUE, queue)
    task_rows = []
    for i in range(TASKS):
        state = STATES[i % len(STATES)]
        at = to_db(BASE + dt.timedelta(seconds=i))
        terminal = state in {"SUCCEEDED", "FAILED", "CANCELLED"}
        live = state == "RUNNING"
        task_rows.append((namespace_id, secrets.token_bytes(16), queue_id, state, at,
                          at if terminal else None, secrets.token_bytes(16) if live else None,
                          at if live else None))
    cur.executemany(
        "INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state,"
        " available_at, completed_at, current_attempt_id, lease_expires_at, max_attempts,"
        " retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter, offer_lease_ms,"
        " execution_lease_ms, rerun_safe, created_at, updated_at) VALUES (%s, %s, %s, 'h',"
        " '{}', %s, %s, %s, %s, %s, 3, 1000, 60000, 2, 0.2, 30000, 60000, 0,"
        " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", task_rows)
    for table in ("orbit_events", "pulse_tasks"):  # fixed names
        cur.execute(f"ANALYZE TABLE {table}")
        cur.fetchall()
    middle = workflows[len(workflows) // 2]
    return EventSeed(namespace_id=middle[0], workflow_id=middle[1],
                     task_namespace_id=namespace_id, queue_id=queue_id)


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, EventSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def _start() -> tuple[Any, ...]:
    """The first page's position: before every row."""
    return (to_db(queries.TIME_MIN), to_db(queries.TIME_MIN), queries.ID_MIN)


def _middle() -> tuple[Any, ...]:
    at = to_db(BASE + dt.timedelta(seconds=TASKS // 2))
    return (at, at, queries.ID_MIN)


# name → (statement, its parameters, the index it must read, at most this many rows or None)
READS: dict[str, tuple[str, Callable[[EventSeed], tuple[Any, ...]], str, int | None]] = {
    "events.SELECT_WORKFLOW_TIMELINE": (
        events.SELECT_WORKFLOW_TIMELINE,
        lambda s: (s.namespace_id, s.workflow_id, *_start(), PAGE),
        "ix_events_workflow", 2 * EVENTS_PER_WORKFLOW),
    "events.SELECT_BY_TYPE": (
        events.SELECT_BY_TYPE,
        lambda s: ("workflow.step_completed", *_middle(), PAGE),
        "ix_events_type", None),
    "queries.SELECT_BY_STATE_AVAILABLE": (
        queries.SELECT_BY_STATE_AVAILABLE,
        lambda s: ("WAITING", *_middle(), PAGE),
        "ix_tasks_state_available", None),
    "queries.SELECT_BY_STATE_COMPLETED": (
        queries.SELECT_BY_STATE_COMPLETED,
        lambda s: ("SUCCEEDED", *_middle(), PAGE),
        "ix_tasks_state_completed", None),
}


def test_the_seed_is_large_enough(seeded: tuple[DatabaseUrl, EventSeed]) -> None:
    url, _ = seeded
    (row,) = migrations.query(url, "SELECT COUNT(*) AS n FROM orbit_events")
    assert row["n"] >= 4000
    (row,) = migrations.query(url, "SELECT COUNT(*) AS n FROM pulse_tasks")
    assert row["n"] >= TASKS


@pytest.mark.parametrize("name", list(READS))
def test_the_read_uses_its_index_in_order(
    seeded: tuple[DatabaseUrl, EventSeed], name: str,
) -> None:
    url, s = seeded
    sql, params, index, most = READS[name]
    plan = explain(url, sql, params(s))
    text = "\n".join(map(str, plan))
    (row,) = plan
    assert row["key"] == index, text
    assert row["type"] in {"range", "ref"}, text
    extra = row["Extra"] or ""
    assert "filesort" not in extra, text
    assert "temporary" not in extra, text
    if most is not None:  # about one workflow's rows (an estimate), never the namespace's
        assert int(row["rows"]) <= most, text


def test_the_timeline_reads_one_workflows_events_in_order(
    seeded: tuple[DatabaseUrl, EventSeed],
) -> None:
    url, s = seeded
    rows = migrations.query(
        url, events.SELECT_WORKFLOW_TIMELINE, (s.namespace_id, s.workflow_id, *_start(), 100))
    assert len(rows) == EVENTS_PER_WORKFLOW
    assert all(json.loads(r["payload"])["workflow_id"] == s.workflow_id.hex() for r in rows)
    keys = [(r["occurred_at"], r["id"]) for r in rows]
    assert keys == sorted(keys)


@pytest.mark.parametrize(("payload", "expected"), [
    ({"workflow_id": "ab" * 16}, bytes.fromhex("ab" * 16)),
    ({"workflow_id": "AB" * 16}, bytes.fromhex("ab" * 16)),
    ({}, None),
    ({"workflow_id": None}, None),
    ({"workflow_id": "ab" * 15}, None),  # too short: not padded into a wrong id
    ({"workflow_id": "ab" * 17}, None),  # too long: not an insert failure
    ({"workflow_id": "zz" * 16}, None),  # not hex
    ({"workflow_id": 12345}, None),
    ({"workflow_id": {"id": "x"}}, None),
    ({"nested": {"workflow_id": "ab" * 16}}, None),  # only the top-level member counts
], ids=["hex", "upper-hex", "missing", "null", "short", "long", "not-hex", "number", "object",
        "nested"])
def test_workflow_id_is_decoded_from_the_payload(
    seeded: tuple[DatabaseUrl, EventSeed], payload: dict[str, Any], expected: bytes | None,
) -> None:
    url, _ = seeded
    namespace_id, event_id = secrets.token_bytes(16), secrets.token_bytes(16)
    conn = migrations.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(events.INSERT_EVENT, (namespace_id, event_id, "task",
                                              secrets.token_bytes(16), 1, "task.accepted",
                                              None, "WAITING", json.dumps(payload)))
    finally:
        conn.close()
    (row,) = migrations.query(url, "SELECT workflow_id FROM orbit_events WHERE id = %s",
                              (event_id,))
    assert row["workflow_id"] == expected


def _now() -> dt.datetime:
    return to_db(BASE + dt.timedelta(seconds=TASKS // 2))


# The claim module (the package re-exports a function of the same name).
claims = importlib.import_module("orbit_common.pulse.leases.claim")

# The hot scans on pulse_tasks that filter on ``state`` keep their own indexes: the two new
# (state, time, id) indexes must not be chosen for them. (Only the index is asserted: the
# recovery scan's ``state IN (…)`` sorts its two ranges, as it did before these indexes.)
HOT_TASK_SCANS: dict[str, tuple[str, Callable[[EventSeed], tuple[Any, ...]], str]] = {
    "leases claim": (
        claims._claim_sql(1, concurrency_keys=False),  # the production statement
        lambda s: (s.task_namespace_id, s.queue_id, _now(), _now(), _now(), _now(), "h", 10),
        "ix_tasks_claim"),
    "recovery.EXPIRED_LEASES": (recovery.EXPIRED_LEASES, lambda s: (_now(), 100),
                              "ix_tasks_lease_expiry"),
    "recovery.WAITING_PAST_DEADLINE": (recovery.WAITING_PAST_DEADLINE, lambda s: (_now(), 100),
                                     "ix_tasks_waiting_deadline"),
}


@pytest.mark.parametrize("name", list(HOT_TASK_SCANS))
def test_the_hot_task_scans_keep_their_indexes(
    seeded: tuple[DatabaseUrl, EventSeed], name: str,
) -> None:
    url, s = seeded
    sql, params, index = HOT_TASK_SCANS[name]
    plan = explain(url, sql, params(s))
    text = "\n".join(map(str, plan))
    (row,) = plan
    assert row["key"] == index, text

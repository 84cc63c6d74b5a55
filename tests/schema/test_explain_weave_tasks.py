"""The workflow → tasks list (orbit_common/weave/instance_tasks.py) reads ``ix_tasks_owner`` in
task id order from the cursor, with no sort, about one instance's rows, and follows each task to
its activation and POLL round by their unique keys -- on a database holding thousands of tasks of
many instances, schedules and plain submissions over several namespaces. No index of its own:
the owner index (migration 0015) with the primary key's ``id`` InnoDB appends to it is enough."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.weave import instance_tasks
from tests.schema.test_explain import explain
from tests.support import migrations, pulse

NAMESPACES = 3
INSTANCES = 40  # per namespace
TASKS_PER_INSTANCE = 12  # half of them POLL rounds of one activation
PLAIN_TASKS = 1500  # per namespace: submitted and scheduled tasks
BASE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PAGE = 5


@attrs.frozen(kw_only=True)
class OwnedSeed:
    namespace_id: bytes
    instance_id: bytes
    task_ids: tuple[bytes, ...]


INSERT_TASK = (
    "INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, priority,"
    " available_at, max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier,"
    " retry_jitter, offer_lease_ms, execution_lease_ms, rerun_safe, owner_kind, owner_id,"
    " created_at, updated_at) VALUES (%s, %s, %s, 'h', '{}', 'WAITING', 0, %s, 3, 1000, 60000,"
    " 2, 0.2, 30000, 60000, 0, %s, %s, %s, %s)")


def seed(cur: Any) -> OwnedSeed:
    chosen: OwnedSeed | None = None
    n = 0
    for _ in range(NAMESPACES):
        ns = secrets.token_bytes(16)
        queue_id, gate, queue = pulse.queue_rows(ns, "work")
        cur.execute(pulse.INSERT_GATE, gate)
        cur.execute(pulse.INSERT_QUEUE, queue)
        task_rows, step_rows, activation_rows, round_rows = [], [], [], []
        for i in range(INSTANCES):
            instance_id = secrets.token_bytes(16)
            task_step, poll_step = secrets.token_bytes(16), secrets.token_bytes(16)
            poll_activation = secrets.token_bytes(16)
            step_rows += [(ns, instance_id, task_step, "a", "TASK"),
                          (ns, instance_id, poll_step, "check", "POLL")]
            owned = []
            for k in range(TASKS_PER_INSTANCE):
                n += 1
                at = to_db(BASE + dt.timedelta(milliseconds=n))
                task_id = secrets.token_bytes(16)
                owned.append(task_id)
                task_rows.append((ns, task_id, queue_id, at, "WORKFLOW", instance_id, at, at))
                if k % 2 == 0:
                    activation_rows.append((ns, instance_id, task_step, secrets.token_bytes(16),
                                            k // 2 + 1, "SUPERSEDED", task_id, at, at))
                else:
                    round_rows.append((ns, instance_id, poll_activation, k // 2 + 1, poll_step,
                                       task_id, at))
            activation_rows.append((ns, instance_id, poll_step, poll_activation, 1, "SUCCEEDED",
                                    None, to_db(BASE), to_db(BASE)))
            if chosen is None and i == INSTANCES // 2:
                chosen = OwnedSeed(namespace_id=ns, instance_id=instance_id,
                                   task_ids=tuple(sorted(owned)))
        for _ in range(PLAIN_TASKS):
            n += 1
            at = to_db(BASE + dt.timedelta(milliseconds=n))
            owner = ("SCHEDULE", secrets.token_bytes(16)) if n % 3 == 0 else (None, None)
            task_rows.append((ns, secrets.token_bytes(16), queue_id, at, *owner, at, at))
        cur.executemany(INSERT_TASK, task_rows)
        cur.executemany(
            "INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state,"
            " activation_count, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, 'SUCCEEDED',"
            " 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", step_rows)
        cur.executemany(
            "INSERT INTO weave_activations (namespace_id, instance_id, step_id, id, sequence,"
            " state, task_id, created_at, ended_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            activation_rows)
        cur.executemany(
            "INSERT INTO weave_poll_rounds (namespace_id, instance_id, activation_id, round,"
            " step_id, task_id, state, created_at) VALUES (%s, %s, %s, %s, %s, %s, 'NOT_MET',"
            " %s)", round_rows)
    for table in ("pulse_tasks", "weave_steps", "weave_activations", "weave_poll_rounds"):
        cur.execute(f"ANALYZE TABLE {table}")  # fixed names above
        cur.fetchall()
    assert chosen is not None
    return chosen


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, OwnedSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


# EXPLAIN's table alias → the index it must read.
KEYS = {"t": "ix_tasks_owner", "q": "PRIMARY", "a": "uq_weave_activations_task",
        "r": "uq_weave_poll_rounds_task", "ra": "uq_weave_activations_id"}


@pytest.mark.parametrize("after", ["first", "middle"])
def test_the_list_reads_the_owner_index_in_order(seeded: tuple[DatabaseUrl, OwnedSeed],
                                                 after: str) -> None:
    url, s = seeded
    position = instance_tasks.ID_MIN if after == "first" else s.task_ids[5]
    plan = explain(url, instance_tasks.TASKS, (s.namespace_id, s.instance_id, position,
                                               PAGE + 1))
    text = "\n".join(map(str, plan))
    assert {r["table"]: r["key"] for r in plan} == KEYS, text
    (owner,) = [r for r in plan if r["table"] == "t"]
    assert owner["type"] in {"range", "ref"}, text
    for row in plan:
        assert "filesort" not in (row["Extra"] or ""), text
        assert "temporary" not in (row["Extra"] or ""), text
        if row["table"] != "t":
            assert row["type"] == "eq_ref", text
    assert int(owner["rows"]) <= 2 * TASKS_PER_INSTANCE, text


def test_pages_follow_the_task_id_order(seeded: tuple[DatabaseUrl, OwnedSeed]) -> None:
    url, s = seeded
    seen: list[bytes] = []
    position = instance_tasks.ID_MIN
    while True:
        rows = migrations.query(url, instance_tasks.TASKS,
                                (s.namespace_id, s.instance_id, position, PAGE))
        seen += [r["id"] for r in rows]
        if len(rows) < PAGE:
            break
        position = rows[-1]["id"]
    assert seen == list(s.task_ids)
    # Each task found its activation: directly (TASK step) or through its round (POLL).
    rows = migrations.query(url, instance_tasks.TASKS,
                            (s.namespace_id, s.instance_id, instance_tasks.ID_MIN, 100))
    assert all((r["a_id"] is None) != (r["ra_id"] is None) for r in rows)
    assert sum(r["round"] is not None for r in rows) == TASKS_PER_INSTANCE // 2

"""A workflow timeline's two reads (orbit_common/weave/timeline.py) use their indexes in order,
both directions (DESIGN §7): the instance's own events by ``ix_events_aggregate`` and the events
naming it in their payload by ``ix_events_workflow`` — each reads about one instance's rows,
with no sort, on a database holding thousands of events of many instances, signals and tasks
over several namespaces. And the merged page is the union in order, each event once."""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.weave import timeline
from tests.schema.test_explain import explain
from tests.support import migrations

NAMESPACES = 3
INSTANCES = 60  # per namespace
OWN_EVENTS = 8  # per instance: aggregate workflow_instance
NAMED_EVENTS = 6  # per instance: its signals' events (payload workflow_id)
TASK_EVENTS = 2000  # per namespace: task events naming no workflow
BASE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PAGE = 50


@attrs.frozen(kw_only=True)
class TimelineSeed:
    namespace_id: bytes
    instance_id: bytes


def seed(cur: Any) -> TimelineSeed:
    rows: list[tuple[Any, ...]] = []
    n = 0
    chosen: TimelineSeed | None = None

    def at() -> Any:
        nonlocal n
        n += 1
        return to_db(BASE + dt.timedelta(milliseconds=n * 3))

    for _ in range(NAMESPACES):
        ns = secrets.token_bytes(16)
        for i in range(INSTANCES):
            instance_id = secrets.token_bytes(16)
            for revision in range(1, OWN_EVENTS + 1):
                rows.append((ns, secrets.token_bytes(16), "workflow_instance", instance_id,
                             revision, "workflow.advanced", json.dumps({"completed": []}),
                             at()))
            for _ in range(NAMED_EVENTS):
                rows.append((ns, secrets.token_bytes(16), "workflow_signal",
                             secrets.token_bytes(16), 1, "workflow.signal.accepted",
                             json.dumps({"workflow_id": instance_id.hex()}), at()))
            if chosen is None and i == INSTANCES // 2:
                chosen = TimelineSeed(namespace_id=ns, instance_id=instance_id)
        for _ in range(TASK_EVENTS):
            rows.append((ns, secrets.token_bytes(16), "task", secrets.token_bytes(16), 1,
                         "task.accepted", json.dumps({"state": "WAITING"}), at()))
    cur.executemany(
        "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
        " aggregate_revision, event_type, payload, occurred_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
    cur.execute("ANALYZE TABLE orbit_events")
    cur.fetchall()
    assert chosen is not None
    return chosen


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, TimelineSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


READS = {f"{name}.{order}": (statements[order], order)
         for name, statements in (("INSTANCE_EVENTS", timeline.INSTANCE_EVENTS),
                                  ("NAMED_EVENTS", timeline.NAMED_EVENTS))
         for order in timeline.ORDERS}
INDEXES = {"INSTANCE_EVENTS": "ix_events_aggregate", "NAMED_EVENTS": "ix_events_workflow"}


def _params(s: TimelineSeed, order: str) -> tuple[Any, ...]:
    at, after = timeline.start_position(order)
    return (s.namespace_id, s.instance_id, to_db(at), to_db(at), after, PAGE + 1)


@pytest.mark.parametrize("name", sorted(READS))
def test_the_read_uses_its_index_in_order(seeded: tuple[DatabaseUrl, TimelineSeed],
                                          name: str) -> None:
    url, s = seeded
    sql, order = READS[name]
    plan = explain(url, sql, _params(s, order))
    text = "\n".join(map(str, plan))
    (row,) = plan
    assert row["key"] == INDEXES[name.split(".", maxsplit=1)[0]], text
    assert row["type"] in {"range", "ref"}, text
    extra = row["Extra"] or ""
    assert "filesort" not in extra, text
    assert "temporary" not in extra, text
    assert int(row["rows"]) <= 2 * (OWN_EVENTS + NAMED_EVENTS), text


def test_each_read_finds_only_its_instances_events(
        seeded: tuple[DatabaseUrl, TimelineSeed]) -> None:
    url, s = seeded
    for name, (sql, order) in READS.items():
        rows = migrations.query(url, sql, _params(s, order))
        expected = OWN_EVENTS if name.startswith("INSTANCE") else NAMED_EVENTS
        assert len(rows) == expected, name
        keys = [(r["occurred_at"], r["id"]) for r in rows]
        assert keys == sorted(keys, reverse=order == "desc"), name

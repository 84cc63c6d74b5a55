"""Weave's hot reads use their indexes (DESIGN §7): the engine's lease scans of the inbox and of
pending advances (due and lapsed: ``ix_weave_inbox_scan``/``_lease``,
``ix_weave_advances_due``/``_lease``), the ending writer's link read
(``uq_weave_activations_task``) and the instance list by namespace, definition, state and
business key (newest first, no sort) — each reads its index in order and only about the rows it
returns, on a database holding thousands of rows over several namespaces and states."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.batch import placeholders
from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.model import cursors
from orbit_common.pulse.leases import workflow_inbox
from orbit_common.weave import instances, leasing, polls
from tests.schema.test_explain import explain
from tests.support import migrations

NAMESPACES = 3
DEFINITIONS = 4  # per namespace
INSTANCES = 500  # per namespace
VERSIONS = 3  # per definition
STATES = ("SUCCEEDED", "SUCCEEDED", "FAILED", "RUNNING", "CANCELLED")
INBOX_STATES = ("CONSUMED", "CONSUMED", "CONSUMED", "PENDING", "LEASED", "QUARANTINED")
BASE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PAGE = 50


@attrs.frozen(kw_only=True)
class WeaveSeed:
    namespace_id: bytes
    definition_id: bytes
    task_ids: tuple[bytes, ...]
    instance_ids: tuple[bytes, ...] = ()


def seed(cur: Any) -> WeaveSeed:
    first: WeaveSeed | None = None
    for _ in range(NAMESPACES):
        ns = secrets.token_bytes(16)
        definition_ids = [secrets.token_bytes(16) for _ in range(DEFINITIONS)]
        instance_rows, step_rows, activation_rows, advance_rows, inbox_rows = [], [], [], [], []
        task_ids, instance_ids = [], []
        for n in range(INSTANCES):
            at = to_db(BASE + dt.timedelta(milliseconds=n))
            state = STATES[n % len(STATES)]
            instance_id, step_id = secrets.token_bytes(16), secrets.token_bytes(16)
            instance_rows.append((ns, instance_id, definition_ids[n % DEFINITIONS],
                                  1 + n // DEFINITIONS % VERSIONS, state,
                                  f"key-{n % 50}".encode(), secrets.token_bytes(16), at, at,
                                  None if state == "RUNNING" else at))
            activation_id, task_id = secrets.token_bytes(16), secrets.token_bytes(16)
            task_ids.append(task_id)
            instance_ids.append(instance_id)
            step_rows.append((ns, instance_id, step_id, at, at))
            activation_rows.append((ns, instance_id, step_id, activation_id, task_id, at, at))
            done = n % 4 != 0
            advance_rows.append((ns, secrets.token_bytes(16), instance_id, step_id,
                                 "DONE" if done else "PENDING" if n % 8 else "LEASED", at,
                                 None if done or n % 8 else at, at, at if done else None))
            inbox_state = INBOX_STATES[n % len(INBOX_STATES)]
            inbox_rows.append((ns, secrets.token_bytes(16), secrets.token_bytes(16), task_id,
                               instance_id, inbox_state,
                               "missing_activation" if inbox_state == "QUARANTINED" else None,
                               at if inbox_state == "LEASED" else None, at,
                               at if inbox_state == "CONSUMED" else None))
        cur.executemany(
            "INSERT INTO weave_instances (namespace_id, id, definition_id, version, version_digest,"
            " state, revision, business_key, input, gate_id, started_by_credential_id,"
            " created_at, updated_at, completed_at) VALUES (%s, %s, %s, %s, REPEAT('d', 32), %s,"
            " 1, %s, '{}', %s, REPEAT('c', 16), %s, %s, %s)", instance_rows)
        cur.executemany(
            "INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state,"
            " activation_count, created_at, updated_at) VALUES (%s, %s, %s, 'a', 'TASK',"
            " 'SUCCEEDED', 1, %s, %s)", step_rows)
        cur.executemany(
            "INSERT INTO weave_activations (namespace_id, instance_id, step_id, id, sequence,"
            " state, task_id, created_at, ended_at) VALUES (%s, %s, %s, %s, 1, 'SUCCEEDED', %s,"
            " %s, %s)", activation_rows)
        cur.executemany(
            "INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id, kind,"
            " state, due_at, lease_expires_at, created_at, done_at) VALUES (%s, %s, %s, %s,"
            " 'ROOT', %s, %s, %s, %s, %s)", advance_rows)
        cur.executemany(
            "INSERT INTO weave_inbox (namespace_id, id, source_event_id, consumer, task_id,"
            " task_revision, task_state, instance_id, snapshot, state, quarantine_reason,"
            " lease_expires_at, created_at, consumed_at) VALUES (%s, %s, %s, 'ENGINE', %s, 2,"
            " 'SUCCEEDED', %s, '{}', %s, %s, %s, %s, %s)", inbox_rows)
        if first is None:
            first = WeaveSeed(namespace_id=ns, definition_id=definition_ids[0],
                              task_ids=tuple(task_ids[:20]),
                              instance_ids=tuple(instance_ids[:20]))
    cur.execute("ANALYZE TABLE weave_instances, weave_activations, weave_pending_advances,"
                " weave_inbox")
    assert first is not None
    return first


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, WeaveSeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def _unlocked(sql: str) -> str:
    return sql.replace("FOR UPDATE SKIP LOCKED", "")


def _list(s: WeaveSeed, **filters: Any) -> tuple[str, list[Any]]:
    spec: dict[str, Any] = {"definition_id": None, "state": None, "key": None,
                            "created_from": None, "created_to": None,
                            "position": (cursors.TIME_MAX, b"\xff" * 16), "limit": PAGE}
    return instances.list_query(s.namespace_id, **{**spec, **filters})


LEASE_US = 30_000_000  # a lease scan's first parameter: the lease, for the expiry it reads

# name → (statement and parameters, the table alias, the index it must read, row bound)
READS: dict[str, tuple[Callable[[WeaveSeed], tuple[str, Any]], str, str, int]] = {
    "leasing.INBOX_DUE": (lambda s: (_unlocked(leasing.INBOX_DUE), (LEASE_US, PAGE)),
                          "weave_inbox", "ix_weave_inbox_scan", INSTANCES * NAMESPACES // 3),
    "leasing.INBOX_LAPSED": (lambda s: (_unlocked(leasing.INBOX_LAPSED), (LEASE_US, PAGE)),
                             "weave_inbox", "ix_weave_inbox_lease", INSTANCES * NAMESPACES // 3),
    "leasing.ADVANCES_DUE": (lambda s: (_unlocked(leasing.ADVANCES_DUE), (LEASE_US, PAGE)),
                             "weave_pending_advances", "ix_weave_advances_due",
                             INSTANCES * NAMESPACES // 3),
    "leasing.ADVANCES_LAPSED": (lambda s: (_unlocked(leasing.ADVANCES_LAPSED), (LEASE_US, PAGE)),
                                "weave_pending_advances", "ix_weave_advances_lease",
                                INSTANCES * NAMESPACES // 3),
    "workflow_inbox.LINKS": (
        lambda s: (workflow_inbox.LINKS.format(ids=placeholders(20)),
                   (s.namespace_id, *s.task_ids, s.namespace_id, *s.task_ids)),
        "a", "uq_weave_activations_task", 40),
    "workflow_inbox.LINKS_rounds": (
        lambda s: (workflow_inbox.LINKS.format(ids=placeholders(20)),
                   (s.namespace_id, *s.task_ids, s.namespace_id, *s.task_ids)),
        "r", "uq_weave_poll_rounds_task", 40),
    "polls.LOAD_ADVANCES": (
        lambda s: (polls.LOAD_ADVANCES.format(ids=placeholders(20)),
                   (s.namespace_id, *s.instance_ids)),
        "weave_pending_advances", "uq_weave_advances_step", 40),
    "instances.CURRENT_ACTIVATIONS": (
        lambda s: (instances.CURRENT_ACTIVATIONS, (s.namespace_id, s.instance_ids[3])),
        "a", "PRIMARY", 2),
    "instances.ALL_ACTIVATIONS": (
        lambda s: (instances.ALL_ACTIVATIONS, (s.namespace_id, s.instance_ids[3])),
        "weave_activations", "PRIMARY", 2),
    "instances.list": (_list, "i", "ix_weave_instances_created", 2 * INSTANCES),
    "instances.list_by_definition": (
        lambda s: _list(s, definition_id=s.definition_id), "i",
        "ix_weave_instances_definition", INSTANCES),
    "instances.list_by_state": (
        lambda s: _list(s, state="FAILED"), "i", "ix_weave_instances_state", INSTANCES),
    "instances.list_by_business_key": (
        lambda s: _list(s, key=b"key-7"), "i", "ix_weave_instances_business_key", 40),
}


# Every combination of instance list filters (a version only with its definition) reads the
# index instances.list_index names for it, in order, about the rows of that index's prefix.
COMBINATIONS = [
    (definition, version, state, key, ranged)
    for definition in (False, True) for version in ((False, True) if definition else (False,))
    for state in (False, True) for key in (False, True) for ranged in (False, True)]
PREFIX_ROWS = {"ix_weave_instances_created": 2 * INSTANCES,
               "ix_weave_instances_definition": INSTANCES,
               "ix_weave_instances_state": INSTANCES,
               "ix_weave_instances_definition_state": INSTANCES // 2,
               "ix_weave_instances_version": INSTANCES // 2,
               "ix_weave_instances_business_key": 40}


def _combination_name(c: tuple[bool, ...]) -> str:
    return "+".join(n for n, on in zip(("definition", "version", "state", "key", "range"), c,
                                       strict=True) if on) or "none"


@pytest.mark.parametrize("combination", COMBINATIONS, ids=map(_combination_name, COMBINATIONS))
def test_every_list_filter_combination_reads_an_index(
        seeded: tuple[DatabaseUrl, WeaveSeed], combination: tuple[bool, ...]) -> None:
    url, s = seeded
    definition, version, state, key, ranged = combination
    index = instances.list_index(definition=definition, version=version, state=state, key=key)
    sql, params = _list(s, definition_id=s.definition_id if definition else None,
                        version=2 if version else None, state="FAILED" if state else None,
                        key=b"key-7" if key else None,
                        created_from=BASE + dt.timedelta(milliseconds=100) if ranged else None,
                        created_to=BASE + dt.timedelta(milliseconds=400) if ranged else None)
    plan = explain(url, sql, tuple(params))
    text = "\n".join(map(str, plan))
    (row,) = [r for r in plan if r["table"] == "i"]
    assert row["key"] == index, text
    assert row["type"] in {"range", "ref"}, text
    assert "filesort" not in (row["Extra"] or ""), text
    assert int(row["rows"]) <= PREFIX_ROWS[index], text


def test_a_version_needs_its_definition(seeded: tuple[DatabaseUrl, WeaveSeed]) -> None:
    _, s = seeded
    with pytest.raises(ValueError, match="definition"):
        _list(s, version=1)


@pytest.mark.parametrize("name", sorted(READS))
def test_the_read_uses_its_index(seeded: tuple[DatabaseUrl, WeaveSeed], name: str) -> None:
    url, s = seeded
    statement, table, index, most = READS[name]
    sql, params = statement(s)
    plan = explain(url, sql, tuple(params))
    text = "\n".join(map(str, plan))
    (row,) = [r for r in plan if r["table"] == table]
    assert row["key"] == index, text
    assert row["type"] in {"range", "ref", "eq_ref"}, text
    assert "filesort" not in (row["Extra"] or ""), text
    assert int(row["rows"]) <= most, text

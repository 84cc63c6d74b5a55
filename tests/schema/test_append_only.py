"""Append-only tables refuse UPDATE and DELETE with a trigger (SIGNAL SQLSTATE '45000').

``APPEND_ONLY`` names every append-only table with a statement that inserts one valid row; the
list is checked complete against the tables that have triggers in a fresh install, so a table
that gains a trigger (or loses one) fails here until it is listed and both UPDATE and DELETE
are proven refused. Later issues add their append-only tables (definition versions, …) here.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pymysql
import pytest

from orbit_common.db.pool import DatabaseUrl
from tests.support import migrations

ER_SIGNAL_EXCEPTION = 1644


@attrs.frozen(kw_only=True)
class AppendOnlyTable:
    name: str
    key_columns: tuple[str, ...]
    # Inserts one row; its parameters are the key columns' values, in order.
    insert: str
    # A column UPDATE tries to change.
    column: str
    # Random 16-byte ids the insert takes after the key columns (other id columns).
    extra_ids: int = 0


APPEND_ONLY = (
    AppendOnlyTable(
        name="orbit_events",
        key_columns=("namespace_id", "id"),
        insert="""
INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id, aggregate_revision,
  event_type, from_state, to_state, payload, occurred_at)
VALUES (%s, %s, 'namespace', %s, 1, 'namespace.created', NULL, 'ACTIVE', '{"a": 1}',
  UTC_TIMESTAMP(6))
""",
        column="payload",
        extra_ids=1,
    ),
    AppendOnlyTable(
        name="orbit_audit_events",
        key_columns=("id",),
        insert="""
INSERT INTO orbit_audit_events (id, namespace_id, application_id, actor_kind, actor_id, action,
  resource_type, resource_id, resource_revision, reason, occurred_at)
VALUES (%s, NULL, NULL, 'operator', 'pytest', 'credential.revoke', 'credential', NULL, 2,
  'because', UTC_TIMESTAMP(6))
""",
        column="reason",
    ),
    AppendOnlyTable(
        name="orbit_result_events",
        key_columns=("namespace_id", "id"),
        insert="""
INSERT INTO orbit_result_events (namespace_id, id, sequence, task_id, queue_id, task_revision,
  state, snapshot, committed_at)
VALUES (%s, %s, 1, %s, %s, 3, 'SUCCEEDED', '{"a": 1}', UTC_TIMESTAMP(6))
""",
        column="snapshot",
        extra_ids=2,
    ),
    AppendOnlyTable(
        name="orbit_delivery_attempts",
        # with attempt 1 below: the primary key
        key_columns=("namespace_id", "delivery_id"),
        insert="""
INSERT INTO orbit_delivery_attempts (namespace_id, delivery_id, attempt, subscription_id,
  outcome, status_code, error, duration_ms, ended_at)
VALUES (%s, %s, 1, %s, 'FAILED', 500, 'boom', 12, UTC_TIMESTAMP(6))
""",
        column="error",
        extra_ids=1,
    ),
    AppendOnlyTable(
        name="pulse_schedule_versions",
        # with version 1 below: the primary key
        key_columns=("namespace_id", "schedule_id"),
        insert="""
INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule, template,
  misfire_policy, overlap_policy, catchup_window_ms, grace_ms, effective_from, created_by,
  created_at)
VALUES (%s, %s, 1, '{"every_ms": 1000}', '{"handler": "h"}', 'SKIP', 'ALLOW', 0, 0,
  UTC_TIMESTAMP(6), 'pytest', UTC_TIMESTAMP(6))
""",
        column="rule",
    ),
    AppendOnlyTable(
        name="pulse_schedule_occurrences",
        key_columns=("namespace_id", "id"),
        insert="""
INSERT INTO pulse_schedule_occurrences (namespace_id, id, schedule_id, fire_at, version, source,
  outcome, reason, covered_until, covered_count, task_id, fired_at, lateness_ms)
VALUES (%s, %s, %s, UTC_TIMESTAMP(6), 1, 'RULE', 'FIRED', NULL, NULL, 1, %s, UTC_TIMESTAMP(6), 0)
""",
        column="reason",
        extra_ids=2,
    ),
    AppendOnlyTable(
        name="weave_definition_versions",
        key_columns=("namespace_id", "definition_id"),
        insert="""
INSERT INTO weave_definition_versions (namespace_id, definition_id, version, document, digest,
  created_by_credential_id, created_at)
VALUES (%s, %s, 1, '{}', REPEAT('a', 32), REPEAT('b', 16), UTC_TIMESTAMP(6))
""",
        column="document",
    ),
    AppendOnlyTable(
        name="weave_version_scopes",
        key_columns=("namespace_id", "definition_id"),
        insert="""
INSERT INTO weave_version_scopes (namespace_id, definition_id, version, digest, queue_ids,
  created_at)
VALUES (%s, %s, 1, REPEAT('a', 32), '[]', UTC_TIMESTAMP(6))
""",
        column="queue_ids",
    ),
)
IDS = [t.name for t in APPEND_ONLY]


@pytest.fixture
def conn(fresh_install: DatabaseUrl) -> Iterator[pymysql.connections.Connection[Any]]:
    connection = migrations.connect(fresh_install)
    try:
        yield connection
    finally:
        connection.close()


def _insert(cur: Any, table: AppendOnlyTable) -> tuple[bytes, ...]:
    key = tuple(secrets.token_bytes(16) for _ in table.key_columns)
    params = key + tuple(secrets.token_bytes(16) for _ in range(table.extra_ids))
    cur.execute(table.insert, params)
    assert cur.rowcount == 1
    return key


def _where(table: AppendOnlyTable) -> str:
    # column names come from APPEND_ONLY above, never from input
    return " AND ".join(f"{c} = %s" for c in table.key_columns)


def _row(cur: Any, table: AppendOnlyTable, key: tuple[bytes, ...]) -> Any:
    cur.execute(f"SELECT * FROM {table.name} WHERE {_where(table)}", key)
    return cur.fetchone()


def _diagnostics(cur: Any) -> tuple[str, int, str]:
    """SQLSTATE, errno and message of the statement that just failed on this session."""
    cur.execute(
        "GET DIAGNOSTICS CONDITION 1 @st = RETURNED_SQLSTATE, @no = MYSQL_ERRNO,"
        " @msg = MESSAGE_TEXT"
    )
    cur.execute("SELECT @st, @no, @msg")
    sqlstate, errno, message = cur.fetchone()
    return sqlstate, int(errno), message


@pytest.mark.parametrize("table", APPEND_ONLY, ids=IDS)
def test_insert_is_allowed(
    conn: pymysql.connections.Connection[Any], table: AppendOnlyTable
) -> None:
    with conn.cursor() as cur:
        key = _insert(cur, table)
        assert _row(cur, table, key) is not None


@pytest.mark.parametrize("table", APPEND_ONLY, ids=IDS)
def test_update_is_rejected_and_the_row_is_unchanged(
    conn: pymysql.connections.Connection[Any], table: AppendOnlyTable
) -> None:
    with conn.cursor() as cur:
        key = _insert(cur, table)
        before = _row(cur, table, key)
        with pytest.raises(pymysql.err.OperationalError) as raised:
            cur.execute(
                f"UPDATE {table.name} SET {table.column} = %s WHERE {_where(table)}",
                ("{}", *key),
            )
        assert raised.value.args[0] == ER_SIGNAL_EXCEPTION
        assert _diagnostics(cur) == ("45000", ER_SIGNAL_EXCEPTION, f"{table.name} is append-only")
        assert _row(cur, table, key) == before


@pytest.mark.parametrize("table", APPEND_ONLY, ids=IDS)
def test_delete_is_rejected_and_the_row_stays(
    conn: pymysql.connections.Connection[Any], table: AppendOnlyTable
) -> None:
    with conn.cursor() as cur:
        key = _insert(cur, table)
        before = _row(cur, table, key)
        with pytest.raises(pymysql.err.OperationalError) as raised:
            cur.execute(f"DELETE FROM {table.name} WHERE {_where(table)}", key)
        assert raised.value.args[0] == ER_SIGNAL_EXCEPTION
        assert _diagnostics(cur) == ("45000", ER_SIGNAL_EXCEPTION, f"{table.name} is append-only")
        assert _row(cur, table, key) == before


@pytest.mark.parametrize("table", APPEND_ONLY, ids=IDS)
def test_a_rejected_change_rolls_back_inside_a_transaction(
    conn: pymysql.connections.Connection[Any], table: AppendOnlyTable
) -> None:
    """An UPDATE of every row in a transaction changes nothing, even rows inserted by it."""
    with conn.cursor() as cur:
        committed = _insert(cur, table)
        before = _row(cur, table, committed)
        conn.begin()
        try:
            _insert(cur, table)
            with pytest.raises(pymysql.err.OperationalError) as raised:
                cur.execute(f"UPDATE {table.name} SET {table.column} = %s", ("{}",))
            assert raised.value.args[0] == ER_SIGNAL_EXCEPTION
        finally:
            conn.rollback()
        assert _row(cur, table, committed) == before


def _triggers(url: DatabaseUrl) -> set[tuple[str, str, str]]:
    rows = migrations.query(
        url,
        "SELECT EVENT_OBJECT_TABLE AS table_name, ACTION_TIMING AS timing,"
        " EVENT_MANIPULATION AS event FROM information_schema.TRIGGERS"
        " WHERE TRIGGER_SCHEMA = DATABASE()",
    )
    return {(r["table_name"], r["timing"], r["event"]) for r in rows}


def test_every_append_only_table_has_both_triggers(fresh_install: DatabaseUrl) -> None:
    found = _triggers(fresh_install)
    expected = {(t.name, "BEFORE", event) for t in APPEND_ONLY for event in ("UPDATE", "DELETE")}
    missing = sorted(expected - found)
    assert not missing, f"append-only tables without a refusing trigger: {missing}"


def test_the_list_names_every_table_with_a_trigger(fresh_install: DatabaseUrl) -> None:
    """Triggers exist here only to make tables append-only: every table that has one is in
    ``APPEND_ONLY`` (so the tests above prove both refusals for it), and every listed table
    exists."""
    with_triggers = {table for table, _, _ in _triggers(fresh_install)}
    assert with_triggers == {t.name for t in APPEND_ONLY}
    assert {t.name for t in APPEND_ONLY} <= set(migrations.tables(fresh_install))

"""Storage conventions of a fresh install (DESIGN §7): named CHECKs, VARCHAR states with a
CHECK, BINARY(16) ids, DATETIME(6) times, BINARY(32) digests, InnoDB utf8mb4 tables."""

from __future__ import annotations

import re

from orbit_common.db.pool import DatabaseUrl
from tests.support import migrations

# Columns named like ids that are deliberately not BINARY(16), with the reason.
NOT_BINARY_IDS = {
    # The migration file name; the ledger is keyed by what an operator reads on disk.
    ("orbit_schema_migrations", "migration_id"),
    # Who acted: a credential id (hex) or an operator account such as "alice@host".
    ("orbit_audit_events", "actor_id"),
    # The HTTP request id as the client or the API logged it, for matching with logs.
    ("orbit_audit_events", "request_id"),
    # A worker-chosen report identity (exact bytes), deduplicating re-sent reports.
    ("pulse_attempt_receipts", "report_id"),
}

COLUMNS = """
SELECT TABLE_NAME AS table_name, COLUMN_NAME AS column_name, DATA_TYPE AS data_type,
       COLUMN_TYPE AS column_type
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
ORDER BY TABLE_NAME, ORDINAL_POSITION
"""
CHECKS = """
SELECT TABLE_NAME AS table_name, CONSTRAINT_NAME AS name, CHECK_CLAUSE AS clause
FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE()
ORDER BY TABLE_NAME, CONSTRAINT_NAME
"""


def _columns(url: DatabaseUrl) -> list[dict[str, str]]:
    return migrations.query(url, COLUMNS)


def _fail(what: str, offenders: list[str]) -> str:
    return f"{what}:\n  " + "\n  ".join(offenders)


def test_every_check_constraint_is_named(fresh_install: DatabaseUrl) -> None:
    """Unnamed CHECKs get server-generated names (CONSTRAINT_1, or the column's name for a
    column-level CHECK) that differ between MySQL and MariaDB and cannot be referred to."""
    checks = migrations.query(fresh_install, CHECKS)
    assert checks
    offenders = [
        f"{c['table_name']}.{c['name']}: {c['clause']}"
        for c in checks
        if not c["name"].startswith("ck_")
    ]
    assert not offenders, _fail("CHECK constraints not named ck_…", offenders)


def test_states_are_varchar_with_a_check(fresh_install: DatabaseUrl) -> None:
    checks = migrations.query(fresh_install, CHECKS)
    state_columns = [c for c in _columns(fresh_install) if c["column_name"] == "state"]
    assert state_columns
    offenders = []
    for column in state_columns:
        table = column["table_name"]
        if column["data_type"] != "varchar":
            offenders.append(f"{table}.state is {column['column_type']}")
        guarded = re.compile(r"`state`\s+in\s*\(", re.IGNORECASE)
        if not any(c["table_name"] == table and guarded.search(c["clause"]) for c in checks):
            offenders.append(f"{table}.state has no CHECK (state IN (…))")
    assert not offenders, _fail("state columns", offenders)


def test_ids_are_binary_16(fresh_install: DatabaseUrl) -> None:
    columns = [
        c
        for c in _columns(fresh_install)
        if (c["column_name"] == "id" or c["column_name"].endswith("_id"))
        and (c["table_name"], c["column_name"]) not in NOT_BINARY_IDS
    ]
    assert columns
    offenders = [
        f"{c['table_name']}.{c['column_name']} is {c['column_type']}"
        for c in columns
        if c["column_type"] != "binary(16)"
    ]
    assert not offenders, _fail("id columns that are not binary(16)", offenders)


def test_the_id_exemptions_still_exist(fresh_install: DatabaseUrl) -> None:
    """Keeps NOT_BINARY_IDS honest: an exemption for a column that is gone must be removed."""
    present = {(c["table_name"], c["column_name"]) for c in _columns(fresh_install)}
    assert present >= NOT_BINARY_IDS


def test_times_are_datetime_6(fresh_install: DatabaseUrl) -> None:
    columns = [
        c
        for c in _columns(fresh_install)
        if c["column_name"].endswith("_at") or c["data_type"] in {"datetime", "timestamp", "date"}
    ]
    assert columns
    offenders = [
        f"{c['table_name']}.{c['column_name']} is {c['column_type']}"
        for c in columns
        if c["column_type"] != "datetime(6)"
    ]
    assert not offenders, _fail("time columns that are not datetime(6)", offenders)


def test_digests_are_binary_32(fresh_install: DatabaseUrl) -> None:
    columns = [c for c in _columns(fresh_install) if c["column_name"].endswith("_digest")]
    assert columns
    offenders = [
        f"{c['table_name']}.{c['column_name']} is {c['column_type']}"
        for c in columns
        if c["column_type"] != "binary(32)"
    ]
    assert not offenders, _fail("digest columns that are not binary(32)", offenders)


def test_tables_are_innodb_utf8mb4(fresh_install: DatabaseUrl) -> None:
    rows = migrations.query(
        fresh_install,
        "SELECT TABLE_NAME AS table_name, ENGINE AS engine, TABLE_COLLATION AS collation"
        " FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()",
    )
    offenders = [
        f"{r['table_name']}: {r['engine']}, {r['collation']}"
        for r in rows
        if r["engine"] != "InnoDB" or not r["collation"].startswith("utf8mb4_")
    ]
    assert not offenders, _fail("tables not InnoDB utf8mb4", offenders)

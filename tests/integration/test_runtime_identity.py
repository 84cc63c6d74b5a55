"""The dev stack's runtime identity (orbit_devdb.grant_runtime) on the real server: it can do
what the daemons do — domain transactions, the readiness check, append-only triggers that run
with their definer's privileges — and nothing else: no CREATE, DROP, ALTER, INDEX, TRIGGER or
GRANT. Names with a backtick or a quote never reach a statement."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pymysql
import pytest

import orbit_devdb as devdb
from orbit_common.db.pool import DatabaseUrl, connect_sync, open_database
from orbit_common.db.schema import SchemaChecker
from orbit_common.platform import commands
from orbit_common.platform.audit import Actor
from tests.support import database

ER_SIGNAL_EXCEPTION = 1644  # the append-only trigger's refusal
# Access denied: to a table command (1142), to the database (1044), lacking a global
# privilege (1227) or needing GRANT OPTION / CREATE USER (1410 on MySQL, 1227 on MariaDB).
ACCESS_DENIED = {1044, 1142, 1227, 1410}


@attrs.frozen
class Runtime:
    admin: DatabaseUrl
    url: DatabaseUrl
    database: str
    user: str


@pytest.fixture(scope="module")
def runtime(server_url: DatabaseUrl) -> Iterator[Runtime]:
    """A migrated scratch database and a runtime user granted on it (both removed after; the
    refused statements change nothing, so the module shares them)."""
    name = database.scratch_name("orbit_runtime")
    admin = database.create_database(server_url, name)
    user, password = f"rt_{secrets.token_hex(6)}", secrets.token_urlsafe(18)
    conn = database.admin_connection(server_url)
    try:
        devdb.grant_runtime(conn, name, user, password)
        yield Runtime(admin=admin, database=name, user=user,
                      url=attrs.evolve(admin, user=user, password=password, unix_socket=None,
                                       host="127.0.0.1"))
    finally:
        with conn.cursor() as cur:
            for host in devdb.ACCOUNT_HOSTS:
                cur.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")  # generated, checked
        conn.close()
        database.drop_database(server_url, name)


def _refused(conn: pymysql.connections.Connection[Any], statement: str) -> int:
    with conn.cursor() as cur, pytest.raises(pymysql.err.MySQLError) as caught:
        cur.execute(statement)
    return int(caught.value.args[0])


def test_the_runtime_user_holds_exactly_the_row_privileges(runtime: Runtime) -> None:
    conn = connect_sync(runtime.url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GRANTS")
            grants = sorted(row[0] for row in cur.fetchall())
    finally:
        conn.close()
    assert len(grants) == 2, grants
    assert grants[0].startswith(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{runtime.database}`.*")
    assert grants[1].startswith("GRANT USAGE ON *.*")


async def test_the_runtime_user_runs_domain_transactions_and_the_readiness_check(
    runtime: Runtime,
) -> None:
    db = await open_database(runtime.url, minsize=1, maxsize=2)
    try:
        report = await SchemaChecker(db).check()
        assert report.ready, report.problems
        assert report.foreign_keys == 0
        made = await commands.bootstrap(db, application="rt-app", namespace="rt-ns",
                                        credential="rt", actor=Actor.operator("pytest"))
        assert made.issued.api_key.startswith("orb_")
    finally:
        await db.close()
    conn = connect_sync(runtime.url, autocommit=True)
    try:
        # The append-only trigger runs (with its definer's privileges) and refuses the change.
        assert _refused(conn, "UPDATE orbit_audit_events SET action = action") \
            == ER_SIGNAL_EXCEPTION
        assert _refused(conn, "DELETE FROM orbit_audit_events") == ER_SIGNAL_EXCEPTION
    finally:
        conn.close()


@pytest.mark.parametrize("statement", [
    "CREATE TABLE rt_probe (id INT PRIMARY KEY)",
    "DROP TABLE orbit_namespaces",
    "ALTER TABLE orbit_namespaces ADD COLUMN rt_probe INT",
    "CREATE INDEX ix_rt_probe ON orbit_namespaces (created_at)",
    "TRUNCATE TABLE orbit_namespaces",
    "CREATE TRIGGER rt_probe BEFORE INSERT ON orbit_namespaces FOR EACH ROW SET @x = 1",
    "DROP TRIGGER IF EXISTS trg_orbit_audit_events_no_update",
    "CREATE DATABASE rt_probe",
    "DROP DATABASE {database}",
    "CREATE USER rt_probe IDENTIFIED BY 'x'",
    "GRANT SELECT ON {database}.* TO {user}",
])
def test_the_runtime_user_cannot_change_the_schema(runtime: Runtime, statement: str) -> None:
    text = statement.format(database=runtime.database, user=runtime.user)
    conn = connect_sync(runtime.url, autocommit=True)
    try:
        assert _refused(conn, text) in ACCESS_DENIED, text
    finally:
        conn.close()
    admin = connect_sync(runtime.admin, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
                        " DATABASE() AND TABLE_NAME = 'orbit_namespaces' AND COLUMN_NAME ="
                        " 'rt_probe'")
            assert cur.fetchone()[0] == 0
            cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA ="
                        " DATABASE() AND TABLE_NAME IN ('rt_probe', 'orbit_namespaces')")
            assert cur.fetchone()[0] == 1
    finally:
        admin.close()


@pytest.mark.parametrize(("database_name", "user"), [
    ("orbit`; DROP DATABASE mysql; --", "rt_ok"),
    ("orbit'", "rt_ok"),
    ("orbit_ok", "rt'@'%"),
    ("orbit_ok", "rt`x"),
])
def test_names_with_quotes_are_refused_before_any_statement(
    server_url: DatabaseUrl, database_name: str, user: str
) -> None:
    conn = database.admin_connection(server_url)
    try:
        with pytest.raises(devdb.InvalidName, match=r"invalid (database|user) name"):
            devdb.grant_runtime(conn, database_name, user, "secret")
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM mysql.user WHERE user = %s", (user,))
            assert cur.fetchone()[0] == 0
    finally:
        conn.close()
    with pytest.raises(devdb.InvalidName):
        database.create_database(server_url, "orbit`x", migrate=False)

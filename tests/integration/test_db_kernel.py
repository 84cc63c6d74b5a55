"""The database kernel against the real server: session settings, driver pin, transaction runner."""

from __future__ import annotations

import asyncio
import importlib.metadata
import secrets
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db import clock
from orbit_common.db import errors as dberrors
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.db.tx import TX_RETRIES, Isolation, TransactionRunner
from orbit_common.model import ids
from orbit_common.platform import applications as apps
from orbit_common.platform.audit import Actor
from tests.conftest import Tenant

ACTOR = Actor.operator("pytest")


async def _scalar(db: Database, sql: str, params: tuple[Any, ...] = ()) -> Any:
    async def body(cur: Any) -> Any:
        await cur.execute(sql, params)
        row = await cur.fetchone()
        return next(iter(row.values()))

    return await db.read("test.scalar", body)


@pytest.mark.parametrize(
    "value",
    [
        bytes(16),
        b"\x00\x27\x5c\x22\x0a\x0d\x1a\xff" * 2,  # NUL, quote, backslash, newline, ^Z, 0xff
        bytes(range(240, 256)),  # fixed: xdist workers must collect identical parameters
    ],
)
async def test_binary16_parameters_round_trip_exactly(db: Database, value: bytes) -> None:
    """Guards the PyMySQL pin: aiomysql 0.3.2 breaks on bytes parameters with PyMySQL >= 1.2.1."""
    assert await _scalar(db, "SELECT %s AS v", (value,)) == value
    assert await _scalar(db, "SELECT HEX(%s) AS v", (value,)) == value.hex().upper()
    assert await _scalar(db, "SELECT LENGTH(%s) AS v", (value,)) == 16


@pytest.mark.parametrize("value", [
    '{"a": "b", "c": [1, "d"]}', '"', "'\"'", '\\"', "\"\0\"", "%s %d %%", "\n\r\x1a\t",
    "引号\"和'反斜杠\\", "\U0001F600\"",
])
async def test_string_parameters_round_trip_exactly(db: Database, value: str) -> None:
    """The cursor's literals (double quotes unescaped when nothing else needs escaping) are the
    same strings to the server: equal after the round trip, and the same length."""
    assert await _scalar(db, "SELECT %s AS v", (value,)) == value
    assert await _scalar(db, "SELECT CHAR_LENGTH(%s) AS v", (value,)) == len(value)


async def test_binary16_id_finds_its_row(db: Database, tenant: Tenant) -> None:
    name = await _scalar(
        db, "SELECT name FROM orbit_namespaces WHERE id = %s", (tenant.namespace_id,)
    )
    assert name == tenant.namespace


def test_pymysql_is_pinned_below_the_aiomysql_breakage() -> None:
    # pymysql.__version__ mimics mysqlclient; the distribution's version is the real one.
    version = importlib.metadata.version("PyMySQL")
    major, minor, patch = (int(p) for p in version.split(".")[:3])
    assert (1, 1, 1) <= (major, minor, patch) < (1, 2, 1)


async def test_session_is_utc_and_strict(db: Database) -> None:
    assert await _scalar(db, "SELECT @@session.time_zone AS v") == "+00:00"
    mode = await _scalar(db, "SELECT @@session.sql_mode AS v")
    for flag in ("STRICT_TRANS_TABLES", "ONLY_FULL_GROUP_BY", "NO_ZERO_DATE",
                 "ERROR_FOR_DIVISION_BY_ZERO", "NO_ENGINE_SUBSTITUTION"):
        assert flag in mode
    assert await _scalar(db, "SELECT NOW(6) = UTC_TIMESTAMP(6) AS v") == 1


async def test_strict_mode_refuses_truncation(db: Database) -> None:
    async def body(cur: Any) -> None:
        await cur.execute("CREATE TEMPORARY TABLE t_strict (v VARCHAR(3))")
        await cur.execute("INSERT INTO t_strict VALUES ('abcd')")

    with pytest.raises(errors.DatabaseError):
        await db.transaction("test.strict", body)


async def test_database_clock_is_aware_utc(db: Database) -> None:
    now = await db.read("test.clock", clock.db_now)
    assert now.tzinfo is not None
    assert now.utcoffset() is not None
    assert now.utcoffset().total_seconds() == 0


async def test_found_rows_counts_matched_rows_not_changed_rows(
    db: Database, tenant: Tenant
) -> None:
    """The deliberate FOUND_ROWS choice: a guard that holds counts 1 even if nothing changed."""

    async def body(cur: Any) -> tuple[int, int]:
        await cur.execute(
            "UPDATE orbit_applications SET state = state WHERE id = %s AND state = 'ACTIVE'",
            (tenant.application_id,),
        )
        matched_unchanged = cur.rowcount
        await cur.execute(
            "UPDATE orbit_applications SET state = state WHERE id = %s AND revision = -1",
            (tenant.application_id,),
        )
        return matched_unchanged, cur.rowcount

    assert await db.transaction("test.found_rows", body) == (1, 0)


async def test_transactions_run_read_committed(db: Database, db_url: DatabaseUrl,
                                               tenant: Tenant) -> None:
    """A second read inside one transaction sees another transaction's commit (not RR)."""
    other = connect_sync(db_url, autocommit=True)
    seen: list[str] = []

    async def body(cur: Any) -> None:
        sql = "SELECT description FROM orbit_namespaces WHERE id = %s"
        await cur.execute(sql, (tenant.namespace_id,))
        seen.append((await cur.fetchone())["description"])
        with other.cursor() as c:
            c.execute("UPDATE orbit_namespaces SET description = 'changed' WHERE id = %s",
                      (tenant.namespace_id,))
        await cur.execute(sql, (tenant.namespace_id,))
        seen.append((await cur.fetchone())["description"])

    try:
        await db.transaction("test.isolation", body)
    finally:
        other.close()
    assert seen == ["", "changed"]


async def test_a_domain_error_rolls_back_everything(db: Database) -> None:
    name = f"app-{secrets.token_hex(5)}"
    app_id = ids.new_id()

    async def body(cur: Any) -> None:
        await apps.create_application(cur, app_id=app_id, name=name, actor=ACTOR)
        raise errors.Conflict("changed my mind")

    with pytest.raises(errors.Conflict):
        await db.transaction("test.rollback", body)
    assert await _scalar(db, "SELECT COUNT(*) AS n FROM orbit_applications WHERE id = %s",
                         (app_id,)) == 0
    assert await _scalar(db, "SELECT COUNT(*) AS n FROM orbit_events WHERE aggregate_id = %s",
                         (app_id,)) == 0


async def test_a_transaction_costs_no_begin_round_trip(db_url: DatabaseUrl) -> None:
    """The runner sends no START TRANSACTION (autocommit is off: the body's first statement
    begins the transaction); the rollback test above shows the body is still one unit."""
    database = await open_database(db_url, minsize=1, maxsize=1)

    async def begins(cur: Any) -> int:
        await cur.execute("SHOW SESSION STATUS LIKE 'Com_begin'")
        return int((await cur.fetchone())["Value"])

    try:
        first = await database.transaction("test.begins", begins)
        await database.transaction("test.noop", lambda cur: cur.execute("SELECT 1"))
        assert await database.transaction("test.begins", begins) == first
    finally:
        await database.close()


async def test_check_violation_surfaces_as_integrity_error(db: Database) -> None:
    async def body(cur: Any) -> None:
        await cur.execute(
            "INSERT INTO orbit_applications (id, name, state, revision, created_at, updated_at)"
            " VALUES (%s, %s, 'BOGUS', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
            (ids.new_id(), f"app-{secrets.token_hex(5)}"),
        )

    with pytest.raises(errors.IntegrityViolation):
        await db.transaction("test.check", body)


async def test_deadlock_victim_is_rerun_as_a_whole(db: Database) -> None:
    """Two transactions lock two rows in opposite order; the victim is re-run and both commit."""
    first, second = ids.new_id(), ids.new_id()
    names = [f"app-{secrets.token_hex(5)}" for _ in range(2)]
    for app_id, name in zip((first, second), names, strict=True):
        await db.transaction("test.seed", lambda cur, a=app_id, n=name: apps.create_application(
            cur, app_id=a, name=n, actor=ACTOR))
    both_hold_one = asyncio.Barrier(2)
    runs = {"a": 0, "b": 0}
    retries_before = TX_RETRIES.labels("test.deadlock", "1213")._value.get()

    def body_for(label: str, mine: bytes, theirs: bytes) -> Any:
        async def body(cur: Any) -> None:
            runs[label] += 1
            lock = "SELECT id FROM orbit_applications WHERE id = %s FOR UPDATE"
            await cur.execute(lock, (mine,))
            if runs[label] == 1:
                await asyncio.wait_for(both_hold_one.wait(), 10)
            await cur.execute(lock, (theirs,))
            await cur.execute(
                "UPDATE orbit_applications SET updated_at = UTC_TIMESTAMP(6) WHERE id = %s",
                (mine,),
            )

        return body

    await asyncio.gather(
        db.transaction("test.deadlock", body_for("a", first, second)),
        db.transaction("test.deadlock", body_for("b", second, first)),
    )
    assert sorted(runs.values()) == [1, 2]
    assert TX_RETRIES.labels("test.deadlock", "1213")._value.get() == retries_before + 1


async def test_lock_wait_timeout_rolls_back_the_whole_transaction_before_rerun(
    db: Database, db_url: DatabaseUrl, tenant: Tenant
) -> None:
    """1205 rolls back only the statement; the runner must roll back the rest itself."""
    holder = connect_sync(db_url, autocommit=False)
    with holder.cursor() as c:
        c.execute("SELECT id FROM orbit_namespaces WHERE id = %s FOR UPDATE",
                  (tenant.namespace_id,))
    marker = ids.new_id()
    runs = 0

    async def body(cur: Any) -> None:
        nonlocal runs
        runs += 1
        await cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
        # A write that must not survive the failed first run.
        await cur.execute(
            "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
            " aggregate_revision, event_type, payload, occurred_at)"
            " VALUES (%s, %s, 'test', %s, %s, 'test.lockwait', '{}', UTC_TIMESTAMP(6))",
            (tenant.namespace_id, ids.new_id(), marker, runs),
        )
        if runs == 2:
            await asyncio.to_thread(holder.rollback)  # release the lock for the re-run
        await cur.execute("SELECT id FROM orbit_namespaces WHERE id = %s FOR UPDATE",
                          (tenant.namespace_id,))
        await cur.execute("SET SESSION innodb_lock_wait_timeout = 10")

    try:
        # The second run releases the lock only after its own insert; the third run wins if
        # the release races the lock request, so allow up to 3 runs but require >= 2.
        await db.transaction("test.lockwait", body)
    finally:
        holder.close()
    assert runs >= 2
    rows = await _scalar(db, "SELECT COUNT(*) AS n FROM orbit_events WHERE aggregate_id = %s",
                         (marker,))
    assert rows == 1, "the first run's insert must have been rolled back"


async def test_retries_are_bounded(db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    holder = connect_sync(db_url, autocommit=False)
    with holder.cursor() as c:
        c.execute("SELECT id FROM orbit_namespaces WHERE id = %s FOR UPDATE",
                  (tenant.namespace_id,))
    runner = TransactionRunner(db.pool, max_attempts=2, base_delay_s=0.001)
    runs = 0

    async def body(cur: Any) -> None:
        nonlocal runs
        runs += 1
        await cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
        try:
            await cur.execute("SELECT id FROM orbit_namespaces WHERE id = %s FOR UPDATE",
                              (tenant.namespace_id,))
        finally:
            await cur.execute("SET SESSION innodb_lock_wait_timeout = 10")

    try:
        with pytest.raises(errors.TransactionRetriesExhausted):
            await runner.run("test.exhausted", body)
    finally:
        holder.rollback()
        holder.close()
    assert runs == 2


def test_error_classification_is_by_errno() -> None:
    def err(code: int) -> pymysql.err.MySQLError:
        return pymysql.err.OperationalError(code, "x")

    assert dberrors.classify(err(1213)) is dberrors.Kind.RETRY
    assert dberrors.classify(err(1205)) is dberrors.Kind.RETRY
    assert dberrors.classify(err(1020)) is dberrors.Kind.RETRY
    assert dberrors.classify(err(3572)) is dberrors.Kind.RETRY
    assert dberrors.classify(err(2013)) is dberrors.Kind.CONNECTION
    assert dberrors.classify(pymysql.err.IntegrityError(1062, "dup")) is dberrors.Kind.DUPLICATE
    assert dberrors.classify(err(4025)) is dberrors.Kind.INTEGRITY
    assert dberrors.classify(err(3819)) is dberrors.Kind.INTEGRITY
    assert dberrors.classify(err(1644)) is dberrors.Kind.INTEGRITY
    assert dberrors.classify(ConnectionResetError()) is dberrors.Kind.CONNECTION
    assert dberrors.is_duplicate(
        pymysql.err.IntegrityError(1062, "Duplicate entry 'x' for key 'uq_namespaces_name'"),
        "uq_namespaces_name",
    )
    assert dberrors.is_duplicate(
        pymysql.err.IntegrityError(1062, "Duplicate entry 'x' for key 'orbit_namespaces."
                                   "uq_namespaces_name'"),
        "uq_namespaces_name",
    )
    assert not dberrors.is_duplicate(
        pymysql.err.IntegrityError(1062, "Duplicate entry 'x' for key 'PRIMARY'"),
        "uq_namespaces_name",
    )


async def test_unreachable_database_is_unavailable_not_a_crash() -> None:
    url = DatabaseUrl.parse("mysql://nobody:x@127.0.0.1:1/nothing")
    with pytest.raises(pymysql.err.OperationalError):
        await open_database(url)


async def test_repeatable_read_is_available_per_transaction(
    db: Database, db_url: DatabaseUrl, tenant: Tenant
) -> None:
    """REPEATABLE READ applies to that one transaction; the next one is READ COMMITTED again."""
    other = connect_sync(db_url, autocommit=True)
    sql = "SELECT description FROM orbit_namespaces WHERE id = %s"

    def body_changing(value: str) -> Any:
        async def body(cur: Any) -> list[str]:
            seen = []
            await cur.execute(sql, (tenant.namespace_id,))
            seen.append((await cur.fetchone())["description"])
            with other.cursor() as c:
                c.execute("UPDATE orbit_namespaces SET description = %s WHERE id = %s",
                          (value, tenant.namespace_id))
            await cur.execute(sql, (tenant.namespace_id,))
            seen.append((await cur.fetchone())["description"])
            return seen

        return body

    try:
        repeatable = await db.transaction("test.rr", body_changing("one"),
                                          isolation=Isolation.REPEATABLE_READ)
        committed = await db.transaction("test.rc", body_changing("two"))
    finally:
        other.close()
    assert repeatable == ["", ""]
    assert committed == ["one", "two"]

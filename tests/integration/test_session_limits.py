"""The daemons' session limits on the real server (orbit_common/db/pool.py SessionSettings):
a transaction whose client went silent (even one that only locked rows) is rolled back by the
server, so it stops holding them; lock waits are bounded. MariaDB only for the idle limit (MySQL
has no such variable; the init command skips it there, docs/runbooks/liveness.md)."""

from __future__ import annotations

from typing import Any

import pymysql
import pytest

from orbit_common.db.pool import DatabaseUrl, SessionSettings, connect_sync, open_database
from tests.support.waiting import until

LIMITS = SessionSettings(lock_wait_timeout_s=1, idle_transaction_timeout_s=1)


def _is_mariadb(conn: pymysql.connections.Connection[Any]) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        return "mariadb" in str(cur.fetchone()[0]).lower()


async def test_the_session_limits_are_set(db_url: DatabaseUrl) -> None:
    db = await open_database(db_url, maxsize=1, session=LIMITS)
    try:
        async def body(cur: Any) -> dict[str, Any]:
            await cur.execute("SELECT @@session.innodb_lock_wait_timeout AS lock_wait")
            return dict(await cur.fetchone())

        assert (await db.read("test.limits", body))["lock_wait"] == 1
    finally:
        await db.close()


async def test_a_silent_transaction_is_rolled_back_and_frees_its_rows(db_url: DatabaseUrl) -> None:
    observer = connect_sync(db_url, autocommit=True)
    if not _is_mariadb(observer):
        observer.close()
        pytest.skip("idle_transaction_timeout is MariaDB's (MySQL: the watchdog)")
    frozen = connect_sync(db_url, init_command=LIMITS.init_command())
    try:
        with frozen.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID()")
            frozen_id = cur.fetchone()[0]
            cur.execute("INSERT INTO pulse_dispatch_heartbeats (node, beat_at, started_at)"
                        " VALUES ('frozen-holder', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
            frozen.commit()
            # Only a locking read, no write: like a claim holding a limited queue's row.
            cur.execute("START TRANSACTION")
            cur.execute("SELECT beat_at FROM pulse_dispatch_heartbeats"
                        " WHERE node = 'frozen-holder' FOR UPDATE")
        # The client now says nothing more, like a stopped process in mid-transaction.

        def gone() -> bool:
            with observer.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                            (frozen_id,))
                return int(cur.fetchone()[0]) == 0

        await until(gone, timeout=10, interval=0.1,
                    message="the server to roll back the silent transaction")
        with observer.cursor() as cur:  # the row is free again: no wait, no lock-wait timeout
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            cur.execute("DELETE FROM pulse_dispatch_heartbeats WHERE node = 'frozen-holder'")
            assert cur.rowcount == 1
    finally:
        frozen.close()
        observer.close()

"""Test databases on a real MariaDB/MySQL server.

``script/test`` starts a throw-away private instance and exports ``ORBIT_TEST_DATABASE_URL`` (a
URL without a database). Run bare, pytest starts one itself under ``/tmp``. Each xdist worker
gets its own migrated database; tests isolate themselves by creating their own tenant (see the
``tenant`` fixture) rather than by truncating tables.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

import orbit_devdb as devdb
from orbit_common.db.migrator import Migrator
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database


def server_url() -> DatabaseUrl:
    url = os.environ.get("ORBIT_TEST_DATABASE_URL")
    if url:
        return DatabaseUrl.parse(url)
    # A per-user directory that devdb creates with mode 0700.
    instance = devdb.start(Path(tempfile.gettempdir()) / f"orbit-pytest-{os.getuid()}")
    os.environ["ORBIT_TEST_DATABASE_URL"] = instance.url()
    return DatabaseUrl.parse(instance.url())


def admin_connection(url: DatabaseUrl) -> pymysql.connections.Connection[Any]:
    return connect_sync(url.with_database(""), autocommit=True)


def create_database(url: DatabaseUrl, name: str, *, migrate: bool = True) -> DatabaseUrl:
    """(Re)create database ``name`` on the server, optionally migrated to the current schema."""
    identifier = devdb.database_identifier(name)  # checked: [A-Za-z0-9_]{1,64}
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {identifier}")
            cur.execute(
                f"CREATE DATABASE {identifier} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
    finally:
        conn.close()
    target = url.with_database(name)
    if migrate:
        Migrator(target).up(log=lambda _msg: None)
    return target


def drop_database(url: DatabaseUrl, name: str) -> None:
    identifier = devdb.database_identifier(name)  # checked: [A-Za-z0-9_]{1,64}
    conn = admin_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {identifier}")
    finally:
        conn.close()


def scratch_name(prefix: str = "orbit_scratch") -> str:
    return f"{prefix}_{secrets.token_hex(4)}"


def own_database(prefix: str, *, pool_max: int = 6, scope: str = "module",
                 names: tuple[str, str] = ("own_url", "db")) -> tuple[Any, Any]:
    """Two fixtures: a migrated database of the test module's own (created once per ``scope``,
    module or function, and dropped after it) and a pool on it, named by ``names`` (its URL,
    its pool), for a test module whose daemons or scans read every namespace, such as the
    workflow engine's lease scans, or whose fault tests kill daemons mid-transaction. In the
    module: ``own_url, db = own_database("orbit_weave_polls")``."""
    url_name, db_name = names

    @pytest.fixture(scope=scope, name=url_name)  # type: ignore[call-overload]
    def own_url() -> Iterator[DatabaseUrl]:
        server = server_url()
        name = scratch_name(prefix)
        yield create_database(server, name)
        drop_database(server, name)

    @pytest.fixture(name=db_name)
    async def db(request: pytest.FixtureRequest) -> AsyncIterator[Database]:
        pool = await open_database(request.getfixturevalue(url_name), minsize=1,
                                   maxsize=pool_max)
        try:
            yield pool
        finally:
            await pool.close()

    return own_url, db

"""The sending application's database for the task-outbox example's tests: a scratch database
on the test server (not Orbit's), with the example's two tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs
import pymysql
from task_outbox import schema
from task_outbox.database import DatabaseUrl as AppUrl

from orbit_common.db.pool import DatabaseUrl, connect_sync
from tests.support import database


@attrs.frozen(kw_only=True)
class AppDatabase:
    """The application's database: ``url`` for assertions (PyMySQL), ``app_url`` for the
    example's own code and command line."""

    name: str
    url: DatabaseUrl
    app_url: AppUrl

    @property
    def rendered(self) -> str:
        return self.url.render(hide_password=False)

    @contextlib.contextmanager
    def sql(self) -> Iterator[pymysql.connections.Connection[Any]]:
        conn = connect_sync(self.url, autocommit=True,
                            cursorclass=pymysql.cursors.DictCursor)
        try:
            yield conn
        finally:
            conn.close()

    def one(self, query: str, args: Any = None) -> dict[str, Any]:
        with self.sql() as conn, conn.cursor() as cur:
            cur.execute(query, args)
            row = cur.fetchone()
            assert row is not None, (query, args)
            return dict(row)

    def value(self, query: str, args: Any = None) -> Any:
        return next(iter(self.one(query, args).values()))


@contextlib.contextmanager
def app_database(server: DatabaseUrl) -> Iterator[AppDatabase]:
    """A fresh application database with ``sender_outbox`` and ``sender_jobs`` (created by
    the example's DDL, as ``task-outbox init-db`` does), dropped afterwards."""
    name = database.scratch_name("sender_app")
    url = database.create_database(server, name, migrate=False)
    try:
        conn = connect_sync(url, autocommit=True)
        try:
            with conn.cursor() as cur:
                for ddl in schema.TABLES:
                    cur.execute(ddl)
        finally:
            conn.close()
        yield AppDatabase(name=name, url=url,
                          app_url=AppUrl.parse(url.render(hide_password=False)))
    finally:
        with contextlib.suppress(pymysql.err.MySQLError):
            database.drop_database(server, name)

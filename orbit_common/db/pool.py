"""Connection settings and the aiomysql pool factory.

Every connection, async or sync, is opened with the same session settings:

* ``time_zone = '+00:00'``: DATETIME(6) values are UTC and ``NOW(6)`` is UTC time.
* the MySQL 8.4 default ``sql_mode`` list, so MariaDB behaves as strictly as production.
* ``innodb_lock_wait_timeout``: short, because a queue-like transaction that waits long is a bug
  and the runner re-runs it anyway.
* the ``FOUND_ROWS`` client flag. Deliberate: with it, ``cursor.rowcount`` after an UPDATE is the
  number of rows the ``WHERE`` clause *matched*, not the number whose values changed. Guarded
  updates put the whole condition in ``WHERE`` (``… AND revision = %s``), so "matched" is exactly
  "the guard held", even when the new values equal the old ones (an idempotent re-apply).
  ``tests/integration/test_db_kernel.py`` pins this.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiomysql
import attrs
import pymysql
from pymysql.constants import CLIENT

from orbit_common.db.tx import Isolation, TransactionRunner

T = TypeVar("T")

SQL_MODE = (
    "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"
)
LOCK_WAIT_TIMEOUT_S = 10
INIT_COMMAND = (
    f"SET time_zone = '+00:00', sql_mode = '{SQL_MODE}', "
    f"innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}"
)
CLIENT_FLAGS = CLIENT.FOUND_ROWS


@attrs.frozen(kw_only=True)
class DatabaseUrl:
    """A parsed ``mysql://user:password@host:port/database?unix_socket=/path`` URL."""

    user: str
    password: str = attrs.field(repr=False)
    host: str = "127.0.0.1"
    port: int = 3306
    database: str = ""
    unix_socket: str | None = None

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in {"mysql", "mariadb"}:
            raise ValueError("database URL must start with mysql:// or mariadb://")
        query = urllib.parse.parse_qs(parts.query)
        unknown = set(query) - {"unix_socket"}
        if unknown:
            raise ValueError(f"unknown database URL parameters: {sorted(unknown)}")
        socket = query.get("unix_socket", [None])[0]
        return cls(
            user=urllib.parse.unquote(parts.username or "root"),
            password=urllib.parse.unquote(parts.password or ""),
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            database=urllib.parse.unquote(parts.path.lstrip("/")),
            unix_socket=socket,
        )

    def with_database(self, database: str) -> DatabaseUrl:
        return attrs.evolve(self, database=database)

    def render(self, *, hide_password: bool = True) -> str:
        auth = urllib.parse.quote(self.user, safe="")
        if self.password:
            # The mask is not URL-quoted, so it reads as "***" rather than "%2A%2A%2A".
            auth += ":" + ("***" if hide_password else urllib.parse.quote(self.password, safe=""))
        # Quoted so that parse() reads the same values back ("+" in a query string is a space).
        socket = urllib.parse.quote(self.unix_socket, safe="/") if self.unix_socket else ""
        query = f"?unix_socket={socket}" if socket else ""
        database = urllib.parse.quote(self.database, safe="")
        return f"mysql://{auth}@{self.host}:{self.port}/{database}{query}"

    def connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "autocommit": False,
            "init_command": INIT_COMMAND,
            "client_flag": CLIENT_FLAGS,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        else:
            kwargs["host"] = self.host
            kwargs["port"] = self.port
        return kwargs


def connect_sync(url: DatabaseUrl, **overrides: Any) -> pymysql.connections.Connection[Any]:
    """A blocking PyMySQL connection with Orbit's session settings (tools and migrations)."""
    kwargs = url.connect_kwargs() | {"database": url.database or None} | overrides
    return pymysql.connect(**kwargs)


class Database:
    """An aiomysql pool plus the transaction runner that every domain transaction goes through."""

    def __init__(self, pool: Any, url: DatabaseUrl) -> None:
        self.pool = pool
        self.url = url
        self._runner = TransactionRunner(pool)

    async def transaction(
        self,
        name: str,
        body: Callable[[Any], Awaitable[T]],
        *,
        isolation: Isolation = Isolation.READ_COMMITTED,
        recheck: Callable[[Any], Awaitable[T | None]] | None = None,
    ) -> T:
        """Run ``body(cursor)`` as one transaction; see :class:`TransactionRunner`."""
        return await self._runner.run(name, body, isolation=isolation, recheck=recheck)

    async def read(self, name: str, body: Callable[[Any], Awaitable[T]]) -> T:
        """Run a read-only ``body`` in a READ COMMITTED transaction (retried like any other)."""
        return await self._runner.run(name, body, isolation=Isolation.READ_COMMITTED)

    async def close(self) -> None:
        self.pool.close()
        await self.pool.wait_closed()


async def open_database(
    url: DatabaseUrl | str, *, minsize: int = 1, maxsize: int = 10, pool_recycle: int = 3600
) -> Database:
    """Open a pool with Orbit's session settings (see the module docstring)."""
    parsed = DatabaseUrl.parse(url) if isinstance(url, str) else url
    pool = await aiomysql.create_pool(
        minsize=minsize,
        maxsize=maxsize,
        pool_recycle=pool_recycle,
        db=parsed.database or None,
        **parsed.connect_kwargs(),
    )
    return Database(pool, parsed)

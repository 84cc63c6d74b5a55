"""Connection settings and the aiomysql pool factory.

Every connection, async or sync, is opened with the same session settings:

* ``time_zone = '+00:00'``: DATETIME(6) values are UTC and ``NOW(6)`` is UTC time.
* the MySQL 8.4 default ``sql_mode`` list, so MariaDB behaves as strictly as production.
* ``innodb_lock_wait_timeout``: short, because a queue-like transaction that waits long is a bug
  and the runner re-runs it anyway (jittered backoff, bounded attempts). The daemons' pools use
  :class:`SessionSettings` from ``[database]`` (2 s by default); tools and tests keep 10 s.
* on MariaDB only, ``idle_transaction_timeout`` (daemon pools, ``[database]
  idle_transaction_timeout_s``): the server rolls back a transaction whose client went silent
  (a frozen, paused or stopped process) and closes its connection, so a frozen holder cannot
  keep a shared counter row locked for the whole pause. Any transaction, not only writing ones
  (``idle_write_transaction_timeout``): a claim holds a limited queue's row through a locking
  read before it writes anything. The setting is sent inside a
  MariaDB executable comment (``/*M!100300 … */``): MariaDB 10.3+ runs it, MySQL skips it as a
  comment, so the same init command detects the server flavour on each connection (also after
  a failover to the other flavour) and never fails on MySQL 8.4, which has no such variable
  (docs/runbooks/liveness.md: what to run there instead).
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
CLIENT_FLAGS = CLIENT.FOUND_ROWS


@attrs.frozen(kw_only=True)
class SessionSettings:
    """Per-connection lock and idle limits (whole seconds: both servers take integers).

    ``idle_transaction_timeout_s`` 0 leaves the server's default (never roll back an idle
    transaction).
    """

    lock_wait_timeout_s: int = LOCK_WAIT_TIMEOUT_S
    idle_transaction_timeout_s: int = 0

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.lock_wait_timeout_s <= 3600:
            raise ValueError("lock_wait_timeout_s must be 1-3600 seconds")
        if not 0 <= self.idle_transaction_timeout_s <= 3600:
            raise ValueError("idle_transaction_timeout_s must be 0-3600 seconds")

    def init_command(self) -> str:
        command = (f"SET time_zone = '+00:00', sql_mode = '{SQL_MODE}', "
                   f"innodb_lock_wait_timeout = {self.lock_wait_timeout_s}")
        if self.idle_transaction_timeout_s:
            # MariaDB-only executable comment: MySQL treats it as a comment (module docstring).
            command += (f" /*M!100300 , idle_transaction_timeout ="
                        f" {self.idle_transaction_timeout_s} */")
        return command


DEFAULT_SESSION = SessionSettings()
INIT_COMMAND = DEFAULT_SESSION.init_command()


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

    def connect_kwargs(self, session: SessionSettings = DEFAULT_SESSION) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "autocommit": False,
            "init_command": session.init_command(),
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
    url: DatabaseUrl | str, *, minsize: int = 1, maxsize: int = 10, pool_recycle: int = 3600,
    session: SessionSettings = DEFAULT_SESSION,
) -> Database:
    """Open a pool with Orbit's session settings (see the module docstring); ``session``
    bounds its lock waits and idle write transactions."""
    parsed = DatabaseUrl.parse(url) if isinstance(url, str) else url
    pool = await aiomysql.create_pool(
        minsize=minsize,
        maxsize=maxsize,
        pool_recycle=pool_recycle,
        db=parsed.database or None,
        **parsed.connect_kwargs(session),
    )
    return Database(pool, parsed)

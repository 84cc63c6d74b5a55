"""The application's database: a URL, an aiomysql pool and the transaction runner.

Every transaction of this example is one async function taking a cursor; :func:`transaction`
runs it in READ COMMITTED (the outbox is a queue: correctness comes from guarded updates, not
snapshots), commits, and re-runs the whole function after a deadlock (1213) or a lock-wait
timeout (1205). All times come from the database (``UTC_TIMESTAMP(6)``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiomysql
import attrs
import pymysql

T = TypeVar("T")

RETRY_ERRNOS = frozenset({1205, 1213})
"""Lock-wait timeout (only the statement was rolled back) and deadlock: roll back, re-run."""

MAX_TRIES = 5


@attrs.frozen(kw_only=True)
class DatabaseUrl:
    """``mysql://user:password@host:port/database?unix_socket=/path``."""

    user: str
    password: str = attrs.field(repr=False)
    host: str
    port: int
    database: str
    unix_socket: str | None

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in {"mysql", "mariadb"}:
            raise ValueError("the database URL starts with mysql:// or mariadb://")
        query = urllib.parse.parse_qs(parts.query)
        database = urllib.parse.unquote(parts.path.lstrip("/"))
        if not database:
            raise ValueError("the database URL names a database (mysql://…/app)")
        return cls(user=urllib.parse.unquote(parts.username or "root"),
                   password=urllib.parse.unquote(parts.password or ""),
                   host=parts.hostname or "127.0.0.1", port=parts.port or 3306,
                   database=database, unix_socket=query.get("unix_socket", [None])[0])

    def connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"user": self.user, "password": self.password,
                                  "db": self.database, "charset": "utf8mb4",
                                  "autocommit": False}
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        else:
            kwargs["host"], kwargs["port"] = self.host, self.port
        return kwargs


async def open_pool(url: DatabaseUrl, *, maxsize: int = 10) -> Any:
    """An aiomysql pool on the application's database (close with ``close(); wait_closed()``)."""
    return await aiomysql.create_pool(minsize=1, maxsize=maxsize, **url.connect_kwargs())


async def close_pool(pool: Any) -> None:
    pool.close()
    await pool.wait_closed()


async def transaction(pool: Any, body: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``body(cursor)`` in one READ COMMITTED transaction and commit; re-run it whole after
    a deadlock or lock-wait timeout. Any other error rolls back and propagates. The cursor
    reads rows as dicts."""
    for attempt in range(1, MAX_TRIES + 1):
        async with pool.acquire() as conn:
            try:
                async with conn.cursor(aiomysql.DictCursor) as cur:
                    await cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    await conn.begin()
                    result = await body(cur)
                await conn.commit()
                return result
            except pymysql.err.MySQLError as exc:
                await _rollback(conn)
                if exc.args and exc.args[0] in RETRY_ERRNOS and attempt < MAX_TRIES:
                    continue
                raise
            except BaseException:
                await _rollback(conn)
                raise
    raise AssertionError("unreachable: the last try returns or raises")


async def _rollback(conn: Any) -> None:
    try:
        await conn.rollback()
    except pymysql.err.MySQLError:
        conn.close()  # a broken connection: the pool drops it, the server rolls back

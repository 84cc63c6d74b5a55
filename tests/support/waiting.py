"""Waiting in async tests: on a condition, with a deadline, never on a bare sleep.

``until`` polls a condition (sync or async) until it is truthy and fails the test after
``timeout`` seconds; the short sleep between polls is only the poll interval. ``statements_waiting``
is the condition most lock-race tests need: how many statements matching a pattern are running
in this test's database right now (PROCESSLIST, readable without the PROCESS privilege, unlike
INNODB_TRX) -- a statement still running there while another transaction holds its row is
waiting for that row's lock.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pymysql


async def until(condition: Callable[[], Any | Awaitable[Any]], *, timeout: float = 10,
                interval: float = 0.01, message: str = "condition") -> Any:
    """Poll ``condition()`` until it returns a truthy value (returned); fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        await asyncio.sleep(interval)  # the poll interval


def statements_waiting(conn: pymysql.connections.Connection[Any], like: str) -> int:
    """Statements of this test's database whose text matches the SQL ``LIKE`` pattern and
    that are running now -- not counting this query, whose own text holds the pattern."""
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                    " WHERE DB = DATABASE() AND COMMAND = 'Query' AND ID <> CONNECTION_ID()"
                    " AND INFO LIKE %s", (like,))
        return int(cur.fetchone()[0])

"""The receiver's own database: a connection pool from a URL, and its schema (schema.sql)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import aiomysql

SCHEMA = Path(__file__).resolve().parent.parent / "schema.sql"


def connect_args(url: str) -> dict[str, Any]:
    """``mysql://user:password@host:port/database[?unix_socket=/path]`` as driver arguments."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "mysql" or not parts.path.strip("/"):
        raise ValueError("expected mysql://user:password@host:port/database")
    query = urllib.parse.parse_qs(parts.query)
    args: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": urllib.parse.unquote(parts.username or ""),
        "password": urllib.parse.unquote(parts.password or ""),
        "db": urllib.parse.unquote(parts.path.strip("/")),
        "charset": "utf8mb4",
        # Timestamps in the tables are UTC; the statements write UTC_TIMESTAMP(6).
        "init_command": "SET time_zone = '+00:00'",
    }
    if "unix_socket" in query:
        args["unix_socket"] = query["unix_socket"][0]
    return args


async def open_pool(url: str, *, maxsize: int = 10) -> aiomysql.Pool:
    return await aiomysql.create_pool(minsize=1, maxsize=maxsize, autocommit=False,
                                      **connect_args(url))


def schema_statements() -> list[str]:
    """The statements of schema.sql (each ends with a line holding only ``;``)."""
    statements = []
    for chunk in SCHEMA.read_text(encoding="utf-8").split("\n;\n"):
        lines = [line for line in chunk.splitlines() if not line.lstrip().startswith("--")]
        code = "\n".join(lines).strip()
        if code:
            statements.append(code)
    return statements


async def init_db(url: str) -> None:
    """Create the two tables if they do not exist (idempotent)."""
    conn = await aiomysql.connect(autocommit=True, **connect_args(url))
    try:
        async with conn.cursor() as cur:
            for statement in schema_statements():
                await cur.execute(statement)
    finally:
        conn.close()

"""Helpers for the API tests: problem-document checks, row-count snapshots, raw HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pymysql
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.health import ReadinessGate
from tests.conftest import api_config
from tests.support.servers import ServiceTestServer

PROBLEM_FIELDS = {"type", "title", "status", "detail", "code"}

# Every table a platform request may write to.
WRITE_TABLES = (
    "orbit_applications",
    "orbit_credentials",
    "orbit_namespaces",
    "orbit_events",
    "orbit_audit_events",
    "orbit_idempotency_keys",
)


async def assert_problem(response: ClientResponse, status: int, code: str) -> dict[str, Any]:
    """Check an RFC 9457 problem document with a stable code; returns its body."""
    text = await response.text()
    assert response.status == status, text
    assert response.content_type == "application/problem+json", text
    body: dict[str, Any] = await response.json()
    assert body.keys() >= PROBLEM_FIELDS, body
    assert body["status"] == status
    assert body["code"] == code, body
    assert body["type"] == f"/problems/{code}"
    assert isinstance(body["title"], str)
    assert body["title"]
    assert isinstance(body["detail"], str)
    assert body["detail"]
    if status == 401:
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    return body


def row_counts(conn: pymysql.connections.Connection[Any],
               tables: tuple[str, ...] = WRITE_TABLES) -> dict[str, int]:
    counts = {}
    with conn.cursor() as cur:
        for table in tables:  # fixed whitelists in the test modules, never input
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            row = cur.fetchone()
            assert row is not None
            counts[table] = int(row[0])
    return counts


@attrs.define
class WriteWatch:
    """Row counts of a set of tables (every platform table by default), to prove that a refused
    request wrote nothing."""

    conn: pymysql.connections.Connection[Any]
    tables: tuple[str, ...] = WRITE_TABLES
    before: dict[str, int] = attrs.field(factory=dict)

    def reset(self) -> None:
        self.before = row_counts(self.conn, self.tables)

    def assert_unchanged(self) -> None:
        assert row_counts(self.conn, self.tables) == self.before

    def delta(self) -> dict[str, int]:
        now = row_counts(self.conn, self.tables)
        return {t: now[t] - self.before[t] for t in self.tables if now[t] != self.before[t]}


@pytest.fixture
def writes(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    """Call ``writes.reset()`` after the setup, then ``writes.assert_unchanged()``."""
    return WriteWatch(sync_conn)


@attrs.frozen
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


async def raw_request(client: TestClient[Any, Any], data: bytes) -> RawResponse:
    """Send bytes the aiohttp client would refuse to send (bad header bytes and the like)."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(data)
        await writer.drain()
        raw = await reader.read()  # the request says "Connection: close"
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status=int(status_line.split()[1]), headers=headers, body=body)


def raw_http(
    method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: localhost"]
    lines += [name + b": " + value for name, value in headers]
    lines += [b"Content-Length: " + str(len(body)).encode(), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.fixture
async def big_db(db_url: DatabaseUrl) -> AsyncIterator[Database]:
    """A pool large enough for many concurrent requests (the ``db`` fixture has 10)."""
    database = await open_database(db_url, minsize=1, maxsize=40)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
async def big_api(big_db: Database, db_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    """The API over ``big_db``."""
    app = create_app(api_config(db_url), big_db, ReadinessGate(SchemaChecker(big_db)))
    client = TestClient(ServiceTestServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()

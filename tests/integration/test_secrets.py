"""No plaintext API key anywhere: not in any table, not in the logs."""

from __future__ import annotations

import logging
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import Tenant


def _every_value(conn: pymysql.connections.Connection[Any]) -> list[bytes]:
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES"
                    " WHERE TABLE_SCHEMA = DATABASE()")
        tables = [row[0] for row in cur.fetchall()]
        values: list[bytes] = []
        for table in tables:
            cur.execute(f"SELECT * FROM `{table}`")  # names from information_schema
            for row in cur.fetchall():
                for value in row:
                    if isinstance(value, bytes):
                        values.append(value)
                    elif value is not None:
                        values.append(str(value).encode())
    return values


async def test_no_table_holds_the_key_or_its_secret(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = tenant.api_key.split("_", 2)[2]
    wrong = tenant.api_key[:-4] + "AAAA"
    # Exercise success and failure paths so every log line they produce is captured.
    await api.get("/v1/whoami", headers=tenant.auth)
    await api.get("/v1/whoami", headers={"Authorization": f"Bearer {wrong}"})
    await api.post("/v1/namespaces", headers={**tenant.auth, "Content-Type": "application/json"},
                   data=b'{"name": 1}')

    stored = _every_value(sync_conn)
    assert stored, "the dump must not be empty"
    for needle in (tenant.api_key.encode(), secret.encode(), wrong.encode()):
        assert not any(needle in value for value in stored)
    logged = "\n".join(record.getMessage() + repr(record.__dict__) for record in caplog.records)
    for needle in (tenant.api_key, secret, wrong):
        assert needle not in logged

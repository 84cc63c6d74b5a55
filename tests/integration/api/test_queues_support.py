"""Helpers shared by the queue API tests (this module holds no tests)."""

from __future__ import annotations

from typing import Any

import prometheus_client
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import Tenant
from tests.integration.api.conftest import WRITE_TABLES, WriteWatch

# The platform tables plus the two a queue request writes.
QUEUE_WRITE_TABLES = (*WRITE_TABLES, "pulse_queues", "pulse_execution_gates")

DEFAULTS = {
    "description": "",
    "offer_lease_ms": 30000,
    "execution_lease_ms": 60000,
    "retry": {"max_attempts": 3, "initial_ms": 1000, "max_ms": 60000, "multiplier": 2,
              "jitter": 0.2},
    "max_concurrent_attempts": None,
    "max_unfinished_tasks": None,
    "max_starts_per_second": None,
    "active_attempts": 0,
    "paused": False,
    "gate": {"state": "OPEN", "control_revision": 1, "reason": None},
    "revision": 1,
}


def refusals(code: str) -> float:
    """``orbit_backpressure_refusals_total{code}`` of this process (the API runs in it)."""
    value = prometheus_client.REGISTRY.get_sample_value(
        "orbit_backpressure_refusals_total", {"code": code})
    return value or 0.0


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def url(namespace: str, *parts: str) -> str:
    return "/".join([f"/v1/namespaces/{namespace}/queues", *parts])


# The queue tests watch the platform tables plus the queue tables.
QueueWrites = WriteWatch


@pytest.fixture
def qwrites(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    """Call ``qwrites.reset()`` after the setup, then ``qwrites.assert_unchanged()``."""
    return WriteWatch(sync_conn, tables=QUEUE_WRITE_TABLES)


def rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


async def create(
    api: TestClient[Any, Any],
    tenant: Tenant,
    name: str,
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    response = await api.post(url(tenant.namespace), json={"name": name, **fields},
                              headers=headers or tenant.auth)
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    return body


USAGE_FIELDS = {"measured_at", "unfinished_tasks", "active_attempts", "starts_in_window",
                "start_window_until", "waiting_tasks", "oldest_waiting_age_ms"}


async def get_with_usage(api: TestClient[Any, Any], tenant: Tenant, name: str
                         ) -> dict[str, Any]:
    """GET of one queue: the queue view plus its ``usage``."""
    response = await api.get(url(tenant.namespace, name), headers=tenant.auth)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    assert set(body["usage"]) == USAGE_FIELDS, body["usage"]
    return body


async def get(api: TestClient[Any, Any], tenant: Tenant, name: str) -> dict[str, Any]:
    """GET of one queue without its ``usage`` (the view every other answer carries)."""
    body = await get_with_usage(api, tenant, name)
    del body["usage"]
    return body


async def list_all(
    api: TestClient[Any, Any], namespace: str, headers: dict[str, str], limit: int
) -> tuple[list[str], int]:
    """Every queue name the key sees, following cursors; also the number of pages."""
    names: list[str] = []
    pages = 0
    target = f"{url(namespace)}?limit={limit}"
    while True:
        response = await api.get(target, headers=headers)
        assert response.status == 200, await response.text()
        page = await response.json()
        pages += 1
        names += [item["name"] for item in page["items"]]
        if page["next_cursor"] is None:
            return names, pages
        target = f"{url(namespace)}?limit={limit}&cursor={page['next_cursor']}"


def set_active_attempts(
    conn: pymysql.connections.Connection[Any], tenant: Tenant, name: str, value: int
) -> None:
    """What the lease protocol does to the runtime counter (no revision change)."""
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE pulse_queues SET active_attempts = %s WHERE namespace_id = %s AND name = %s",
            (value, tenant.namespace_id, name),
        )
        assert cur.rowcount == 1

"""/healthz, /readyz and /metrics served by the API."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from orbit_common.db import migrator
from tests.conftest import Tenant


async def test_healthz(api: TestClient[Any, Any]) -> None:
    response = await api.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_readyz_lists_the_migrations_and_zero_foreign_keys(
    api: TestClient[Any, Any],
) -> None:
    response = await api.get("/readyz")
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["ready"] is True
    assert body["problems"] == []
    assert body["foreign_keys"] == 0
    expected = {f.id for f in migrator.discover()}
    assert expected
    assert set(body["migrations"]) == expected
    assert set(body["migrations"].values()) == {"applied"}
    assert "flush_log_at_trx_commit" in body["durability"]


async def test_metrics_is_prometheus_text_with_transaction_timings(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    assert (await api.get("/v1/whoami", headers=tenant.auth)).status == 200
    response = await api.get("/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain"
    text = await response.text()
    assert "# TYPE orbit_db_transaction_seconds histogram" in text
    assert 'orbit_db_transaction_seconds_count{transaction="whoami"}' in text
    assert 'orbit_db_transaction_seconds_bucket{le="+Inf",transaction="whoami"}' in text or (
        'orbit_db_transaction_seconds_bucket{transaction="whoami",le="+Inf"}' in text
    )
    assert "orbit_ready" in text

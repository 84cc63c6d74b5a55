"""/healthz and a bare /readyz on the API's public port; /metrics and the detailed /readyz only
on the operator listener (orbit_common/service/health.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient

from orbit_common.db import migrator
from orbit_common.db.schema import SchemaReport
from orbit_common.service.health import GATE_KEY, ReadinessGate
from tests.conftest import Tenant
from tests.integration.api.conftest import assert_problem


async def test_healthz(api: TestClient[Any, Any], operator: TestClient[Any, Any]) -> None:
    for client in (api, operator):
        response = await client.get("/healthz")
        assert response.status == 200
        assert await response.json() == {"status": "ok"}


async def test_public_readyz_says_ready_and_nothing_about_the_database(
    api: TestClient[Any, Any],
) -> None:
    response = await api.get("/readyz")
    assert response.status == 200, await response.text()
    assert await response.json() == {"ready": True}


async def test_operator_readyz_lists_the_migrations_and_zero_foreign_keys(
    operator: TestClient[Any, Any],
) -> None:
    response = await operator.get("/readyz")
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
    assert body["durability"]["version"]


async def test_metrics_are_not_served_on_the_public_port(api: TestClient[Any, Any]) -> None:
    response = await api.get("/metrics")
    body = await assert_problem(response, 404, "not_found")
    assert "orbit_" not in str(body)


async def test_metrics_is_prometheus_text_with_transaction_timings(
    api: TestClient[Any, Any], operator: TestClient[Any, Any], tenant: Tenant
) -> None:
    assert (await api.get("/v1/whoami", headers=tenant.auth)).status == 200
    response = await operator.get("/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain"
    text = await response.text()
    assert "# TYPE orbit_db_transaction_seconds histogram" in text
    assert 'orbit_db_transaction_seconds_count{transaction="whoami"}' in text
    assert 'orbit_db_transaction_seconds_bucket{le="+Inf",transaction="whoami"}' in text or (
        'orbit_db_transaction_seconds_bucket{transaction="whoami",le="+Inf"}' in text
    )
    assert "orbit_ready" in text


async def test_other_operator_paths_are_problem_documents(
    operator: TestClient[Any, Any],
) -> None:
    await assert_problem(await operator.get("/v1/whoami"), 404, "not_found")
    await assert_problem(await operator.post("/metrics"), 405, "method_not_allowed")


def _count_checks(gate: ReadinessGate) -> list[int]:
    """A spy on the gate's schema checks (the real check still runs); returns the counter."""
    calls = [0]
    check = gate.checker.check

    async def counted() -> SchemaReport:
        calls[0] += 1
        return await check()

    gate.checker.check = counted  # type: ignore[method-assign]
    return calls


async def test_a_flood_of_public_readyz_costs_one_schema_check(
    api: TestClient[Any, Any], operator: TestClient[Any, Any],
) -> None:
    calls = _count_checks(api.server.app[GATE_KEY])
    answers = await asyncio.gather(*(api.get("/readyz") for _ in range(30)))
    assert {a.status for a in answers} == {200}
    assert calls == [1]  # concurrent requests shared one check, later ones reused it
    # The operator's /readyz checks every time.
    operator_calls = _count_checks(operator.server.app[GATE_KEY])
    for _ in range(3):
        assert (await operator.get("/readyz")).status == 200
    assert operator_calls == [3]

"""HTTP request metrics are labelled by route template, never by raw path."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import Tenant


async def test_requests_are_counted_by_route_template_and_status(
    api: TestClient[Any, Any], operator: TestClient[Any, Any], tenant: Tenant
) -> None:
    assert (await api.get("/v1/whoami", headers=tenant.auth)).status == 200
    assert (await api.get("/v1/whoami")).status == 401
    assert (await api.get("/v1/no/such/thing/123", headers=tenant.auth)).status == 404
    text = await (await operator.get("/metrics")).text()
    assert 'orbit_http_requests_total{method="GET",route="/v1/whoami",status="200"}' in text
    assert 'orbit_http_requests_total{method="GET",route="/v1/whoami",status="401"}' in text
    assert 'route="unmatched",status="404"' in text
    assert "/v1/no/such/thing/123" not in text
    assert "orbit_http_request_seconds_bucket" in text

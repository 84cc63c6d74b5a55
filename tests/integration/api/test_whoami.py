"""GET /v1/whoami."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import Tenant


async def test_whoami_answers_with_the_callers_application_and_namespace(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    response = await api.get("/v1/whoami", headers=tenant.auth)
    assert response.status == 200
    body = await response.json()
    assert body["application"] == {"id": tenant.application_id.hex(), "name": tenant.application}
    assert body["namespaces"] == [tenant.namespace]
    assert body["credential"]["prefix"] == tenant.api_key.split("_")[1]
    assert "api_key" not in body["credential"]


async def test_whoami_without_credential_is_a_401_problem(api: TestClient[Any, Any]) -> None:
    response = await api.get("/v1/whoami")
    assert response.status == 401
    assert response.content_type == "application/problem+json"
    body = await response.json()
    assert body["code"] == "unauthenticated"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")

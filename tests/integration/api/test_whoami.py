"""GET /v1/whoami."""

from __future__ import annotations

import re
import secrets
from typing import Any

import pymysql
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key


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


async def test_whoami_shows_a_restricted_credential_and_only_what_it_covers(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    tag = secrets.token_hex(4)
    for name in (f"team-{tag}", f"other-{tag}"):
        response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
        assert response.status == 201
    grants = [{"namespaces": ["team-*"], "actions": ["namespaces.read"]}]
    key = await make_key(db, tenant, grants)
    response = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"})
    assert response.status == 200
    body = await response.json()
    assert set(body) == {"application", "credential", "grants", "namespaces"}
    assert set(body["credential"]) == {"id", "name", "prefix"}
    assert re.fullmatch(r"[0-9a-f]{32}", body["credential"]["id"])
    assert body["credential"]["prefix"] == key.split("_")[1]
    assert body["grants"] == [{**grants[0], "queues": ["*"]}]
    assert body["namespaces"] == [f"team-{tag}"]
    assert key.split("_", 2)[2] not in await response.text()


async def test_whoami_and_the_list_hide_a_disabled_namespace(
    api: TestClient[Any, Any],
    tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = f"gone-{secrets.token_hex(4)}"
    response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
    assert response.status == 201
    # No API disables a namespace yet; set the state the way a future transaction will.
    with sync_conn.cursor() as cur:
        cur.execute(
            "UPDATE orbit_namespaces SET state = 'DISABLED', revision = revision + 1"
            " WHERE name = %s AND state = 'ACTIVE'",
            (name,),
        )
        assert cur.rowcount == 1
    who = await (await api.get("/v1/whoami", headers=tenant.auth)).json()
    assert who["namespaces"] == [tenant.namespace]
    page = await (await api.get("/v1/namespaces", headers=tenant.auth)).json()
    assert [item["name"] for item in page["items"]] == [tenant.namespace]
    # and the name stays taken
    response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
    assert response.status == 409

"""POST and GET /v1/namespaces: the documented representation, pagination, events and audit."""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.model import cursors
from tests.conftest import Tenant, make_tenant, unique
from tests.integration.api.conftest import WriteWatch, assert_problem

NAMESPACE_FIELDS = {"id", "name", "description", "state", "revision", "created_at", "updated_at"}


def _fetch(
    conn: pymysql.connections.Connection[Any], sql: str, args: tuple[Any, ...]
) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


async def _credential_id(api: TestClient[Any, Any], tenant: Tenant) -> str:
    body = await (await api.get("/v1/whoami", headers=tenant.auth)).json()
    return str(body["credential"]["id"])


async def test_create_returns_201_with_the_documented_fields(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    name = unique("create")
    response = await api.post(
        "/v1/namespaces", json={"name": name, "description": "Team A — 团队"}, headers=tenant.auth
    )
    assert response.status == 201, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body) == NAMESPACE_FIELDS
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["name"] == name
    assert body["description"] == "Team A — 团队"
    assert body["state"] == "ACTIVE"
    assert body["revision"] == 1
    created = dt.datetime.fromisoformat(body["created_at"])
    assert created.utcoffset() == dt.timedelta(0)
    assert body["created_at"].endswith("+00:00")
    assert re.search(r"\.\d{6}\+00:00$", body["created_at"])
    assert body["updated_at"] == body["created_at"]
    assert abs(dt.datetime.now(dt.UTC) - created) < dt.timedelta(minutes=5)


async def test_description_defaults_to_empty(api: TestClient[Any, Any], tenant: Tenant) -> None:
    response = await api.post(
        "/v1/namespaces", json={"name": unique("nodesc")}, headers=tenant.auth
    )
    assert response.status == 201
    assert (await response.json())["description"] == ""


async def test_creation_commits_the_row_an_event_and_an_audit_event(
    api: TestClient[Any, Any],
    tenant: Tenant,
    writes: WriteWatch,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    credential_id = await _credential_id(api, tenant)
    writes.reset()
    name = unique("audited")
    response = await api.post(
        "/v1/namespaces",
        json={"name": name, "description": "d"},
        headers={**tenant.auth, "X-Request-Id": "req-audited-1"},
    )
    assert response.status == 201
    body = await response.json()
    namespace_id = bytes.fromhex(body["id"])
    assert writes.delta() == {"orbit_namespaces": 1, "orbit_events": 1, "orbit_audit_events": 1}

    [row] = _fetch(sync_conn, "SELECT * FROM orbit_namespaces WHERE id = %s", (namespace_id,))
    assert row["application_id"] == tenant.application_id
    assert (row["name"], row["description"], row["state"], row["revision"]) == (
        name,
        "d",
        "ACTIVE",
        1,
    )

    [event] = _fetch(
        sync_conn,
        "SELECT * FROM orbit_events WHERE namespace_id = %s AND aggregate_id = %s",
        (namespace_id, namespace_id),
    )
    assert event["aggregate_type"] == "namespace"
    assert event["event_type"] == "namespace.created"
    assert event["aggregate_revision"] == 1
    assert (event["from_state"], event["to_state"]) == (None, "ACTIVE")
    payload = json.loads(event["payload"])
    assert payload["id"] == body["id"]
    assert payload["name"] == name
    assert payload["application_id"] == tenant.application_id.hex()

    [audit] = _fetch(
        sync_conn,
        "SELECT * FROM orbit_audit_events WHERE resource_type = 'namespace' AND resource_id = %s",
        (namespace_id,),
    )
    assert audit["action"] == "namespace.create"
    assert audit["actor_kind"] == "credential"
    assert audit["actor_id"] == credential_id
    assert audit["namespace_id"] == namespace_id
    assert audit["application_id"] == tenant.application_id
    assert audit["resource_revision"] == 1
    assert audit["request_id"] == "req-audited-1"
    assert audit["before_doc"] is None
    assert json.loads(audit["after_doc"])["name"] == name
    # database time, statement by statement in the one transaction: row, event, audit
    assert row["created_at"] <= event["occurred_at"] <= audit["occurred_at"]
    assert audit["occurred_at"] - row["created_at"] < dt.timedelta(seconds=10)


async def test_a_failed_creation_leaves_no_event_or_audit(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    name = unique("dup")
    response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
    assert response.status == 201
    writes.reset()
    response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
    await assert_problem(response, 409, "already_exists")
    writes.assert_unchanged()


async def test_a_created_namespace_is_listed_and_in_whoami(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    response = await api.post("/v1/namespaces", json={"name": unique("seen")}, headers=tenant.auth)
    created = await response.json()
    page = await (await api.get("/v1/namespaces", headers=tenant.auth)).json()
    assert created in page["items"]
    assert page["next_cursor"] is None
    who = await (await api.get("/v1/whoami", headers=tenant.auth)).json()
    assert created["name"] in who["namespaces"]


async def _walk(
    api: TestClient[Any, Any], tenant: Tenant, limits: list[int]
) -> tuple[list[dict[str, Any]], int]:
    items: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        limit = limits[min(pages, len(limits) - 1)]
        url = f"/v1/namespaces?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        response = await api.get(url, headers=tenant.auth)
        assert response.status == 200, await response.text()
        page = await response.json()
        assert set(page) == {"items", "next_cursor"}
        assert len(page["items"]) <= limit
        items += page["items"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            return items, pages
        assert pages < 100, "the walk does not end"


@pytest.mark.parametrize("limits", [[1], [2], [3], [8], [9], [500], [3, 1, 5]])
async def test_pagination_walks_every_namespace_exactly_once_in_name_order(
    api: TestClient[Any, Any], db: Database, limits: list[int]
) -> None:
    tenant = await make_tenant(db)
    tag = secrets.token_hex(3)
    # Names chosen so that byte order, not insertion order, decides the order.
    names = [f"{p}-{tag}" for p in ("m", "a0", "z", "a", "b.1", "b_1", "b-1")]
    for name in names:
        response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
        assert response.status == 201
    expected = sorted([*names, tenant.namespace])  # 8 namespaces

    items, pages = await _walk(api, tenant, limits)
    assert [item["name"] for item in items] == expected
    assert all(set(item) == NAMESPACE_FIELDS for item in items)
    if limits == [1]:
        assert pages in {8, 9}  # a last, empty page is allowed by the contract


async def test_a_cursor_can_be_reused_and_gives_the_same_page(
    api: TestClient[Any, Any], db: Database
) -> None:
    tenant = await make_tenant(db)
    for i in range(3):
        await api.post("/v1/namespaces", json={"name": unique(f"re{i}")}, headers=tenant.auth)
    first = await (await api.get("/v1/namespaces?limit=2", headers=tenant.auth)).json()
    cursor = first["next_cursor"]
    assert cursor is not None
    url = f"/v1/namespaces?limit=2&cursor={cursor}"
    again = [await (await api.get(url, headers=tenant.auth)).json() for _ in range(2)]
    assert again[0] == again[1]
    assert {i["name"] for i in again[0]["items"]}.isdisjoint({i["name"] for i in first["items"]})


async def test_a_cursor_from_another_tenant_only_positions_within_the_callers_namespaces(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    # A cursor is a position, not an authorization: B's page after A's cursor holds only B's.
    other = await make_tenant(db)
    first = await (await api.get("/v1/namespaces?limit=1", headers=tenant.auth)).json()
    cursor = first["next_cursor"] or cursors.encode("namespaces", {}, [tenant.namespace])
    page = await (await api.get(f"/v1/namespaces?cursor={cursor}", headers=other.auth)).json()
    assert all(item["name"] == other.namespace for item in page["items"])


async def test_a_cursor_of_another_kind_is_refused(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    cursor = cursors.encode("other", {}, ["x"])
    response = await api.get(f"/v1/namespaces?cursor={cursor}", headers=tenant.auth)
    await assert_problem(response, 400, "invalid_cursor")
    cursor = cursors.encode("namespaces", {"state": "ACTIVE"}, ["x"])
    response = await api.get(f"/v1/namespaces?cursor={cursor}", headers=tenant.auth)
    body = await assert_problem(response, 400, "invalid_cursor")
    assert "other filters" in body["detail"]


async def test_the_default_limit_is_100(api: TestClient[Any, Any], tenant: Tenant) -> None:
    page = await (await api.get("/v1/namespaces", headers=tenant.auth)).json()
    assert [item["name"] for item in page["items"]] == [tenant.namespace]
    assert page["next_cursor"] is None


# --- disable and enable ---------------------------------------------------------------------------


async def test_an_operator_disables_and_enables_a_namespace(
    api: TestClient[Any, Any], db: Database, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    from orbit_api.openapi import DOCUMENT
    from tests.support.contract import assert_documented

    ns = tenant.namespace
    assert "/v1/namespaces/{namespace}/disable" in DOCUMENT["paths"]
    created = await api.post(f"/v1/namespaces/{ns}/queues", json={"name": "work"},
                             headers=tenant.auth)
    assert created.status == 201
    task = {"queue": "work", "handler": "h"}
    assert (await api.post(f"/v1/namespaces/{ns}/tasks", json=task,
                           headers=tenant.auth)).status == 201

    for body in (None, {}, {"reason": ""}):
        response = await api.post(f"/v1/namespaces/{ns}/disable", json=body, headers=tenant.auth)
        problem = await assert_problem(response, 400, "validation_failed")
        assert problem["errors"][0]["path"] == "$.reason"
    response = await api.post(f"/v1/namespaces/{ns}/disable",
                              json={"reason": "tenant offboarded"}, headers=tenant.auth)
    assert response.status == 200
    disabled = await response.json()
    assert (disabled["state"], disabled["revision"]) == ("DISABLED", 2)
    assert_documented("/v1/namespaces/{namespace}/disable", "post", 200, disabled)

    # DISABLED: every namespaced route answers as for a namespace that does not exist.
    for method, path, body in [
        ("POST", f"/v1/namespaces/{ns}/tasks", task),
        ("GET", f"/v1/namespaces/{ns}/tasks", None),
        ("GET", f"/v1/namespaces/{ns}/queues/work", None),
        ("POST", f"/v1/namespaces/{ns}/queues/work/pause", {"reason": "x"}),
    ]:
        response = await api.request(method, path, json=body, headers=tenant.auth)
        await assert_problem(response, 404, "namespace_not_found")
    whoami = await (await api.get("/v1/whoami", headers=tenant.auth)).json()
    assert ns not in whoami["namespaces"]
    listed = await (await api.get("/v1/namespaces", headers=tenant.auth)).json()
    assert ns not in [item["name"] for item in listed["items"]]

    again = await api.post(f"/v1/namespaces/{ns}/disable", json={"reason": "again"},
                           headers=tenant.auth)
    assert await again.json() == disabled  # idempotent
    response = await api.post(f"/v1/namespaces/{ns}/enable", json={"reason": "back"},
                              headers=tenant.auth)
    enabled = await response.json()
    assert (response.status, enabled["state"], enabled["revision"]) == (200, "ACTIVE", 3)
    assert (await api.post(f"/v1/namespaces/{ns}/tasks", json=task,
                           headers=tenant.auth)).status == 201

    audits = _fetch(sync_conn, "SELECT action, reason FROM orbit_audit_events WHERE"
                               " resource_id = %s AND action LIKE 'namespace.%%able'"
                               " ORDER BY resource_revision", (tenant.namespace_id,))
    assert audits == [{"action": "namespace.disable", "reason": "tenant offboarded"},
                      {"action": "namespace.enable", "reason": "back"}]


async def test_disabling_needs_namespaces_manage_and_the_callers_namespace(
    api: TestClient[Any, Any], db: Database, tenant: Tenant,
) -> None:
    from tests.conftest import make_key

    reader = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["namespaces.*"]}])
    creator = await make_key(db, tenant, [{"namespaces": ["*"],
                                           "actions": ["namespaces.create", "tasks.*"]}])
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/disable",
                              json={"reason": "x"},
                              headers={"Authorization": f"Bearer {creator}"})
    await assert_problem(response, 403, "forbidden")
    other = await make_tenant(db)
    for ns, key in ((other.namespace, tenant.api_key), (unique("nowhere"), tenant.api_key)):
        response = await api.post(f"/v1/namespaces/{ns}/disable", json={"reason": "x"},
                                  headers={"Authorization": f"Bearer {key}"})
        await assert_problem(response, 404, "namespace_not_found")
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/disable",
                              json={"reason": "x"}, headers={"Authorization": f"Bearer {reader}"})
    assert response.status == 200  # namespaces.* covers namespaces.manage

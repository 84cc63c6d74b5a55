"""Grants on the API: what a restricted key lists, creates and sees; tenant isolation."""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem

READ_TEAM = [{"namespaces": ["team-*"], "actions": ["namespaces.read"]}]
CREATE_TEAM = [{"namespaces": ["team-*"], "actions": ["namespaces.create", "namespaces.read"]}]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _create(api: TestClient[Any, Any], tenant: Tenant, name: str) -> None:
    response = await api.post("/v1/namespaces", json={"name": name}, headers=tenant.auth)
    assert response.status == 201, await response.text()


async def _list_all(api: TestClient[Any, Any], headers: dict[str, str]) -> list[str]:
    names: list[str] = []
    url = "/v1/namespaces?limit=2"
    while True:
        response = await api.get(url, headers=headers)
        assert response.status == 200, await response.text()
        page = await response.json()
        names += [item["name"] for item in page["items"]]
        if page["next_cursor"] is None:
            return names
        url = f"/v1/namespaces?limit=2&cursor={page['next_cursor']}"


async def test_a_read_key_lists_only_the_namespaces_its_pattern_covers(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    tag = secrets.token_hex(4)
    team = [f"team-{tag}-a", f"team-{tag}-b", f"team-{tag}-c"]
    others = [f"other-{tag}", f"teams-{tag}", f"my-team-{tag}", f"zeta-{tag}"]
    for name in team + others:
        await _create(api, tenant, name)
    key = await make_key(db, tenant, READ_TEAM)

    assert await _list_all(api, _bearer(key)) == sorted(team)
    response = await api.get("/v1/whoami", headers=_bearer(key))
    body = await response.json()
    assert body["namespaces"] == sorted(team)
    assert body["grants"] == [
        {"namespaces": ["team-*"], "actions": ["namespaces.read"], "queues": ["*"]}
    ]
    # The all-access key of the same application sees everything.
    everything = await _list_all(api, tenant.auth)
    assert everything == sorted([*team, *others, tenant.namespace])


async def test_a_read_key_cannot_create_and_writes_nothing(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    key = await make_key(db, tenant, READ_TEAM)
    writes.reset()
    for name in (f"team-{secrets.token_hex(4)}", f"other-{secrets.token_hex(4)}"):
        response = await api.post(
            "/v1/namespaces",
            json={"name": name},
            headers={**_bearer(key), "Idempotency-Key": name},
        )
        body = await assert_problem(response, 403, "forbidden")
        assert "namespaces.create" in body["detail"]
    writes.assert_unchanged()


async def test_a_create_key_creates_only_inside_its_pattern(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    key = await make_key(db, tenant, CREATE_TEAM)
    inside = f"team-{secrets.token_hex(4)}"
    response = await api.post("/v1/namespaces", json={"name": inside}, headers=_bearer(key))
    assert response.status == 201, await response.text()

    writes.reset()
    outside = f"other-{secrets.token_hex(4)}"
    response = await api.post("/v1/namespaces", json={"name": outside}, headers=_bearer(key))
    await assert_problem(response, 403, "forbidden")
    writes.assert_unchanged()
    assert outside not in await _list_all(api, tenant.auth)
    assert inside in await _list_all(api, tenant.auth)


async def test_a_key_without_read_lists_nothing_but_whoami_shows_its_patterns(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    tag = secrets.token_hex(4)
    await _create(api, tenant, f"team-{tag}")
    key = await make_key(db, tenant, [{"namespaces": ["team-*"], "actions": ["namespaces.create"]}])
    assert await _list_all(api, _bearer(key)) == []
    body = await (await api.get("/v1/whoami", headers=_bearer(key))).json()
    assert body["namespaces"] == [f"team-{tag}"]


async def test_pages_may_be_empty_but_the_walk_finds_every_readable_namespace_once(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    # More unreadable namespaces ahead than one request scans (10 batches of `limit`).
    tag = secrets.token_hex(4)
    hidden = [f"alpha-{tag}-{i:02}" for i in range(12)]
    visible = [f"team-{tag}-{i}" for i in range(3)]
    for name in hidden + visible:
        await _create(api, tenant, name)
    key = await make_key(db, tenant, READ_TEAM)

    seen: list[str] = []
    empty_pages = 0
    url = "/v1/namespaces?limit=1"
    for _ in range(50):
        response = await api.get(url, headers=_bearer(key))
        page = await response.json()
        assert len(page["items"]) <= 1
        empty_pages += not page["items"]
        seen += [item["name"] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        url = f"/v1/namespaces?limit=1&cursor={page['next_cursor']}"
    else:
        raise AssertionError("the walk did not end")
    assert seen == visible
    assert empty_pages >= 1


async def test_tenant_b_never_sees_tenant_a(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    a = tenant
    b = await make_tenant(db)
    tag = secrets.token_hex(4)
    await _create(api, a, f"team-{tag}-a")
    await _create(api, b, f"team-{tag}-b")

    a_names = await _list_all(api, a.auth)
    b_names = await _list_all(api, b.auth)
    assert a_names == sorted([a.namespace, f"team-{tag}-a"])
    assert b_names == sorted([b.namespace, f"team-{tag}-b"])

    a_who = await (await api.get("/v1/whoami", headers=a.auth)).json()
    b_who = await (await api.get("/v1/whoami", headers=b.auth)).json()
    assert a_who["namespaces"] == a_names
    assert b_who["namespaces"] == b_names
    assert a_who["application"]["id"] == a.application_id.hex()
    assert b_who["application"]["id"] == b.application_id.hex()
    # Same pattern, other application: a team-* key of B sees only B's team-* namespaces.
    b_team = await make_key(db, b, READ_TEAM)
    assert await _list_all(api, _bearer(b_team)) == [f"team-{tag}-b"]


async def test_a_name_used_by_another_tenant_is_already_exists(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    # Namespace names are global (docs/api/namespaces.md): a caller allowed to create a name
    # learns that it is taken, by design. It learns nothing else: not the owner, its id or its
    # description, and a caller without create permission on the name gets 403, not 409.
    a = tenant
    b = await make_tenant(db)
    name = f"team-{secrets.token_hex(4)}"
    response = await api.post(
        "/v1/namespaces", json={"name": name, "description": "secret plans"}, headers=a.auth
    )
    assert response.status == 201
    created = await response.json()
    b_other = await make_key(db, b, [{"namespaces": ["other-*"], "actions": ["*"]}])

    writes.reset()
    response = await api.post("/v1/namespaces", json={"name": name}, headers=b.auth)
    body = await assert_problem(response, 409, "already_exists")
    text = await response.text()
    for leaked in (a.application, a.application_id.hex(), created["id"], "secret plans"):
        assert leaked not in text
    assert set(body) <= {"type", "title", "status", "detail", "code", "instance"}

    # With an idempotency key the answer is the same and nothing is recorded for B.
    response = await api.post(
        "/v1/namespaces", json={"name": name}, headers={**b.auth, "Idempotency-Key": "taken"}
    )
    await assert_problem(response, 409, "already_exists")

    response = await api.post("/v1/namespaces", json={"name": name}, headers=_bearer(b_other))
    await assert_problem(response, 403, "forbidden")
    writes.assert_unchanged()

    assert name not in await _list_all(api, b.auth)
    b_who = await (await api.get("/v1/whoami", headers=b.auth)).json()
    assert name not in b_who["namespaces"]

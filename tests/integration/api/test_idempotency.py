"""Idempotency-Key on POST /v1/namespaces: replay, conflict, scope and real concurrency."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aiohttp
import pymysql
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.api.conftest import WriteWatch, assert_problem

CONCURRENCY = 8


def _count(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
        assert row is not None
        return int(row[0])


def _namespaces_named(conn: pymysql.connections.Connection[Any], name: str) -> int:
    return _count(conn, "SELECT COUNT(*) FROM orbit_namespaces WHERE name = %s", name)


def _idempotency_rows(conn: pymysql.connections.Connection[Any], tenant: Tenant, key: str) -> int:
    return _count(
        conn,
        "SELECT COUNT(*) FROM orbit_idempotency_keys"
        " WHERE operation = 'namespaces.create' AND scope = %s AND idem_key = %s",
        tenant.application_id,
        key.encode(),
    )


async def _post(
    api: TestClient[Any, Any], headers: dict[str, str], body: bytes, key: str | None
) -> tuple[int, bytes]:
    extra = {"Idempotency-Key": key} if key is not None else {}
    response = await api.post(
        "/v1/namespaces",
        data=body,
        headers={**headers, "Content-Type": "application/json", **extra},
    )
    return response.status, await response.read()


async def test_same_key_and_body_replays_the_original_response_byte_for_byte(
    api: TestClient[Any, Any],
    tenant: Tenant,
    writes: WriteWatch,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    key = unique("key")
    name = unique("replay")
    body = json.dumps({"name": name, "description": "first"}).encode()
    writes.reset()
    first = await _post(api, tenant.auth, body, key)
    assert first[0] == 201
    after_first = writes.delta()
    assert after_first == {
        "orbit_namespaces": 1,
        "orbit_events": 1,
        "orbit_audit_events": 1,
        "orbit_idempotency_keys": 1,
    }
    for _ in range(3):
        assert await _post(api, tenant.auth, body, key) == first
    assert writes.delta() == after_first
    assert _namespaces_named(sync_conn, name) == 1
    assert _idempotency_rows(sync_conn, tenant, key) == 1


async def test_the_same_request_spelled_differently_is_a_replay(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    # The digest is over the canonical request: key order, whitespace and an explicit default
    # description do not make it another request (docs/api/namespaces.md).
    key = unique("key")
    name = unique("spelled")
    first = await _post(api, tenant.auth, json.dumps({"name": name}).encode(), key)
    assert first[0] == 201
    writes.reset()
    for body in (
        b'{"description": "", "name": "%s"}' % name.encode(),
        b'  {\n "name" : "%s" }  ' % name.encode(),
        b'{"name": "\\u%04x%s"}' % (ord(name[0]), name[1:].encode()),
    ):
        assert await _post(api, tenant.auth, body, key) == first
    writes.assert_unchanged()


async def test_same_key_with_another_body_is_a_conflict_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    key = unique("key")
    name = unique("conflict")
    first = await _post(api, tenant.auth, json.dumps({"name": name}).encode(), key)
    assert first[0] == 201
    writes.reset()
    for other in ({"name": unique("other")}, {"name": name, "description": "changed"}):
        response = await api.post(
            "/v1/namespaces", json=other, headers={**tenant.auth, "Idempotency-Key": key}
        )
        await assert_problem(response, 409, "idempotency_conflict")
    writes.assert_unchanged()
    # The original is still replayed afterwards.
    assert await _post(api, tenant.auth, json.dumps({"name": name}).encode(), key) == first


async def test_keys_compare_by_exact_bytes(api: TestClient[Any, Any], tenant: Tenant) -> None:
    key = unique("Key")
    first = await _post(api, tenant.auth, json.dumps({"name": unique("exact")}).encode(), key)
    assert first[0] == 201
    # Another spelling of the key is another key: a new request, not a conflict. (Spaces around
    # a header value are not part of it in HTTP, so "key " is the same key.)
    for other_key in (key.upper(), key.lower(), key + "."):
        status, _ = await _post(
            api, tenant.auth, json.dumps({"name": unique("exact")}).encode(), other_key
        )
        assert status == 201, other_key


async def test_the_scope_is_the_application_not_the_credential(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    key = unique("key")
    body = json.dumps({"name": unique("scoped")}).encode()
    first = await _post(api, tenant.auth, body, key)
    assert first[0] == 201
    sibling = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"]}])
    assert await _post(api, {"Authorization": f"Bearer {sibling}"}, body, key) == first


async def test_authorization_is_checked_before_a_replay(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    key = unique("key")
    body = json.dumps({"name": unique("authz")}).encode()
    assert (await _post(api, tenant.auth, body, key))[0] == 201
    reader = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["namespaces.read"]}])
    writes.reset()
    response = await api.post(
        "/v1/namespaces",
        data=body,
        headers={
            "Authorization": f"Bearer {reader}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        },
    )
    await assert_problem(response, 403, "forbidden")
    writes.assert_unchanged()


async def test_two_applications_using_the_same_key_are_independent(
    api: TestClient[Any, Any],
    db: Database,
    tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    other = await make_tenant(db)
    key = unique("shared-key")
    a_body = json.dumps({"name": unique("app-a")}).encode()
    b_body = json.dumps({"name": unique("app-b")}).encode()
    a_first = await _post(api, tenant.auth, a_body, key)
    b_first = await _post(api, other.auth, b_body, key)
    assert a_first[0] == b_first[0] == 201
    assert a_first[1] != b_first[1]
    assert _idempotency_rows(sync_conn, tenant, key) == 1
    assert _idempotency_rows(sync_conn, other, key) == 1
    assert await _post(api, tenant.auth, a_body, key) == a_first
    assert await _post(api, other.auth, b_body, key) == b_first

    # B sending A's exact request under the same key is B's own new request, never A's replay:
    # the name is taken, so B gets already_exists and learns nothing of A's response.
    status, text = await _post(api, other.auth, a_body, unique("fresh"))
    assert status == 409
    status, text = await _post(api, other.auth, a_body, key)
    assert status == 409
    assert json.loads(text)["code"] == "idempotency_conflict"  # B's key holds B's own request


async def test_a_refused_request_does_not_burn_its_key(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    key = unique("key")
    taken = unique("taken")
    assert (await _post(api, tenant.auth, json.dumps({"name": taken}).encode(), None))[0] == 201
    status, _ = await _post(api, tenant.auth, json.dumps({"name": taken}).encode(), key)
    assert status == 409
    assert _idempotency_rows(sync_conn, tenant, key) == 0
    # The same key then works for a request that succeeds.
    status, _ = await _post(api, tenant.auth, json.dumps({"name": unique("free")}).encode(), key)
    assert status == 201


# --- real concurrency ----------------------------------------------------------------------------


async def _concurrent_posts(
    api: TestClient[Any, Any], headers: dict[str, str], bodies: list[bytes], key: str | None
) -> list[tuple[int, bytes]]:
    """One POST per body, all at once, each on its own connection (its own client session)."""
    url = api.make_url("/v1/namespaces")
    extra = {"Idempotency-Key": key} if key is not None else {}
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1, force_close=True))
        for _ in bodies
    ]
    start = asyncio.Event()

    async def one(session: aiohttp.ClientSession, body: bytes) -> tuple[int, bytes]:
        await start.wait()
        async with session.post(
            url,
            data=body,
            headers={**headers, "Content-Type": "application/json", **extra},
        ) as response:
            return response.status, await response.read()

    try:
        tasks = [asyncio.create_task(one(s, b)) for s, b in zip(sessions, bodies, strict=True)]
        start.set()  # a start line: no request goes out before all tasks exist
        return await asyncio.gather(*tasks)
    finally:
        for session in sessions:
            await session.close()


async def test_concurrent_identical_requests_with_one_key_have_one_effect(
    big_api: TestClient[Any, Any],
    big_db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    for _ in range(3):  # a few rounds, to meet more interleavings
        tenant = await make_tenant(big_db)
        key = unique("key")
        name = unique("race")
        body = json.dumps({"name": name, "description": "raced"}).encode()
        results = await _concurrent_posts(big_api, tenant.auth, [body] * CONCURRENCY, key)
        statuses = [status for status, _ in results]
        assert statuses == [201] * CONCURRENCY, [r[1][:200] for r in results]
        assert len({text for _, text in results}) == 1
        assert json.loads(results[0][1])["name"] == name
        assert _namespaces_named(sync_conn, name) == 1
        assert _idempotency_rows(sync_conn, tenant, key) == 1
        # and a later, sequential retry replays the same bytes
        assert await _post(big_api, tenant.auth, body, key) == results[0]


async def test_concurrent_different_requests_with_one_key_have_one_effect(
    big_api: TestClient[Any, Any],
    big_db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = await make_tenant(big_db)
    key = unique("key")
    names = [unique("differ") for _ in range(CONCURRENCY)]
    bodies = [json.dumps({"name": n}).encode() for n in names]
    results = await _concurrent_posts(big_api, tenant.auth, bodies, key)
    codes = Counter(
        "created" if status == 201 else json.loads(text)["code"] for status, text in results
    )
    assert codes == {"created": 1, "idempotency_conflict": CONCURRENCY - 1}, results
    assert sum(_namespaces_named(sync_conn, n) for n in names) == 1
    assert _idempotency_rows(sync_conn, tenant, key) == 1


async def test_concurrent_creations_of_one_name_without_a_key_give_one_201(
    big_api: TestClient[Any, Any],
    big_db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    for _ in range(3):
        tenant = await make_tenant(big_db)
        name = unique("same-name")
        body = json.dumps({"name": name}).encode()
        results = await _concurrent_posts(big_api, tenant.auth, [body] * CONCURRENCY, None)
        statuses = Counter(status for status, _ in results)
        assert statuses == {201: 1, 409: CONCURRENCY - 1}, results
        for status, text in results:
            if status == 409:
                assert json.loads(text)["code"] == "already_exists"
        assert _namespaces_named(sync_conn, name) == 1


async def test_concurrent_creations_of_one_name_by_two_tenants_give_one_owner(
    big_api: TestClient[Any, Any],
    big_db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    a, b = await make_tenant(big_db), await make_tenant(big_db)
    name = unique("contested")
    body = json.dumps({"name": name}).encode()
    results = await asyncio.gather(
        _concurrent_posts(big_api, a.auth, [body] * (CONCURRENCY // 2), unique("ka")),
        _concurrent_posts(big_api, b.auth, [body] * (CONCURRENCY // 2), unique("kb")),
    )
    a_statuses = {status for status, _ in results[0]}
    b_statuses = {status for status, _ in results[1]}
    # One tenant owns the name and all its requests replay 201; the other gets 409 throughout.
    assert {frozenset(a_statuses), frozenset(b_statuses)} == {
        frozenset({201}),
        frozenset({409}),
    }, results
    assert _namespaces_named(sync_conn, name) == 1

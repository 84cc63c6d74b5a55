"""Queue authorization: grants with queue patterns, no existence leak, tenant isolation.

A queue the credential may neither read nor manage answers exactly like a queue that does not
exist (404 queue_not_found); one it can see but not act on is 403 forbidden.
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_queues_support import (
    QueueWrites,
    bearer,
    create,
    get,
    list_all,
    qwrites,
    url,
)

__all__ = ["qwrites"]

READ_PAY = [{"namespaces": ["*"], "actions": ["queues.read"], "queues": ["pay-*"]}]
MANAGE_PAY = [{"namespaces": ["*"], "actions": ["queues.*"], "queues": ["pay-*"]}]
MANAGE_ONLY = [{"namespaces": ["*"], "actions": ["queues.manage"]}]
NO_QUEUES = [{"namespaces": ["*"], "actions": ["namespaces.read", "tasks.submit"]}]

WRITES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("patch", "", {"revision": 1, "description": "x"}),
    ("post", "pause", {"reason": "x"}),
    ("post", "resume", {"reason": "x"}),
]


async def _call(
    api: TestClient[Any, Any], method: str, target: str, body: dict[str, Any] | None,
    headers: dict[str, str],
) -> Any:
    return await api.request(method, target, json=body, headers=headers)


async def _same_404(
    api: TestClient[Any, Any], method: str, existing: str, missing: str, *,
    body: dict[str, Any] | None = None, headers: dict[str, str],
) -> None:
    """An existing queue the key cannot see and a missing one give the same problem."""
    answers = []
    for target in (existing, missing):
        response = await _call(api, method, target, body, headers)
        problem = await assert_problem(response, 404, "queue_not_found")
        answers.append((problem["title"], problem["detail"].replace(target.split("/")[5], "Q")))
    assert answers[0] == answers[1]


async def test_a_read_key_reads_only_queues_its_pattern_covers(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, qwrites: QueueWrites
) -> None:
    tag = unique("t")
    visible = sorted([f"pay-{tag}-a", f"pay-{tag}-b"])
    hidden = [f"ship-{tag}", f"payroll{tag}", f"a-pay-{tag}"]
    for name in visible + hidden:
        await create(api, tenant, name)
    key = bearer(await make_key(db, tenant, READ_PAY))
    ns = tenant.namespace

    response = await api.get(url(ns, visible[0]), headers=key)
    assert response.status == 200
    for name in hidden:
        await _same_404(api, "get", url(ns, name), url(ns, name + "-missing"), headers=key)
    # Hidden rows are skipped whatever the page size; every visible one is reached.
    for limit in (1, 2, 100):
        names, _ = await list_all(api, ns, key, limit)
        assert names == visible

    qwrites.reset()
    for method, suffix, body in WRITES:
        parts = (visible[0], suffix) if suffix else (visible[0],)
        response = await _call(api, method, url(ns, *parts), body, key)
        problem = await assert_problem(response, 403, "forbidden")
        assert "queues.manage" in problem["detail"]
        # Where it cannot even read, a write is told "not found", like for a missing queue.
        hidden_parts = (hidden[0], suffix) if suffix else (hidden[0],)
        response = await _call(api, method, url(ns, *hidden_parts), body, key)
        await assert_problem(response, 404, "queue_not_found")
    response = await api.post(url(ns), json={"name": f"pay-{tag}-c"}, headers=key)
    await assert_problem(response, 403, "forbidden")
    qwrites.assert_unchanged()


async def test_a_manage_key_acts_only_inside_its_pattern(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, qwrites: QueueWrites
) -> None:
    tag = unique("t")
    outside = f"ship-{tag}"
    await create(api, tenant, outside)
    key = bearer(await make_key(db, tenant, MANAGE_PAY))
    ns = tenant.namespace

    mine = await create(api, tenant, f"pay-{tag}", headers=key)
    response = await api.patch(url(ns, mine["name"]), json={"revision": 1, "description": "ok"},
                               headers=key)
    assert response.status == 200
    response = await api.post(url(ns, mine["name"], "pause"), json={"reason": "x"},
                              headers=key)
    assert response.status == 200

    qwrites.reset()
    response = await api.post(url(ns), json={"name": f"ship-{tag}-2"}, headers=key)
    await assert_problem(response, 403, "forbidden")
    # Creating a name that exists but is outside the pattern: forbidden, not already_exists.
    response = await api.post(url(ns), json={"name": outside}, headers=key)
    await assert_problem(response, 403, "forbidden")
    for method, suffix, body in WRITES:
        parts = (outside, suffix) if suffix else (outside,)
        response = await _call(api, method, url(ns, *parts), body, key)
        await assert_problem(response, 404, "queue_not_found")
    qwrites.assert_unchanged()


async def test_a_manage_only_key_may_change_but_not_read(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    name = unique("q")
    await create(api, tenant, name)
    key = bearer(await make_key(db, tenant, MANAGE_ONLY))
    response = await api.get(url(tenant.namespace, name), headers=key)
    await assert_problem(response, 403, "forbidden")
    response = await api.get(url(tenant.namespace), headers=key)
    await assert_problem(response, 403, "forbidden")
    response = await api.post(url(tenant.namespace, name, "pause"), json={"reason": "x"},
                              headers=key)
    assert response.status == 200


async def test_a_key_without_queue_actions_sees_no_queue(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    name = unique("q")
    await create(api, tenant, name)
    key = bearer(await make_key(db, tenant, NO_QUEUES))
    response = await api.get(url(tenant.namespace), headers=key)
    await assert_problem(response, 403, "forbidden")
    await _same_404(api, "get", url(tenant.namespace, name),
                    url(tenant.namespace, name + "-missing"), headers=key)


async def test_a_grant_on_another_namespace_does_not_reach_this_one(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    name = unique("q")
    await create(api, tenant, name)
    key = bearer(await make_key(db, tenant, [{"namespaces": ["elsewhere-*"],
                                              "actions": ["queues.*"]}]))
    for response in (
        await api.get(url(tenant.namespace, name), headers=key),
        await api.get(url(tenant.namespace), headers=key),
        await api.post(url(tenant.namespace), json={"name": unique("q")}, headers=key),
    ):
        await assert_problem(response, 404, "namespace_not_found")


async def test_tenants_are_isolated(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, qwrites: QueueWrites
) -> None:
    name = unique("shared-name")
    theirs = await create(api, tenant, name)
    other = await make_tenant(db)
    ns = tenant.namespace
    qwrites.reset()
    for method, target, body in [
        ("get", url(ns), None),
        ("get", url(ns, name), None),
        ("post", url(ns), {"name": unique("intruder")}),
        ("patch", url(ns, name), {"revision": 1, "description": "mine now"}),
        ("post", url(ns, name, "pause"), {"reason": "x"}),
        ("post", url(ns, name, "resume"), {"reason": "x"}),
    ]:
        response = await _call(api, method, target, body, other.auth)
        await assert_problem(response, 404, "namespace_not_found")
    qwrites.assert_unchanged()
    # B's own namespace holds none of A's queues; the same name there is B's own queue.
    names, _ = await list_all(api, other.namespace, other.auth, 100)
    assert names == []
    mine = await create(api, other, name)
    assert mine["id"] != theirs["id"]
    assert await get(api, tenant, name) == theirs


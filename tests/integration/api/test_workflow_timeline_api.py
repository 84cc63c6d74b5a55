"""GET …/workflows/{workflow_id}/timeline against the real database: the instance's own events
and its signals' events merged in database-time order (oldest or newest first), paged with
cursors bound to the instance and the order, each event once, nothing of another instance or of
tasks; every refusal a stable problem code; 404 for another tenant; 403 without
``workflows.read``; the SDK."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, NotFound

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform.events import append_event
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_workflows_api import QUEUE, ok, published, start
from tests.support import pulse


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    return QUEUE


def path(tenant: Tenant, workflow_id: str, query: str = "") -> str:
    return f"/v1/namespaces/{tenant.namespace}/workflows/{workflow_id}/timeline{query}"


async def signal(api: TestClient[Any, Any], tenant: Tenant, workflow_id: str, n: int) -> str:
    sent = await ok(api, "POST", f"/v1/namespaces/{tenant.namespace}/workflows/{workflow_id}"
                    "/signals", tenant, {"name": "approval", "payload": n, "payload_version": 1})
    return str(sent["id"])


async def instance_event(db: Database, tenant: Tenant, workflow_id: str, revision: int,
                         payload: dict[str, Any] | None = None,
                         aggregate_type: str = "workflow_instance") -> str:
    async def write(cur: Any) -> bytes:
        return await append_event(
            cur, namespace_id=tenant.namespace_id, aggregate_type=aggregate_type,
            aggregate_id=bytes.fromhex(workflow_id), aggregate_revision=revision,
            event_type="workflow.advanced", from_state="RUNNING", to_state="RUNNING",
            payload=payload or {"completed": []})
    return (await db.transaction("test.event", write)).hex()


async def story(api: TestClient[Any, Any], db: Database, tenant: Tenant
                ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """An instance whose own events and signal events interleave; the (type, aggregate id)
    of each event in order."""
    await published(api, tenant)
    mine = await start(api, tenant)
    first = await signal(api, tenant, mine["id"], 1)
    await instance_event(db, tenant, mine["id"], 2)
    second = await signal(api, tenant, mine["id"], 2)
    # An instance event that also names the instance in its payload: found by both reads,
    # listed once.
    await instance_event(db, tenant, mine["id"], 3, {"workflow_id": mine["id"]})
    expected = [("workflow.started", mine["id"]), ("workflow.signal.accepted", first),
                ("workflow.advanced", mine["id"]), ("workflow.signal.accepted", second),
                ("workflow.advanced", mine["id"])]
    return mine, expected


def seen(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["aggregate_id"]) for e in items]


async def test_the_timeline_in_order_both_ways_with_bound_cursors(
        api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str) -> None:
    mine, expected = await story(api, db, tenant)
    # Another instance's events, and a task's event naming nothing, are not part of it.
    other = await start(api, tenant)
    await signal(api, tenant, other["id"], 9)
    await instance_event(db, tenant, mine["id"], 1, aggregate_type="task")

    everything = await ok(api, "GET", path(tenant, mine["id"]), tenant)
    assert seen(everything["items"]) == expected
    assert everything["next_cursor"] is None
    started = everything["items"][0]
    assert (started["aggregate_type"], started["aggregate_revision"], started["from_state"],
            started["to_state"], started["payload"]["definition"]) == (
        "workflow_instance", 1, None, "RUNNING", "orders")
    times = [e["occurred_at"] for e in everything["items"]]
    assert times == sorted(times)
    newest = await ok(api, "GET", path(tenant, mine["id"], "?order=desc"), tenant)
    assert seen(newest["items"]) == expected[::-1]

    for order, want in (("asc", expected), ("desc", expected[::-1])):
        got: list[dict[str, Any]] = []
        query = f"?order={order}&limit=2"
        page = await ok(api, "GET", path(tenant, mine["id"], query), tenant)
        got += page["items"]
        cursors = []
        while page["next_cursor"] is not None:
            cursors.append(page["next_cursor"])
            page = await ok(api, "GET", path(
                tenant, mine["id"], f"{query}&cursor={page['next_cursor']}"), tenant)
            got += page["items"]
        assert seen(got) == want, order
        assert len({e["id"] for e in got}) == len(want)
        # A cursor belongs to its instance and its order.
        flipped = "desc" if order == "asc" else "asc"
        await assert_problem(await api.get(path(tenant, mine["id"], f"?order={flipped}&cursor="
                                                + cursors[0]), headers=tenant.auth),
                             400, "invalid_cursor")
        await assert_problem(await api.get(path(tenant, other["id"], f"{query}&cursor="
                                                + cursors[0]), headers=tenant.auth),
                             400, "invalid_cursor")


async def test_refusals(api: TestClient[Any, Any], db: Database, tenant: Tenant,
                        queue: str) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    for query, code in (("?limit=0", "validation_failed"), ("?limit=101", "validation_failed"),
                        ("?order=newest", "validation_failed"), ("?cursor=x", "invalid_cursor"),
                        ("?page=2", "validation_failed"),
                        ("?order=asc&order=desc", "validation_failed")):
        await assert_problem(await api.get(path(tenant, mine["id"], query),
                                           headers=tenant.auth), 400, code)
    for unknown in (ids.new_id().hex(), "not-hex"):
        await assert_problem(await api.get(path(tenant, unknown), headers=tenant.auth),
                             404, "workflow_instance_not_found")
    no_read = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"], "actions": [
        "workflows.start", "workflows.manage", "workflows.signal", "tasks.submit"]}])
    await assert_problem(await api.get(path(tenant, mine["id"]), headers={
        "Authorization": f"Bearer {no_read}"}), 403, "forbidden")


async def test_another_tenant_sees_nothing(api: TestClient[Any, Any], db: Database,
                                           tenant: Tenant, queue: str) -> None:
    mine, _ = await story(api, db, tenant)
    other = await make_tenant(db)
    # Their key on our namespace; our instance's id in their namespace.
    await assert_problem(await api.get(path(tenant, mine["id"]), headers=other.auth),
                         404, "namespace_not_found")
    await assert_problem(await api.get(path(other, mine["id"]), headers=other.auth),
                         404, "workflow_instance_not_found")


async def test_the_sdk(api: TestClient[Any, Any], db: Database, tenant: Tenant,
                       queue: str) -> None:
    mine, expected = await story(api, db, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        events = [e async for e in orbit.list_workflow_timeline(mine["id"], page_size=2)]
        assert [(e.type, e.aggregate_id) for e in events] == expected
        newest = [e async for e in orbit.list_workflow_timeline(mine["id"], newest_first=True)]
        assert [(e.type, e.aggregate_id) for e in newest] == expected[::-1]
        assert events[0].payload["definition"] == "orders"
        assert events[0].occurred_at is not None
        assert events[0].to_state == "RUNNING"
        with pytest.raises(NotFound):
            [e async for e in orbit.list_workflow_timeline(ids.new_id().hex())]

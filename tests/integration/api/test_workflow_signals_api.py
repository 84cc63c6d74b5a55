"""…/workflows/{workflow_id}/signals…, …/workflow-signals against the real database: sending a
signal (by id, by definition and business key) with idempotency, the signal history with bound
cursors, one signal, every refusal (a stable problem code, nothing written), 404 for another
tenant through every route, 403 without the action, and the SDK. The engine's part (consumption,
dispositions) is tests/integration/weave/test_signals.py's."""

from __future__ import annotations

import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, Conflict, IdempotencyConflict, NotFound, RawJson

from orbit_common.db.pool import Database
from orbit_common.model import ids
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.integration.api.test_workflows_api import QUEUE, call, ns, ok, published, start
from tests.support import pulse

TABLES = ("weave_signals", "weave_instances", "orbit_events", "orbit_idempotency_keys")


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    return QUEUE


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, TABLES)


def signal(**extra: Any) -> dict[str, Any]:
    return {"name": "approval", "correlation_key": "o-1", "payload": {"ok": True},
            "payload_version": 1, **extra}


async def finish(db: Database, tenant: Tenant, workflow_id: str) -> None:
    await db.transaction("test.finish", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'SUCCEEDED', completed_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, bytes.fromhex(workflow_id))))


async def test_send_replay_get_and_list(api: TestClient[Any, Any], tenant: Tenant,
                                        queue: str) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    path = ns(tenant, f"/workflows/{mine['id']}/signals")
    status, first = await call(api, "POST", path, tenant,
                               b'{"name": "approval", "correlation_key": "o-1",'
                               b' "payload": {"amount": 12.50}, "payload_version": 1,'
                               b' "evidence_ref": "psp:1"}', key="sig-1")
    assert status == 201
    assert (first["state"], first["disposition"], first["workflow_id"]) == (
        "PENDING", None, mine["id"])
    assert first["evidence_ref"] == "psp:1"
    status, again = await call(api, "POST", path, tenant,
                               b'{"name": "approval", "correlation_key": "o-1",'
                               b' "payload": {"amount": 12.50}, "payload_version": 1,'
                               b' "evidence_ref": "psp:1"}', key="sig-1")
    assert (status, again) == (201, first)
    await assert_problem(await api.post(path, json=signal(), headers={
        **tenant.auth, "Idempotency-Key": "sig-1"}), 409, "idempotency_conflict")
    got = await ok(api, "GET", f"{path}/{first['id']}", tenant)
    assert got == first
    raw = await api.get(f"{path}/{first['id']}", headers=tenant.auth)
    assert b'"payload":{"amount":12.50}' in await raw.read()  # the digits as written
    sent = [first["id"]]
    for n in range(3):
        sent.append((await ok(api, "POST", path, tenant, signal(payload=n)))["id"])
    page = await ok(api, "GET", f"{path}?limit=2", tenant)
    assert [s["id"] for s in page["items"]] == sent[::-1][:2]
    rest = await ok(api, "GET", f"{path}?limit=2&cursor={page['next_cursor']}", tenant)
    assert [s["id"] for s in rest["items"]] == sent[::-1][2:]
    assert rest["next_cursor"] is None
    other = await start(api, tenant)
    await assert_problem(await api.get(
        ns(tenant, f"/workflows/{other['id']}/signals?cursor={page['next_cursor']}"),
        headers=tenant.auth), 400, "invalid_cursor")
    await assert_problem(await api.get(ns(tenant, f"/workflows/{other['id']}/signals/"
                                                  f"{first['id']}"), headers=tenant.auth),
                         404, "workflow_signal_not_found")
    await assert_problem(await api.get(f"{path}/not-hex", headers=tenant.auth),
                         404, "workflow_signal_not_found")


async def test_send_by_business_key(api: TestClient[Any, Any], db: Database, tenant: Tenant,
                                    queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    by_key = ns(tenant, "/workflow-signals")
    body = {**signal(), "definition": "orders", "business_key": "order-7"}
    watch.reset()
    await assert_problem(await api.post(by_key, json=body, headers=tenant.auth),
                         404, "workflow_instance_not_found")
    first = await start(api, tenant, business_key="order-7")
    sent = await ok(api, "POST", by_key, tenant, body)
    assert sent["workflow_id"] == first["id"]
    second = await start(api, tenant, business_key="order-7")
    watch.reset()
    await assert_problem(await api.post(by_key, json=body, headers=tenant.auth),
                         409, "workflow_instance_ambiguous")
    await finish(db, tenant, first["id"])
    assert (await ok(api, "POST", by_key, tenant, body))["workflow_id"] == second["id"]
    await finish(db, tenant, second["id"])
    watch.reset()
    await assert_problem(await api.post(by_key, json=body, headers=tenant.auth),
                         409, "workflow_instance_finished")
    await assert_problem(await api.post(by_key, json={**body, "definition": "nope"},
                                        headers=tenant.auth), 404, "workflow_instance_not_found")
    watch.assert_unchanged()


async def test_refusals_write_nothing(api: TestClient[Any, Any], db: Database, tenant: Tenant,
                                      queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    path = ns(tenant, f"/workflows/{mine['id']}/signals")
    by_key = ns(tenant, "/workflow-signals")
    watch.reset()
    cases: list[tuple[str, Any, int, str, str | None]] = [
        (path, signal(correlation_key="k" * 513), 400, "validation_failed", "$.correlation_key"),
        (path, signal(correlation_key="é" * 257), 400, "validation_failed", "$.correlation_key"),
        (path, signal(correlation_key=7), 400, "validation_failed", "$.correlation_key"),
        (path, {"payload_version": 1}, 400, "validation_failed", "$.name"),
        (path, signal(name="not a name"), 400, "validation_failed", "$.name"),
        (path, {"name": "approval"}, 400, "validation_failed", "$.payload_version"),
        (path, signal(payload_version=0), 400, "validation_failed", "$.payload_version"),
        (path, signal(payload_version="1"), 400, "validation_failed", "$.payload_version"),
        (path, signal(evidence_ref=""), 400, "validation_failed", "$.evidence_ref"),
        (path, signal(expires_in_ms=999), 400, "validation_failed", "$.expires_in_ms"),
        (path, signal(extra=1), 400, "validation_failed", "$.extra"),
        (path, signal(payload="x" * (256 * 1024)), 400, "validation_failed", "$.payload"),
        (by_key, signal(), 400, "validation_failed", "$.definition"),
        (by_key, {**signal(), "definition": "orders"}, 400, "validation_failed",
         "$.business_key"),
        (by_key, {**signal(), "definition": "orders", "business_key": "k" * 513}, 400,
         "validation_failed", "$.business_key"),
        (path, b'{"name": "approval"', 400, "malformed_json", None),
        (ns(tenant, f"/workflows/{ids.new_id().hex()}/signals"), signal(), 404,
         "workflow_instance_not_found", None),
        (ns(tenant, "/workflows/not-hex/signals"), signal(), 404,
         "workflow_instance_not_found", None),
    ]
    for where, body, status, code, at in cases:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        problem = await assert_problem(await api.post(
            where, data=data, headers={**tenant.auth, "Content-Type": "application/json"}),
            status, code)
        if at is not None:
            assert at in [e["path"] for e in problem["errors"]], problem
    ok_key = await ok(api, "POST", path, tenant, signal(correlation_key="k" * 512))
    assert len(ok_key["correlation_key"]) == 512
    await finish(db, tenant, mine["id"])
    watch.reset()
    await assert_problem(await api.post(path, json=signal(), headers=tenant.auth),
                         409, "workflow_instance_finished")
    watch.assert_unchanged()


async def test_another_tenant_sees_nothing(api: TestClient[Any, Any], db: Database,
                                           tenant: Tenant, queue: str,
                                           watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant, business_key="order-7")
    sent = await ok(api, "POST", ns(tenant, f"/workflows/{mine['id']}/signals"), tenant,
                    signal())
    other = await make_tenant(db)
    watch.reset()
    routes = [
        ("POST", f"/workflows/{mine['id']}/signals", signal()),
        ("GET", f"/workflows/{mine['id']}/signals", None),
        ("GET", f"/workflows/{mine['id']}/signals/{sent['id']}", None),
        ("POST", "/workflow-signals", {**signal(), "definition": "orders",
                                       "business_key": "order-7"}),
    ]
    for method, suffix, body in routes:
        # their key on our namespace
        await assert_problem(await api.request(method, ns(tenant, suffix), json=body,
                                               headers=other.auth), 404, "namespace_not_found")
        # our ids in their namespace
        await assert_problem(await api.request(method, ns(other, suffix), json=body,
                                               headers=other.auth),
                             404, "workflow_instance_not_found")
    watch.assert_unchanged()


async def test_each_route_needs_its_action(api: TestClient[Any, Any], db: Database,
                                           tenant: Tenant, queue: str,
                                           watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant, business_key="order-7")
    path = ns(tenant, f"/workflows/{mine['id']}/signals")
    await ok(api, "POST", path, tenant, signal(), key="sig-1")
    sent = await ok(api, "POST", path, tenant, signal())
    no_signal = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"], "actions": [
        "workflows.read", "workflows.start", "workflows.manage", "tasks.submit"]}])
    no_read = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                           "actions": ["workflows.signal"]}])
    only_signal_some_queue = await make_key(db, tenant, [{
        "namespaces": ["*"], "queues": ["other"], "actions": ["workflows.signal"]}])
    watch.reset()
    for body, where in ((signal(), path), (
            {**signal(), "definition": "orders", "business_key": "order-7"},
            ns(tenant, "/workflow-signals"))):
        for key in (None, "sig-1"):
            headers = {"Authorization": f"Bearer {no_signal}"}
            if key:
                headers["Idempotency-Key"] = key
            await assert_problem(await api.post(where, json=body, headers=headers),
                                 403, "forbidden")
    for suffix in ("", f"/{sent['id']}"):
        await assert_problem(await api.get(path + suffix, headers={
            "Authorization": f"Bearer {no_read}"}), 403, "forbidden")
    # workflows.signal is namespace-wide: a key scoped to some queues may not steer a workflow
    await assert_problem(await api.post(path, json=signal(), headers={
        "Authorization": f"Bearer {only_signal_some_queue}"}), 403, "forbidden")
    watch.assert_unchanged()


async def test_the_sdk(api: TestClient[Any, Any], db: Database, tenant: Tenant,
                       queue: str) -> None:
    await published(api, tenant)
    mine = await start(api, tenant, business_key="order-7")
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        first = await orbit.send_signal(mine["id"], "approval", RawJson('{"n": 1.0e0}'),
                                        correlation_key="o-1", idempotency_key="s1",
                                        evidence_ref="psp:1")
        assert await orbit.send_signal(mine["id"], "approval", RawJson('{"n": 1.0e0}'),
                                       correlation_key="o-1", idempotency_key="s1",
                                       evidence_ref="psp:1") == first
        assert (first.state, first.resolved, first.correlation_key, first.payload_version,
                first.evidence_ref) == ("PENDING", False, "o-1", 1, "psp:1")
        with pytest.raises(IdempotencyConflict):
            await orbit.send_signal(mine["id"], "approval", {"n": 2}, idempotency_key="s1")
        second = await orbit.send_signal(None, "approval", 2, payload_version=2,
                                         definition="orders", business_key="order-7",
                                         expires_in_ms=60_000)
        assert second.workflow_id == mine["id"]
        got = await orbit.get_signal(mine["id"], second.id)
        assert (got.id, got.payload, got.payload_version) == (second.id, 2, 2)
        listed = [s.id async for s in orbit.list_signals(mine["id"], page_size=1)]
        assert listed == [second.id, first.id]
        with pytest.raises(NotFound):
            await orbit.get_signal(mine["id"], ids.new_id().hex())
        with pytest.raises(ValueError, match="business_key"):
            await orbit.send_signal(None, "approval")
        await finish(db, tenant, mine["id"])
        with pytest.raises(Conflict) as finished:
            await orbit.send_signal(mine["id"], "approval")
        assert finished.value.code == "workflow_instance_finished"

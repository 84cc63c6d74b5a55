"""``POST /v1/namespaces/{namespace}/workflows/batch`` against the real database: 1–100 starts
in one transaction, each exactly what a single start writes, per-item idempotency shared with
the single start, all or nothing on any refusal (docs/api/workflows.md "批量启动")."""

from __future__ import annotations

from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, WorkflowStart

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.integration.api.test_workflows_api import (
    WEAVE_TABLES,
    call,
    doc,
    ns,
    ok,
    published,
    start,
)
from tests.support import pulse

QUEUE = "work"
BATCH = "/workflows/batch"


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    return QUEUE


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, WEAVE_TABLES)


def rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> list[Any]:
    conn.commit()  # a fresh snapshot
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def written(conn: pymysql.connections.Connection[Any], instance_id: str) -> dict[str, Any]:
    """What the start wrote for one instance, independent of its ids and times."""
    raw = bytes.fromhex(instance_id)
    ((state, revision, version, business_key, text, gate_state),) = rows(
        conn, "SELECT i.state, i.revision, i.version, i.business_key, i.input, g.state"
        " FROM weave_instances i JOIN pulse_execution_gates g"
        " ON g.namespace_id = i.namespace_id AND g.id = i.gate_id AND g.owner_id = i.id"
        " WHERE i.id = %s", raw)
    steps = rows(conn, "SELECT s.name, s.kind, s.state, a.sequence, a.state"
                       " FROM weave_steps s JOIN weave_activations a"
                       " ON a.step_id = s.id AND a.id = s.live_activation_id"
                       " WHERE s.instance_id = %s", raw)
    advances = rows(conn, "SELECT kind, state FROM weave_pending_advances"
                          " WHERE instance_id = %s", raw)
    events = rows(conn, "SELECT event_type, aggregate_revision FROM orbit_events"
                        " WHERE aggregate_id = %s", raw)
    audits = rows(conn, "SELECT action, actor_kind FROM orbit_audit_events"
                        " WHERE resource_id = %s", raw)
    return {"instance": (state, revision, version, business_key, text, gate_state),
            "steps": steps, "advances": advances, "events": events, "audits": audits}


async def test_a_batch_writes_what_single_starts_write(
        api: TestClient[Any, Any], tenant: Tenant, queue: str,
        sync_conn: pymysql.connections.Connection[Any]) -> None:
    await published(api, tenant)
    single = await start(api, tenant, business_key="k-1")
    status, answer = await call(api, "POST", ns(tenant, BATCH), tenant, {"instances": [
        {"definition": "orders", "input": {"n": 1}, "business_key": "k-1"},
        {"definition": "orders", "version": 1, "input": {"n": 2}},
    ]})
    assert status == 201, answer
    first, second = answer["instances"]
    assert (first["replayed"], second["replayed"]) == (False, False)
    assert first["id"] != second["id"] != single["id"]
    # The receipt is the single start's receipt shape (plus replayed).
    assert set(first) - {"replayed"} == set(single)
    assert (first["state"], first["revision"], first["version"], first["business_key"],
            first["input"]) == ("RUNNING", 1, 1, "k-1", {"n": 1})
    assert first["created_at"] == second["created_at"]  # one transaction, one database time
    assert written(sync_conn, first["id"]) == written(sync_conn, single["id"])
    assert written(sync_conn, second["id"])["instance"][4] == '{"n":2}'
    # The detail reads the same as a single start's.
    detail = await ok(api, "GET", ns(tenant, f"/workflows/{second['id']}"), tenant)
    assert detail["id"] == second["id"]
    assert detail["state"] == "RUNNING"


async def test_item_keys_replay_and_are_shared_with_the_single_start(
        api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    status, single = await call(api, "POST", ns(tenant, "/workflows"), tenant,
                                {"definition": "orders", "input": {"n": 1}}, key="s-1")
    assert status == 201, single
    batch = {"instances": [
        {"definition": "orders", "input": {"n": 1}, "idempotency_key": "s-1"},
        {"definition": "orders", "input": {"n": 2}, "idempotency_key": "b-2"},
    ]}
    answer = await ok(api, "POST", ns(tenant, BATCH), tenant, batch)
    replayed, fresh = answer["instances"]
    assert replayed == {**single, "replayed": True}
    assert fresh["replayed"] is False
    # The whole batch again: both items replay their original receipts, nothing is written.
    watch.reset()
    again = await ok(api, "POST", ns(tenant, BATCH), tenant, batch)
    assert [i["id"] for i in again["instances"]] == [single["id"], fresh["id"]]
    assert [i["replayed"] for i in again["instances"]] == [True, True]
    watch.assert_unchanged()
    # The batch item's key replays through the single start too.
    status, via_single = await call(api, "POST", ns(tenant, "/workflows"), tenant,
                                    {"definition": "orders", "input": {"n": 2}}, key="b-2")
    assert status == 201
    assert via_single["id"] == fresh["id"]
    # Another request under a used key: a conflict naming the item, nothing written.
    problem = await assert_problem(await api.post(ns(tenant, BATCH), json={"instances": [
        {"definition": "orders", "input": {"n": 5}},
        {"definition": "orders", "input": {"n": 3}, "idempotency_key": "b-2"}]},
        headers=tenant.auth), 409, "idempotency_conflict")
    assert "$.instances[1].idempotency_key" in problem["detail"]
    watch.assert_unchanged()


async def test_any_refusal_writes_nothing(api: TestClient[Any, Any], tenant: Tenant,
                                          queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": "draft"})
    watch.reset()
    good = {"definition": "orders", "input": {"n": 1}}
    cases: list[tuple[dict[str, Any], int, str, str | None]] = [
        ({"instances": []}, 400, "validation_failed", "$.instances"),
        ({"instances": [good] * 101}, 400, "validation_failed", "$.instances"),
        ({"instances": "x"}, 400, "validation_failed", "$.instances"),
        ({"instances": [good], "extra": 1}, 400, "validation_failed", "$.extra"),
        ({"instances": [good, {**good, "colour": 1}]}, 400, "validation_failed",
         "$.instances[1].colour"),
        ({"instances": [good, {**good, "version": 0}]}, 400, "validation_failed",
         "$.instances[1].version"),
        ({"instances": [good, 7]}, 400, "validation_failed", "$.instances[1]"),
        ({"instances": [{**good, "business_key": ""}]}, 400, "validation_failed",
         "$.instances[0].business_key"),
        ({"instances": [{**good, "idempotency_key": 5}]}, 400, "validation_failed",
         "$.instances[0].idempotency_key"),
        ({"instances": [{**good, "idempotency_key": ""}]}, 400, "validation_failed",
         "$.instances[0].idempotency_key"),
        ({"instances": [{**good, "idempotency_key": "k"}, {**good, "idempotency_key": "k"}]},
         400, "validation_failed", "$.instances[1].idempotency_key"),
        ({"instances": [good, {"definition": "orders", "input": {"n": "one"}}]}, 400,
         "validation_failed", "$.instances[1].input.n"),
        ({"instances": [good, {"definition": "nope"}]}, 404, "definition_not_found", None),
        ({"instances": [good, {**good, "version": 9}]}, 404, "definition_version_not_found",
         None),
        ({"instances": [good, {"definition": "draft"}]}, 409, "definition_not_published", None),
    ]
    for body, status, code, path in cases:
        problem = await assert_problem(await api.post(ns(tenant, BATCH), json=body,
                                                      headers=tenant.auth), status, code)
        if path is not None:
            assert path in [e["path"] for e in problem["errors"]], (body, problem)
    # The header names a whole request: a batch takes keys per item.
    problem = await assert_problem(await api.post(
        ns(tenant, BATCH), json={"instances": [good]},
        headers={**tenant.auth, "Idempotency-Key": "whole"}), 400, "validation_failed")
    assert problem["errors"][0]["path"] == "Idempotency-Key"
    watch.assert_unchanged()
    # GET …/workflows/batch is no route, not a malformed instance id.
    response = await api.get(ns(tenant, BATCH), headers=tenant.auth)
    assert response.status == 405


async def test_authorization_comes_before_any_replay(
        api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str,
        watch: WriteWatch) -> None:
    other_tenant = await make_tenant(db)
    await published(api, tenant)
    await ok(api, "POST", ns(tenant, BATCH), tenant, {"instances": [
        {"definition": "orders", "input": {"n": 1}, "idempotency_key": "a"}]})
    # workflows.start without tasks.submit on the version's queue: 403, not the receipt.
    starter = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                           "actions": ["workflows.start"]}])
    watch.reset()
    body = {"instances": [{"definition": "orders", "input": {"n": 1}, "idempotency_key": "a"}]}
    await assert_problem(await api.post(ns(tenant, BATCH), json=body,
                                        headers={"Authorization": f"Bearer {starter}"}),
                         403, "forbidden")
    # Another tenant: the namespace is not found.
    await assert_problem(await api.post(ns(tenant, BATCH), json=body,
                                        headers=other_tenant.auth), 404, "namespace_not_found")
    watch.assert_unchanged()


async def test_the_sdk_starts_a_batch_and_retries_it_safely(
        api: TestClient[Any, Any], tenant: Tenant, queue: str) -> None:
    await published(api, tenant, document=doc())
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as sdk:
        await _sdk_batch(sdk)


async def _sdk_batch(sdk: Client) -> None:
    starts = [WorkflowStart(definition="orders", input={"n": n}, business_key=f"o-{n}")
              for n in range(1, 4)]
    keyed = [WorkflowStart(definition="orders", input={"n": 9}, idempotency_key="sdk-9")]
    first = await sdk.start_workflows([*starts, *keyed])
    assert [i.business_key for i in first[:3]] == ["o-1", "o-2", "o-3"]
    assert all(i.state == "RUNNING" for i in first)
    (again,) = await sdk.start_workflows(keyed)
    assert again.id == first[3].id
    assert again.raw["replayed"] is True

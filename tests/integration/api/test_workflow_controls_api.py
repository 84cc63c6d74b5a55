"""…/workflows/{workflow_id}/pause, …/resume and …/cancel against the real database: the
instance after the change, idempotency, the compare-and-set on the control revision, every
refusal (a stable problem code, nothing written), another tenant's 404, 403 without
``workflows.control``, and the SDK. The engine's part (parking, replay, the stop's settlement)
is tests/integration/weave/test_pause.py's and test_stop.py's."""

from __future__ import annotations

from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, Conflict

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.integration.api.test_workflows_api import QUEUE, call, ns, ok, published, start
from tests.support import pulse

TABLES = ("weave_instances", "weave_pending_advances", "pulse_execution_gates", "orbit_events",
          "orbit_audit_events", "orbit_idempotency_keys")


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    return QUEUE


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, TABLES)


async def test_pause_and_resume_over_http(api: TestClient[Any, Any], tenant: Tenant,
                                          queue: str) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    assert (mine["paused"], mine["control_revision"], mine["checkpoints"]) == (False, 1, 0)
    path = ns(tenant, f"/workflows/{mine['id']}")
    status, paused = await call(api, "POST", path + "/pause", tenant,
                                {"reason": "provider outage", "control_revision": 1}, key="p1")
    assert status == 200, paused
    assert (paused["paused"], paused["control_revision"], paused["state"]) == (True, 2, "RUNNING")
    assert [s["name"] for s in paused["steps"]] == ["$root"]
    assert await call(api, "POST", path + "/pause", tenant,
                      {"reason": "provider outage", "control_revision": 1}, key="p1") == (
        200, paused)
    got = await ok(api, "GET", path, tenant)
    assert (got["paused"], got["control_revision"]) == (True, 2)
    resumed = await ok(api, "POST", path + "/resume", tenant, {"reason": "back"})
    assert (resumed["paused"], resumed["control_revision"]) == (False, 3)


async def test_refusals_write_nothing(api: TestClient[Any, Any], tenant: Tenant, queue: str,
                                      watch: WriteWatch, db: Database) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    path = ns(tenant, f"/workflows/{mine['id']}")
    auth = {**tenant.auth, "Content-Type": "application/json"}
    await ok(api, "POST", path + "/pause", tenant, {"reason": "first"}, key="p1")
    watch.reset()
    for body in ({}, {"reason": ""}, {"reason": "x" * 1025}, {"reason": 5},
                 {"reason": "r", "control_revision": 0}, {"reason": "r", "control_revision": "2"},
                 {"reason": "r", "extra": 1}):
        await assert_problem(await api.post(path + "/resume", json=body, headers=auth), 400,
                             "validation_failed")
    await assert_problem(await api.post(path + "/resume", data=b"[1]", headers=auth), 400,
                         "validation_failed")
    await assert_problem(await api.post(path + "/resume", json={"reason": "r",
                                                                "control_revision": 1},
                                        headers=auth), 409, "stale_revision")
    await assert_problem(await api.post(path + "/pause", json={"reason": "other"}, headers={
        **auth, "Idempotency-Key": "p1"}), 409, "idempotency_conflict")
    await assert_problem(await api.post(ns(tenant, f"/workflows/{'00' * 16}/pause"),
                                        json={"reason": "r"}, headers=auth), 404,
                         "workflow_instance_not_found")
    await assert_problem(await api.post(ns(tenant, "/workflows/xyz/pause"),
                                        json={"reason": "r"}, headers=auth), 404,
                         "workflow_instance_not_found")
    watch.assert_unchanged()
    await db.transaction("test.end", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'SUCCEEDED', completed_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, bytes.fromhex(mine["id"]))))
    watch.reset()
    await assert_problem(await api.post(path + "/resume", json={"reason": "r"}, headers=auth),
                         409, "workflow_instance_finished")
    watch.assert_unchanged()


async def test_another_tenant_and_a_key_without_the_action_are_refused(
        api: TestClient[Any, Any], tenant: Tenant, queue: str, db: Database,
        watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    other = await make_tenant(db)
    reader = await make_key(db, tenant, [{"namespaces": [tenant.namespace], "queues": ["*"],
                                          "actions": ["workflows.read", "workflows.start"]}])
    watch.reset()
    path = f"/workflows/{mine['id']}/pause"
    await assert_problem(await api.post(ns(tenant, path), json={"reason": "r"},
                                        headers=other.auth), 404, "namespace_not_found")
    await assert_problem(await api.post(ns(tenant, path), json={"reason": "r"}, headers={
        "Authorization": f"Bearer {reader}"}), 403, "forbidden")
    watch.assert_unchanged()


async def test_the_sdk_pauses_and_resumes(api: TestClient[Any, Any], tenant: Tenant,
                                          queue: str) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        paused = await orbit.pause_workflow(mine["id"], "maintenance", control_revision=1)
        assert (paused.paused, paused.control_revision, paused.checkpoints) == (True, 2, 0)
        with pytest.raises(Conflict) as stale:
            await orbit.resume_workflow(mine["id"], "back", control_revision=1)
        assert stale.value.code == "stale_revision"
        resumed = await orbit.resume_workflow(mine["id"], "back", control_revision=2)
        assert (resumed.paused, resumed.control_revision) == (False, 3)
        assert (await orbit.get_workflow(mine["id"])).paused is False


async def test_cancel_over_http(api: TestClient[Any, Any], tenant: Tenant, queue: str,
                                db: Database, watch: WriteWatch) -> None:
    """202 with the STOPPING instance (the stop intent, the gate STOPPED); a replay under the
    key is the original receipt; a repeat is 200 and changes nothing; pause and resume of a
    stopping instance are ``workflow_instance_stopping``; an ended one is
    ``workflow_instance_finished`` and nothing is written."""
    await published(api, tenant)
    mine = await start(api, tenant)
    assert (mine["stop_kind"], mine["stop_requested_at"], mine["cancel_requested_at"]) == (
        None, None, None)
    path = ns(tenant, f"/workflows/{mine['id']}")
    status, stopping = await call(api, "POST", path + "/cancel", tenant,
                                  {"reason": "order withdrawn", "control_revision": 1},
                                  key="c1")
    assert status == 202, stopping
    assert (stopping["state"], stopping["stop_kind"], stopping["control_revision"]) == (
        "STOPPING", "CANCEL", 2)
    assert stopping["stop_requested_at"] == stopping["cancel_requested_at"] is not None
    assert stopping["error"] == {"error": "cancelled", "cause": "order withdrawn"}
    assert await call(api, "POST", path + "/cancel", tenant,
                      {"reason": "order withdrawn", "control_revision": 1}, key="c1") == (
        202, stopping)
    auth = {**tenant.auth, "Content-Type": "application/json"}
    watch.reset()
    status, again = await call(api, "POST", path + "/cancel", tenant, {"reason": "again"})
    assert (status, again["control_revision"], again["stop_kind"]) == (200, 2, "CANCEL")
    for verb in ("pause", "resume"):
        await assert_problem(await api.post(path + f"/{verb}", json={"reason": "r"},
                                            headers=auth), 409, "workflow_instance_stopping")
    await assert_problem(await api.post(path + "/cancel", json={"reason": "r"}, headers={
        **auth, "Idempotency-Key": "c1"}), 409, "idempotency_conflict")
    watch.assert_unchanged()
    listed = await ok(api, "GET", ns(tenant, "/workflows?state=STOPPING"), tenant)
    assert [i["id"] for i in listed["items"]] == [mine["id"]]
    await db.transaction("test.end", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'CANCELLED', completed_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, bytes.fromhex(mine["id"]))))
    watch.reset()
    await assert_problem(await api.post(path + "/cancel", json={"reason": "r"}, headers=auth),
                         409, "workflow_instance_finished")
    watch.assert_unchanged()


async def test_cancel_refusals_write_nothing(api: TestClient[Any, Any], tenant: Tenant,
                                             queue: str, db: Database,
                                             watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    path = ns(tenant, f"/workflows/{mine['id']}/cancel")
    auth = {**tenant.auth, "Content-Type": "application/json"}
    other = await make_tenant(db)
    reader = await make_key(db, tenant, [{"namespaces": [tenant.namespace], "queues": ["*"],
                                          "actions": ["workflows.read", "workflows.start"]}])
    watch.reset()
    for body in ({}, {"reason": ""}, {"reason": "x" * 1025}, {"reason": "r", "extra": 1},
                 {"reason": "r", "control_revision": 0}):
        await assert_problem(await api.post(path, json=body, headers=auth), 400,
                             "validation_failed")
    await assert_problem(await api.post(path, json={"reason": "r", "control_revision": 7},
                                        headers=auth), 409, "stale_revision")
    await assert_problem(await api.post(ns(tenant, f"/workflows/{'00' * 16}/cancel"),
                                        json={"reason": "r"}, headers=auth), 404,
                         "workflow_instance_not_found")
    await assert_problem(await api.post(path, json={"reason": "r"}, headers=other.auth), 404,
                         "namespace_not_found")
    await assert_problem(await api.post(path, json={"reason": "r"}, headers={
        "Authorization": f"Bearer {reader}"}), 403, "forbidden")
    watch.assert_unchanged()


async def test_the_sdk_cancels(api: TestClient[Any, Any], tenant: Tenant, queue: str) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        with pytest.raises(Conflict) as stale:
            await orbit.cancel_workflow(mine["id"], "withdrawn", control_revision=9)
        assert stale.value.code == "stale_revision"
        stopping = await orbit.cancel_workflow(mine["id"], "withdrawn", control_revision=1)
        assert (stopping.state, stopping.stop_kind, stopping.control_revision) == (
            "STOPPING", "CANCEL", 2)
        assert stopping.stop_requested_at is not None
        assert stopping.cancel_requested_at == stopping.stop_requested_at
        again = await orbit.cancel_workflow(mine["id"], "again")
        assert (again.state, again.control_revision) == ("STOPPING", 2)

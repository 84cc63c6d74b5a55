"""GET …/workflows/{workflow_id} shows each step's current activation by default and every
activation (historical ones too) with ``?activations=all``, against the real database; the
operator CLI and the SDK the same. A step with a superseded first activation and a LIVE second
one (as a retry leaves it) is made directly in the tables."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient
from orbit_sdk import Client

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.model import ids
from tests.conftest import Tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_workflows_api import ok
from tests.integration.test_admin_cli import ok as admin_ok
from tests.integration.weave.test_inbox import workflow_task


async def superseded(db: Database, tenant: Tenant) -> tuple[str, bytes, bytes]:
    """An instance whose step ``a`` has a SUPERSEDED first activation and a LIVE second one;
    the instance id and both activation ids."""
    _, instance, first = await workflow_task(db, tenant)
    assert first is not None
    second = ids.new_id()

    async def body(cur: Any) -> None:
        await cur.execute("SELECT id FROM weave_steps WHERE namespace_id = %s"
                          " AND instance_id = %s AND name = 'a'",
                          (tenant.namespace_id, instance["id"]))
        (step_id,) = (await cur.fetchone()).values()
        await cur.execute(
            "UPDATE weave_activations SET state = 'SUPERSEDED', live_step_id = NULL,"
            " ended_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND id = %s",
            (tenant.namespace_id, first))
        await cur.execute(
            "INSERT INTO weave_activations (namespace_id, instance_id, step_id, id, sequence,"
            " state, live_step_id, created_at) VALUES (%s, %s, %s, %s, 2, 'LIVE', %s,"
            " UTC_TIMESTAMP(6))", (tenant.namespace_id, instance["id"], step_id, second, step_id))
        await cur.execute(
            "UPDATE weave_steps SET activation_count = 2, live_activation_id = %s"
            " WHERE namespace_id = %s AND id = %s", (second, tenant.namespace_id, step_id))

    await db.transaction("test.supersede", body)
    return instance["id"].hex(), first, second


def step_a(view: dict[str, Any]) -> dict[str, Any]:
    (step,) = [s for s in view["steps"] if s["name"] == "a"]
    return dict(step)


async def test_current_by_default_every_one_on_request(
        api: TestClient[Any, Any], db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    workflow_id, first, second = await superseded(db, tenant)
    path = f"/v1/namespaces/{tenant.namespace}/workflows/{workflow_id}"
    current = step_a(await ok(api, "GET", path, tenant))
    assert (current["activation_count"], current["current_activation"]) == (2, 2)
    assert [(a["id"], a["sequence"], a["state"]) for a in current["activations"]] == [
        (second.hex(), 2, "LIVE")]
    everything = step_a(await ok(api, "GET", path + "?activations=all", tenant))
    assert [(a["id"], a["sequence"], a["state"]) for a in everything["activations"]] == [
        (first.hex(), 1, "SUPERSEDED"), (second.hex(), 2, "LIVE")]
    # The superseded activation keeps its task and what its result has become.
    assert everything["activations"][0]["task_id"] is not None
    assert everything["activations"][0]["task_state"] == "WAITING"
    assert step_a(await ok(api, "GET", path + "?activations=current", tenant)) == current
    for query in ("?activations=some", "?activations=all&activations=all", "?page=1"):
        await assert_problem(await api.get(path + query, headers=tenant.auth),
                             400, "validation_failed")
    # The root step: one activation, current and all alike.
    (root,) = [s for s in (await ok(api, "GET", path, tenant))["steps"]
               if s["name"] == "$root"]
    assert (root["activation_count"], root["current_activation"], len(root["activations"])) == (
        1, 1, 1)

    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        (sdk_current,) = [s for s in (await orbit.get_workflow(workflow_id)).steps
                          if s.name == "a"]
        assert (sdk_current.current_activation, sdk_current.activation_count,
                [a.sequence for a in sdk_current.activations]) == (2, 2, [2])
        (sdk_all,) = [s for s in (await orbit.get_workflow(
            workflow_id, all_activations=True)).steps if s.name == "a"]
        assert [a.sequence for a in sdk_all.activations] == [1, 2]

    shown = (await admin_ok(db_url, "workflows", "instances", "get", workflow_id,
                            "--namespace", tenant.namespace)).json()
    assert [a["sequence"] for a in step_a(shown)["activations"]] == [2]
    every = json.loads((await admin_ok(db_url, "workflows", "instances", "get", workflow_id,
                                       "--namespace", tenant.namespace,
                                       "--all-activations")).out)
    assert [a["sequence"] for a in step_a(every)["activations"]] == [1, 2]

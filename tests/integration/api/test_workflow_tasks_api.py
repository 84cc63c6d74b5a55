"""The task source view in both directions (issue 16 part 4), with the engine making the tasks:
``GET …/workflows/{id}/tasks`` lists every task an instance created (a TASK step's, each POLL
round's) with its step, activation and round, verified back, paged by a cursor bound to the
instance; a task's detail shows its verified ``source``; a link that does not hold is shown as
not verified, never guessed; a step retry's task names its direct parent and the old task keeps
its old activation. The SDK and the operator CLI the same. A database of its own: the engine's
lease scans read every namespace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client

from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.model import ids
from orbit_common.weave.engine import Engine
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.test_admin_cli import ok as admin_ok
from tests.integration.weave.engine_support import Flow, begin, doc, drain, task
from tests.support import database
from tests.support.contract import assert_documented
from tests.support.lease_fixtures import add_tasks
from tests.support.waiting import until

LIST = "/v1/namespaces/{namespace}/workflows/{workflow_id}/tasks"
DETAIL = "/v1/namespaces/{namespace}/tasks/{task_id}"


@pytest.fixture(scope="module")
def own_url(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    name = database.scratch_name("orbit_weave_tasks_api")
    yield database.create_database(server_url, name)
    database.drop_database(server_url, name)


@pytest.fixture
def db_url(own_url: DatabaseUrl) -> DatabaseUrl:
    return own_url


@pytest.fixture
async def db(own_url: DatabaseUrl) -> AsyncIterator[Database]:
    db = await open_database(own_url, minsize=1, maxsize=6)
    try:
        yield db
    finally:
        await db.close()


FLOW = doc({
    "a": task("w.a", "check"),
    "check": {"kind": "POLL", "queue": "Q", "handler": "w.b", "until": "round.result.done",
              "interval_ms": 100, "max_rounds": 3, "next": "done"},
    "done": {"kind": "SUCCEED"},
}, "a")


async def finished_flow(db: Database, tenant: Tenant) -> Flow:
    """An instance that ran TASK step ``a`` and two POLL rounds of ``check`` to its end."""
    engine = Engine(db, owner="engine-tasks-api", batch=8)
    flow = await begin(db, tenant, FLOW)
    await drain(engine)
    await flow.end((await flow.tasks())[0]["id"], "ok", {"x": 1})
    await drain(engine)
    await flow.end((await flow.tasks())[-1]["id"], "ok", {"done": False})
    await drain(engine)

    async def second_round() -> bool:
        await engine.run_once()
        return len(await flow.tasks()) == 3

    await until(second_round, timeout=10, interval=0.02, message="the second round")
    await flow.end((await flow.tasks())[-1]["id"], "ok", {"done": True})
    await drain(engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    return flow


def list_path(tenant: Tenant, workflow_id: str) -> str:
    return LIST.format(namespace=tenant.namespace, workflow_id=workflow_id)


def detail_path(tenant: Tenant, task_id: str) -> str:
    return DETAIL.format(namespace=tenant.namespace, task_id=task_id)


async def get(api: TestClient[Any, Any], path: str, tenant: Tenant, **params: str) -> Any:
    response = await api.get(path, params=params, headers=tenant.auth)
    assert response.status == 200, await response.text()
    return await response.json()


async def execute(db: Database, sql: str, *params: Any) -> None:
    async def body(cur: Any) -> None:
        await cur.execute(sql, params)
    await db.transaction("test.workflow_tasks", body)


async def test_both_directions(api: TestClient[Any, Any], db: Database,
                               db_url: DatabaseUrl) -> None:
    tenant = await make_tenant(db)
    flow = await finished_flow(db, tenant)
    made = await flow.tasks()  # a, round 1, round 2
    workflow_id = flow.instance_id.hex()
    body = await get(api, list_path(tenant, workflow_id), tenant)
    assert_documented(LIST, "GET", 200, body)
    assert body["next_cursor"] is None
    assert [t["task_id"] for t in body["items"]] == sorted(t["id"].hex() for t in made)
    shown = {t["task_id"]: t for t in body["items"]}
    expected = {made[0]["id"].hex(): ("a", "TASK", None), made[1]["id"].hex(): ("check", "POLL", 1),
                made[2]["id"].hex(): ("check", "POLL", 2)}
    for task_id, (step, kind, round_) in expected.items():
        item = shown[task_id]
        assert (item["step"], item["step_kind"], item["round"], item["verified"]) == (
            step, kind, round_, True)
        assert (item["activation_sequence"], item["activation_state"], item["state"]) == (
            1, "SUCCEEDED", "SUCCEEDED")
        assert item["queue"] == flow.queue.name
        assert item["retry_of"] is None
        assert item["completed_at"] is not None
        # The other direction: the task's detail names the same instance, step and activation.
        detail = await get(api, detail_path(tenant, task_id), tenant)
        assert_documented(DETAIL, "GET", 200, detail)
        source = detail["source"]
        assert (source["kind"], source["workflow_id"], source["step"], source["sequence"],
                source["round"], source["activation"]) == (
            "workflow", workflow_id, step, 1, round_, item["activation_id"])
        assert (source["verified"], source["problem"], source["retry_of"]) == (True, None, None)
        assert (source["definition"], source["version"]) == (flow.name, 1)
    # Pages of one: the same tasks in the same order, the last page without a cursor.
    paged: list[str] = []
    cursor: str | None = None
    while True:
        page = await get(api, list_path(tenant, workflow_id), tenant, limit="1",
                         **({"cursor": cursor} if cursor else {}))
        paged += [t["task_id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == [t["task_id"] for t in body["items"]]

    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        listed = [t async for t in orbit.list_workflow_tasks(workflow_id, page_size=2)]
        assert [(t.task_id, t.step, t.round, t.verified) for t in listed] == [
            (t["task_id"], t["step"], t["round"], True) for t in body["items"]]
        got = await orbit.get_task(made[2]["id"].hex())
        assert got.source is not None
        assert (got.source.kind, got.source.workflow_id, got.source.step, got.source.round,
                got.source.verified) == ("workflow", workflow_id, "check", 2, True)

    lines = (await admin_ok(db_url, "workflows", "instances", "tasks", workflow_id,
                            "--namespace", tenant.namespace)).out.splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == [
        t["task_id"] for t in body["items"]]
    assert {json.loads(line)["step"] for line in lines} == {"a", "check"}
    operator = (await admin_ok(db_url, "tasks", "get", made[1]["id"].hex(), "--namespace",
                               tenant.namespace)).json()
    assert (operator["source"]["step"], operator["source"]["round"]) == ("check", 1)


async def test_a_link_that_does_not_hold_is_shown_not_verified(
        api: TestClient[Any, Any], db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await finished_flow(db, tenant)
    first = (await flow.tasks())[0]["id"]
    # The activation no longer names the task (a corruption: nothing writes this).
    await execute(db, "UPDATE weave_activations SET task_id = NULL WHERE namespace_id = %s"
                      " AND task_id = %s", tenant.namespace_id, first)
    items = (await get(api, list_path(tenant, flow.instance_id.hex()), tenant))["items"]
    (broken,) = [t for t in items if t["task_id"] == first.hex()]
    assert broken["verified"] is False
    assert [broken[k] for k in ("step", "step_kind", "activation_id", "activation_sequence",
                                "activation_state", "round")] == [None] * 6
    assert all(t["verified"] for t in items if t["task_id"] != first.hex())
    detail = await get(api, detail_path(tenant, first.hex()), tenant)
    assert_documented(DETAIL, "GET", 200, detail)
    assert detail["source"] == {
        "kind": "workflow", "workflow_id": flow.instance_id.hex(), "retry_of": None,
        "verified": False,
        "problem": f"task {first.hex()}: no workflow activation references it"}
    # The source route says the same as a problem.
    await assert_problem(await api.get(detail_path(tenant, first.hex()) + "/source",
                                       headers=tenant.auth), 409, "source_link_missing")
    # A plain task's detail: submitted, verified.
    (plain,) = await add_tasks(db, tenant, flow.queue)
    assert (await get(api, detail_path(tenant, plain.hex()), tenant))["source"] == {
        "kind": "submitted", "verified": True, "problem": None}


async def retried(db: Database, flow: Flow) -> tuple[bytes, bytes]:
    """Step ``a`` retried as a step retry leaves it: its first activation SUPERSEDED, a second
    one LIVE naming a new task owned by the instance that retries the first task."""
    old = (await flow.tasks())[0]["id"]
    (new,) = await add_tasks(db, flow.tenant, flow.queue)
    second = ids.new_id()

    async def body(cur: Any) -> None:
        ns = flow.tenant.namespace_id
        await cur.execute("SELECT step_id FROM weave_activations WHERE namespace_id = %s"
                          " AND task_id = %s", (ns, old))
        (step_id,) = (await cur.fetchone()).values()
        await cur.execute("UPDATE pulse_tasks SET owner_kind = 'WORKFLOW', owner_id = %s,"
                          " retry_of = %s WHERE namespace_id = %s AND id = %s",
                          (flow.instance_id, old, ns, new))
        await cur.execute("UPDATE weave_activations SET state = 'SUPERSEDED' WHERE"
                          " namespace_id = %s AND task_id = %s", (ns, old))
        await cur.execute(
            "INSERT INTO weave_activations (namespace_id, instance_id, step_id, id, sequence,"
            " state, live_step_id, task_id, created_at) VALUES (%s, %s, %s, %s, 2, 'LIVE', %s,"
            " %s, UTC_TIMESTAMP(6))", (ns, flow.instance_id, step_id, second, step_id, new))

    await db.transaction("test.retried", body)
    return old, new


async def test_a_step_retry_names_its_parent_and_the_old_task_keeps_its_activation(
        api: TestClient[Any, Any], db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await finished_flow(db, tenant)
    old, new = await retried(db, flow)
    new_source = (await get(api, detail_path(tenant, new.hex()), tenant))["source"]
    assert (new_source["kind"], new_source["step"], new_source["sequence"],
            new_source["retry_of"], new_source["verified"]) == (
        "workflow", "a", 2, old.hex(), True)
    old_source = (await get(api, detail_path(tenant, old.hex()), tenant))["source"]
    assert (old_source["step"], old_source["sequence"], old_source["retry_of"]) == ("a", 1, None)
    assert await get(api, detail_path(tenant, new.hex()) + "/source", tenant) == {
        k: v for k, v in new_source.items() if k not in ("verified", "problem")}
    items = {t["task_id"]: t for t in
             (await get(api, list_path(tenant, flow.instance_id.hex()), tenant))["items"]}
    assert (items[old.hex()]["activation_sequence"], items[old.hex()]["activation_state"]) == (
        1, "SUPERSEDED")
    assert (items[new.hex()]["activation_sequence"], items[new.hex()]["activation_state"],
            items[new.hex()]["retry_of"]) == (2, "LIVE", old.hex())
    # A parent of another owner does not hold.
    await execute(db, "UPDATE pulse_tasks SET owner_kind = NULL, owner_id = NULL"
                      " WHERE namespace_id = %s AND id = %s", tenant.namespace_id, old)
    broken = (await get(api, detail_path(tenant, new.hex()), tenant))["source"]
    assert (broken["verified"], broken["retry_of"]) == (False, old.hex())
    assert "another owner" in broken["problem"]


async def test_refusals_and_isolation(api: TestClient[Any, Any], db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await finished_flow(db, tenant)
    path = list_path(tenant, flow.instance_id.hex())
    first = await get(api, path, tenant, limit="1")
    for params, status, code in (({"limit": "0"}, 400, "validation_failed"),
                                 ({"limit": "101"}, 400, "validation_failed"),
                                 ({"page": "1"}, 400, "validation_failed"),
                                 ({"cursor": "garbage"}, 400, "invalid_cursor")):
        await assert_problem(await api.get(path, params=params, headers=tenant.auth), status,
                             code)
    # A cursor is bound to its instance.
    other_flow = await begin(db, tenant, FLOW)
    await assert_problem(await api.get(list_path(tenant, other_flow.instance_id.hex()),
                                       params={"cursor": first["next_cursor"]},
                                       headers=tenant.auth), 400, "invalid_cursor")
    for unknown in ("0" * 32, "not-an-id"):
        await assert_problem(await api.get(list_path(tenant, unknown), headers=tenant.auth),
                             404, "workflow_instance_not_found")
    # Another tenant: its own namespace does not have the instance; ours is not visible.
    other = await make_tenant(db)
    await assert_problem(await api.get(list_path(other, flow.instance_id.hex()),
                                       headers=other.auth), 404, "workflow_instance_not_found")
    await assert_problem(await api.get(path, headers=other.auth), 404, "namespace_not_found")
    no_read = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                           "actions": ["tasks.read"]}])
    await assert_problem(await api.get(path, headers={"Authorization": f"Bearer {no_read}"}),
                         403, "forbidden")

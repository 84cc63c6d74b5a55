"""``GET /v1/namespaces/{namespace}/workflows/{id}/steps/{step}/rounds`` and the POLL step's
query in the instance detail, through HTTP and the SDK, with the engine running the rounds: the
rounds in order with their tasks and results, pages with bound cursors, refusals, 404 for
another tenant, 403 without ``workflows.read``; an older round's task keeps its workflow source.
A database of its own: the engine's lease scans read every namespace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, NotFound

from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.weave.engine import Engine
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.weave.engine_support import Flow, begin, doc, drain
from tests.support import database
from tests.support.contract import assert_documented
from tests.support.waiting import until


@pytest.fixture(scope="module")
def own_url(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    name = database.scratch_name("orbit_weave_rounds_api")
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


POLL = doc({
    "check": {"kind": "POLL", "queue": "Q", "handler": "w.a", "until": "round.result.done",
              "interval_ms": 100, "max_rounds": 4, "query_deadline_ms": 600_000,
              "next": "done"},
    "done": {"kind": "SUCCEED", "output": "steps.check.result"},
}, "check")


async def three_rounds(db: Database, tenant: Tenant) -> Flow:
    """An instance whose POLL step ran two rounds not met and is in its third."""
    engine = Engine(db, owner="engine-rounds-api", batch=8)
    flow = await begin(db, tenant, POLL)
    await drain(engine)
    for n in range(2):
        await flow.end((await flow.tasks())[-1]["id"], "ok", {"done": False, "n": n})
        await drain(engine)

        async def made(count: int = n + 2) -> bool:
            await engine.run_once()
            return len(await flow.tasks()) >= count

        await until(made, timeout=10, interval=0.02, message="the next round")
    return flow


def path(tenant: Tenant, flow: Flow, step: str = "check") -> str:
    return (f"/v1/namespaces/{tenant.namespace}/workflows/{flow.instance_id.hex()}"
            f"/steps/{step}/rounds")


async def test_rounds_in_order_with_the_query(api: TestClient[Any, Any], db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await three_rounds(db, tenant)
    made = await flow.tasks()
    response = await api.get(path(tenant, flow), headers=tenant.auth)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert_documented("/v1/namespaces/{namespace}/workflows/{workflow_id}/steps/{step}/rounds",
                      "GET", 200, body)
    assert (body["workflow_id"], body["step"], body["next_cursor"]) == (
        flow.instance_id.hex(), "check", None)
    poll = body["poll"]
    assert (poll["state"], poll["used_rounds"], poll["max_rounds"], poll["next_round_at"]) == (
        "ROUND", 3, 4, None)
    assert poll["deadline_at"] is not None
    assert [(r["round"], r["task_id"], r["state"], r["task_state"], r["result"])
            for r in body["items"]] == [
        (1, made[0]["id"].hex(), "NOT_MET", "SUCCEEDED", {"done": False, "n": 0}),
        (2, made[1]["id"].hex(), "NOT_MET", "SUCCEEDED", {"done": False, "n": 1}),
        (3, made[2]["id"].hex(), "RUNNING", "WAITING", None)]
    assert all(r["ended_at"] for r in body["items"][:2])
    assert body["items"][2]["ended_at"] is None
    # The instance detail shows the same query on the step.
    detail = await (await api.get(f"/v1/namespaces/{tenant.namespace}/workflows/"
                                  f"{flow.instance_id.hex()}", headers=tenant.auth)).json()
    assert_documented("/v1/namespaces/{namespace}/workflows/{workflow_id}", "GET", 200, detail)
    (step,) = [s for s in detail["steps"] if s["name"] == "check"]
    assert step["poll"] == poll
    assert step["activations"][0]["task_id"] == made[2]["id"].hex()  # the current round's
    assert "poll" not in next(s for s in detail["steps"] if s["name"] == "$root")
    # Pages: two rounds, then one, with a cursor bound to the route.
    first = await (await api.get(path(tenant, flow), params={"limit": "2"},
                                 headers=tenant.auth)).json()
    assert [r["round"] for r in first["items"]] == [1, 2]
    second = await (await api.get(path(tenant, flow), params={
        "limit": "2", "cursor": first["next_cursor"]}, headers=tenant.auth)).json()
    assert ([r["round"] for r in second["items"]], second["next_cursor"]) == ([3], None)
    # An older round's task still has its workflow source (found through its round).
    source = await (await api.get(f"/v1/namespaces/{tenant.namespace}/tasks/"
                                  f"{made[0]['id'].hex()}/source", headers=tenant.auth)).json()
    assert (source["kind"], source["step"], source["workflow_id"]) == (
        "workflow", "check", flow.instance_id.hex())


async def test_refusals(api: TestClient[Any, Any], db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await three_rounds(db, tenant)
    first = await (await api.get(path(tenant, flow), params={"limit": "1"},
                                 headers=tenant.auth)).json()
    for params, status, code in (
            ({"limit": "0"}, 400, "validation_failed"),
            ({"limit": "101"}, 400, "validation_failed"),
            ({"nope": "1"}, 400, "validation_failed"),
            ({"cursor": "garbage"}, 400, "invalid_cursor")):
        await assert_problem(await api.get(path(tenant, flow), params=params,
                                           headers=tenant.auth), status, code)
    # A cursor of another step's route does not fit this one.
    await assert_problem(await api.get(path(tenant, flow, "done"), params={
        "cursor": first["next_cursor"]}, headers=tenant.auth), 400, "invalid_cursor")
    for step in ("done", "$root", "nope"):
        await assert_problem(await api.get(path(tenant, flow, step), headers=tenant.auth),
                             404, "workflow_step_not_found")
    gone = f"/v1/namespaces/{tenant.namespace}/workflows/{'0' * 32}/steps/check/rounds"
    await assert_problem(await api.get(gone, headers=tenant.auth), 404,
                         "workflow_instance_not_found")
    no_read = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                           "actions": ["workflows.start", "tasks.submit"]}])
    await assert_problem(await api.get(path(tenant, flow), headers={
        "Authorization": f"Bearer {no_read}"}), 403, "forbidden")


async def test_another_tenant_sees_no_rounds(api: TestClient[Any, Any], db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await three_rounds(db, tenant)
    other = await make_tenant(db)
    # Their key on our namespace, and our instance's id in their namespace: not found.
    await assert_problem(await api.get(path(tenant, flow), headers=other.auth), 404,
                         "namespace_not_found")
    await assert_problem(await api.get(path(other, flow), headers=other.auth), 404,
                         "workflow_instance_not_found")
    async with Client(str(api.make_url("")), other.api_key, other.namespace) as orbit:
        with pytest.raises(NotFound):
            await orbit.get_poll_rounds(flow.instance_id.hex(), "check")


async def test_the_sdk_reads_the_query_and_every_round(api: TestClient[Any, Any],
                                                       db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await three_rounds(db, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        got = await orbit.get_poll_rounds(flow.instance_id.hex(), "check", page_size=1)
        assert (got.workflow_id, got.step) == (flow.instance_id.hex(), "check")
        assert (got.poll.state, got.poll.used_rounds, got.poll.max_rounds) == ("ROUND", 3, 4)
        assert got.poll.deadline_at is not None
        assert [(r.round, r.state) for r in got.rounds] == [
            (1, "NOT_MET"), (2, "NOT_MET"), (3, "RUNNING")]
        assert json.dumps(got.rounds[0].result) == json.dumps({"done": False, "n": 0})
        detail = await orbit.get_workflow(flow.instance_id.hex())
        (step,) = [s for s in detail.steps if s.name == "check"]
        assert step.poll == got.poll
        with pytest.raises(NotFound):
            await orbit.get_poll_rounds(flow.instance_id.hex(), "done")

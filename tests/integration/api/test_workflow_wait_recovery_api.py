"""``POST …/workflows/{id}/steps/{step}/rearm`` and ``…/continue`` over HTTP and through the SDK,
with the engine holding the steps: the receipt (documented in the OpenAPI document), the replay
of a keyed request, each refusal as a stable problem (nothing written), 403 without
``workflows.control``, 404 for another tenant, and the operator's commands. The domain rules
are tests/integration/weave/test_wait_recovery.py's. A database of its own: the engine's lease
scans read every namespace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import prometheus_client
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, Conflict

from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.weave.engine import Engine
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.test_admin_cli import ACTOR, ok, orbit_admin
from tests.integration.weave.engine_support import Flow, begin, doc, drain, task
from tests.support import database
from tests.support.contract import assert_documented
from tests.support.lease_fixtures import wait_db_time_past


@pytest.fixture(scope="module")
def own_url(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    name = database.scratch_name("orbit_weave_wait_recovery_api")
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


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-wait-recovery-api", batch=8)


SIGNALLED = doc({
    "approve": {"kind": "SIGNAL", "signal": "approval", "timeout_ms": 200,
                "on_timeout": "$hold", "next": "after"},
    "after": task("w.a", "done"),
    "done": {"kind": "SUCCEED"}}, "approve")
POLLING = doc({
    "check": {"kind": "POLL", "queue": "Q", "handler": "w.a", "until": "round.result.done",
              "interval_ms": 100, "max_rounds": 1, "on_exhausted": "$hold", "next": "done"},
    "done": {"kind": "SUCCEED"}}, "check")
REARM = "/v1/namespaces/{namespace}/workflows/{workflow_id}/steps/{step}/rearm"
CONTINUE = "/v1/namespaces/{namespace}/workflows/{workflow_id}/steps/{step}/continue"


async def held_signal(db: Database, engine: Engine, tenant: Tenant) -> Flow:
    flow = await begin(db, tenant, SIGNALLED)
    await drain(engine)
    deadline = await db.read("test.deadline", lambda cur: _deadline(cur, flow))
    await wait_db_time_past(db, deadline)
    await drain(engine)
    assert (await flow.steps())["approve"]["held_at"] is not None
    return flow


async def _deadline(cur: Any, flow: Flow) -> Any:
    await cur.execute("SELECT deadline_at FROM weave_waits WHERE namespace_id = %s"
                      " AND instance_id = %s", (flow.tenant.namespace_id, flow.instance_id))
    return (await cur.fetchone())["deadline_at"]


async def held_poll(db: Database, engine: Engine, tenant: Tenant) -> Flow:
    flow = await begin(db, tenant, POLLING)
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {"done": False})
    await drain(engine)
    assert (await flow.steps())["check"]["held_at"] is not None
    return flow


def recoveries(kind: str) -> float:
    """``orbit_weave_recoveries_total{kind}`` of this process (the in-process API's)."""
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_weave_recoveries_total", {"kind": kind}) or 0.0


def url(flow: Flow, step: str, verb: str, tenant: Tenant | None = None) -> str:
    namespace = (tenant or flow.tenant).namespace
    return f"/v1/namespaces/{namespace}/workflows/{flow.instance_id.hex()}/steps/{step}/{verb}"


async def revision(flow: Flow, step: str) -> int:
    found: int = (await flow.steps())[step]["revision"]
    return found


async def post(api: TestClient[Any, Any], path: str, tenant: Tenant, body: Any,
               key: str | None = None, api_key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {api_key or tenant.api_key}",
               "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    response = await api.post(path, data=json.dumps(body).encode(), headers=headers)
    return response.status, await response.json()


async def test_rearm_over_http_replays_its_receipt(api: TestClient[Any, Any], db: Database,
                                                   engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await held_signal(db, engine, tenant)
    body = {"reason": "approver is back", "step_revision": await revision(flow, "approve"),
            "timeout_ms": 60_000}
    counted = recoveries("rearm")
    status, receipt = await post(api, url(flow, "approve", "rearm"), tenant, body, key="r-1")
    assert status == 201, receipt
    assert recoveries("rearm") == counted + 1
    assert_documented(REARM, "POST", 201, receipt)
    assert (receipt["workflow_id"], receipt["state"], receipt["held_at"]) == (
        flow.instance_id.hex(), "WAITING", None)
    assert [(a["sequence"], a["state"]) for a in receipt["activations"]] == [
        (1, "SUPERSEDED"), (2, "LIVE")]
    assert [(w["generation"], w["state"]) for w in receipt["waits"]] == [
        (1, "TIMED_OUT"), (2, "WAITING")]
    assert await post(api, url(flow, "approve", "rearm"), tenant, body, key="r-1") == (
        201, receipt)
    assert recoveries("rearm") == counted + 1  # a replay is not counted again
    # Its one event is on the instance's timeline (it names the instance).
    timeline = await api.get(f"/v1/namespaces/{tenant.namespace}/workflows/"
                             f"{flow.instance_id.hex()}/timeline", headers=tenant.auth)
    events = [e for e in (await timeline.json())["items"]
              if e["type"] == "workflow.step.rearmed"]
    assert [(e["aggregate_type"], e["payload"]["step"], e["payload"]["generation"])
            for e in events] == [("workflow_step", "approve", 2)]
    await assert_problem(await api.post(url(flow, "approve", "rearm"), json={
        **body, "timeout_ms": 5}, headers={**tenant.auth, "Idempotency-Key": "r-1"}), 409,
        "idempotency_conflict")
    # Now waiting on its new wait: not re-armable; the old revision is stale.
    await assert_problem(await api.post(url(flow, "approve", "rearm"), json={
        **body, "step_revision": receipt["revision"]}, headers=tenant.auth), 409,
        "wait_not_rearmable")
    await assert_problem(await api.post(url(flow, "approve", "rearm"), json=body,
                                        headers=tenant.auth), 409, "stale_revision")


async def test_continue_over_http_and_the_sdk(api: TestClient[Any, Any], db: Database,
                                              engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await held_poll(db, engine, tenant)
    body = {"reason": "settlement back", "step_revision": await revision(flow, "check"),
            "rounds": 2, "deadline_ms": None}
    counted = recoveries("continue")
    status, receipt = await post(api, url(flow, "check", "continue"), tenant, body)
    assert status == 201, receipt
    assert recoveries("continue") == counted + 1
    assert_documented(CONTINUE, "POST", 201, receipt)
    assert (receipt["state"], receipt["poll"]["state"], receipt["poll"]["granted_rounds"],
            receipt["poll"]["first_round"]) == ("WAITING", "WAITING", 2, 2)
    detail = await api.get(f"/v1/namespaces/{tenant.namespace}/workflows/"
                           f"{flow.instance_id.hex()}", headers=tenant.auth)
    assert_documented("/v1/namespaces/{namespace}/workflows/{workflow_id}", "GET", 200,
                      await detail.json())
    # The SDK: a second held poll, continued; a refusal is a Conflict with its code.
    other = await held_poll(db, engine, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        step = await orbit.continue_poll(other.instance_id.hex(), "check", "again",
                                         step_revision=await revision(other, "check"),
                                         rounds=1, deadline_ms=60_000)
        assert (step.state, step.activation_count) == ("WAITING", 2)
        assert step.poll is not None
        assert (step.poll.granted_rounds, step.poll.first_round) == (1, 2)
        assert step.poll.continued_deadline_at is not None
        with pytest.raises(Conflict) as refused:
            await orbit.continue_poll(other.instance_id.hex(), "check", "again",
                                      step_revision=step.revision, rounds=1)
        assert refused.value.code == "poll_not_continuable"
        held = await held_signal(db, engine, tenant)
        rearmed = await orbit.rearm_wait(held.instance_id.hex(), "approve", "back",
                                         step_revision=await revision(held, "approve"),
                                         timeout_ms=60_000)
        assert [w.generation for w in rearmed.waits] == [1, 2]


async def test_a_continued_round_is_listed_whole_on_one_page(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """A round continued in a new activation has a row per activation; a page of the rounds
    route never splits it (its cursor is the round number)."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "check": {"kind": "POLL", "queue": "Q", "handler": "w.a", "until": "round.result.done",
                  "interval_ms": 100, "max_rounds": 3, "on_failure": "$hold",
                  "retry": {"max_attempts": 2}, "next": "done"},
        "done": {"kind": "SUCCEED"}}, "check"))
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "fail", "down")  # not retryable: 1 of its 2 attempts used
    await drain(engine)
    status, receipt = await post(api, url(flow, "check", "continue"), tenant, {
        "reason": "r", "step_revision": await revision(flow, "check"), "rounds": 1})
    assert (status, receipt["state"]) == (201, "RUNNING"), receipt
    rounds = (f"/v1/namespaces/{tenant.namespace}/workflows/{flow.instance_id.hex()}"
              "/steps/check/rounds")
    page = await (await api.get(rounds + "?limit=1", headers=tenant.auth)).json()
    assert [(r["round"], r["state"]) for r in page["items"]] == [(1, "FAILED"),
                                                                  (1, "RUNNING")]
    assert [r["activation_id"] for r in page["items"]] == [
        a["id"] for a in receipt["activations"]]
    assert page["next_cursor"] is not None
    rest = await (await api.get(rounds + f"?limit=1&cursor={page['next_cursor']}",
                                headers=tenant.auth)).json()
    assert (rest["items"], rest["next_cursor"]) == ([], None)


async def test_refusals_write_nothing(api: TestClient[Any, Any], db: Database,
                                      engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await held_poll(db, engine, tenant)
    good = {"reason": "r", "step_revision": await revision(flow, "check"), "rounds": 1}
    before = await flow.steps()
    for body in ({}, {**good, "reason": ""}, {**good, "rounds": 0}, {**good, "rounds": 1001},
                 {**good, "step_revision": 0}, {**good, "deadline_ms": 0},
                 {**good, "extra": 1}, {**good, "step_revision": "1"}):
        await assert_problem(await api.post(url(flow, "check", "continue"), json=body,
                                            headers=tenant.auth), 400, "validation_failed")
    for body in ({"reason": "r", "step_revision": 1}, {"reason": "r", "step_revision": 1,
                                                       "timeout_ms": 366 * 86_400_000 + 1}):
        await assert_problem(await api.post(url(flow, "check", "rearm"), json=body,
                                            headers=tenant.auth), 400, "validation_failed")
    await assert_problem(await api.post(url(flow, "check", "rearm"), json={
        "reason": "r", "step_revision": good["step_revision"], "timeout_ms": 1000},
        headers=tenant.auth), 409, "wait_not_rearmable")
    await assert_problem(await api.post(url(flow, "nowhere", "continue"), json=good,
                                        headers=tenant.auth), 404, "workflow_step_not_found")
    gone = f"/v1/namespaces/{tenant.namespace}/workflows/{'0' * 32}/steps/check/continue"
    await assert_problem(await api.post(gone, json=good, headers=tenant.auth), 404,
                         "workflow_instance_not_found")
    no_control = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                              "actions": ["workflows.read"]}])
    await assert_problem(await api.post(url(flow, "check", "continue"), json=good, headers={
        "Authorization": f"Bearer {no_control}"}), 403, "forbidden")
    other = await make_tenant(db)
    await assert_problem(await api.post(url(flow, "check", "continue", other), json=good,
                                        headers=other.auth), 404, "workflow_instance_not_found")
    assert await flow.steps() == before


async def test_the_operator_commands(db: Database, db_url: DatabaseUrl,
                                     engine: Engine) -> None:
    """``orbit admin workflows steps rearm|continue`` as a real subprocess: the step printed,
    the audit naming the operator, a refusal as the problem's code."""
    tenant = await make_tenant(db)
    flow = await held_signal(db, engine, tenant)
    rearmed = await ok(db_url, "workflows", "steps", "rearm", flow.instance_id.hex(),
                       "approve", "--namespace", tenant.namespace, "--reason", "night shift",
                       "--step-revision", str(await revision(flow, "approve")),
                       "--timeout-ms", "60000")
    assert rearmed.json()["activation_count"] == 2
    refused = await orbit_admin(db_url, "workflows", "steps", "rearm", flow.instance_id.hex(),
                                "approve", "--namespace", tenant.namespace, "--reason", "again",
                                "--step-revision", str(await revision(flow, "approve")),
                                "--timeout-ms", "60000")
    assert refused.code != 0
    assert "wait_not_rearmable" in refused.err
    polled = await held_poll(db, engine, tenant)
    continued = await ok(db_url, "workflows", "steps", "continue", polled.instance_id.hex(),
                         "check", "--namespace", tenant.namespace, "--reason", "night shift",
                         "--step-revision", str(await revision(polled, "check")),
                         "--rounds", "3")
    assert continued.json()["poll"]["granted_rounds"] == 3

    async def audits(cur: Any) -> list[tuple[str, str, str]]:
        await cur.execute("SELECT action, actor_kind, actor_id FROM orbit_audit_events"
                          " WHERE namespace_id = %s AND action LIKE 'workflow.step.%%'",
                          (tenant.namespace_id,))
        return [(r["action"], r["actor_kind"], r["actor_id"]) for r in await cur.fetchall()]

    assert sorted(await db.read("test.audits", audits)) == [
        ("workflow.step.continue", "operator", ACTOR),
        ("workflow.step.rearm", "operator", ACTOR)]

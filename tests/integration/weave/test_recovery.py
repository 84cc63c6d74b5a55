"""Manual recovery of a step over HTTP, with the engine and real workers (docs/weave/
recovery.md): retry a TASK step (a new activation and task; the attempt budget and absolute
deadline carried), resolve a step (the task's review and the step's conclusion kept apart; the
engine advances with the conclusion), every refusal (stable codes, nothing written), the
idempotent replay of each, the metric, the SDK and the operator commands. A database of its
own: the engine's lease scans read every namespace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import prometheus_client
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, Conflict

from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.health import ReadinessGate
from orbit_common.weave.engine import Engine
from tests.conftest import api_config, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.integration.test_admin_cli import ACTOR, ok, orbit_admin
from tests.integration.weave.engine_support import Flow, begin, doc, drain, task
from tests.integration.weave.test_signals import rows
from tests.support import database, invariants
from tests.support.contract import assert_documented
from tests.support.lease_fixtures import wait_db_time_past
from tests.support.servers import ServiceTestServer

own_url, db = database.own_database("orbit_weave_recovery", pool_max=10)

TABLES = ("weave_steps", "weave_activations", "weave_pending_advances", "pulse_tasks",
          "orbit_events", "orbit_audit_events", "orbit_idempotency_keys", "weave_inbox")
SHAPE = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
STEP_PATH = "/v1/namespaces/{namespace}/workflows/{workflow_id}/steps/{step}"
RETRY_PATH, RESOLVE_PATH = STEP_PATH + "/retry", STEP_PATH + "/resolve"


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-recovery", lease_ms=30_000, batch=16)


@pytest.fixture
async def api(db: Database, own_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    client = TestClient(ServiceTestServer(create_app(api_config(own_url), db,
                                                     ReadinessGate(SchemaChecker(db)))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def watch(own_url: DatabaseUrl) -> Iterator[WriteWatch]:
    conn = connect_sync(own_url, autocommit=True)
    try:
        yield WriteWatch(conn, TABLES)
    finally:
        conn.close()


def recoveries(kind: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_weave_recoveries_total", {"kind": kind}) or 0.0


async def post(api: TestClient[Any, Any], flow: Flow, step: str, verb: str,
               body: dict[str, Any], key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {flow.tenant.api_key}",
               "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    response = await api.post(
        f"/v1/namespaces/{flow.tenant.namespace}/workflows/{flow.instance_id.hex()}"
        f"/steps/{step}/{verb}", data=json.dumps(body).encode(), headers=headers)
    return response.status, await response.json()


async def refused(api: TestClient[Any, Any], flow: Flow, step: str, verb: str,
                  body: dict[str, Any], status: int, code: str) -> dict[str, Any]:
    response = await api.post(
        f"/v1/namespaces/{flow.tenant.namespace}/workflows/{flow.instance_id.hex()}"
        f"/steps/{step}/{verb}", json=body,
        headers={"Authorization": f"Bearer {flow.tenant.api_key}"})
    return await assert_problem(response, status, code)


async def clean(flow: Flow) -> None:
    assert await invariants.check_db(flow.db, [flow.tenant.namespace_id]) == []


async def step_row(flow: Flow, name: str) -> dict[str, Any]:
    return (await flow.steps())[name]


async def task_row(flow: Flow, task_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                          (flow.tenant.namespace_id, task_id))
        return dict(await cur.fetchone())
    return await flow.db.read("test.recovery.task", body)


async def audits(flow: Flow, action: str) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("SELECT * FROM orbit_audit_events WHERE namespace_id = %s"
                          " AND action = %s ORDER BY occurred_at, id",
                          (flow.tenant.namespace_id, action))
        return [dict(r) for r in await cur.fetchall()]
    return await flow.db.read("test.recovery.audit", body)


def held_doc(**options: Any) -> dict[str, Any]:
    """a (TASK, on_failure $hold) -> b (TASK reading a's result) -> done."""
    return doc({
        "a": task("w.a", "b", on_failure="$hold", result_schema=SHAPE, **options),
        "b": task("w.b", "done", input="{'x2': steps.a.result.x * 2}"),
        "done": {"kind": "SUCCEED", "output": "{'a': steps.a.result.x}"},
    }, "a")


async def fail_current(flow: Flow, engine: Engine, step: str) -> dict[str, Any]:
    """End the step's newest task as failed (not retryable) and let the engine consume it."""
    current = [t for t in await flow.tasks() if t["step"] == step][-1]
    await flow.end(current["id"], "fail", "broken")
    await drain(engine)
    return current


async def test_retry_carries_the_budget_and_the_absolute_deadline(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """Budget 3: each retry's task gets what the step's tasks have not started (3-1, 3-2),
    then the budget is spent (refused without additional_attempts); every task keeps the
    first one's absolute deadline; the old activations are SUPERSEDED and kept; the last
    retry's success advances the instance."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc(retry={"max_attempts": 3}, deadline_ms=600_000))
    await drain(engine)
    first = await fail_current(flow, engine, "a")
    first_task = await task_row(flow, first["id"])
    assert (first_task["max_attempts"], first_task["starts_used"]) == (3, 1)
    assert (await step_row(flow, "a"))["held_at"] is not None
    expected_budget = [2, 1]
    for n, budget in enumerate(expected_budget, start=2):
        step = await step_row(flow, "a")
        status, view = await post(api, flow, "a", "retry",
                                  {"reason": f"retry {n}", "step_revision": step["revision"]})
        assert status == 201, view
        assert (view["state"], view["activation_count"], view["held_at"]) == ("RUNNING", n,
                                                                              None)
        assert [a["state"] for a in view["activations"]] == ["SUPERSEDED"] * (n - 1) + ["LIVE"]
        new = await task_row(flow, bytes.fromhex(view["activations"][-1]["task_id"]))
        assert new["max_attempts"] == budget
        assert new["deadline_at"] == first_task["deadline_at"]
        assert new["retry_of"] == bytes.fromhex(view["activations"][-2]["task_id"])
        assert (new["owner_kind"], new["owner_id"]) == ("WORKFLOW", flow.instance_id)
        assert new["workflow_gate_id"] == first_task["workflow_gate_id"]
        assert (new["handler"], new["input"]) == (first_task["handler"], first_task["input"])
        await clean(flow)
        await fail_current(flow, engine, "a")
    step = await step_row(flow, "a")
    body = {"reason": "once more", "step_revision": step["revision"]}
    problem = await refused(api, flow, "a", "retry", body, 409, "step_not_retryable")
    assert "attempt budget spent" in problem["detail"]
    assert "3 of 3" in problem["detail"]
    status, view = await post(api, flow, "a", "retry", {**body, "additional_attempts": 2})
    assert status == 201, view
    last = await task_row(flow, bytes.fromhex(view["activations"][-1]["task_id"]))
    assert (last["max_attempts"], last["deadline_at"]) == (2, first_task["deadline_at"])
    (audit,) = [a for a in await audits(flow, "workflow.step.retry")
                if json.loads(a["after_doc"])["budget"]["granted"] == 2]
    assert json.loads(audit["after_doc"])["budget"] == {
        "original": 3, "used": 3, "remaining": 0, "granted": 2, "max_attempts": 2}
    assert audit["reason"] == "once more"
    await flow.end(last["id"], "ok", {"x": 7})
    await drain(engine)
    (b_task,) = [t for t in await flow.tasks() if t["step"] == "b"]
    assert json.loads(b_task["input"]) == {"x2": 14}
    await flow.end(b_task["id"], "ok", {})
    await drain(engine)
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == ("SUCCEEDED", {"a": 7})
    assert [t["sequence"] for t in await flow.tasks()] == [1, 2, 3, 4, 5]
    await clean(flow)


async def test_a_retry_never_moves_the_absolute_deadline(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc(retry={"max_attempts": 5}, deadline_ms=1500))
    await drain(engine)
    first = await fail_current(flow, engine, "a")
    await wait_db_time_past(db, (await task_row(flow, first["id"]))["deadline_at"])
    step = await step_row(flow, "a")
    problem = await refused(api, flow, "a", "retry", {
        "reason": "late", "step_revision": step["revision"], "additional_attempts": 3},
        409, "step_not_retryable")
    assert "absolute deadline" in problem["detail"]
    await clean(flow)


async def test_needs_review_then_retry_then_success_advances_once(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """The old task is reviewed failed with the evidence (its inbox row is kept as stale);
    the retry's success advances the step exactly once."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "a": task("w.a", "b", result_schema=SHAPE),
        "b": task("w.b", "done", input="{'x2': steps.a.result.x * 2}"),
        "done": {"kind": "SUCCEED"}}, "a"))
    await drain(engine)
    (old,) = await flow.tasks()
    await flow.end(old["id"], "review")
    await drain(engine)
    step = await step_row(flow, "a")
    assert step["state"] == "WAITING"
    assert step["held_at"] is None  # waiting for a review, not held by $hold
    body = {"reason": "worker lost", "step_revision": step["revision"]}
    await refused(api, flow, "a", "retry", {**body, "execution_ended": True}, 400,
                  "validation_failed")
    await refused(api, flow, "a", "retry", {**body, "evidence_ref": "ticket-1"}, 400,
                  "confirmation_required")
    before = recoveries("retry")
    # The queue's budget is 1 attempt, spent by the lost one: one more is granted.
    full = {**body, "evidence_ref": "ticket-1", "execution_ended": True,
            "additional_attempts": 1}
    status, view = await post(api, flow, "a", "retry", full, key="r-1")
    assert status == 201, view
    assert_documented(RETRY_PATH, "POST", 201, view)
    assert recoveries("retry") == before + 1
    # The replay: the original receipt, nothing new, not counted again.
    assert await post(api, flow, "a", "retry", full, key="r-1") == (201, view)
    assert recoveries("retry") == before + 1
    await refused_key(api, flow, "a", "retry", {**full, "reason": "other"}, "r-1")
    reviewed = await task_row(flow, old["id"])
    assert (reviewed["state"], reviewed["outcome_reason"]) == ("FAILED", "reviewed_failed")
    await drain(engine)
    new_task = bytes.fromhex(view["activations"][-1]["task_id"])
    await flow.end(new_task, "ok", {"x": 3})
    await drain(engine)
    await drain(engine)
    assert [r["outcome"] for r in await flow.inbox()] == ["held", "stale", "advanced"]
    b_tasks = [t for t in await flow.tasks() if t["step"] == "b"]
    assert len(b_tasks) == 1
    assert json.loads(b_tasks[0]["input"]) == {"x2": 6}
    assert (await step_row(flow, "a"))["state"] == "SUCCEEDED"
    # The retry is in the instance's timeline (its event names the instance).
    response = await api.get(
        f"/v1/namespaces/{tenant.namespace}/workflows/{flow.instance_id.hex()}/timeline",
        headers={"Authorization": f"Bearer {tenant.api_key}"})
    timeline = (await response.json())["items"]
    (retried,) = [e for e in timeline if e["type"] == "workflow.step.retried"]
    assert retried["payload"]["reviewed"] is True
    assert retried["payload"]["budget"]["max_attempts"] == 1
    await clean(flow)


async def refused_key(api: TestClient[Any, Any], flow: Flow, step: str, verb: str,
                      body: dict[str, Any], key: str) -> None:
    response = await api.post(
        f"/v1/namespaces/{flow.tenant.namespace}/workflows/{flow.instance_id.hex()}"
        f"/steps/{step}/{verb}", json=body,
        headers={"Authorization": f"Bearer {flow.tenant.api_key}", "Idempotency-Key": key})
    await assert_problem(response, 409, "idempotency_conflict")


async def test_resolve_succeeded_advances_with_the_output(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc())
    await drain(engine)
    await fail_current(flow, engine, "a")
    response = await api.get(
        f"/v1/namespaces/{tenant.namespace}/workflows/{flow.instance_id.hex()}",
        headers={"Authorization": f"Bearer {tenant.api_key}"})
    detail = await response.json()
    assert_documented("/v1/namespaces/{namespace}/workflows/{workflow_id}", "GET", 200, detail)
    (shown,) = [s for s in detail["steps"] if s["name"] == "a"]
    assert (shown["state"], shown["held_error"]["error"], shown["resolution"]) == (
        "WAITING", "task_failed", None)
    step = await step_row(flow, "a")
    body = {"reason": "done by hand", "evidence_ref": "ops-42", "step_revision":
            step["revision"], "conclusion": "succeeded", "output": {"x": 5}}
    await refused(api, flow, "a", "resolve", {**body, "output": {"x": "five"}}, 400,
                  "validation_failed")
    before = recoveries("resolve")
    status, view = await post(api, flow, "a", "resolve", body, key="s-1")
    assert status == 202, view
    assert_documented(RESOLVE_PATH, "POST", 202, view)
    assert recoveries("resolve") == before + 1
    assert view["state"] == "WAITING"
    resolution = view["resolution"]
    assert {k: resolution[k] for k in ("conclusion", "output", "reason", "evidence_ref")} == {
        "conclusion": "succeeded", "output": {"x": 5}, "reason": "done by hand",
        "evidence_ref": "ops-42"}
    assert resolution["actor"]["kind"] == "credential"
    assert await post(api, flow, "a", "resolve", body, key="s-1") == (202, view)
    assert recoveries("resolve") == before + 1
    await refused(api, flow, "a", "resolve", {**body, "step_revision": view["revision"]}, 409,
                  "step_not_resolvable")
    await drain(engine)
    step = await step_row(flow, "a")
    assert (step["state"], json.loads(step["output"]), step["held_at"]) == (
        "SUCCEEDED", {"x": 5}, None)
    (b_task,) = [t for t in await flow.tasks() if t["step"] == "b"]
    assert json.loads(b_task["input"]) == {"x2": 10}
    (advance,) = [r for r in await rows(flow, "weave_pending_advances")
                  if r["kind"] == "RESOLVE"]
    assert advance["state"] == "DONE"
    await clean(flow)


async def test_resolve_failed_takes_the_failure_path_never_hold_again(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc())
    await drain(engine)
    await fail_current(flow, engine, "a")
    step = await step_row(flow, "a")
    status, view = await post(api, flow, "a", "resolve", {
        "reason": "cannot be done", "evidence_ref": "ops-7", "step_revision": step["revision"],
        "conclusion": "failed", "error": "order_abandoned"})
    assert status == 202, view
    await drain(engine)
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    assert json.loads(instance["error"]) == {"error": "order_abandoned",
                                             "cause": "cannot be done", "step": "a",
                                             "resolved": True}
    await clean(flow)


async def test_resolve_a_task_in_review_keeps_the_two_conclusions_apart(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """The task is reviewed succeeded (its execution did happen) while the step's logical
    conclusion is failed: the step takes its on_failure transition; the task's own result is
    kept (stale), never advanced."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "a": task("w.a", "done", on_failure="mend"),
        "mend": task("w.b", "done"),
        "done": {"kind": "SUCCEED"}}, "a"))
    await drain(engine)
    (old,) = await flow.tasks()
    await flow.end(old["id"], "review")
    await drain(engine)
    step = await step_row(flow, "a")
    body = {"reason": "charged twice", "evidence_ref": "psp-9", "step_revision":
            step["revision"], "conclusion": "failed", "error": "double_charge"}
    await refused(api, flow, "a", "resolve", {**body, "execution_ended": True}, 400,
                  "validation_failed")
    await refused(api, flow, "a", "resolve", {**body, "task_decision": "succeeded"}, 400,
                  "confirmation_required")
    status, view = await post(api, flow, "a", "resolve", {
        **body, "task_decision": "succeeded", "execution_ended": True})
    assert status == 202, view
    assert (await task_row(flow, old["id"]))["state"] == "SUCCEEDED"
    await drain(engine)
    await drain(engine)
    steps = await flow.steps()
    assert steps["a"]["state"] == "FAILED"
    assert json.loads(steps["a"]["error"])["error"] == "double_charge"
    assert [t["step"] for t in await flow.tasks()] == ["a", "mend"]
    assert [r["outcome"] for r in await flow.inbox()] == ["held", "stale"]
    await clean(flow)


async def test_a_reviewed_result_reaching_the_engine_before_the_resolution_is_stale(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """The task's review result is consumed in an advance of its own, before the RESOLVE
    advance (another engine leased only it): the step's recorded conclusion wins -- the
    result is stale, the step waits for its RESOLVE advance, which then advances it once."""
    from orbit_common.weave import leasing

    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "a": task("w.a", "b", result_schema=SHAPE),
        "b": task("w.b", "done", input="{'x2': steps.a.result.x * 2}"),
        "done": {"kind": "SUCCEED"}}, "a"))
    await drain(engine)
    (old,) = await flow.tasks()
    await flow.end(old["id"], "review")
    await drain(engine)
    step = await step_row(flow, "a")
    status, _ = await post(api, flow, "a", "resolve", {
        "reason": "checked", "evidence_ref": "ops-5", "step_revision": step["revision"],
        "conclusion": "succeeded", "output": {"x": 4}, "task_decision": "succeeded",
        "execution_ended": True})
    assert status == 202
    other = Engine(db, owner="engine-inbox-only", lease_ms=30_000)
    leased = await db.transaction("test.lease_inbox", lambda cur: leasing.lease_inbox(
        cur, owner=other.owner, lease_ms=30_000, limit=10))
    assert [r["task_id"] for r in leased] == [old["id"]]  # the review's result, alone
    done = await other.advance(tenant.namespace_id, flow.instance_id, leased, [])
    assert done.outcomes == {"stale": 1}, done
    assert (await step_row(flow, "a"))["state"] == "WAITING"
    assert len(await flow.tasks()) == 1  # no task of b yet
    await drain(engine)  # the RESOLVE advance
    (b_task,) = [t for t in await flow.tasks() if t["step"] == "b"]
    assert json.loads(b_task["input"]) == {"x2": 8}  # the recorded output, not the review's
    assert [r["outcome"] for r in await flow.inbox()] == ["held", "stale"]
    await clean(flow)


async def test_a_retry_of_a_paused_instance_waits_behind_its_gate(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """The new task is behind the instance's gate: not claimable while the instance is
    paused, claimed and advanced after the resume."""
    from orbit_common.weave import controls
    from tests.integration.weave.support import principal

    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc(retry={"max_attempts": 2}))
    await drain(engine)
    await fail_current(flow, engine, "a")
    who = await principal(db, tenant.api_key)
    await controls.set_paused(db, who, namespace=tenant.namespace,
                              instance_id=flow.instance_id.hex(), paused=True, reason="look")
    step = await step_row(flow, "a")
    status, view = await post(api, flow, "a", "retry", {"reason": "again",
                                                        "step_revision": step["revision"]})
    assert status == 201, view
    new_task = bytes.fromhex(view["activations"][-1]["task_id"])
    with pytest.raises(AssertionError, match="cannot be claimed"):
        await flow.end(new_task, "ok", {"x": 1})
    await controls.set_paused(db, who, namespace=tenant.namespace,
                              instance_id=flow.instance_id.hex(), paused=False, reason="ok")
    await flow.end(new_task, "ok", {"x": 1})
    await drain(engine)
    assert (await step_row(flow, "a"))["state"] == "SUCCEEDED"
    await clean(flow)


async def test_resolve_a_held_signal_and_a_paused_instance_parks_the_advance(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """A SIGNAL step held after its timeout, resolved while the instance is paused: the
    RESOLVE advance parks like any checkpoint and is replayed on resume."""
    from orbit_common.weave import controls
    from tests.integration.weave.support import principal

    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "a": task("w.a", "approve"),
        "approve": {"kind": "SIGNAL", "signal": "approval", "timeout_ms": 200,
                    "on_timeout": "$hold", "next": "done"},
        "done": {"kind": "SUCCEED", "output": "steps.approve.result"}}, "a"))
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {})
    await drain(engine)
    (wait,) = await rows(flow, "weave_waits")
    await wait_db_time_past(db, wait["deadline_at"])
    await drain(engine)
    step = await step_row(flow, "approve")
    assert json.loads(step["held_error"]) == {"error": "signal_timeout", "step": "approve"}
    who = await principal(db, tenant.api_key)
    await controls.set_paused(db, who, namespace=tenant.namespace,
                              instance_id=flow.instance_id.hex(), paused=True, reason="look")
    status, _ = await post(api, flow, "approve", "resolve", {
        "reason": "approved by phone", "evidence_ref": "call-1",
        "step_revision": step["revision"], "conclusion": "succeeded",
        "output": {"approved": True}})
    assert status == 202
    await drain(engine)
    assert (await step_row(flow, "approve"))["state"] == "WAITING"  # parked
    assert (await flow.instance())["checkpoints"] == 1
    await clean(flow)
    await controls.set_paused(db, who, namespace=tenant.namespace,
                              instance_id=flow.instance_id.hex(), paused=False, reason="ok")
    await drain(engine)
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == ("SUCCEEDED",
                                                                   {"approved": True})
    await clean(flow)


async def test_refusals_write_nothing(api: TestClient[Any, Any], db: Database,
                                      engine: Engine, watch: WriteWatch) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc())
    await drain(engine)
    running = await step_row(flow, "a")  # its task is running: nothing to decide yet
    revision = running["revision"]
    retry = {"reason": "r", "step_revision": revision}
    resolve = {"reason": "r", "evidence_ref": "e", "step_revision": revision,
               "conclusion": "succeeded", "output": {"x": 1}}
    other = await make_tenant(db)
    watch.reset()
    for body in ({}, {"reason": "r"}, {"reason": "", "step_revision": 1},
                 {**retry, "additional_attempts": 101}, {**retry, "additional_attempts": -1},
                 {**retry, "extra": 1}, {**retry, "step_revision": "1"},
                 {**retry, "evidence_ref": None}, {**retry, "additional_attempts": None},
                 {**retry, "execution_ended": "yes"}):
        await refused(api, flow, "a", "retry", body, 400, "validation_failed")
    for body in ({**resolve, "conclusion": "maybe"}, {**resolve, "evidence_ref": None},
                 {**resolve, "conclusion": "failed"},
                 {**resolve, "conclusion": "failed", "error": "Bad Code"},
                 {**resolve, "error": "x"}, {**resolve, "task_decision": "perhaps"},
                 {**resolve, "error": None}, {**resolve, "task_decision": None},
                 {**resolve, "conclusion": "failed", "error": "gave_up", "output": None}):
        await refused(api, flow, "a", "resolve", body, 400, "validation_failed")
    problem = await refused(api, flow, "a", "retry", retry, 409, "step_not_retryable")
    assert "RUNNING" in problem["detail"]
    await refused(api, flow, "a", "resolve", resolve, 409, "step_not_resolvable")
    await refused(api, flow, "a", "retry", {**retry, "step_revision": revision + 1}, 409,
                  "stale_revision")
    await refused(api, flow, "nope", "retry", retry, 404, "workflow_step_not_found")
    await refused(api, flow, "$root", "resolve", resolve, 404, "workflow_step_not_found")
    response = await api.post(
        f"/v1/namespaces/{tenant.namespace}/workflows/{flow.instance_id.hex()}/steps/a/retry",
        json=retry, headers={"Authorization": f"Bearer {other.api_key}"})
    await assert_problem(response, 404, "namespace_not_found")
    watch.assert_unchanged()
    # A held SIGNAL or a held step without a task is resolved, never retried.
    await fail_current(flow, engine, "a")
    held = await step_row(flow, "a")
    await db.transaction("test.end", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'FAILED', completed_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s", (tenant.namespace_id, flow.instance_id)))
    watch.reset()
    await refused(api, flow, "a", "retry", {**retry, "step_revision": held["revision"]}, 409,
                  "workflow_instance_not_running")
    await refused(api, flow, "a", "resolve", {**resolve, "step_revision": held["revision"]},
                  409, "workflow_instance_not_running")
    watch.assert_unchanged()


async def test_resolving_a_held_poll_in_a_branch_completes_the_join(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """A POLL step held after its rounds ran out, in one branch of a PARALLEL block whose other
    branch succeeded: its resolution completes the branch, the join, the instance."""
    from tests.integration.weave.test_polls import poll

    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "p": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "done",
              "branches": [
                  {"name": "x", "start": "check", "steps": {
                      "check": poll(max_rounds=1, on_exhausted="$hold", next="cx"),
                      "cx": {"kind": "SUCCEED", "output": "steps.check.result"}}},
                  {"name": "y", "start": "b", "steps": {
                      "b": task("w.b", "by"), "by": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED", "output": "steps.p.result"}}, "p"))
    await drain(engine)
    (b_task,) = [t for t in await flow.tasks() if t["step"] == "b"]
    await flow.end(b_task["id"], "ok", {})
    await drain(engine)
    (round_task,) = [t for t in await flow.tasks() if t["step"] == "check"]
    await flow.end(round_task["id"], "ok", {"done": False})
    await drain(engine)
    step = await step_row(flow, "check")
    assert json.loads(step["held_error"])["error"] == "poll_exhausted"
    assert (await step_row(flow, "p"))["state"] == "RUNNING"  # the join waits for it
    status, _ = await post(api, flow, "check", "resolve", {
        "reason": "settled at the bank", "evidence_ref": "bank-1",
        "step_revision": step["revision"], "conclusion": "succeeded",
        "output": {"done": True, "i": 9}})
    assert status == 202
    await drain(engine)
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == (
        "SUCCEEDED", {"x": {"done": True, "i": 9}, "y": None})
    await clean(flow)


async def test_two_retries_of_one_revision_make_one_new_activation(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    """Two operators retry the same held step at once (and the engine runs meanwhile): the
    step's lock and revision let one through; the other is stale_revision."""
    import asyncio

    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc(retry={"max_attempts": 3}))
    await drain(engine)
    await fail_current(flow, engine, "a")
    step = await step_row(flow, "a")
    body = {"reason": "race", "step_revision": step["revision"]}
    answers = await asyncio.gather(post(api, flow, "a", "retry", body),
                                   post(api, flow, "a", "retry", body), engine.run_once())
    statuses = sorted(status for status, _ in answers[:2])
    assert statuses == [201, 409], answers
    assert {a["code"] for s, a in answers[:2] if s == 409} == {"stale_revision"}
    view = next(a for s, a in answers[:2] if s == 201)
    assert [a["state"] for a in view["activations"]] == ["SUPERSEDED", "LIVE"]
    assert len([t for t in await flow.tasks() if t["step"] == "a"]) == 2
    await clean(flow)


async def test_a_held_step_without_a_task_is_resolved_not_retried(
        api: TestClient[Any, Any], db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({
        "a": task("w.a", "done", on_failure="$hold", input="{'q': 1 / (input.n - input.n)}"),
        "done": {"kind": "SUCCEED"}}, "a"))
    await drain(engine)
    step = await step_row(flow, "a")
    problem = await refused(api, flow, "a", "retry", {
        "reason": "r", "step_revision": step["revision"]}, 409, "step_not_retryable")
    assert "no task" in problem["detail"]
    status, _ = await post(api, flow, "a", "resolve", {
        "reason": "skip", "evidence_ref": "e", "step_revision": step["revision"],
        "conclusion": "succeeded", "output": None})
    assert status == 202
    await drain(engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(flow)


async def test_the_sdk_retries_and_resolves(api: TestClient[Any, Any], db: Database,
                                            engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc(retry={"max_attempts": 2}))
    await drain(engine)
    await fail_current(flow, engine, "a")
    instance_id = flow.instance_id.hex()
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        detail = await orbit.get_workflow(instance_id)
        (held,) = [s for s in detail.steps if s.name == "a"]
        assert held.held_at is not None
        assert held.held_error["error"] == "task_failed"
        with pytest.raises(Conflict) as stale:
            await orbit.retry_workflow_step(instance_id, "a", "again",
                                            step_revision=held.revision + 5)
        assert stale.value.code == "stale_revision"
        retried = await orbit.retry_workflow_step(instance_id, "a", "again",
                                                  step_revision=held.revision)
        assert (retried.workflow_id, retried.state, retried.activation_count) == (
            instance_id, "RUNNING", 2)
        assert [a.state for a in retried.activations] == ["SUPERSEDED", "LIVE"]
        await fail_current(flow, engine, "a")
        again = (await orbit.get_workflow(instance_id)).steps
        (held,) = [s for s in again if s.name == "a"]
        resolved = await orbit.resolve_workflow_step(
            instance_id, "a", "fixed by hand", evidence_ref="ops-1",
            step_revision=held.revision, conclusion="succeeded", output={"x": 1})
        assert resolved.resolution["output"] == {"x": 1}
    await drain(engine)
    assert (await step_row(flow, "a"))["state"] == "SUCCEEDED"
    await clean(flow)


async def test_the_operator_commands_retry_and_resolve(db: Database, own_url: DatabaseUrl,
                                                       engine: Engine) -> None:
    """``orbit admin workflows steps retry|resolve``: the same transactions with the
    operator's identity (audited as such); a stale revision is refused with its code."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, held_doc(retry={"max_attempts": 2}))
    await drain(engine)
    await fail_current(flow, engine, "a")
    step = await step_row(flow, "a")
    retry = ["workflows", "steps", "retry", flow.instance_id.hex(), "a", "--namespace",
             tenant.namespace, "--reason", "again", "--step-revision", str(step["revision"])]
    shown = json.loads((await ok(own_url, *retry)).out)
    assert (shown["state"], shown["activation_count"]) == ("RUNNING", 2)
    again = await orbit_admin(own_url, *retry)
    assert again.code != 0
    assert "stale_revision" in again.err
    await fail_current(flow, engine, "a")
    step = await step_row(flow, "a")
    resolved = json.loads((await ok(
        own_url, "workflows", "steps", "resolve", flow.instance_id.hex(), "a", "--namespace",
        tenant.namespace, "--reason", "by hand", "--evidence-ref", "ops-3", "--step-revision",
        str(step["revision"]), "--conclusion", "succeeded", "--output", '{"x": 2}')).out)
    assert resolved["resolution"]["actor"] == {"kind": "operator", "id": ACTOR}
    (audit,) = await audits(flow, "workflow.step.resolve")
    assert (audit["actor_kind"], audit["actor_id"]) == ("operator", ACTOR)
    await drain(engine)
    assert (await step_row(flow, "a"))["state"] == "SUCCEEDED"
    assert [t["step"] for t in await flow.tasks()] == ["a", "a", "b"]
    await clean(flow)

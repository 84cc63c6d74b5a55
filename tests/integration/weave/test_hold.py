"""``$hold``: a failure or timeout transition that holds its step for a person (docs/weave/
recovery.md) -- the step stays WAITING with its activation LIVE, ``held_at`` and ``held_error``
set; the instance keeps RUNNING (a PARALLEL join waits for it); the engine never advances it;
the reference interpreter predicts the same."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orbit_common.db.pool import Database
from orbit_common.weave.engine import Engine
from tests.conftest import make_tenant
from tests.integration.weave.engine_support import (
    Flow,
    assert_matches,
    begin,
    doc,
    drain,
    play,
    task,
)
from tests.integration.weave.test_polls import answer, next_round, poll, state
from tests.integration.weave.test_signals import reach_wait, rows
from tests.support import database, invariants
from tests.support.lease_fixtures import wait_db_time_past

own_url, db = database.own_database("orbit_weave_hold")


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-hold", lease_ms=30_000, batch=8)


async def clean(flow: Flow) -> None:
    assert await invariants.check_db(flow.db, [flow.tenant.namespace_id]) == []


async def held(flow: Flow, name: str) -> dict[str, Any]:
    """The step, asserted held: WAITING, its (only) activation LIVE, held_at and held_error."""
    step = (await flow.steps())[name]
    assert step["state"] == "WAITING"
    assert step["held_at"] is not None
    assert step["live_activation_id"] is not None
    (activation,) = [a for a in await rows(flow, "weave_activations")
                     if a["step_id"] == step["id"]]
    assert activation["state"] == "LIVE"
    assert (await flow.instance())["state"] == "RUNNING"
    return {**step, "held_error": json.loads(step["held_error"])}


async def events(flow: Flow) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("SELECT event_type, payload FROM orbit_events WHERE namespace_id = %s"
                          " AND aggregate_type = 'workflow_instance' AND aggregate_id = %s"
                          " ORDER BY aggregate_revision",
                          (flow.tenant.namespace_id, flow.instance_id))
        return [{**dict(r), "payload": json.loads(r["payload"])} for r in await cur.fetchall()]
    return await flow.db.read("test.hold.events", body)


async def test_a_failed_task_holds_its_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({"a": task("w.a", "done", on_failure="$hold"),
                    "done": {"kind": "SUCCEED"}}, "a")
    flow = await begin(db, tenant, document)
    script = {"w.a": ("fail", "broken")}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    step = await held(flow, "a")
    assert step["held_error"]["error"] == "task_failed"
    assert step["held_error"]["step"] == "a"
    assert step["error"] is None
    assert step["output"] is None
    assert run.held == {"a": step["held_error"]}
    (row,) = await flow.inbox()
    assert row["outcome"] == "advanced"  # the result moved the step: into its hold
    assert (await events(flow))[-1]["payload"]["held"] == ["a"]
    # Nothing else moves it: another engine round leaves it as it was.
    await drain(engine)
    assert (await held(flow, "a"))["held_at"] == step["held_at"]
    await clean(flow)


async def test_a_result_of_the_wrong_shape_holds_its_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({"a": task("w.a", "done", on_failure="$hold", result_schema={
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
        "done": {"kind": "SUCCEED"}}, "a")
    flow = await begin(db, tenant, document)
    script = {"w.a": ("ok", {"x": "no"})}
    await play(flow, engine, script)
    await assert_matches(flow, script)
    assert (await held(flow, "a"))["held_error"]["error"] == "result_shape_mismatch"
    await clean(flow)


async def test_an_input_expression_failure_holds_the_step_without_a_task(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({"a": task("w.a", "done", on_failure="$hold",
                              input="{'q': 10 / (input.n - input.n)}"),
                    "done": {"kind": "SUCCEED"}}, "a")
    flow = await begin(db, tenant, document)
    await play(flow, engine, {})
    await assert_matches(flow, {})
    step = await held(flow, "a")
    assert step["held_error"]["error"] == "expression_failed"
    assert await flow.tasks() == []
    await clean(flow)


async def test_a_parallel_join_waits_for_a_held_branch(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "p": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "done",
              "branches": [
                  {"name": "x", "start": "a", "steps": {
                      "a": task("w.a", "ax", on_failure="$hold"),
                      "ax": {"kind": "SUCCEED"}}},
                  {"name": "y", "start": "b", "steps": {
                      "b": task("w.b", "by"), "by": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED"}}, "p")
    flow = await begin(db, tenant, document)
    script = {"w.a": ("fail", "x"), "w.b": ("ok", {"v": 1})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "RUNNING"
    await held(flow, "a")
    steps = await flow.steps()
    assert steps["b"]["state"] == "SUCCEEDED"  # the other branch went on
    assert steps["p"]["state"] == "RUNNING"
    assert json.loads(steps["p"]["join_state"]) == {"y": {"ok": True, "value": None}}
    await clean(flow)


async def test_a_fail_fast_block_that_closes_ends_its_held_step(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "p": {"kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
              "branches": [
                  {"name": "x", "start": "a", "steps": {
                      "a": task("w.a", "ax", on_failure="$hold"),
                      "ax": {"kind": "SUCCEED"}}},
                  {"name": "y", "start": "b", "steps": {
                      "b": task("w.b", "by"), "by": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED"}}, "p")
    flow = await begin(db, tenant, document)
    script = {"w.a": ("fail", "x"), "w.b": ("fail", "y")}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "FAILED"
    assert run.held == {}
    step = (await flow.steps())["a"]
    assert (step["state"], step["held_at"], step["held_error"]) == ("CANCELLED", None, None)
    await clean(flow)


async def test_a_signal_timeout_holds_its_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "a": task("w.a", "approve"),
        "approve": {"kind": "SIGNAL", "signal": "approval", "correlation": "input.order",
                    "timeout_ms": 300, "on_timeout": "$hold", "next": "done"},
        "done": {"kind": "SUCCEED"}}, "a", input_schema={
            "type": "object", "properties": {"order": {"type": "string"}},
            "required": ["order"]})
    flow = await begin(db, tenant, document, {"order": "o-1"})
    await reach_wait(flow, engine)
    (wait,) = await rows(flow, "weave_waits")
    await wait_db_time_past(db, wait["deadline_at"])
    await drain(engine)
    step = await held(flow, "approve")
    assert step["held_error"] == {"error": "signal_timeout", "step": "approve"}
    (wait,) = await rows(flow, "weave_waits")
    assert wait["state"] == "TIMED_OUT"
    await clean(flow)


@pytest.mark.parametrize("field", ["on_exhausted", "on_failure"])
async def test_an_exhausted_poll_holds_its_step(db: Database, engine: Engine,
                                                field: str) -> None:
    """``on_exhausted`` holds; without it, ``on_failure: $hold`` holds an exhausted query too
    (an exhausted query takes on_exhausted, else on_failure)."""
    tenant = await make_tenant(db)
    document = doc({"check": poll(max_rounds=2, **{field: "$hold"}),
                    "done": {"kind": "SUCCEED", "output": "steps.check.result"}}, "check")
    flow = await begin(db, tenant, document)
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await next_round(flow, engine)
    await answer(flow, engine, "ok", {"done": False})
    step = await held(flow, "check")
    assert step["held_error"] == {"error": "poll_exhausted", "rounds": 2,
                                  "reason": "max_rounds", "step": "check"}
    assert (await state(flow))["state"] == "EXHAUSTED"
    await clean(flow)


async def test_a_failed_poll_round_holds_its_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({"check": poll(on_failure="$hold"),
                    "done": {"kind": "SUCCEED", "output": "steps.check.result"}}, "check")
    flow = await begin(db, tenant, document)
    await drain(engine)
    await answer(flow, engine, "fail", "down")
    step = await held(flow, "check")
    assert step["held_error"]["error"] == "task_failed"
    assert (await state(flow))["state"] == "FAILED"
    await clean(flow)

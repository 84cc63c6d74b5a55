"""POLL steps (bounded queries) through the engine against the real database: rounds until the
condition holds, exhaustion by rounds and by the absolute deadline, backoff, failed and held
rounds, cancel, the gate, stale results, and the invariant probe ``poll_rounds``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.weave import interpreter, language
from orbit_common.weave.engine import Engine
from tests.conftest import make_tenant
from tests.integration.weave.engine_support import (
    Flow,
    _queue_names,
    assert_same,
    begin,
    doc,
    drain,
    frozen_errors,
    task,
)
from tests.support import database, invariants
from tests.support.lease_fixtures import make_queue
from tests.support.waiting import until

own_url, db = database.own_database("orbit_weave_polls")


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-polls", lease_ms=30_000, batch=8)


def poll(**extra: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "kind": "POLL", "queue": "Q", "handler": "w.a", "input": "{'n': input.n}",
        "until": "round.result.done", "interval_ms": 100, "max_rounds": 5, "next": "done",
        "result_schema": {"type": "object", "properties": {"done": {"type": "boolean"},
                                                            "i": {"type": "integer"}},
                          "required": ["done"]}}
    step.update(extra)
    return step


def flow_doc(**extra: Any) -> dict[str, Any]:
    """A POLL step, then SUCCEED with its result; ``gave_up`` (FAIL) and ``mend`` (a TASK)
    exist when a transition names them."""
    steps: dict[str, Any] = {"check": poll(**extra),
                             "done": {"kind": "SUCCEED", "output": "steps.check.result"}}
    targets = {v for v in extra.values() if isinstance(v, str)}
    if "gave_up" in targets:
        steps["gave_up"] = {"kind": "FAIL", "error": "gave_up"}
    if "mend" in targets:
        steps["mend"] = task("w.b", "mended")
        steps["mended"] = {"kind": "SUCCEED"}
    return doc(steps, "check")


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.polls.rows", body)


async def state(flow: Flow) -> dict[str, Any]:
    (found,) = await rows(flow.db, "SELECT * FROM weave_poll_states WHERE namespace_id = %s"
                          " AND instance_id = %s", flow.tenant.namespace_id, flow.instance_id)
    return found


async def rounds(flow: Flow) -> list[dict[str, Any]]:
    return await rows(flow.db, "SELECT * FROM weave_poll_rounds WHERE namespace_id = %s"
                      " AND instance_id = %s ORDER BY round", flow.tenant.namespace_id,
                      flow.instance_id)


async def advance_row(flow: Flow) -> dict[str, Any]:
    (found,) = await rows(flow.db, "SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                          " AND instance_id = %s AND kind = 'POLL'", flow.tenant.namespace_id,
                          flow.instance_id)
    return found


async def current_task(flow: Flow) -> dict[str, Any]:
    return (await flow.tasks())[-1]


async def answer(flow: Flow, engine: Engine, outcome: str, result: Any = None) -> None:
    """End the current round's task and let the engine consume it."""
    await flow.end((await current_task(flow))["id"], outcome, result)
    await drain(engine)


async def next_round(flow: Flow, engine: Engine) -> None:
    """Run the engine until the WAITING query's next round exists (its interval passes)."""
    before = len(await flow.tasks())

    async def made() -> bool:
        await engine.run_once()
        return len(await flow.tasks()) > before

    await until(made, timeout=10, interval=0.02, message="the next round")


async def clean(db: Database, namespace_id: bytes) -> None:
    assert await invariants.check_db(db, [namespace_id]) == []


async def test_satisfied_after_three_rounds(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc(), {"n": 4})
    await drain(engine)
    first = await state(flow)
    assert (first["state"], first["used_rounds"], first["max_rounds"]) == ("ROUND", 1, 5)
    assert (await flow.steps())["check"]["state"] == "RUNNING"
    assert (await advance_row(flow))["state"] == "DONE"
    for n in range(2):
        await answer(flow, engine, "ok", {"done": False, "i": n})
        waiting = await state(flow)
        assert (waiting["state"], waiting["used_rounds"]) == ("WAITING", n + 1)
        assert (await flow.steps())["check"]["state"] == "WAITING"
        armed = await advance_row(flow)
        assert (armed["state"], armed["due_at"]) == ("PENDING", waiting["next_round_at"])
        await next_round(flow, engine)
        assert (await flow.steps())["check"]["state"] == "RUNNING"
    await answer(flow, engine, "ok", {"done": True, "i": 2})
    made = await flow.tasks()
    assert [(t["sequence"], t["step"], json.loads(t["input"])) for t in made] == [
        (1, "check", {"n": 4}), (2, "check", {"n": 4}), (3, "check", {"n": 4})]
    assert [(r["round"], r["state"], r["task_id"]) for r in await rounds(flow)] == [
        (1, "NOT_MET", made[0]["id"]), (2, "NOT_MET", made[1]["id"]), (3, "MET", made[2]["id"])]
    assert json.loads((await rounds(flow))[2]["result"]) == {"done": True, "i": 2}
    final = await state(flow)
    assert (final["state"], final["used_rounds"], final["deadline_at"]) == ("SATISFIED", 3, None)
    assert json.loads(final["last_result"]) == {"done": True, "i": 2}
    assert (await advance_row(flow))["state"] == "DONE"
    step = (await flow.steps())["check"]
    assert (step["state"], json.loads(step["output"])) == ("SUCCEEDED", {"done": True, "i": 2})
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == (
        "SUCCEEDED", {"done": True, "i": 2})
    assert {r["outcome"] for r in await flow.inbox()} == {"advanced"}
    await clean(db, tenant.namespace_id)


@pytest.mark.parametrize("exit_to", ["on_exhausted", "on_failure", None])
async def test_exhausted_by_rounds(db: Database, engine: Engine, exit_to: str | None) -> None:
    tenant = await make_tenant(db)
    extra: dict[str, Any] = {"max_rounds": 2}
    if exit_to == "on_exhausted":
        extra |= {"on_exhausted": "gave_up", "on_failure": "mend"}
    elif exit_to == "on_failure":
        extra |= {"on_failure": "gave_up"}
    flow = await begin(db, tenant, flow_doc(**extra))
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await next_round(flow, engine)
    await answer(flow, engine, "ok", {"done": False})
    final = await state(flow)
    assert (final["state"], final["used_rounds"]) == ("EXHAUSTED", 2)
    assert len(await rounds(flow)) == 2
    step = (await flow.steps())["check"]
    error = {"error": "poll_exhausted", "rounds": 2, "reason": "max_rounds", "step": "check"}
    assert (step["state"], json.loads(step["error"])) == ("FAILED", error)
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    if exit_to is None:
        assert json.loads(instance["error"]) == error
    else:
        assert json.loads(instance["error"])["error"] == "gave_up"
    assert (await advance_row(flow))["state"] == "DONE"
    assert len(await flow.tasks()) == 2
    await clean(db, tenant.namespace_id)


async def test_exhausted_by_the_absolute_deadline(db: Database, engine: Engine) -> None:
    """The deadline is fixed when the step starts; every round's task deadline is within it;
    the query ends when the next round would come at or after it."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc(max_rounds=1000, query_deadline_ms=1200,
                                            interval_ms=400, deadline_ms=60_000))
    await drain(engine)
    entered = await state(flow)
    deadline = entered["deadline_at"]
    assert deadline == entered["created_at"] + dt.timedelta(milliseconds=1200)
    while (await state(flow))["state"] != "EXHAUSTED":
        current = await state(flow)
        assert current["deadline_at"] == deadline
        if current["state"] == "WAITING":
            await next_round(flow, engine)
        else:
            await answer(flow, engine, "ok", {"done": False})
    final = await state(flow)
    assert final["deadline_at"] == deadline
    made = await rounds(flow)
    assert 1 <= final["used_rounds"] == len(made) < 1000
    assert made[-1]["ended_at"] + dt.timedelta(milliseconds=final["next_interval_ms"]) >= deadline
    tasks = await rows(db, "SELECT deadline_at FROM pulse_tasks WHERE namespace_id = %s"
                       " AND owner_id = %s", tenant.namespace_id, flow.instance_id)
    assert tasks
    assert all(t["deadline_at"] <= deadline for t in tasks)
    error = json.loads((await flow.instance())["error"])
    assert (error["error"], error["reason"], error["rounds"]) == (
        "poll_exhausted", "deadline", final["used_rounds"])
    await clean(db, tenant.namespace_id)


async def test_backoff_grows_the_stored_interval_up_to_its_ceiling(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc(
        interval_ms=100, backoff={"multiplier": 2, "max_interval_ms": 300}))
    await drain(engine)
    assert (await state(flow))["next_interval_ms"] == 100
    waits, stored = [], []
    for _ in range(3):
        await answer(flow, engine, "ok", {"done": False})
        current = await state(flow)
        waits.append((current["next_round_at"] - current["updated_at"])
                     // dt.timedelta(milliseconds=1))
        stored.append(current["next_interval_ms"])
        await next_round(flow, engine)
    assert waits == [100, 200, 300]
    assert stored == [200, 300, 300]
    await answer(flow, engine, "ok", {"done": True})
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(db, tenant.namespace_id)


@pytest.mark.parametrize("on_failure", [True, False])
async def test_a_failed_round_task_fails_the_step(db: Database, engine: Engine,
                                                  on_failure: bool) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc(**({"on_failure": "mend"} if on_failure else {})))
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await next_round(flow, engine)
    await answer(flow, engine, "fail", "broken")
    assert [r["state"] for r in await rounds(flow)] == ["NOT_MET", "FAILED"]
    assert (await state(flow))["state"] == "FAILED"
    step = (await flow.steps())["check"]
    assert (step["state"], json.loads(step["error"])["error"]) == ("FAILED", "task_failed")
    if on_failure:
        assert [t["step"] for t in await flow.tasks()] == ["check", "check", "mend"]
        await answer(flow, engine, "ok", {"done": True})
        assert (await flow.instance())["state"] == "SUCCEEDED"
    else:
        instance = await flow.instance()
        assert instance["state"] == "FAILED"
        assert json.loads(instance["error"])["error"] == "task_failed"
    await clean(db, tenant.namespace_id)


async def test_a_result_that_breaks_the_schema_fails_the_step(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc())
    await drain(engine)
    await answer(flow, engine, "ok", {"done": "yes"})
    assert [r["state"] for r in await rounds(flow)] == ["FAILED"]
    error = json.loads((await flow.instance())["error"])
    assert (error["error"], error["step"]) == ("result_shape_mismatch", "check")
    await clean(db, tenant.namespace_id)


async def test_a_round_in_review_holds_the_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc())
    await drain(engine)
    await answer(flow, engine, "unknown")
    assert [r["outcome"] for r in await flow.inbox()] == ["held"]
    assert (await flow.steps())["check"]["state"] == "WAITING"
    held = await state(flow)
    assert (held["state"], held["used_rounds"]) == ("ROUND", 1)
    assert [r["state"] for r in await rounds(flow)] == ["RUNNING"]
    await clean(db, tenant.namespace_id)


def fail_fast_poll(side: str) -> dict[str, Any]:
    """A FAIL_FAST block: branch a polls, branch b's task (on ``side``) decides when it fails."""
    branch_b = task("w.b", "ok_b")
    branch_b["queue"] = side
    return doc({"fan": {
        "kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
        "branches": [
            {"name": "a", "start": "check", "steps": {
                "check": poll(next="ok_a"), "ok_a": {"kind": "SUCCEED"}}},
            {"name": "b", "start": "t_b", "steps": {
                "t_b": branch_b, "ok_b": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED"}}, "fan")


@pytest.mark.parametrize("when", ["waiting", "round"])
async def test_a_closed_block_cancels_the_query(db: Database, engine: Engine,
                                                when: str) -> None:
    tenant = await make_tenant(db)
    side = await make_queue(db, tenant, name="side", max_attempts=1)
    flow = await begin(db, tenant, fail_fast_poll(side.name))
    flow.more_queues.append(side)
    await drain(engine)
    first, t_b = await flow.tasks()
    if when == "waiting":
        await flow.end(first["id"], "ok", {"done": False})
        await drain(engine)
        assert (await advance_row(flow))["state"] == "PENDING"
    await flow.end(t_b["id"], "fail", "no")
    await drain(engine)
    steps = await flow.steps()
    if when == "waiting":
        assert (steps["check"]["state"], steps["fan"]["state"]) == ("CANCELLED", "FAILED")
        assert (await state(flow))["state"] == "CANCELLED"
        assert [r["state"] for r in await rounds(flow)] == ["NOT_MET"]
    else:
        # The round's task is in flight: the failure settlement (docs/weave/stop.md) keeps
        # the query's step RUNNING and the instance STOPPING until the round's result.
        assert (steps["check"]["state"], steps["fan"]["state"]) == ("RUNNING", "FAILED")
        assert (await flow.instance())["state"] == "STOPPING"
        (task_row,) = await rows(db, "SELECT state, cancel_requested_at, cancel_reason"
                                 " FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                                 tenant.namespace_id, first["id"])
        # Claimed and started with t_b: a running task gets the intent.
        assert task_row["cancel_reason"] == "workflow instance failed"
        assert task_row["cancel_requested_at"] is not None
        await flow.end(first["id"], "ok", {"done": True})
        await drain(engine)
        assert [r["outcome"] for r in await flow.inbox()
                if r["task_id"] == first["id"]] == ["stopping"]
        steps = await flow.steps()
        assert steps["check"]["state"] == "SUCCEEDED"  # the met round is recorded ...
        assert "ok_a" not in steps  # ... and nothing advances
        assert (await state(flow))["state"] == "SATISFIED"
        assert [r["state"] for r in await rounds(flow)] == ["MET"]
    assert (await advance_row(flow))["state"] == "DONE"
    assert (await flow.instance())["state"] == "FAILED"
    assert len([t for t in await flow.tasks() if t["step"] == "check"]) == 1
    await clean(db, tenant.namespace_id)


async def test_the_next_round_waits_for_an_open_gate(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc())
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    gate_id = (await flow.instance())["gate_id"]

    async def set_gate(value: str) -> None:
        await db.transaction("test.gate", lambda cur: cur.execute(
            "UPDATE pulse_execution_gates SET state = %s WHERE namespace_id = %s AND id = %s",
            (value, tenant.namespace_id, gate_id)))

    await set_gate("PAUSED")
    due = (await advance_row(flow))["due_at"]

    async def rearmed() -> bool:
        await engine.run_once()
        row = await advance_row(flow)
        return bool(row["state"] == "PENDING" and row["due_at"] > due)

    await until(rearmed, timeout=10, interval=0.02, message="a re-armed advance")
    paused = await state(flow)
    assert (paused["state"], paused["used_rounds"]) == ("WAITING", 1)
    assert len(await flow.tasks()) == 1
    await set_gate("OPEN")
    await next_round(flow, engine)
    assert (await state(flow))["used_rounds"] == 2
    await clean(db, tenant.namespace_id)


async def test_an_older_rounds_result_is_not_consumed_again(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc())
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await next_round(flow, engine)
    first, _ = await flow.tasks()
    (row,) = await flow.inbox()
    assert row["activation_id"] is not None
    # The first round's row comes back (a commit whose outcome was lost): never advanced.
    await db.transaction("test.replay", lambda cur: cur.execute(
        "UPDATE weave_inbox SET state = 'PENDING', consumed_at = NULL, outcome = NULL"
        " WHERE namespace_id = %s AND task_id = %s", (tenant.namespace_id, first["id"])))
    (done,) = [r for r in await drain(engine) if r.inbox]
    assert done.outcomes == {"duplicate": 1}
    assert (await state(flow))["used_rounds"] == 2
    assert len(await flow.tasks()) == 2
    # An older round's task is still linked to the activation (through its round) and has a
    # workflow source.
    await answer(flow, engine, "ok", {"done": True})
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(db, tenant.namespace_id)


async def test_the_poll_rounds_probe_finds_corruption(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc())
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await clean(db, tenant.namespace_id)
    ns = tenant.namespace_id

    async def run(sql: str, *params: Any) -> None:
        await db.transaction("test.corrupt", lambda cur: cur.execute(sql, params))

    # A WAITING query without its pending advance.
    await run("UPDATE weave_pending_advances SET state = 'DONE', done_at = UTC_TIMESTAMP(6),"
              " lease_owner = NULL, lease_expires_at = NULL WHERE namespace_id = %s"
              " AND instance_id = %s AND kind = 'POLL'", ns, flow.instance_id)
    found = await invariants.check_db(db, [ns])
    assert invariants.codes(found) == {"poll_rounds"}, found
    assert "pending advance" in found[0]
    await run("UPDATE weave_pending_advances SET state = 'PENDING', done_at = NULL"
              " WHERE namespace_id = %s AND instance_id = %s AND kind = 'POLL'",
              ns, flow.instance_id)
    await clean(db, ns)
    # A gap in the round numbers.
    await run("UPDATE weave_poll_rounds SET round = 3 WHERE namespace_id = %s"
              " AND instance_id = %s AND round = 1", ns, flow.instance_id)
    found = await invariants.check_db(db, [ns])
    assert invariants.codes(found) == {"poll_rounds"}, found
    await run("UPDATE weave_poll_rounds SET round = 1 WHERE namespace_id = %s"
              " AND instance_id = %s AND round = 3", ns, flow.instance_id)
    await clean(db, ns)
    # More rounds than the maximum.
    (poll_state,) = await rows(db, "SELECT step_id, activation_id FROM weave_poll_states"
                               " WHERE namespace_id = %s AND instance_id = %s",
                               ns, flow.instance_id)
    await run("UPDATE weave_poll_states SET max_rounds = 1 WHERE namespace_id = %s"
              " AND instance_id = %s", ns, flow.instance_id)
    await run("INSERT INTO weave_poll_rounds (namespace_id, instance_id, activation_id, round,"
              " step_id, task_id, state, created_at) VALUES (%s, %s, %s, 2, %s, %s, 'NOT_MET',"
              " UTC_TIMESTAMP(6))", ns, flow.instance_id, poll_state["activation_id"],
              poll_state["step_id"], b"\x01" * 16)
    found = await invariants.check_db(db, [ns])
    assert invariants.codes(found) == {"poll_rounds"}, found
    assert "used 1 of 1 rounds but has 2 round rows" in found[0]
    await run("DELETE FROM weave_poll_rounds WHERE namespace_id = %s AND task_id = %s",
              ns, b"\x01" * 16)
    await clean(db, ns)


def _ms(delta: dt.timedelta) -> int:
    return delta // dt.timedelta(milliseconds=1)


async def test_round_times_are_database_times(db: Database, engine: Engine) -> None:
    """The query deadline is fixed from the entering advance's database time."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc(query_deadline_ms=60_000))
    await drain(engine)
    entered = await state(flow)
    (first,) = await rounds(flow)
    assert _ms(entered["deadline_at"] - entered["created_at"]) == 60_000
    assert as_utc(first["created_at"]) == as_utc(entered["created_at"])


# --- the engine against the reference interpreter ----------------------------------------------

CHAIN = doc({
    "a": task("w.a", "check", input="{'n': input.n}"),
    "check": poll(input="{'n': input.n + 1}", max_rounds=3, on_exhausted="gave_up",
                  on_failure="mend"),
    "after": task("w.c", "done", input="{'i': steps.check.result.i}"),
    "done": {"kind": "SUCCEED", "output": "{'check': steps.check.result}"},
    "gave_up": {"kind": "FAIL", "error": "gave_up", "cause": "input.n"},
    "mend": task("w.b", "mended"),
    "mended": {"kind": "SUCCEED", "output": "'mended'"},
}, "a")
CHAIN["steps"]["check"]["next"] = "after"


@pytest.mark.parametrize("script", [
    [("ok", {"done": False, "i": 1}), ("ok", {"done": True, "i": 2})],
    [("ok", {"done": False})] * 3,
    [("ok", {"done": False}), ("fail", "broken")],
    [("ok", {"done": True, "i": 7})],
])
async def test_the_engine_polls_as_the_interpreter_predicts(
        db: Database, engine: Engine, script: list[tuple[str, Any]]) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, CHAIN, {"n": 5})
    await drain(engine)
    await answer(flow, engine, "ok", {})  # a
    for n, (kind, result) in enumerate(script):
        if n:
            await next_round(flow, engine)
        await answer(flow, engine, kind, result)
    for t in await flow.tasks():
        if t["step"] in ("after", "mend") and t["state"] == "WAITING":
            await answer(flow, engine, "ok", {"after": True})
    frozen = await frozen_errors(flow)
    by_sequence = {t["sequence"]: t["id"].hex() for t in await flow.tasks()}

    def outcome(call: interpreter.TaskCall) -> interpreter.Outcome:
        if call.step != "check":
            return interpreter.Succeeded(result={} if call.step == "a" else {"after": True})
        kind, result = script[call.round - 1]
        if kind == "fail":
            return interpreter.Failed(error=frozen[by_sequence[call.seq]])
        return interpreter.Succeeded(result=result)

    run = interpreter.run(language.validate_document(_queue_names(CHAIN, flow.queue.name)),
                          {"n": 5}, outcome)
    await assert_same(flow, run)
    assert run.state is not interpreter.InstanceState.RUNNING
    assert [c.round for c in run.tasks if c.step == "check"] == list(
        range(1, len(script) + 1))
    await clean(db, tenant.namespace_id)


async def test_a_refused_next_round_fails_the_instance_instead_of_looping(
        db: Database, engine: Engine) -> None:
    """The next round's task is refused (its queue is gone): the advance is rejected once, the
    instance fails with task_rejected, the query is cancelled and its advance is done."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, flow_doc())
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await db.transaction("test.drop_queue", lambda cur: cur.execute(
        "UPDATE pulse_queues SET name = CONCAT(name, '-gone') WHERE namespace_id = %s"
        " AND id = %s", (tenant.namespace_id, flow.queue.id)))

    async def ended() -> bool:
        await engine.run_once()
        return bool((await flow.instance())["state"] != "RUNNING")

    await until(ended, timeout=10, interval=0.02, message="the instance to fail")
    instance = await flow.instance()
    assert json.loads(instance["error"])["error"] == "task_rejected"
    assert (await state(flow))["state"] == "CANCELLED"
    assert (await state(flow))["used_rounds"] == 1
    assert (await advance_row(flow))["state"] == "DONE"
    assert len(await flow.tasks()) == 1
    await clean(db, tenant.namespace_id)


async def test_a_round_made_and_cancelled_in_one_advance_is_cancelled_at_once(
        db: Database, engine: Engine) -> None:
    """The POLL advance is due and the other branch's failure arrives in the same engine round:
    the next round is made, then the block closes in the same advance -- the new round's task
    (in the query's existing activation) is cancelled before any worker sees it."""
    tenant = await make_tenant(db)
    side = await make_queue(db, tenant, name="side", max_attempts=1)
    flow = await begin(db, tenant, fail_fast_poll(side.name))
    flow.more_queues.append(side)
    await drain(engine)
    first, t_b = await flow.tasks()
    await flow.end(first["id"], "ok", {"done": False})
    await drain(engine)
    waiting = await state(flow)
    assert waiting["state"] == "WAITING"

    async def due() -> bool:
        found = await rows(db, "SELECT UTC_TIMESTAMP(6) >= %s AS due", waiting["next_round_at"])
        return bool(found[0]["due"])

    await until(due, timeout=10, interval=0.02, message="the next round to be due")
    await flow.end(t_b["id"], "fail", "no")
    done = await engine.run_once()
    assert (done.inbox, done.advances) == (1, 1)
    made = await flow.tasks()
    assert [t["step"] for t in made] == ["check", "t_b", "check"]
    (task_row,) = await rows(db, "SELECT state, cancel_reason FROM pulse_tasks"
                             " WHERE namespace_id = %s AND id = %s",
                             tenant.namespace_id, made[2]["id"])
    assert (task_row["state"], task_row["cancel_reason"]) == ("CANCELLED",
                                                              "workflow instance failed")
    assert [r["state"] for r in await rounds(flow)] == ["NOT_MET", "CANCELLED"]
    assert (await state(flow))["state"] == "CANCELLED"
    await drain(engine)
    assert [r["outcome"] for r in await flow.inbox() if r["task_id"] == made[2]["id"]] == [
        "instance_ended"]
    await clean(db, tenant.namespace_id)

"""TIMER steps (orbit_common/weave/timers.py, docs/weave/waits.md § 计时（TIMER）) against the real
database: entering (the wait, the fixed-activation pending advance), firing once and never
early (database time), late firing recorded as late, ``until`` instants and their refusals,
cancellation by closed blocks and ended instances, the invariant probe. A database of its own:
the engine's lease scans read every namespace."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest

from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.weave import leasing
from orbit_common.weave.engine import Engine
from tests.conftest import make_tenant
from tests.integration.weave.engine_support import (
    Flow,
    assert_matches,
    begin,
    doc,
    drain,
    fire_due_timers,
    play,
    task,
)
from tests.support import database, invariants
from tests.support.lease_fixtures import db_time, make_queue, wait_db_time_past

own_url, db = database.own_database("orbit_weave_timers")


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-timers", lease_ms=30_000, batch=64)


async def rows(db: Database, table: str, flow: Flow, *extra: str) -> list[dict[str, Any]]:
    """``table``'s rows of the flow's instance (fixed table names from the tests)."""
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(f"SELECT * FROM {table} WHERE namespace_id = %s AND instance_id = %s"
                          f"{''.join(extra)} ORDER BY created_at, id",
                          (flow.tenant.namespace_id, flow.instance_id))
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.timer_rows", body)


async def timer_advances(db: Database, flow: Flow) -> list[dict[str, Any]]:
    return await rows(db, "weave_pending_advances", flow, " AND kind = 'TIMER'")


async def clean(db: Database, flow: Flow) -> None:
    assert await invariants.check_db(db, [flow.tenant.namespace_id]) == []


def timed(wait: dict[str, Any], *, then: str = "after") -> dict[str, Any]:
    return {"kind": "TIMER", "next": then, **wait}


READS_RESULT = doc({
    "pause": timed({"duration_ms": 1000}),
    "after": task("w.a", "done", input="{'late': steps.pause.result.late_ms,"
                                       " 'due': steps.pause.result.due_at}"),
    "done": {"kind": "SUCCEED", "output": "steps.pause.result"},
}, "pause")


async def test_a_timer_waits_its_duration_then_fires_once_and_its_next_step_runs(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, READS_RESULT)
    await drain(engine)
    steps = await flow.steps()
    assert steps["pause"]["state"] == "WAITING"
    (wait,) = await rows(db, "weave_waits", flow)
    (advance,) = await timer_advances(db, flow)
    entered = as_utc(steps["pause"]["created_at"])
    due = entered + dt.timedelta(milliseconds=1000)
    assert (wait["kind"], wait["state"], wait["generation"]) == ("TIMER", "WAITING", 1)
    assert as_utc(wait["deadline_at"]) == as_utc(wait["first_deadline_at"]) == due
    assert (wait["activation_id"], wait["step_id"]) == (steps["pause"]["live_activation_id"],
                                                        steps["pause"]["id"])
    assert (advance["state"], as_utc(advance["due_at"])) == ("PENDING", due)
    assert advance["activation_id"] == wait["activation_id"]
    assert await flow.tasks() == []
    await clean(db, flow)
    await wait_db_time_past(db, due)
    rounds = await drain(engine)
    assert sum(r.outcomes.get("advanced", 0) for r in rounds) == 1
    (wait,) = await rows(db, "weave_waits", flow)
    fired = as_utc(wait["fired_at"])
    assert wait["state"] == "FIRED"
    assert fired >= due
    assert wait["late_ms"] == (fired - due) // dt.timedelta(milliseconds=1)
    (advance,) = await timer_advances(db, flow)
    assert advance["state"] == "DONE"
    steps = await flow.steps()
    result = json.loads(steps["pause"]["output"])
    assert steps["pause"]["state"] == "SUCCEEDED"
    assert result == {"due_at": due.isoformat(timespec="microseconds"),
                      "fired_at": fired.isoformat(timespec="microseconds"),
                      "late_ms": wait["late_ms"]}
    (after,) = await flow.tasks()
    assert json.loads(after["input"]) == {"late": wait["late_ms"], "due": result["due_at"]}
    # Another round finds nothing to fire again.
    await drain(engine)
    assert len(await flow.tasks()) == 1
    await play(flow, engine, {"w.a": ("ok", {})})
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == ("SUCCEEDED", result)
    await clean(db, flow)


UNTIL = doc({
    "pause": timed({"until": "input.at"}, then="done"),
    "done": {"kind": "SUCCEED", "output": "steps.pause.result"},
}, "pause", input_schema={"type": "object", "properties": {"at": {"type": "string"}},
                          "required": ["at"]})


async def test_an_until_instant_in_the_past_fires_at_the_next_round_late_and_recorded_late(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    past = (await db_time(db)).replace(tzinfo=dt.UTC) - dt.timedelta(hours=1)
    # An offset other than Z: the instant is converted to UTC.
    spelled = past.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))).isoformat()
    flow = await begin(db, tenant, UNTIL, {"at": spelled})
    await drain(engine)
    (wait,) = await rows(db, "weave_waits", flow)
    assert as_utc(wait["first_deadline_at"]) == past
    assert wait["state"] == "FIRED"
    assert wait["late_ms"] >= 3_600_000
    instance = await flow.instance()
    assert instance["state"] == "SUCCEEDED"
    output = json.loads(instance["output"])
    assert output["due_at"] == past.isoformat(timespec="microseconds")
    assert output["late_ms"] == wait["late_ms"]
    await clean(db, flow)


async def test_an_until_instant_in_the_future_is_the_due_time(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    at = (await db_time(db)).replace(tzinfo=dt.UTC) + dt.timedelta(minutes=5)
    flow = await begin(db, tenant, UNTIL, {"at": at.isoformat().replace("+00:00", "Z")})
    await drain(engine)
    (wait,) = await rows(db, "weave_waits", flow)
    (advance,) = await timer_advances(db, flow)
    assert (wait["state"], as_utc(wait["deadline_at"]), as_utc(advance["due_at"])) == (
        "WAITING", at, at)
    await clean(db, flow)


@pytest.mark.parametrize("at", ["2030-01-02 03:04:05", "tomorrow", "2030-13-01T00:00:00Z",
                                "1969-12-31T23:59:59Z", "2999-01-01T00:00:00Z"])
async def test_an_until_that_is_not_an_instant_fails_the_step_with_expression_failed(
        db: Database, engine: Engine, at: str) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, UNTIL, {"at": at})
    await drain(engine)
    instance = await flow.instance()
    error = json.loads(instance["error"])
    assert (instance["state"], error["error"], error["step"]) == (
        "FAILED", "expression_failed", "pause")
    assert (await flow.steps())["pause"]["state"] == "FAILED"
    assert await rows(db, "weave_waits", flow) == []
    assert await timer_advances(db, flow) == []
    await clean(db, flow)


async def lease_by_hand(db: Database, engine: Engine, flow: Flow, row_id: bytes
                        ) -> list[dict[str, Any]]:
    """Lease a pending advance for ``engine`` whether or not it is due (the scan would not)."""
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("UPDATE weave_pending_advances SET state = 'LEASED', lease_owner = %s,"
                          " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,"
                          " attempts = attempts + 1 WHERE namespace_id = %s AND id = %s",
                          (engine.owner, flow.tenant.namespace_id, row_id))
        await cur.execute("SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                          " AND id = %s", (flow.tenant.namespace_id, row_id))
        return [dict(await cur.fetchone())]
    return await db.transaction("test.lease_by_hand", body)


async def test_a_timer_row_leased_before_its_due_time_goes_back_unchanged(
        db: Database, engine: Engine) -> None:
    """Never early: the lease scan never offers a row before its due time; a row leased
    anyway (here by hand) is re-checked against database time and goes back to PENDING."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({"pause": timed({"duration_ms": 3_600_000}, then="done"),
                                        "done": {"kind": "SUCCEED"}}, "pause"))
    await drain(engine)
    (advance,) = await timer_advances(db, flow)
    leased = await lease_by_hand(db, engine, flow, advance["id"])
    done = await engine.advance(tenant.namespace_id, flow.instance_id, [], leased)
    assert done.outcomes == {"early": 1}
    (after,) = await timer_advances(db, flow)
    assert (after["state"], after["due_at"], after["done_at"], after["lease_owner"]) == (
        "PENDING", advance["due_at"], None, None)
    (wait,) = await rows(db, "weave_waits", flow)
    assert (wait["state"], wait["fired_at"]) == ("WAITING", None)
    assert (await flow.steps())["pause"]["state"] == "WAITING"
    await clean(db, flow)


async def test_two_engines_racing_fire_a_timer_once(db: Database) -> None:
    tenant = await make_tenant(db)
    flows = [await begin(db, tenant, READS_RESULT) for _ in range(6)]
    one, two = (Engine(db, owner=f"engine-race-{i}", batch=4) for i in range(2))
    rounds = await drain(one)  # the six roots (a timer may come due meanwhile)
    waits = [(await rows(db, "weave_waits", f))[0] for f in flows]
    await wait_db_time_past(db, max(as_utc(w["deadline_at"]) for w in waits))
    rounds += await asyncio.gather(*(e.run_once() for e in (one, two, one, two)))
    rounds += await drain(one)
    assert sum(r.outcomes.get("advanced", 0) for r in rounds) == 12
    for flow in flows:
        (wait,) = await rows(db, "weave_waits", flow)
        assert wait["state"] == "FIRED"
        assert [t["step"] for t in await flow.tasks()] == ["after"]
        await clean(db, flow)


async def test_a_lapsed_lease_on_a_timer_is_fired_by_the_next_holder_once(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, READS_RESULT)
    await drain(engine)
    (wait,) = await rows(db, "weave_waits", flow)
    await wait_db_time_past(db, wait["deadline_at"])
    dead = Engine(db, owner="engine-dead", lease_ms=1, batch=64)
    leased = await db.transaction("test.lease", lambda cur: leasing.lease_advances(
        cur, owner=dead.owner, lease_ms=1, limit=64))
    mine = [r for r in leased if r["instance_id"] == flow.instance_id]
    assert [r["kind"] for r in mine] == ["TIMER"]
    await wait_db_time_past(db, mine[0]["lease_expires_at"])
    await drain(engine)
    late = await dead.advance(tenant.namespace_id, flow.instance_id, [], mine)
    assert late.outcomes == {"fenced": 1}
    (advance,) = await timer_advances(db, flow)
    assert (advance["state"], advance["attempts"]) == ("DONE", 2)
    assert [t["step"] for t in await flow.tasks()] == ["after"]
    await clean(db, flow)


def racing(*, fail_now: bool) -> dict[str, Any]:
    """A FAIL_FAST block: branch a waits an hour; branch b fails at once (``fail_now``) or
    after its task fails."""
    branch_b: dict[str, Any] = (
        {"name": "b", "start": "stop", "steps": {"stop": {"kind": "FAIL", "error": "stopped"}}}
        if fail_now else
        {"name": "b", "start": "t_b", "steps": {"t_b": task("w.b", "ok_b"),
                                                 "ok_b": {"kind": "SUCCEED"}}})
    return doc({
        "fan": {"kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
                "branches": [{"name": "a", "start": "pause", "steps": {
                    "pause": timed({"duration_ms": 3_600_000}, then="ok_a"),
                    "ok_a": {"kind": "SUCCEED"}}}, branch_b]},
        "done": {"kind": "SUCCEED"}}, "fan")


async def test_a_closed_block_cancels_its_waiting_timer(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, racing(fail_now=False))
    await drain(engine)
    assert (await rows(db, "weave_waits", flow))[0]["state"] == "WAITING"
    (t_b,) = await flow.tasks()
    await flow.end(t_b["id"], "fail", "no")
    await drain(engine)
    (wait,) = await rows(db, "weave_waits", flow)
    (advance,) = await timer_advances(db, flow)
    assert (wait["state"], wait["fired_at"], wait["late_ms"]) == ("CANCELLED", None, None)
    assert advance["state"] == "DONE"
    steps = await flow.steps()
    assert (steps["pause"]["state"], steps["fan"]["state"]) == ("CANCELLED", "FAILED")
    assert (await flow.instance())["state"] == "FAILED"
    await clean(db, flow)


async def test_a_timer_entered_and_closed_in_one_advance_has_no_pending_advance(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, racing(fail_now=True))
    await drain(engine)
    (wait,) = await rows(db, "weave_waits", flow)
    assert wait["state"] == "CANCELLED"
    assert await timer_advances(db, flow) == []
    assert (await flow.steps())["pause"]["state"] == "CANCELLED"
    await clean(db, flow)


async def test_a_timer_whose_row_was_leased_before_its_block_closed_is_stale(
        db: Database, engine: Engine) -> None:
    """A replica leased the TIMER row, then the block closed (another replica's advance): the
    closing advance made the row DONE, so the first replica's advance is fenced off and fires
    nothing."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, racing(fail_now=False))
    slow = Engine(db, owner="engine-slow", batch=64)
    await drain(engine)
    (advance,) = await timer_advances(db, flow)
    leased = await lease_by_hand(db, slow, flow, advance["id"])
    (t_b,) = await flow.tasks()
    await flow.end(t_b["id"], "fail", "no")
    await drain(engine)
    (advance,) = await timer_advances(db, flow)
    assert (advance["state"], advance["lease_owner"]) == ("DONE", None)
    done = await slow.advance(tenant.namespace_id, flow.instance_id, [], leased)
    assert done.outcomes == {"fenced": 1}
    (wait,) = await rows(db, "weave_waits", flow)
    assert wait["state"] == "CANCELLED"
    assert "ok_a" not in await flow.steps()
    await clean(db, flow)


async def test_wait_pending_advance_probe_finds_a_waiting_timer_without_its_advance(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({"pause": timed({"duration_ms": 3_600_000}, then="done"),
                                        "done": {"kind": "SUCCEED"}}, "pause"))
    await drain(engine)
    await clean(db, flow)
    ns = [tenant.namespace_id]

    async def corrupt(statement: str) -> None:
        await db.transaction("test.corrupt", lambda cur: cur.execute(
            statement, (tenant.namespace_id, flow.instance_id)))

    await corrupt("UPDATE weave_pending_advances SET state = 'DONE', done_at = UTC_TIMESTAMP(6)"
                  " WHERE namespace_id = %s AND instance_id = %s AND kind = 'TIMER'")
    found = await invariants.check_db(db, ns)
    assert invariants.codes(found) == {"wait_pending_advance"}, found
    assert "no PENDING or LEASED TIMER pending advance" in found[0]
    await corrupt("UPDATE weave_waits SET state = 'CANCELLED' WHERE namespace_id = %s"
                  " AND instance_id = %s")
    found = await invariants.check_db(db, ns)
    assert len(found) == 2, found
    assert invariants.codes(found) == {"wait_pending_advance"}, found
    assert any("no WAITING wait" in f for f in found)


TIMED_BLOCK = doc({
    "fan": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "settle",
            "branches": [
                {"name": "a", "start": "pause", "steps": {
                    "pause": timed({"duration_ms": 200}, then="t_a"),
                    "t_a": task("w.a", "ok_a",
                                input="{'on_time': steps.pause.result.late_ms >= 0}"),
                    "ok_a": {"kind": "SUCCEED", "output": "steps.t_a.result"}}},
                {"name": "b", "start": "t_b", "steps": {
                    "t_b": task("w.b", "ok_b"), "ok_b": {"kind": "SUCCEED"}}}]},
    "settle": timed({"duration_ms": 1}, then="done"),
    "done": {"kind": "SUCCEED", "output": "steps.fan.result"},
}, "fan")


async def test_timers_in_a_block_advance_as_the_interpreter_predicts(
        db: Database, engine: Engine) -> None:
    """The interpreter fires each timer as an advance of its own before the next task result;
    with the engine's timers fired as they come due, the tasks (order, inputs), the final
    state and output are the interpreter's."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, TIMED_BLOCK)
    await drain(engine)
    await fire_due_timers(flow, engine)
    script = {"w.a": ("ok", {"a": 1}), "w.b": ("ok", {"b": 2})}
    await play(flow, engine, script)
    await fire_due_timers(flow, engine)
    run = await assert_matches(flow, script)
    assert run.state.value == "SUCCEEDED"
    assert [a.timer for a in run.advances if a.timer] == ["pause", "settle"]
    assert [t["step"] for t in await flow.tasks()] == ["t_b", "t_a"]
    assert json.loads((await flow.instance())["output"]) == {"a": {"a": 1}, "b": None}
    waits = await rows(db, "weave_waits", flow)
    assert [w["state"] for w in waits] == ["FIRED", "FIRED"]
    await clean(db, flow)


async def test_an_instance_failed_by_a_refusal_cancels_its_waiting_timer(
        db: Database, engine: Engine) -> None:
    """The instance fails with task_rejected (the queue of the step after branch b's task is
    gone) while branch a's timer waits: the failing transaction cancels the wait and makes its
    pending advance DONE."""
    tenant = await make_tenant(db)
    side = await make_queue(db, tenant, name="side", max_attempts=1)
    document = racing(fail_now=False)
    branch_b = document["steps"]["fan"]["branches"][1]["steps"]
    branch_b["t_b"]["next"] = "elsewhere"
    branch_b["elsewhere"] = {**task("w.c", "ok_b"), "queue": side.name}
    flow = await begin(db, tenant, document)
    await drain(engine)
    (t_b,) = await flow.tasks()
    await db.transaction("test.drop_queue", lambda cur: cur.execute(
        "UPDATE pulse_queues SET name = 'side-gone' WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, side.id)))
    await flow.end(t_b["id"], "ok", 1)
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"rejected": 1}
    assert json.loads((await flow.instance())["error"])["error"] == "task_rejected"
    (wait,) = await rows(db, "weave_waits", flow)
    (advance,) = await timer_advances(db, flow)
    assert (wait["state"], advance["state"]) == ("CANCELLED", "DONE")
    assert (await flow.steps())["pause"]["state"] == "CANCELLED"
    await clean(db, flow)

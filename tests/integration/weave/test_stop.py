"""The stop of a workflow instance (orbit_common/weave/stops.py, the engine's settlement;
docs/weave/stop.md) against the real database: a user's cancel records the stop intent, closes
the gate for good and asks the unfinished tasks to stop in one transaction; the instance stays
STOPPING while a step is in flight, results that arrive are recorded on their steps (a committed
success stays SUCCEEDED) and never advance, and the root continuation or the last in-flight
result settles it CANCELLED once. A database of its own: the engine's lease scans read every
namespace."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc
from orbit_common.platform.idempotency import Replay
from orbit_common.weave import controls, signals, stops
from orbit_common.weave.engine import Engine, gauges
from tests.conftest import make_tenant
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.engine_support import (
    Flow,
    begin,
    doc,
    drain,
    gate_of,
    task,
    workflow_events,
)
from tests.integration.weave.support import principal
from tests.integration.weave.test_pause import PAIR
from tests.support import database, invariants

own_url, db = database.own_database("orbit_weave_stop")

REASON = "customer withdrew the order"


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-stop", lease_ms=30_000, batch=64)


ONE = doc({"a": task("w.a", "done"), "done": {"kind": "SUCCEED"}}, "a")

NAP = doc({
    "nap": {"kind": "TIMER", "duration_ms": 3_600_000, "next": "after"},
    "after": task("w.a", "done"),
    "done": {"kind": "SUCCEED"},
}, "nap")

SIGNALLED = doc({
    "approve": {"kind": "SIGNAL", "signal": "ok", "timeout_ms": 3_600_000, "next": "after",
                "on_timeout": "late"},
    "after": task("w.a", "done"),
    "done": {"kind": "SUCCEED"},
    "late": {"kind": "FAIL", "error": "late"},
}, "approve")


async def cancel(flow: Flow, *, reason: str = REASON, control_revision: int | None = None,
                 key: str | None = None) -> Replay:
    who = await principal(flow.db, flow.tenant.api_key)
    return await stops.cancel(flow.db, who, namespace=flow.tenant.namespace,
                              instance_id=flow.instance_id.hex(), reason=reason,
                              control_revision=control_revision, idempotency_key=key)


async def control(flow: Flow, verb: str) -> Replay:
    who = await principal(flow.db, flow.tenant.api_key)
    return await controls.set_paused(flow.db, who, namespace=flow.tenant.namespace,
                                     instance_id=flow.instance_id.hex(),
                                     paused=verb == "pause", reason="maintenance")


async def read(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.stop.read", body)


async def running(flow: Flow) -> list[Any]:
    """Claim and start every task of the instance waiting now (a worker holds them): the
    grants in the order of the steps' tasks (a, then b)."""
    grants = await claim(flow.db, flow.session, flow.queue)
    await start(flow.db, flow.tenant, grants)
    order = {t["id"]: t["sequence"] for t in await flow.tasks()}
    return sorted(grants, key=lambda g: order[g.task_id])


async def task_row(flow: Flow, task_id: bytes) -> dict[str, Any]:
    (row,) = await read(flow.db, "SELECT * FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                        flow.tenant.namespace_id, task_id)
    return row


async def outcomes(flow: Flow) -> dict[str, str]:
    return {json.loads(r["snapshot"])["handler"]: r["outcome"] for r in await flow.inbox()}


async def advances(flow: Flow) -> list[tuple[str, str]]:
    rows = await read(flow.db, "SELECT kind, state FROM weave_pending_advances"
                      " WHERE namespace_id = %s AND instance_id = %s ORDER BY kind",
                      flow.tenant.namespace_id, flow.instance_id)
    return [(r["kind"], r["state"]) for r in rows]


async def clean(flow: Flow) -> None:
    assert await invariants.check_db(flow.db, [flow.tenant.namespace_id]) == []


async def test_cancel_stops_a_running_task_and_settles_once_its_result_is_recorded(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    grants = await running(flow)
    done = await cancel(flow, key="c-1")
    assert done.status == 202
    view = done.body
    assert (view["state"], view["stop_kind"], view["paused"]) == ("STOPPING", "CANCEL", False)
    assert view["stop_requested_at"] == view["cancel_requested_at"] is not None
    assert view["control_revision"] == 2
    assert json.loads(jsondoc.dumps(view["error"])) == {"error": "cancelled", "cause": REASON}
    assert (await gate_of(flow))["state"] == "STOPPED"
    for g in grants:  # the workers get the cancel notice
        row = await task_row(flow, g.task_id)
        assert (row["state"], row["cancel_reason"]) == ("RUNNING", REASON)
        assert row["cancel_requested_at"] is not None
    await drain(engine)  # the root continuation: both tasks are in flight
    assert (await flow.instance())["state"] == "STOPPING"
    assert {s["state"] for n, s in (await flow.steps()).items() if n in ("a", "b")} == {
        "RUNNING"}
    # a's success commits despite the cancel request; b's worker stops.
    await finish(db, tenant, [report(grants[0], "succeeded", result='"kept"')])
    await drain(engine)
    assert (await flow.instance())["state"] == "STOPPING"
    await finish(db, tenant, [report(grants[1], "cancelled", error={"type": "stopped"})])
    await drain(engine)
    ended = await flow.instance()
    assert (ended["state"], ended["stop_kind"]) == ("CANCELLED", "CANCEL")
    assert json.loads(ended["error"]) == {"error": "cancelled", "cause": REASON}
    assert ended["completed_at"] is not None
    steps = await flow.steps()
    assert (steps["a"]["state"], json.loads(steps["a"]["output"])) == ("SUCCEEDED", "kept")
    assert (steps["b"]["state"], steps["both"]["state"]) == ("CANCELLED", "CANCELLED")
    assert {"after", "x_done"}.isdisjoint(steps)  # nothing advanced after the stop
    assert await outcomes(flow) == {"w.a": "stopping", "w.b": "stopping"}
    assert await workflow_events(db, flow) == [
        "workflow.started", "workflow.advanced", "workflow.cancel_requested",
        "workflow.advanced", "workflow.advanced", "workflow.cancelled"]  # root, a, then b
    assert [t["step"] for t in await flow.tasks()] == ["a", "b"]
    audit = await read(db, "SELECT action, reason, resource_revision FROM orbit_audit_events"
                       " WHERE namespace_id = %s AND resource_id = %s"
                       " AND action = 'workflow.cancel'", tenant.namespace_id,
                       flow.instance_id)
    assert [(a["action"], a["reason"], a["resource_revision"]) for a in audit] == [
        ("workflow.cancel", REASON, 2)]
    # The receipt replays as it was; the stopped gate stays closed.
    replay = await cancel(flow, key="c-1")
    assert replay.status == 202
    assert json.loads(jsondoc.dumps(replay.body)) == json.loads(jsondoc.dumps(done.body))
    assert (await gate_of(flow))["state"] == "STOPPED"
    with pytest.raises(signals.InstanceFinished):
        await cancel(flow)
    await clean(flow)


async def test_cancel_ends_waiting_tasks_at_once_and_settles_in_the_next_round(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    await cancel(flow)
    for t in await flow.tasks():  # no worker held them: cancelled by the cancel itself
        row = await task_row(flow, t["id"])
        assert (row["state"], row["cancel_reason"]) == ("CANCELLED", REASON)
    assert (await flow.instance())["state"] == "STOPPING"
    await drain(engine)
    assert (await flow.instance())["state"] == "CANCELLED"
    assert await outcomes(flow) == {"w.a": "stopping", "w.b": "stopping"}
    await clean(flow)


@pytest.mark.parametrize("document", [NAP, SIGNALLED], ids=["timer", "signal"])
async def test_cancel_of_a_waiting_instance_settles_with_nothing_in_flight(
        db: Database, engine: Engine, document: dict[str, Any]) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, document)
    await drain(engine)
    (step,) = (await flow.steps()).keys() - {"$root"}
    assert len(await flow.waits(waiting=True)) == 1
    await cancel(flow)
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"stopping": 1}  # the root continuation settles it
    ended = await flow.instance()
    assert ended["state"] == "CANCELLED"
    assert (await flow.steps())[step]["state"] == "CANCELLED"
    assert [w["state"] for w in await flow.waits()] == ["CANCELLED"]
    assert {state for _, state in await advances(flow)} == {"DONE"}
    assert await flow.tasks() == []
    who = await principal(db, tenant.api_key)
    with pytest.raises(signals.InstanceFinished):
        await signals.send_signal(
            db, who, namespace=tenant.namespace,
            target=signals.Target(instance_id=flow.instance_id),
            signal=signals.SignalRequest.check(name="ok", correlation_key=None,
                                               payload_text="1", payload_version=1,
                                               evidence_ref=None, expires_in_ms=None,
                                               problems=[]))
    await clean(flow)


async def test_cancel_before_the_first_advance_starts_nothing(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await cancel(flow)
    await drain(engine)
    assert (await flow.instance())["state"] == "CANCELLED"
    assert await flow.tasks() == []
    assert (await flow.steps())["$root"]["state"] == "CANCELLED"
    await clean(flow)


async def test_cancel_of_a_paused_instance_records_its_parked_results_and_replays_nothing(
        db: Database, engine: Engine) -> None:
    """Paused with a's success parked: the cancel takes the instance out of the pause (the
    gate STOPPED, the RESUME row due); the engine consumes the parked result under the stop
    (recorded on a, never advanced), the RESUME row ends DONE, the count goes to zero; b is still
    in flight until its worker stops. Pause and resume are refused while it stops."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    grants = await running(flow)
    await control(flow, "pause")
    await finish(db, tenant, [report(grants[0], "succeeded", result='"parked"')])
    await drain(engine)
    assert (await flow.instance())["checkpoints"] == 1
    view = (await cancel(flow)).body
    assert (view["state"], view["paused"], view["control_revision"]) == ("STOPPING", False, 3)
    assert (await gate_of(flow))["state"] == "STOPPED"
    await clean(flow)
    await drain(engine)
    instance = await flow.instance()
    assert (instance["state"], instance["checkpoints"]) == ("STOPPING", 0)
    steps = await flow.steps()
    assert (steps["a"]["state"], steps["b"]["state"]) == ("SUCCEEDED", "RUNNING")
    assert "x_done" not in steps
    assert await outcomes(flow) == {"w.a": "stopping"}
    assert ("RESUME", "DONE") in await advances(flow)
    for verb in ("pause", "resume"):
        with pytest.raises(controls.InstanceStopping):
            await control(flow, verb)
    assert (await gate_of(flow))["state"] == "STOPPED"
    await finish(db, tenant, [report(grants[1], "cancelled", error={"type": "stopped"})])
    await drain(engine)
    assert (await flow.instance())["state"] == "CANCELLED"
    assert "after" not in await flow.steps()
    await clean(flow)


async def test_a_success_committed_before_the_cancel_stays_and_an_ended_instance_refuses(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, ONE)
    await drain(engine)
    (a,) = await flow.tasks()
    await flow.end(a["id"], "ok", {"paid": True})  # committed, not yet consumed
    await cancel(flow)
    assert (await task_row(flow, a["id"]))["state"] == "SUCCEEDED"
    await drain(engine)
    steps = await flow.steps()
    assert (steps["a"]["state"], json.loads(steps["a"]["output"])) == (
        "SUCCEEDED", {"paid": True})
    assert "done" not in steps
    assert (await flow.instance())["state"] == "CANCELLED"
    # An instance whose success committed: the cancel is refused and writes nothing.
    other = await begin(db, tenant, ONE)
    await drain(engine)
    (b,) = await other.tasks()
    await other.end(b["id"], "ok", {"paid": True})
    await drain(engine)
    before = await other.instance()
    assert before["state"] == "SUCCEEDED"
    with pytest.raises(signals.InstanceFinished):
        await cancel(other)
    assert await other.instance() == before
    await clean(flow)


async def test_cancel_is_idempotent_checked_and_a_repeat_changes_nothing(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    grants = await running(flow)
    with pytest.raises(errors.StaleRevision):
        await cancel(flow, control_revision=5)
    with pytest.raises(errors.ValidationFailed) as bad:
        await cancel(flow, reason="")
    assert bad.value.errors[0]["path"] == "$.reason"
    assert (await flow.instance())["state"] == "RUNNING"  # the refusals wrote nothing
    first = await cancel(flow, control_revision=1, key="k")
    assert first.status == 202
    with pytest.raises(errors.IdempotencyConflict):
        await cancel(flow, reason="another", key="k")
    again = await cancel(flow, reason="again")  # already stopping: unchanged, 200
    assert again.status == 200
    assert again.body["control_revision"] == first.body["control_revision"] == 2
    assert again.body["stop_requested_at"] == first.body["stop_requested_at"]
    assert len(await read(db, "SELECT id FROM orbit_audit_events WHERE namespace_id = %s"
                          " AND action = 'workflow.cancel'", tenant.namespace_id)) == 1
    who = await principal(db, tenant.api_key)
    with pytest.raises(errors.NotFound):
        await stops.cancel(db, who, namespace=tenant.namespace, instance_id="00" * 16,
                           reason="r")
    await finish(db, tenant, [report(g, "cancelled", error={"type": "stopped"})
                              for g in grants])
    await drain(engine)
    assert (await flow.instance())["state"] == "CANCELLED"
    await clean(flow)


async def test_a_cancel_of_an_instance_stopping_for_a_failure_keeps_the_failure(
        db: Database, engine: Engine) -> None:
    """b fails while a runs: the failure settlement is STOPPING (kind FAILURE); a user's
    cancel then records only cancel_requested_at (200); the instance ends FAILED with b's
    error once a's result arrives."""
    tenant = await make_tenant(db)
    document = json.loads(json.dumps(PAIR))
    document["steps"]["both"]["join"]["policy"] = "FAIL_FAST"
    flow = await begin(db, tenant, document)
    await drain(engine)
    grants = await running(flow)
    await finish(db, tenant, [report(grants[1], "failed", error={"type": "boom"})])
    await drain(engine)
    stopping = await flow.instance()
    assert (stopping["state"], stopping["stop_kind"]) == ("STOPPING", "FAILURE")
    noted = await cancel(flow)
    assert noted.status == 200
    assert noted.body["stop_kind"] == "FAILURE"
    assert noted.body["cancel_requested_at"] is not None
    assert noted.body["stop_requested_at"] == jsondoc.loads_strict(
        jsondoc.dumps(noted.body))["stop_requested_at"]
    assert noted.body["control_revision"] == 2
    repeat = await cancel(flow)
    assert (repeat.status, repeat.body["control_revision"]) == (200, 2)
    await finish(db, tenant, [report(grants[0], "succeeded", result="1")])
    await drain(engine)
    ended = await flow.instance()
    assert (ended["state"], ended["stop_kind"]) == ("FAILED", "FAILURE")
    assert json.loads(ended["error"])["step"] == "b"
    assert ended["stop_requested_at"] == stopping["stop_requested_at"]
    assert ended["cancel_requested_at"] is not None
    assert (await flow.steps())["a"]["state"] == "SUCCEEDED"
    await clean(flow)


async def test_a_held_step_does_not_hold_up_the_stop(db: Database, engine: Engine) -> None:
    """a's task ends NEEDS_REVIEW (the step waits for a person): it is not in flight, so a
    cancel settles the instance at once; the task keeps waiting for its review."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, ONE)
    await drain(engine)
    (a,) = await flow.tasks()
    await flow.end(a["id"], "review")
    await drain(engine)
    assert (await flow.steps())["a"]["state"] == "WAITING"
    await cancel(flow)
    await drain(engine)
    assert (await flow.instance())["state"] == "CANCELLED"
    assert (await flow.steps())["a"]["state"] == "CANCELLED"
    assert (await task_row(flow, a["id"]))["state"] == "NEEDS_REVIEW"
    await clean(flow)


async def test_the_stopping_gauge_counts_instances_waiting_for_in_flight_steps(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, ONE)
    await drain(engine)
    grants = await running(flow)
    before = (await gauges(db)).instances.get("STOPPING", 0)
    await cancel(flow)
    await drain(engine)
    assert (await gauges(db)).instances.get("STOPPING", 0) == before + 1
    await finish(db, tenant, [report(grants[0], "cancelled", error={"type": "stopped"})])
    await drain(engine)
    assert (await gauges(db)).instances.get("STOPPING", 0) == before
    await clean(flow)


async def damage(db: Database, sql: str, *params: Any) -> None:
    await db.transaction("test.stop.damage", lambda cur: cur.execute(sql, params))


async def test_the_invariant_checker_finds_stop_corruptions(
        db: Database, engine: Engine) -> None:
    """A stopping and a cancelled instance are clean; a reopened gate, an end that is not the
    intent's, a LIVE activation left on a stopped instance, a step created after the intent are
    each ``stop_intent`` (the paired columns are also a CHECK: the database refuses half an
    intent); another tenant stays clean."""
    tenant, bystander = await make_tenant(db), await make_tenant(db)
    stopping = await begin(db, tenant, PAIR)
    cancelled = await begin(db, tenant, ONE)
    other = await begin(db, bystander, ONE)
    await drain(engine)
    await running(stopping)
    await cancel(stopping)
    await cancel(cancelled)
    await cancel(other)
    await drain(engine)
    assert (await stopping.instance())["state"] == "STOPPING"
    assert (await cancelled.instance())["state"] == "CANCELLED"
    ns = tenant.namespace_id

    async def found(marker: str) -> list[str]:
        problems = await invariants.check_db(db, [ns])
        assert [p for p in problems if p.startswith("[stop_intent]") and marker in p], problems
        return problems

    assert await invariants.check_db(db, [ns]) == []
    gate_id = (await stopping.instance())["gate_id"]
    await damage(db, "UPDATE pulse_execution_gates SET state = 'OPEN' WHERE namespace_id = %s"
                     " AND id = %s", ns, gate_id)
    await found("gate is not STOPPED")
    await damage(db, "UPDATE pulse_execution_gates SET state = 'STOPPED' WHERE namespace_id = %s"
                     " AND id = %s", ns, gate_id)
    await damage(db, "UPDATE weave_instances SET stop_kind = 'FAILURE' WHERE namespace_id = %s"
                     " AND id = %s", ns, cancelled.instance_id)
    await found("ended otherwise")
    await damage(db, "UPDATE weave_instances SET stop_kind = 'CANCEL' WHERE namespace_id = %s"
                     " AND id = %s", ns, cancelled.instance_id)
    (a,) = await read(db, "SELECT a.id FROM weave_activations a JOIN weave_steps st"
                      " ON st.namespace_id = a.namespace_id AND st.id = a.step_id"
                      " WHERE a.namespace_id = %s AND a.instance_id = %s AND st.name = 'a'",
                      ns, cancelled.instance_id)
    await damage(db, "UPDATE weave_activations SET state = 'LIVE', live_step_id = step_id,"
                     " ended_at = NULL"
                     " WHERE namespace_id = %s AND id = %s", ns, a["id"])
    await found("keeps LIVE activations")
    await damage(db, "UPDATE weave_activations SET state = 'CANCELLED', live_step_id = NULL,"
                     " ended_at = UTC_TIMESTAMP(6)"
                     " WHERE namespace_id = %s AND id = %s", ns, a["id"])
    await damage(db, "UPDATE weave_steps st JOIN weave_instances i ON i.namespace_id ="
                     " st.namespace_id AND i.id = st.instance_id SET st.created_at ="
                     " i.stop_requested_at + INTERVAL 1 SECOND WHERE st.namespace_id = %s"
                     " AND st.instance_id = %s AND st.name = 'a'", ns, stopping.instance_id)
    await found("a step created after the stop intent")
    with pytest.raises(errors.IntegrityViolation):
        await damage(db, "UPDATE weave_instances SET stop_requested_at = NULL"
                         " WHERE namespace_id = %s AND id = %s", ns, stopping.instance_id)
    assert await invariants.check_db(db, [bystander.namespace_id]) == []


async def test_a_stopped_gate_grants_and_starts_nothing(db: Database, engine: Engine) -> None:
    """The kernel reads only OPEN as open: behind a STOPPED workflow gate a task is neither
    granted nor started (a cancel's own cancel intents end such tasks anyway; this pins the
    gate state every claim and start path reads)."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    offered = await claim(db, flow.session, flow.queue, 1)
    assert len(offered) == 1
    await damage(db, "UPDATE pulse_execution_gates g JOIN weave_instances i"
                     " ON i.namespace_id = g.namespace_id AND i.gate_id = g.id"
                     " SET g.state = 'STOPPED' WHERE i.namespace_id = %s AND i.id = %s",
                 tenant.namespace_id, flow.instance_id)
    assert await claim(db, flow.session, flow.queue) == []
    outcomes = await start(db, tenant, offered)
    assert [(o.approved, o.reason) for o in outcomes] == [(False, "workflow_paused")]


async def test_a_cancel_ends_a_step_held_by_hold_and_clears_its_hold(
        db: Database, engine: Engine) -> None:
    """a's task failed and ``$hold`` holds the step (docs/weave/recovery.md): nothing is in
    flight, so a cancel settles the instance; the held step ends CANCELLED without its hold
    marks (the step_hold and stop_intent invariants both hold)."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({"a": task("w.a", "done", on_failure="$hold"),
                                        "done": {"kind": "SUCCEED"}}, "a"))
    await drain(engine)
    (a,) = await flow.tasks()
    await flow.end(a["id"], "fail")
    await drain(engine)
    step = (await flow.steps())["a"]
    assert (step["state"], step["held_at"] is not None) == ("WAITING", True)
    await cancel(flow)
    await drain(engine)
    assert (await flow.instance())["state"] == "CANCELLED"
    step = (await flow.steps())["a"]
    assert (step["state"], step["held_at"], step["held_error"]) == ("CANCELLED", None, None)
    await clean(flow)

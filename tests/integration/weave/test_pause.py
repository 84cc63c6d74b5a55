"""Pause and resume of a workflow instance (orbit_common/weave/controls.py, the engine's parking
and replay; docs/weave/pause.md) against the real database: one transaction moves the flag,
the control revision, the gate, the RESUME checkpoint, the event and the audit record; while
paused, results are recorded and parked (never advanced, never lost), no new task is granted,
timers and poll rounds that come due are parked, signals wait; a resume replays every parked
checkpoint in order, exactly once. A database of its own: the engine's lease scans read every
namespace."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.model import jsondoc
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import leases
from orbit_common.weave import controls, signals
from orbit_common.weave.engine import Engine, gauges
from tests.conftest import make_tenant
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.engine_support import (
    Flow,
    begin,
    doc,
    drain,
    task,
)
from tests.integration.weave.support import principal
from tests.support import database, invariants
from tests.support.lease_fixtures import add_tasks, set_queue_limits, wait_db_time_past
from tests.support.waiting import statements_waiting, until

own_url, db = database.own_database("orbit_weave_pause")


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-pause", lease_ms=30_000, batch=64)


PAIR = doc({
    "both": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "after", "branches": [
        {"name": "x", "start": "a", "steps": {"a": task("w.a", "x_done"),
                                             "x_done": {"kind": "SUCCEED"}}},
        {"name": "y", "start": "b", "steps": {"b": task("w.b", "y_done"),
                                             "y_done": {"kind": "SUCCEED"}}}]},
    "after": task("w.c", "done"),
    "done": {"kind": "SUCCEED", "output": "steps.both.result"},
}, "both")

WAITS = doc({
    "nap": {"kind": "TIMER", "duration_ms": 200, "next": "after"},
    "after": task("w.a", "done"),
    "done": {"kind": "SUCCEED"},
}, "nap")

SIGNALLED = doc({
    "approve": {"kind": "SIGNAL", "signal": "ok", "next": "after"},
    "after": task("w.a", "done"),
    "done": {"kind": "SUCCEED", "output": "steps.approve.result.payload"},
}, "approve")


async def control(flow: Flow, verb: str, *, reason: str | None = "maintenance",
                  control_revision: int | None = None, key: str | None = None) -> Replay:
    who = await principal(flow.db, flow.tenant.api_key)
    return await controls.set_paused(
        flow.db, who, namespace=flow.tenant.namespace, instance_id=flow.instance_id.hex(),
        paused=verb == "pause", reason=reason,  # type: ignore[arg-type]
        control_revision=control_revision, idempotency_key=key)


async def read(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.pause.read", body)


async def gate(flow: Flow) -> dict[str, Any]:
    (row,) = await read(flow.db, "SELECT g.* FROM pulse_execution_gates g JOIN weave_instances i"
                        " ON i.namespace_id = g.namespace_id AND i.gate_id = g.id"
                        " WHERE i.namespace_id = %s AND i.id = %s",
                        flow.tenant.namespace_id, flow.instance_id)
    return row


async def resume_rows(flow: Flow) -> list[dict[str, Any]]:
    return await read(flow.db, "SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                      " AND instance_id = %s AND kind = 'RESUME'", flow.tenant.namespace_id,
                      flow.instance_id)


async def running(flow: Flow) -> list[Any]:
    """Claim and start every task of the instance waiting now (a worker holds them)."""
    grants = await claim(flow.db, flow.session, flow.queue)
    await start(flow.db, flow.tenant, grants)
    return grants


async def succeed(flow: Flow, grants: list[Any], result: Any = "ok") -> None:
    await finish(flow.db, flow.tenant, [report(g, "succeeded", result=json.dumps(result))
                                        for g in grants])


async def clean(flow: Flow) -> None:
    assert await invariants.check_db(flow.db, [flow.tenant.namespace_id]) == []


async def test_pause_parks_results_of_running_tasks_and_resume_advances_once_per_result(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    grants = await running(flow)
    assert len(grants) == 2
    paused = await control(flow, "pause", reason="investigate the payment provider")
    assert paused.status == 200
    assert paused.body["paused"] is True
    assert paused.body["control_revision"] == 2
    assert paused.body["state"] == "RUNNING"
    assert (await gate(flow))["state"] == "PAUSED"
    (resume,) = await resume_rows(flow)
    assert resume["state"] == "PENDING"
    assert resume["due_at"].year == 9999  # never due while paused

    # Running tasks finish: their results are recorded, parked, never advanced.
    await succeed(flow, grants, {"v": 1})
    revision = (await flow.instance())["revision"]
    before = await gauges(db)
    rounds = await drain(engine)
    after = await gauges(db)
    assert (after.paused, after.checkpoints) == (before.paused, before.checkpoints + 2)
    assert sum(r.outcomes.get("paused", 0) for r in rounds) == 2
    inbox = await flow.inbox()
    assert [(r["state"], r["outcome"]) for r in inbox] == [("CONSUMED", "paused")] * 2
    instance = await flow.instance()
    assert instance["revision"] == revision  # nothing advanced
    assert instance["checkpoints"] == 2
    assert {n: s["state"] for n, s in (await flow.steps()).items()
            if n in ("a", "b", "both")} == {"a": "RUNNING", "b": "RUNNING", "both": "RUNNING"}
    assert len(await flow.tasks()) == 2  # no new task
    await clean(flow)

    resumed = await control(flow, "resume", reason="provider is back")
    assert resumed.body["paused"] is False
    assert resumed.body["control_revision"] == 3
    assert (await gate(flow))["state"] == "OPEN"
    await drain(engine)
    inbox = await flow.inbox()
    assert [(r["state"], r["outcome"]) for r in inbox] == [("CONSUMED", "advanced")] * 2
    instance = await flow.instance()
    assert instance["checkpoints"] == 0
    (resume,) = await resume_rows(flow)
    assert resume["state"] == "DONE"
    steps = await flow.steps()
    assert steps["both"]["state"] == "SUCCEEDED"
    assert [t["step"] for t in await flow.tasks()] == ["a", "b", "after"]
    # Each result advanced its activation exactly once: one advance event per result.
    events = await read(db, "SELECT event_type, payload FROM orbit_events"
                        " WHERE namespace_id = %s AND aggregate_type = 'workflow_instance'"
                        " AND aggregate_id = %s ORDER BY aggregate_revision",
                        tenant.namespace_id, flow.instance_id)
    completed = [n for e in events for n in json.loads(e["payload"]).get("completed", [])]
    assert sorted(completed) == ["a", "b", "both"]
    (after,) = [t for t in await flow.tasks() if t["step"] == "after"]
    await flow.end(after["id"], "ok", "fine")
    await drain(engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(flow)


async def test_a_paused_instance_grants_no_new_task_and_resume_lets_it_run(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    await control(flow, "pause")
    assert await claim(db, flow.session, flow.queue) == []  # the gate holds both tasks back
    await control(flow, "resume")
    assert len(await running(flow)) == 2
    await clean(flow)


async def test_a_timer_due_while_paused_is_parked_and_fires_once_after_the_resume(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, WAITS)
    await drain(engine)
    await control(flow, "pause")
    (wait,) = await flow.waits(waiting=True)
    await wait_db_time_past(db, wait["deadline_at"])
    rounds = await drain(engine)
    assert sum(r.outcomes.get("paused", 0) for r in rounds) == 1
    (advance,) = await read(db, "SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                            " AND instance_id = %s AND kind = 'TIMER'", tenant.namespace_id,
                            flow.instance_id)
    assert advance["state"] == "PENDING"
    assert advance["due_at"].year == 9999
    assert advance["parked_due_at"] == wait["deadline_at"]
    assert (await flow.steps())["nap"]["state"] == "WAITING"
    assert (await flow.waits())[0]["state"] == "WAITING"  # not fired
    assert (await flow.instance())["checkpoints"] == 1
    await clean(flow)

    await control(flow, "resume")
    await drain(engine)
    (fired,) = await flow.waits()
    assert fired["state"] == "FIRED"
    assert fired["late_ms"] > 0
    (advance,) = await read(db, "SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                            " AND instance_id = %s AND kind = 'TIMER'", tenant.namespace_id,
                            flow.instance_id)
    assert advance["state"] == "DONE"
    assert advance["parked_due_at"] is None
    assert advance["due_at"] == wait["deadline_at"]
    assert [t["step"] for t in await flow.tasks()] == ["after"]
    await clean(flow)


async def test_a_signal_sent_while_paused_waits_and_wins_after_the_resume(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, SIGNALLED)
    await drain(engine)
    await control(flow, "pause")
    who = await principal(db, tenant.api_key)
    sent = await signals.send_signal(
        db, who, namespace=tenant.namespace,
        target=signals.Target(instance_id=flow.instance_id),
        signal=signals.SignalRequest.check(name="ok", correlation_key=None, payload_text="7",
                                           payload_version=1, evidence_ref=None,
                                           expires_in_ms=None, problems=[]))
    await drain(engine)
    (row,) = await read(db, "SELECT * FROM weave_signals WHERE namespace_id = %s AND id = %s",
                        tenant.namespace_id, bytes.fromhex(sent.body["id"]))
    assert row["state"] == "PENDING"
    assert row["available_at"].year == 9999
    assert (await flow.steps())["approve"]["state"] == "WAITING"
    await control(flow, "resume")
    await drain(engine)
    (row,) = await read(db, "SELECT * FROM weave_signals WHERE namespace_id = %s AND id = %s",
                        tenant.namespace_id, bytes.fromhex(sent.body["id"]))
    assert row["state"] == "CONSUMED"
    assert (await flow.steps())["approve"]["state"] == "SUCCEEDED"
    await clean(flow)


async def test_pause_and_resume_are_idempotent_audited_and_checked(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    first = await control(flow, "pause", key="k-1", reason="one")
    replay = await control(flow, "pause", key="k-1", reason="one")
    assert json.loads(jsondoc.dumps(replay.body)) == json.loads(jsondoc.dumps(first.body))
    with pytest.raises(errors.IdempotencyConflict):
        await control(flow, "pause", key="k-1", reason="another")
    again = await control(flow, "pause", reason="twice")  # already paused: unchanged
    assert again.body["control_revision"] == 2
    with pytest.raises(errors.StaleRevision):
        await control(flow, "resume", control_revision=1)
    with pytest.raises(errors.ValidationFailed) as bad:
        await control(flow, "resume", reason="")
    assert bad.value.errors[0]["path"] == "$.reason"
    with pytest.raises(errors.ValidationFailed):
        await control(flow, "resume", control_revision=0)
    assert (await flow.instance())["paused"] == 1  # the refusals changed nothing
    done = await control(flow, "resume", control_revision=2, reason="back")
    assert done.body["control_revision"] == 3
    audit = await read(db, "SELECT action, reason, resource_revision FROM orbit_audit_events"
                       " WHERE namespace_id = %s AND resource_id = %s AND action LIKE"
                       " 'workflow.%%d' ORDER BY occurred_at, id", tenant.namespace_id,
                       flow.instance_id)
    assert [(a["action"], a["reason"], a["resource_revision"]) for a in audit
            if a["action"] != "workflow.started"] == [("workflow.paused", "one", 2),
                                                      ("workflow.resumed", "back", 3)]
    events = await read(db, "SELECT event_type, aggregate_revision FROM orbit_events"
                        " WHERE namespace_id = %s AND aggregate_type = 'execution_gate'"
                        " ORDER BY aggregate_revision", tenant.namespace_id)
    assert [(e["event_type"], e["aggregate_revision"]) for e in events] == [
        ("workflow.paused", 2), ("workflow.resumed", 3)]
    # Nothing was parked: the resume closed the RESUME row itself.
    assert [r["state"] for r in await resume_rows(flow)] == ["DONE"]
    await clean(flow)


async def test_a_finished_or_unknown_instance_cannot_be_paused(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, doc({"done": {"kind": "SUCCEED"}}, "done"))
    await drain(engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    with pytest.raises(signals.InstanceFinished):
        await control(flow, "pause")
    who = await principal(db, tenant.api_key)
    with pytest.raises(errors.NotFound):
        await controls.set_paused(db, who, namespace=tenant.namespace,
                                  instance_id="00" * 16, paused=True, reason="r")
    with pytest.raises(errors.NotFound):
        await controls.set_paused(db, who, namespace=tenant.namespace,
                                  instance_id="not-hex", paused=True, reason="r")


async def test_a_refusal_during_the_replay_fails_the_instance_and_ends_its_checkpoints(
        db: Database, engine: Engine) -> None:
    """The replay creates a task the queue's unfinished-task limit refuses: the instance fails
    with task_rejected, its parked results are consumed as rejected, its RESUME row is DONE
    (a finished instance keeps no unfinished pending advance)."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    grants = await running(flow)
    await control(flow, "pause")
    await succeed(flow, grants)
    await drain(engine)
    assert (await flow.instance())["checkpoints"] == 2
    await add_tasks(db, tenant, flow.queue, 1)
    await set_queue_limits(db, tenant, flow.queue.id, max_unfinished_tasks=1)
    await control(flow, "resume")
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"rejected": 3}  # the RESUME row and both parked results
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    assert json.loads(instance["error"])["error"] == "task_rejected"
    assert instance["checkpoints"] == 0
    assert [r["outcome"] for r in await flow.inbox()] == ["rejected", "rejected"]
    assert [r["state"] for r in await resume_rows(flow)] == ["DONE"]
    await clean(flow)


async def damage(db: Database, sql: str, *params: Any) -> None:
    await db.transaction("test.pause.damage", lambda cur: cur.execute(sql, params))


async def test_the_invariant_checker_finds_pause_corruptions(
        db: Database, engine: Engine) -> None:
    """A paused instance with parked results is clean; an open gate, a lost RESUME row, a
    wrong checkpoint count, a resumed instance whose RESUME row is not due are each
    ``pause_control``; another tenant stays clean."""
    tenant, bystander = await make_tenant(db), await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    other = await begin(db, bystander, PAIR)
    await drain(engine)
    await control(other, "pause")
    grants = await running(flow)
    await control(flow, "pause")
    await succeed(flow, grants)
    await drain(engine)
    ns, iid = tenant.namespace_id, flow.instance_id

    async def found() -> list[str]:
        return await invariants.check_db(db, [ns])

    assert await found() == []
    gate_id = (await flow.instance())["gate_id"]
    await damage(db, "UPDATE pulse_execution_gates SET state = 'OPEN' WHERE namespace_id = %s"
                     " AND id = %s", ns, gate_id)
    (problem,) = await found()
    assert problem.startswith("[pause_control]"), problem
    assert "gate" in problem, problem
    await damage(db, "UPDATE pulse_execution_gates SET state = 'PAUSED' WHERE namespace_id = %s"
                     " AND id = %s", ns, gate_id)
    await damage(db, "UPDATE weave_instances SET checkpoints = 1 WHERE namespace_id = %s"
                     " AND id = %s", ns, iid)
    (problem,) = await found()
    assert "1 counted, 2 parked" in problem, problem
    await damage(db, "UPDATE weave_instances SET checkpoints = 2 WHERE namespace_id = %s"
                     " AND id = %s", ns, iid)
    await damage(db, "UPDATE weave_pending_advances SET state = 'DONE',"
                     " done_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND instance_id = %s"
                     " AND kind = 'RESUME'", ns, iid)
    (problem,) = await found()
    assert "without its PENDING RESUME row" in problem, problem
    # Resumed (flag and gate), the RESUME row still DONE: nothing would replay the two.
    await damage(db, "UPDATE weave_instances SET paused = 0 WHERE namespace_id = %s"
                     " AND id = %s", ns, iid)
    await damage(db, "UPDATE pulse_execution_gates SET state = 'OPEN' WHERE namespace_id = %s"
                     " AND id = %s", ns, gate_id)
    (problem,) = await found()
    assert "no RESUME row due" in problem, problem
    assert await invariants.check_db(db, [bystander.namespace_id]) == []


POLLED = doc({
    "check": {"kind": "POLL", "queue": "Q", "handler": "w.a", "until": "round.result.done",
              "interval_ms": 100, "max_rounds": 3, "next": "done",
              "result_schema": {"type": "object", "properties": {"done": {"type": "boolean"}},
                                "required": ["done"]}},
    "done": {"kind": "SUCCEED"},
}, "check")


async def poll_state(flow: Flow) -> dict[str, Any]:
    (row,) = await read(flow.db, "SELECT * FROM weave_poll_states WHERE namespace_id = %s"
                        " AND instance_id = %s", flow.tenant.namespace_id, flow.instance_id)
    return row


async def test_a_poll_round_due_while_paused_is_parked_and_starts_once_after_the_resume(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, POLLED)
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {"done": False})
    await drain(engine)
    waiting = await poll_state(flow)
    assert (waiting["state"], waiting["used_rounds"]) == ("WAITING", 1)
    await control(flow, "pause")
    await wait_db_time_past(db, waiting["next_round_at"])
    rounds = await drain(engine)
    assert sum(r.outcomes.get("paused", 0) for r in rounds) == 1
    parked = await poll_state(flow)
    assert (parked["state"], parked["used_rounds"]) == ("WAITING", 1)  # no round counted
    assert len(await flow.tasks()) == 1
    await control(flow, "resume")
    await drain(engine)
    resumed = await poll_state(flow)
    assert (resumed["state"], resumed["used_rounds"]) == ("ROUND", 2)  # the budget carried on
    assert len(await flow.tasks()) == 2
    await clean(flow)


async def test_an_instance_paused_before_its_first_advance_starts_after_the_resume(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await control(flow, "pause")
    await drain(engine)
    assert await flow.tasks() == []
    assert (await flow.steps()).keys() == {"$root"}
    assert (await flow.instance())["checkpoints"] == 1  # the ROOT continuation, parked
    await clean(flow)
    await control(flow, "resume")
    await drain(engine)
    assert [t["step"] for t in await flow.tasks()] == ["a", "b"]
    await clean(flow)


async def test_a_pause_waits_for_a_claim_in_flight_and_then_no_start_is_approved(
        db: Database, own_url: DatabaseUrl, engine: Engine) -> None:
    """The pause's gate lock serialises with the kernel's claim (a shared lock on the gate):
    a claim in flight when the pause comes finishes first; the start of what it granted comes
    after the pause and is refused (``workflow_paused``); the tasks wait again."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, PAIR)
    await drain(engine)
    holding, release = asyncio.Event(), asyncio.Event()

    async def claiming(cur: Any) -> list[Any]:
        grants = await leases.claim(cur, flow.session, flow.queue, 32)
        holding.set()
        await release.wait()
        return grants

    claimed = asyncio.create_task(db.transaction("test.claim", claiming))
    await holding.wait()
    pausing = asyncio.create_task(control(flow, "pause"))
    conn = connect_sync(own_url, autocommit=True)
    try:
        await until(lambda: statements_waiting(
            conn, "SELECT state, control_revision FROM pulse_execution_gates%FOR UPDATE"),
            timeout=10, message="the pause to wait for the claim's gate lock")
    finally:
        conn.close()
        release.set()
    grants = await claimed
    await pausing
    assert len(grants) == 2  # the claim came first
    outcomes = await start(db, tenant, grants)
    assert [(o.approved, o.reason) for o in outcomes] == [(False, "workflow_paused")] * 2
    await clean(flow)

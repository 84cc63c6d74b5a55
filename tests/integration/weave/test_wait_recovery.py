"""Re-arm a held SIGNAL wait and continue a held POLL step (orbit_common/weave/wait_recovery.py;
docs/weave/recovery.md § 重新等待, § 继续有界查询) against the real database and the engine: the
first deadline kept, a signal sent after the re-arm (or kept while held) wins, a continued
query never exceeds a round's original attempt budget, the interval restored, refusals that
write nothing, replays that return the original receipt, and the invariant checker clean."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.platform.idempotency import Replay
from orbit_common.weave import controls, recovery, wait_recovery
from orbit_common.weave.engine import Engine
from tests.conftest import make_tenant
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.engine_support import Flow, begin, doc, drain, task
from tests.integration.weave.support import principal
from tests.integration.weave.test_polls import answer, next_round, poll, state
from tests.integration.weave.test_signals import send
from tests.support import database, invariants
from tests.support.lease_fixtures import wait_db_time_past
from tests.support.waiting import until

own_url, db = database.own_database("orbit_weave_wait_recovery")


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-wait-recovery", lease_ms=30_000, batch=8)


SIGNALLED = doc({
    "approve": {"kind": "SIGNAL", "signal": "approval", "correlation": "input.order",
                "timeout_ms": 300, "on_timeout": "$hold", "next": "after"},
    "after": task("w.a", "done"),
    "done": {"kind": "SUCCEED", "output": "steps.approve.result.payload"}},
    "approve", input_schema={"type": "object", "properties": {"order": {"type": "string"}},
                             "required": ["order"]})


async def read(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.wait_recovery.read", body)


async def of_instance(flow: Flow, table: str, order: str = "") -> list[dict[str, Any]]:
    return await read(flow.db, f"SELECT * FROM {table} WHERE namespace_id = %s"
                      f" AND instance_id = %s{order}", flow.tenant.namespace_id,
                      flow.instance_id)


async def clean(flow: Flow) -> None:
    assert await invariants.check_db(flow.db, [flow.tenant.namespace_id]) == []


async def step_row(flow: Flow, name: str) -> dict[str, Any]:
    return (await flow.steps())[name]


async def rearm(flow: Flow, step: str = "approve", *, revision: int | None = None,
                timeout_ms: int = 60_000, reason: str = "customer called back",
                key: str | None = None, fresh: bool = True) -> Replay:
    who = await principal(flow.db, flow.tenant.api_key)
    if revision is None:
        revision = (await step_row(flow, step))["revision"]
    done = await wait_recovery.rearm_wait(
        flow.db, who, namespace=flow.tenant.namespace, instance_id=flow.instance_id.hex(),
        step=step, reason=reason, step_revision=revision, timeout_ms=timeout_ms,
        idempotency_key=key)
    assert done.fresh == fresh  # committed by this call, or the replay of an earlier one
    return done.replay


async def proceed(flow: Flow, step: str = "check", *, rounds: int = 1,
                  deadline_ms: int | None = None, revision: int | None = None,
                  key: str | None = None, fresh: bool = True) -> Replay:
    who = await principal(flow.db, flow.tenant.api_key)
    if revision is None:
        revision = (await step_row(flow, step))["revision"]
    done = await wait_recovery.continue_poll(
        flow.db, who, namespace=flow.tenant.namespace, instance_id=flow.instance_id.hex(),
        step=step, reason="the bank's settlement job was down", step_revision=revision,
        rounds=rounds, deadline_ms=deadline_ms, idempotency_key=key)
    assert done.fresh == fresh
    return done.replay


async def held_signal(db: Database, engine: Engine) -> Flow:
    """An instance whose ``approve`` step is held after its wait timed out."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, SIGNALLED, {"order": "o-1"})
    await drain(engine)
    (wait,) = await of_instance(flow, "weave_waits")
    await wait_db_time_past(db, wait["deadline_at"])
    await drain(engine)
    step = await step_row(flow, "approve")
    assert (step["state"], json.loads(step["held_error"])["error"]) == ("WAITING",
                                                                        "signal_timeout")
    return flow


async def activations_of(flow: Flow, name: str) -> list[dict[str, Any]]:
    step_id = (await step_row(flow, name))["id"]
    return [a for a in await of_instance(flow, "weave_activations", " ORDER BY sequence")
            if a["step_id"] == step_id]


async def signal_advance(flow: Flow) -> dict[str, Any]:
    (row,) = await read(flow.db, "SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                        " AND instance_id = %s AND kind = 'SIGNAL'", flow.tenant.namespace_id,
                        flow.instance_id)
    return row


async def finish_instance(flow: Flow, engine: Engine) -> None:
    """End the one waiting task ``after`` and let the instance succeed."""
    (after,) = [t for t in await flow.tasks() if t["step"] == "after"]
    await flow.end(after["id"], "ok", {})
    await drain(engine)


# --- re-arm -------------------------------------------------------------------------------------


async def test_rearm_keeps_the_first_deadline_and_a_signal_sent_after_it_wins(
        db: Database, engine: Engine) -> None:
    flow = await held_signal(db, engine)
    (first,) = await of_instance(flow, "weave_waits")
    before = await step_row(flow, "approve")
    receipt = await rearm(flow, timeout_ms=60_000)
    assert receipt.status == 201
    view = receipt.body
    assert (view["name"], view["state"], view["held_at"], view["held_error"]) == (
        "approve", "WAITING", None, None)
    assert view["revision"] == before["revision"] + 1
    assert [(a["sequence"], a["state"]) for a in view["activations"]] == [
        (1, "SUPERSEDED"), (2, "LIVE")]
    old, new = sorted(await of_instance(flow, "weave_waits"), key=lambda w: w["generation"])
    assert (old["state"], old["id"]) == ("TIMED_OUT", first["id"])  # kept as it was
    assert (new["state"], new["generation"], new["kind"]) == ("WAITING", 2, "SIGNAL")
    assert new["first_deadline_at"] == first["first_deadline_at"]  # never moved
    assert new["deadline_at"] == new["created_at"] + dt.timedelta(milliseconds=60_000)
    assert (new["signal_name"], new["correlation_key"]) == ("approval", b"o-1")
    assert [w["generation"] for w in view["waits"]] == [1, 2]
    armed = await signal_advance(flow)
    assert (armed["state"], armed["activation_id"]) == ("PENDING", new["activation_id"])
    assert armed["due_at"] <= new["created_at"]  # due at once: a pending signal would win
    await drain(engine)
    armed = await signal_advance(flow)  # nothing pending: the row waits for the new deadline
    assert (armed["state"], armed["due_at"]) == ("PENDING", new["deadline_at"])
    await clean(flow)
    sent = await send(flow, payload={"approved": True})
    await drain(engine)
    step = await step_row(flow, "approve")
    assert (step["state"], json.loads(step["output"])["signal_id"]) == ("SUCCEEDED", sent["id"])
    (won,) = await read(db, "SELECT * FROM weave_waits WHERE namespace_id = %s AND id = %s",
                        flow.tenant.namespace_id, new["id"])
    assert (won["state"], won["winner_signal_id"].hex()) == ("SIGNALLED", sent["id"])
    await finish_instance(flow, engine)
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == ("SUCCEEDED",
                                                                   {"approved": True})
    # One event on the step (naming the instance) and one audit record.
    (event,) = await read(db, "SELECT * FROM orbit_events WHERE namespace_id = %s"
                          " AND aggregate_type = 'workflow_step' AND aggregate_id = %s",
                          flow.tenant.namespace_id, before["id"])
    payload = json.loads(event["payload"])
    assert (event["event_type"], event["aggregate_revision"]) == ("workflow.step.rearmed",
                                                                  before["revision"] + 1)
    assert (payload["workflow_id"], payload["generation"], payload["activation_sequence"]) == (
        flow.instance_id.hex(), 2, 2)
    (audit,) = await read(db, "SELECT * FROM orbit_audit_events WHERE namespace_id = %s"
                          " AND action = 'workflow.step.rearm'", flow.tenant.namespace_id)
    assert (audit["reason"], audit["resource_id"]) == ("customer called back", before["id"])
    assert json.loads(audit["before_doc"])["held_error"]["error"] == "signal_timeout"
    await clean(flow)


async def test_a_signal_sent_while_the_step_is_held_waits_and_wins_on_rearm(
        db: Database, engine: Engine) -> None:
    flow = await held_signal(db, engine)
    sent = await send(flow, payload={"approved": "late"})
    await drain(engine)
    (kept,) = await of_instance(flow, "weave_signals")
    assert (kept["state"], kept["disposition"]) == ("PENDING", None)  # not wait_closed
    assert (await step_row(flow, "approve"))["state"] == "WAITING"
    await rearm(flow)
    await drain(engine)  # the re-armed row comes at once and takes the pending signal
    step = await step_row(flow, "approve")
    assert (step["state"], json.loads(step["output"])["signal_id"]) == ("SUCCEEDED", sent["id"])
    (taken,) = await of_instance(flow, "weave_signals")
    assert (taken["state"], taken["disposition"], taken["target_activation_sequence"]) == (
        "CONSUMED", "consumed", 2)
    assert (await signal_advance(flow))["state"] == "DONE"
    await finish_instance(flow, engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(flow)


async def test_a_pending_signal_wins_a_rearmed_wait_whose_new_timeout_already_passed(
        db: Database, engine: Engine) -> None:
    """The re-armed row is the wait's entry: the signal kept while the step was held wins even
    when the engine comes only after the new (tiny) timeout."""
    flow = await held_signal(db, engine)
    sent = await send(flow)
    await drain(engine)
    await rearm(flow, timeout_ms=1)
    new = max(await of_instance(flow, "weave_waits"), key=lambda w: w["generation"])
    await wait_db_time_past(db, new["deadline_at"])
    await drain(engine)
    step = await step_row(flow, "approve")
    assert (step["state"], json.loads(step["output"])["signal_id"]) == ("SUCCEEDED", sent["id"])
    await clean(flow)


async def test_a_rearmed_wait_that_times_out_again_holds_and_keeps_its_first_deadline(
        db: Database, engine: Engine) -> None:
    flow = await held_signal(db, engine)
    (first,) = await of_instance(flow, "weave_waits")
    await rearm(flow, timeout_ms=200)
    second = max(await of_instance(flow, "weave_waits"), key=lambda w: w["generation"])
    await drain(engine)
    await wait_db_time_past(db, second["deadline_at"])
    await drain(engine)
    step = await step_row(flow, "approve")
    assert (step["state"], json.loads(step["held_error"])["error"]) == ("WAITING",
                                                                        "signal_timeout")
    await rearm(flow, timeout_ms=200)
    waits = sorted(await of_instance(flow, "weave_waits"), key=lambda w: w["generation"])
    assert [(w["generation"], w["state"]) for w in waits] == [
        (1, "TIMED_OUT"), (2, "TIMED_OUT"), (3, "WAITING")]
    assert {w["first_deadline_at"] for w in waits} == {first["first_deadline_at"]}
    activations = await activations_of(flow, "approve")
    assert [(a["sequence"], a["state"]) for a in activations] == [
        (1, "SUPERSEDED"), (2, "SUPERSEDED"), (3, "LIVE")]
    await clean(flow)


async def test_a_rearm_while_paused_parks_its_row_and_the_resume_replays_it(
        db: Database, engine: Engine) -> None:
    """A paused instance may be re-armed: the row due now is parked like any checkpoint, the
    signal waits, and after the resume the replay lets the pending signal win, once."""
    flow = await held_signal(db, engine)
    who = await principal(db, flow.tenant.api_key)

    async def control(paused: bool) -> None:
        await controls.set_paused(db, who, namespace=flow.tenant.namespace,
                                  instance_id=flow.instance_id.hex(), paused=paused,
                                  reason="maintenance")

    await control(True)
    await rearm(flow)
    sent = await send(flow)
    await drain(engine)
    parked = await signal_advance(flow)
    assert (parked["state"], parked["parked_due_at"] is not None) == ("PENDING", True)
    assert (await step_row(flow, "approve"))["state"] == "WAITING"
    assert (await flow.instance())["checkpoints"] == 1
    await control(False)
    await drain(engine)
    step = await step_row(flow, "approve")
    assert (step["state"], json.loads(step["output"])["signal_id"]) == ("SUCCEEDED", sent["id"])
    assert (await flow.instance())["checkpoints"] == 0
    await finish_instance(flow, engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(flow)


async def test_rearm_refusals_write_nothing(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "nap": {"kind": "TIMER", "duration_ms": 60_000, "next": "approve"},
        "approve": {"kind": "SIGNAL", "signal": "approval", "timeout_ms": 60_000,
                    "on_timeout": "$hold", "next": "done"},
        "done": {"kind": "SUCCEED"}}, "nap")
    flow = await begin(db, tenant, document)
    await drain(engine)
    snapshot = await of_instance(flow, "weave_activations")
    with pytest.raises(wait_recovery.WaitNotRearmable, match="TIMER step"):
        await rearm(flow, "nap")
    with pytest.raises(errors.NotFound) as missing:
        await rearm(flow, "nowhere", revision=1)
    assert missing.value.code == "workflow_step_not_found"
    with pytest.raises(errors.ValidationFailed):
        await rearm(flow, "nap", timeout_ms=0)
    # A SIGNAL step still waiting (not timed out) is not re-armable; a TASK step never is.
    held = await held_signal(db, engine)
    with pytest.raises(errors.StaleRevision):
        await rearm(held, revision=1)
    with pytest.raises(errors.NotFound):  # $root is no step a person recovers
        await rearm(held, "$root", revision=1)
    await rearm(held)
    with pytest.raises(wait_recovery.WaitNotRearmable, match="not held"):
        await rearm(held)  # WAITING on its new wait: not held any more
    assert await of_instance(flow, "weave_activations") == snapshot
    await clean(flow)
    await clean(held)


async def test_a_step_with_a_recorded_conclusion_is_neither_rearmed_nor_continued(
        db: Database, engine: Engine) -> None:
    """Resolve records the step's conclusion and the engine advances it with that: until it
    does, the step is still held, but no other recovery may take it elsewhere."""
    flow = await held_signal(db, engine)
    who = await principal(db, flow.tenant.api_key)
    request = recovery.ResolveRequest.check(
        reason="approved by phone", evidence_ref="call-7",
        step_revision=(await step_row(flow, "approve"))["revision"], conclusion="failed",
        error="no_approval")
    await recovery.resolve_step(db, who, namespace=flow.tenant.namespace,
                                instance_id=flow.instance_id.hex(), step="approve",
                                request=request)
    with pytest.raises(wait_recovery.WaitNotRearmable, match="recorded conclusion"):
        await rearm(flow)
    tenant = await make_tenant(db)
    polled = await begin(db, tenant, poll_doc(max_rounds=1, on_exhausted="$hold"))
    await drain(engine)
    await answer(polled, engine, "ok", {"done": False})
    request = recovery.ResolveRequest.check(
        reason="settled by hand", evidence_ref="bank-1",
        step_revision=(await step_row(polled, "check"))["revision"], conclusion="failed",
        error="unsettled")
    await recovery.resolve_step(db, await principal(db, tenant.api_key),
                                namespace=tenant.namespace,
                                instance_id=polled.instance_id.hex(), step="check",
                                request=request)
    with pytest.raises(wait_recovery.PollNotContinuable, match="recorded conclusion"):
        await proceed(polled)
    await clean(flow)
    await clean(polled)


async def test_rearm_of_an_instance_that_is_not_running(db: Database, engine: Engine) -> None:
    flow = await held_signal(db, engine)
    async def body(cur: Any) -> None:
        # A stopping instance carries its stop intent (ck_weave_instances_stop).
        await cur.execute("UPDATE weave_instances SET state = 'STOPPING', stop_kind = 'CANCEL',"
                          " stop_requested_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s"
                          " AND id = %s", (flow.tenant.namespace_id, flow.instance_id))
    await db.transaction("test.stopping", body)
    with pytest.raises(recovery.InstanceNotRunning):
        await rearm(flow)
    assert len(await of_instance(flow, "weave_waits")) == 1


async def test_a_rearm_replayed_with_its_key_returns_the_original_receipt(
        db: Database, engine: Engine) -> None:
    flow = await held_signal(db, engine)
    revision = (await step_row(flow, "approve"))["revision"]
    first = await rearm(flow, revision=revision, key="rearm-1")
    again = await rearm(flow, revision=revision, key="rearm-1", fresh=False)
    assert (again.status, again.body) == (first.status, first.body)
    assert len(await activations_of(flow, "approve")) == 2
    with pytest.raises(errors.IdempotencyConflict):
        await rearm(flow, revision=revision, key="rearm-1", timeout_ms=5_000)
    await clean(flow)


# --- continue -----------------------------------------------------------------------------------


def poll_doc(**extra: Any) -> dict[str, Any]:
    return doc({"check": poll(**extra),
                "done": {"kind": "SUCCEED", "output": "steps.check.result"}}, "check")


async def tasks_of_round(flow: Flow, number: int) -> list[dict[str, Any]]:
    return await read(flow.db, "SELECT t.* FROM weave_poll_rounds r JOIN pulse_tasks t"
                      " ON t.namespace_id = r.namespace_id AND t.id = r.task_id"
                      " WHERE r.namespace_id = %s AND r.instance_id = %s AND r.round = %s"
                      " ORDER BY t.created_at, t.id", flow.tenant.namespace_id,
                      flow.instance_id, number)


async def attempt(flow: Flow, task_id: bytes, *, retryable: bool) -> None:
    """Claim (when the task is due), start and fail ``task_id`` once."""
    grants: list[Any] = []

    async def claimed() -> bool:
        grants.extend(await claim(flow.db, flow.session, flow.queue))
        return any(g.task_id == task_id for g in grants)

    await until(claimed, timeout=10, interval=0.02, message="the task's next attempt")
    await start(flow.db, flow.tenant, grants)
    (grant,) = [g for g in grants if g.task_id == task_id]
    await finish(flow.db, flow.tenant, [report(grant, "failed", retryable=retryable,
                                               error={"type": "down", "message": "503"})])


async def test_continue_after_exhaustion_grants_rounds_and_restores_the_interval(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(max_rounds=2, on_exhausted="$hold", interval_ms=100,
                                            backoff={"multiplier": 2, "max_interval_ms": 10_000}))
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    await next_round(flow, engine)
    await answer(flow, engine, "ok", {"done": False})
    exhausted = await state(flow)
    assert (exhausted["state"], exhausted["next_interval_ms"]) == ("EXHAUSTED", 200)
    receipt = await proceed(flow, rounds=2)
    view = receipt.body
    assert [(a["sequence"], a["state"]) for a in view["activations"]] == [
        (1, "SUPERSEDED"), (2, "LIVE")]
    assert view["poll"]["granted_rounds"] == 2
    query = await state(flow)
    assert (query["state"], query["used_rounds"], query["max_rounds"], query["granted_rounds"],
            query["first_round"], query["first_round_attempts_used"]) == (
        "WAITING", 2, 2, 2, 3, 0)
    # The interval is the stored one (the backoff's position), not reset to interval_ms.
    assert query["next_interval_ms"] == 200
    assert query["next_round_at"] == query["updated_at"] + dt.timedelta(milliseconds=200)
    assert (query["deadline_at"], query["continued_deadline_at"]) == (None, None)
    await next_round(flow, engine)
    await answer(flow, engine, "ok", {"done": False})
    await next_round(flow, engine)
    await answer(flow, engine, "ok", {"done": True, "i": 4})
    rounds = await of_instance(flow, "weave_poll_rounds", " ORDER BY round")
    live = view["activations"][1]["id"]
    assert [(r["round"], r["activation_id"].hex() == live) for r in rounds] == [
        (1, False), (2, False), (3, True), (4, True)]
    made = await flow.tasks()
    assert [t["sequence"] for t in made] == [1, 2, 3, 4]
    instance = await flow.instance()
    assert (instance["state"], json.loads(instance["output"])) == ("SUCCEEDED",
                                                                   {"done": True, "i": 4})
    await clean(flow)


async def test_a_continued_round_never_exceeds_its_original_attempt_budget(
        db: Database, engine: Engine) -> None:
    """Issue 16 "Must hold": the round cut short by its failed task continues with only the
    attempts it has left; once they are spent, a continue starts a new round with the
    original per-round budget."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(on_failure="$hold", retry={
        "max_attempts": 3, "initial_ms": 0, "max_ms": 0}))
    await drain(engine)
    (original,) = await flow.tasks()
    assert original["id"] == (await tasks_of_round(flow, 1))[0]["id"]
    await attempt(flow, original["id"], retryable=True)
    await attempt(flow, original["id"], retryable=False)  # FAILED after 2 of its 3 attempts
    await drain(engine)
    assert json.loads((await step_row(flow, "check"))["held_error"])["error"] == "task_failed"
    receipt = await proceed(flow, rounds=1)
    assert receipt.body["state"] == "RUNNING"
    query = await state(flow)
    assert (query["state"], query["used_rounds"], query["first_round"],
            query["first_round_attempts_used"]) == ("ROUND", 1, 1, 2)
    first, second = await tasks_of_round(flow, 1)
    assert (first["max_attempts"], first["starts_used"]) == (3, 2)
    assert (second["max_attempts"], second["retry_of"], second["state"]) == (
        1, first["id"], "WAITING")  # only the round's remaining attempt
    assert (second["owner_kind"], second["owner_id"]) == ("WORKFLOW", flow.instance_id)
    assert second["deadline_at"] == first["deadline_at"]
    await attempt(flow, second["id"], retryable=True)  # its budget is spent: FAILED at once
    await drain(engine)
    spent = await tasks_of_round(flow, 1)
    assert [t["state"] for t in spent] == ["FAILED", "FAILED"]
    assert sum(t["starts_used"] for t in spent) == 3  # never more than the round's budget
    # The round has nothing left: a continue starts round 2 with the original budget.
    await proceed(flow, rounds=1)
    query = await state(flow)
    assert (query["state"], query["first_round"], query["first_round_attempts_used"]) == (
        "WAITING", 2, 0)
    await next_round(flow, engine)
    (fresh,) = await tasks_of_round(flow, 2)
    assert (fresh["max_attempts"], fresh["retry_of"]) == (3, None)
    await answer(flow, engine, "ok", {"done": True})
    assert (await flow.instance())["state"] == "SUCCEEDED"
    assert [t["sequence"] for t in await flow.tasks()] == [1, 2, 3]
    await clean(flow)


async def test_a_cut_short_round_whose_request_deadline_passed_is_not_continued(
        db: Database, engine: Engine) -> None:
    """The round's request deadline (its first task's creation + the step's deadline_ms) is
    absolute: once it passed, a continue starts a new round, though attempts were left."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(on_failure="$hold", deadline_ms=300, retry={
        "max_attempts": 3}))
    await drain(engine)
    (original,) = await flow.tasks()
    await attempt(flow, original["id"], retryable=False)  # 1 of 3 attempts used
    await drain(engine)
    (first,) = await tasks_of_round(flow, 1)
    await wait_db_time_past(db, first["created_at"] + dt.timedelta(milliseconds=300))
    receipt = await proceed(flow)
    assert receipt.body["state"] == "WAITING"  # a new round, not round 1 again
    query = await state(flow)
    assert (query["state"], query["first_round"], query["first_round_attempts_used"]) == (
        "WAITING", 2, 0)
    assert len(await tasks_of_round(flow, 1)) == 1
    await next_round(flow, engine)
    (fresh,) = await tasks_of_round(flow, 2)
    assert (fresh["max_attempts"], fresh["retry_of"]) == (3, None)
    await clean(flow)


async def test_a_poll_continued_while_paused_waits_for_the_resume(
        db: Database, engine: Engine) -> None:
    """The continued round's task is behind the instance's gate: no grant while paused; after
    the resume it runs and the query goes on."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(on_failure="$hold", retry={"max_attempts": 2}))
    await drain(engine)
    (original,) = await flow.tasks()
    await attempt(flow, original["id"], retryable=False)
    await drain(engine)
    who = await principal(db, tenant.api_key)

    async def control(paused: bool) -> None:
        await controls.set_paused(db, who, namespace=tenant.namespace,
                                  instance_id=flow.instance_id.hex(), paused=paused,
                                  reason="maintenance")

    await control(True)
    await proceed(flow)
    (_, continued) = await tasks_of_round(flow, 1)
    assert continued["max_attempts"] == 1
    assert await claim(db, flow.session, flow.queue) == []  # the gate holds it back
    await control(False)
    await answer(flow, engine, "ok", {"done": True})
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(flow)


async def test_continue_after_the_query_deadline_needs_a_new_deadline(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(max_rounds=100, query_deadline_ms=300,
                                            interval_ms=400, on_exhausted="$hold"))
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    query = await state(flow)
    assert query["state"] == "EXHAUSTED"
    before = await step_row(flow, "check")
    with pytest.raises(wait_recovery.PollNotContinuable, match="deadline_ms"):
        await proceed(flow, rounds=5)
    assert await step_row(flow, "check") == before  # nothing written
    await proceed(flow, rounds=5, deadline_ms=60_000)
    continued = await state(flow)
    assert continued["deadline_at"] == query["deadline_at"]  # the first one never moves
    assert continued["continued_deadline_at"] == continued["updated_at"] + dt.timedelta(
        milliseconds=60_000)
    await next_round(flow, engine)
    (second,) = await tasks_of_round(flow, 2)
    assert as_utc(second["deadline_at"]) <= as_utc(continued["continued_deadline_at"])
    await answer(flow, engine, "ok", {"done": True})
    assert (await flow.instance())["state"] == "SUCCEEDED"
    await clean(flow)


async def test_continue_refusals_write_nothing(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(on_failure="$hold", result_schema={
        "type": "object", "properties": {"done": {"type": "boolean"}}, "required": ["done"]}))
    await drain(engine)
    with pytest.raises(wait_recovery.PollNotContinuable, match="not held"):
        await proceed(flow)  # RUNNING its first round
    with pytest.raises(errors.NotFound):
        await proceed(flow, "$root", revision=1)
    with pytest.raises(wait_recovery.WaitNotRearmable, match="POLL step"):
        await rearm(flow, "check")
    await answer(flow, engine, "ok", {"done": "yes"})  # the wrong shape: held, not continuable
    step = await step_row(flow, "check")
    assert json.loads(step["held_error"])["error"] == "result_shape_mismatch"
    with pytest.raises(wait_recovery.PollNotContinuable, match="result_shape_mismatch"):
        await proceed(flow)
    with pytest.raises(errors.StaleRevision):
        await proceed(flow, revision=step["revision"] + 5)
    with pytest.raises(errors.ValidationFailed):
        await proceed(flow, rounds=0)
    assert await step_row(flow, "check") == step
    assert len(await activations_of(flow, "check")) == 1
    await clean(flow)
    # A round whose task awaits review waits for a person too, but not as a held query.
    review = await begin(db, tenant, poll_doc(on_failure="$hold"))
    await drain(engine)
    await answer(review, engine, "unknown")
    assert (await step_row(review, "check"))["state"] == "WAITING"
    with pytest.raises(wait_recovery.PollNotContinuable, match="awaits review"):
        await proceed(review)
    await clean(review)


async def test_a_continue_replayed_with_its_key_returns_the_original_receipt(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, poll_doc(on_failure="$hold", retry={"max_attempts": 2}))
    await drain(engine)
    (original,) = await flow.tasks()
    await attempt(flow, original["id"], retryable=False)
    await drain(engine)
    revision = (await step_row(flow, "check"))["revision"]
    first = await proceed(flow, revision=revision, key="continue-1")
    again = await proceed(flow, revision=revision, key="continue-1", fresh=False)
    assert (again.status, again.body) == (first.status, first.body)
    assert len(await tasks_of_round(flow, 1)) == 2  # one continued task, not two
    with pytest.raises(errors.IdempotencyConflict):
        await proceed(flow, revision=revision, key="continue-1", rounds=7)
    await clean(flow)

"""SIGNAL steps and signals (orbit_common.weave.signals, the engine's part in engine.py) against
the real database: a signal before its wait, one winner among concurrent signals, the
dispositions of signals that can never win, the timeout, expiry with back-off, and acceptance's
refusals. A database of its own: the engine's lease scans read every namespace."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc
from orbit_common.weave import interpreter, language, signals
from orbit_common.weave.engine import Engine, gauges
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
from tests.integration.weave.support import principal
from tests.support import database, invariants
from tests.support.lease_fixtures import db_time, wait_db_time_past

own_url, db = database.own_database("orbit_weave_signals", pool_max=12)


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="signal-test", lease_ms=30_000, batch=32)


def waiting(*, then_task: bool = False, **extra: Any) -> dict[str, Any]:
    """a (TASK) -> approve (SIGNAL "approval", correlation input.order) -> done (or, with
    ``then_task``, a TASK b first: the instance keeps running after the signal)."""
    step = {"kind": "SIGNAL", "signal": "approval", "correlation": "input.order",
            "next": "b" if then_task else "done", **extra}
    steps: dict[str, Any] = {
        "a": task("w.a", "approve"), "approve": step,
        "done": {"kind": "SUCCEED", "output": "steps.approve.result.payload"},
    }
    if then_task:
        steps["b"] = task("w.b", "done")
    if "on_timeout" in extra:
        steps["late"] = {"kind": "FAIL", "error": "no_approval"}
    return doc(steps, "a", input_schema={
        "type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]})


async def send(flow: Flow, *, name: str = "approval", key: str | None = "o-1",
               payload: Any = None, version: int = 1, expires_in_ms: int | None = None,
               idempotency_key: str | None = None, instance_id: bytes | None = None
               ) -> dict[str, Any]:
    who = await principal(flow.db, flow.tenant.api_key)
    request = signals.SignalRequest.check(
        name=name, correlation_key=key,
        payload_text=json.dumps({"ok": True} if payload is None else payload),
        payload_version=version, evidence_ref=None, expires_in_ms=expires_in_ms)
    replay = await signals.send_signal(
        flow.db, who, namespace=flow.tenant.namespace,
        target=signals.Target(instance_id=instance_id or flow.instance_id), signal=request,
        idempotency_key=idempotency_key)
    assert replay.status == 201
    body: dict[str, Any] = replay.body
    return body


async def rows(flow: Flow, table: str, order: str = "") -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(f"SELECT * FROM {table} WHERE namespace_id = %s AND instance_id = %s"
                          f"{order}", (flow.tenant.namespace_id, flow.instance_id))
        return [dict(r) for r in await cur.fetchall()]
    return await flow.db.read("test.rows", body)


async def reach_wait(flow: Flow, engine: Engine) -> None:
    """Start, and end task a: the instance waits at approve."""
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {})
    await drain(engine)


async def clean(flow: Flow) -> None:
    assert await invariants.check_db(flow.db, [flow.tenant.namespace_id]) == []


async def test_signal_before_its_wait_is_consumed_when_the_wait_is_reached(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    await drain(engine)
    early = await send(flow, payload={"approved": "yes"})
    assert early["state"] == "PENDING"
    await drain(engine)  # no wait yet: it stays PENDING, its next check backed off
    (row,) = await rows(flow, "weave_signals")
    assert row["state"] == "PENDING"
    assert row["checks"] == 1
    assert row["available_at"] > row["accepted_at"]
    assert row["expires_at"] > row["available_at"]
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {})
    await drain(engine)
    instance = await flow.instance()
    assert instance["state"] == "SUCCEEDED"
    assert json.loads(instance["output"]) == {"approved": "yes"}
    (row,) = await rows(flow, "weave_signals")
    (wait,) = await rows(flow, "weave_waits")
    assert row["state"] == "CONSUMED"
    assert row["disposition"] == "consumed"
    assert row["wait_id"] == wait["id"]
    assert row["target_activation_sequence"] == 1
    assert wait["state"] == "SIGNALLED"
    assert wait["winner_signal_id"] == row["id"]
    assert wait["correlation_key"] == b"o-1"
    assert wait["signal_name"] == "approval"
    steps = await flow.steps()
    result = json.loads(steps["approve"]["output"])
    assert result["signal_id"] == early["id"]
    assert result["payload_version"] == 1
    assert result["payload"] == {"approved": "yes"}
    await clean(flow)


async def test_a_signal_to_an_open_wait_advances_it(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    await reach_wait(flow, engine)
    assert (await flow.steps())["approve"]["state"] == "WAITING"
    before = (await flow.instance(), await flow.steps(), await rows(flow, "weave_waits"),
              await rows(flow, "weave_pending_advances"))
    await send(flow, key="o-2")  # another order's signal
    await send(flow, version=2)  # a version no step accepts
    await send(flow, name="other")  # a name no step waits for
    await drain(engine)
    # rejected: nothing but the signals themselves changed
    assert (await flow.instance(), await flow.steps(), await rows(flow, "weave_waits"),
            await rows(flow, "weave_pending_advances")) == before
    assert (await flow.instance())["state"] == "RUNNING"
    won = await send(flow, payload=7)
    await drain(engine)
    instance = await flow.instance()
    assert instance["state"] == "SUCCEEDED"
    assert json.loads(instance["output"]) == 7
    by_id = {r["id"].hex(): r for r in await rows(flow, "weave_signals")}
    assert by_id.pop(won["id"])["disposition"] == "consumed"
    assert sorted(r["disposition"] for r in by_id.values()) == [
        "correlation_mismatch", "payload_version", "unknown_signal"]
    assert all(r["state"] == "REJECTED" and r["wait_id"] is None for r in by_id.values())
    await clean(flow)


async def test_100_concurrent_signals_to_one_wait_make_one_winner(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(then_task=True), {"order": "o-1"})
    await reach_wait(flow, engine)
    two = Engine(db, owner="signal-test-2", lease_ms=30_000, batch=32)

    async def burst() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(send(flow, payload=i) for i in range(100))))

    async def engines() -> None:
        for _ in range(20):
            await asyncio.gather(engine.run_once(), two.run_once())

    sent, _ = await asyncio.gather(burst(), engines())
    await drain(engine)
    assert len({s["id"] for s in sent}) == 100
    found = await rows(flow, "weave_signals")
    assert len(found) == 100
    consumed = [r for r in found if r["state"] == "CONSUMED"]
    assert len(consumed) == 1
    assert sorted({r["disposition"] for r in found if r["state"] == "REJECTED"}) == [
        "wait_closed"]
    assert sum(r["state"] == "REJECTED" for r in found) == 99
    (wait,) = await rows(flow, "weave_waits")
    assert wait["winner_signal_id"] == consumed[0]["id"]
    result = json.loads((await flow.steps())["approve"]["output"])
    assert result["signal_id"] == consumed[0]["id"].hex()
    assert result["payload"] == json.loads(consumed[0]["payload"])
    assert [t["step"] for t in await flow.tasks()] == ["a", "b"]
    await clean(flow)


async def test_two_waits_never_consume_one_signal(db: Database, engine: Engine) -> None:
    """Two SIGNAL steps in parallel branches wait for the same name and key: one signal wins
    one of them; the second wait needs a second signal."""
    branch = {"kind": "SIGNAL", "signal": "go", "correlation": "'k'", "next": "{end}"}
    document = doc({
        "both": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "done",
                 "branches": [
            {"name": "left", "start": "l", "steps": {
                "l": {**branch, "next": "l_end"}, "l_end": {"kind": "SUCCEED"}}},
            {"name": "right", "start": "r", "steps": {
                "r": {**branch, "next": "r_end"}, "r_end": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED"}}, "both")
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, document)
    first = await send(flow, name="go", key="k")
    await drain(engine)
    steps = await flow.steps()
    assert sorted(steps[n]["state"] for n in ("l", "r")) == ["SUCCEEDED", "WAITING"]
    assert (await flow.instance())["state"] == "RUNNING"
    second = await send(flow, name="go", key="k")
    await drain(engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    waits = await rows(flow, "weave_waits")
    assert sorted(w["winner_signal_id"].hex() for w in waits) == sorted(
        [first["id"], second["id"]])
    found = await rows(flow, "weave_signals")
    assert {r["wait_id"] for r in found} == {w["id"] for w in waits}
    await clean(flow)


async def test_timeout_fails_the_step_and_takes_on_timeout(db: Database,
                                                           engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(timeout_ms=300, on_timeout="late"), {"order": "o-1"})
    await reach_wait(flow, engine)
    (advance,) = [r for r in await rows(flow, "weave_pending_advances") if r["kind"] == "SIGNAL"]
    assert advance["state"] == "PENDING"
    (wait,) = await rows(flow, "weave_waits")
    assert advance["due_at"] == wait["deadline_at"] == wait["first_deadline_at"]

    await wait_db_time_past(db, wait["deadline_at"])  # the deadline is database time
    await drain(engine)
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    assert json.loads(instance["error"])["error"] == "no_approval"
    step = (await flow.steps())["approve"]
    assert step["state"] == "FAILED"
    assert json.loads(step["error"]) == {"error": "signal_timeout", "step": "approve"}
    (wait,) = await rows(flow, "weave_waits")
    assert wait["state"] == "TIMED_OUT"
    assert wait["fired_at"] >= wait["deadline_at"]
    assert wait["late_ms"] >= 0
    # A signal after the instance ended: the engine's disposition.
    await db.transaction("test.force", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'RUNNING', completed_at = NULL"
        " WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, flow.instance_id)))
    late = await send(flow)
    await db.transaction("test.force", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'FAILED', completed_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, flow.instance_id)))
    await drain(engine)
    (row,) = await rows(flow, "weave_signals")
    assert row["id"].hex() == late["id"]
    assert (row["state"], row["disposition"]) == ("REJECTED", "instance_finished")
    await clean(flow)


async def test_expiry_backs_off_without_moving_expires_at(db: Database,
                                                          engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    await drain(engine)
    sent = await send(flow, expires_in_ms=1500)
    (before,) = await rows(flow, "weave_signals")
    await drain(engine)
    (backed,) = await rows(flow, "weave_signals")
    assert backed["state"] == "PENDING"
    assert backed["checks"] == 1
    assert backed["expires_at"] == before["expires_at"]
    assert before["available_at"] < backed["available_at"] <= backed["expires_at"]
    await wait_db_time_past(db, before["expires_at"])  # its expiry is database time
    await drain(engine)
    (row,) = await rows(flow, "weave_signals")
    assert (row["state"], row["disposition"]) == ("REJECTED", "expired")
    assert row["expires_at"] == before["expires_at"]
    assert row["checks"] >= 1
    assert row["available_at"] <= row["expires_at"]
    # the wait reached after its expiry does not take it
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {})
    await drain(engine)
    assert (await flow.steps())["approve"]["state"] == "WAITING"
    assert sent["id"] == row["id"].hex()
    await clean(flow)


async def test_closing_the_instance_cancels_the_wait_and_rejects_its_signals(
        db: Database, engine: Engine) -> None:
    """A PARALLEL branch fails (FAIL_FAST) while the other waits: the wait is CANCELLED, its
    timeout advance DONE, and the instance's pending signals get ``instance_finished``."""
    document = doc({
        "both": {"kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
                 "branches": [
            {"name": "w", "start": "s", "steps": {
                "s": {"kind": "SIGNAL", "signal": "go", "timeout_ms": 60_000,
                      "on_timeout": "s_end", "next": "s_end"},
                "s_end": {"kind": "SUCCEED"}}},
            {"name": "t", "start": "a", "steps": {"a": task("w.a", "a_end"),
                                                   "a_end": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED"}}, "both")
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, document)
    await drain(engine)
    await send(flow, name="go", key="not this one")
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "fail", "boom")
    await drain(engine)
    assert (await flow.instance())["state"] == "FAILED"
    (wait,) = await rows(flow, "weave_waits")
    assert wait["state"] == "CANCELLED"
    assert wait["winner_signal_id"] is None
    assert {r["state"] for r in await rows(flow, "weave_pending_advances")} == {"DONE"}
    (row,) = await rows(flow, "weave_signals")
    assert row["state"] == "REJECTED"
    # leased while the wait was open: a mismatch; an unleased one would be instance_finished
    assert row["disposition"] in ("correlation_mismatch", "instance_finished")
    await clean(flow)


async def test_an_ended_instance_rejects_its_unleased_signals_in_batches(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    await drain(engine)
    for _ in range(40):
        await send(flow, key="other")  # waits for a step not reached yet: stays PENDING
    await drain(engine)
    assert {r["state"] for r in await rows(flow, "weave_signals")} == {"PENDING"}
    (first,) = await flow.tasks()
    await flow.end(first["id"], "fail", "boom")  # the instance fails at a
    await engine.run_once()
    found = await rows(flow, "weave_signals")
    assert (await flow.instance())["state"] == "FAILED"
    rejected = [r for r in found if r["state"] == "REJECTED"]
    assert len(rejected) == signals.REJECT_BATCH  # one transaction: at most 32
    assert {r["disposition"] for r in rejected} == {"instance_finished"}
    await db.transaction("test.due", lambda cur: cur.execute(
        "UPDATE weave_signals SET available_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s"
        " AND state = 'PENDING'", (tenant.namespace_id,)))
    await drain(engine)
    found = await rows(flow, "weave_signals")
    assert {(r["state"], r["disposition"]) for r in found} == {("REJECTED", "instance_finished")}
    await clean(flow)


async def test_correlation_over_512_bytes_fails_the_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "é" * 257})  # 514 bytes
    await reach_wait(flow, engine)
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    error = json.loads(instance["error"])
    assert error["error"] == "expression_failed"
    assert error["step"] == "approve"
    assert await rows(flow, "weave_waits") == []
    await clean(flow)


async def test_acceptance_refusals_write_nothing(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    with pytest.raises(errors.ValidationFailed) as bad:
        signals.SignalRequest.check(name="approval", correlation_key="k" * 513,
                                    payload_text="{}", payload_version=1, evidence_ref=None,
                                    expires_in_ms=None)
    assert bad.value.errors[0]["path"] == "$.correlation_key"
    ok = signals.SignalRequest.check(name="approval", correlation_key="k" * 512,
                                     payload_text="{}", payload_version=1, evidence_ref=None,
                                     expires_in_ms=None)
    assert len(ok.correlation_key) == 512
    for version in (0, True, "1"):
        with pytest.raises(errors.ValidationFailed):
            signals.SignalRequest.check(name="approval", correlation_key=None,
                                        payload_text="{}", payload_version=version,
                                        evidence_ref=None, expires_in_ms=None)
    other = await make_tenant(db)
    who = await principal(db, other.api_key)
    with pytest.raises(errors.NotFound):  # another tenant's instance is not found
        await signals.send_signal(db, who, namespace=other.namespace,
                                  target=signals.Target(instance_id=flow.instance_id),
                                  signal=ok)
    # a finished instance: 409, nothing written
    await db.transaction("test.force", lambda cur: cur.execute(
        "UPDATE weave_instances SET state = 'CANCELLED', completed_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, flow.instance_id)))
    with pytest.raises(signals.InstanceFinished):
        await send(flow)
    assert await rows(flow, "weave_signals") == []


async def test_a_replay_returns_the_original_receipt(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    first = json.loads(jsondoc.dumps(await send(flow, idempotency_key="sig-1")))
    again = json.loads(jsondoc.dumps(await send(flow, idempotency_key="sig-1")))
    assert again == first
    with pytest.raises(errors.Conflict) as conflict:
        await send(flow, idempotency_key="sig-1", payload={"other": 1})
    assert conflict.value.code == "idempotency_conflict"
    assert len(await rows(flow, "weave_signals")) == 1
    # once consumed, a replay still returns the original (PENDING) receipt
    await reach_wait(flow, engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"
    assert json.loads(jsondoc.dumps(await send(flow, idempotency_key="sig-1"))) == first


async def test_by_business_key(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, waiting(), {"order": "o-1"})
    who = await principal(db, tenant.api_key)
    request = signals.SignalRequest.check(name="approval", correlation_key="o-1",
                                          payload_text="1", payload_version=1,
                                          evidence_ref="cb-9", expires_in_ms=None)
    with pytest.raises(errors.NotFound):
        await signals.send_signal(db, who, namespace=tenant.namespace, signal=request,
                                  target=signals.Target(definition=flow.name,
                                                        business_key=b"order-1"))
    await db.transaction("test.key", lambda cur: cur.execute(
        "UPDATE weave_instances SET business_key = %s WHERE namespace_id = %s AND id = %s",
        (b"order-1", tenant.namespace_id, flow.instance_id)))
    sent = await signals.send_signal(db, who, namespace=tenant.namespace, signal=request,
                                     target=signals.Target(definition=flow.name,
                                                           business_key=b"order-1"))
    assert sent.body["workflow_id"] == flow.instance_id.hex()
    assert sent.body["evidence_ref"] == "cb-9"
    twin = await begin(db, tenant, waiting(), {"order": "o-1"})
    await db.transaction("test.key", lambda cur: cur.execute(
        "UPDATE weave_instances SET business_key = %s, definition_id = (SELECT definition_id"
        " FROM (SELECT definition_id FROM weave_instances WHERE namespace_id = %s AND id = %s)"
        " x) WHERE namespace_id = %s AND id = %s",
        (b"order-1", tenant.namespace_id, flow.instance_id, tenant.namespace_id,
         twin.instance_id)))
    with pytest.raises(signals.InstanceAmbiguous):
        await signals.send_signal(db, who, namespace=tenant.namespace, signal=request,
                                  target=signals.Target(definition=flow.name,
                                                        business_key=b"order-1"))


async def test_wait_winner_probe_finds_a_second_winner_and_a_lost_one(
        db: Database, engine: Engine) -> None:
    """Two instances with a consumed signal each are clean; a second CONSUMED signal naming a
    wait, a winner that is not CONSUMED, and a CONSUMED signal naming no SIGNALLED wait are
    ``wait_winner``; another tenant stays clean."""
    damaged, bystander = await make_tenant(db), await make_tenant(db)
    flows = []
    for tenant in (damaged, bystander):
        flow = await begin(db, tenant, waiting(then_task=True), {"order": "o-1"})
        await send(flow)
        await reach_wait(flow, engine)
        assert (await flow.steps())["approve"]["state"] == "SUCCEEDED"
        flows.append(flow)
    flow = flows[0]
    ns = [damaged.namespace_id]
    assert await invariants.check_db(db, ns) == []
    (wait,) = await rows(flow, "weave_waits")
    extra = await send(flows[1], payload=2)  # a PENDING signal of the bystander's instance

    async def force(sql: str, *args: Any) -> None:
        await db.transaction("test.corrupt", lambda cur: cur.execute(sql, args))

    # a second CONSUMED signal naming the damaged wait
    await force("UPDATE weave_signals SET namespace_id = %s, instance_id = %s, state = 'CONSUMED',"
                " disposition = 'consumed', wait_id = %s WHERE id = %s", damaged.namespace_id,
                flow.instance_id, wait["id"], bytes.fromhex(extra["id"]))
    found = [f for f in await invariants.check_db(db, ns) if f.startswith("[wait_winner]")]
    assert len(found) == 2, found  # two name it; the extra is not its winner
    assert any("2 CONSUMED signals name it" in f for f in found)
    # the winner itself rejected
    await force("UPDATE weave_signals SET state = 'REJECTED', disposition = 'wait_closed',"
                " wait_id = NULL WHERE id = %s", wait["winner_signal_id"])
    found = [f for f in await invariants.check_db(db, ns) if f.startswith("[wait_winner]")]
    assert any("its winner is not a CONSUMED signal" in f for f in found), found
    assert await invariants.check_db(db, [bystander.namespace_id]) == []


def relay(timeout: bool) -> dict[str, Any]:
    """a -> approve (SIGNAL, 400 ms timeout) -> b (its input from the payload) -> done; on
    timeout: late (a TASK) -> done."""
    return doc({
        "a": task("w.a", "approve"),
        "approve": {"kind": "SIGNAL", "signal": "approval", "correlation": "input.order",
                    "payload_versions": [1, 2], "timeout_ms": 400 if timeout else 60_000,
                    "on_timeout": "late", "next": "b"},
        "b": task("w.b", "done", input="{'amount': steps.approve.result.payload.amount}"),
        "late": task("w.c", "done"),
        "done": {"kind": "SUCCEED", "output": "{'n': 1}"},
    }, "a", input_schema={"type": "object", "properties": {"order": {"type": "string"}},
                          "required": ["order"]})


SCRIPT: Any = {"w.a": ("ok", {}), "w.b": ("ok", {"paid": True}), "w.c": ("ok", {})}


@pytest.mark.parametrize("arrives", [True, False])
async def test_the_engine_agrees_with_the_interpreter(db: Database, engine: Engine,
                                                      arrives: bool) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, relay(timeout=not arrives), {"order": "o-9"})
    if arrives:
        await send(flow, key="o-9", payload={"amount": "12.50"}, version=2)
    await play(flow, engine, SCRIPT)
    if not arrives:  # the instance waits at approve until its timeout (database time)
        (wait,) = await rows(flow, "weave_waits")
        await wait_db_time_past(db, wait["deadline_at"])
        await play(flow, engine, SCRIPT)
    assert (await flow.instance())["state"] != "RUNNING"
    engine_result = json.loads((await flow.steps())["approve"]["output"] or "null")
    seen: list[tuple[str, bytes]] = []

    def arrival(step: language.SignalStep, key: bytes) -> interpreter.SignalArrived | None:
        seen.append((step.signal, key))
        return interpreter.SignalArrived(result=engine_result) if arrives else None

    run = await assert_matches(flow, SCRIPT, arrival)
    assert seen == [("approval", b"o-9")]
    assert [t.step for t in run.tasks] == (["a", "b"] if arrives else ["a", "late"])
    if not arrives:
        step = (await flow.steps())["approve"]
        assert json.loads(step["error"]) == {"error": "signal_timeout", "step": "approve"}
    await clean(flow)


async def test_gauges_count_pending_signals_and_how_overdue_the_oldest_due_advance_is(
        db: Database, engine: Engine) -> None:
    await drain(engine)
    before = await gauges(db)
    assert before.advances_overdue_s == 0
    flow = await begin(db, await make_tenant(db), waiting(), {"order": "o-1"})
    await wait_db_time_past(db, await db_time(db))
    unleased = await gauges(db)  # the start's ROOT advance is due and no engine has run
    assert unleased.advances_overdue_s > 0
    await send(flow)  # before its wait exists: it stays pending
    await drain(engine)
    after = await gauges(db)
    assert after.signals_pending == before.signals_pending + 1
    assert after.advances_overdue_s == 0
    (signal,) = await rows(flow, "weave_signals")
    assert signal["state"] == "PENDING"

"""The workflow engine (orbit_common.weave.engine) against the real database and the kernel's
lease protocol, compared with the reference interpreter: the tasks each advance creates, the
final state, output and step results. A database of its own: the engine's lease scans read every
namespace."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from typing import Any

import prometheus_client
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.pulse import interventions
from orbit_common.weave import definitions, instances, interpreter, language, leasing
from orbit_common.weave.engine import Engine, gauges
from tests.conftest import make_tenant, unique
from tests.integration.test_interventions import review
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.engine_support import (
    ACTIVE,
    ENDED,
    Flow,
    assert_matches,
    assert_same,
    begin,
    doc,
    drain,
    fire_due_timers,
    frozen_errors,
    gate_of,
    play,
    publish,
    task,
    workflow_events,
)
from tests.integration.weave.support import principal
from tests.support import database, invariants
from tests.support.lease_fixtures import (
    db_time,
    make_queue,
    open_session,
    set_queue_limits,
    wait_db_time_past,
)
from tests.support.waiting import until
from tests.unit.weave.strategies import definitions as random_definitions

own_url, db = database.own_database("orbit_weave_engine")


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-test", lease_ms=30_000, batch=8)


async def clean(db: Database, namespace_id: bytes) -> None:
    assert await invariants.check_db(db, [namespace_id]) == []


LINEAR = doc({
    "a": task("w.a", "b", input="{'n': input.n}",
              result_schema={"type": "object", "properties": {"x": {"type": "integer"}},
                             "required": ["x"]}),
    "b": task("w.b", "done", input="{'x2': steps.a.result.x * 2}"),
    "done": {"kind": "SUCCEED", "output": "{'a': steps.a.result.x, 'b': steps.b.result}"},
}, "a")


async def test_linear_task_task_succeed(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR, {"n": 7})
    script = {"w.a": ("ok", {"x": 5}), "w.b": ("ok", {"y": "z"})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "SUCCEEDED"
    instance = await flow.instance()
    assert json.loads(instance["output"]) == {"a": 5, "b": {"y": "z"}}
    assert instance["completed_at"] is not None
    assert {r["outcome"] for r in await flow.inbox()} == {"advanced"}
    await clean(db, tenant.namespace_id)


CHOICE = doc({
    "a": task("w.a", "pick"),
    "pick": {"kind": "CHOICE", "choices": [
        {"when": "input.n > 10", "next": "big"}], "default": "small"},
    "big": task("w.b", "done"),
    "small": task("w.c", "done"),
    "done": {"kind": "SUCCEED", "output": "input.n"},
}, "a")


@pytest.mark.parametrize("n", [3, 30])
async def test_choice(db: Database, engine: Engine, n: int) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, CHOICE, {"n": n})
    script = {"w.a": ("ok", {}), "w.b": ("ok", 1), "w.c": ("ok", 2)}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert [c.handler for c in run.tasks] == ["w.a", "w.b" if n > 10 else "w.c"]
    assert json.loads((await flow.steps())["pick"]["output"]) == {
        "next": "big" if n > 10 else "small"}
    await clean(db, tenant.namespace_id)


def parallel(policy: str, *, on_failure: str | None = None, branches: int = 3
             ) -> dict[str, Any]:
    names = [f"b{i}" for i in range(branches)]
    block: dict[str, Any] = {
        "kind": "PARALLEL", "join": {"policy": policy}, "next": "after",
        "branches": [{"name": name, "start": f"t_{name}", "steps": {
            f"t_{name}": task(f"w.{'abcd'[i % 4]}", f"ok_{name}",
                              input=f"{{'branch': '{name}'}}"),
            f"ok_{name}": {"kind": "SUCCEED", "output": f"steps.t_{name}.result"}}}
            for i, name in enumerate(names)]}
    steps: dict[str, Any] = {
        "fan": block,
        "after": task("w.f", "done", input="{'joined': steps.fan.result}"),
        "done": {"kind": "SUCCEED", "output": "steps.fan.result"},
    }
    if on_failure is not None:
        block["on_failure"] = on_failure
        steps[on_failure] = task("w.e", "failed")
        steps["failed"] = {"kind": "FAIL", "error": "recovered"}
    return doc(steps, "fan")


async def test_one_transactions_new_tasks_hold_a_run_of_ids_per_instance(db: Database) -> None:
    # Four instances of a 5-branch block advanced in one transaction: each instance's branch
    # tasks are adjacent in the claim order (dispatch_at, available_at, id), so a claim takes
    # an instance's branches together (engine.TaskIds). With ids assigned at random, four
    # instances' 20 tasks would interleave almost surely.
    tenant = await make_tenant(db)
    first = await begin(db, tenant, parallel("ALL_SUCCEED", branches=5))
    who = await principal(db, tenant.api_key)
    for n in range(3):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=first.name,
                                       input_json=json.dumps({"n": n}).encode())
    rounds = await drain(Engine(db, owner="engine-runs", batch=16, per_transaction=16))
    assert rounds[0].advances == 4 and len(rounds[0].advance_seconds) == 1  # one transaction

    async def claim_order(cur: Any) -> list[tuple[bytes, Any]]:
        await cur.execute("SELECT owner_id, available_at FROM pulse_tasks WHERE namespace_id = %s"
                          " ORDER BY dispatch_at, available_at, id", (tenant.namespace_id,))
        return [(r["owner_id"], r["available_at"]) for r in await cur.fetchall()]

    order = await db.read("test.claim_order", claim_order)
    assert len(order) == 20 and len({at for _, at in order}) == 1
    owners = [owner for owner, _ in order]
    runs = [owner for n, owner in enumerate(owners) if n == 0 or owners[n - 1] != owner]
    assert len(runs) == 4 and len(set(runs)) == 4
    await clean(db, tenant.namespace_id)


async def test_parallel_all_succeed(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, parallel("ALL_SUCCEED"))
    script = {"w.a": ("ok", 1), "w.b": ("ok", 2), "w.c": ("ok", 3), "w.f": ("ok", {})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.output == {"b0": 1, "b1": 2, "b2": 3}
    steps = await flow.steps()
    assert json.loads(steps["fan"]["join_state"]) == {
        "b0": {"ok": True, "value": 1}, "b1": {"ok": True, "value": 2},
        "b2": {"ok": True, "value": 3}}
    await clean(db, tenant.namespace_id)


async def test_parallel_all_succeed_with_a_failed_branch_fails_at_the_join(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, parallel("ALL_SUCCEED"))
    script = {"w.a": ("ok", 1), "w.b": ("fail", "no"), "w.c": ("ok", 3), "w.f": ("ok", {})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "FAILED"
    assert run.error["step"] == "t_b1"
    await clean(db, tenant.namespace_id)


async def test_fail_fast_keeps_the_closed_branch_result_without_advancing(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, parallel("FAIL_FAST", on_failure="recover"))
    # b0 fails first; b1's and b2's results arrive after the block closed, before recover ends.
    script = {"w.a": ("fail", "no"), "w.b": ("ok", 2), "w.c": ("ok", 3), "w.e": ("ok", {})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "FAILED"
    assert run.error["error"] == "recovered"
    outcomes = {json.loads(r["snapshot"])["handler"]: r["outcome"] for r in await flow.inbox()}
    assert outcomes == {"w.a": "advanced", "w.b": "closed_block", "w.c": "closed_block",
                        "w.e": "advanced"}
    steps = await flow.steps()
    assert steps["fan"]["state"] == "FAILED"
    assert steps["t_b1"]["state"] == "CANCELLED"  # closed with the block; its task ran on
    assert "after" not in steps
    await clean(db, tenant.namespace_id)


async def test_on_failure_takes_the_failure_transition(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "a": task("w.a", "done", on_failure="mend"),
        "mend": task("w.b", "done", input="{'n': input.n}"),
        "done": {"kind": "SUCCEED"},
    }, "a")
    flow = await begin(db, tenant, document)
    script = {"w.a": ("fail", "broken"), "w.b": ("ok", 1)}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert [c.handler for c in run.tasks] == ["w.a", "w.b"]
    assert run.state.value == "SUCCEEDED"
    steps = await flow.steps()
    assert json.loads(steps["a"]["error"])["error"] == "task_failed"
    await clean(db, tenant.namespace_id)


async def test_result_schema_mismatch_fails_the_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    script = {"w.a": ("ok", {"x": "not a number"}), "w.b": ("ok", 1)}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "FAILED"
    assert run.error["error"] == "result_shape_mismatch"
    assert len(run.tasks) == 1
    await clean(db, tenant.namespace_id)


async def test_expression_failure_fails_the_step(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    document = doc({
        "a": task("w.a", "b"),
        "b": task("w.b", "done", input="{'q': 10 / (input.n - input.n)}"),
        "done": {"kind": "SUCCEED"},
    }, "a")
    flow = await begin(db, tenant, document)
    script = {"w.a": ("ok", {}), "w.b": ("ok", 1)}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert (run.state.value, run.error["error"], run.error["step"]) == (
        "FAILED", "expression_failed", "b")
    assert len(run.tasks) == 1
    await clean(db, tenant.namespace_id)


async def test_needs_review_holds_the_step_until_the_review(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    script = {"w.a": ("review",), "w.b": ("ok", 1)}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert run.state.value == "RUNNING"
    steps = await flow.steps()
    assert steps["a"]["state"] == "WAITING"
    assert steps["a"]["live_activation_id"] is not None
    (held,) = await flow.inbox()
    assert held["outcome"] == "held"
    await clean(db, tenant.namespace_id)
    # The review decides: the task's SUCCEEDED event advances the waiting step.
    (task_row,) = await flow.tasks()
    await review(db, await principal(db, tenant.api_key), tenant, task_row["id"],
                 decision="succeeded", result='{"x": 4}')
    await drain(engine)
    tasks = await flow.tasks()
    assert [t["handler"] for t in tasks] == ["w.a", "w.b"]
    assert json.loads(tasks[1]["input"]) == {"x2": 8}
    assert [r["outcome"] for r in await flow.inbox()] == ["held", "advanced"]
    await clean(db, tenant.namespace_id)


async def test_a_row_consumed_twice_makes_one_next_task(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {"x": 1})
    await drain(engine)
    assert len(await flow.tasks()) == 2
    # The same row comes back (as after a commit whose outcome was lost): it is a duplicate.
    await db.transaction("test.replay", lambda cur: cur.execute(
        "UPDATE weave_inbox SET state = 'PENDING', consumed_at = NULL, outcome = NULL"
        " WHERE namespace_id = %s AND task_id = %s", (tenant.namespace_id, first["id"])))
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"duplicate": 1}
    assert len(await flow.tasks()) == 2
    await clean(db, tenant.namespace_id)


async def test_a_result_for_another_activation_is_stale(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, parallel("ALL_SUCCEED", branches=2))
    await drain(engine)
    one, two = await flow.tasks()
    await flow.end(one["id"], "ok", 1)
    # A row whose activation is not its task's (a mislinked source): kept, never advanced.

    async def mislink(cur: Any) -> None:
        await cur.execute("SELECT activation_id FROM weave_inbox WHERE namespace_id = %s"
                          " AND task_id = %s", (tenant.namespace_id, one["id"]))
        await cur.execute(
            "UPDATE weave_inbox SET activation_id = (SELECT id FROM weave_activations"
            " WHERE namespace_id = %s AND task_id = %s) WHERE namespace_id = %s"
            " AND task_id = %s", (tenant.namespace_id, two["id"], tenant.namespace_id,
                                  one["id"]))

    await db.transaction("test.mislink", mislink)
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"stale": 1}
    steps = await flow.steps()
    assert steps["t_b0"]["state"] == steps["t_b1"]["state"] == "RUNNING"
    assert (await flow.inbox())[0]["outcome"] == "stale"


async def test_an_instance_started_on_v1_finishes_on_v1(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    v2 = doc({"z": task("w.e", "done"), "done": {"kind": "SUCCEED", "output": "'v2'"}}, "z")
    await publish(db, tenant, flow.queue.name, v2, name=flow.name, revision=2)
    script = {"w.a": ("ok", {"x": 2}), "w.b": ("ok", 1)}
    await play(flow, engine, script)
    await assert_matches(flow, script)
    assert [t["handler"] for t in await flow.tasks()] == ["w.a", "w.b"]
    assert (await flow.instance())["version"] == 1
    # A new instance runs v2.
    started = await instances.start_instance(db, await principal(db, tenant.api_key),
                                             namespace=tenant.namespace, definition=flow.name,
                                             input_json=b'{"n": 1}')
    assert started.body["version"] == 2
    await clean(db, tenant.namespace_id)


async def test_a_lapsed_lease_is_leased_again_and_advanced_once(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "ok", {"x": 1})
    # A replica leases the row for 1 ms and dies before its advance.
    dead = Engine(db, owner="engine-dead", lease_ms=1, batch=8)
    leased = await db.transaction("test.lease", lambda cur: leasing.lease_inbox(
        cur, owner=dead.owner, lease_ms=1, limit=8))
    assert [r["task_id"] for r in leased] == [first["id"]]
    await wait_db_time_past(db, leased[0]["lease_expires_at"])
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"advanced": 1}
    # The dead replica's advance, were it to resume, is fenced off: nothing changes.
    late = await dead.advance(tenant.namespace_id, flow.instance_id, leased, [])
    assert late.outcomes == {"fenced": 1}
    assert len(await flow.tasks()) == 2
    (row,) = await flow.inbox()
    assert (row["state"], row["attempts"], row["outcome"]) == ("CONSUMED", 2, "advanced")
    await clean(db, tenant.namespace_id)


async def test_two_engines_racing_join_a_block_once(db: Database) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, parallel("ALL_SUCCEED", branches=12))
    one = Engine(db, owner="engine-1", batch=3)
    two = Engine(db, owner="engine-2", batch=3)
    await drain(one)
    made = await flow.tasks()
    assert len(made) == 12
    for t in made:
        await flow.end(t["id"], "ok", t["sequence"])
    while True:
        a, b = await asyncio.gather(one.run_once(), two.run_once())
        if a.inbox + b.inbox + a.advances + b.advances == 0:
            break
    tasks = await flow.tasks()
    assert [t["handler"] for t in tasks].count("w.f") == 1
    steps = await flow.steps()
    assert steps["fan"]["state"] == "SUCCEEDED"
    assert json.loads(steps["fan"]["output"]) == {f"b{i}": i + 1 for i in range(12)}
    assert {r["outcome"] for r in await flow.inbox()} == {"advanced"}
    await clean(db, tenant.namespace_id)


async def test_a_refused_task_fails_the_instance_instead_of_looping(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    await drain(engine)
    (first,) = await flow.tasks()
    # The queue of step b is renamed away: its task cannot be created, whatever retries.
    await db.transaction("test.drop_queue", lambda cur: cur.execute(
        "UPDATE pulse_queues SET name = CONCAT(name, '-gone') WHERE namespace_id = %s"
        " AND id = %s", (tenant.namespace_id, flow.queue.id)))
    await flow.end(first["id"], "ok", {"x": 1})
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"rejected": 1}
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    error = json.loads(instance["error"])
    assert error["error"] == "task_rejected"
    assert "does not exist" in error["cause"]
    assert len(await flow.tasks()) == 1
    await clean(db, tenant.namespace_id)


async def test_gauges_count_the_backlog_and_instances(db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    await drain(engine)
    flow = await begin(db, tenant, LINEAR)
    before = await gauges(db)
    assert before.advances_due >= 1
    assert before.instances.get("RUNNING", 0) >= 1
    await drain(engine)
    (first,) = await flow.tasks()
    idle = await gauges(db)
    moment = await db_time(db)
    await flow.end(first["id"], "ok", {"x": 1})
    await wait_db_time_past(db, moment)
    waiting = await gauges(db)
    assert waiting.inbox_backlog == idle.inbox_backlog + 1
    assert waiting.inbox_oldest_age_s > 0
    await drain(engine)
    assert (await gauges(db)).inbox_backlog == idle.inbox_backlog


# --- random definitions, random outcomes, random delivery order ---------------------------------


async def _random_run(url: DatabaseUrl, document: dict[str, Any], failing: set[str], n: int,
                      rng: random.Random) -> None:
    db = await open_database(url, minsize=1, maxsize=4)
    try:
        tenant = await make_tenant(db)
        qa = await make_queue(db, tenant, name="qa", max_attempts=1)
        qb = await make_queue(db, tenant, name="qb", max_attempts=1)
        who = await principal(db, tenant.api_key)
        name = unique("wf")
        await definitions.create_definition(db, who, namespace=tenant.namespace, name=name)
        await definitions.publish_version(db, who, namespace=tenant.namespace, name=name,
                                          revision=1, document=json.dumps(document).encode())
        started = await instances.start_instance(db, who, namespace=tenant.namespace,
                                                 definition=name,
                                                 input_json=json.dumps({"n": n}).encode())
        session = await open_session(db, tenant, [qa, qb], handlers=("h.run",),
                                     max_in_flight=256)
        flow = Flow(db=db, tenant=tenant, queue=qa, session=session, name=name,
                    instance_id=bytes.fromhex(started.body["id"]), document=document,
                    input={"n": n}, more_queues=[qb])
        engine = Engine(db, owner="engine-random", batch=4)
        await drain(engine)
        await fire_due_timers(flow, engine)
        delivered: list[int] = []
        while (await flow.instance())["state"] in ACTIVE:
            pending = [t for t in await flow.tasks() if t["sequence"] not in delivered]
            if not pending:
                break
            chosen = pending[rng.randrange(len(pending))]
            delivered.append(chosen["sequence"])
            if chosen["state"] in ENDED:
                pass  # cancelled by the engine: its result is already in the inbox
            elif chosen["step"] in failing:
                await flow.end(chosen["id"], "fail", "drawn")
            else:
                await flow.end(chosen["id"], "ok", {"v": json.loads(chosen["input"])["v"] + 1})
            await drain(engine)
            await fire_due_timers(flow, engine)  # the interpreter fires them before a result
        frozen = await frozen_errors(flow)
        fired = await flow.fired_order()
        made = await flow.tasks()
        by_sequence = {t["sequence"]: t["id"].hex() for t in made}
        states = {t["sequence"]: t["state"] for t in made}
        outcomes = {r["task_id"].hex(): r["outcome"] for r in await flow.inbox()}
        # Tasks the engine cancelled whose result it consumed before the instance ended (a
        # failure settlement may settle on them before this loop picked them): delivered too.
        delivered += [t["sequence"] for t in made if t["sequence"] not in delivered
                      and outcomes.get(t["id"].hex()) not in (None, "instance_ended")]
        order = iter(delivered)

        def choose(calls: Sequence[interpreter.TaskCall]) -> int:
            return [c.seq for c in calls].index(next(order))

        def outcome(call: interpreter.TaskCall) -> interpreter.Outcome:
            if call.step in failing or states[call.seq] == "CANCELLED":
                return interpreter.Failed(error=frozen[by_sequence[call.seq]])
            return interpreter.Succeeded(result={"v": call.input["v"] + 1})

        def fire(timers: Sequence[interpreter.TimerCall]) -> int:
            return [t.step for t in timers].index(fired.pop(0))

        run = interpreter.run(language.validate_document(document), {"n": n}, outcome,
                              choose=choose, fire=fire)
        # The interpreter consumed every delivered result (what is left changed nothing in
        # the engine either: results of closed blocks or of a stop, kept, never advanced).
        assert {outcomes[by_sequence[seq]] for seq in order} <= {"closed_block", "stopping",
                                                                 "instance_ended"}
        assert fired == []  # ... and fired every timer the engine fired
        await assert_same(flow, run)
        assert await invariants.check_db(db, [tenant.namespace_id]) == []
    finally:
        await db.close()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(document=random_definitions(timers=True), data=st.data())
def test_random_definitions_advance_as_the_interpreter_predicts(
        own_url: DatabaseUrl, document: dict[str, Any], data: st.DataObject) -> None:
    """Random valid definitions (chains, choices, failure transitions, nested PARALLEL blocks
    of both policies, TIMER steps), random failing steps and a random delivery order: the
    engine makes the interpreter's tasks and ends where it ends (the timers fire before the
    next result, in the order the engine fired them)."""
    parsed = language.validate_document(document)
    tasks = sorted(n for n, s in parsed.all_steps.items() if isinstance(s, language.TaskStep))
    failing = data.draw(st.sets(st.sampled_from(tasks)) if tasks else st.just(set()))
    n = data.draw(st.integers(-1000, 1000))
    rng = data.draw(st.randoms(use_true_random=False))
    asyncio.run(_random_run(own_url, document, failing, n, rng))


async def test_a_failing_advance_holds_up_no_other_instance_and_is_retried(
        db: Database) -> None:
    """An advance that fails with an error that is no refusal (a trigger refuses one step's
    row here) rolls back alone: the other instance of the round advances; once the cause is
    gone the failed one's lapsed lease is leased again and it advances."""
    tenant = await make_tenant(db)
    engine = Engine(db, owner="engine-errors", lease_ms=300, batch=8)
    await drain(engine)
    poisoned = await begin(db, tenant, doc({"poison": task("w.a", "done"),
                                            "done": {"kind": "SUCCEED"}}, "poison"))
    healthy = await begin(db, tenant, LINEAR)

    async def ddl(sql: str) -> None:
        await db.transaction("test.ddl", lambda cur: cur.execute(sql))

    await ddl("CREATE TRIGGER trg_test_poison BEFORE INSERT ON weave_steps FOR EACH ROW"
              " BEGIN IF NEW.name = 'poison' THEN SIGNAL SQLSTATE '45000'"
              " SET MESSAGE_TEXT = 'poisoned step'; END IF; END")
    try:
        done = await engine.run_once()
        assert done.outcomes == {"advanced": 1, "error": 1}
        assert len(await healthy.tasks()) == 1
        assert await poisoned.tasks() == []
    finally:
        await ddl("DROP TRIGGER trg_test_poison")
    await until(lambda: _tasks_made(poisoned), timeout=10, interval=0.05)
    assert len(await poisoned.tasks()) == 1
    assert len(await healthy.tasks()) == 1
    await clean(db, tenant.namespace_id)


async def _tasks_made(flow: Flow) -> bool:
    await Engine(flow.db, owner="engine-errors", lease_ms=300, batch=8).run_once()
    return bool(await flow.tasks())


async def test_a_limit_refusal_fails_the_instance_with_task_rejected(
        db: Database, engine: Engine) -> None:
    """A parallel block whose tasks exceed the queue's unfinished-task limit: the task insert is
    refused in the advance; the instance fails instead of the advance being retried forever."""
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, parallel("ALL_SUCCEED", branches=3))
    await set_queue_limits(db, tenant, flow.queue.id, max_unfinished_tasks=2)
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"rejected": 1}
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    error = json.loads(instance["error"])
    assert error["error"] == "task_rejected"
    assert error["cause"].startswith("queue_full")
    assert await flow.tasks() == []
    await clean(db, tenant.namespace_id)


def _transactions(name: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_db_transaction_seconds_count", {"transaction": name}) or 0.0


async def test_a_round_advances_its_instances_in_one_transaction(
        db: Database, engine: Engine) -> None:
    """Five instances' results in one round: one advance transaction for all of them (each
    instance's advance whole in it), and each instance made exactly its next task."""
    tenant = await make_tenant(db)
    await drain(engine)
    flows = [await begin(db, tenant, LINEAR) for _ in range(5)]
    before = _transactions("weave.advance")
    done = await engine.run_once()
    assert done.outcomes == {"advanced": 5}
    assert _transactions("weave.advance") - before == 1
    for flow in flows:
        (first,) = await flow.tasks()
        await flow.end(first["id"], "ok", {"x": 3})
    before = _transactions("weave.advance")
    done = await engine.run_once()
    assert done.outcomes == {"advanced": 5}
    assert _transactions("weave.advance") - before == 1
    for flow in flows:
        assert [t["step"] for t in await flow.tasks()] == ["a", "b"]
        assert json.loads((await flow.tasks())[1]["input"]) == {"x2": 6}
    await clean(db, tenant.namespace_id)


async def test_a_refusal_in_a_batch_fails_its_instance_and_advances_the_others(
        db: Database, engine: Engine) -> None:
    """Two instances on a queue that takes them and one whose block exceeds its queue's limit,
    leased in one round: the batch's transaction is refused, each instance is then advanced
    alone -- the two make their tasks, the third fails with task_rejected."""
    tenant = await make_tenant(db)
    await drain(engine)
    fine = [await begin(db, tenant, LINEAR) for _ in range(2)]
    refused = await begin(db, tenant, parallel("ALL_SUCCEED", branches=3))
    await set_queue_limits(db, tenant, refused.queue.id, max_unfinished_tasks=2)
    done = await engine.run_once()
    assert done.outcomes == {"advanced": 2, "rejected": 1}
    for flow in fine:
        assert len(await flow.tasks()) == 1
    instance = await refused.instance()
    assert instance["state"] == "FAILED"
    assert json.loads(instance["error"])["error"] == "task_rejected"
    assert await refused.tasks() == []
    await clean(db, tenant.namespace_id)


# --- cancel intents for the tasks of closed blocks and ended instances --------------------------


def fail_fast(b_queue: str = "Q", *, recover: bool = True) -> dict[str, Any]:
    """A FAIL_FAST block of two one-task branches; branch b's task on ``b_queue`` (a queue the
    flow's worker does not claim from keeps it WAITING)."""
    branch_b = task("w.b", "ok_b")
    branch_b["queue"] = b_queue
    block: dict[str, Any] = {
        "kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
        "branches": [
            {"name": "a", "start": "t_a", "steps": {
                "t_a": task("w.a", "ok_a"), "ok_a": {"kind": "SUCCEED"}}},
            {"name": "b", "start": "t_b", "steps": {
                "t_b": branch_b, "ok_b": {"kind": "SUCCEED"}}}]}
    steps: dict[str, Any] = {"fan": block, "done": {"kind": "SUCCEED"}}
    if recover:
        block["on_failure"] = "recover"
        steps["recover"] = task("w.e", "failed")
        steps["failed"] = {"kind": "FAIL", "error": "recovered"}
    return doc(steps, "fan")


async def task_events(db: Database, task_id: bytes) -> list[tuple[str, Any]]:
    async def body(cur: Any) -> list[tuple[str, Any]]:
        await cur.execute("SELECT event_type, payload FROM orbit_events WHERE aggregate_type ="
                          " 'task' AND aggregate_id = %s ORDER BY aggregate_revision", (task_id,))
        return [(r["event_type"], json.loads(r["payload"])) for r in await cur.fetchall()]

    return await db.read("test.task_events", body)


async def task_state(flow: Flow, task_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT state, cancel_requested_at, cancel_reason FROM pulse_tasks"
                          " WHERE namespace_id = %s AND id = %s",
                          (flow.tenant.namespace_id, task_id))
        return dict(await cur.fetchone())

    return await flow.db.read("test.task_state", body)


async def outcome_of(flow: Flow, task_id: bytes) -> str | None:
    (row,) = [r for r in await flow.inbox() if r["task_id"] == task_id]
    return row["outcome"]  # type: ignore[no-any-return]


async def test_a_closed_block_cancels_a_waiting_branch_task_at_once(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    side = await make_queue(db, tenant, name="side", max_attempts=1)
    flow = await begin(db, tenant, fail_fast(side.name))
    await drain(engine)
    t_a, t_b = await flow.tasks()
    await flow.end(t_a["id"], "fail", "no")  # the flow's worker never claims from "side"
    await drain(engine)
    b = await task_state(flow, t_b["id"])
    assert (b["state"], b["cancel_reason"]) == ("CANCELLED", "workflow block closed")
    assert (await task_events(db, t_b["id"]))[-1] == (
        "task.cancelled", {"reason": "workflow block closed", "by": "workflow"})
    assert await outcome_of(flow, t_b["id"]) == "closed_block"
    steps = await flow.steps()
    assert (steps["fan"]["state"], steps["t_b"]["state"]) == ("FAILED", "CANCELLED")
    assert "ok_b" not in steps
    assert [t["step"] for t in await flow.tasks()] == ["t_a", "t_b", "recover"]
    script = {"w.a": ("fail", "no"), "w.b": ("ok", 1), "w.e": ("ok", {})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert (run.state.value, run.error["error"]) == ("FAILED", "recovered")
    await clean(db, tenant.namespace_id)


@pytest.mark.parametrize("worker_outcome", ["cancelled", "succeeded"])
async def test_a_closed_block_asks_a_running_branch_task_to_stop(
        db: Database, engine: Engine, worker_outcome: str) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, fail_fast())
    await drain(engine)
    t_a, t_b = await flow.tasks()
    await flow.end(t_a["id"], "fail", "no")  # claims and starts both
    await drain(engine)
    b = await task_state(flow, t_b["id"])
    assert b["state"] == "RUNNING"
    assert b["cancel_requested_at"] is not None
    assert b["cancel_reason"] == "workflow block closed"
    assert (await task_events(db, t_b["id"]))[-1] == (
        "task.cancel_requested", {"reason": "workflow block closed", "by": "workflow"})
    assert (await flow.steps())["t_b"]["state"] == "CANCELLED"
    # The worker stops (or its success commits first): the result is kept, never advanced.
    grant = flow.grants.pop(t_b["id"])
    if worker_outcome == "cancelled":
        (done,) = await finish(db, tenant, [report(grant, "cancelled",
                                                   error={"type": "stopped"})])
    else:
        (done,) = await finish(db, tenant, [report(grant, "succeeded", result="7")])
    assert done.task_state == worker_outcome.upper()
    await drain(engine)
    assert await outcome_of(flow, t_b["id"]) == "closed_block"
    steps = await flow.steps()
    assert (steps["t_b"]["state"], steps["fan"]["state"]) == ("CANCELLED", "FAILED")
    script = {"w.a": ("fail", "no"), "w.b": ("ok", 7), "w.e": ("ok", {})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert (run.state.value, run.error["error"]) == ("FAILED", "recovered")
    await clean(db, tenant.namespace_id)


@pytest.mark.parametrize("b_held", ["waiting", "running"])
async def test_a_failure_settlement_waits_for_the_in_flight_branch_task(
        db: Database, engine: Engine, b_held: str) -> None:
    """A FAIL_FAST block fails the instance while the other branch's task is in flight: the
    stop intent FAILURE is recorded, the gate closes for good and the task is asked to stop;
    the instance is STOPPING until that task's result is consumed (``stopping``: a success is
    recorded on its step, nothing advances), then FAILED with the first failure. A task still
    waiting for a worker is cancelled at once; its result settles the instance in the next
    round (docs/weave/stop.md)."""
    tenant = await make_tenant(db)
    side = await make_queue(db, tenant, name="side", max_attempts=1)
    flow = await begin(db, tenant, fail_fast("Q" if b_held == "running" else side.name,
                                             recover=False))
    await drain(engine)
    t_a, t_b = await flow.tasks()
    await flow.end(t_a["id"], "fail", "no")
    b = await task_state(flow, t_b["id"])
    assert b["state"] == ("RUNNING" if b_held == "running" else "WAITING")
    await engine.run_once()  # the failure: the stop intent, and no more
    stopping = await flow.instance()
    assert (stopping["state"], stopping["stop_kind"]) == ("STOPPING", "FAILURE")
    assert stopping["stop_requested_at"] is not None
    assert stopping["cancel_requested_at"] is None
    assert stopping["completed_at"] is None
    assert json.loads(stopping["error"])["step"] == "t_a"
    assert (await gate_of(flow))["state"] == "STOPPED"
    steps = await flow.steps()
    assert (steps["fan"]["state"], steps["t_b"]["state"]) == ("FAILED", "RUNNING")
    b = await task_state(flow, t_b["id"])
    asked = {"reason": "workflow instance failed", "by": "workflow"}
    if b_held == "waiting":
        assert b["state"] == "CANCELLED"
        assert (await task_events(db, t_b["id"]))[-1] == ("task.cancelled", asked)
    else:
        assert (b["state"], b["cancel_reason"]) == ("RUNNING", "workflow instance failed")
        assert (await task_events(db, t_b["id"]))[-1] == ("task.cancel_requested", asked)
        await drain(engine)
        assert (await flow.instance())["state"] == "STOPPING"  # waits for the worker
        await flow.end(t_b["id"], "ok", 5)
    await drain(engine)
    assert await outcome_of(flow, t_b["id"]) == "stopping"
    ended = await flow.instance()
    assert (ended["state"], ended["stop_kind"], ended["error"]) == (
        "FAILED", "FAILURE", stopping["error"])
    assert ended["stop_requested_at"] == stopping["stop_requested_at"]
    assert ended["completed_at"] is not None
    steps = await flow.steps()
    assert steps["t_b"]["state"] == ("SUCCEEDED" if b_held == "running" else "CANCELLED")
    assert "ok_b" not in steps  # recorded, never advanced
    assert await workflow_events(db, flow) == [
        "workflow.started", "workflow.advanced", "workflow.stopping", "workflow.failed"]
    await assert_matches(flow, {"w.a": ("fail", "no"), "w.b": ("ok", 5)})
    assert await invariants.check_db(db, [tenant.namespace_id]) == []
    await clean(db, tenant.namespace_id)


async def test_a_failure_with_nothing_in_flight_fails_at_once_with_its_stop_intent(
        db: Database, engine: Engine) -> None:
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, LINEAR)
    await drain(engine)
    (first,) = await flow.tasks()
    await flow.end(first["id"], "fail", "no")
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"advanced": 1}
    ended = await flow.instance()
    assert (ended["state"], ended["stop_kind"]) == ("FAILED", "FAILURE")
    assert ended["stop_requested_at"] == ended["completed_at"]
    assert ended["cancel_requested_at"] is None
    assert (await gate_of(flow))["state"] == "STOPPED"
    assert await workflow_events(db, flow) == [
        "workflow.started", "workflow.advanced", "workflow.failed"]
    await clean(db, tenant.namespace_id)


async def test_a_task_made_and_closed_in_one_advance_is_cancelled_at_once(
        db: Database, engine: Engine) -> None:
    """Branch a makes its task, branch b fails at once: the block closes in the same advance,
    and the task it just made is cancelled before any worker sees it."""
    tenant = await make_tenant(db)
    document = fail_fast()
    document["steps"]["fan"]["branches"][1] = {"name": "b", "start": "stop", "steps": {
        "stop": {"kind": "FAIL", "error": "stopped"}}}
    flow = await begin(db, tenant, document)
    await drain(engine)
    (t_a, recover) = await flow.tasks()
    assert recover["step"] == "recover"
    assert (await task_state(flow, t_a["id"]))["state"] == "CANCELLED"
    assert await outcome_of(flow, t_a["id"]) == "closed_block"
    script = {"w.a": ("ok", 1), "w.e": ("ok", {})}
    await play(flow, engine, script)
    run = await assert_matches(flow, script)
    assert (run.state.value, run.error["error"]) == ("FAILED", "recovered")
    await clean(db, tenant.namespace_id)


async def test_a_rejected_advance_cancels_the_live_tasks_of_the_failed_instance(
        db: Database, engine: Engine) -> None:
    """The instance fails with task_rejected (a step's queue is gone) while another branch's
    task runs: that task gets the intent in the failing transaction."""
    tenant = await make_tenant(db)
    side = await make_queue(db, tenant, name="side", max_attempts=1)
    document = parallel("ALL_SUCCEED", branches=2)
    document["steps"]["fan"]["branches"][1]["steps"]["t_b1"]["next"] = "elsewhere"
    document["steps"]["fan"]["branches"][1]["steps"]["elsewhere"] = {
        **task("w.c", "ok_b1"), "queue": side.name}
    flow = await begin(db, tenant, document)
    await drain(engine)
    t_b0, t_b1 = await flow.tasks()
    await db.transaction("test.drop_queue", lambda cur: cur.execute(
        "UPDATE pulse_queues SET name = 'side-gone' WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, side.id)))
    await flow.end(t_b1["id"], "ok", 1)  # claims and starts t_b0 too
    rounds = await drain(engine)
    assert rounds[0].outcomes == {"rejected": 1}
    assert json.loads((await flow.instance())["error"])["error"] == "task_rejected"
    b0 = await task_state(flow, t_b0["id"])
    assert (b0["state"], b0["cancel_reason"]) == ("RUNNING", "workflow instance failed")
    assert (await flow.instance())["state"] == "STOPPING"  # t_b0 is in flight
    await flow.end(t_b0["id"], "ok", 0)
    await drain(engine)
    assert await outcome_of(flow, t_b0["id"]) == "stopping"
    ended = await flow.instance()
    assert (ended["state"], ended["stop_kind"]) == ("FAILED", "FAILURE")
    assert json.loads(ended["error"])["error"] == "task_rejected"
    assert (await flow.steps())["t_b0"]["state"] == "SUCCEEDED"
    await clean(db, tenant.namespace_id)


async def test_cancel_intents_race_workers_api_cancels_and_two_engines(db: Database) -> None:
    """FAIL_FAST blocks close while workers finish the other branches' tasks, the API cancels
    some of them and two engines advance: every lock order meets (engine: instance -> tasks ->
    counters; worker: task -> attempt -> counters; API: idempotency -> task -> counters); no
    advance fails, every result is consumed once, every instance fails with its first branch's
    failure and the invariants hold."""
    tenant = await make_tenant(db)
    rng = random.Random(7)
    engines = [Engine(db, owner=f"engine-race-{i}", batch=4) for i in range(2)]
    flows = [await begin(db, tenant, parallel("FAIL_FAST", branches=6)) for _ in range(4)]
    await drain(engines[0])
    made = {}
    for flow in flows:
        made[flow.instance_id] = await flow.tasks()
        grants = await claim(db, flow.session, flow.queue)
        await start(db, tenant, grants)
        flow.grants.update({g.task_id: g for g in grants})
        assert len(flow.grants) == 6
    who = await principal(db, tenant.api_key)
    workers_done = asyncio.Event()
    seen: list[str] = []

    async def work(flow: Flow) -> None:
        first, *rest = made[flow.instance_id]
        rng.shuffle(rest)
        await flow.end(first["id"], "fail", "first")
        for t in rest:
            await flow.end(t["id"], "ok", t["sequence"])

    async def cancel_some(flow: Flow) -> None:
        for t in rng.sample(made[flow.instance_id][1:], 3):
            await interventions.cancel_task(db, who, namespace=tenant.namespace,
                                            task_id=t["id"], reason="race")

    async def advance(engine: Engine) -> None:
        while True:
            done = await engine.run_once()
            seen.extend(o for o, n in done.outcomes.items() for _ in range(n))
            if workers_done.is_set() and done.inbox == 0 and done.advances == 0:
                return
            await asyncio.sleep(0)

    async def people() -> None:
        await asyncio.gather(*(work(f) for f in flows), *(cancel_some(f) for f in flows))
        workers_done.set()

    await asyncio.gather(people(), *(advance(e) for e in engines))
    await drain(engines[0])
    assert "error" not in seen
    assert set(seen) <= {"advanced", "closed_block", "instance_ended", "stopping"}
    for flow in flows:
        instance = await flow.instance()
        assert instance["state"] == "FAILED"
        assert json.loads(instance["error"])["step"] == "t_b0"
        assert {t["state"] for t in await flow.tasks()} <= {"SUCCEEDED", "FAILED", "CANCELLED"}
        assert {r["state"] for r in await flow.inbox()} == {"CONSUMED"}
    await clean(db, tenant.namespace_id)

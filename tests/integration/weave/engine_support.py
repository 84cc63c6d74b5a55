"""Driving workflow instances through the engine with the kernel's own lease protocol: queues,
a published definition, a started instance, a worker session that claims, starts and finishes
the instance's tasks, and the comparison with the reference interpreter."""

from __future__ import annotations

import json
from typing import Any

import attrs

from orbit_common.db.pool import Database
from orbit_common.pulse.leases import Grant
from orbit_common.pulse.workers import QueueRef, Session
from orbit_common.weave import definitions, instances, interpreter, language
from orbit_common.weave.engine import Engine, Round
from tests.conftest import Tenant, unique
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.support import principal
from tests.support.lease_fixtures import make_queue, open_session, wait_db_time_past

HANDLERS = ("w.a", "w.b", "w.c", "w.d", "w.e", "w.f")


def doc(steps: dict[str, Any], start_step: str, *, input_schema: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    return {"format": "orbit.weave/1",
            "input_schema": input_schema or {"type": "object",
                                             "properties": {"n": {"type": "integer"}},
                                             "required": ["n"]},
            "start": start_step, "steps": steps}


def task(handler: str, nxt: str, **extra: Any) -> dict[str, Any]:
    """A TASK step on the queue named ``Q`` (replaced by the scenario's queue)."""
    return {"kind": "TASK", "queue": "Q", "handler": handler, "next": nxt, **extra}


def _queue_names(value: Any, queue: str) -> Any:
    if isinstance(value, dict):
        return {k: (queue if k == "queue" and v == "Q" else _queue_names(v, queue))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_queue_names(v, queue) for v in value]
    return value


async def publish(db: Database, tenant: Tenant, queue: str, document: dict[str, Any],
                  name: str | None = None, revision: int = 1) -> str:
    who = await principal(db, tenant.api_key)
    name = name or unique("wf")
    if revision == 1:
        await definitions.create_definition(db, who, namespace=tenant.namespace, name=name)
    await definitions.publish_version(db, who, namespace=tenant.namespace, name=name,
                                      revision=revision,
                                      document=json.dumps(_queue_names(document, queue)).encode())
    return name


@attrs.define
class Flow:
    """One instance and the worker that runs its tasks."""

    db: Database
    tenant: Tenant
    queue: QueueRef
    session: Session
    name: str
    instance_id: bytes
    document: dict[str, Any]
    input: Any
    grants: dict[bytes, Grant] = attrs.field(factory=dict)
    more_queues: list[QueueRef] = attrs.field(factory=list)

    def timer_steps(self) -> set[str]:
        """The names of the TIMER steps of the document (every scope)."""
        found: set[str] = set()

        def walk(steps: dict[str, Any]) -> None:
            for name, body in steps.items():
                if body.get("kind") == "TIMER":
                    found.add(name)
                for branch in body.get("branches", []):
                    walk(branch["steps"])

        walk(self.document["steps"])
        return found

    async def tasks(self) -> list[dict[str, Any]]:
        """The instance's tasks in creation order (the sequence the engine recorded)."""
        async def body(cur: Any) -> list[dict[str, Any]]:
            await cur.execute(
                "SELECT t.id, t.state, t.handler, t.input, t.revision, e.payload"
                " FROM pulse_tasks t JOIN orbit_events e ON e.namespace_id = t.namespace_id"
                " AND e.aggregate_type = 'task' AND e.aggregate_id = t.id"
                " AND e.aggregate_revision = 1"
                " WHERE t.namespace_id = %s AND t.owner_kind = 'WORKFLOW' AND t.owner_id = %s",
                (self.tenant.namespace_id, self.instance_id))
            found = []
            for r in await cur.fetchall():
                payload = json.loads(r["payload"])["workflow"]
                found.append({**dict(r), "step": payload["step"],
                              "sequence": payload["sequence"]})
            return sorted(found, key=lambda r: r["sequence"])
        return await self.db.read("test.flow.tasks", body)

    async def end(self, task_id: bytes, outcome: str, result: Any = None) -> None:
        """Claim (everything waiting), start and finish ``task_id`` as a worker would."""
        while task_id not in self.grants:  # a claim grants at most 32 tasks
            claimed = 0
            for queue in (self.queue, *self.more_queues):
                grants = await claim(self.db, self.session, queue)
                if grants:
                    await start(self.db, self.tenant, grants)
                self.grants.update({g.task_id: g for g in grants})
                claimed += len(grants)
            if not claimed:
                raise AssertionError(f"task {task_id.hex()} cannot be claimed")
        grant = self.grants.pop(task_id)
        if outcome == "ok":
            await finish(self.db, self.tenant, [report(grant, "succeeded",
                                                       result=json.dumps(result))])
        elif outcome == "fail":
            await finish(self.db, self.tenant, [report(
                grant, "failed", error={"type": "boom", "message": f"{result}"})])
        else:
            await finish(self.db, self.tenant, [report(
                grant, "unknown", error={"type": "lost", "message": "?"})])

    async def instance(self) -> dict[str, Any]:
        async def body(cur: Any) -> dict[str, Any]:
            await cur.execute("SELECT * FROM weave_instances WHERE namespace_id = %s AND id = %s",
                              (self.tenant.namespace_id, self.instance_id))
            return dict(await cur.fetchone())
        return await self.db.read("test.flow.instance", body)

    async def steps(self) -> dict[str, dict[str, Any]]:
        async def body(cur: Any) -> dict[str, dict[str, Any]]:
            await cur.execute("SELECT * FROM weave_steps WHERE namespace_id = %s"
                              " AND instance_id = %s", (self.tenant.namespace_id,
                                                        self.instance_id))
            return {r["name"]: dict(r) for r in await cur.fetchall()}
        return await self.db.read("test.flow.steps", body)

    async def waits(self, *, waiting: bool = False) -> list[dict[str, Any]]:
        """The instance's wait rows (``waiting``: only WAITING ones), with their pending
        advance's id as ``advance_id``."""
        async def body(cur: Any) -> list[dict[str, Any]]:
            await cur.execute(
                "SELECT w.*, p.id AS advance_id, p.created_at AS advance_created_at"
                " FROM weave_waits w LEFT JOIN weave_pending_advances p"
                " ON p.namespace_id = w.namespace_id AND p.instance_id = w.instance_id"
                " AND p.step_id = w.step_id AND p.kind = w.kind"
                " WHERE w.namespace_id = %s AND w.instance_id = %s"
                + (" AND w.state = 'WAITING'" if waiting else "")
                + " ORDER BY w.created_at, w.id", (self.tenant.namespace_id, self.instance_id))
            return [dict(r) for r in await cur.fetchall()]
        return await self.db.read("test.flow.waits", body)

    async def fired_order(self) -> list[str]:
        """The TIMER steps in the order the engine fired them: by fire time (one advance's
        database time), and within one advance in the order it handled its rows (its pending
        advances by creation, then id)."""
        steps = {s["id"]: name for name, s in (await self.steps()).items()}
        fired = [w for w in await self.waits() if w["state"] == "FIRED"]
        fired.sort(key=lambda w: (w["fired_at"], w["advance_created_at"], w["advance_id"]))
        return [steps[w["step_id"]] for w in fired]

    async def inbox(self) -> list[dict[str, Any]]:
        async def body(cur: Any) -> list[dict[str, Any]]:
            await cur.execute("SELECT * FROM weave_inbox WHERE namespace_id = %s"
                              " AND instance_id = %s ORDER BY created_at, id",
                              (self.tenant.namespace_id, self.instance_id))
            return [dict(r) for r in await cur.fetchall()]
        return await self.db.read("test.flow.inbox", body)


async def gate_of(flow: Flow) -> dict[str, Any]:
    """The instance's execution gate row."""
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT g.* FROM pulse_execution_gates g JOIN weave_instances i"
                          " ON i.namespace_id = g.namespace_id AND i.gate_id = g.id"
                          " WHERE i.namespace_id = %s AND i.id = %s",
                          (flow.tenant.namespace_id, flow.instance_id))
        return dict(await cur.fetchone())
    return await flow.db.read("test.flow.gate", body)


async def workflow_events(db: Database, flow: Flow) -> list[str]:
    """The types of the instance's own events, in order."""
    async def body(cur: Any) -> list[str]:
        await cur.execute("SELECT event_type FROM orbit_events WHERE namespace_id = %s"
                          " AND aggregate_type = 'workflow_instance' AND aggregate_id = %s"
                          " ORDER BY aggregate_revision, occurred_at",
                          (flow.tenant.namespace_id, flow.instance_id))
        return [r["event_type"] for r in await cur.fetchall()]
    return await db.read("test.flow.events", body)


async def begin(db: Database, tenant: Tenant, document: dict[str, Any],
                workflow_input: Any = None) -> Flow:
    queue = await make_queue(db, tenant, max_attempts=1)
    name = await publish(db, tenant, queue.name, document)
    workflow_input = {"n": 1} if workflow_input is None else workflow_input
    started = await instances.start_instance(
        db, await principal(db, tenant.api_key), namespace=tenant.namespace, definition=name,
        input_json=json.dumps(workflow_input).encode())
    session = await open_session(db, tenant, [queue], handlers=HANDLERS, max_in_flight=256)
    return Flow(db=db, tenant=tenant, queue=queue, session=session, name=name,
                instance_id=bytes.fromhex(started.body["id"]), document=document,
                input=workflow_input)


async def fire_due_timers(flow: Flow, engine: Engine) -> None:
    """Until the instance has no WAITING timer: wait for the database clock to pass the
    latest deadline, then drain."""
    while waiting := [w for w in await flow.waits(waiting=True) if w["kind"] == "TIMER"]:
        await wait_db_time_past(flow.db, max(w["deadline_at"] for w in waiting))
        await drain(engine)


async def drain(engine: Engine) -> list[Round]:
    """Rounds until one leases nothing."""
    rounds = []
    while True:
        done = await engine.run_once()
        rounds.append(done)
        if done.inbox == 0 and done.advances == 0 and done.signals == 0:
            return rounds


# A task that no longer waits for a worker (NEEDS_REVIEW: a cancel of a task that carried an
# uncertain effect, or a worker's unknown outcome).
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW")
# An instance the engine still advances: running, or stopping (docs/weave/stop.md: a failure
# settlement waits for the results of its in-flight tasks).
ACTIVE = ("RUNNING", "STOPPING")
Script = dict[str, tuple[str, Any]]  # handler -> ("ok", result) | ("fail", message) | ("review",)


async def play(flow: Flow, engine: Engine, script: Script) -> None:
    """Deliver results oldest task first (the interpreter's default order), one advance each,
    while the instance runs or stops."""
    await drain(engine)
    ended: set[bytes] = set()
    while (await flow.instance())["state"] in ACTIVE:
        pending = [t for t in await flow.tasks() if t["id"] not in ended]
        if not pending:
            return
        chosen = pending[0]
        ended.add(chosen["id"])
        if chosen["state"] in ENDED:
            # Ended already: by the engine's cancel before any worker held it (a closed block,
            # an ended instance), or by the test before it played on. Its result is in the
            # inbox.
            await drain(engine)
            continue
        outcome = script[chosen["handler"]]
        await flow.end(chosen["id"], outcome[0], outcome[1] if len(outcome) > 1 else None)
        await drain(engine)


async def predicted(flow: Flow, script: Script,
                    signals: interpreter.Signals | None = None) -> interpreter.Run:
    """What the reference interpreter predicts, with the engine's frozen task errors (and, for
    SIGNAL steps, ``signals``: which signals arrive)."""
    errors_by_step = await frozen_errors(flow)
    by_sequence = {t["sequence"]: t for t in await flow.tasks()}
    parsed = language.validate_document(_queue_names(flow.document, flow.queue.name))

    def outcome(call: interpreter.TaskCall) -> interpreter.Outcome:
        task = by_sequence[call.seq]
        if task["state"] == "CANCELLED":  # the engine's cancel won before the script played
            return interpreter.Failed(error=errors_by_step.get(task["id"].hex()))
        spec = script[call.handler]
        if spec[0] == "ok":
            return interpreter.Succeeded(result=spec[1])
        if spec[0] == "fail":
            task_id = by_sequence[call.seq]["id"].hex()
            return interpreter.Failed(error=errors_by_step.get(task_id))
        return interpreter.NeedsReview()

    return interpreter.run(parsed, flow.input, outcome, signals=signals)


async def assert_matches(flow: Flow, script: Script,
                         signals: interpreter.Signals | None = None) -> interpreter.Run:
    """The engine made the interpreter's tasks (in order, with the same inputs) and reached its
    final state, output, error and step results."""
    run = await predicted(flow, script, signals)
    await assert_same(flow, run)
    return run


async def frozen_errors(flow: Flow) -> dict[str, Any]:
    """Each ended task's frozen error (by task id, hex), as its inbox row's snapshot holds it."""
    found: dict[str, Any] = {}
    for row in await flow.inbox():
        snapshot = json.loads(row["snapshot"])
        found[snapshot["task_id"]] = snapshot.get("error")
    return found


async def assert_same(flow: Flow, run: interpreter.Run) -> None:
    """The engine's tasks, final state, output, error and step results are ``run``'s."""
    made = await flow.tasks()
    assert [(t["sequence"], t["step"], t["handler"], json.loads(t["input"])) for t in made] == [
        (c.seq, c.step, c.handler, c.input) for c in run.tasks]
    instance = await flow.instance()
    assert instance["state"] == run.state.value
    assert (json.loads(instance["output"]) if instance["output"] else None) == run.output
    assert (json.loads(instance["error"]) if instance["error"] else None) == run.error
    steps = await flow.steps()
    results = {name: json.loads(s["output"]) for name, s in steps.items()
               if s["state"] == "SUCCEEDED"
               and s["kind"] in ("TASK", "PARALLEL", "SIGNAL", "POLL")}
    timers = {name for name, s in steps.items()
              if s["state"] == "SUCCEEDED" and s["kind"] == "TIMER"}
    # A timer's result holds database times: the same steps fired, the values are the engine's.
    predicted_timers = set(run.results) & flow.timer_steps()
    assert results == {k: v for k, v in run.results.items() if k not in predicted_timers}
    assert timers == predicted_timers
    # Steps held by a $hold transition: WAITING, with the error they would have propagated.
    held = {name: json.loads(s["held_error"]) for name, s in steps.items()
            if s["held_at"] is not None}
    assert all(steps[name]["state"] == "WAITING" for name in held)
    assert held == run.held

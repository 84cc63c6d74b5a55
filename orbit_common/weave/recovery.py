"""Manual recovery of a workflow step: retry a TASK step, resolve a step (issue 16; 000 §1
invariant 8; docs/weave/recovery.md).

Each is one transaction, in the one lock order (docs/architecture.md):

1. the idempotency identity (``Idempotency-Key``: a replay returns the original receipt);
2. the instance row ``FOR UPDATE`` -- every advance of the instance locks it first, so the
   action waits for an advance in flight and every later advance sees what it wrote; the
   instance must be ``RUNNING`` (paused or not), else ``workflow_instance_not_running``;
3. the step row (by name, ``FOR UPDATE``; ``workflow_step_not_found``) with the compare-and-set
   on its revision (``stale_revision``), then its activations;
4. the tasks of its activations (id order, locked with the step); the step's writes (new
   activation, resolution, RESOLVE advance); a retry's new task with its queue and application
   counters; last, a task in ``NEEDS_REVIEW`` is reviewed through the kernel's one ending writer
   (its execution conclusion, with the evidence; its result reaches the engine's inbox and is
   kept, never advanced: ``stale``) -- the result stream it appends to ends the lock order.

**Retry** (TASK steps; :func:`retry_step`): allowed when the step is WAITING and its LIVE
activation's task is ``NEEDS_REVIEW`` (reviewed ``failed`` here) or the step is held
(``$hold``) after its task ended ``FAILED`` or ``CANCELLED``; else ``step_not_retryable``. The
old activation becomes ``SUPERSEDED`` (kept with its task and evidence); a new activation
(sequence + 1) is LIVE with a new task ``retry_of`` the old one: same queue, handler, input and
policies, owned by the instance, behind its gate. Its ``max_attempts`` is the original budget
(the first activation's task's ``max_attempts``) minus the starts used by **all** the step's
tasks plus ``additional_attempts`` (at least 1, else ``step_not_retryable``); its absolute
``deadline_at`` is the first task's, unchanged (already past: ``step_not_retryable``). The step
is RUNNING again, its hold cleared.

**Resolve** (any held step, or a TASK step whose task is ``NEEDS_REVIEW``; :func:`resolve_step`):
records the task's review (``task_decision``) and, separately, the step's logical conclusion
(``weave_steps.resolution``), then writes a ``RESOLVE`` pending advance on the step: the engine
advances the step as if it had succeeded with ``output`` or failed with ``error`` (a failure
follows the step's own failure transition, never ``$hold`` again: without one it propagates to
the scope). Else ``step_not_resolvable``.

Both write an audit record (actor, reason, evidence, before/after) and one event on the step's
aggregate (``workflow_step``) that names the instance (``workflow_id``: the instance timeline
shows it).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event, append_events
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import resources
from orbit_common.pulse.interventions import ConfirmationRequired
from orbit_common.pulse.leases import common, decisions, endings
from orbit_common.pulse.model import TaskState
from orbit_common.weave import definitions, instances, operator, types
from orbit_common.weave.language import ERROR_CODE, ERROR_CODE_RULE, PollStep, TaskStep

REASON_MAX = 1024
ADDITIONAL_MAX = 100
CONCLUSIONS = ("succeeded", "failed")
RETRY = "retry"
RESOLVE = "resolve"


class StepNotRetryable(errors.Conflict):
    code = "step_not_retryable"
    title = "This step cannot be retried now"


class StepNotResolvable(errors.Conflict):
    code = "step_not_resolvable"
    title = "This step cannot be resolved now"


class InstanceNotRunning(errors.Conflict):
    code = "workflow_instance_not_running"
    title = "The workflow instance is not running"


@attrs.frozen(kw_only=True)
class Done:
    """A recovery's answer: the receipt (``replay``: the original one on a replay) and whether
    this call committed it (``fresh``; False for a replay of an earlier call)."""

    replay: Replay
    fresh: bool


# --- the requests -------------------------------------------------------------------------------


def _text(value: Any, path: str, problems: list[dict[str, str]], *, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not 1 <= len(value) <= REASON_MAX:
        problems.append({"path": path, "message": f"required: a string of 1-{REASON_MAX}"
                                                  " characters" if required else
                         f"a string of 1-{REASON_MAX} characters"})


def _revision(value: Any, problems: list[dict[str, str]]) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append({"path": "$.step_revision",
                         "message": "required: the step's revision as read, an integer ≥ 1"})


@attrs.frozen(kw_only=True)
class RetryRequest:
    reason: str
    step_revision: int
    evidence_ref: str | None = None
    execution_ended: bool | None = None
    additional_attempts: int = 0

    @classmethod
    def check(cls, *, reason: Any, step_revision: Any, evidence_ref: Any = None,
              execution_ended: Any = None, additional_attempts: Any = None) -> RetryRequest:
        """The body's fields (docs/weave/recovery.md § 重试); what depends on the step's state
        (evidence and the confirmation for a NEEDS_REVIEW task) is checked in the
        transaction."""
        problems: list[dict[str, str]] = []
        _text(reason, "$.reason", problems, required=True)
        _text(evidence_ref, "$.evidence_ref", problems, required=False)
        _revision(step_revision, problems)
        if execution_ended is not None and not isinstance(execution_ended, bool):
            problems.append({"path": "$.execution_ended", "message": "a boolean"})
        extra = 0 if additional_attempts is None else additional_attempts
        if (isinstance(extra, bool) or not isinstance(extra, int)
                or not 0 <= extra <= ADDITIONAL_MAX):
            problems.append({"path": "$.additional_attempts",
                             "message": f"an integer 0-{ADDITIONAL_MAX}"})
        if problems:
            raise errors.ValidationFailed(problems)
        return cls(reason=reason, step_revision=step_revision, evidence_ref=evidence_ref,
                   execution_ended=execution_ended, additional_attempts=extra)

    def digest_body(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class ResolveRequest:
    reason: str
    evidence_ref: str
    step_revision: int
    conclusion: str
    output: Any = None
    has_output: bool = False
    error: str | None = None
    task_decision: str | None = None
    execution_ended: bool | None = None

    @classmethod
    def check(cls, *, reason: Any, evidence_ref: Any, step_revision: Any, conclusion: Any,
              output: Any = None, has_output: bool = False, error: Any = None,
              task_decision: Any = None, execution_ended: Any = None) -> ResolveRequest:
        """The body's fields (docs/weave/recovery.md § 记录结论); the output's shape and what
        a NEEDS_REVIEW task needs are checked in the transaction."""
        problems: list[dict[str, str]] = []
        _text(reason, "$.reason", problems, required=True)
        _text(evidence_ref, "$.evidence_ref", problems, required=True)
        _revision(step_revision, problems)
        if conclusion not in CONCLUSIONS:
            problems.append({"path": "$.conclusion", "message": "succeeded or failed"})
        elif conclusion == "succeeded":
            if error is not None:
                problems.append({"path": "$.error", "message": "only with conclusion failed"})
        else:
            if has_output:
                problems.append({"path": "$.output",
                                 "message": "only with conclusion succeeded"})
            if not isinstance(error, str) or not ERROR_CODE.match(error):
                problems.append({"path": "$.error",
                                 "message": f"required with conclusion failed: {ERROR_CODE_RULE}"})
        if task_decision is not None and task_decision not in CONCLUSIONS:
            problems.append({"path": "$.task_decision", "message": "succeeded or failed"})
        if execution_ended is not None and not isinstance(execution_ended, bool):
            problems.append({"path": "$.execution_ended", "message": "a boolean"})
        if problems:
            raise errors.ValidationFailed(problems)
        return cls(reason=reason, evidence_ref=evidence_ref, step_revision=step_revision,
                   conclusion=conclusion, output=output, has_output=has_output, error=error,
                   task_decision=task_decision, execution_ended=execution_ended)

    def digest_body(self) -> dict[str, Any]:
        return attrs.asdict(self)


# --- shared -------------------------------------------------------------------------------------

LOCK_INSTANCE = ("SELECT id, definition_id, version, version_digest, state, paused, gate_id"
                 " FROM weave_instances WHERE namespace_id = %s AND id = %s FOR UPDATE")
LOCK_STEP = ("SELECT * FROM weave_steps WHERE namespace_id = %s AND instance_id = %s"
             " AND name = %s FOR UPDATE")
LOCK_ACTIVATIONS = ("SELECT * FROM weave_activations WHERE namespace_id = %s"
                    " AND instance_id = %s AND step_id = %s ORDER BY sequence FOR UPDATE")
STEP_ACTIVATIONS = ("SELECT * FROM weave_activations WHERE namespace_id = %s"
                    " AND instance_id = %s AND step_id = %s ORDER BY sequence")
READ_STEP = "SELECT * FROM weave_steps WHERE namespace_id = %s AND instance_id = %s AND id = %s"


@attrs.frozen
class _Located:
    instance: dict[str, Any]
    step: dict[str, Any]
    activations: list[dict[str, Any]]
    live: dict[str, Any] | None  # the LIVE activation
    tasks: dict[bytes, dict[str, Any]]  # the activations' tasks, locked


def _instance_id(instance_id: str) -> bytes:
    try:
        return ids.from_hex(instance_id)
    except ValueError:
        return bytes(16)  # authorization first; then the 404 of an unknown instance


async def lock_step(cur: Any, namespace_id: bytes, instance_id: bytes, name: str,
                    revision: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The instance and the step, locked in that order, with the refusals every recovery
    shares, in this order: an unknown instance or step (``$root`` is none: 404), an instance
    that is not RUNNING, a stale step revision. Used by the wait recoveries too."""
    await cur.execute(LOCK_INSTANCE, (namespace_id, instance_id))
    instance = await cur.fetchone()
    if instance is None:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")
    await cur.execute(LOCK_STEP, (namespace_id, instance_id, name))
    step = await cur.fetchone()
    if step is None or step["kind"] == "ROOT":
        raise instances.StepNotFound("no step of this name has run in this instance")
    if instance["state"] != "RUNNING":
        raise InstanceNotRunning(
            f"workflow instance {instance_id.hex()} is {instance['state']}: a step is "
            "recovered only while its instance runs")
    if step["revision"] != revision:
        raise errors.StaleRevision(
            f"the step is at revision {step['revision']}, not {revision}; read it again",
            current_revision=step["revision"])
    return dict(instance), dict(step)


async def _locate(cur: Any, namespace_id: bytes, instance_id: bytes, name: str,
                  revision: int) -> _Located:
    instance, step = await lock_step(cur, namespace_id, instance_id, name, revision)
    await cur.execute(LOCK_ACTIVATIONS, (namespace_id, instance_id, step["id"]))
    activations = [dict(r) for r in await cur.fetchall()]
    live = next((a for a in activations if a["state"] == "LIVE"), None)
    task_ids = [a["task_id"] for a in activations if a["task_id"] is not None]
    tasks = {t["id"]: t for t in await common.lock_tasks(cur, namespace_id, task_ids)}
    return _Located(instance=dict(instance), step=dict(step), activations=activations,
                    live=live, tasks=tasks)


def _live_task(found: _Located) -> dict[str, Any] | None:
    if found.live is None or found.live["task_id"] is None:
        return None
    return found.tasks.get(found.live["task_id"])


async def _review(cur: Any, namespace_id: bytes, task: dict[str, Any], decision: str, *,
                  reason: str, evidence_ref: str, by: str, now: dt.datetime) -> None:
    """The task's execution conclusion (a NEEDS_REVIEW task), through the one ending writer."""
    await endings.write(cur, namespace_id, [endings.Ending(
        task=task, attempt=None, decision=decisions.decide_review(decision),
        payload={"reason": reason, "evidence_ref": evidence_ref, "by": by},
        snapshot_extra={"review": {"reason": reason, "evidence_ref": evidence_ref,
                                   "by": by}})], now)


async def step_view(cur: Any, namespace_id: bytes, instance_id: bytes,
                    step_id: bytes) -> dict[str, Any]:
    """The step with every activation and what each task's result has become."""
    await cur.execute(READ_STEP, (namespace_id, instance_id, step_id))
    step = dict(await cur.fetchone())
    await cur.execute(STEP_ACTIVATIONS, (namespace_id, instance_id, step_id))
    activations = [dict(a) for a in await cur.fetchall()]
    results = await instances.task_results(
        cur, namespace_id, [a["task_id"] for a in activations if a["task_id"] is not None])
    return {"workflow_id": instance_id.hex(), **instances.step_view(step, activations, results)}


async def _step_event(cur: Any, namespace_id: bytes, found: _Located, event_type: str, *,
                      to_state: str, payload: dict[str, Any]) -> None:
    await append_event(cur, namespace_id=namespace_id, aggregate_type="workflow_step",
                       aggregate_id=found.step["id"],
                       aggregate_revision=found.step["revision"] + 1, event_type=event_type,
                       from_state=found.step["state"], to_state=to_state,
                       payload={"workflow_id": found.instance["id"].hex(),
                                "step": found.step["name"], **payload})


def _actor_json(actor: Actor) -> dict[str, str]:
    return {"kind": actor.kind.value, "id": actor.id}


Act = Callable[[Any, bytes], Awaitable[tuple[int, dict[str, Any], bytes]]]


async def _as_principal(db: Database, name: str, principal: credentials.Principal, *,
                        namespace: str, idem: Any, act: Act) -> Done:
    fresh: list[bool] = []

    async def acted(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        fresh[:] = [True]
        return await act(cur, namespace_id)

    replay = await namespaced.run(db, name, principal=principal,
                                  action=authz.Action.WORKFLOWS_CONTROL, namespace=namespace,
                                  idem=idem, act=acted)
    return Done(replay=replay, fresh=bool(fresh))


async def _as_operator(db: Database, name: str, namespace: str,
                       act: Callable[[Any, bytes, bytes], Awaitable[
                           tuple[int, dict[str, Any], bytes]]]) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        ns = await operator.namespace_of(cur, namespace)
        _, view, _ = await act(cur, ns.id, ns.application_id)
        return view

    return await db.transaction(name, body)


# --- retry --------------------------------------------------------------------------------------

# The new task: the old one's work and frozen policies, owned by the instance behind its gate;
# its budget and absolute deadline computed by the retry. Parameters: now, now, deadline_at,
# start_deadline_at, max_attempts, new id, namespace id, old task id.
RETRY_INSERT = """
INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, revision, priority,
  available_at, business_key, concurrency_key, concurrency_key_digest, deadline_at,
  start_deadline_at, attempt_timeout_ms, max_attempts,
  retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter, offer_lease_ms,
  execution_lease_ms, rerun_safe, retry_of, owner_kind, owner_id, workflow_gate_id, created_at,
  updated_at)
SELECT o.namespace_id, v.new_id, o.queue_id, o.handler, o.input, 'WAITING', 1, o.priority,
  v.now, o.business_key, o.concurrency_key, o.concurrency_key_digest, v.deadline_at,
  v.start_deadline_at, o.attempt_timeout_ms, v.max_attempts, o.retry_initial_ms,
  o.retry_max_ms, o.retry_multiplier, o.retry_jitter, o.offer_lease_ms, o.execution_lease_ms,
  o.rerun_safe, o.id, o.owner_kind, o.owner_id, o.workflow_gate_id, v.now, v.now
FROM (SELECT %s AS now, %s AS deadline_at, %s AS start_deadline_at, %s AS max_attempts,
             %s AS new_id) v
JOIN pulse_tasks o ON o.namespace_id = %s AND o.id = %s
"""
TASK_CREATED = "SELECT created_at FROM pulse_tasks WHERE namespace_id = %s AND id = %s"
OWNED_TASKS = ("SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
               " AND owner_kind = 'WORKFLOW' AND owner_id = %s")
SUPERSEDE = ("UPDATE weave_activations SET state = 'SUPERSEDED', live_step_id = NULL,"
             " ended_at = %s WHERE namespace_id = %s AND id = %s AND state = 'LIVE'")
INSERT_ACTIVATION = ("INSERT INTO weave_activations (namespace_id, instance_id, step_id, id,"
                     " sequence, state, live_step_id, task_id, created_at)"
                     " VALUES (%s, %s, %s, %s, %s, 'LIVE', %s, %s, %s)")
STEP_RETRIED = ("UPDATE weave_steps SET state = 'RUNNING', revision = revision + 1,"
                " activation_count = activation_count + 1, live_activation_id = %s,"
                " error = NULL, held_at = NULL, held_error = NULL, updated_at = %s"
                " WHERE namespace_id = %s AND instance_id = %s AND id = %s AND revision = %s")


def _retryable(found: _Located, request: RetryRequest) -> tuple[dict[str, Any], bool]:
    """The live task to retry and whether it awaits review; else ``step_not_retryable``."""
    step = found.step
    name = step["name"]
    if step["kind"] != "TASK":
        raise StepNotRetryable(f"step {name!r} is a {step['kind']} step: only a TASK step is "
                               "retried (resolve it instead)")
    if step["state"] != "WAITING":
        raise StepNotRetryable(f"step {name!r} is {step['state']}: a TASK step is retried "
                               "only while it waits for a person (its task in NEEDS_REVIEW, "
                               "or held after its task failed)")
    if step["resolution"] is not None:
        raise StepNotRetryable(f"step {name!r} has a recorded conclusion; the engine "
                               "advances it")
    task = _live_task(found)
    if task is None:
        raise StepNotRetryable(f"step {name!r} has no task to retry (held before its task "
                               "was made: resolve it instead)")
    state = task["state"]
    if state == TaskState.NEEDS_REVIEW.value:
        missing = []
        if request.evidence_ref is None:
            missing.append({"path": "$.evidence_ref",
                            "message": "required: the task is in NEEDS_REVIEW"})
        if missing:
            raise errors.ValidationFailed(missing)
        if request.execution_ended is not True:
            raise ConfirmationRequired("the task is in NEEDS_REVIEW: set execution_ended to "
                                       "true to declare that its execution has ended")
        return task, True
    if step["held_at"] is not None and state in (TaskState.FAILED.value,
                                                 TaskState.CANCELLED.value):
        return task, False
    raise StepNotRetryable(f"step {name!r}'s task is {state}: a step is retried when its "
                           "task is in NEEDS_REVIEW, or the step is held after its task "
                           "ended FAILED or CANCELLED")


async def _retry(cur: Any, namespace_id: bytes, instance_id: bytes, name: str,
                 request: RetryRequest, *, actor: Actor, application_id: bytes | None,
                 request_id: str | None) -> tuple[int, dict[str, Any], bytes]:
    found = await _locate(cur, namespace_id, instance_id, name, request.step_revision)
    task, review = _retryable(found, request)
    now = await db_now(cur)
    when = to_db(now)
    step_tasks = [found.tasks[a["task_id"]] for a in found.activations
                  if a["task_id"] is not None and a["task_id"] in found.tasks]
    first = step_tasks[0]
    budget = int(first["max_attempts"])
    used = sum(int(t["starts_used"]) for t in step_tasks)
    remaining = max(0, budget - used)
    granted = remaining + request.additional_attempts
    if granted < 1:
        raise StepNotRetryable(
            f"attempt budget spent: {used} of {budget} attempts used across the step's "
            f"{len(step_tasks)} task(s); grant additional_attempts")
    deadline = None if first["deadline_at"] is None else as_utc(first["deadline_at"])
    if deadline is not None and deadline <= now:
        raise StepNotRetryable(
            f"the step's absolute deadline {deadline.isoformat()} has passed; a retry keeps "
            "it (resolve the step instead)")
    await cur.execute(TASK_CREATED, (namespace_id, task["id"]))
    times = await cur.fetchone()
    start_deadline = None
    if task["start_deadline_at"] is not None:
        start_deadline = now + (as_utc(task["start_deadline_at"]) - as_utc(times["created_at"]))
        if deadline is not None:
            start_deadline = min(start_deadline, deadline)
    await cur.execute(OWNED_TASKS, (namespace_id, instance_id))
    sequence = int((await cur.fetchone())["n"]) + 1
    new_task, new_activation = ids.new_id(), ids.new_id()
    step = found.step
    live = found.live
    if live is None:  # _retryable found the live task
        raise errors.DatabaseError(f"step {name!r} lost its LIVE activation")
    await cur.execute(SUPERSEDE, (when, namespace_id, live["id"]))
    await cur.execute(INSERT_ACTIVATION, (
        namespace_id, instance_id, step["id"], new_activation, step["activation_count"] + 1,
        step["id"], new_task, when))
    await cur.execute(STEP_RETRIED, (new_activation, when, namespace_id, instance_id,
                                     step["id"], step["revision"]))
    if cur.rowcount != 1:
        raise errors.DatabaseError(f"step {name!r} changed under its lock")
    try:
        await cur.execute(RETRY_INSERT, (
            when, None if deadline is None else to_db(deadline),
            None if start_deadline is None else to_db(start_deadline), granted, new_task,
            namespace_id, task["id"]))
    except Exception as exc:
        if dberrors.is_duplicate(exc, "uq_tasks_retry_parent"):
            raise StepNotRetryable(f"step {name!r}'s task already has a retry") from exc
        raise
    await resources.apply(cur, namespace_id,
                          resources.Usage(unfinished=Counter({task["queue_id"]: 1})),
                          admit=True)
    if review:  # last: the ending writer's result stream is the end of the one lock order
        await _review(cur, namespace_id, task, "failed", reason=request.reason,
                      evidence_ref=request.evidence_ref or "", by="workflow.step.retry",
                      now=now)
    workflow = {"instance_id": instance_id.hex(), "step": name,
                "activation_id": new_activation.hex(), "sequence": sequence}
    await append_events(cur, [common.task_event(
        namespace_id, new_task, 1, "task.accepted", None, TaskState.WAITING,
        {"retry_of": task["id"].hex(), "reason": request.reason, "workflow": workflow})])
    budget_view = {"original": budget, "used": used, "remaining": remaining,
                   "granted": request.additional_attempts, "max_attempts": granted}
    after = {"state": "RUNNING", "activation": step["activation_count"] + 1,
             "task_id": new_task.hex(), "budget": budget_view,
             "deadline_at": None if deadline is None else deadline.isoformat()}
    await _step_event(cur, namespace_id, found, "workflow.step.retried", to_state="RUNNING",
                      payload={"reason": request.reason, "evidence_ref": request.evidence_ref,
                               "old_task_id": task["id"].hex(), "reviewed": review, **after})
    await append_audit(cur, AuditRecord(
        actor=actor, action="workflow.step.retry", resource_type="workflow_step",
        resource_id=step["id"], resource_revision=step["revision"] + 1,
        namespace_id=namespace_id, application_id=application_id, reason=request.reason,
        evidence_ref=request.evidence_ref,
        before={"state": step["state"], "revision": step["revision"],
                "activation": step["activation_count"], "task_id": task["id"].hex(),
                "task_state": task["state"],
                "held_error": None if step["held_error"] is None
                else jsondoc.loads_strict(step["held_error"])},
        after={**after, "reviewed": review, "execution_ended": request.execution_ended},
        request_id=request_id))
    return 201, await step_view(cur, namespace_id, instance_id, step["id"]), step["id"]


async def retry_step(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str, step: str, request: RetryRequest,
                     idempotency_key: str | None = None, request_id: str | None = None) -> Done:
    """``POST …/workflows/{id}/steps/{step}/retry``: 201 with the step (every activation)."""
    raw_id = _instance_id(instance_id)
    idem = namespaced.request("workflows.steps.retry", idempotency_key, raw_id,
                              {"step": step, **request.digest_body()}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        return await _retry(cur, namespace_id, raw_id, step, request, actor=principal.actor,
                            application_id=principal.application_id, request_id=request_id)

    return await _as_principal(db, "workflows.steps.retry", principal, namespace=namespace,
                               idem=idem, act=act)


async def operator_retry(db: Database, *, namespace: str, instance_id: str, step: str,
                         request: RetryRequest, actor: Actor) -> dict[str, Any]:
    """``orbit admin workflows steps retry``: the same transaction with the operator's
    identity (no credential, no idempotency key: the step revision guards a repeat)."""
    raw_id = _instance_id(instance_id)
    return await _as_operator(db, "weave.operator.retry", namespace, lambda cur, ns, app: _retry(
        cur, ns, raw_id, step, request, actor=actor, application_id=app, request_id=None))


# --- resolve ------------------------------------------------------------------------------------

STEP_RESOLVED = ("UPDATE weave_steps SET resolution = %s, revision = revision + 1,"
                 " updated_at = %s WHERE namespace_id = %s AND instance_id = %s AND id = %s"
                 " AND revision = %s")
ARM_RESOLVE = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id,"
               " kind, state, due_at, attempts, created_at) VALUES (%s, %s, %s, %s, 'RESOLVE',"
               " 'PENDING', %s, 0, %s) ON DUPLICATE KEY UPDATE state = 'PENDING',"
               " due_at = VALUES(due_at), parked_due_at = NULL, lease_owner = NULL,"
               " lease_expires_at = NULL, done_at = NULL")


def _resolvable(found: _Located, request: ResolveRequest) -> dict[str, Any] | None:
    """The live task to review (NEEDS_REVIEW), or None; else ``step_not_resolvable``."""
    step = found.step
    name = step["name"]
    if step["resolution"] is not None:
        raise StepNotResolvable(f"step {name!r} already has a recorded conclusion; the "
                                "engine advances it")
    task = _live_task(found)
    review = (step["kind"] == "TASK" and step["state"] == "WAITING" and task is not None
              and task["state"] == TaskState.NEEDS_REVIEW.value)
    if step["held_at"] is None and not review:
        raise StepNotResolvable(
            f"step {name!r} is {step['state']}: a step is resolved when it is held ($hold) "
            "or, a TASK step, while its task is in NEEDS_REVIEW")
    if review:
        if request.task_decision is None:
            raise errors.ValidationFailed([{
                "path": "$.task_decision",
                "message": "required: the task is in NEEDS_REVIEW (succeeded or failed: "
                           "the execution's conclusion, apart from the step's)"}])
        if request.execution_ended is not True:
            raise ConfirmationRequired("the task is in NEEDS_REVIEW: set execution_ended to "
                                       "true to declare that its execution has ended")
        return task
    if request.task_decision is not None:
        raise errors.ValidationFailed([{
            "path": "$.task_decision",
            "message": "only when the step's task is in NEEDS_REVIEW"}])
    return None


async def _check_output(cur: Any, namespace_id: bytes, found: _Located, output: Any) -> None:
    """A succeeded conclusion's output against the step's declared result shape."""
    instance = found.instance
    pinned = await definitions.load_version(cur, namespace_id, instance["definition_id"],
                                            instance["version"])
    if pinned.digest != instance["version_digest"]:
        raise errors.DatabaseError("the instance's version does not verify")
    step = pinned.definition.all_steps.get(found.step["name"])
    schema = step.result_schema if isinstance(step, TaskStep | PollStep) else None
    if schema is None:
        return
    problems: list[dict[str, str]] = []
    types.value_problems(schema, output, "$.output", problems)
    if problems:
        raise errors.ValidationFailed([{"path": p["path"], "message": p["message"]}
                                       for p in problems])


async def _resolve(cur: Any, namespace_id: bytes, instance_id: bytes, name: str,
                   request: ResolveRequest, *, actor: Actor, application_id: bytes | None,
                   request_id: str | None) -> tuple[int, dict[str, Any], bytes]:
    found = await _locate(cur, namespace_id, instance_id, name, request.step_revision)
    task = _resolvable(found, request)
    if request.conclusion == "succeeded":
        await _check_output(cur, namespace_id, found, request.output)
    now = await db_now(cur)
    when = to_db(now)
    step = found.step
    resolution: dict[str, Any] = {"conclusion": request.conclusion}
    if request.conclusion == "succeeded":
        resolution["output"] = request.output
    else:
        resolution["error"] = request.error
    resolution |= {"reason": request.reason, "evidence_ref": request.evidence_ref,
                   "actor": _actor_json(actor), "at": now.isoformat(timespec="microseconds")}
    await cur.execute(STEP_RESOLVED, (jsondoc.dumps(resolution), when, namespace_id,
                                      instance_id, step["id"], step["revision"]))
    if cur.rowcount != 1:
        raise errors.DatabaseError(f"step {name!r} changed under its lock")
    await cur.execute(ARM_RESOLVE, (namespace_id, ids.new_id(), instance_id, step["id"], when,
                                    when))
    if task is not None and request.task_decision is not None:  # the task, after the steps
        await _review(cur, namespace_id, task, request.task_decision, reason=request.reason,
                      evidence_ref=request.evidence_ref, by="workflow.step.resolve", now=now)
    task_view = None if task is None else {"task_id": task["id"].hex(),
                                           "task_decision": request.task_decision}
    await _step_event(cur, namespace_id, found, "workflow.step.resolved",
                      to_state=step["state"],
                      payload={"conclusion": request.conclusion, "reason": request.reason,
                               "evidence_ref": request.evidence_ref, "review": task_view})
    await append_audit(cur, AuditRecord(
        actor=actor, action="workflow.step.resolve", resource_type="workflow_step",
        resource_id=step["id"], resource_revision=step["revision"] + 1,
        namespace_id=namespace_id, application_id=application_id, reason=request.reason,
        evidence_ref=request.evidence_ref,
        before={"state": step["state"], "revision": step["revision"],
                "held_error": None if step["held_error"] is None
                else jsondoc.loads_strict(step["held_error"]),
                "task_state": None if task is None else task["state"]},
        after={"resolution": {k: v for k, v in resolution.items() if k != "actor"},
               "review": task_view, "execution_ended": request.execution_ended},
        request_id=request_id))
    return 202, await step_view(cur, namespace_id, instance_id, step["id"]), step["id"]


async def resolve_step(db: Database, principal: credentials.Principal, *, namespace: str,
                       instance_id: str, step: str, request: ResolveRequest,
                       idempotency_key: str | None = None, request_id: str | None = None
                       ) -> Done:
    """``POST …/workflows/{id}/steps/{step}/resolve``: 202 with the step (its resolution
    recorded; the engine advances it)."""
    raw_id = _instance_id(instance_id)
    body = {"step": step, **request.digest_body()}
    body["output"] = jsondoc.dumps(request.output)  # the digest sees the value, exactly
    idem = namespaced.request("workflows.steps.resolve", idempotency_key, raw_id, body,
                              principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        return await _resolve(cur, namespace_id, raw_id, step, request, actor=principal.actor,
                              application_id=principal.application_id, request_id=request_id)

    return await _as_principal(db, "workflows.steps.resolve", principal, namespace=namespace,
                               idem=idem, act=act)


async def operator_resolve(db: Database, *, namespace: str, instance_id: str, step: str,
                           request: ResolveRequest, actor: Actor) -> dict[str, Any]:
    """``orbit admin workflows steps resolve``: the same transaction with the operator's
    identity."""
    raw_id = _instance_id(instance_id)
    return await _as_operator(
        db, "weave.operator.resolve", namespace, lambda cur, ns, app: _resolve(
            cur, ns, raw_id, step, request, actor=actor, application_id=app, request_id=None))


"""Human interventions on tasks: cancel, review (NEEDS_REVIEW → an outcome), manual retry.

Every intervention is authorized inside its transaction (the task's queue decides the grant),
is idempotent (an optional Idempotency-Key; and repeating the same intent changes nothing), and
commits an audit event with the actor, the reason and any evidence reference together with the
change it records.

Cancel (specification 000 §2 and 000007)
    WAITING / LEASED → CANCELLED at once (a live offer is WITHDRAWN and its queue slot released).
    RUNNING → a durable cancel intent (``cancel_requested_at``); the task ends CANCELLED only when
    the worker confirms it stopped, and a success that commits first wins.
    A task carrying an uncertain effect goes to NEEDS_REVIEW instead of CANCELLED.
    A finished task is returned unchanged (a confirmed success is never overwritten).
    :func:`request_cancel` is these semantics inside the caller's transaction, shared by the
    cancel API and the workflow engine (which cancels the tasks of the activations it ends; its
    events say ``"by": "workflow"``).
Review (000 §2, 000015)
    Only NEEDS_REVIEW → SUCCEEDED (optional result) or FAILED. The reviewer must name the
    evidence (``evidence_ref``), declare that the execution has ended (``execution_ended``) and
    give the revision of the task they judged (a task that changed since is a stale revision);
    reason, evidence and actor are audited. The uncertainty flag is resolved by the decision.
Manual retry (000015)
    A FAILED or CANCELLED task gets one new task with ``retry_of`` pointing at it (a unique
    index makes it at most one direct successor); the old task, its attempts and evidence are
    untouched. The caller must confirm that re-running is safe.
Reasons (000 §1 invariant 8)
    Review and retry always need a reason. A cancel needs one when it comes from an operator
    credential: one that may also manage the task's queue (``queues.manage``, see
    :func:`is_operator`); a client credential may cancel without one.

Lock order: the one order of docs/architecture.md (here: idempotency record → task → attempt →
queue counter → key rows and permits → application row → result stream).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from typing import Any

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import AuditRecord, append_audit
from orbit_common.platform.events import append_events
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import leases, resources
from orbit_common.pulse.leases import common, decisions, endings
from orbit_common.pulse.model import Task, TaskState

REASON_MAX = 1024


TaskNotFound = errors.TaskNotFound  # re-exported: the interventions' "no such task"


class TaskNotReviewable(errors.Conflict):
    code = "task_not_reviewable"
    title = "Only a task in NEEDS_REVIEW can be reviewed"


class TaskNotRetryable(errors.Conflict):
    code = "task_not_retryable"
    title = "Only a FAILED or CANCELLED task can be retried by hand"


class AlreadyRetried(errors.Conflict):
    code = "already_retried"
    title = "This task already has a manual retry"


class CancelNeedsReview(errors.Conflict):
    code = "task_needs_review"
    title = "The task awaits review; resolve it with a review instead of a cancel"


class ConfirmationRequired(errors.BadRequest):
    code = "confirmation_required"
    title = "The intervention needs an explicit confirmation"


SELECT_TASK = f"SELECT {Task.COLUMNS} FROM pulse_tasks t WHERE t.namespace_id = %s AND t.id = %s"


def task_view(task: Task, queue: str) -> dict[str, Any]:
    """The representation interventions answer with (a subset of the task detail)."""
    return {
        "id": task.id.hex(), "queue": queue, "handler": task.handler, "state": task.state.value,
        "revision": task.revision, "cancel_requested": task.cancel_requested_at is not None,
        "effect_uncertain": task.effect_uncertain, "outcome_reason": task.outcome_reason,
        "retry_of": task.retry_of.hex() if task.retry_of else None,
        "completed_at": task.completed_at.isoformat() if task.completed_at else None,
    }


async def _locked_task(cur: Any, principal: credentials.Principal, action: authz.Action,
                       namespace: str, task_id: bytes) -> tuple[Task, str, bytes]:
    """Authorize and lock the task; returns it with its queue name and namespace id."""
    ns = await credentials.authorize(cur, principal, action, namespace)
    await cur.execute(SELECT_TASK + " FOR UPDATE", (ns.id, task_id))
    row = await cur.fetchone()
    if row is None:
        raise TaskNotFound()
    task = Task.from_row(row)
    queue = await _task_scope(cur, principal, action, namespace, ns.id, task.queue_id)
    return task, queue, ns.id


async def _task_scope(cur: Any, principal: credentials.Principal, action: authz.Action,  # noqa: PLR0917
                      namespace: str, namespace_id: bytes, queue_id: bytes) -> str:
    """The task's queue name, once the grants allow ``action`` there: a queue the grants cover
    for neither reading tasks nor ``action`` hides the task (404), one they cover for reading
    only is forbidden."""
    await cur.execute("SELECT name FROM pulse_queues WHERE namespace_id = %s AND id = %s",
                      (namespace_id, queue_id))
    queue: str = (await cur.fetchone())["name"]
    grants = await credentials.recheck_principal(cur, principal)
    if not authz.allowed(grants, authz.Action.TASKS_READ.value, namespace, queue) and \
            not authz.allowed(grants, action.value, namespace, queue):
        raise TaskNotFound()
    if not authz.allowed(grants, action.value, namespace, queue):
        raise errors.Forbidden(f"the credential may not {action.value} in queue {queue!r}")
    return queue


def _locate_task(principal: credentials.Principal, action: authz.Action, namespace: str,
                 task_id: bytes) -> namespaced.Locate:
    """The authorization of the task before any idempotency replay (a plain read, see
    platform/namespaced.py): the same 404 or 403 as the command itself would give."""

    async def locate(cur: Any, namespace_id: bytes) -> None:
        await cur.execute("SELECT queue_id FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                          (namespace_id, task_id))
        row = await cur.fetchone()
        if row is None:
            raise TaskNotFound()
        await _task_scope(cur, principal, action, namespace, namespace_id, row["queue_id"])

    return locate


def _check_reason(reason: str | None, *, required: bool) -> None:
    if required and not reason:
        raise errors.ValidationFailed([{"path": "$.reason", "message": "required"}])
    if reason is not None and len(reason) > REASON_MAX:
        raise errors.ValidationFailed([{"path": "$.reason",
                                        "message": f"at most {REASON_MAX} characters"}])


async def is_operator(cur: Any, principal: credentials.Principal, namespace: str,
                      queue: str) -> bool:
    """Whether the caller acts as an operator on this queue: its credential may also manage the
    queue (``queues.manage``). Operators must give a reason for every intervention."""
    grants = await credentials.recheck_principal(cur, principal)
    return authz.allowed(grants, authz.Action.QUEUES_MANAGE.value, namespace, queue)



# --- cancel ----------------------------------------------------------------------------------


async def cancel_task(db: Database, principal: credentials.Principal, *, namespace: str,
                      task_id: bytes, reason: str | None, idempotency_key: str | None = None,
                      request_id: str | None = None) -> Replay:
    """Cancel a task (see the module docstring); 200 with the task's representation."""
    _check_reason(reason, required=False)
    idem = namespaced.request("tasks.cancel", idempotency_key, task_id, {"reason": reason},
                              principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        task, queue, _ = await _locked_task(cur, principal, authz.Action.TASKS_CANCEL,
                                            namespace, task_id)
        operator = await is_operator(cur, principal, namespace, queue)
        if operator and not reason:
            raise errors.ValidationFailed(
                [{"path": "$.reason", "message": "required for an operator's cancel"}])
        if task.state.terminal:
            return 200, task_view(task, queue), task.id
        if task.state is TaskState.NEEDS_REVIEW:
            raise CancelNeedsReview()
        await request_cancel(cur, namespace_id, [task.id], reason=reason,
                             now=await db_now(cur))
        after = await _reload(cur, namespace_id, task.id)
        await append_audit(cur, AuditRecord(
            actor=principal.actor, action="task.cancel", resource_type="task",
            resource_id=task.id, resource_revision=after.revision, namespace_id=namespace_id,
            application_id=principal.application_id, reason=reason,
            before={"state": task.state.value, "revision": task.revision},
            after={"state": after.state.value, "revision": after.revision,
                   "cancel_requested": after.cancel_requested_at is not None,
                   "by": "operator" if operator else "client"},
            request_id=request_id,
        ))
        return 200, task_view(after, queue), task.id

    return await namespaced.run(
        db, "tasks.cancel", principal=principal, action=authz.Action.TASKS_CANCEL,
        namespace=namespace, idem=idem, act=act,
        locate=_locate_task(principal, authz.Action.TASKS_CANCEL, namespace, task_id))


# What :func:`request_cancel` did to each task.
CANCELLED = "cancelled"  # WAITING / LEASED: ended now, CANCELLED
TO_REVIEW = "needs_review"  # WAITING / LEASED with an uncertain effect: ended now, NEEDS_REVIEW
REQUESTED = "cancel_requested"  # RUNNING: the cancel intent is recorded
ALREADY_REQUESTED = "already_requested"  # RUNNING with an intent already: nothing
ALREADY_ENDED = "already_ended"  # SUCCEEDED / FAILED / CANCELLED: nothing
AWAITS_REVIEW = "awaits_review"  # NEEDS_REVIEW: nothing, a person decides
NOT_FOUND = "not_found"


async def request_cancel(cur: Any, namespace_id: bytes, task_ids: Sequence[bytes], *,
                         reason: str | None, now: dt.datetime,
                         by: str | None = None) -> dict[bytes, str]:
    """Cancel ``task_ids`` in the caller's transaction with the semantics of the module
    docstring, without authorization, idempotency or audit (the callers' concern: the cancel
    API, and the workflow engine for the tasks of the activations it ends).

    The tasks are locked in id order (the lock order of docs/architecture.md: after workflow
    rows, before attempts and counters). ``by`` (e.g. ``"workflow"``) is added to the events'
    payload next to the reason; None keeps the payload ``{"reason": ...}``. Returns what
    happened to each task (``CANCELLED`` ... ``NOT_FOUND``)."""
    rows = {r["id"]: r for r in await common.lock_tasks(cur, namespace_id, task_ids)}
    payload: dict[str, Any] = {"reason": reason} if by is None else {"reason": reason, "by": by}
    done: dict[bytes, str] = dict.fromkeys(task_ids, NOT_FOUND)
    to_end: list[dict[str, Any]] = []
    for task_id, row in sorted(rows.items()):
        state = TaskState(row["state"])
        if state.terminal:
            done[task_id] = ALREADY_ENDED
        elif state is TaskState.NEEDS_REVIEW:
            done[task_id] = AWAITS_REVIEW
        elif state is TaskState.RUNNING:
            if row["cancel_requested_at"] is not None:
                done[task_id] = ALREADY_REQUESTED
                continue
            await cur.execute(
                "UPDATE pulse_tasks SET cancel_requested_at = %s, cancel_reason = %s,"
                " revision = revision + 1, updated_at = UTC_TIMESTAMP(6)"
                " WHERE namespace_id = %s AND id = %s AND revision = %s AND state = 'RUNNING'",
                (to_db(now), reason, namespace_id, task_id, row["revision"]))
            leases.expect_rows(cur, 1, "cancel intent")
            await append_events(cur, [leases.task_event(
                namespace_id, task_id, row["revision"] + 1, "task.cancel_requested",
                TaskState.RUNNING, TaskState.RUNNING, payload)])
            done[task_id] = REQUESTED
        else:
            to_end.append(row)
    if to_end:
        done.update(await _cancel_now(cur, namespace_id, to_end, reason, payload, now))
    return done


async def _cancel_now(cur: Any, namespace_id: bytes,  # noqa: PLR0917
                      rows: Sequence[dict[str, Any]], reason: str | None,
                      payload: dict[str, Any], now: dt.datetime) -> dict[bytes, str]:
    """WAITING or LEASED tasks (locked): end them now through the ending writer (a live offer
    is WITHDRAWN; NEEDS_REVIEW if the task carries an uncertain effect). The writer also records
    a workflow-owned task's inbox row."""
    attempts = await common.lock_attempts(
        cur, namespace_id, [r["current_attempt_id"] for r in rows
                            if r["current_attempt_id"] is not None])
    endings_ = [endings.Ending(
        task=row, attempt=attempts.get(row["current_attempt_id"]),
        decision=decisions.decide_cancel_now(row), payload=payload, cancel=True,
        cancel_reason=reason, error={"type": "cancelled", "message": reason or ""})
        for row in rows]
    await endings.write(cur, namespace_id, endings_, now)
    return {e.task["id"]: CANCELLED if e.decision.task_state is TaskState.CANCELLED
            else TO_REVIEW for e in endings_}


async def _reload(cur: Any, namespace_id: bytes, task_id: bytes) -> Task:
    await cur.execute(SELECT_TASK, (namespace_id, task_id))
    return Task.from_row(await cur.fetchone())


# --- review ----------------------------------------------------------------------------------

DECISIONS = ("succeeded", "failed")


async def review_task(db: Database, principal: credentials.Principal, *, namespace: str,
                      task_id: bytes, decision: str, reason: str, evidence_ref: str,
                      execution_ended: bool, revision: int, result: str | None = None,
                      idempotency_key: str | None = None,
                      request_id: str | None = None) -> Replay:
    """Resolve NEEDS_REVIEW to SUCCEEDED or FAILED, audited with reason and evidence.

    The reviewer names the evidence, declares that the execution has ended and gives the task
    revision they judged (specification 000 §2); a task that changed since is a 409.
    """
    problems = []
    if decision not in DECISIONS:
        problems.append({"path": "$.decision", "message": "succeeded or failed"})
    if result is not None and decision != "succeeded":
        problems.append({"path": "$.result", "message": "only with decision succeeded"})
    if not evidence_ref:
        problems.append({"path": "$.evidence_ref", "message": "required"})
    elif len(evidence_ref) > REASON_MAX:
        problems.append({"path": "$.evidence_ref",
                         "message": f"at most {REASON_MAX} characters"})
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        problems.append({"path": "$.revision", "message": "the task revision, at least 1"})
    if problems:
        raise errors.ValidationFailed(problems)
    _check_reason(reason, required=True)
    if execution_ended is not True:
        raise ConfirmationRequired("set execution_ended to true to declare that the task's "
                                   "execution has ended")
    idem = namespaced.request("tasks.review", idempotency_key, task_id,
                              {"decision": decision, "reason": reason,
                               "evidence_ref": evidence_ref, "result": result,
                               "execution_ended": True, "revision": revision}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        task, queue, _ = await _locked_task(cur, principal, authz.Action.TASKS_REVIEW,
                                            namespace, task_id)
        if task.state is not TaskState.NEEDS_REVIEW:
            raise TaskNotReviewable(f"the task is {task.state.value}")
        if task.revision != revision:
            raise errors.StaleRevision(
                f"the task is at revision {task.revision}, not {revision}; read it again",
                current_revision=task.revision)
        now = await db_now(cur)
        (row,) = await common.lock_tasks(cur, namespace_id, [task.id])
        await endings.write(cur, namespace_id, [endings.Ending(
            task=row, attempt=None, decision=decisions.decide_review(decision),
            payload={"reason": reason, "evidence_ref": evidence_ref}, result=result,
            snapshot_extra={"review": {"reason": reason, "evidence_ref": evidence_ref}})], now)
        after = await _reload(cur, namespace_id, task.id)
        await append_audit(cur, AuditRecord(
            actor=principal.actor, action="task.review", resource_type="task",
            resource_id=task.id, resource_revision=after.revision, namespace_id=namespace_id,
            application_id=principal.application_id, reason=reason, evidence_ref=evidence_ref,
            before={"state": task.state.value, "revision": task.revision,
                    "effect_uncertain": task.effect_uncertain},
            after={"state": after.state.value, "decision": decision, "execution_ended": True},
            request_id=request_id,
        ))
        return 200, task_view(after, queue), task.id

    return await namespaced.run(
        db, "tasks.review", principal=principal, action=authz.Action.TASKS_REVIEW,
        namespace=namespace, idem=idem, act=act,
        locate=_locate_task(principal, authz.Action.TASKS_REVIEW, namespace, task_id))


# --- manual retry ----------------------------------------------------------------------------


async def retry_task(db: Database, principal: credentials.Principal, *, namespace: str,
                     task_id: bytes, reason: str, rerun_confirmed: bool,
                     idempotency_key: str | None = None,
                     request_id: str | None = None) -> Replay:
    """Create the one direct successor of a FAILED or CANCELLED task (201)."""
    _check_reason(reason, required=True)
    if rerun_confirmed is not True:
        raise ConfirmationRequired("set rerun_confirmed to true to declare re-running safe")
    new_id = ids.new_id()
    idem = namespaced.request("tasks.retry", idempotency_key, task_id, {"reason": reason},
                              principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        task, queue, _ = await _locked_task(cur, principal, authz.Action.TASKS_RETRY,
                                            namespace, task_id)
        if task.state not in {TaskState.FAILED, TaskState.CANCELLED}:
            raise TaskNotRetryable(f"the task is {task.state.value}")
        await cur.execute("SELECT id FROM pulse_tasks WHERE namespace_id = %s AND retry_of = %s",
                          (namespace_id, task.id))
        existing = await cur.fetchone()
        if existing is not None:
            raise AlreadyRetried(successor=existing["id"].hex())
        now = await db_now(cur)
        created = task.created_at

        def relative(at: dt.datetime | None) -> Any:
            return None if at is None else to_db(now + (as_utc(at) - created))

        try:
            await cur.execute(RETRY_INSERT, (
                to_db(now), to_db(now), relative(task.deadline_at),
                relative(task.start_deadline_at), new_id, namespace_id, task.id))
        except Exception as exc:
            if dberrors.is_duplicate(exc, "uq_tasks_retry_parent"):
                raise AlreadyRetried() from exc
            raise
        # The successor counts against the queue's and the application's limits like any
        # submission (a refusal rolls the whole retry back).
        await resources.apply(cur, namespace_id,
                              resources.Usage(unfinished=Counter({task.queue_id: 1})),
                              admit=True)
        await append_events(cur, [leases.task_event(
            namespace_id, new_id, 1, "task.accepted", None, TaskState.WAITING,
            {"retry_of": task.id.hex(), "reason": reason})])
        await append_audit(cur, AuditRecord(
            actor=principal.actor, action="task.retry", resource_type="task",
            resource_id=task.id, resource_revision=task.revision, namespace_id=namespace_id,
            application_id=principal.application_id, reason=reason,
            before={"state": task.state.value},
            after={"successor": new_id.hex()}, request_id=request_id,
        ))
        successor = await _reload(cur, namespace_id, new_id)
        return 201, task_view(successor, queue), new_id

    return await namespaced.run(
        db, "tasks.retry", principal=principal, action=authz.Action.TASKS_RETRY,
        namespace=namespace, idem=idem, act=act,
        locate=_locate_task(principal, authz.Action.TASKS_RETRY, namespace, task_id))


# The successor copies the original's work and frozen policies; deadlines keep their relative
# length from the new acceptance time; attempts, results and evidence start afresh.
RETRY_INSERT = """
INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, revision, priority,
  available_at, business_key, concurrency_key, concurrency_key_digest, deadline_at,
  start_deadline_at, attempt_timeout_ms, max_attempts,
  retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter, offer_lease_ms,
  execution_lease_ms, rerun_safe, retry_of, created_at, updated_at)
SELECT o.namespace_id, v.new_id, o.queue_id, o.handler, o.input, 'WAITING', 1, o.priority,
  v.now, o.business_key, o.concurrency_key, o.concurrency_key_digest, v.deadline_at,
  v.start_deadline_at, o.attempt_timeout_ms,
  o.max_attempts, o.retry_initial_ms, o.retry_max_ms, o.retry_multiplier, o.retry_jitter,
  o.offer_lease_ms, o.execution_lease_ms, o.rerun_safe, o.id, v.now, v.now
FROM (SELECT %s AS now, %s AS created, %s AS deadline_at, %s AS start_deadline_at,
             %s AS new_id) v
JOIN pulse_tasks o ON o.namespace_id = %s AND o.id = %s
"""

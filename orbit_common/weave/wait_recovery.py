"""Manual recovery of a held wait: re-arm a SIGNAL wait that timed out, continue a POLL step
that exhausted its rounds or deadline or whose round task failed (docs/weave/recovery.md
§ 重新等待 and § 继续有界查询; 000 §1 invariant 8, spec 000022).

Both act on a step *held* for a person (``held_at``: its ``on_timeout`` / ``on_exhausted`` /
``on_failure`` is ``$hold``): the step is WAITING, its activation LIVE, ``held_error`` the error
it would have propagated. Each is one short transaction in the lock order of an advance
(docs/architecture.md): the idempotency identity (a replay returns the original receipt) →
the instance row ``FOR UPDATE`` (every advance of the instance locks it first) → the step row,
its activation, its poll state and its pending advance → the round's tasks → (last) the new
task and the queue and application counters it updates. Then one ``workflow_step`` event
(the instance's timeline shows it through its ``workflow_id``) and one audit record with the
actor and the reason. A refusal writes nothing.

Re-arm (``…/steps/{step}/rearm``): the old activation SUPERSEDED with its TIMED_OUT wait kept;
a new activation (sequence + 1) LIVE with a new wait generation WAITING, the same signal name,
correlation key and payload versions, ``first_deadline_at`` copied from the first wait (never
moved), ``deadline_at`` = now + ``timeout_ms``; the step's SIGNAL pending advance re-armed for
the new activation **due now**: the engine handles it at once and a matching signal already
pending (kept while the step was held: ``engine._rearmable``) wins as on a wait's entry; else
the row waits for the new deadline. A TIMER wait never times out (it fires): not re-armable.

Continue (``…/steps/{step}/continue``): a new activation; the query keeps its rounds (numbered
from the first activation), its definition's ``max_rounds`` and first ``deadline_at``; the
continue *grants* ``rounds`` (``granted_rounds``) and may give a new query deadline
(``continued_deadline_at``). The last round was *cut short* when its task FAILED or was
CANCELLED: if that round still has attempts left (its first task's ``max_attempts`` minus the
starts of every task of that round, across activations) and its request deadline (its first
task's creation + the step's ``deadline_ms``, within the query deadline) has not passed, the
same round continues at once with a new task (``retry_of`` the round's last task) allowed
**only the remaining attempts** -- never more than the round's original budget; else a new
business round comes after the stored interval (the one computed from the last processed
result), with the original per-round policy, made by the engine (``polls.py``).
``first_round`` / ``first_round_attempts_used`` record the new activation's first business
round and what that round had already used.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event, append_events
from orbit_common.platform.idempotency import IdempotencyRequest
from orbit_common.pulse import leases, resources
from orbit_common.pulse.model import TaskState
from orbit_common.weave import definitions, instances, polls, signals, waits
from orbit_common.weave.language import MAX_WAIT_MS, PollStep
from orbit_common.weave.recovery import Done, lock_step

REASON_MAX = 1024
TIMEOUT_MIN_MS = 1
TIMEOUT_MAX_MS = MAX_WAIT_MS  # 366 days
ROUNDS_MAX = 1000
AGGREGATE = "workflow_step"
TASK_FAILED = "task_failed"
CONTINUABLE = (polls.POLL_EXHAUSTED, TASK_FAILED)


class WaitNotRearmable(errors.Conflict):
    code = "wait_not_rearmable"
    title = "Only a SIGNAL wait that timed out and holds its step can be re-armed"


class PollNotContinuable(errors.Conflict):
    code = "poll_not_continuable"
    title = "Only a POLL step held after it exhausted or after a round task failed can be continued"


@attrs.frozen
class Who:
    """Who recovers: an API credential (its actor and application) or an operator at the
    command line (``orbit admin workflows``; no application)."""

    actor: Actor
    application_id: bytes | None = None

    @classmethod
    def of(cls, principal: credentials.Principal) -> Who:
        return cls(actor=principal.actor, application_id=principal.application_id)


async def _run(db: Database, name: str,  # noqa: PLR0917
               principal: credentials.Principal, namespace: str,
               idem: IdempotencyRequest | None, act: namespaced.Act) -> Done:
    """Run a recovery for an API credential (``workflows.control``). ``fresh``: the answer is
    the very body this call's transaction made and committed -- a replay's (even one found by
    a re-run of the transaction after a deadlock) is read back from its record."""
    made: list[Any] = []

    async def acted(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        answer = await act(cur, namespace_id)
        made[:] = [answer[1]]
        return answer

    replay = await namespaced.run(db, name, principal=principal,
                                  action=authz.Action.WORKFLOWS_CONTROL, namespace=namespace,
                                  idem=idem, act=acted)
    return Done(replay=replay, fresh=bool(made) and replay.body is made[0])


def _problem(path: str, message: str) -> dict[str, str]:
    return {"path": path, "message": message}


def _integer(value: Any, low: int, high: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def check_common(reason: Any, step_revision: Any, problems: list[dict[str, str]]) -> None:
    """``reason`` 1-1024 characters and ``step_revision`` an integer ≥ 1: both required (a
    recovery is an operator's judgment of one state of the step)."""
    if not isinstance(reason, str) or not 1 <= len(reason) <= REASON_MAX:
        problems.append(_problem("$.reason", f"required: a string of 1-{REASON_MAX} characters"))
    if not _integer(step_revision, 1, 2**63 - 1):
        problems.append(_problem("$.step_revision",
                                 "required: an integer ≥ 1 (the step's revision as read)"))


def check_rearm(reason: Any, step_revision: Any, timeout_ms: Any) -> None:
    problems: list[dict[str, str]] = []
    check_common(reason, step_revision, problems)
    if not _integer(timeout_ms, TIMEOUT_MIN_MS, TIMEOUT_MAX_MS):
        problems.append(_problem("$.timeout_ms", f"required: an integer from {TIMEOUT_MIN_MS}"
                                                 f" to {TIMEOUT_MAX_MS} (366 days)"))
    if problems:
        raise errors.ValidationFailed(problems)


def check_continue(reason: Any, step_revision: Any, rounds: Any, deadline_ms: Any) -> None:
    problems: list[dict[str, str]] = []
    check_common(reason, step_revision, problems)
    if not _integer(rounds, 1, ROUNDS_MAX):
        problems.append(_problem("$.rounds", f"required: an integer from 1 to {ROUNDS_MAX}"))
    if deadline_ms is not None and not _integer(deadline_ms, 1, MAX_WAIT_MS):
        problems.append(_problem("$.deadline_ms",
                                 f"an integer from 1 to {MAX_WAIT_MS} (366 days), or null"))
    if problems:
        raise errors.ValidationFailed(problems)


# --- reads and locks ----------------------------------------------------------------------------

LIVE_ACTIVATION = ("SELECT * FROM weave_activations WHERE namespace_id = %s AND id = %s"
                   " FOR UPDATE")
ACTIVATION_WAIT = "SELECT * FROM weave_waits WHERE namespace_id = %s AND activation_id = %s"
FIRST_WAIT = ("SELECT first_deadline_at FROM weave_waits WHERE namespace_id = %s"
              " AND instance_id = %s AND step_id = %s ORDER BY generation, created_at LIMIT 1")
# The step's pending advance of ``kind`` (one per step and kind), locked before any task row:
# the order of an advance (docs/architecture.md).
LOCK_ADVANCE = ("SELECT id FROM weave_pending_advances WHERE namespace_id = %s"
                " AND instance_id = %s AND step_id = %s AND kind = %s FOR UPDATE")
POLL_STATE = ("SELECT * FROM weave_poll_states WHERE namespace_id = %s AND instance_id = %s"
              " AND step_id = %s FOR UPDATE")
# Every task of one round of a query (a continued round has one per activation), oldest
# first, with what its budget counts (starts_used).
ROUND_TASKS = ("SELECT r.activation_id, r.round, r.state AS round_state, r.task_id,"
               " t.state AS task_state, t.max_attempts, t.starts_used, t.created_at,"
               " t.deadline_at, t.start_deadline_at FROM weave_poll_rounds r JOIN pulse_tasks t"
               " ON t.namespace_id = r.namespace_id AND t.id = r.task_id"
               " WHERE r.namespace_id = %s AND r.instance_id = %s AND r.step_id = %s"
               " AND r.round = %s ORDER BY t.created_at, t.id FOR UPDATE")
TASKS_MADE = ("SELECT COUNT(*) AS n FROM pulse_tasks FORCE INDEX (ix_tasks_owner)"
              " WHERE namespace_id = %s AND owner_kind = 'WORKFLOW' AND owner_id = %s")
STEP_ACTIVATIONS = ("SELECT * FROM weave_activations WHERE namespace_id = %s"
                    " AND instance_id = %s AND step_id = %s ORDER BY sequence")

# --- writes -------------------------------------------------------------------------------------

SUPERSEDE = ("UPDATE weave_activations SET state = 'SUPERSEDED', live_step_id = NULL,"
             " ended_at = %s WHERE namespace_id = %s AND id = %s AND state = 'LIVE'")
INSERT_ACTIVATION = ("INSERT INTO weave_activations (namespace_id, instance_id, step_id, id,"
                     " sequence, state, live_step_id, task_id, result_event_id, created_at,"
                     " ended_at) VALUES (%s, %s, %s, %s, %s, 'LIVE', %s, %s, NULL, %s, NULL)")
# The step moves to its new activation, guarded by the revision the operator read.
MOVE_STEP = ("UPDATE weave_steps SET state = %s, revision = revision + 1,"
             " activation_count = activation_count + 1, live_activation_id = %s,"
             " held_at = NULL, held_error = NULL, updated_at = %s"
             " WHERE namespace_id = %s AND instance_id = %s AND id = %s AND revision = %s"
             " AND held_at IS NOT NULL")
INSERT_WAIT = ("INSERT INTO weave_waits (namespace_id, id, instance_id, step_id, activation_id,"
               " kind, generation, signal_name, correlation_key, payload_versions,"
               " first_deadline_at, deadline_at, state, winner_signal_id, fired_at, late_ms,"
               " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, 'SIGNAL', %s, %s, %s, %s,"
               " %s, %s, 'WAITING', NULL, NULL, NULL, %s, %s)")
# One pending advance per (instance, step, kind): the step's row, for its new activation.
ARM_ADVANCE = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id,"
               " activation_id, kind, state, due_at, attempts, created_at)"
               " VALUES (%s, %s, %s, %s, %s, %s, 'PENDING', %s, 0, %s)"
               " ON DUPLICATE KEY UPDATE state = 'PENDING', activation_id = VALUES(activation_id),"
               " due_at = VALUES(due_at), parked_due_at = NULL, lease_owner = NULL,"
               " lease_expires_at = NULL, done_at = NULL")
POINT_ADVANCE = ("UPDATE weave_pending_advances SET activation_id = %s WHERE namespace_id = %s"
                 " AND instance_id = %s AND step_id = %s AND kind = 'POLL'")
CONTINUE_STATE = ("UPDATE weave_poll_states SET activation_id = %s, state = %s,"
                  " granted_rounds = granted_rounds + %s,"
                  " continued_deadline_at = COALESCE(%s, continued_deadline_at),"
                  " first_round = %s, first_round_attempts_used = %s, next_round_at = %s,"
                  " updated_at = %s WHERE namespace_id = %s AND instance_id = %s"
                  " AND step_id = %s")
INSERT_ROUND = ("INSERT INTO weave_poll_rounds (namespace_id, instance_id, activation_id, round,"
                " step_id, task_id, state, result, created_at, ended_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, 'RUNNING', NULL, %s, NULL)")
# The continued round's task: the round's last task's work and frozen policies, owned by the
# instance behind its gate, allowed only the round's remaining attempts, its request deadline
# kept (absolute), its start window relative to now (as a manual retry's, interventions.py).
ROUND_TASK_INSERT = """
INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, revision, priority,
  available_at, business_key, concurrency_key, concurrency_key_digest, deadline_at,
  start_deadline_at, attempt_timeout_ms, max_attempts,
  retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter, offer_lease_ms,
  execution_lease_ms, rerun_safe, retry_of, owner_kind, owner_id, workflow_gate_id, created_at,
  updated_at)
SELECT o.namespace_id, v.new_id, o.queue_id, o.handler, o.input, 'WAITING', 1, o.priority,
  v.now, o.business_key, o.concurrency_key, o.concurrency_key_digest, v.deadline_at,
  v.start_deadline_at,
  o.attempt_timeout_ms, v.max_attempts, o.retry_initial_ms, o.retry_max_ms,
  o.retry_multiplier, o.retry_jitter, o.offer_lease_ms, o.execution_lease_ms, o.rerun_safe,
  o.id, 'WORKFLOW', v.instance_id, v.gate_id, v.now, v.now
FROM (SELECT %s AS now, %s AS deadline_at, %s AS start_deadline_at, %s AS max_attempts,
             %s AS new_id,
             %s AS instance_id, %s AS gate_id) v
JOIN pulse_tasks o ON o.namespace_id = %s AND o.id = %s
"""
TASK_QUEUE = "SELECT queue_id FROM pulse_tasks WHERE namespace_id = %s AND id = %s"


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


def _raw_id(instance_id: str) -> bytes:
    try:
        return ids.from_hex(instance_id)
    except ValueError:
        return bytes(16)  # authorization first; then the 404 of an unknown instance


async def _locked(cur: Any, namespace_id: bytes, instance_id: bytes, step: str,
                  step_revision: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The instance and the step, locked, with the refusals every recovery shares
    (:func:`recovery.lock_step`)."""
    return await lock_step(cur, namespace_id, instance_id, step, step_revision)


async def _live(cur: Any, namespace_id: bytes, step: dict[str, Any]) -> dict[str, Any] | None:
    if step["live_activation_id"] is None:
        return None
    await cur.execute(LIVE_ACTIVATION, (namespace_id, step["live_activation_id"]))
    found = await cur.fetchone()
    return None if found is None or found["state"] != "LIVE" else dict(found)


def _held_error(step: dict[str, Any]) -> Any:
    return None if step["held_error"] is None else jsondoc.loads_strict(step["held_error"])


async def _move(cur: Any, namespace_id: bytes, instance_id: bytes,  # noqa: PLR0917
                step: dict[str, Any], old: dict[str, Any], state: str, task_id: bytes | None,
                now: dt.datetime) -> tuple[bytes, int]:
    """The old activation SUPERSEDED, the new one LIVE (sequence + 1), the step on it with
    its hold cleared; returns the new activation's id and sequence."""
    when = to_db(now)
    await cur.execute(SUPERSEDE, (when, namespace_id, old["id"]))
    if cur.rowcount != 1:
        raise errors.DatabaseError(f"step {step['name']!r}: its activation is not LIVE")
    activation_id = ids.new_id()
    sequence = step["activation_count"] + 1
    await cur.execute(INSERT_ACTIVATION, (namespace_id, instance_id, step["id"], activation_id,
                                          sequence, step["id"], task_id, when))
    await cur.execute(MOVE_STEP, (state, activation_id, when, namespace_id, instance_id,
                                  step["id"], step["revision"]))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the step changed while it was recovered; read it again")
    return activation_id, sequence


async def step_detail(cur: Any, namespace_id: bytes, instance_id: bytes,
                      step_id: bytes) -> dict[str, Any]:
    """A step with every activation (in sequence order), its waits and, for a POLL step, its
    query: the receipt of a recovery."""
    await cur.execute("SELECT * FROM weave_steps WHERE namespace_id = %s AND instance_id = %s"
                      " AND id = %s", (namespace_id, instance_id, step_id))
    step = dict(await cur.fetchone())
    await cur.execute(STEP_ACTIVATIONS, (namespace_id, instance_id, step_id))
    activations = [dict(a) for a in await cur.fetchall()]
    results = await instances.task_results(
        cur, namespace_id, [a["task_id"] for a in activations if a["task_id"] is not None])
    step_waits = [w for w in await waits.waits_of(cur, namespace_id, instance_id)
                  if w["step_id"] == step_id.hex()]
    view = instances.step_view(step, activations, results, step_waits)
    if step["kind"] == "POLL":
        view["poll"] = (await polls.states_of(cur, namespace_id, instance_id)).get(step_id)
    view["workflow_id"] = instance_id.hex()
    return view


async def _record(cur: Any, who: Who, *,
                  namespace_id: bytes, instance_id: bytes, step: dict[str, Any], verb: str,
                  action: str, reason: str,
                  before: dict[str, Any], after: dict[str, Any],
                  request_id: str | None) -> None:
    """The recovery's one event (on the step, naming the instance) and its audit record."""
    revision = step["revision"] + 1
    await append_event(cur, namespace_id=namespace_id, aggregate_type=AGGREGATE,
                       aggregate_id=step["id"], aggregate_revision=revision,
                       event_type=f"workflow.step.{verb}", from_state=step["state"],
                       to_state=after["state"],
                       payload={"workflow_id": instance_id.hex(), "step": step["name"],
                                "reason": reason, **after})
    await append_audit(cur, AuditRecord(
        actor=who.actor, action=f"workflow.step.{action}",
        resource_type=AGGREGATE, resource_id=step["id"], resource_revision=revision,
        namespace_id=namespace_id, application_id=who.application_id, reason=reason,
        before=before, after=after, request_id=request_id))


# --- re-arm -------------------------------------------------------------------------------------


async def rearm_wait(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str, step: str, reason: str, step_revision: int,
                     timeout_ms: int, idempotency_key: str | None = None,
                     request_id: str | None = None) -> Done:
    """``POST …/workflows/{id}/steps/{step}/rearm``: 201 with the step (see the module
    docstring), and whether this call committed it (not a replay)."""
    check_rearm(reason, step_revision, timeout_ms)
    raw_id = _raw_id(instance_id)
    idem = namespaced.request("workflows.steps.rearm", idempotency_key, raw_id,
                              {"step": step, "reason": reason, "step_revision": step_revision,
                               "timeout_ms": timeout_ms}, principal)
    act = _rearm(Who.of(principal), raw_id, step, reason, step_revision, timeout_ms,
                 request_id)
    return await _run(db, "workflows.steps.rearm", principal, namespace, idem, act)


def _rearm(who: Who, raw_id: bytes, step: str, reason: str,  # noqa: PLR0917
           step_revision: int, timeout_ms: int, request_id: str | None) -> namespaced.Act:
    """The re-arm transaction's body (after authorization and the idempotency claim)."""

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        _, row = await _locked(cur, namespace_id, raw_id, step, step_revision)
        old = await _rearmable(cur, namespace_id, row)
        await cur.execute(LOCK_ADVANCE, (namespace_id, raw_id, row["id"], "SIGNAL"))
        await cur.execute(ACTIVATION_WAIT, (namespace_id, old["id"]))
        wait = await cur.fetchone()
        if wait is None or wait["kind"] != "SIGNAL" or wait["state"] != "TIMED_OUT":
            raise WaitNotRearmable(f"step {step!r}'s wait is"
                                   f" {wait['state'] if wait else 'missing'}, not TIMED_OUT")
        await cur.execute(FIRST_WAIT, (namespace_id, raw_id, row["id"]))
        first = await cur.fetchone()
        now = await db_now(cur)
        deadline = now + dt.timedelta(milliseconds=timeout_ms)
        activation_id, sequence = await _move(cur, namespace_id, raw_id, row, old, "WAITING",
                                              None, now)
        when = to_db(now)
        generation = wait["generation"] + 1
        await cur.execute(INSERT_WAIT, (
            namespace_id, ids.new_id(), raw_id, row["id"], activation_id, generation,
            wait["signal_name"], wait["correlation_key"], wait["payload_versions"],
            first["first_deadline_at"], to_db(deadline), when, when))
        # Due now: the engine takes a matching signal already pending, else re-arms the row
        # for the new deadline (engine.signal_timeout).
        await cur.execute(ARM_ADVANCE, (namespace_id, ids.new_id(), raw_id, row["id"],
                                        activation_id, "SIGNAL", when, when))
        await _record(
            cur, who, namespace_id=namespace_id, instance_id=raw_id, step=row,
            verb="rearmed", action="rearm", reason=reason,
            before={"state": row["state"], "activation_sequence": row["activation_count"],
                    "held_error": _held_error(row), "generation": wait["generation"],
                    "wait_state": wait["state"], "deadline_at": _iso(wait["deadline_at"])},
            after={"state": "WAITING", "activation_sequence": sequence,
                   "superseded_sequence": row["activation_count"], "generation": generation,
                   "timeout_ms": timeout_ms, "deadline_at": _iso(deadline),
                   "first_deadline_at": _iso(first["first_deadline_at"])},
            request_id=request_id)
        return 201, await step_detail(cur, namespace_id, raw_id, row["id"]), row["id"]

    return act


async def _rearmable(cur: Any, namespace_id: bytes, row: dict[str, Any]) -> dict[str, Any]:
    """The LIVE activation of a SIGNAL step held after its timeout; else the precise
    refusal."""
    name = row["name"]
    if row["kind"] == "TIMER":
        raise WaitNotRearmable(f"step {name!r} is a TIMER step: a timer fires, it never times"
                               " out, so there is nothing to re-arm")
    if row["kind"] != "SIGNAL":
        raise WaitNotRearmable(f"step {name!r} is a {row['kind']} step; only a SIGNAL wait"
                               " can be re-armed")
    held = _held_error(row)
    if row["state"] != "WAITING" or row["held_at"] is None:
        raise WaitNotRearmable(f"step {name!r} is {row['state']} and not held: only a step"
                               " held after its wait timed out (on_timeout \"$hold\") can be"
                               " re-armed")
    if not isinstance(held, dict) or held.get("error") != signals.SIGNAL_TIMEOUT:
        raise WaitNotRearmable(f"step {name!r} is held after {held!r}, not a signal_timeout")
    if row["resolution"] is not None:
        raise WaitNotRearmable(f"step {name!r} has a recorded conclusion; the engine advances"
                               " it with that")
    old = await _live(cur, namespace_id, row)
    if old is None:
        raise errors.DatabaseError(f"held step {name!r} has no LIVE activation")
    return old


# --- continue -----------------------------------------------------------------------------------


async def continue_poll(db: Database, principal: credentials.Principal, *, namespace: str,
                        instance_id: str, step: str, reason: str, step_revision: int,
                        rounds: int, deadline_ms: int | None = None,
                        idempotency_key: str | None = None, request_id: str | None = None
                        ) -> Done:
    """``POST …/workflows/{id}/steps/{step}/continue``: 201 with the step (see the module
    docstring), and whether this call committed it (not a replay)."""
    check_continue(reason, step_revision, rounds, deadline_ms)
    raw_id = _raw_id(instance_id)
    idem = namespaced.request("workflows.steps.continue", idempotency_key, raw_id,
                              {"step": step, "reason": reason, "step_revision": step_revision,
                               "rounds": rounds, "deadline_ms": deadline_ms}, principal)
    act = _continue(Who.of(principal), raw_id, step, reason, step_revision, rounds,
                    deadline_ms, request_id)
    return await _run(db, "workflows.steps.continue", principal, namespace, idem, act)


def _continue(who: Who, raw_id: bytes, step: str, reason: str,  # noqa: PLR0917
              step_revision: int, rounds: int, deadline_ms: int | None,
              request_id: str | None) -> namespaced.Act:
    """The continue transaction's body (after authorization and the idempotency claim)."""

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        instance, row = await _locked(cur, namespace_id, raw_id, step, step_revision)
        old, query, held = await _continuable(cur, namespace_id, raw_id, row)
        now = await db_now(cur)
        new_deadline = (None if deadline_ms is None
                        else now + dt.timedelta(milliseconds=deadline_ms))
        state = _query(query, new_deadline)
        plan = await _plan(cur, namespace_id, instance, row, state, held, now)
        before = {"state": row["state"], "activation_sequence": row["activation_count"],
                  "held_error": held, **polls.state_view(query)}
        when = to_db(now)
        if plan.same_round:
            task_id = ids.new_id()
            activation_id, sequence = await _move(cur, namespace_id, raw_id, row, old,
                                                  "RUNNING", task_id, now)
            await cur.execute(INSERT_ROUND, (namespace_id, raw_id, activation_id, plan.round,
                                             row["id"], task_id, when))
            await cur.execute(CONTINUE_STATE, (
                activation_id, polls.ROUND, rounds, _db(new_deadline), plan.round,
                plan.attempts_used, None, when, namespace_id, raw_id, row["id"]))
            await cur.execute(POINT_ADVANCE, (activation_id, namespace_id, raw_id, row["id"]))
            # Last, as in an advance: the task and the queue and application counters.
            await _round_task(cur, namespace_id, instance, row, plan, task_id, activation_id,
                              reason, now)
        else:
            activation_id, sequence = await _move(cur, namespace_id, raw_id, row, old,
                                                  "WAITING", None, now)
            await cur.execute(CONTINUE_STATE, (
                activation_id, polls.WAITING, rounds, _db(new_deadline), plan.round, 0,
                _db(plan.due_at), when, namespace_id, raw_id, row["id"]))
            await cur.execute(ARM_ADVANCE, (namespace_id, ids.new_id(), raw_id, row["id"],
                                            activation_id, "POLL", _db(plan.due_at), when))
        await _record(
            cur, who, namespace_id=namespace_id, instance_id=raw_id, step=row,
            verb="continued", action="continue", reason=reason, before=before,
            after={"state": "RUNNING" if plan.same_round else "WAITING",
                   "activation_sequence": sequence,
                   "superseded_sequence": row["activation_count"],
                   "granted_rounds": rounds, "deadline_ms": deadline_ms,
                   "continued_deadline_at": _iso(new_deadline),
                   "round": plan.round, "same_round": plan.same_round,
                   "round_budget": plan.budget, "attempts_used": plan.attempts_used,
                   "attempts_allowed": plan.allowed, "next_round_at": _iso(plan.due_at),
                   "task_id": plan.task_id.hex() if plan.task_id else None},
            request_id=request_id)
        return 201, await step_detail(cur, namespace_id, raw_id, row["id"]), row["id"]

    return act


def _db(value: dt.datetime | None) -> Any:
    return None if value is None else to_db(value)


def _query(row: dict[str, Any], new_deadline: dt.datetime | None) -> polls.PollState:
    """The query's row in memory, with the continue's new deadline in force."""
    return polls.PollState(
        instance_id=row["instance_id"], step_id=row["step_id"],
        activation_id=row["activation_id"], state=row["state"], used_rounds=row["used_rounds"],
        max_rounds=row["max_rounds"], next_interval_ms=row["next_interval_ms"],
        next_round_at=None, deadline_at=None if row["deadline_at"] is None
        else as_utc(row["deadline_at"]), granted_rounds=row["granted_rounds"],
        continued_deadline_at=new_deadline or (None if row["continued_deadline_at"] is None
                                               else as_utc(row["continued_deadline_at"])))


async def _continuable(cur: Any, namespace_id: bytes, instance_id: bytes, row: dict[str, Any]
                       ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The LIVE activation, the query row and the held error of a POLL step held after it
    exhausted or after a round task failed; else the precise refusal."""
    name = row["name"]
    if row["kind"] != "POLL":
        raise PollNotContinuable(f"step {name!r} is a {row['kind']} step; only a POLL step"
                                 " can be continued")
    held = _held_error(row)
    if row["state"] != "WAITING" or row["held_at"] is None or not isinstance(held, dict):
        detail = (" (its round's task awaits review: review or resolve it)"
                  if row["state"] == "WAITING" else "")
        raise PollNotContinuable(f"step {name!r} is {row['state']} and not held{detail}: only"
                                 " a step held after poll_exhausted or a failed round task"
                                 " can be continued")
    if row["resolution"] is not None:
        raise PollNotContinuable(f"step {name!r} has a recorded conclusion; the engine"
                                 " advances it with that")
    if held.get("error") not in CONTINUABLE:
        raise PollNotContinuable(f"step {name!r} is held after {held.get('error')!r}; only"
                                 " poll_exhausted or task_failed can be continued (resolve"
                                 " the step instead)")
    await cur.execute(POLL_STATE, (namespace_id, instance_id, row["id"]))
    query = await cur.fetchone()
    await cur.execute(LOCK_ADVANCE, (namespace_id, instance_id, row["id"], "POLL"))
    if query is None or query["state"] not in (polls.EXHAUSTED, polls.FAILED):
        raise PollNotContinuable(f"step {name!r}'s query is"
                                 f" {query['state'] if query else 'not started'}")
    old = await _live(cur, namespace_id, row)
    if old is None:
        raise errors.DatabaseError(f"held step {name!r} has no LIVE activation")
    return old, dict(query), held


class _Plan:
    """What a continue does: the same (cut-short) round at once with its remaining attempts,
    or a new business round after the stored interval."""

    def __init__(self, *, round_number: int, same_round: bool, budget: int | None,
                 attempts_used: int, due_at: dt.datetime | None,
                 deadline_at: dt.datetime | None = None, last_task: bytes | None = None,
                 start_window: dt.timedelta | None = None) -> None:
        self.round = round_number
        self.same_round = same_round
        self.budget = budget
        self.attempts_used = attempts_used
        self.due_at = due_at
        self.deadline_at = deadline_at
        self.last_task = last_task
        self.start_window = start_window
        self.task_id: bytes | None = None

    @property
    def allowed(self) -> int | None:
        return None if self.budget is None else self.budget - self.attempts_used


async def _plan(cur: Any, namespace_id: bytes,  # noqa: PLR0917
                instance: dict[str, Any], row: dict[str, Any], state: polls.PollState,
                held: dict[str, Any], now: dt.datetime) -> _Plan:
    """Decide the continuation (the module docstring); refuse one whose next round could not
    run before the query deadline."""
    deadline = state.query_deadline
    if held.get("error") == TASK_FAILED and state.used_rounds >= 1:
        await cur.execute(ROUND_TASKS, (namespace_id, instance["id"], row["id"],
                                        state.used_rounds))
        tasks_of_round = [dict(r) for r in await cur.fetchall()]
        if tasks_of_round and tasks_of_round[-1]["round_state"] in (polls.FAILED,
                                                                   polls.CANCELLED):
            first = tasks_of_round[0]
            used = sum(t["starts_used"] for t in tasks_of_round)
            budget = first["max_attempts"]
            request_deadline = await _request_deadline(cur, namespace_id, instance, row,
                                                       as_utc(first["created_at"]))
            if deadline is not None:
                request_deadline = (deadline if request_deadline is None
                                    else min(request_deadline, deadline))
            if budget - used >= 1 and (request_deadline is None or request_deadline > now):
                return _Plan(round_number=state.used_rounds, same_round=True, budget=budget,
                             attempts_used=used, due_at=None, deadline_at=request_deadline,
                             last_task=tasks_of_round[-1]["task_id"],
                             start_window=_window(tasks_of_round[-1]))
    due = now + dt.timedelta(milliseconds=state.next_interval_ms)
    if deadline is not None and due >= deadline:
        raise PollNotContinuable(
            f"the query deadline {_iso(deadline)} passes before the next round at {_iso(due)}"
            " (now + the stored interval of"
            f" {state.next_interval_ms} ms); give a new deadline_ms")
    return _Plan(round_number=state.used_rounds + 1, same_round=False, budget=None,
                 attempts_used=0, due_at=due)


def _window(task: dict[str, Any]) -> dt.timedelta | None:
    """A task's start window (its start deadline after its creation), kept relative."""
    if task["start_deadline_at"] is None:
        return None
    return as_utc(task["start_deadline_at"]) - as_utc(task["created_at"])


async def _request_deadline(cur: Any, namespace_id: bytes, instance: dict[str, Any],
                            row: dict[str, Any], created: dt.datetime) -> dt.datetime | None:
    """A round's request deadline: its first task's creation + the step's ``deadline_ms``
    (the pinned version's; absolute, never reset)."""
    pinned = await definitions.load_version(cur, namespace_id, instance["definition_id"],
                                             instance["version"])
    step = pinned.definition.all_steps.get(row["name"])
    if not isinstance(step, PollStep):
        raise errors.DatabaseError(f"step {row['name']!r} is not a POLL step of its version")
    if step.options.deadline_ms is None:
        return None
    return created + dt.timedelta(milliseconds=step.options.deadline_ms)


async def _round_task(cur: Any, namespace_id: bytes,  # noqa: PLR0917
                      instance: dict[str, Any], row: dict[str, Any], plan: _Plan,
                      task_id: bytes, activation_id: bytes, reason: str,
                      now: dt.datetime) -> None:
    """The continued round's task (``retry_of`` the round's last task), counted against the
    queue's and the application's limits like any submission, with its accepted event."""
    if plan.last_task is None or plan.allowed is None:
        raise errors.DatabaseError("a continued round without its task")
    await cur.execute(TASKS_MADE, (namespace_id, instance["id"]))
    sequence = int((await cur.fetchone())["n"]) + 1
    start_deadline = None if plan.start_window is None else now + plan.start_window
    await cur.execute(ROUND_TASK_INSERT, (
        to_db(now), _db(plan.deadline_at), _db(start_deadline), plan.allowed, task_id,
        instance["id"], instance["gate_id"], namespace_id, plan.last_task))
    if cur.rowcount != 1:
        raise errors.DatabaseError("the round's task to continue is gone")
    await cur.execute(TASK_QUEUE, (namespace_id, task_id))
    queue_id = (await cur.fetchone())["queue_id"]
    await resources.apply(cur, namespace_id,
                          resources.Usage(unfinished=Counter({queue_id: 1})), admit=True)
    await append_events(cur, [leases.task_event(
        namespace_id, task_id, 1, "task.accepted", None, TaskState.WAITING,
        {"retry_of": plan.last_task.hex(), "reason": reason,
         "workflow": {"instance_id": instance["id"].hex(), "step": row["name"],
                      "activation_id": activation_id.hex(), "sequence": sequence}})])
    plan.task_id = task_id


# --- the operator's commands (``orbit admin workflows steps rearm|continue``) -------------------


async def _operator(db: Database, name: str, namespace: str, act: namespaced.Act
                    ) -> dict[str, Any]:
    from orbit_common.weave import operator  # noqa: PLC0415 - operator imports the views

    async def body(cur: Any) -> dict[str, Any]:
        ns = await operator.namespace_of(cur, namespace)
        _, view, _ = await act(cur, ns.id)
        return view

    return await db.transaction(name, body)


async def operator_rearm(db: Database, *, namespace: str, instance_id: str, step: str,
                         reason: str, step_revision: int, timeout_ms: int, actor: Actor
                         ) -> dict[str, Any]:
    """Re-arm by the operator (the database credentials; the audit names ``actor``)."""
    check_rearm(reason, step_revision, timeout_ms)
    return await _operator(db, "weave.operator.rearm", namespace, _rearm(
        Who(actor=actor), _raw_id(instance_id), step, reason, step_revision, timeout_ms,
        None))


async def operator_continue(db: Database, *, namespace: str, instance_id: str, step: str,
                            reason: str, step_revision: int, rounds: int,
                            deadline_ms: int | None, actor: Actor) -> dict[str, Any]:
    """Continue by the operator (the database credentials; the audit names ``actor``)."""
    check_continue(reason, step_revision, rounds, deadline_ms)
    return await _operator(db, "weave.operator.continue", namespace, _continue(
        Who(actor=actor), _raw_id(instance_id), step, reason, step_revision, rounds,
        deadline_ms, None))

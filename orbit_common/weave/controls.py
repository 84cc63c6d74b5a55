"""Pause and resume of a workflow instance (000 §1 invariant 12, §5 "流程暂停 / 继续", §6.3;
docs/weave/pause.md).

Each is one transaction, in the lock order of an advance (the instance row first):

1. the idempotency identity (``Idempotency-Key``: a replay returns the original receipt);
2. the instance row ``FOR UPDATE`` -- every advance of the instance locks it first, so a pause
   waits for an advance in flight and every later advance sees the flag;
3. its execution gate (``pulse_execution_gates``, ``owner_kind = 'WORKFLOW'``) ``FOR UPDATE``:
   PAUSED / OPEN with ``control_revision + 1`` -- claims and starts read the gate with a shared
   lock, so a pause serialises with them: no new grant, no new start approval;
4. the instance's RESUME pending advance (one per instance, on its ``$root`` step): a pause
   writes it PENDING, due never (:data:`PARKED`) -- the resumable record the engine's parked
   checkpoints belong to; a resume makes it due now (or DONE when nothing was parked);
5. on resume, the instance's parked signals become available again;
6. the instance's ``paused`` flag and ``control_revision + 1``, one event on the gate's
   aggregate (``workflow.paused`` / ``workflow.resumed``), one audit record with the actor and
   the reason.

The instance's execution state (``state``) does not change: ``paused`` is kept apart from it
(001 "暂停"). Pausing a paused instance (resuming a running one) returns it unchanged: no new
control revision, no event, no audit. ``control_revision`` in the request is a compare-and-set
on the instance's control revision (``stale_revision`` when it moved). An ended instance is
``workflow_instance_finished``; a stopping one (a cancel or a failure settlement recorded its
stop intent and closed its gate for good: docs/weave/stop.md) is ``workflow_instance_stopping``
-- a resume can never reopen a stopped instance's gate.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from orbit_common import errors
from orbit_common.db.clock import db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import Replay
from orbit_common.platform.namespaces import find_namespace
from orbit_common.weave import instances
from orbit_common.weave.signals import InstanceFinished

# A parked row's due time: the lease scans (``due_at <= now``) never reach it.
PARKED = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)
REASON_MAX = 1024


class InstanceStopping(errors.Conflict):
    code = "workflow_instance_stopping"
    title = "The workflow instance is stopping"

LOCK_INSTANCE = ("SELECT id, state, paused, control_revision, checkpoints, gate_id"
                 " FROM weave_instances WHERE namespace_id = %s AND id = %s FOR UPDATE")
LOCK_GATE = ("SELECT state, control_revision FROM pulse_execution_gates"
             " WHERE namespace_id = %s AND id = %s FOR UPDATE")
SET_GATE = ("UPDATE pulse_execution_gates SET state = %s, reason = %s,"
            " control_revision = control_revision + 1, updated_at = %s"
            " WHERE namespace_id = %s AND id = %s")
ROOT = ("SELECT id FROM weave_steps WHERE namespace_id = %s AND instance_id = %s"
        " AND name = '$root'")
ARM_RESUME = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id, kind,"
              " state, due_at, attempts, created_at) VALUES (%s, %s, %s, %s, 'RESUME', 'PENDING',"
              " %s, 0, %s) ON DUPLICATE KEY UPDATE state = 'PENDING', due_at = VALUES(due_at),"
              " lease_owner = NULL, lease_expires_at = NULL, done_at = NULL")
WAKE_RESUME = ("UPDATE weave_pending_advances SET due_at = %s WHERE namespace_id = %s"
               " AND instance_id = %s AND kind = 'RESUME' AND state = 'PENDING'")
RESUME_DONE = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s,"
               " lease_owner = NULL, lease_expires_at = NULL WHERE namespace_id = %s"
               " AND instance_id = %s AND kind = 'RESUME' AND state <> 'DONE'")
WAKE_SIGNALS = ("UPDATE weave_signals SET available_at = %s WHERE namespace_id = %s"
                " AND instance_id = %s AND state = 'PENDING' AND available_at = %s")
SET_INSTANCE = ("UPDATE weave_instances SET paused = %s, control_revision = control_revision + 1,"
                " updated_at = %s WHERE namespace_id = %s AND id = %s")


def check_request(reason: Any, control_revision: Any) -> None:
    """The request's fields: ``reason`` 1-1024 characters (required: a pause or resume is an
    operator's intervention, 000 §1 invariant 8), ``control_revision`` an integer ≥ 1 or
    absent."""
    problems = []
    if not isinstance(reason, str) or not 1 <= len(reason) <= REASON_MAX:
        problems.append({"path": "$.reason",
                         "message": f"required: a string of 1-{REASON_MAX} characters"})
    if control_revision is not None and (isinstance(control_revision, bool)
                                         or not isinstance(control_revision, int)
                                         or control_revision < 1):
        problems.append({"path": "$.control_revision", "message": "an integer ≥ 1"})
    if problems:
        raise errors.ValidationFailed(problems)


async def change_pause(cur: Any, namespace_id: bytes, raw_id: bytes, *, paused: bool,
                       reason: str, control_revision: int | None, actor: Actor,
                       application_id: bytes, request_id: str | None) -> dict[str, Any]:
    """The pause (``paused``) or resume transaction's work on the caller's connection (see the
    module docstring; the caller owns the transaction and any idempotency record): the
    instance's view after it. Used by the API (:func:`set_paused`) and the operator command
    (:func:`operator_set_paused`)."""
    verb = "pause" if paused else "resume"
    await cur.execute(LOCK_INSTANCE, (namespace_id, raw_id))
    row = await cur.fetchone()
    if row is None:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")
    if control_revision is not None and row["control_revision"] != control_revision:
        raise errors.StaleRevision(
            f"the instance's control revision is {row['control_revision']}, not"
            f" {control_revision}; read it again")
    if row["state"] == "STOPPING":
        raise InstanceStopping(f"workflow instance {raw_id.hex()} is stopping: its gate"
                               " stays closed; it settles when its in-flight steps end")
    if row["state"] != "RUNNING":
        raise InstanceFinished(f"workflow instance {raw_id.hex()} is {row['state']}")
    if bool(row["paused"]) == paused:
        return await instances.detail(cur, namespace_id, raw_id)
    now = await db_now(cur)
    when = to_db(now)
    await cur.execute(LOCK_GATE, (namespace_id, row["gate_id"]))
    gate = await cur.fetchone()
    if gate is None:
        raise errors.DatabaseError(f"workflow instance {raw_id.hex()} has no gate")
    await cur.execute(SET_GATE, ("PAUSED" if paused else "OPEN", reason, when,
                                 namespace_id, row["gate_id"]))
    if paused:
        await cur.execute(ROOT, (namespace_id, raw_id))
        root = await cur.fetchone()
        if root is None:
            raise errors.DatabaseError(f"workflow instance {raw_id.hex()} has no root")
        await cur.execute(ARM_RESUME, (namespace_id, ids.new_id(), raw_id, root["id"],
                                       to_db(PARKED), when))
    elif row["checkpoints"]:
        await cur.execute(WAKE_RESUME, (when, namespace_id, raw_id))
    else:  # nothing was parked: nothing to replay
        await cur.execute(RESUME_DONE, (when, namespace_id, raw_id))
    if not paused:
        await cur.execute(WAKE_SIGNALS, (when, namespace_id, raw_id, to_db(PARKED)))
    await cur.execute(SET_INSTANCE, (int(paused), when, namespace_id, raw_id))
    revision = row["control_revision"] + 1
    payload = {"workflow_id": raw_id.hex(), "reason": reason,
               "control_revision": revision, "checkpoints": row["checkpoints"]}
    await append_event(cur, namespace_id=namespace_id, aggregate_type="execution_gate",
                       aggregate_id=row["gate_id"],
                       aggregate_revision=gate["control_revision"] + 1,
                       event_type=f"workflow.{verb}d", from_state=gate["state"],
                       to_state="PAUSED" if paused else "OPEN", payload=payload)
    await append_audit(cur, AuditRecord(
        actor=actor, action=f"workflow.{verb}d",
        resource_type="workflow_instance", resource_id=raw_id, resource_revision=revision,
        namespace_id=namespace_id, application_id=application_id,
        reason=reason, before={"paused": bool(row["paused"]),
                               "control_revision": row["control_revision"]},
        after={"paused": paused, "control_revision": revision,
               "checkpoints": row["checkpoints"]},
        request_id=request_id))
    return await instances.detail(cur, namespace_id, raw_id)


async def set_paused(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str, paused: bool, reason: str,
                     control_revision: int | None = None, idempotency_key: str | None = None,
                     request_id: str | None = None) -> Replay:
    """``POST …/workflows/{workflow_id}/pause`` (``paused``) and ``…/resume``: 200 with the
    instance (see the module docstring)."""
    check_request(reason, control_revision)
    verb = "pause" if paused else "resume"
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError:
        raw_id = bytes(16)  # authorization first; then the 404 of an unknown instance
    idem = namespaced.request(f"workflows.instances.{verb}", idempotency_key, raw_id,
                              {"reason": reason, "control_revision": control_revision},
                              principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        view = await change_pause(cur, namespace_id, raw_id, paused=paused, reason=reason,
                                  control_revision=control_revision, actor=principal.actor,
                                  application_id=principal.application_id,
                                  request_id=request_id)
        return 200, view, raw_id

    return await namespaced.run(db, f"workflows.instances.{verb}", principal=principal,
                                action=authz.Action.WORKFLOWS_CONTROL, namespace=namespace,
                                idem=idem, act=act)


async def operator_set_paused(db: Database, *, namespace: str, instance_id: str,
                              paused: bool, actor: Actor, reason: str,
                              control_revision: int | None = None) -> dict[str, Any]:
    """Pause (``paused``) or resume the instance as the operator (``orbit admin workflows
    pause/resume``: the namespace by name, no credential or grant, audited with the operator as
    actor and the namespace's application): the API's rules (a reason of
    1-1024 characters, the control revision compare-and-set, ``workflow_instance_finished``
    for an ended instance, a repeat returns the instance unchanged); the instance after it."""
    check_request(reason, control_revision)
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> dict[str, Any]:
        ns = await find_namespace(cur, namespace)
        if ns is None:
            raise errors.NamespaceNotFound(f"no namespace {namespace!r}")
        return await change_pause(cur, ns.id, raw_id, paused=paused, reason=reason,
                                  control_revision=control_revision, actor=actor,
                                  application_id=ns.application_id, request_id=None)

    verb = "pause" if paused else "resume"
    return await db.transaction(f"weave.operator.{verb}", body)

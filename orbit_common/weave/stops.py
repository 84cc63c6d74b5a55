"""A user's cancel of a workflow instance: the stop intent CANCEL (specification 001 000021;
docs/weave/stop.md). The engine's side of a stop -- the failure settlement, the results that
arrive while an instance stops, the settlement itself -- is in ``engine.py``.

``POST …/workflows/{workflow_id}/cancel`` is one transaction, in the lock order of an advance
(the instance row first; docs/architecture.md):

1. the idempotency identity (``Idempotency-Key``: a replay returns the original receipt);
2. the instance row ``FOR UPDATE`` (every advance locks it first: the cancel waits for an
   advance in flight, and every later advance sees the intent); ``control_revision`` in the
   request is a compare-and-set on it (``stale_revision``);
3. its execution gate ``FOR UPDATE`` -> ``STOPPED`` (closed for good: claims and starts read it
   with a shared lock, and neither a pause nor a resume changes a stopping instance's gate);
4. its ``$root`` ROOT pending advance re-armed, due now -- the root continuation: the engine
   leases it and, the instance being STOPPING, ends what is not in flight and settles the
   instance when nothing is (so a cancel of an instance with nothing in flight settles in the
   engine's next round, not in this transaction); a paused instance's RESUME row is due now
   when it parked checkpoints (the engine replays them under the stop: results recorded on
   their steps, nothing advances) or DONE, and its parked signals become available (rejected
   as ``instance_finished``);
5. the instance: ``STOPPING``, ``stop_kind = CANCEL``, ``stop_requested_at`` and
   ``cancel_requested_at`` now, ``error = {"error": "cancelled", "cause": reason}``,
   ``paused = 0``, ``control_revision + 1``, ``revision + 1``;
6. cancel intents for its unfinished tasks (``interventions.request_cancel``, task rows in id
   order: WAITING / LEASED end CANCELLED at once, RUNNING get ``cancel_requested_at`` and the
   worker its cancel notice, NEEDS_REVIEW waits for a person; events say ``"by": "workflow"``);
7. one ``workflow.cancel_requested`` event on the instance and one audit record
   ``workflow.cancel`` (actor, reason, before/after).

202 with the instance. The first stop intent wins and is frozen: a cancel of an instance that
is already stopping changes nothing (200) -- except that an instance stopping for a FAILURE
records the user's ``cancel_requested_at`` once (with its control revision, audit and event);
its kind stays FAILURE. An ended instance is ``workflow_instance_finished``: a committed
success is never overridden.
"""

from __future__ import annotations

from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import interventions
from orbit_common.weave import controls, instances, operator
from orbit_common.weave.signals import InstanceFinished

CANCEL = "CANCEL"
FAILURE = "FAILURE"
KINDS = (CANCEL, FAILURE)
CANCELLED_BY = "workflow"

LOCK_INSTANCE = ("SELECT id, state, revision, paused, control_revision, checkpoints, gate_id,"
                 " stop_kind, stop_requested_at, cancel_requested_at FROM weave_instances"
                 " WHERE namespace_id = %s AND id = %s FOR UPDATE")
STOP_GATE = ("UPDATE pulse_execution_gates SET state = 'STOPPED', reason = %s,"
             " control_revision = control_revision + 1, updated_at = %s"
             " WHERE namespace_id = %s AND id = %s")
# The root continuation: the ROOT row of $root (DONE since the start, or still PENDING when the
# instance has not started) due now.
ARM_ROOT = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id, kind,"
            " state, due_at, attempts, created_at) VALUES (%s, %s, %s, %s, 'ROOT', 'PENDING',"
            " %s, 0, %s) ON DUPLICATE KEY UPDATE state = 'PENDING', due_at = VALUES(due_at),"
            " lease_owner = NULL, lease_expires_at = NULL, done_at = NULL")
STOP_INSTANCE = ("UPDATE weave_instances SET state = 'STOPPING', stop_kind = 'CANCEL',"
                 " stop_requested_at = %s, cancel_requested_at = %s, error = %s, paused = 0,"
                 " control_revision = control_revision + 1, revision = revision + 1,"
                 " updated_at = %s WHERE namespace_id = %s AND id = %s AND state = 'RUNNING'")
NOTE_CANCEL = ("UPDATE weave_instances SET cancel_requested_at = %s,"
               " control_revision = control_revision + 1, revision = revision + 1,"
               " updated_at = %s WHERE namespace_id = %s AND id = %s AND state = 'STOPPING'"
               " AND cancel_requested_at IS NULL")
# The instance's tasks that may still run (owner index: ix_tasks_owner).
UNFINISHED_TASKS = ("SELECT id FROM pulse_tasks WHERE namespace_id = %s"
                    " AND owner_kind = 'WORKFLOW' AND owner_id = %s"
                    " AND state IN ('WAITING', 'LEASED', 'RUNNING') ORDER BY id")


async def cancel(db: Database, principal: credentials.Principal, *, namespace: str,
                 instance_id: str, reason: str, control_revision: int | None = None,
                 idempotency_key: str | None = None, request_id: str | None = None) -> Replay:
    """``POST …/workflows/{workflow_id}/cancel`` (see the module docstring): 202 with the
    instance when the stop intent is recorded, 200 when it already stopped."""
    controls.check_request(reason, control_revision)
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError:
        raw_id = bytes(16)  # authorization first; then the 404 of an unknown instance
    idem = namespaced.request("workflows.instances.cancel", idempotency_key, raw_id,
                              {"reason": reason, "control_revision": control_revision},
                              principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        who = _Who(actor=principal.actor, application_id=principal.application_id,
                   request_id=request_id)
        return await _cancel(cur, who, namespace_id, raw_id, reason, control_revision)

    return await namespaced.run(db, "workflows.instances.cancel", principal=principal,
                                action=authz.Action.WORKFLOWS_CONTROL, namespace=namespace,
                                idem=idem, act=act)


async def operator_cancel(db: Database, *, namespace: str, instance_id: str, reason: str,
                          actor: Actor, control_revision: int | None = None
                          ) -> tuple[int, dict[str, Any]]:
    """``orbit admin workflows cancel``: the same transaction with the operator's identity
    (the database credentials of the command line; no API credential, no idempotency key)."""
    controls.check_request(reason, control_revision)
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> tuple[int, dict[str, Any]]:
        ns = await operator.namespace_of(cur, namespace)
        who = _Who(actor=actor, application_id=ns.application_id, request_id=None)
        status, view, _ = await _cancel(cur, who, ns.id, raw_id, reason, control_revision)
        return status, view

    return await db.transaction("weave.operator.cancel", body)


@attrs.frozen(kw_only=True)
class _Who:
    """Who cancels: recorded in the audit record."""

    actor: Actor
    application_id: bytes
    request_id: str | None


async def _cancel(cur: Any, who: _Who, namespace_id: bytes,  # noqa: PLR0917
                  raw_id: bytes, reason: str, control_revision: int | None
                  ) -> tuple[int, dict[str, Any], bytes]:
    await cur.execute(LOCK_INSTANCE, (namespace_id, raw_id))
    row = await cur.fetchone()
    if row is None:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")
    if control_revision is not None and row["control_revision"] != control_revision:
        raise errors.StaleRevision(
            f"the instance's control revision is {row['control_revision']}, not"
            f" {control_revision}; read it again")
    if row["state"] not in ("RUNNING", "STOPPING"):
        raise InstanceFinished(f"workflow instance {raw_id.hex()} is {row['state']}")
    now = await db_now(cur)
    if row["state"] == "STOPPING":
        if row["cancel_requested_at"] is None:
            await _note(cur, who, namespace_id, dict(row), reason, to_db(now))
        return 200, await instances.detail(cur, namespace_id, raw_id), raw_id
    await _stop(cur, who, namespace_id, dict(row), reason, now)
    return 202, await instances.detail(cur, namespace_id, raw_id), raw_id


async def _stop(cur: Any, who: _Who, namespace_id: bytes,  # noqa: PLR0917
                row: dict[str, Any], reason: str, now: Any) -> None:
    """The stop intent of a RUNNING instance (locked), steps 3-7 of the module docstring."""
    raw_id, when = row["id"], to_db(now)
    await cur.execute(controls.LOCK_GATE, (namespace_id, row["gate_id"]))
    gate = await cur.fetchone()
    if gate is None:
        raise errors.DatabaseError(f"workflow instance {raw_id.hex()} has no gate")
    await cur.execute(STOP_GATE, (reason, when, namespace_id, row["gate_id"]))
    await cur.execute(controls.ROOT, (namespace_id, raw_id))
    root = await cur.fetchone()
    if root is None:
        raise errors.DatabaseError(f"workflow instance {raw_id.hex()} has no root")
    await cur.execute(ARM_ROOT, (namespace_id, ids.new_id(), raw_id, root["id"], when, when))
    if row["paused"]:
        if row["checkpoints"]:  # replayed by the engine under the stop: nothing advances
            await cur.execute(controls.WAKE_RESUME, (when, namespace_id, raw_id))
        else:
            await cur.execute(controls.RESUME_DONE, (when, namespace_id, raw_id))
        await cur.execute(controls.WAKE_SIGNALS, (when, namespace_id, raw_id,
                                                  to_db(controls.PARKED)))
    error = {"error": "cancelled", "cause": reason}
    await cur.execute(STOP_INSTANCE, (when, when, jsondoc.dumps(error), when, namespace_id,
                                      raw_id))
    if cur.rowcount != 1:
        raise errors.DatabaseError(f"workflow instance {raw_id.hex()} changed under its lock")
    await cur.execute(UNFINISHED_TASKS, (namespace_id, raw_id))
    task_ids = [r["id"] for r in await cur.fetchall()]
    asked = {}
    if task_ids:
        done = await interventions.request_cancel(cur, namespace_id, task_ids, reason=reason,
                                                  now=now, by=CANCELLED_BY)
        asked = {task_id.hex(): outcome for task_id, outcome in sorted(done.items())}
    revision = row["control_revision"] + 1
    payload = {"workflow_id": raw_id.hex(), "reason": reason, "stop_kind": CANCEL,
               "control_revision": revision, "paused": bool(row["paused"]), "tasks": asked}
    await append_event(cur, namespace_id=namespace_id, aggregate_type="workflow_instance",
                       aggregate_id=raw_id, aggregate_revision=row["revision"] + 1,
                       event_type="workflow.cancel_requested", from_state="RUNNING",
                       to_state="STOPPING", payload=payload)
    await append_audit(cur, AuditRecord(
        actor=who.actor, action="workflow.cancel", resource_type="workflow_instance",
        resource_id=raw_id, resource_revision=revision, namespace_id=namespace_id,
        application_id=who.application_id, reason=reason,
        before={"state": "RUNNING", "paused": bool(row["paused"]),
                "control_revision": row["control_revision"], "gate": gate["state"]},
        after={"state": "STOPPING", "stop_kind": CANCEL, "paused": False,
               "control_revision": revision, "gate": "STOPPED", "tasks": asked},
        request_id=who.request_id))


async def _note(cur: Any, who: _Who, namespace_id: bytes,  # noqa: PLR0917
                row: dict[str, Any], reason: str, when: Any) -> None:
    """A user's cancel of an instance stopping for a FAILURE: only ``cancel_requested_at``
    (the intent stays FAILURE, frozen); its tasks were asked to stop by the engine."""
    raw_id = row["id"]
    await cur.execute(NOTE_CANCEL, (when, when, namespace_id, raw_id))
    if cur.rowcount != 1:
        raise errors.DatabaseError(f"workflow instance {raw_id.hex()} changed under its lock")
    revision = row["control_revision"] + 1
    await append_event(cur, namespace_id=namespace_id, aggregate_type="workflow_instance",
                       aggregate_id=raw_id, aggregate_revision=row["revision"] + 1,
                       event_type="workflow.cancel_requested", from_state="STOPPING",
                       to_state="STOPPING",
                       payload={"workflow_id": raw_id.hex(), "reason": reason,
                                "stop_kind": row["stop_kind"], "control_revision": revision})
    await append_audit(cur, AuditRecord(
        actor=who.actor, action="workflow.cancel", resource_type="workflow_instance",
        resource_id=raw_id, resource_revision=revision, namespace_id=namespace_id,
        application_id=who.application_id, reason=reason,
        before={"state": "STOPPING", "stop_kind": row["stop_kind"],
                "control_revision": row["control_revision"], "cancel_requested": False},
        after={"state": "STOPPING", "stop_kind": row["stop_kind"],
               "control_revision": revision, "cancel_requested": True},
        request_id=who.request_id))

"""Renew: extend execution leases (specification 000 §3 "续租").

    RUNNING --renew--> RUNNING (lease extended)

Only a live RUNNING attempt whose lease has not expired (database time) is renewed, and only
for a session of the attempt's worker instance that is ACTIVE and alive; a new session of that
instance (a reconnected worker) adopts the attempt here: the attempt records it, so cancel
notices reach the worker where it is now. The answer carries the task's cancel intent. A
refused renewal from an authentic holder (right token and generation) is kept as late evidence.

Renewals touch only their attempts and tasks, no counter rows, so they never wait behind claims
or finishes on the shared rows. Locks: the session (shared), tasks, attempts (FOR UPDATE).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common.db.batch import values_table
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.pulse.leases.common import (
    AttemptRef,
    SessionIdentity,
    check_batch,
    evidence_row,
    expect_rows,
    identity_refusal,
    insert_evidence,
    lock_for,
)
from orbit_common.pulse.leases.start import execution_lease
from orbit_common.pulse.model import AttemptState


@attrs.frozen(kw_only=True)
class RenewOutcome:
    attempt_id: bytes
    renewed: bool
    reason: str | None = None
    lease_expires_at: dt.datetime | None = None
    cancel_requested: bool = False


RENEW_ATTEMPTS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_attempts a"
    " ON a.namespace_id = %s AND a.id = v.attempt_id"
    " SET a.lease_expires_at = v.expires, a.renewals = a.renewals + 1,"
    "     a.worker_session_id = %s"
    " WHERE a.state = 'RUNNING'"
    "   AND a.lease_expires_at > UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
)
RENEW_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.task_id"
    " SET t.lease_expires_at = v.expires, t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.state = 'RUNNING'"
    "   AND t.current_attempt_id = v.attempt_id"
)


async def renew(cur: Any, session: SessionIdentity,
                refs: Sequence[AttemptRef]) -> list[RenewOutcome]:
    """Extend execution leases (the module docstring), answered per item."""
    check_batch(refs)
    namespace_id = session.namespace_id
    locked, live = await lock_for(cur, session, [r.attempt_id for r in refs])
    now = await db_now(cur)
    outcomes: list[RenewOutcome] = []
    renewals: dict[bytes, tuple[Any, ...]] = {}
    evidence: list[tuple[Any, ...]] = []
    for ref in refs:
        lk = locked.get(ref.attempt_id)
        if lk is None or not lk.matches(ref):
            outcomes.append(RenewOutcome(attempt_id=ref.attempt_id, renewed=False,
                                         reason="invalid_attempt"))
            continue
        cancel = lk.task["cancel_requested_at"] is not None
        reason = identity_refusal(lk, session, live)
        if reason is None and (lk.attempt["state"] != AttemptState.RUNNING or not lk.is_live()):
            reason = "attempt_finished"
        elif reason is None and as_utc(lk.attempt["lease_expires_at"]) <= now:
            reason = "lease_expired"
        if reason is not None:
            evidence.append(evidence_row(namespace_id, lk, "RENEW", None, {}, reason))
            outcomes.append(RenewOutcome(attempt_id=ref.attempt_id, renewed=False,
                                         reason=reason, cancel_requested=cancel))
            continue
        expires = execution_lease(now, lk.task, as_utc(lk.attempt["started_at"]))
        renewals[ref.attempt_id] = (lk.attempt["id"], lk.task["id"], to_db(expires))
        outcomes.append(RenewOutcome(attempt_id=ref.attempt_id, renewed=True,
                                     lease_expires_at=expires, cancel_requested=cancel))
    if renewals:
        table, values = values_table(["attempt_id", "task_id", "expires"], list(renewals.values()))
        await cur.execute(RENEW_ATTEMPTS.format(table=table), (*values, namespace_id, session.id))
        expect_rows(cur, len(renewals), "renew attempts")
        await cur.execute(RENEW_TASKS.format(table=table), (*values, namespace_id))
        expect_rows(cur, len(renewals), "renew tasks")
    await insert_evidence(cur, evidence)
    return outcomes

"""The worker gateway's transactions: every transaction the dispatcher runs, by name.

The dispatcher (``orbit_dispatcher``) owns connections, frames and the claim pool; each database
step it takes is one function here, which opens the transaction and calls the domain bodies in
``workers.py`` and ``leases.py`` (their docstrings state what they lock, in the order of
docs/architecture.md). Nothing here decides anything the bodies do not: these functions only
draw the transaction boundaries and name them (the name labels the runner's metrics).

Sessions: :func:`register`, :func:`load_session`, :func:`heartbeat`, :func:`close`,
:func:`active_credentials`. Attempts:
:func:`claim`, :func:`start`, :func:`renew`, :func:`finish`, :func:`cancel_requested`. Recovery
(every replica, SKIP LOCKED): :func:`recover_leases`, :func:`expire_waiting`,
:func:`expire_sessions`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.platform.credentials import Principal
from orbit_common.pulse import leases, outages, workers
from orbit_common.pulse.workers import QueueRef, Session

# Running attempts of a session whose task has a cancel request (the dispatcher pushes notices).
CANCEL_REQUESTED = """
SELECT a.id FROM pulse_attempts a JOIN pulse_tasks t
  ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE a.namespace_id = %s AND a.worker_session_id = %s AND a.state = 'RUNNING'
  AND t.cancel_requested_at IS NOT NULL AND t.current_attempt_id = a.id
"""

# --- sessions ------------------------------------------------------------------------------


async def register(db: Database, principal: Principal, *, namespace: str, instance_key: str,
                   queues: Sequence[str], handlers: Sequence[str], max_in_flight: int,
                   session_id: bytes, instance_id: bytes, node: str | None,
                   name: str = "dispatch.register",
                   ttl_s: int = workers.SESSION_TTL_S) -> Session:
    """A new session, fencing the instance's older ones (:func:`workers.register`)."""
    return await db.transaction(name, lambda cur: workers.register(
        cur, principal, namespace=namespace, instance_key=instance_key, queues=queues,
        handlers=handlers, max_in_flight=max_in_flight, session_id=session_id,
        instance_id=instance_id, node=node, ttl_s=ttl_s))


async def load_session(db: Database, principal: Principal, *, namespace: str,
                       session_id: bytes) -> tuple[Session, bool]:
    """The caller's session and whether it is ACTIVE and alive (read-only)."""
    return await db.read("dispatch.session", lambda cur: workers.load(
        cur, principal, namespace=namespace, session_id=session_id))


async def heartbeat(db: Database, session: Session, *, name: str = "dispatch.heartbeat") -> None:
    """Extend the session; :class:`workers.SessionLost` when it was fenced or expired."""
    await db.transaction(name, lambda cur: workers.heartbeat(cur, session))


async def close(db: Database, session: Session, *, name: str = "dispatch.close") -> None:
    await db.transaction(name, lambda cur: workers.close(cur, session))


async def active_credentials(db: Database, credential_ids: Sequence[bytes]) -> set[bytes]:
    """Which of the open sessions' credentials are still ACTIVE, of an ACTIVE application
    (read-only; the dispatcher closes the sessions of the others)."""
    return await db.read("dispatch.credentials",
                         lambda cur: credentials.active_among(cur, credential_ids))


# --- attempts ------------------------------------------------------------------------------


async def claim(db: Database, session: Session, queue: QueueRef, limit: int, *,
                name: str = "dispatch.claim") -> list[leases.Grant]:
    """One claim transaction for ``session`` on ``queue`` (:func:`leases.run_claim`)."""
    return await leases.run_claim(db, name, session, queue, limit)


async def any_due(db: Database, namespace_id: bytes, queue: QueueRef, *,
                  name: str = "dispatch.due") -> bool:
    """Whether ``queue`` has a task due now (:func:`leases.any_due`, a lock-free read)."""
    return await db.read(name, lambda cur: leases.any_due(cur, namespace_id, queue.id))


async def start(db: Database, session: Session, refs: list[leases.AttemptRef], *,
                name: str = "dispatch.start") -> list[leases.StartOutcome]:
    """Approve (or refuse) the starts of a batch of granted attempts, one outcome per ref;
    ``session`` is the caller (the execution identity)."""
    return await db.transaction(name, lambda cur: leases.start(cur, session, refs))


async def renew(db: Database, session: Session, refs: list[leases.AttemptRef], *,
                name: str = "dispatch.renew") -> list[leases.RenewOutcome]:
    return await db.transaction(name, lambda cur: leases.renew(cur, session, refs))


async def finish(db: Database, session: Session, reports: list[leases.FinishReport], *,
                 name: str = "dispatch.finish") -> list[leases.FinishOutcome]:
    return await db.transaction(name, lambda cur: leases.finish(cur, session, reports))


async def cancel_requested(db: Database, session: Session) -> list[bytes]:
    """Attempt ids of ``session``'s running attempts whose task has a cancel request."""

    async def body(cur: Any) -> list[bytes]:
        await cur.execute(CANCEL_REQUESTED, (session.namespace_id, session.id))
        return [row["id"] for row in await cur.fetchall()]

    return await db.read("dispatch.cancel_scan", body)


# --- recovery ------------------------------------------------------------------------------


async def recover_leases(db: Database, limit: int, *, outage_threshold: dt.timedelta,
                         max_offer_lapses: int = leases.DEFAULT_MAX_OFFER_LAPSES) -> int | None:
    """Resolve up to ``limit`` expired offer and execution leases; returns how many, or None
    while the fleet's heartbeat shows an outage no beat has compensated yet (it decides nothing
    then: :func:`outages.recover_expired`)."""
    return await db.transaction("recovery.leases", lambda cur: outages.recover_expired(
        cur, outage_threshold, limit, max_offer_lapses))


async def expire_waiting(db: Database, limit: int) -> int:
    """End up to ``limit`` waiting tasks past their deadlines; returns how many."""
    return await db.transaction("recovery.deadlines",
                                lambda cur: leases.expire_waiting(cur, limit))


async def expire_sessions(db: Database, limit: int) -> int:
    """Mark up to ``limit`` lapsed sessions expired; returns how many."""
    return await db.transaction("recovery.sessions",
                                lambda cur: workers.expire_lapsed(cur, limit))


async def beat(db: Database, node: str, threshold: dt.timedelta) -> outages.Beat:
    """This dispatcher's heartbeat (``dispatch.beat``): compensates an outage its gap shows
    (:func:`outages.beat`)."""
    return await db.transaction("dispatch.beat", lambda cur: outages.beat(cur, node, threshold))

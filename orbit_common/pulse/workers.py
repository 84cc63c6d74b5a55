"""Worker instances and sessions.

Identity: a *worker instance* is the stable identity a worker reports (``instance_key``, e.g.
host and process name); a *session* is one connection of it. Registering a session increments the
instance's ``session_generation`` and fences every older ACTIVE session of that instance: a fenced
session gets no new leases and its heartbeats fail. A session of the same instance adopts the
instance's attempts (start and renew record it on the attempt: ``leases/common.py``), so a worker
that reconnects keeps renewing and finishing its attempts with their attempt id, secret token and
generation.

Ownership: an instance belongs to the *credential* that registered it (``credential_id``). Only
that credential may register sessions of it, and so fence its sessions and adopt its attempts;
another credential -- even one of the same application, since every credential that can reach a
namespace is of the namespace's application -- is refused with ``instance_owned_elsewhere`` and
changes nothing. When the owner is revoked, the instance passes to the next credential that
registers it (key rotation: a worker restarted with its new key keeps its ``instance_key``
once the old key is revoked); that registration fences the revoked credential's sessions.

A session lives while it heartbeats (``expires_at`` in database time); the recovery scan marks
lapsed ones EXPIRED. Authorization (``workers.work`` on the namespace and each queue) is checked
at registration and re-checked by every claim, inside its transaction.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.batch import placeholders
from orbit_common.db.clock import as_utc
from orbit_common.model import ids, jsondoc
from orbit_common.platform import authz, credentials

SESSION_TTL_S = 30
HANDLER_PATTERN = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")
MAX_QUEUES = 64
MAX_HANDLERS = 256


class SessionState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    CLOSED = "CLOSED"
    FENCED = "FENCED"
    EXPIRED = "EXPIRED"


@attrs.frozen(kw_only=True)
class QueueRef:
    id: bytes
    name: str
    gate_id: bytes


@attrs.frozen(kw_only=True)
class Session:
    namespace_id: bytes
    namespace: str
    id: bytes
    instance_id: bytes
    generation: int
    credential_id: bytes
    queues: tuple[QueueRef, ...]
    handlers: tuple[str, ...]
    max_in_flight: int
    expires_at: dt.datetime
    application_id: bytes
    concurrency_keys: bool = True  # accepts tasks with a concurrency key (can fence with tokens)
    ttl_s: int = SESSION_TTL_S  # how long a heartbeat keeps the session alive


SELECT_INSTANCE = """
SELECT id, session_generation, credential_id FROM pulse_worker_instances
WHERE namespace_id = %s AND instance_key = %s FOR UPDATE
"""
# The owner's state, read to decide whether another credential may take the instance over.
OWNER_STATE = "SELECT state FROM orbit_credentials WHERE id = %s"
INSERT_INSTANCE = """
INSERT INTO pulse_worker_instances (namespace_id, id, instance_key, credential_id,
  session_generation, revision, created_at, updated_at)
VALUES (%s, %s, %s, %s, 0, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
BUMP_INSTANCE = """
UPDATE pulse_worker_instances
SET session_generation = session_generation + 1, revision = revision + 1,
    credential_id = %s, updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id = %s AND session_generation = %s AND credential_id = %s
"""
FENCE_OLDER = """
UPDATE pulse_worker_sessions SET state = 'FENCED', closed_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND instance_id = %s AND state = 'ACTIVE'
"""
INSERT_SESSION = """
INSERT INTO pulse_worker_sessions (namespace_id, id, instance_id, generation, credential_id,
  queues, handlers, max_in_flight, concurrency_keys, state, dispatcher_node, heartbeat_at,
  expires_at, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'ACTIVE', %s, UTC_TIMESTAMP(6),
  UTC_TIMESTAMP(6) + INTERVAL %s SECOND, UTC_TIMESTAMP(6))
"""
HEARTBEAT = """
UPDATE pulse_worker_sessions
SET heartbeat_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL %s SECOND
WHERE namespace_id = %s AND id = %s AND state = 'ACTIVE' AND expires_at > UTC_TIMESTAMP(6)
"""
CLOSE = """
UPDATE pulse_worker_sessions SET state = 'CLOSED', closed_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id = %s AND state = 'ACTIVE'
"""
# Shared lock: a fence (new session of the instance) serialises with claims of the old one.
CHECK_ACTIVE = """
SELECT expires_at > UTC_TIMESTAMP(6) AS alive FROM pulse_worker_sessions
WHERE namespace_id = %s AND id = %s AND state = 'ACTIVE' LOCK IN SHARE MODE
"""
EXPIRE_LAPSED = """
UPDATE pulse_worker_sessions SET state = 'EXPIRED', closed_at = UTC_TIMESTAMP(6)
WHERE state = 'ACTIVE' AND expires_at <= UTC_TIMESTAMP(6)
LIMIT %s
"""


def validate_registration(queues: Sequence[str], handlers: Sequence[str],
                          max_in_flight: int) -> None:
    problems = []
    if not queues or len(queues) > MAX_QUEUES or len(set(queues)) != len(queues):
        problems.append({"path": "$.queues",
                         "message": f"1-{MAX_QUEUES} distinct queue names"})
    if not handlers or len(handlers) > MAX_HANDLERS or len(set(handlers)) != len(handlers):
        problems.append({"path": "$.handlers",
                         "message": f"1-{MAX_HANDLERS} distinct handler names"})
    # Each name is checked only within the bound: a list over it is refused as a whole.
    for i, handler in enumerate(handlers[:MAX_HANDLERS]):
        if not HANDLER_PATTERN.match(handler):
            problems.append({"path": f"$.handlers[{i}]",
                             "message": "1-128 characters of A-Z a-z 0-9 . _ : -"})
    if not 1 <= max_in_flight <= 10_000:
        problems.append({"path": "$.max_in_flight", "message": "an integer from 1 to 10000"})
    if problems:
        raise errors.ValidationFailed(problems)


async def _resolve_queues(
    cur: Any, namespace_id: bytes, names: Sequence[str]
) -> tuple[QueueRef, ...]:
    await cur.execute(
        f"SELECT id, name, gate_id FROM pulse_queues WHERE namespace_id = %s"
        f" AND name IN ({placeholders(len(names))})",
        (namespace_id, *names),
    )
    found = {row["name"]: QueueRef(id=row["id"], name=row["name"], gate_id=row["gate_id"])
             for row in await cur.fetchall()}
    missing = [n for n in names if n not in found]
    if missing:
        raise errors.QueueNotFound(f"no queue named {missing[0]!r} in this namespace")
    return tuple(found[n] for n in names)


async def register(
    cur: Any,
    principal: credentials.Principal,
    *,
    namespace: str,
    instance_key: str,
    queues: Sequence[str],
    handlers: Sequence[str],
    max_in_flight: int,
    session_id: bytes,
    instance_id: bytes,
    node: str | None,
    concurrency_keys: bool = True,
    ttl_s: int = SESSION_TTL_S,
) -> Session:
    """Register a session, fencing the instance's older ones; only the instance's owner may
    (:class:`InstanceOwnedElsewhere` otherwise, and nothing changes).

    Locks, in order: the instance row (FOR UPDATE; the owner's credential row is read plainly),
    older ACTIVE session rows, the new row.
    """
    validate_registration(queues, handlers, max_in_flight)
    raw_key = instance_key.encode()
    if not 1 <= len(raw_key) <= 191:
        raise errors.ValidationFailed([{"path": "$.instance_key", "message": "1-191 bytes"}])
    ns = await credentials.authorize(cur, principal, authz.Action.WORKERS_WORK, namespace,
                                     queue=queues[0])
    for queue in queues[1:]:
        await credentials.authorize(cur, principal, authz.Action.WORKERS_WORK, namespace,
                                    queue=queue)
    refs = await _resolve_queues(cur, ns.id, queues)
    await cur.execute(SELECT_INSTANCE, (ns.id, raw_key))
    row = await cur.fetchone()
    if row is None:
        try:
            await cur.execute(INSERT_INSTANCE, (ns.id, ids.check_id(instance_id), raw_key,
                                                principal.credential_id))
        except Exception as exc:
            if not dberrors.is_duplicate(exc, "uq_worker_instances_key"):
                raise
        await cur.execute(SELECT_INSTANCE, (ns.id, raw_key))
        row = await cur.fetchone()
    instance, generation, owner = (row["id"], int(row["session_generation"]) + 1,
                                   row["credential_id"])
    if owner != principal.credential_id and await _owner_active(cur, owner):
        raise InstanceOwnedElsewhere(
            f"the worker instance {instance_key!r} belongs to another credential; register with"
            " another instance_key, or revoke that credential to hand the instance over")
    await cur.execute(BUMP_INSTANCE, (principal.credential_id, ns.id, instance, generation - 1,
                                      owner))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the worker instance changed concurrently")
    await cur.execute(FENCE_OLDER, (ns.id, instance))
    await cur.execute(INSERT_SESSION, (
        ns.id, ids.check_id(session_id), instance, generation, principal.credential_id,
        jsondoc.dumps(list(queues)), jsondoc.dumps(list(handlers)), max_in_flight,
        int(concurrency_keys), node, ttl_s,
    ))
    await cur.execute("SELECT expires_at FROM pulse_worker_sessions WHERE namespace_id = %s"
                      " AND id = %s", (ns.id, session_id))
    expires = as_utc((await cur.fetchone())["expires_at"])
    return Session(namespace_id=ns.id, namespace=namespace, id=session_id, instance_id=instance,
                   generation=generation, credential_id=principal.credential_id, queues=refs,
                   handlers=tuple(handlers), max_in_flight=max_in_flight, expires_at=expires,
                   application_id=principal.application_id, concurrency_keys=concurrency_keys,
                   ttl_s=ttl_s)


class InstanceOwnedElsewhere(errors.Conflict):
    code = "instance_owned_elsewhere"
    title = "The worker instance belongs to another credential"


async def _owner_active(cur: Any, owner: bytes) -> bool:
    """Whether the instance's owning credential still holds it (it is not revoked)."""
    await cur.execute(OWNER_STATE, (owner,))
    row = await cur.fetchone()
    return row is not None and row["state"] == credentials.CredentialState.ACTIVE


class SessionLost(errors.Conflict):
    code = "session_lost"
    title = "The worker session is closed, expired or fenced by a newer session"


async def heartbeat(cur: Any, session: Session) -> None:
    await cur.execute(HEARTBEAT, (session.ttl_s, session.namespace_id, session.id))
    if cur.rowcount != 1:
        raise SessionLost()


async def close(cur: Any, session: Session) -> None:
    await cur.execute(CLOSE, (session.namespace_id, session.id))


async def check_active(cur: Any, session: Session) -> None:
    """Inside a claim: the session is ACTIVE and alive (shared lock against a fence)."""
    await cur.execute(CHECK_ACTIVE, (session.namespace_id, session.id))
    row = await cur.fetchone()
    if row is None or not row["alive"]:
        raise SessionLost()


async def expire_lapsed(cur: Any, limit: int = 500) -> int:
    await cur.execute(EXPIRE_LAPSED, (limit,))
    return int(cur.rowcount)


class SessionNotFound(errors.NotFound):
    code = "session_not_found"
    title = "No such worker session for this credential"


SELECT_SESSION = """
SELECT instance_id, generation, credential_id, queues, handlers, max_in_flight,
       concurrency_keys, state, expires_at, expires_at > UTC_TIMESTAMP(6) AS alive
FROM pulse_worker_sessions WHERE namespace_id = %s AND id = %s
"""


async def load(cur: Any, principal: credentials.Principal, *, namespace: str,
               session_id: bytes) -> tuple[Session, bool]:
    """A session of the caller's credential, and whether it is ACTIVE and alive.

    Finishing and renewing attempts do not need a live session (the attempt token is the
    credential); claiming and polling do.
    """
    ns = await credentials.authorize(cur, principal, authz.Action.WORKERS_WORK, namespace)
    await cur.execute(SELECT_SESSION, (ns.id, session_id))
    row = await cur.fetchone()
    if row is None or row["credential_id"] != principal.credential_id:
        raise SessionNotFound()
    names = jsondoc.loads_strict(row["queues"])
    refs = await _resolve_queues(cur, ns.id, names)
    session = Session(
        namespace_id=ns.id, namespace=namespace, id=session_id, instance_id=row["instance_id"],
        generation=row["generation"], credential_id=row["credential_id"], queues=refs,
        handlers=tuple(jsondoc.loads_strict(row["handlers"])),
        max_in_flight=row["max_in_flight"], expires_at=as_utc(row["expires_at"]),
        application_id=principal.application_id,
        concurrency_keys=bool(row["concurrency_keys"]),
    )
    return session, row["state"] == SessionState.ACTIVE and bool(row["alive"])

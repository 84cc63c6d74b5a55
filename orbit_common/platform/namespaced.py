"""Namespace-scoped commands with an optional ``Idempotency-Key``: the one shape that task
interventions and schedule commands share.

:func:`run` authorizes the caller in the namespace (optionally for one queue), authorizes the
command's object (``locate``: the queue of the task or schedule, read without a lock), and only
then claims the idempotency identity (a replay returns the recorded answer), runs
``act(cur, namespace_id)`` → ``(status, body, resource id)``, and records the answer, all in one
transaction. Authorization — namespace, action and the object's queue — thus comes before any
replay or ``idempotency_conflict``: a caller that may not act on the object gets the same 404 or
403 with a key as without one, never another caller's receipt nor a conflict that confirms the
object exists. A COMMIT whose
outcome is unknown is re-checked by looking the identity up. :func:`request` builds the identity
before the transaction runner is entered, so a re-run carries the same digest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from orbit_common.db.pool import Database
from orbit_common.platform import authz, credentials, idempotency, namespaces
from orbit_common.platform.idempotency import IdempotencyRequest, Replay

Act = Callable[[Any, bytes], Awaitable[tuple[int, dict[str, Any], bytes]]]
Locate = Callable[[Any, bytes], Awaitable[None]]


def request(operation: str, key: str | None, scope: bytes, body: dict[str, Any],
            principal: credentials.Principal) -> IdempotencyRequest | None:
    """The identity of a keyed command (None without a key); the namespace id is filled in
    inside the transaction."""
    if key is None:
        return None
    return IdempotencyRequest.build(
        namespace_id=bytes(16),  # replaced by the real namespace inside the transaction
        operation=operation, scope=scope, key=key, request=body,
        credential_id=principal.credential_id,
    )


async def run(db: Database, name: str, *, principal: credentials.Principal,
              action: authz.Action, namespace: str, idem: IdempotencyRequest | None,
              act: Act, queue: str | None = None, locate: Locate | None = None) -> Replay:
    """Run one namespace-scoped command (see the module docstring). ``locate(cur,
    namespace_id)`` raises the object's 404 or 403 (a plain read: the idempotency record comes
    first in the one lock order; ``act`` locks the object and checks again)."""

    async def body(cur: Any) -> Replay:
        ns = await credentials.authorize(cur, principal, action, namespace, queue=queue)
        if locate is not None:
            await locate(cur, ns.id)

        async def effect() -> Replay:
            status, view, resource = await act(cur, ns.id)
            return Replay(status=status, body=view, resource_id=resource)

        return await idempotency.once(
            cur, None if idem is None else attrs.evolve(idem, namespace_id=ns.id), effect)

    async def recheck(cur: Any) -> Replay | None:
        assert idem is not None  # noqa: S101 - only passed when idem is set
        ns = await namespaces.find_namespace(cur, namespace)
        if ns is None:
            return None
        return await idempotency.lookup(cur, attrs.evolve(idem, namespace_id=ns.id))

    return await db.transaction(name, body, recheck=recheck if idem is not None else None)

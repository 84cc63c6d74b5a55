"""Idempotency as a reusable part of any command.

Identity: ``(namespace_id, operation, scope, key)`` is unique. Alongside it we keep the SHA-256 of
the canonical request and the original response.

Protocol, inside the command's own transaction and *before* its effect (lock order: application
quota → idempotency → queue → task/attempt → permits → result stream):

1. :func:`begin` looks the identity up. Found with the same digest → :class:`Replay` of the
   original status and body; found with another digest → ``409 idempotency_conflict``.
2. Not found → it INSERTs the record with a placeholder response. The unique index makes a
   concurrent identical request block on that insert until the first transaction ends; then it
   gets a duplicate-key error (the first committed: re-read and replay) or succeeds (the first
   rolled back: it now owns the key). Two concurrent requests thus give one effect and two equal
   answers, never a 500.
3. The command performs its effect and calls :func:`complete` with the response it will return,
   in the same transaction. The placeholder is never visible to another transaction.

A lost COMMIT is re-checked by :func:`lookup` with a locking read on the same identity.
"""

from __future__ import annotations

from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.model import digests, ids, jsondoc

KEY_MAX_BYTES = 255
DEFAULT_TTL_S = 7 * 24 * 3600


@attrs.frozen(kw_only=True)
class IdempotencyRequest:
    namespace_id: bytes
    operation: str
    scope: bytes
    key: bytes
    request_digest: bytes
    credential_id: bytes
    ttl_s: int = DEFAULT_TTL_S

    @classmethod
    def build(
        cls,
        *,
        namespace_id: bytes,
        operation: str,
        scope: bytes,
        key: str,
        request: Any,
        credential_id: bytes,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> IdempotencyRequest:
        """Validate the key and digest the canonical request (operation and scope included)."""
        try:
            raw = key.encode("utf-8")
        except UnicodeEncodeError:  # header bytes that are not UTF-8 arrive as lone surrogates
            raw = b""
        if not raw or len(raw) > KEY_MAX_BYTES or not key.isprintable():
            raise errors.ValidationFailed([{
                "path": "Idempotency-Key",
                "message": f"1-{KEY_MAX_BYTES} bytes of printable characters",
            }])
        digest = digests.domain_digest(
            "orbit.idempotency.v1", operation.encode(), scope, jsondoc.canonical(request)
        )
        return cls(namespace_id=namespace_id, operation=operation, scope=scope, key=raw,
                   request_digest=digest, credential_id=credential_id, ttl_s=ttl_s)


@attrs.frozen(kw_only=True)
class Replay:
    status: int
    body: Any
    resource_id: bytes | None


@attrs.frozen(kw_only=True)
class Claim:
    request: IdempotencyRequest
    record_id: bytes


SELECT_IDENTITY = """
SELECT id, request_digest, response_status, response_body, resource_id
FROM orbit_idempotency_keys
WHERE namespace_id = %s AND operation = %s AND scope = %s AND idem_key = %s
"""
SELECT_IDENTITY_FOR_UPDATE = SELECT_IDENTITY + " FOR UPDATE"
INSERT_PLACEHOLDER = """
INSERT INTO orbit_idempotency_keys (namespace_id, id, operation, scope, idem_key, request_digest,
  credential_id, response_status, response_body, created_at, expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, 102, '{}', UTC_TIMESTAMP(6),
  UTC_TIMESTAMP(6) + INTERVAL %s SECOND)
"""
COMPLETE = """
UPDATE orbit_idempotency_keys SET response_status = %s, response_body = %s, resource_id = %s
WHERE namespace_id = %s AND id = %s
"""


def _identity(req: IdempotencyRequest) -> tuple[bytes, str, bytes, bytes]:
    return (req.namespace_id, req.operation, req.scope, req.key)


def _replay(req: IdempotencyRequest, row: dict[str, Any]) -> Replay:
    if row["request_digest"] != req.request_digest:
        raise errors.IdempotencyConflict(
            "this Idempotency-Key was already used with a different request"
        )
    return Replay(
        status=row["response_status"],
        body=jsondoc.loads_strict(row["response_body"]),
        resource_id=row["resource_id"],
    )


async def begin(cur: Any, req: IdempotencyRequest, record_id: bytes) -> Replay | Claim:
    """Replay a finished request or claim its identity (see the module docstring)."""
    await cur.execute(SELECT_IDENTITY, _identity(req))
    row = await cur.fetchone()
    if row is not None:
        return _replay(req, row)
    try:
        await cur.execute(
            INSERT_PLACEHOLDER,
            (req.namespace_id, ids.check_id(record_id), req.operation, req.scope, req.key,
             req.request_digest, req.credential_id, req.ttl_s),
        )
    except Exception as exc:
        if not dberrors.is_duplicate(exc, "uq_idempotency_identity"):
            raise
        await cur.execute(SELECT_IDENTITY_FOR_UPDATE, _identity(req))
        row = await cur.fetchone()
        if row is None:  # the winner's row vanished (retention): let the runner re-run us
            raise
        return _replay(req, row)
    return Claim(request=req, record_id=record_id)


async def complete(
    cur: Any, claim: Claim, *, status: int, body: Any, resource_id: bytes | None = None
) -> None:
    """Store the response of a claimed request, in the same transaction as its effect."""
    await cur.execute(
        COMPLETE,
        (status, jsondoc.dumps(body), resource_id, claim.request.namespace_id, claim.record_id),
    )
    if cur.rowcount != 1:
        raise errors.DatabaseError("idempotency record vanished inside its own transaction")


async def lookup(cur: Any, req: IdempotencyRequest) -> Replay | None:
    """Locking read of a request's outcome (re-check after a lost COMMIT)."""
    await cur.execute(SELECT_IDENTITY_FOR_UPDATE, _identity(req))
    row = await cur.fetchone()
    if row is None or row["response_status"] == 102:
        return None
    return _replay(req, row)

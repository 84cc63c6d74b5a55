"""Idempotency as a reusable part of any command: the one protocol, single and batch.

Identity: ``(namespace_id, operation, scope, key)`` is unique. Alongside it we keep the SHA-256 of
the canonical request and the original response.

Protocol, inside the command's own transaction and *before* its effect (the idempotency record
comes first in the one lock order, docs/architecture.md):

1. :func:`claim_many` (:func:`begin` for one) reads every identity in one statement. Found with
   the same digest → :class:`Replay` of the original status and body; found with another digest →
   ``409 idempotency_conflict`` for the whole request.
2. The rest are INSERTed in one statement, in identity order (so concurrent batches with
   overlapping keys lock them in the same order): with their final response when the caller
   knows it before the effect (a submission's receipt), else with a placeholder that
   :func:`complete` fills in the same transaction (the placeholder is never visible to another
   transaction). The unique index makes a concurrent first use of the same identity block on
   that insert until the other transaction ends; then:

   * the other committed → duplicate key (1062): the failed statement was rolled back; a locking
     read finds the winner's record and it is replayed (or is a conflict), and the rest are
     inserted again;
   * the other rolled back → our insert goes through and we own the identity;
   * the other is still running when our lock wait ends (1205), or its record vanished between
     the duplicate-key error and the re-read → ``409 idempotency_in_progress``: nothing was
     written, the client retries with the same key and gets the winner's answer.

   Two concurrent requests thus give one effect and equal answers, never a 500.
3. :func:`once` wraps the common single shape: claim, run the effect, complete.

A lost COMMIT is re-checked by :func:`lookup` with a locking read on the same identity.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.batch import multi_insert, placeholders
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
COMPLETE = """
UPDATE orbit_idempotency_keys SET response_status = %s, response_body = %s, resource_id = %s
WHERE namespace_id = %s AND id = %s
"""


def _identity(req: IdempotencyRequest) -> tuple[bytes, str, bytes, bytes]:
    return (req.namespace_id, req.operation, req.scope, req.key)


def _replay(req: IdempotencyRequest, row: dict[str, Any], where: str | None = None) -> Replay:
    if row["request_digest"] != req.request_digest:
        raise errors.IdempotencyConflict(
            f"{where}: this idempotency key was already used with a different request" if where
            else "this Idempotency-Key was already used with a different request"
        )
    return Replay(
        status=row["response_status"],
        body=jsondoc.loads_strict(row["response_body"]),
        resource_id=row["resource_id"],
    )


class IdempotencyInProgress(errors.Conflict):
    code = "idempotency_in_progress"
    title = "A request with this Idempotency-Key is still being processed"


@attrs.frozen(kw_only=True)
class Entry:
    """One identity to claim. ``response`` set: the command knows its answer before its effect
    (e.g. a submission's receipt), so the record is written with it and needs no
    :func:`complete`."""

    request: IdempotencyRequest
    record_id: bytes
    response: Replay | None = None


SELECT_IDENTITIES = """
SELECT scope, idem_key, request_digest, response_status, response_body, resource_id
FROM orbit_idempotency_keys
WHERE namespace_id = %s AND operation = %s AND ({})
"""
IDENTITY_GROUP = "(scope = %s AND idem_key IN ({}))"
INSERT_RECORDS = (
    "INSERT INTO orbit_idempotency_keys (namespace_id, id, operation, scope, idem_key,"
    " request_digest, credential_id, response_status, response_body, resource_id, created_at,"
    " expires_at)"
)
RECORD_ROW = ("(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6),"
              " UTC_TIMESTAMP(6) + INTERVAL %s SECOND)")
PLACEHOLDER_STATUS = 102


async def _read(cur: Any, requests: Sequence[IdempotencyRequest], *,
                lock: bool) -> dict[tuple[bytes, str, bytes, bytes], dict[str, Any]]:
    """The records of ``requests``: one statement per (namespace, operation), one index range
    per scope. A locking read sees the latest commit."""
    groups: dict[tuple[bytes, str], dict[bytes, list[bytes]]] = {}
    for req in requests:
        groups.setdefault((req.namespace_id, req.operation), {}).setdefault(
            req.scope, []).append(req.key)
    found: dict[tuple[bytes, str, bytes, bytes], dict[str, Any]] = {}
    for (namespace_id, operation), scopes in sorted(groups.items()):
        where = " OR ".join(IDENTITY_GROUP.format(placeholders(len(keys))) for keys in
                            scopes.values())
        params = [v for scope, keys in scopes.items() for v in (scope, *keys)]
        await cur.execute(SELECT_IDENTITIES.format(where) + (" FOR UPDATE" if lock else ""),
                          (namespace_id, operation, *params))
        for row in await cur.fetchall():
            found[(namespace_id, operation, row["scope"], row["idem_key"])] = row
    return found


async def _insert(cur: Any, entries: Sequence[Entry]) -> None:
    rows = []
    for entry in sorted(entries, key=lambda e: _identity(e.request)):
        req, resp = entry.request, entry.response
        rows.append((
            req.namespace_id, ids.check_id(entry.record_id), req.operation, req.scope, req.key,
            req.request_digest, req.credential_id,
            PLACEHOLDER_STATUS if resp is None else resp.status,
            "{}" if resp is None else jsondoc.dumps(resp.body),
            None if resp is None else resp.resource_id, req.ttl_s,
        ))
    sql, params = multi_insert(INSERT_RECORDS, RECORD_ROW, rows)
    await cur.execute(sql, params)


async def find_many(cur: Any, requests: Sequence[IdempotencyRequest],
                    where: Sequence[str] | None = None) -> dict[int, Replay]:
    """Step 1: the requests already answered, by index (plain read, one statement per
    namespace and operation); a digest mismatch raises ``idempotency_conflict``, its detail
    naming the request by ``where`` (e.g. the item's JSON path in a batch)."""
    if not requests:
        return {}
    found = await _read(cur, requests, lock=False)
    return {index: _replay(req, found[_identity(req)], where[index] if where else None)
            for index, req in enumerate(requests) if _identity(req) in found}


async def record_many(cur: Any, entries: Sequence[Entry],
                      where: Sequence[str] | None = None) -> list[Replay | Claim]:
    """Step 2: insert the records of ``entries`` (not found by step 1), answered per entry: a
    :class:`Claim`, or a :class:`Replay` of a concurrent first use that committed first."""
    outcomes: dict[int, Replay | Claim] = {}
    pending = list(range(len(entries)))
    while pending:
        try:
            await _insert(cur, [entries[i] for i in pending])
        except Exception as exc:
            if dberrors.errno_of(exc) == dberrors.ER_LOCK_WAIT_TIMEOUT:
                # Only this statement was rolled back; the caller's transaction rolls back on
                # the error, so nothing of this request is written.
                raise IdempotencyInProgress(
                    "a concurrent request with this Idempotency-Key has not finished;"
                    " retry with the same key") from exc
            if not dberrors.is_duplicate(exc, "uq_idempotency_identity"):
                raise
            pending = await _replay_winners(cur, entries, pending, outcomes, exc, where)
            continue
        for index in pending:
            outcomes[index] = Claim(request=entries[index].request,
                                    record_id=entries[index].record_id)
        pending = []
    return [outcomes[i] for i in range(len(entries))]


async def claim_many(cur: Any, entries: Sequence[Entry]) -> list[Replay | Claim]:
    """Steps 1 and 2: replay the requests already answered, claim the others (see the module
    docstring), answered per entry. The identities of one call must be distinct."""
    found = await find_many(cur, [e.request for e in entries])
    rest = [i for i in range(len(entries)) if i not in found]
    outcomes: dict[int, Replay | Claim] = dict(found)
    if rest:
        recorded = await record_many(cur, [entries[i] for i in rest])
        outcomes.update(zip(rest, recorded, strict=True))
    return [outcomes[i] for i in range(len(entries))]


async def _replay_winners(  # noqa: PLR0917 - the loop state of record_many
    cur: Any, entries: Sequence[Entry], pending: list[int],
    outcomes: dict[int, Replay | Claim], exc: Exception, where: Sequence[str] | None,
) -> list[int]:
    """After a duplicate key: a concurrent first use committed first. Replay the identities now
    recorded (a locking read sees the latest commit); return the entries still to insert."""
    found = await _read(cur, [entries[i].request for i in pending], lock=True)
    remaining = []
    for index in pending:
        row = found.get(_identity(entries[index].request))
        if row is None:
            remaining.append(index)
        else:
            outcomes[index] = _replay(entries[index].request, row,
                                      where[index] if where else None)
    if len(remaining) == len(pending):  # the winner's record vanished again
        raise IdempotencyInProgress(
            "a concurrent request with this Idempotency-Key changed its record;"
            " retry with the same key") from exc
    return remaining


async def begin(cur: Any, req: IdempotencyRequest, record_id: bytes) -> Replay | Claim:
    """:func:`claim_many` for one request whose answer depends on its effect."""
    (outcome,) = await claim_many(cur, [Entry(request=req, record_id=record_id)])
    return outcome


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


async def once(cur: Any, req: IdempotencyRequest | None,
               act: Callable[[], Awaitable[Replay]]) -> Replay:
    """Run ``act`` (the command's effect, returning its answer) at most once per identity, in
    the caller's transaction: a replay returns the recorded answer and runs nothing. Without a
    key (``req`` None) ``act`` simply runs."""
    if req is None:
        return await act()
    outcome = await begin(cur, req, ids.new_id())
    if isinstance(outcome, Replay):
        return outcome
    answer = await act()
    await complete(cur, outcome, status=answer.status, body=answer.body,
                   resource_id=answer.resource_id)
    return answer


async def lookup(cur: Any, req: IdempotencyRequest) -> Replay | None:
    """Locking read of a request's outcome (re-check after a lost COMMIT)."""
    await cur.execute(SELECT_IDENTITY_FOR_UPDATE, _identity(req))
    row = await cur.fetchone()
    if row is None or row["response_status"] == PLACEHOLDER_STATUS:
        return None
    return _replay(req, row)

"""The engine's leases on its three work queues: inbox rows (task results to consume), pending
advances (ROOT continuations and clock checkpoints) and accepted signals (PENDING and
available: a new signal at once, one whose wait has not come yet after its back-off). Any number
of engine replicas lease concurrently without a leader: each scan reads its index in order with
``FOR UPDATE SKIP LOCKED`` (a row another replica is leasing is skipped, never waited for),
oldest first, then marks the rows LEASED until database time + the lease. A lease that lapsed
(the engine died between reading a row and committing its advance) is found by the second scan
and leased again; consuming a row twice is harmless because the advance deduplicates by event
identity (a signal's advance re-checks its state: only a LEASED signal of this lease is decided).
"""

from __future__ import annotations

from typing import Any

# Oldest PENDING rows first (ix_weave_inbox_scan / ix_weave_advances_due), then lapsed leases
# (ix_weave_inbox_lease / ix_weave_advances_lease). Fixed table and index names only.
INBOX_DUE = (
    "SELECT namespace_id, id FROM weave_inbox FORCE INDEX (ix_weave_inbox_scan)"
    " WHERE state = 'PENDING' ORDER BY created_at, namespace_id, id LIMIT %s"
    " FOR UPDATE SKIP LOCKED"
)
INBOX_LAPSED = (
    "SELECT namespace_id, id FROM weave_inbox FORCE INDEX (ix_weave_inbox_lease)"
    " WHERE state = 'LEASED' AND lease_expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY lease_expires_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
ADVANCES_DUE = (
    "SELECT namespace_id, id FROM weave_pending_advances FORCE INDEX (ix_weave_advances_due)"
    " WHERE state = 'PENDING' AND due_at <= UTC_TIMESTAMP(6)"
    " ORDER BY due_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
ADVANCES_LAPSED = (
    "SELECT namespace_id, id FROM weave_pending_advances FORCE INDEX (ix_weave_advances_lease)"
    " WHERE state = 'LEASED' AND lease_expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY lease_expires_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
SIGNALS_DUE = (
    "SELECT namespace_id, id FROM weave_signals FORCE INDEX (ix_weave_signals_scan)"
    " WHERE state = 'PENDING' AND available_at <= UTC_TIMESTAMP(6)"
    " ORDER BY available_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
SIGNALS_LAPSED = (
    "SELECT namespace_id, id FROM weave_signals FORCE INDEX (ix_weave_signals_lease)"
    " WHERE state = 'LEASED' AND lease_expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY lease_expires_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
MARK = (
    "UPDATE {table} SET state = 'LEASED', lease_owner = %s,"
    " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, attempts = attempts + 1"
    " WHERE (namespace_id, id) IN ({rows})"
)


async def _lease(cur: Any, table: str, scans: tuple[str, str], *, owner: str, lease_ms: int,
                 limit: int) -> list[dict[str, Any]]:
    found: list[tuple[bytes, bytes]] = []
    for scan in scans:
        if len(found) >= limit:
            break
        await cur.execute(scan, (limit - len(found),))
        found += [(r["namespace_id"], r["id"]) for r in await cur.fetchall()]
    if not found:
        return []
    rows = ", ".join(["(%s, %s)"] * len(found))
    params = [value for pair in found for value in pair]
    await cur.execute(MARK.format(table=table, rows=rows), (owner, lease_ms * 1000, *params))
    await cur.execute(f"SELECT * FROM {table} WHERE (namespace_id, id) IN ({rows})", params)
    return [dict(r) for r in await cur.fetchall()]


async def lease_inbox(cur: Any, *, owner: str, lease_ms: int, limit: int
                      ) -> list[dict[str, Any]]:
    """Lease up to ``limit`` inbox rows (PENDING, then lapsed LEASED) in the caller's
    transaction; QUARANTINED and CONSUMED rows are never leased."""
    return await _lease(cur, "weave_inbox", (INBOX_DUE, INBOX_LAPSED), owner=owner,
                        lease_ms=lease_ms, limit=limit)


async def lease_advances(cur: Any, *, owner: str, lease_ms: int, limit: int
                         ) -> list[dict[str, Any]]:
    """Lease up to ``limit`` due pending advances (PENDING and due, then lapsed LEASED)."""
    return await _lease(cur, "weave_pending_advances", (ADVANCES_DUE, ADVANCES_LAPSED),
                        owner=owner, lease_ms=lease_ms, limit=limit)


async def lease_signals(cur: Any, *, owner: str, lease_ms: int, limit: int
                        ) -> list[dict[str, Any]]:
    """Lease up to ``limit`` signals (PENDING and available, then lapsed LEASED); CONSUMED and
    REJECTED signals are never leased."""
    return await _lease(cur, "weave_signals", (SIGNALS_DUE, SIGNALS_LAPSED), owner=owner,
                        lease_ms=lease_ms, limit=limit)

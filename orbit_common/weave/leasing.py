"""The engine's leases on its three work queues: inbox rows (task results to consume), pending
advances (ROOT continuations and clock checkpoints) and accepted signals (PENDING and
available: a new signal at once, one whose wait has not come yet after its back-off). Any number
of engine replicas lease concurrently without a leader: each scan reads its index in order with
``FOR UPDATE SKIP LOCKED`` (a row another replica is leasing is skipped, never waited for),
oldest first, then marks the rows LEASED until database time + the lease. A lease that lapsed
(the engine died between reading a row and committing its advance) is found by the second scan
and leased again; consuming a row twice is harmless because the advance deduplicates by event
identity (a signal's advance re-checks its state: only a LEASED signal of this lease is decided).

Each scan reads the whole rows it locks and the expiry (database time + the lease), so there is
no second read after the mark: what the mark wrote (``state``, ``lease_owner``,
``lease_expires_at``, ``attempts``) is applied to the returned rows. ``lapsed=False`` skips the
second scan: the engine runs it at most once per ``recover_interval_s`` (a lapsed lease waits at
most that much longer), so a busy engine's rounds do not pay for a scan that almost never finds
anything.
"""

from __future__ import annotations

from typing import Any

from orbit_common.db.batch import placeholders

# Whole rows, and the expiry a lease taken now gets (database time + the lease).
_SCAN = "SELECT *, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND AS lease_until FROM "
# Oldest PENDING rows first (ix_weave_inbox_scan / ix_weave_advances_due), then lapsed leases
# (ix_weave_inbox_lease / ix_weave_advances_lease). Fixed table and index names only.
INBOX_DUE = (
    _SCAN + "weave_inbox FORCE INDEX (ix_weave_inbox_scan)"
    " WHERE state = 'PENDING' ORDER BY created_at, namespace_id, id LIMIT %s"
    " FOR UPDATE SKIP LOCKED"
)
INBOX_LAPSED = (
    _SCAN + "weave_inbox FORCE INDEX (ix_weave_inbox_lease)"
    " WHERE state = 'LEASED' AND lease_expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY lease_expires_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
ADVANCES_DUE = (
    _SCAN + "weave_pending_advances FORCE INDEX (ix_weave_advances_due)"
    " WHERE state = 'PENDING' AND due_at <= UTC_TIMESTAMP(6)"
    " ORDER BY due_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
ADVANCES_LAPSED = (
    _SCAN + "weave_pending_advances FORCE INDEX (ix_weave_advances_lease)"
    " WHERE state = 'LEASED' AND lease_expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY lease_expires_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
SIGNALS_DUE = (
    _SCAN + "weave_signals FORCE INDEX (ix_weave_signals_scan)"
    " WHERE state = 'PENDING' AND available_at <= UTC_TIMESTAMP(6)"
    " ORDER BY available_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
SIGNALS_LAPSED = (
    _SCAN + "weave_signals FORCE INDEX (ix_weave_signals_lease)"
    " WHERE state = 'LEASED' AND lease_expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY lease_expires_at, namespace_id, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
# The expiry is the one the scan read (database time at the scan + the lease), so the rows
# returned carry exactly what the mark wrote. One statement per namespace: ``namespace_id = ?
# AND id IN (…)`` is a list of point ranges on the primary key, where a row constructor
# ``(namespace_id, id) IN ((…), …)`` made MariaDB's range optimizer OR one tree per row
# together (5 % of the database's CPU in a linear workflow run, bench/RESULTS.md).
MARK = (
    "UPDATE {table} SET state = 'LEASED', lease_owner = %s, lease_expires_at = %s,"
    " attempts = attempts + 1 WHERE namespace_id = %s AND id IN ({ids})"
)


async def _lease(cur: Any, table: str, scans: tuple[str, ...], *, owner: str, lease_ms: int,
                 limit: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for scan in scans:
        if len(found) >= limit:
            break
        await cur.execute(scan, (lease_ms * 1000, limit - len(found)))
        found += [dict(r) for r in await cur.fetchall()]
    if not found:
        return []
    until = min(r["lease_until"] for r in found)
    by_namespace: dict[bytes, list[bytes]] = {}
    for r in found:
        by_namespace.setdefault(r["namespace_id"], []).append(r["id"])
    for namespace_id, ids in by_namespace.items():
        await cur.execute(MARK.format(table=table, ids=placeholders(len(ids))),
                          (owner, until, namespace_id, *ids))
    for r in found:
        del r["lease_until"]
        r.update(state="LEASED", lease_owner=owner, lease_expires_at=until,
                 attempts=r["attempts"] + 1)
    return found


async def lease_inbox(cur: Any, *, owner: str, lease_ms: int, limit: int,
                      lapsed: bool = True) -> list[dict[str, Any]]:
    """Lease up to ``limit`` inbox rows (PENDING, then lapsed LEASED) in the caller's
    transaction; QUARANTINED and CONSUMED rows are never leased."""
    scans = (INBOX_DUE, INBOX_LAPSED) if lapsed else (INBOX_DUE,)
    return await _lease(cur, "weave_inbox", scans, owner=owner, lease_ms=lease_ms, limit=limit)


async def lease_advances(cur: Any, *, owner: str, lease_ms: int, limit: int,
                         lapsed: bool = True) -> list[dict[str, Any]]:
    """Lease up to ``limit`` due pending advances (PENDING and due, then lapsed LEASED)."""
    scans = (ADVANCES_DUE, ADVANCES_LAPSED) if lapsed else (ADVANCES_DUE,)
    return await _lease(cur, "weave_pending_advances", scans, owner=owner, lease_ms=lease_ms,
                        limit=limit)


async def lease_signals(cur: Any, *, owner: str, lease_ms: int, limit: int,
                        lapsed: bool = True) -> list[dict[str, Any]]:
    """Lease up to ``limit`` signals (PENDING and available, then lapsed LEASED); CONSUMED and
    REJECTED signals are never leased."""
    scans = (SIGNALS_DUE, SIGNALS_LAPSED) if lapsed else (SIGNALS_DUE,)
    return await _lease(cur, "weave_signals", scans, owner=owner, lease_ms=lease_ms,
                        limit=limit)

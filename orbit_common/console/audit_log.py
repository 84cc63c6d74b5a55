"""The console's audit log of one namespace: ``orbit_audit_events`` newest first, filtered by
action, actor kind and time, in bounded keyset pages.

Who may read it: a credential allowed ``namespaces.manage`` there — the operator's grant, which
covers every queue of the namespace (authz.NAMESPACE_WIDE), since the log names every resource
of the namespace and every actor's reasons. No new action is introduced for it.

Bounds: one page reads at most :data:`SCAN_ROWS` rows of ``ix_audit_namespace``
``(namespace_id, occurred_at, id)`` from the cursor's position; the filters apply to those rows.
A page can therefore be short (even empty) and still have a next cursor, which starts where the
scan stopped — never a scan of the namespace's whole history for a rare filter.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids, names
from orbit_common.platform import authz
from orbit_common.platform import credentials as creds
from orbit_common.platform.audit import ActorKind

PAGE = 50
SCAN_ROWS = 2000
ACTION_MAX = 64

# ix_audit_namespace, newest first from the position (exclusive), at most SCAN_ROWS rows.
SCAN = f"""
SELECT id, actor_kind, actor_id, action, resource_type, resource_id, resource_revision, reason,
       evidence_ref, request_id, occurred_at
FROM orbit_audit_events FORCE INDEX (ix_audit_namespace)
WHERE namespace_id = %s AND occurred_at >= %s
  AND (occurred_at < %s OR (occurred_at = %s AND id < %s))
ORDER BY occurred_at DESC, id DESC
LIMIT {SCAN_ROWS}
"""


@attrs.frozen(kw_only=True)
class AuditFilter:
    action: str | None = None
    actor_kind: str | None = None
    after: dt.datetime | None = None  # occurred at or after
    before: dt.datetime | None = None  # occurred before

    def check(self) -> AuditFilter:
        problems = []
        if self.action is not None and not (
                0 < len(self.action) <= ACTION_MAX and self.action.isascii()
                and self.action.isprintable()):
            problems.append({"path": "?action", "message": "an action such as queue.pause"})
        if self.actor_kind is not None and self.actor_kind not in {k.value for k in ActorKind}:
            problems.append({"path": "?actor_kind",
                             "message": ", ".join(k.value for k in ActorKind)})
        if problems:
            raise errors.ValidationFailed(problems)
        return self

    def bound(self) -> dict[str, Any]:
        return {"action": self.action, "actor_kind": self.actor_kind,
                "after": None if self.after is None else self.after.isoformat(),
                "before": None if self.before is None else self.before.isoformat()}


def _view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(), "actor_kind": row["actor_kind"], "actor_id": row["actor_id"],
        "action": row["action"], "resource_type": row["resource_type"],
        "resource_id": None if row["resource_id"] is None else row["resource_id"].hex(),
        "resource_revision": row["resource_revision"], "reason": row["reason"],
        "evidence_ref": row["evidence_ref"], "request_id": row["request_id"],
        "occurred_at": as_utc(row["occurred_at"]).isoformat(timespec="microseconds"),
    }


async def list_audit(db: Database, principal: creds.Principal, *, namespace: str,
                     filters: AuditFilter, cursor: str | None, limit: int = PAGE
                     ) -> cursors.Page:
    """One bounded page of the namespace's audit events (module docstring)."""
    if not names.is_valid_name(namespace):
        raise errors.NamespaceNotFound(f"no namespace {namespace!r} for this credential")
    filters = filters.check()
    scope = {"namespace": namespace, **filters.bound()}
    if cursor:
        at, last_id = cursors.time_position(cursors.decode(cursor, "console.audit", scope))
    else:
        at = cursors.clamp(filters.before) if filters.before else cursors.TIME_MAX
        last_id = bytes(16) if filters.before else b"\xff" * 16
    floor = cursors.clamp(filters.after) if filters.after else cursors.TIME_MIN

    async def body(cur: Any) -> cursors.Page:
        ns = await creds.authorize(cur, principal, authz.Action.NAMESPACES_MANAGE, namespace)
        await cur.execute(SCAN, (ns.id, to_db(floor), to_db(at), to_db(at), last_id))
        rows = await cur.fetchall()
        items: list[dict[str, Any]] = []
        for row in rows:
            if filters.action is not None and row["action"] != filters.action:
                continue
            if filters.actor_kind is not None and row["actor_kind"] != filters.actor_kind:
                continue
            items.append(_view(row))
            if len(items) == limit:
                last = row
                return cursors.Page(items=items, next_cursor=cursors.encode(
                    "console.audit", scope,
                    [as_utc(last["occurred_at"]).isoformat(), last["id"].hex()]))
        if len(rows) < SCAN_ROWS:
            return cursors.Page(items=items, next_cursor=None)
        last = rows[-1]  # the scan's bound was reached: go on from where it stopped
        return cursors.Page(items=items, next_cursor=cursors.encode(
            "console.audit", scope, [as_utc(last["occurred_at"]).isoformat(),
                                     ids.check_id(last["id"]).hex()]))

    return await db.read("console.audit", body)


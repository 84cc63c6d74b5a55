"""Namespaces: the scope of every runtime entity. Create, get, list, disable and enable.

A DISABLED namespace is closed to new work and hidden, its data kept: every namespaced API
request answers 404 ``namespace_not_found`` (as for a namespace that does not exist), worker
sessions can neither register nor claim, and its schedules do not fire. Attempts already granted
run to their end. Enabling it restores everything (docs/api/namespaces.md).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc
from orbit_common.model import ids, names
from orbit_common.platform.applications import check_name
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event

DESCRIPTION_MAX = 512
REASON_MAX = 1024


class NamespaceState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    DISABLED = "DISABLED"


@attrs.frozen(kw_only=True)
class Namespace:
    id: bytes
    application_id: bytes
    name: str
    description: str
    state: NamespaceState
    revision: int
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Namespace:
        return cls(
            id=row["id"],
            application_id=row["application_id"],
            name=row["name"],
            description=row["description"],
            state=NamespaceState(row["state"]),
            revision=row["revision"],
            created_at=as_utc(row["created_at"]),
            updated_at=as_utc(row["updated_at"]),
        )

    def summary(self) -> dict[str, Any]:
        return {"id": self.id.hex(), "name": self.name, "state": self.state.value,
                "revision": self.revision, "application_id": self.application_id.hex()}


COLUMNS = "id, application_id, name, description, state, revision, created_at, updated_at"
INSERT_NAMESPACE = """
INSERT INTO orbit_namespaces (id, application_id, name, description, state, revision,
  created_at, updated_at)
VALUES (%s, %s, %s, %s, 'ACTIVE', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
SELECT_BY_ID = f"SELECT {COLUMNS} FROM orbit_namespaces WHERE id = %s"
SELECT_BY_NAME = f"SELECT {COLUMNS} FROM orbit_namespaces WHERE name = %s"
SELECT_BY_NAME_FOR_UPDATE = SELECT_BY_NAME + " FOR UPDATE"
SET_STATE_IF_REVISION = """
UPDATE orbit_namespaces SET state = %s, revision = revision + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND revision = %s AND state = %s
"""
# Hot query of every namespaced request: uq_namespaces_name, then the owner check in Python.
LIST_FOR_APPLICATION = f"""
SELECT {COLUMNS} FROM orbit_namespaces
WHERE application_id = %s AND name > %s
ORDER BY name
LIMIT %s
"""


async def create_namespace(
    cur: Any,
    *,
    namespace_id: bytes,
    application_id: bytes,
    name: str,
    description: str,
    actor: Actor,
    request_id: str | None = None,
) -> Namespace:
    """Insert a namespace of an application. Locks: the new row only (unique name)."""
    check_name(name, "namespace")
    if len(description) > DESCRIPTION_MAX:
        raise errors.ValidationFailed(
            [{"path": "$.description", "message": f"at most {DESCRIPTION_MAX} characters"}]
        )
    try:
        await cur.execute(
            INSERT_NAMESPACE, (ids.check_id(namespace_id), application_id, name, description)
        )
    except Exception as exc:
        if dberrors.is_duplicate(exc, "uq_namespaces_name"):
            raise errors.AlreadyExists(f"namespace {name!r} already exists") from exc
        raise
    namespace = await get_namespace(cur, namespace_id)
    await append_event(
        cur, namespace_id=namespace.id, aggregate_type="namespace", aggregate_id=namespace.id,
        aggregate_revision=namespace.revision, event_type="namespace.created", from_state=None,
        to_state=namespace.state.value, payload=namespace.summary(),
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action="namespace.create", resource_type="namespace",
        resource_id=namespace.id, resource_revision=namespace.revision,
        namespace_id=namespace.id, application_id=application_id, after=namespace.summary(),
        request_id=request_id,
    ))
    return namespace


async def get_namespace(cur: Any, namespace_id: bytes) -> Namespace:
    await cur.execute(SELECT_BY_ID, (namespace_id,))
    row = await cur.fetchone()
    if row is None:
        raise errors.NamespaceNotFound()
    return Namespace.from_row(row)


async def find_namespace(cur: Any, name: str) -> Namespace | None:
    await cur.execute(SELECT_BY_NAME, (name,))
    row = await cur.fetchone()
    return Namespace.from_row(row) if names.found(row, "name", name) else None


async def list_namespaces(
    cur: Any, *, application_id: bytes, after_name: str = "", limit: int = 100
) -> list[Namespace]:
    """Namespaces of one application by name, keyset-paginated (ix_namespaces_application)."""
    await cur.execute(LIST_FOR_APPLICATION, (application_id, after_name, limit))
    return [Namespace.from_row(r) for r in await cur.fetchall()]


async def set_namespace_state(
    cur: Any,
    *,
    name: str,
    to: NamespaceState,
    actor: Actor,
    reason: str,
    application_id: bytes | None = None,
    request_id: str | None = None,
) -> Namespace:
    """Disable or enable a namespace (an operator's intervention: the reason is required).

    ``application_id`` limits the change to that application's namespaces (the API); the CLI
    passes None. Locks: the namespace row. Idempotent: a namespace already in ``to`` is returned
    unchanged (no revision, no event, no audit).
    """
    if not reason or len(reason) > REASON_MAX:
        raise errors.ValidationFailed(
            [{"path": "$.reason", "message": f"required, 1-{REASON_MAX} characters"}])
    await cur.execute(SELECT_BY_NAME_FOR_UPDATE, (name,))
    row = await cur.fetchone()
    if not names.found(row, "name", name) or (
            application_id is not None and row["application_id"] != application_id):
        raise errors.NamespaceNotFound(f"no namespace {name!r} for this credential")
    before = Namespace.from_row(row)
    if before.state is to:
        return before
    await cur.execute(SET_STATE_IF_REVISION,
                      (to.value, before.id, before.revision, before.state.value))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the namespace changed concurrently")
    after = await get_namespace(cur, before.id)
    verb = "disable" if to is NamespaceState.DISABLED else "enable"
    await append_event(
        cur, namespace_id=after.id, aggregate_type="namespace", aggregate_id=after.id,
        aggregate_revision=after.revision, event_type=f"namespace.{verb}d",
        from_state=before.state.value, to_state=after.state.value,
        payload={**after.summary(), "reason": reason},
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action=f"namespace.{verb}", resource_type="namespace",
        resource_id=after.id, resource_revision=after.revision, namespace_id=after.id,
        application_id=after.application_id, reason=reason, before=before.summary(),
        after=after.summary(), request_id=request_id,
    ))
    return after

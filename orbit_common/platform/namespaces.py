"""Namespaces: the scope of every runtime entity. Create, get and list transactions."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc
from orbit_common.model import ids
from orbit_common.platform.applications import check_name
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event

DESCRIPTION_MAX = 512


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
    return None if row is None else Namespace.from_row(row)


async def list_namespaces(
    cur: Any, *, application_id: bytes, after_name: str = "", limit: int = 100
) -> list[Namespace]:
    """Namespaces of one application by name, keyset-paginated (ix_namespaces_application)."""
    await cur.execute(LIST_FOR_APPLICATION, (application_id, after_name, limit))
    return [Namespace.from_row(r) for r in await cur.fetchall()]

"""Applications: the tenant boundary. Transactions for create, list, get and disable."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc
from orbit_common.model import ids, names
from orbit_common.platform import PLATFORM_NAMESPACE_ID
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event


class ApplicationState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    DISABLED = "DISABLED"


@attrs.frozen(kw_only=True)
class Application:
    id: bytes
    name: str
    state: ApplicationState
    revision: int
    created_at: dt.datetime
    updated_at: dt.datetime
    disabled_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Application:
        return cls(
            id=row["id"],
            name=row["name"],
            state=ApplicationState(row["state"]),
            revision=row["revision"],
            created_at=as_utc(row["created_at"]),
            updated_at=as_utc(row["updated_at"]),
            disabled_at=as_utc(row["disabled_at"]) if row["disabled_at"] else None,
        )

    def summary(self) -> dict[str, Any]:
        return {"id": self.id.hex(), "name": self.name, "state": self.state.value,
                "revision": self.revision}


COLUMNS = "id, name, state, revision, created_at, updated_at, disabled_at"

INSERT_APPLICATION = """
INSERT INTO orbit_applications (id, name, state, revision, created_at, updated_at)
VALUES (%s, %s, 'ACTIVE', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
# The application's shared-quota row (flow control) is created with it: no limits, zero usage.
INSERT_RESOURCES = """
INSERT INTO orbit_application_resources (application_id, updated_at)
VALUES (%s, UTC_TIMESTAMP(6))
"""
SELECT_BY_ID = f"SELECT {COLUMNS} FROM orbit_applications WHERE id = %s"
SELECT_BY_NAME = f"SELECT {COLUMNS} FROM orbit_applications WHERE name = %s"
SELECT_BY_NAME_FOR_UPDATE = SELECT_BY_NAME + " FOR UPDATE"
LIST_APPLICATIONS = (
    f"SELECT {COLUMNS} FROM orbit_applications WHERE name > %s ORDER BY name LIMIT %s"
)
DISABLE_IF_REVISION = """
UPDATE orbit_applications
SET state = 'DISABLED', disabled_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6),
    revision = revision + 1
WHERE id = %s AND revision = %s AND state = 'ACTIVE'
"""


def check_name(name: str, what: str = "application") -> str:
    if not names.is_valid_name(name):
        raise errors.ValidationFailed(
            [{"path": "$.name", "message": f"{what} name must be {names.NAME_RULE}"}]
        )
    return name


async def create_application(cur: Any, *, app_id: bytes, name: str, actor: Actor) -> Application:
    """Insert an application and its resource row. Locks: the new rows only."""
    check_name(name)
    try:
        await cur.execute(INSERT_APPLICATION, (ids.check_id(app_id), name))
    except Exception as exc:
        if dberrors.is_duplicate(exc, "uq_applications_name"):
            raise errors.AlreadyExists(f"application {name!r} already exists") from exc
        raise
    await cur.execute(INSERT_RESOURCES, (app_id,))
    app = await get_application(cur, app_id)
    await append_event(
        cur, namespace_id=PLATFORM_NAMESPACE_ID, aggregate_type="application",
        aggregate_id=app.id, aggregate_revision=app.revision, event_type="application.created",
        from_state=None, to_state=app.state.value, payload=app.summary(),
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action="application.create", resource_type="application",
        resource_id=app.id, resource_revision=app.revision, application_id=app.id,
        after=app.summary(),
    ))
    return app


async def get_application(cur: Any, app_id: bytes) -> Application:
    await cur.execute(SELECT_BY_ID, (app_id,))
    row = await cur.fetchone()
    if row is None:
        raise errors.ApplicationNotFound()
    return Application.from_row(row)


async def find_application(cur: Any, name: str, *, for_update: bool = False) -> Application:
    await cur.execute(SELECT_BY_NAME_FOR_UPDATE if for_update else SELECT_BY_NAME, (name,))
    row = await cur.fetchone()
    if not names.found(row, "name", name):
        raise errors.ApplicationNotFound(f"no application named {name!r}")
    return Application.from_row(row)


async def list_applications(
    cur: Any, *, after_name: str = "", limit: int = 1000
) -> list[Application]:
    """Applications by name, keyset-paginated (uq_applications_name)."""
    await cur.execute(LIST_APPLICATIONS, (after_name, limit))
    return [Application.from_row(r) for r in await cur.fetchall()]


async def disable_application(
    cur: Any, *, name: str, actor: Actor, reason: str | None
) -> Application:
    """Disable an application: every credential of it stops working at once.

    Locks: the application row (FOR UPDATE), then the guarded update re-checks its revision.
    Idempotent: disabling a disabled application returns it unchanged.
    """
    before = await find_application(cur, name, for_update=True)
    if before.state is ApplicationState.DISABLED:
        return before
    await cur.execute(DISABLE_IF_REVISION, (before.id, before.revision))
    if cur.rowcount != 1:
        raise errors.StaleRevision(f"application {name!r} changed concurrently")
    after = await get_application(cur, before.id)
    await append_event(
        cur, namespace_id=PLATFORM_NAMESPACE_ID, aggregate_type="application",
        aggregate_id=after.id, aggregate_revision=after.revision,
        event_type="application.disabled", from_state=before.state.value,
        to_state=after.state.value, payload=after.summary(),
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action="application.disable", resource_type="application",
        resource_id=after.id, resource_revision=after.revision, application_id=after.id,
        reason=reason, before=before.summary(), after=after.summary(),
    ))
    return after

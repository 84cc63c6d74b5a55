"""Application shared quotas: read and change the limits of ``orbit_application_resources``.

One row per application (created with it; migration 0009 backfilled the existing ones) holds the
limits every namespace of the application shares and the counters the submit and lease
transactions keep (resources.py: where each limit is enforced).

Invariants kept here:

* A limit change is compare-and-set on ``revision``: one guarded
  ``UPDATE … WHERE application_id = … AND revision = …`` whose matched-row count is checked; a
  miss is ``409 stale_revision`` and writes nothing. ``revision`` counts configuration versions
  only: a submit, claim or start that moves a counter does not invalidate it.
* The limits update writes no counter (:data:`RUNTIME_COLUMNS`): a configuration change never
  resets usage. The counters are kept only while a count limit is set (resources.TRACKED);
  the change that sets the first one recounts them from the queues in the same transaction
  (``resources.recount_application``: an exact count, not a reset), and without one the view
  recounts the usage on every read. Lowering a limit below the current usage is allowed; it
  refuses new work until usage falls, and never deletes tasks or revokes grants. ``null``
  means unlimited.
* Every change commits with a state event (``orbit_events``, platform namespace, aggregate
  ``application_resources``) and an audit event carrying the actor, the reason and the
  before/after limits. A patch that changes nothing writes nothing.

Authorization (API): the quota is shared by the whole application, so only a credential that
covers the whole application may see or change it -- one grant whose ``namespaces`` and
``queues`` both contain ``*`` and whose actions match ``applications.read`` (GET) or
``applications.manage`` (PATCH; it also allows GET). The all-access credential of
``orbit admin bootstrap`` qualifies. Another application's name is ``404
application_not_found``, exactly like a name that does not exist. Operators use ``orbit admin
app resources`` (no credential; the actor is recorded in the audit event).

Lock order: the one order of docs/architecture.md. A limit change locks the application's
resource row only (by the guarded UPDATE; its recount reads the queue counters without locks),
and every other transaction locks that row after its queue and key rows, so a limit change
cannot deadlock with them.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, Literal

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, db_now
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc
from orbit_common.platform import PLATFORM_NAMESPACE_ID, authz
from orbit_common.platform import applications as apps
from orbit_common.platform import credentials as creds
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.pulse import resources

INT_MAX = 2_147_483_647  # the columns are INT
REASON_MAX = 1024
LIMIT_FIELDS = ("max_unfinished_tasks", "max_active_attempts", "max_reserved_attempts",
                "max_starts_per_second")
# The counters no statement here may write (tests/unit/test_queue_statements.py checks it).
RUNTIME_COLUMNS = frozenset({"unfinished_tasks", "active_attempts", "reserved_attempts",
                             "start_window_until", "starts_in_window"})
AGGREGATE = "application_resources"
EVENT = "application.resources_updated"

Problems = list[dict[str, str]]


@attrs.frozen(kw_only=True)
class Limits:
    """The limits a caller sets; ``None`` is unlimited."""

    max_unfinished_tasks: int | None = None
    max_active_attempts: int | None = None
    max_reserved_attempts: int | None = None
    max_starts_per_second: int | None = None

    def problems(self) -> Problems:
        found = []
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if value is not None and not 1 <= value <= INT_MAX:
                found.append({"path": f"$.{name}",
                              "message": f"null (unlimited) or an integer from 1 to {INT_MAX}"})
        return found

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def tracks_usage(self) -> bool:
        """Whether the application's usage counters are kept (resources.TRACKED)."""
        return (self.max_unfinished_tasks is not None or self.max_active_attempts is not None
                or self.max_reserved_attempts is not None)


class Unset(enum.Enum):
    """Marks a PATCH field the caller did not send (``None`` is a value: "unlimited")."""

    UNSET = "unset"


UNSET = Unset.UNSET
Field = int | Literal[Unset.UNSET] | None


@attrs.frozen(kw_only=True)
class LimitsPatch:
    """A partial change: :data:`UNSET` keeps a limit, ``None`` removes it."""

    max_unfinished_tasks: Field = UNSET
    max_active_attempts: Field = UNSET
    max_reserved_attempts: Field = UNSET
    max_starts_per_second: Field = UNSET

    def apply(self, current: Limits) -> Limits:
        def pick(name: str) -> int | None:
            value: Field = getattr(self, name)
            kept: int | None = getattr(current, name)
            return kept if value is UNSET else value

        return Limits(**{name: pick(name) for name in LIMIT_FIELDS})

    def problems(self) -> Problems:
        return self.apply(Limits()).problems()


@attrs.frozen(kw_only=True)
class Resources:
    """An application's resource row with its name."""

    application_id: bytes
    application: str
    limits: Limits
    revision: int
    updated_at: dt.datetime
    unfinished_tasks: int
    active_attempts: int
    reserved_attempts: int
    start_window_until: dt.datetime | None
    starts_in_window: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Resources:
        until = row["start_window_until"]
        return cls(
            application_id=row["application_id"], application=row["application_name"],
            limits=Limits(**{name: row[name] for name in LIMIT_FIELDS}),
            revision=row["revision"], updated_at=as_utc(row["updated_at"]),
            unfinished_tasks=row["unfinished_tasks"], active_attempts=row["active_attempts"],
            reserved_attempts=row["reserved_attempts"],
            start_window_until=None if until is None else as_utc(until),
            starts_in_window=row["starts_in_window"],
        )

    def config_view(self) -> dict[str, Any]:
        """The configuration (audit and event documents; no counters)."""
        return {"application": self.application, "revision": self.revision,
                **self.limits.to_json()}

    def view(self, now: dt.datetime) -> dict[str, Any]:
        """The public representation (docs/flow-control.md): limits and usage at ``now``
        (database time); a start window that has passed counts no starts."""
        until = self.start_window_until
        if until is not None and until <= now:
            until = None  # the window has passed: it counts no starts
        return {
            "application": self.application,
            "application_id": self.application_id.hex(),
            "revision": self.revision,
            **self.limits.to_json(),
            "usage": {
                "measured_at": now.isoformat(timespec="microseconds"),
                "unfinished_tasks": self.unfinished_tasks,
                "active_attempts": self.active_attempts,
                "reserved_attempts": self.reserved_attempts,
                "starts_in_window": 0 if until is None else self.starts_in_window,
                "start_window_until": None if until is None
                else until.isoformat(timespec="microseconds"),
            },
            "updated_at": self.updated_at.isoformat(timespec="microseconds"),
        }


# --- SQL -----------------------------------------------------------------------------------------

SELECT_RESOURCES = """
SELECT r.application_id, a.name AS application_name, r.max_unfinished_tasks,
       r.max_active_attempts, r.max_reserved_attempts, r.max_starts_per_second, r.revision,
       r.updated_at, r.unfinished_tasks, r.active_attempts, r.reserved_attempts,
       r.start_window_until, r.starts_in_window
FROM orbit_application_resources r
JOIN orbit_applications a ON a.id = r.application_id
WHERE r.application_id = %s
"""
# Compare-and-set of the limits. The counters are deliberately absent.
UPDATE_LIMITS_IF_REVISION = """
UPDATE orbit_application_resources
SET max_unfinished_tasks = %s, max_active_attempts = %s, max_reserved_attempts = %s,
    max_starts_per_second = %s, revision = revision + 1, updated_at = UTC_TIMESTAMP(6)
WHERE application_id = %s AND revision = %s
"""
# Lost-COMMIT re-check of an update: the event is unique per (application, revision).
SELECT_UPDATE_EVENT_SHARED = f"""
SELECT payload FROM orbit_events
WHERE namespace_id = %s AND aggregate_type = '{AGGREGATE}' AND aggregate_id = %s
  AND aggregate_revision = %s AND event_type = '{EVENT}'
LOCK IN SHARE MODE
"""


# --- transactions (each takes the caller's cursor and never commits) ---------------------------


async def read_resources(cur: Any, application_id: bytes) -> Resources:
    """The application's resource row, read without locks. Without count limits its counters
    are not kept, so the usage is recounted from the queues (resources.application_usage)."""
    await cur.execute(SELECT_RESOURCES, (application_id,))
    row = await cur.fetchone()
    if row is None:
        raise errors.ApplicationNotFound()
    found = Resources.from_row(row)
    if found.limits.tracks_usage():
        return found
    usage = await resources.application_usage(cur, application_id)
    return attrs.evolve(found, unfinished_tasks=usage.unfinished_tasks,
                        active_attempts=usage.active_attempts,
                        reserved_attempts=usage.reserved_attempts)


async def update_limits(
    cur: Any, before: Resources, *, revision: int, limits: Limits, actor: Actor,
    reason: str | None = None, request_id: str | None = None,
) -> Resources:
    """Write ``limits`` if the row is still at ``revision`` (else :class:`errors.StaleRevision`),
    with its event and audit. Locks: the resource row (the guarded UPDATE)."""
    await cur.execute(UPDATE_LIMITS_IF_REVISION, (
        limits.max_unfinished_tasks, limits.max_active_attempts, limits.max_reserved_attempts,
        limits.max_starts_per_second, before.application_id, revision))
    if cur.rowcount != 1:  # FOUND_ROWS: matched rows, so 0 means the guard did not hold
        raise errors.StaleRevision(
            f"the resources of application {before.application!r} are no longer at revision"
            f" {revision}; read them again")
    if limits.tracks_usage() and not before.limits.tracks_usage():
        await resources.recount_application(cur, before.application_id)
    after = await read_resources(cur, before.application_id)
    await append_event(
        cur, namespace_id=PLATFORM_NAMESPACE_ID, aggregate_type=AGGREGATE,
        aggregate_id=after.application_id, aggregate_revision=after.revision, event_type=EVENT,
        from_state=None, to_state=None,
        payload={"application": after.application, "before": before.limits.to_json(),
                 "after": after.limits.to_json()},
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action="application.resources.update", resource_type=AGGREGATE,
        resource_id=after.application_id, resource_revision=after.revision,
        application_id=after.application_id, reason=reason, before=before.config_view(),
        after=after.config_view(), request_id=request_id or None,
    ))
    return after


async def change(
    cur: Any, before: Resources, *, revision: int | None, patch: LimitsPatch, actor: Actor,
    reason: str | None, request_id: str | None,
) -> Resources:
    """Apply ``patch`` based on ``revision`` (``None``: the revision just read). A patch that
    changes nothing writes nothing, but a stale ``revision`` is still refused."""
    if revision is None:
        revision = before.revision
    if before.revision != revision:
        raise errors.StaleRevision(
            f"the resources of application {before.application!r} are at revision"
            f" {before.revision}, not {revision}")
    limits = patch.apply(before.limits)
    found = limits.problems()
    if found:
        raise errors.ValidationFailed(found)
    if limits == before.limits:
        return before
    return await update_limits(cur, before, revision=revision, limits=limits, actor=actor,
                               reason=reason, request_id=request_id)


# --- use cases -----------------------------------------------------------------------------------


def may(grants: tuple[authz.Grant, ...], action: authz.Action) -> bool:
    """Whether one grant covers the whole application (namespaces and queues ``*``) for
    ``action``; ``applications.manage`` also allows reading."""
    wanted = {action.value}
    if action is authz.Action.APPLICATIONS_READ:
        wanted.add(authz.Action.APPLICATIONS_MANAGE.value)
    return any(
        "*" in g.namespaces and "*" in g.queues
        and any(authz.matches(p, a) for p in g.actions for a in wanted)
        for g in grants
    )


async def _authorize(cur: Any, principal: creds.Principal, application: str,
                     action: authz.Action) -> bytes:
    """The application's id, once the principal may do ``action`` on it (in the caller's
    transaction: a revoked credential or disabled application fails here)."""
    grants = await creds.recheck_principal(cur, principal)
    if application != principal.application_name:  # names are unique and never change
        raise errors.ApplicationNotFound(
            f"no application {application!r} for this credential")
    if not may(grants, action):
        raise errors.Forbidden(
            f"the credential may not {action.value} (it needs a grant on every namespace and"
            " queue of the application)")
    return principal.application_id


async def get_resources(db: Database, principal: creds.Principal, *,
                        application: str) -> dict[str, Any]:
    """``GET /v1/applications/{application}/resources``."""

    async def body(cur: Any) -> dict[str, Any]:
        app_id = await _authorize(cur, principal, application, authz.Action.APPLICATIONS_READ)
        return (await read_resources(cur, app_id)).view(await db_now(cur))

    return await db.read("applications.resources.get", body)


def _check_request(revision: int | None, patch: LimitsPatch, reason: str | None) -> None:
    found = patch.problems()
    if revision is not None and revision < 1:
        found.insert(0, {"path": "$.revision", "message": "an integer of at least 1"})
    if reason is not None and len(reason) > REASON_MAX:
        found.append({"path": "$.reason", "message": f"at most {REASON_MAX} characters"})
    if found:
        raise errors.ValidationFailed(found)


async def _run_update(db: Database, find: Any, *, revision: int | None, patch: LimitsPatch,
                      actor: Actor, reason: str | None, request_id: str | None,
                      name: str) -> dict[str, Any]:
    """The update transaction with its lost-COMMIT re-check (the event of revision + 1);
    returns the view after the change."""
    target: dict[str, Any] = {}

    async def body(cur: Any) -> dict[str, Any]:
        before = await find(cur)
        target.update(application_id=before.application_id,
                      revision=before.revision if revision is None else revision,
                      limits=patch.apply(before.limits))
        after = await change(cur, before, revision=revision, patch=patch, actor=actor,
                             reason=reason, request_id=request_id)
        return after.view(await db_now(cur))

    async def recheck(cur: Any) -> dict[str, Any] | None:
        if not target:
            return None
        await cur.execute(SELECT_UPDATE_EVENT_SHARED, (
            PLATFORM_NAMESPACE_ID, target["application_id"], target["revision"] + 1))
        row = await cur.fetchone()
        if row is None:
            return None  # not committed (or a no-op): re-run the body with the same revision
        if jsondoc.loads_strict(row["payload"])["after"] != target["limits"].to_json():
            raise errors.StaleRevision("the application's resources were changed by another"
                                       " request")
        return (await read_resources(cur, target["application_id"])).view(await db_now(cur))

    return await db.transaction(name, body, recheck=recheck)


async def update_resources(
    db: Database, principal: creds.Principal, *, application: str, revision: int,
    patch: LimitsPatch, reason: str | None = None, request_id: str | None = None,
) -> dict[str, Any]:
    """``PATCH /v1/applications/{application}/resources``: compare-and-set on ``revision``."""
    _check_request(revision, patch, reason)

    async def find(cur: Any) -> Resources:
        app_id = await _authorize(cur, principal, application, authz.Action.APPLICATIONS_MANAGE)
        return await read_resources(cur, app_id)

    return await _run_update(db, find, revision=revision, patch=patch, actor=principal.actor,
                             reason=reason, request_id=request_id,
                             name="applications.resources.update")


async def operator_show(db: Database, *, application: str) -> dict[str, Any]:
    """``orbit admin app resources show``: no credential, any application."""

    async def body(cur: Any) -> dict[str, Any]:
        app = await apps.find_application(cur, application)
        return (await read_resources(cur, app.id)).view(await db_now(cur))

    return await db.read("applications.resources.show", body)


async def operator_set(db: Database, *, application: str, actor: Actor, patch: LimitsPatch,
                       revision: int | None, reason: str | None) -> dict[str, Any]:
    """``orbit admin app resources set``: ``revision`` None bases the change on the revision
    read in the same transaction."""
    _check_request(revision, patch, reason)

    async def find(cur: Any) -> Resources:
        app = await apps.find_application(cur, application)
        return await read_resources(cur, app.id)

    return await _run_update(db, find, revision=revision, patch=patch, actor=actor,
                             reason=reason, request_id=None, name="applications.resources.set")

"""Schedule commands and queries: create, publish a version, pause/resume, disable, trigger now,
backfill (and its read-only preview), get, list, occurrences. Every command is one transaction,
audited, and idempotent with an ``Idempotency-Key`` (the foundation's records); the firing itself
is schedules.py.

Validation happens before the transaction (rule, template, policies, windows), except what
needs the database (the queue, the name's uniqueness, the revision), so bad input writes
nothing. Pausing stops firing; on resume the paused time is worked through by the misfire
policy like any other outage. Disabling keeps the schedule, its versions and its ledger.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.batch import multi_insert
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc, names
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import schedule_rules, schedules, tasks
from orbit_common.pulse.model import Queue

MAX_WINDOW_MS = 31 * 24 * 3600 * 1000
MAX_GRACE_MS = 24 * 3600 * 1000
MAX_BACKFILL = 1000
DEFAULT_CATCHUP_MS = 3600 * 1000
DEFAULT_GRACE_MS = 60 * 1000


REASON_MAX = 1024


class ScheduleNotFound(errors.NotFound):
    code = "schedule_not_found"
    title = "Schedule not found"


class ScheduleDisabled(errors.Conflict):
    code = "schedule_disabled"
    title = "Schedule disabled"


class OccurrenceAlreadyRan(errors.Conflict):
    """A run of this (schedule, fire time) is already in the ledger (uq_occurrences_run):
    at most one run per instant, whatever its source."""

    code = "occurrence_already_ran"
    title = "Occurrence already ran"


class RangeTooLarge(errors.BadRequest):
    code = "range_too_large"
    title = "Range too large"


@attrs.frozen(kw_only=True)
class VersionSpec:
    """A validated version: what create and publish share."""

    rule: schedule_rules.Rule
    template_text: str
    misfire_policy: str
    overlap_policy: str
    catchup_window_ms: int
    grace_ms: int

    def canonical(self) -> dict[str, Any]:
        return {"rule": schedule_rules.rule_to_json(self.rule),
                "template": jsondoc.loads_strict(self.template_text, keep_number_text=True),
                "misfire_policy": self.misfire_policy, "overlap_policy": self.overlap_policy,
                "catchup_window_ms": self.catchup_window_ms, "grace_ms": self.grace_ms}


def _int_field(doc: dict[str, Any], key: str, default: int, high: int,
               problems: list[dict[str, str]]) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        problems.append({"path": f"$.{key}", "message": f"an integer from 0 to {high}"})
        return default
    return value


def parse_version(doc: Any, exact: Any) -> VersionSpec:
    """Validate the version part of a create or publish body (rule, template, policies)."""
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "an object"}])
    problems: list[dict[str, str]] = []
    rule = None
    try:
        rule = schedule_rules.parse_rule(doc.get("rule"), path="$.rule")
    except errors.ValidationFailed as exc:
        problems += exc.errors
    template = doc.get("template")
    if not isinstance(template, dict):
        problems.append({"path": "$.template", "message": "an object (the task to create)"})
    else:
        try:
            # The queue is checked inside the transaction; any valid name validates the rest.
            schedules.parse_template(template, exact["template"], "q", "$.template")
        except errors.ValidationFailed as exc:
            problems += exc.errors
    misfire = doc.get("misfire_policy", "SKIP")
    if misfire not in schedules.MISFIRE_POLICIES:
        problems.append({"path": "$.misfire_policy",
                         "message": f"one of {', '.join(schedules.MISFIRE_POLICIES)}"})
    overlap = doc.get("overlap_policy", "ALLOW")
    if overlap not in schedules.OVERLAP_POLICIES:
        problems.append({"path": "$.overlap_policy",
                         "message": f"one of {', '.join(schedules.OVERLAP_POLICIES)}"})
    catchup = _int_field(doc, "catchup_window_ms", DEFAULT_CATCHUP_MS, MAX_WINDOW_MS, problems)
    grace = _int_field(doc, "grace_ms", DEFAULT_GRACE_MS, MAX_GRACE_MS, problems)
    if problems or rule is None:
        raise errors.ValidationFailed(problems)
    return VersionSpec(rule=rule, template_text=jsondoc.dumps(exact["template"]),
                       misfire_policy=misfire, overlap_policy=overlap,
                       catchup_window_ms=catchup, grace_ms=grace)


# --- views --------------------------------------------------------------------------------------

COLUMNS = (
    "s.namespace_id, s.id, s.queue_id, s.name, s.state, s.revision, s.current_version,"
    " s.processing_version, s.covered_until, s.next_fire_at, s.check_at, s.buffered_fire_at,"
    " s.last_task_id, s.last_fired_at, s.created_at, s.updated_at, s.disabled_at,"
    " q.name AS queue_name"
)
FROM = (" FROM pulse_schedules s JOIN pulse_queues q"
        " ON q.namespace_id = s.namespace_id AND q.id = s.queue_id")


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


def schedule_view(row: dict[str, Any], versions: list[dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": row["id"].hex(), "name": row["name"], "queue": row["queue_name"],
        "state": row["state"], "revision": row["revision"],
        "current_version": row["current_version"],
        "processing_version": row["processing_version"],
        "covered_until": _iso(row["covered_until"]), "next_fire_at": _iso(row["next_fire_at"]),
        "check_at": _iso(row["check_at"]), "buffered_fire_at": _iso(row["buffered_fire_at"]),
        "last_task_id": row["last_task_id"].hex() if row["last_task_id"] else None,
        "last_fired_at": _iso(row["last_fired_at"]), "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]), "disabled_at": _iso(row["disabled_at"]),
    }
    if versions is not None:
        view["versions"] = [version_view(v) for v in versions]
    return view


def version_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": row["version"], "rule": jsondoc.loads_strict(row["rule"]),
        "template": jsondoc.loads_strict(row["template"], keep_number_text=True),
        "misfire_policy": row["misfire_policy"], "overlap_policy": row["overlap_policy"],
        "catchup_window_ms": row["catchup_window_ms"], "grace_ms": row["grace_ms"],
        "effective_from": _iso(row["effective_from"]), "created_by": row["created_by"],
        "created_at": _iso(row["created_at"]),
    }


def occurrence_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(), "fire_at": _iso(row["fire_at"]), "version": row["version"],
        "source": row["source"], "outcome": row["outcome"], "reason": row["reason"],
        "covered_until": _iso(row["covered_until"]), "covered_count": row["covered_count"],
        "task_id": row["task_id"].hex() if row["task_id"] else None,
        "fired_at": _iso(row["fired_at"]), "lateness_ms": row["lateness_ms"],
    }


# --- plumbing -----------------------------------------------------------------------------------




async def _locked(cur: Any, namespace_id: bytes, name: str) -> dict[str, Any]:
    await cur.execute(f"SELECT {COLUMNS}{FROM} WHERE s.namespace_id = %s AND s.name = %s"
                      " FOR UPDATE", (namespace_id, name))
    row = await cur.fetchone()
    if not names.found(row, "name", name):
        raise ScheduleNotFound(f"no schedule named {name!r} in this namespace")
    return dict(row)


def _locate(principal: credentials.Principal, action: authz.Action, namespace: str,
            name: str, *, submits: bool = False) -> namespaced.Locate:
    """The authorization of the schedule before any idempotency replay (a plain read, see
    platform/namespaced.py): the same 404 or 403 as the command itself would give."""

    async def locate(cur: Any, namespace_id: bytes) -> None:
        await cur.execute(f"SELECT {COLUMNS}{FROM} WHERE s.namespace_id = %s AND s.name = %s",
                          (namespace_id, name))
        row = await cur.fetchone()
        if not names.found(row, "name", name):
            raise ScheduleNotFound(f"no schedule named {name!r} in this namespace")
        await _in_scope(cur, principal, action, namespace, dict(row), submits=submits)

    return locate


def _locate_queue(principal: credentials.Principal, namespace: str,
                  queue: str) -> namespaced.Locate:
    """Creating a schedule also needs ``tasks.submit`` on its queue (see :func:`_may_submit`)."""

    async def locate(cur: Any, namespace_id: bytes) -> None:
        grants = await credentials.recheck_principal(cur, principal)
        _may_submit(grants, namespace, queue)

    return locate


def _may_submit(grants: Any, namespace: str, queue: str) -> None:
    """A command that makes tasks — create, a new version, trigger, backfill — needs
    ``tasks.submit`` on the schedule's queue besides ``schedules.manage``: ``schedules.manage``
    alone must not be a way to create tasks (docs/authentication.md)."""
    if not authz.allowed(grants, authz.Action.TASKS_SUBMIT.value, namespace, queue):
        raise errors.Forbidden(
            f"the credential may not tasks.submit in queue {queue!r}, which this schedule's"
            " tasks go to")


async def _in_scope(cur: Any, principal: credentials.Principal, action: authz.Action,
                    namespace: str, row: dict[str, Any], *, submits: bool = False) -> None:
    """Schedule actions are scoped by the schedule's queue (the namespace-level check passed
    ``queue=None``): a schedule whose queue the grants cover for no schedule action is not
    found (no existence leak); one they cover for reading but not for ``action`` is forbidden,
    and so is a command that makes tasks (``submits``) without ``tasks.submit`` there."""
    grants = await credentials.recheck_principal(cur, principal)
    queue = row["queue_name"]
    if authz.allowed(grants, action.value, namespace, queue):
        if submits:
            _may_submit(grants, namespace, queue)
        return
    if not any(authz.allowed(grants, seen.value, namespace, queue)
               for seen in (authz.Action.SCHEDULES_READ, authz.Action.SCHEDULES_MANAGE)):
        raise ScheduleNotFound(f"no schedule named {row['name']!r} in this namespace")
    raise errors.Forbidden(f"the credential may not {action.value} schedules of queue {queue!r}")


async def _reload(cur: Any, namespace_id: bytes, schedule_id: bytes,
                  with_versions: bool = False) -> dict[str, Any]:
    await cur.execute(f"SELECT {COLUMNS}{FROM} WHERE s.namespace_id = %s AND s.id = %s",
                      (namespace_id, schedule_id))
    row = await cur.fetchone()
    versions = None
    if with_versions:
        await cur.execute("SELECT * FROM pulse_schedule_versions WHERE namespace_id = %s"
                          " AND schedule_id = %s ORDER BY version", (namespace_id, schedule_id))
        versions = list(await cur.fetchall())
    return schedule_view(row, versions)


INSERT_VERSION = """
INSERT INTO pulse_schedule_versions (namespace_id, schedule_id, version, rule, template,
  misfire_policy, overlap_policy, catchup_window_ms, grace_ms, effective_from, created_by,
  created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


async def _insert_version(cur: Any, namespace_id: bytes, schedule_id: bytes, version: int,  # noqa: PLR0917
                          spec: VersionSpec, now: dt.datetime,
                          principal: credentials.Principal) -> None:
    rule = attrs.evolve(spec.rule, calendar_version=schedule_rules.calendar_version())
    await cur.execute(INSERT_VERSION, (
        namespace_id, schedule_id, version, jsondoc.dumps(schedule_rules.rule_to_json(rule)),
        spec.template_text, spec.misfire_policy, spec.overlap_policy, spec.catchup_window_ms,
        spec.grace_ms, to_db(now), principal.credential_id.hex(), to_db(now)))


async def _queue(cur: Any, namespace_id: bytes, name: str) -> Queue:
    found = await tasks.queues_by_name(cur, namespace_id, [name])
    if name not in found:
        raise errors.QueueNotFound(f"no queue {name!r} in this namespace")
    return found[name]


def _first_check(spec: VersionSpec, schedule_id: bytes, now: dt.datetime
                 ) -> tuple[dt.datetime | None, dt.datetime | None]:
    upcoming = schedule_rules.next_fire(spec.rule, now - schedules.US)
    if upcoming is None:
        return None, None
    return upcoming, upcoming + schedule_rules.jitter_for(spec.rule, schedule_id, upcoming)


# --- commands -----------------------------------------------------------------------------------


async def create_schedule(db: Database, principal: credentials.Principal, *, namespace: str,
                          name: str, queue: str, spec: VersionSpec,
                          idempotency_key: str | None = None,
                          request_id: str | None = None) -> Replay:
    """A new ACTIVE schedule with version 1, covering from now (no retroactive fires: use
    backfill for the past). 201 with the schedule."""
    if not names.is_valid_name(name):
        raise errors.ValidationFailed([{"path": "$.name", "message": names.NAME_RULE}])
    schedule_id = ids.new_id()
    idem = namespaced.request("schedules.create", idempotency_key, name.encode(),
                              {"name": name, "queue": queue, **spec.canonical()}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        target = await _queue(cur, namespace_id, queue)
        schedules.parse_template(jsondoc.loads_strict(spec.template_text),
                                 jsondoc.loads_strict(spec.template_text, keep_number_text=True),
                                 target.name, "$.template")
        now = await db_now(cur)
        upcoming, check_at = _first_check(spec, schedule_id, now)
        try:
            await cur.execute(
                "INSERT INTO pulse_schedules (namespace_id, id, queue_id, name, state, revision,"
                " current_version, processing_version, covered_until, next_fire_at, check_at,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, 'ACTIVE', 1, 1, 1, %s, %s, %s,"
                " %s, %s)",
                (namespace_id, schedule_id, target.id, name, to_db(now),
                 to_db(upcoming) if upcoming else None, to_db(check_at) if check_at else None,
                 to_db(now), to_db(now)))
        except Exception as exc:
            if dberrors.is_duplicate(exc, "uq_schedules_name"):
                raise errors.AlreadyExists(f"schedule {name!r} already exists") from exc
            raise
        await _insert_version(cur, namespace_id, schedule_id, 1, spec, now, principal)
        view = await _reload(cur, namespace_id, schedule_id, with_versions=True)
        await _record(cur, principal, namespace_id, schedule_id, 1, "schedule.created",
                      None, "ACTIVE", {"name": name, "queue": queue}, request_id)
        return 201, view, schedule_id

    return await namespaced.run(
        db, "schedules.create", principal=principal, action=authz.Action.SCHEDULES_MANAGE,
        namespace=namespace, queue=queue, idem=idem, act=act,
        locate=_locate_queue(principal, namespace, queue))


async def _record(cur: Any, principal: credentials.Principal, namespace_id: bytes,  # noqa: PLR0917
                  schedule_id: bytes, revision: int, event: str, before: str | None,
                  after: str, payload: dict[str, Any], request_id: str | None, *,
                  transition: bool = True) -> None:
    """Audit the command; a ``transition`` (one that changed the revision) is also an event.
    Trigger and backfill change no revision and may repeat, and the event stream holds one
    event per (revision, type): they are audited only (their tasks carry their own events)."""
    if transition:
        await append_event(cur, namespace_id=namespace_id, aggregate_type="schedule",
                           aggregate_id=schedule_id, aggregate_revision=revision,
                           event_type=event, from_state=before, to_state=after,
                           payload=payload)
    await append_audit(cur, AuditRecord(
        actor=principal.actor, action=event, resource_type="schedule", resource_id=schedule_id,
        resource_revision=revision, namespace_id=namespace_id,
        application_id=principal.application_id, reason=payload.get("reason"),
        before={"state": before} if before else None,
        after={"state": after, **payload}, request_id=request_id))


async def publish_version(db: Database, principal: credentials.Principal, *, namespace: str,
                          name: str, revision: int, spec: VersionSpec,
                          idempotency_key: str | None = None,
                          request_id: str | None = None) -> Replay:
    """A new version, effective from now (database time); CAS on ``revision``. Instants
    before now keep the version they were planned under (the backlog is not rewritten)."""
    idem = namespaced.request("schedules.publish", idempotency_key, name.encode(),
                              {"revision": revision, **spec.canonical()}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _locked(cur, namespace_id, name)
        await _in_scope(cur, principal, authz.Action.SCHEDULES_MANAGE, namespace, row,
                        submits=True)
        if row["state"] == "DISABLED":
            raise ScheduleDisabled(f"schedule {name!r} is disabled")
        if row["revision"] != revision:
            raise errors.StaleRevision(
                f"schedule {name!r} is at revision {row['revision']}, not {revision}")
        schedules.parse_template(jsondoc.loads_strict(spec.template_text),
                                 jsondoc.loads_strict(spec.template_text, keep_number_text=True),
                                 row["queue_name"], "$.template")
        now = await db_now(cur)
        version = row["current_version"] + 1
        await _insert_version(cur, namespace_id, row["id"], version, spec, now, principal)
        await cur.execute(
            "UPDATE pulse_schedules SET current_version = %s, revision = revision + 1,"
            " check_at = %s, updated_at = %s WHERE namespace_id = %s AND id = %s"
            " AND revision = %s",
            (version, to_db(now), to_db(now), namespace_id, row["id"], revision))
        await _record(cur, principal, namespace_id, row["id"], revision + 1,
                      "schedule.version_published", row["state"], row["state"],
                      {"version": version}, request_id)
        return 200, await _reload(cur, namespace_id, row["id"], with_versions=True), row["id"]

    return await namespaced.run(
        db, "schedules.publish", principal=principal, action=authz.Action.SCHEDULES_MANAGE,
        namespace=namespace, queue=None, idem=idem, act=act,
        locate=_locate(principal, authz.Action.SCHEDULES_MANAGE, namespace, name,
                       submits=True))


async def set_state(db: Database, principal: credentials.Principal, *, namespace: str,
                    name: str, target: str, reason: str | None = None,
                    idempotency_key: str | None = None,
                    request_id: str | None = None) -> Replay:
    """Pause (PAUSED), resume (ACTIVE) or disable (DISABLED, final). Repeating one is a no-op.

    Each is an operator's intervention and needs a reason (specification 000 §1 invariant 8)."""
    if target not in ("ACTIVE", "PAUSED", "DISABLED"):
        raise errors.ValidationFailed([{"path": "$.state",
                                        "message": "ACTIVE, PAUSED or DISABLED"}])
    if reason is not None and len(reason) > REASON_MAX:
        raise errors.ValidationFailed([{"path": "$.reason",
                                        "message": f"at most {REASON_MAX} characters"}])
    idem = namespaced.request("schedules.state", idempotency_key, name.encode(),
                              {"state": target, "reason": reason}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _locked(cur, namespace_id, name)
        await _in_scope(cur, principal, authz.Action.SCHEDULES_MANAGE, namespace, row)
        if not reason:  # checked after the lookup: an unknown schedule is a 404 first
            raise errors.ValidationFailed([{"path": "$.reason", "message": "required"}])
        if row["state"] == target:
            return 200, await _reload(cur, namespace_id, row["id"]), row["id"]
        if row["state"] == "DISABLED":
            raise ScheduleDisabled(f"schedule {name!r} is disabled; its history is kept")
        now = await db_now(cur)
        await cur.execute(
            "UPDATE pulse_schedules SET state = %s, revision = revision + 1,"
            " check_at = IF(%s = 'ACTIVE', %s, check_at),"
            " disabled_at = IF(%s = 'DISABLED', %s, NULL), updated_at = %s"
            " WHERE namespace_id = %s AND id = %s AND revision = %s",
            (target, target, to_db(now), target, to_db(now), to_db(now), namespace_id,
             row["id"], row["revision"]))
        event = {"ACTIVE": "schedule.resumed", "PAUSED": "schedule.paused",
                 "DISABLED": "schedule.disabled"}[target]
        await _record(cur, principal, namespace_id, row["id"], row["revision"] + 1, event,
                      row["state"], target, {"reason": reason}, request_id)
        return 200, await _reload(cur, namespace_id, row["id"]), row["id"]

    return await namespaced.run(
        db, "schedules.state", principal=principal, action=authz.Action.SCHEDULES_MANAGE,
        namespace=namespace, queue=None, idem=idem, act=act,
        locate=_locate(principal, authz.Action.SCHEDULES_MANAGE, namespace, name))


async def _create_runs(cur: Any, namespace_id: bytes, row: dict[str, Any],  # noqa: PLR0917
                       instants: list[tuple[dt.datetime, schedules.Version]], source: str,
                       now: dt.datetime) -> list[dict[str, Any]]:
    queue = await _queue(cur, namespace_id, row["queue_name"])
    planned, payloads, ledger = [], [], []
    for at, version in instants:
        spec = schedules.template_spec(namespace_id, row["id"], version, queue.name)
        item = tasks.Item(spec=spec, path="$.template", owner_kind="SCHEDULE",
                          owner_id=row["id"])
        planned.append((item, queue))
        payloads.append({"schedule": {"id": row["id"].hex(), "name": row["name"],
                                      "version": version.version, "source": source,
                                      "fire_at": at.isoformat(timespec="microseconds")}})
        late = max(0, int((now - at) / dt.timedelta(milliseconds=1)))
        ledger.append((namespace_id, ids.new_id(), row["id"], to_db(at), version.version,
                       source, "FIRED", None, None, 1, item.task_id, to_db(now), late))
    if not planned:
        return []
    await tasks.insert_generated(cur, namespace_id, planned, now, payloads)
    sql, params = multi_insert(schedules.INSERT_OCCURRENCES, schedules.OCCURRENCE_ROW, ledger)
    try:
        await cur.execute(sql, params)
    except Exception as exc:
        # Another run of one of these instants committed first (any source), or this source
        # already has a row for it: the statement was rolled back, and so is the command.
        if dberrors.is_duplicate(exc, schedules.RUN_KEY) or dberrors.is_duplicate(
                exc, "uq_occurrences_fire"):
            raise OccurrenceAlreadyRan(
                "a run of this schedule instant is already recorded") from exc
        raise
    await cur.execute("UPDATE pulse_schedules SET last_task_id = %s, last_fired_at = %s"
                      " WHERE namespace_id = %s AND id = %s",
                      (ledger[-1][10], to_db(now), namespace_id, row["id"]))
    return [{"fire_at": at.isoformat(timespec="microseconds"), "task_id": entry[10].hex(),
             "version": version.version}
            for (at, version), entry in zip(instants, ledger, strict=True)]


async def _all_versions(cur: Any, namespace_id: bytes, row: dict[str, Any]
                        ) -> dict[int, schedules.Version]:
    return await schedules.load_versions(cur, namespace_id, row["id"], 1,
                                         row["current_version"])


async def trigger_now(db: Database, principal: credentials.Principal, *, namespace: str,
                      name: str, idempotency_key: str | None = None,
                      request_id: str | None = None) -> Replay:
    """One run now with the current version (source TRIGGER; the overlap policy does not
    apply to an explicit trigger). 201 with the occurrence's task."""
    idem = namespaced.request("schedules.trigger", idempotency_key, name.encode(), {}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _locked(cur, namespace_id, name)
        await _in_scope(cur, principal, authz.Action.SCHEDULES_MANAGE, namespace, row,
                        submits=True)
        if row["state"] == "DISABLED":
            raise ScheduleDisabled(f"schedule {name!r} is disabled")
        versions = await _all_versions(cur, namespace_id, row)
        now = await db_now(cur)
        (run,) = await _create_runs(cur, namespace_id, row,
                                    [(now, versions[row["current_version"]])], "TRIGGER", now)
        await _record(cur, principal, namespace_id, row["id"], row["revision"],
                      "schedule.triggered", row["state"], row["state"], run, request_id,
                      transition=False)
        return 201, {"schedule": row["name"], **run}, bytes.fromhex(run["task_id"])

    return await namespaced.run(
        db, "schedules.trigger", principal=principal, action=authz.Action.SCHEDULES_MANAGE,
        namespace=namespace, queue=None, idem=idem, act=act,
        locate=_locate(principal, authz.Action.SCHEDULES_MANAGE, namespace, name,
                       submits=True))


def check_backfill(start: dt.datetime, end: dt.datetime, reason: str | None) -> None:
    """The checks of a backfill's input that need no database (``reason`` None: a preview,
    which has none)."""
    problems: list[dict[str, str]] = []
    if end <= start:
        problems.append({"path": "$.end", "message": "after start"})
    if reason is not None and not 1 <= len(reason) <= REASON_MAX:
        problems.append({"path": "$.reason", "message": f"1-{REASON_MAX} characters"})
    if problems:
        raise errors.ValidationFailed(problems)


@attrs.frozen(kw_only=True)
class BackfillPlan:
    """What a backfill of ``[start, end)`` finds: the planned instants it searched (each with
    the version that governed it) and, of those, the ones that never ran."""

    searched_until: dt.datetime
    planned: list[tuple[dt.datetime, schedules.Version]]
    todo: list[tuple[dt.datetime, schedules.Version]]

    @property
    def already_ran(self) -> int:
        return len(self.planned) - len(self.todo)


def _planned(versions: dict[int, schedules.Version], start: dt.datetime, upper: dt.datetime
             ) -> list[tuple[dt.datetime, schedules.Version]]:
    """The planned instants of ``[start, upper)``, each with the version in effect then (the
    first version also before its ``effective_from``); more than :data:`MAX_BACKFILL` is
    ``range_too_large``."""
    instants: list[tuple[dt.datetime, schedules.Version]] = []
    ordered = sorted(versions.values(), key=lambda v: v.version)
    for index, version in enumerate(ordered):
        low = start if index == 0 else max(start, version.effective_from)
        high = upper if index + 1 == len(ordered) else min(
            upper, ordered[index + 1].effective_from)
        if high <= low:
            continue
        for at in schedule_rules.fires_after(version.rule, low - schedules.US,
                                             high - schedules.US, limit=MAX_BACKFILL + 1):
            instants.append((at, version))
            if len(instants) > MAX_BACKFILL:
                raise RangeTooLarge(f"the range holds more than {MAX_BACKFILL} planned"
                                    " instants; backfill it in smaller ranges")
    return instants


async def _plan_backfill(cur: Any, namespace_id: bytes, row: dict[str, Any],
                         start: dt.datetime, end: dt.datetime) -> BackfillPlan:
    """The one selection of a backfill, shared by :func:`backfill` and
    :func:`preview_backfill`: only instants the scheduler has already passed (before
    ``covered_until``), bounded by :data:`MAX_BACKFILL`, minus those that ran (a FIRED row of
    any source, a MERGED range, an earlier backfill). Reads only."""
    if row["state"] == "DISABLED":
        raise ScheduleDisabled(f"schedule {row['name']!r} is disabled")
    versions = await _all_versions(cur, namespace_id, row)
    upper = min(end, as_utc(row["covered_until"]))
    planned = _planned(versions, start, upper)
    ran = await _ran(cur, namespace_id, row["id"], start, upper)
    return BackfillPlan(searched_until=upper, planned=planned,
                        todo=[(at, v) for at, v in planned if not _covered(at, ran)])


async def backfill(db: Database, principal: credentials.Principal, *, namespace: str,
                   name: str, start: dt.datetime, end: dt.datetime, reason: str,
                   idempotency_key: str | None = None,
                   request_id: str | None = None) -> Replay:
    """Run the planned instants of ``[start, end)`` that never ran (no FIRED row, not inside a
    MERGED range, not already backfilled), each with the version that governed it; only
    instants the scheduler has already passed (before ``covered_until``). At most
    :data:`MAX_BACKFILL` instants: a larger range is ``range_too_large``. Audited. The
    selection is :func:`_plan_backfill`, the one :func:`preview_backfill` shows."""
    check_backfill(start, end, reason)
    idem = namespaced.request("schedules.backfill", idempotency_key, name.encode(),
                              {"start": start.isoformat(), "end": end.isoformat(),
                               "reason": reason}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _locked(cur, namespace_id, name)
        await _in_scope(cur, principal, authz.Action.SCHEDULES_MANAGE, namespace, row,
                        submits=True)
        now = await db_now(cur)
        plan = await _plan_backfill(cur, namespace_id, row, start, end)
        # A run committed by another writer between the read of the ledger and the insert
        # (the insert waits on uq_occurrences_run, then fails) is read again and counted as
        # already ran, like every other run found in the ledger.
        await cur.execute("SAVEPOINT backfill_runs")
        try:
            runs = await _create_runs(cur, namespace_id, row, plan.todo, "BACKFILL", now)
        except OccurrenceAlreadyRan:
            await cur.execute("ROLLBACK TO SAVEPOINT backfill_runs")
            plan = await _plan_backfill(cur, namespace_id, row, start, end)
            runs = await _create_runs(cur, namespace_id, row, plan.todo, "BACKFILL", now)
        await _record(cur, principal, namespace_id, row["id"], row["revision"],
                      "schedule.backfilled", row["state"], row["state"],
                      {"start": start.isoformat(), "end": end.isoformat(), "reason": reason,
                       "created": len(runs), "already_ran": plan.already_ran},
                      request_id, transition=False)
        return 200, {"schedule": row["name"], "start": start.isoformat(),
                     "end": end.isoformat(), "searched_until": plan.searched_until.isoformat(),
                     "created": runs, "already_ran": plan.already_ran}, row["id"]

    return await namespaced.run(
        db, "schedules.backfill", principal=principal, action=authz.Action.SCHEDULES_MANAGE,
        namespace=namespace, queue=None, idem=idem, act=act,
        locate=_locate(principal, authz.Action.SCHEDULES_MANAGE, namespace, name,
                       submits=True))


async def preview_backfill(db: Database, principal: credentials.Principal, *, namespace: str,
                           name: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """What :func:`backfill` of ``[start, end)`` would create if it ran now, writing nothing:
    the same selection (:func:`_plan_backfill`), the same refusals (``range_too_large``,
    ``schedule_disabled``, ``validation_failed``) and the same rights (``schedules.manage``
    and ``tasks.submit`` on the schedule's queue), in one read-only transaction. ``instants``
    are in fire-time order, at most :data:`MAX_BACKFILL`; ``versions`` are those they use."""
    check_backfill(start, end, None)

    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.SCHEDULES_MANAGE,
                                         namespace)
        await cur.execute(f"SELECT {COLUMNS}{FROM} WHERE s.namespace_id = %s AND s.name = %s",
                          (ns.id, name))
        found = await cur.fetchone()
        if not names.found(found, "name", name):
            raise ScheduleNotFound(f"no schedule named {name!r} in this namespace")
        row = dict(found)
        await _in_scope(cur, principal, authz.Action.SCHEDULES_MANAGE, namespace, row,
                        submits=True)
        plan = await _plan_backfill(cur, ns.id, row, start, end)
        return {"schedule": row["name"], "start": start.isoformat(), "end": end.isoformat(),
                "searched_until": plan.searched_until.isoformat(),
                "instants": [{"fire_at": at.isoformat(timespec="microseconds"),
                              "version": v.version} for at, v in plan.todo],
                "versions": sorted({v.version for _, v in plan.todo}),
                "already_ran": plan.already_ran}

    return await db.read("schedules.backfill_preview", body)


async def _ran(cur: Any, namespace_id: bytes, schedule_id: bytes, start: dt.datetime,
               end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    """Ranges of instants that already ran (FIRED rows, MERGED ranges, earlier backfills)."""
    await cur.execute(
        "SELECT fire_at, covered_until FROM pulse_schedule_occurrences"
        " WHERE namespace_id = %s AND schedule_id = %s AND outcome IN ('FIRED', 'MERGED')"
        " AND fire_at < %s AND COALESCE(covered_until, fire_at + INTERVAL 1 MICROSECOND) > %s",
        (namespace_id, schedule_id, to_db(end), to_db(start)))
    return [(as_utc(r["fire_at"]),
             as_utc(r["covered_until"]) if r["covered_until"] else as_utc(r["fire_at"])
             + schedules.US) for r in await cur.fetchall()]


def _covered(at: dt.datetime, ranges: list[tuple[dt.datetime, dt.datetime]]) -> bool:
    return any(low <= at < high for low, high in ranges)


# --- queries ------------------------------------------------------------------------------------


async def get_schedule(db: Database, principal: credentials.Principal, *, namespace: str,
                       name: str) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.SCHEDULES_READ, namespace)
        await cur.execute(f"SELECT s.id, s.name, q.name AS queue_name{FROM}"
                          " WHERE s.namespace_id = %s AND s.name = %s", (ns.id, name))
        row = await cur.fetchone()
        if not names.found(row, "name", name):
            raise ScheduleNotFound(f"no schedule named {name!r} in this namespace")
        await _in_scope(cur, principal, authz.Action.SCHEDULES_READ, namespace, row)
        return await _reload(cur, ns.id, row["id"], with_versions=True)

    return await db.read("schedules.get", body)


async def list_schedules(db: Database, principal: credentials.Principal, *, namespace: str,
                         after: str = "", limit: int = 100) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await credentials.authorize(cur, principal, authz.Action.SCHEDULES_READ, namespace)
        grants = await credentials.recheck_principal(cur, principal)
        items: list[dict[str, Any]] = []
        position = after
        # Rows of queues the grants do not cover are skipped, so read on until the page is
        # full or the namespace is exhausted (one batch for a credential without queue scope).
        while True:
            await cur.execute(f"SELECT {COLUMNS}{FROM} WHERE s.namespace_id = %s"
                              " AND s.name > %s ORDER BY s.name LIMIT %s",
                              (ns.id, position, limit))
            batch = list(await cur.fetchall())
            for r in batch:
                if authz.allowed(grants, authz.Action.SCHEDULES_READ.value, namespace,
                                 r["queue_name"]):
                    items.append(schedule_view(r))
                    if len(items) == limit:
                        return items
            if len(batch) < limit:
                return items
            position = batch[-1]["name"]

    return await db.read("schedules.list", body)


async def list_occurrences(db: Database, principal: credentials.Principal, *, namespace: str,
                           name: str, after: dt.datetime | None = None,
                           after_source: str | None = None,
                           limit: int = 100) -> list[dict[str, Any]]:
    """The ledger in fire-time order (then source), from ``after`` (exclusive) or, for the
    next page, from the row (``after``, ``after_source``): one instant may have a row per
    source (a skipped RULE row and its BACKFILL run), so the time alone is no page boundary."""
    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await credentials.authorize(cur, principal, authz.Action.SCHEDULES_READ, namespace)
        await cur.execute(f"SELECT s.id, s.name, q.name AS queue_name{FROM}"
                          " WHERE s.namespace_id = %s AND s.name = %s", (ns.id, name))
        row = await cur.fetchone()
        if not names.found(row, "name", name):
            raise ScheduleNotFound(f"no schedule named {name!r} in this namespace")
        await _in_scope(cur, principal, authz.Action.SCHEDULES_READ, namespace, row)
        start = to_db(after) if after else "1000-01-01"
        if after_source is None:
            await cur.execute(
                "SELECT * FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                " AND schedule_id = %s AND fire_at > %s ORDER BY fire_at, source LIMIT %s",
                (ns.id, row["id"], start, limit))
        else:
            await cur.execute(
                "SELECT * FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                " AND schedule_id = %s AND (fire_at > %s OR (fire_at = %s AND source > %s))"
                " ORDER BY fire_at, source LIMIT %s",
                (ns.id, row["id"], start, start, after_source, limit))
        return [occurrence_view(r) for r in await cur.fetchall()]

    return await db.read("schedules.occurrences", body)

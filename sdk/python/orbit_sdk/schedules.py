"""Schedule DTOs (``docs/api/schedules.md``): tolerant frozen attrs classes, like ``models``.

A field the server leaves out is ``None`` (or its default); everything the server sent is kept
in ``raw``. Times are aware ``datetime`` objects in UTC. ``rule`` and ``template`` stay plain
JSON objects: the server validates them and answers ``validation_failed`` with the field's path.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs

from orbit_sdk._fields import integer as _int
from orbit_sdk._fields import mapping as _dict
from orbit_sdk._fields import objects as _objects
from orbit_sdk._fields import string as _str
from orbit_sdk.models import parse_time

__all__ = [
    "BackfillResult",
    "Schedule",
    "ScheduleOccurrence",
    "ScheduleRun",
    "ScheduleVersion",
    "version_body",
]


def version_body(
    rule: Mapping[str, Any],
    template: Mapping[str, Any],
    *,
    misfire_policy: str | None = None,
    overlap_policy: str | None = None,
    catchup_window_ms: int | None = None,
    grace_ms: int | None = None,
) -> dict[str, Any]:
    """The version fields of a create or publish body; options left as ``None`` are not sent
    (the server's defaults apply: SKIP, ALLOW, one hour, one minute)."""
    body: dict[str, Any] = {"rule": dict(rule), "template": dict(template)}
    options = {"misfire_policy": misfire_policy, "overlap_policy": overlap_policy,
               "catchup_window_ms": catchup_window_ms, "grace_ms": grace_ms}
    body.update({k: v for k, v in options.items() if v is not None})
    return body


@attrs.frozen(kw_only=True)
class ScheduleVersion:
    """One immutable version: the rule, the task template and the policies."""

    version: int
    rule: dict[str, Any] = attrs.field(factory=dict)
    template: dict[str, Any] = attrs.field(factory=dict)
    misfire_policy: str | None = None
    overlap_policy: str | None = None
    catchup_window_ms: int | None = None
    grace_ms: int | None = None
    effective_from: dt.datetime | None = None
    created_by: str | None = None
    created_at: dt.datetime | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ScheduleVersion:
        return cls(
            version=_int(raw, "version") or 0, rule=_dict(raw, "rule"),
            template=_dict(raw, "template"), misfire_policy=_str(raw, "misfire_policy"),
            overlap_policy=_str(raw, "overlap_policy"),
            catchup_window_ms=_int(raw, "catchup_window_ms"), grace_ms=_int(raw, "grace_ms"),
            effective_from=parse_time(raw.get("effective_from")),
            created_by=_str(raw, "created_by"), created_at=parse_time(raw.get("created_at")),
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class Schedule:
    """A schedule and its progress; ``versions`` is filled by get, create and publish (list
    items leave it empty)."""

    id: str
    name: str
    queue: str = ""
    state: str = ""
    revision: int = 0
    current_version: int = 0
    processing_version: int = 0
    covered_until: dt.datetime | None = None
    next_fire_at: dt.datetime | None = None
    check_at: dt.datetime | None = None
    buffered_fire_at: dt.datetime | None = None
    last_task_id: str | None = None
    last_fired_at: dt.datetime | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    disabled_at: dt.datetime | None = None
    versions: tuple[ScheduleVersion, ...] = ()
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Schedule:
        return cls(
            id=_str(raw, "id") or "", name=_str(raw, "name") or "",
            queue=_str(raw, "queue") or "", state=_str(raw, "state") or "",
            revision=_int(raw, "revision") or 0,
            current_version=_int(raw, "current_version") or 0,
            processing_version=_int(raw, "processing_version") or 0,
            covered_until=parse_time(raw.get("covered_until")),
            next_fire_at=parse_time(raw.get("next_fire_at")),
            check_at=parse_time(raw.get("check_at")),
            buffered_fire_at=parse_time(raw.get("buffered_fire_at")),
            last_task_id=_str(raw, "last_task_id"),
            last_fired_at=parse_time(raw.get("last_fired_at")),
            created_at=parse_time(raw.get("created_at")),
            updated_at=parse_time(raw.get("updated_at")),
            disabled_at=parse_time(raw.get("disabled_at")),
            versions=tuple(ScheduleVersion.from_json(v) for v in _objects(raw, "versions")),
            raw=dict(raw),
        )

    @property
    def current(self) -> ScheduleVersion | None:
        """The latest published version, when ``versions`` was sent."""
        return next((v for v in self.versions if v.version == self.current_version), None)


@attrs.frozen(kw_only=True)
class ScheduleOccurrence:
    """One row of the occurrence ledger: FIRED (with its task), SKIPPED or MERGED (one run
    for the range ``[fire_at, covered_until)``)."""

    id: str
    fire_at: dt.datetime | None = None
    version: int | None = None
    source: str = ""  # RULE | BACKFILL | TRIGGER
    outcome: str = ""  # FIRED | SKIPPED | MERGED
    reason: str | None = None
    covered_until: dt.datetime | None = None
    covered_count: int = 1
    task_id: str | None = None
    fired_at: dt.datetime | None = None
    lateness_ms: int | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ScheduleOccurrence:
        return cls(
            id=_str(raw, "id") or "", fire_at=parse_time(raw.get("fire_at")),
            version=_int(raw, "version"), source=_str(raw, "source") or "",
            outcome=_str(raw, "outcome") or "", reason=_str(raw, "reason"),
            covered_until=parse_time(raw.get("covered_until")),
            covered_count=_int(raw, "covered_count") or 1, task_id=_str(raw, "task_id"),
            fired_at=parse_time(raw.get("fired_at")), lateness_ms=_int(raw, "lateness_ms"),
            raw=dict(raw),
        )


@attrs.frozen(kw_only=True)
class ScheduleRun:
    """A run created by trigger or backfill: the planned instant and its task."""

    fire_at: dt.datetime | None
    task_id: str
    version: int | None = None
    schedule: str | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ScheduleRun:
        return cls(fire_at=parse_time(raw.get("fire_at")), task_id=_str(raw, "task_id") or "",
                   version=_int(raw, "version"), schedule=_str(raw, "schedule"), raw=dict(raw))


@attrs.frozen(kw_only=True)
class BackfillResult:
    """What a backfill created; ``already_ran`` instants of the range were left alone, and
    instants at or after ``searched_until`` belong to the scheduler."""

    schedule: str
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    searched_until: dt.datetime | None = None
    created: tuple[ScheduleRun, ...] = ()
    already_ran: int = 0
    raw: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BackfillResult:
        return cls(
            schedule=_str(raw, "schedule") or "", start=parse_time(raw.get("start")),
            end=parse_time(raw.get("end")), searched_until=parse_time(raw.get("searched_until")),
            created=tuple(ScheduleRun.from_json(r) for r in _objects(raw, "created")),
            already_ran=_int(raw, "already_ran") or 0, raw=dict(raw),
        )

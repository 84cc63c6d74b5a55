"""Schedules: immutable versions, the occurrence ledger, and the scheduler's firing transaction.

The ledger (``pulse_schedule_occurrences``) has one row per (schedule, planned UTC fire time):
fired (with its task), skipped, or merged (one run for a range, ``[fire_at, covered_until)``).
The row, the task it creates (``tasks.insert_generated``: counters and limits included; the task
is owned by the schedule, ``owner_kind = 'SCHEDULE'``, ``owner_id`` = the schedule) and the
schedule's progress (``covered_until``, ``processing_version``, ``next_fire_at``, ``check_at``)
commit in one transaction, so a scheduler killed at any point neither loses nor repeats a fire:
either the whole step committed (the next claim starts after it) or none of it did.

Progress
    ``covered_until`` is an exclusive bound: every planned instant before it is in the ledger.
    Version *k* governs the instants in ``[effective_from_k, effective_from_k+1)``;
    ``processing_version`` is the version that governs ``covered_until``, so publishing a new
    version never rewrites an older version's backlog — the backlog is worked through with the
    rule and template it was planned under, then the next version takes over.

Firing rules (:func:`plan`, pure; database time decides ``now``)
    An instant is *due* at ``fire_at + jitter`` (deterministic per schedule and instant).
    One fired within ``grace`` of its due time is on time. One later than that is *missed*:
    if it is also older than ``now - catchup_window`` it is skipped
    (``outside_catchup_window``), otherwise the version's misfire policy decides: ``SKIP``
    records the missed range as skipped, ``MERGE`` runs once for the range (``MERGED``, range
    recorded), ``EACH`` runs every one. A run then meets the overlap
    policy: ``ALLOW`` runs; ``SKIP`` skips while the previous run's task is unfinished;
    ``BUFFER_ONE`` keeps one instant in ``buffered_fire_at`` and runs it once the previous
    task has finished (further ones are skipped).

Claiming
    The scheduler locks due ACTIVE schedules with ``FOR UPDATE SKIP LOCKED`` over
    ``ix_schedules_check (state, check_at)``: any number of replicas, no leader. Lock order:
    the one order of docs/architecture.md (schedule rows → the new tasks → queue, key and
    application counters; the ledger rows are new rows). A limit refusal (``queue_full``)
    rolls that namespace's group back to a savepoint and retries it a second later: a late
    fire is reported as lateness, not lost.
    The schedules of a DISABLED namespace do not fire: their check is put off
    (``NAMESPACE_RECHECK``) and, once the namespace is enabled again, the instants they missed
    meet the misfire policy like those of a paused schedule.

One run per instant
    The unique key ``uq_occurrences_run (namespace_id, schedule_id, run_fire_at)`` admits one
    FIRED or MERGED row per (schedule, UTC fire time) whatever its source (``run_fire_at`` is
    NULL for SKIPPED rows). A planned instant that a TRIGGER or BACKFILL run already holds is
    recorded as SKIPPED (``already_ran``) and creates no task; one committed by a concurrent
    writer after that check (the insert waits on the key, then fails with 1062) rolls the
    namespace's group back to its savepoint and plans it again, now seeing the run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.batch import multi_insert, placeholders, values_table
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.model import ids, jsondoc, strict
from orbit_common.pulse import schedule_rules, tasks
from orbit_common.pulse.model import Queue
from orbit_common.pulse.schedule_rules import Rule

MISFIRE_POLICIES = ("SKIP", "MERGE", "EACH")
OVERLAP_POLICIES = ("ALLOW", "SKIP", "BUFFER_ONE")
MAX_ROWS_PER_PASS = 64  # ledger rows one schedule may add in one firing transaction
BUFFER_POLL = dt.timedelta(seconds=1)  # how often a buffered run re-checks its predecessor
LIMIT_RETRY = dt.timedelta(seconds=1)  # after a queue_full / quota refusal
NAMESPACE_RECHECK = dt.timedelta(seconds=30)  # a disabled namespace's schedules look again
US = dt.timedelta(microseconds=1)
UNFINISHED = ("WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW")


@attrs.frozen(kw_only=True)
class Version:
    """One immutable version (what ``pulse_schedule_versions`` stores)."""

    version: int
    rule: Rule
    template: str  # the task template's JSON text, input numbers spelled as given
    misfire_policy: str
    overlap_policy: str
    catchup_window: dt.timedelta
    grace: dt.timedelta
    effective_from: dt.datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Version:
        return cls(
            version=row["version"],
            rule=schedule_rules.parse_rule(jsondoc.loads_strict(row["rule"])),
            template=row["template"], misfire_policy=row["misfire_policy"],
            overlap_policy=row["overlap_policy"],
            catchup_window=dt.timedelta(milliseconds=row["catchup_window_ms"]),
            grace=dt.timedelta(milliseconds=row["grace_ms"]),
            effective_from=as_utc(row["effective_from"]),
        )


@attrs.frozen(kw_only=True)
class Progress:
    """The schedule row's runtime columns, as :func:`plan` reads and writes them."""

    covered_until: dt.datetime
    processing_version: int
    buffered_fire_at: dt.datetime | None
    previous_unfinished: bool


@attrs.frozen(kw_only=True)
class Occurrence:
    """One ledger row to write (and, unless skipped, one task to create)."""

    fire_at: dt.datetime
    version: int
    outcome: str  # FIRED | SKIPPED | MERGED
    reason: str | None = None
    covered_until: dt.datetime | None = None
    covered_count: int = 1
    due_at: dt.datetime  # fire_at + jitter: lateness is measured from here


@attrs.frozen(kw_only=True)
class Plan:
    occurrences: list[Occurrence]
    progress: Progress
    next_fire_at: dt.datetime | None
    check_at: dt.datetime | None


def _due(rule: Rule, schedule_id: bytes, fire_at: dt.datetime) -> dt.datetime:
    return fire_at + schedule_rules.jitter_for(rule, schedule_id, fire_at)


def plan(schedule_id: bytes, versions: dict[int, Version], progress: Progress,  # noqa: PLR0912, PLR0915
         now: dt.datetime) -> Plan:
    """What one firing step does for one schedule (pure; see the module docstring)."""
    out: list[Occurrence] = []
    covered, pv = progress.covered_until, progress.processing_version
    buffered, busy = progress.buffered_fire_at, progress.previous_unfinished
    pending: Occurrence | None = None  # an open skip/merge range, extended while it grows
    more_work = False
    wait_until: dt.datetime | None = None

    def close_range() -> None:
        """Write the open range; a merged range is one run and meets the overlap policy
        (with BUFFER_ONE a busy predecessor skips it: a range is not buffered)."""
        nonlocal pending, busy
        if pending is None:
            return
        if pending.outcome == "MERGED":
            if busy and versions[pending.version].overlap_policy != "ALLOW":
                out.append(attrs.evolve(pending, outcome="SKIPPED", reason="overlap"))
            else:
                out.append(pending)
                busy = True
        else:
            out.append(pending)
        pending = None

    def run(at: dt.datetime, version: int, due_at: dt.datetime) -> None:
        """A run meets the overlap policy."""
        nonlocal busy, buffered
        policy = versions[version].overlap_policy
        if busy and policy == "SKIP":
            out.append(Occurrence(fire_at=at, version=version, outcome="SKIPPED",
                                  reason="overlap", due_at=due_at))
            return
        if busy and policy == "BUFFER_ONE":
            if buffered is None:
                buffered = at
            else:
                out.append(Occurrence(fire_at=at, version=version, outcome="SKIPPED",
                                      reason="overlap", due_at=due_at))
            return
        out.append(Occurrence(fire_at=at, version=version, outcome="FIRED", due_at=due_at))
        busy = True

    if buffered is not None and not busy:
        out.append(Occurrence(fire_at=buffered, version=pv, outcome="FIRED", due_at=buffered))
        buffered, busy = None, True

    while True:
        v = versions[pv]
        nxt = versions.get(pv + 1)
        start = max(covered, v.effective_from)
        horizon = now if nxt is None else min(now, nxt.effective_from - US)
        room = MAX_ROWS_PER_PASS - len(out)
        fires = (schedule_rules.fires_after(v.rule, start - US, horizon, limit=room + 1)
                 if horizon >= start and room > 0 else [])
        stopped = False
        for index, at in enumerate(fires):
            if index >= room or len(out) >= MAX_ROWS_PER_PASS:
                more_work, stopped = True, True
                break
            due_at = _due(v.rule, schedule_id, at)
            if due_at > now:
                wait_until, stopped = due_at, True
                break
            # Within grace an instant is on time, whatever the window; only a missed one is
            # judged by the catch-up window and then by the misfire policy.
            missed = now - due_at > v.grace
            if missed and at < now - v.catchup_window:
                kind, reason = "SKIPPED", "outside_catchup_window"
            elif missed and v.misfire_policy == "SKIP":
                kind, reason = "SKIPPED", "misfire"
            elif missed and v.misfire_policy == "MERGE":
                kind, reason = "MERGED", "misfire"
            else:
                kind, reason = "RUN", None
            if kind == "RUN":
                close_range()
                run(at, pv, due_at)
            elif (pending is not None and pending.outcome == kind
                  and pending.reason == reason):
                pending = attrs.evolve(pending, covered_until=at + US,
                                       covered_count=pending.covered_count + 1)
            else:
                close_range()
                pending = Occurrence(fire_at=at, version=pv, outcome=kind, reason=reason,
                                     covered_until=at + US, due_at=due_at)
            covered = at + US
        close_range()
        if stopped:
            break
        if len(fires) > room:
            more_work = True
            break
        covered = max(covered, horizon + US)
        if nxt is not None and now >= nxt.effective_from:
            pv += 1
            covered = max(covered, nxt.effective_from)
            continue
        break

    v = versions[pv]
    upcoming = schedule_rules.next_fire(v.rule, covered - US)
    candidates = []
    if more_work:
        candidates.append(now)
    if wait_until is not None:
        candidates.append(wait_until)
    elif upcoming is not None:
        candidates.append(_due(v.rule, schedule_id, upcoming))
    if buffered is not None:
        candidates.append(now + BUFFER_POLL)
    return Plan(
        occurrences=out,
        progress=Progress(covered_until=covered, processing_version=pv,
                          buffered_fire_at=buffered, previous_unfinished=busy),
        next_fire_at=upcoming,
        check_at=min(candidates) if candidates else None,
    )


# --- the firing transaction ---------------------------------------------------------------------

SCHEDULE_COLUMNS = (
    "namespace_id, id, queue_id, name, state, revision, current_version, processing_version,"
    " covered_until, next_fire_at, check_at, buffered_fire_at, last_task_id, last_fired_at"
)
DUE = f"""
SELECT {SCHEDULE_COLUMNS} FROM pulse_schedules FORCE INDEX (ix_schedules_check)
WHERE state = 'ACTIVE' AND check_at <= %s
ORDER BY check_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""
VERSIONS = """
SELECT version, rule, template, misfire_policy, overlap_policy, catchup_window_ms, grace_ms,
       effective_from
FROM pulse_schedule_versions WHERE namespace_id = %s AND schedule_id = %s AND version >= %s
ORDER BY version
"""
INSERT_OCCURRENCES = (
    "INSERT INTO pulse_schedule_occurrences (namespace_id, id, schedule_id, fire_at, version,"
    " source, outcome, reason, covered_until, covered_count, task_id, fired_at, lateness_ms)"
)
OCCURRENCE_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
# The unique key that admits one run (FIRED or MERGED) per (schedule, fire time), any source.
RUN_KEY = "uq_occurrences_run"
# Runs of one schedule between two fire times (inclusive), over uq_occurrences_run; one group
# per schedule, joined with OR. Parameters per group: schedule id, first and last fire time.
RUNS_BETWEEN = (
    "SELECT schedule_id, run_fire_at FROM pulse_schedule_occurrences"
    " WHERE namespace_id = %s AND ({})"
)
RUNS_GROUP = "(schedule_id = %s AND run_fire_at BETWEEN %s AND %s)"
SAVE_PROGRESS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_schedules s"
    " ON s.namespace_id = %s AND s.id = v.id"
    " SET s.covered_until = v.covered_until, s.processing_version = v.processing_version,"
    "     s.next_fire_at = v.next_fire_at, s.check_at = v.check_at,"
    "     s.buffered_fire_at = v.buffered_fire_at,"
    "     s.last_task_id = COALESCE(v.last_task_id, s.last_task_id),"
    "     s.last_fired_at = COALESCE(v.last_fired_at, s.last_fired_at)"
    " WHERE s.state = 'ACTIVE'"
)

# Immutable, so safe to keep per process: (namespace, schedule, version) -> Version, and the
# validated task spec of a version's template for a queue name.
_VERSIONS: dict[tuple[bytes, bytes, int], Version] = {}
_SPECS: dict[tuple[bytes, bytes, int], tasks.TaskSpec] = {}


async def load_versions(cur: Any, namespace_id: bytes, schedule_id: bytes,
                        from_version: int, current: int) -> dict[int, Version]:
    """Versions ``from_version``..``current`` of a schedule (immutable, so cached)."""
    keys = [(namespace_id, schedule_id, n) for n in range(from_version, current + 1)]
    if any(k not in _VERSIONS for k in keys):
        await cur.execute(VERSIONS, (namespace_id, schedule_id, from_version))
        for row in await cur.fetchall():
            _VERSIONS[(namespace_id, schedule_id, row["version"])] = Version.from_row(row)
    return {k[2]: _VERSIONS[k] for k in keys}


def template_spec(namespace_id: bytes, schedule_id: bytes, version: Version,
                  queue_name: str) -> tasks.TaskSpec:
    """The version's task template as a validated :class:`tasks.TaskSpec` (cached)."""
    key = (namespace_id, schedule_id, version.version)
    spec = _SPECS.get(key)
    if spec is None or spec.queue != queue_name:
        spec = parse_template(jsondoc.loads_strict(version.template),
                              jsondoc.loads_strict(version.template, keep_number_text=True),
                              queue_name, "$.template")
        _SPECS[key] = spec
    return spec


TEMPLATE_FIELDS = frozenset({
    "handler", "input", "priority", "business_key", "concurrency_key", "deadline_ms",
    "start_deadline_ms", "attempt_timeout_ms", "retry", "rerun_safe", "offer_lease_ms",
    "execution_lease_ms",
})


def parse_template(doc: Any, exact: Any, queue_name: str, path: str) -> tasks.TaskSpec:
    """A task template: a task submission without ``queue`` (the schedule's) and without
    ``delay_ms`` / ``not_before`` (the rule decides when)."""
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": path, "message": "an object"}])
    unknown = sorted(set(doc) - TEMPLATE_FIELDS)
    if unknown:
        raise errors.ValidationFailed([{"path": f"{path}.{unknown[0]}",
                                        "message": "not a template field"}])
    try:
        dto = strict.structure({**doc, "queue": queue_name}, tasks.SubmitRequest)
    except errors.ValidationFailed as exc:
        raise errors.ValidationFailed([
            {**p, "path": p["path"].replace("$", path, 1)} for p in exc.errors]) from exc
    exact_input = exact.get("input", {}) if isinstance(exact, dict) else {}
    spec, problems = tasks.validate(dto, exact_input, path)
    if spec is None:
        raise errors.ValidationFailed(problems)
    return spec


@attrs.frozen(kw_only=True)
class FireStats:
    schedules: int = 0
    fired: int = 0
    skipped: int = 0
    merged: int = 0
    refused: int = 0
    lateness_ms: tuple[int, ...] = ()


async def fire_due(cur: Any, limit: int = 64) -> FireStats:
    """One firing transaction: lock up to ``limit`` due schedules and take one step each."""
    now = await db_now(cur)
    await cur.execute(DUE, (to_db(now), limit))
    rows = list(await cur.fetchall())
    if not rows:
        return FireStats()
    by_namespace: dict[bytes, list[dict[str, Any]]] = {}
    for row in rows:
        by_namespace.setdefault(row["namespace_id"], []).append(row)
    for namespace_id in await _disabled_namespaces(cur, list(by_namespace)):
        group = by_namespace.pop(namespace_id)
        await _postpone(cur, namespace_id, [r["id"] for r in group], now + NAMESPACE_RECHECK)
    totals = FireStats(schedules=len(rows))
    for n, (namespace_id, group) in enumerate(sorted(by_namespace.items())):
        savepoint = f"ns{n}"
        await cur.execute(f"SAVEPOINT {savepoint}")  # generated identifier
        try:
            stats = await _fire_group_once_per_instant(cur, namespace_id, group, now, savepoint)
        except (errors.QueueFull, errors.ApplicationQuotaExceeded):
            await cur.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
            await _postpone(cur, namespace_id, [r["id"] for r in group], now + LIMIT_RETRY)
            stats = FireStats(refused=len(group))
        totals = FireStats(
            schedules=totals.schedules, fired=totals.fired + stats.fired,
            skipped=totals.skipped + stats.skipped, merged=totals.merged + stats.merged,
            refused=totals.refused + stats.refused,
            lateness_ms=totals.lateness_ms + stats.lateness_ms)
    return totals


async def _fire_group_once_per_instant(cur: Any, namespace_id: bytes,
                                       group: list[dict[str, Any]], now: dt.datetime,
                                       savepoint: str) -> FireStats:
    """:func:`_fire_group`; when a run of one of its instants was committed by another writer
    between its check and its insert (1062 on :data:`RUN_KEY`), the group is rolled back to
    ``savepoint`` and planned once more (the check then sees that run)."""
    try:
        return await _fire_group(cur, namespace_id, group, now)
    except Exception as exc:
        if not dberrors.is_duplicate(exc, RUN_KEY):
            raise
    await cur.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")  # generated identifier
    return await _fire_group(cur, namespace_id, group, now)


async def runs_at(cur: Any, namespace_id: bytes,
                  instants: dict[bytes, list[dt.datetime]]) -> set[tuple[bytes, dt.datetime]]:
    """Which of ``{schedule id: fire times}`` already have a run (FIRED or MERGED, any source)
    in the ledger, as ``(schedule id, fire time)``."""
    wanted = {k: v for k, v in instants.items() if v}
    if not wanted:
        return set()
    groups, params = [], []
    for schedule_id, times in sorted(wanted.items()):
        groups.append(RUNS_GROUP)
        params += [schedule_id, to_db(min(times)), to_db(max(times))]
    await cur.execute(RUNS_BETWEEN.format(" OR ".join(groups)), (namespace_id, *params))
    found = {(row["schedule_id"], as_utc(row["run_fire_at"])) for row in await cur.fetchall()}
    return {(sid, at) for sid, times in wanted.items() for at in times if (sid, at) in found}


async def _disabled_namespaces(cur: Any, namespace_ids: list[bytes]) -> list[bytes]:
    await cur.execute(
        f"SELECT id FROM orbit_namespaces WHERE id IN ({placeholders(len(namespace_ids))})"
        " AND state <> 'ACTIVE'", tuple(namespace_ids))
    return [row["id"] for row in await cur.fetchall()]


async def _postpone(cur: Any, namespace_id: bytes, schedule_ids: Sequence[bytes],
                    until: dt.datetime) -> None:
    await cur.execute(
        f"UPDATE pulse_schedules SET check_at = %s WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(schedule_ids))})",
        (to_db(until), namespace_id, *schedule_ids))


async def _unfinished(cur: Any, namespace_id: bytes, task_ids: list[bytes]) -> set[bytes]:
    if not task_ids:
        return set()
    await cur.execute(
        f"SELECT id FROM pulse_tasks WHERE namespace_id = %s"
        f" AND id IN ({placeholders(len(task_ids))})"
        f" AND state IN ({placeholders(len(UNFINISHED))})",
        (namespace_id, *task_ids, *UNFINISHED))
    return {row["id"] for row in await cur.fetchall()}


async def _queues(cur: Any, namespace_id: bytes, queue_ids: set[bytes]) -> dict[bytes, Queue]:
    ordered = sorted(queue_ids)
    await cur.execute(
        f"SELECT {Queue.COLUMNS} FROM pulse_queues q WHERE q.namespace_id = %s"
        f" AND q.id IN ({placeholders(len(ordered))})", (namespace_id, *ordered))
    return {row["id"]: Queue.from_row(row) for row in await cur.fetchall()}


async def _fire_group(cur: Any, namespace_id: bytes, group: list[dict[str, Any]],
                      now: dt.datetime) -> FireStats:
    busy = await _unfinished(cur, namespace_id,
                             [r["last_task_id"] for r in group if r["last_task_id"]])
    queues = await _queues(cur, namespace_id, {r["queue_id"] for r in group})
    planned: list[tuple[tasks.Item, Queue]] = []
    payloads: list[dict[str, Any]] = []
    ledger: list[tuple[Any, ...]] = []
    progress_rows: list[tuple[Any, ...]] = []
    stats = {"fired": 0, "skipped": 0, "merged": 0}
    lateness: list[int] = []
    steps = []
    for row in group:
        versions = await load_versions(cur, namespace_id, row["id"], row["processing_version"],
                                   row["current_version"])
        steps.append((row, versions, plan(row["id"], versions, Progress(
            covered_until=as_utc(row["covered_until"]),
            processing_version=row["processing_version"],
            buffered_fire_at=as_utc(row["buffered_fire_at"]) if row["buffered_fire_at"] else None,
            previous_unfinished=row["last_task_id"] in busy), now)))
    # Instants a TRIGGER or BACKFILL already ran: skipped, never a second run.
    ran = await runs_at(cur, namespace_id, {
        row["id"]: [o.fire_at for o in step.occurrences if o.outcome != "SKIPPED"]
        for row, _, step in steps})
    for row, versions, step in steps:
        queue = queues[row["queue_id"]]
        last_task = None
        for planned_occ in step.occurrences:
            occ = planned_occ
            if occ.outcome != "SKIPPED" and (row["id"], occ.fire_at) in ran:
                occ = attrs.evolve(occ, outcome="SKIPPED", reason="already_ran")
            task_id = None
            if occ.outcome != "SKIPPED":
                spec = template_spec(namespace_id, row["id"], versions[occ.version], queue.name)
                item = tasks.Item(spec=spec, path="$.template", owner_kind="SCHEDULE",
                                  owner_id=row["id"])
                task_id = last_task = item.task_id
                planned.append((item, queue))
                payloads.append({"schedule": {
                    "id": row["id"].hex(), "name": row["name"], "version": occ.version,
                    "fire_at": occ.fire_at.isoformat(timespec="microseconds"),
                    "covered_until": occ.covered_until.isoformat(timespec="microseconds")
                    if occ.covered_until else None, "covered_count": occ.covered_count}})
            late = max(0, int((now - occ.due_at) / dt.timedelta(milliseconds=1)))
            if occ.outcome == "FIRED":
                lateness.append(late)
            stats[{"FIRED": "fired", "SKIPPED": "skipped", "MERGED": "merged"}[occ.outcome]] += 1
            ledger.append((namespace_id, ids.new_id(), row["id"], to_db(occ.fire_at),
                           occ.version, "RULE", occ.outcome, occ.reason,
                           to_db(occ.covered_until) if occ.covered_until else None,
                           occ.covered_count, task_id, to_db(now), late))
        p = step.progress
        progress_rows.append((
            row["id"], to_db(p.covered_until), p.processing_version,
            to_db(step.next_fire_at) if step.next_fire_at else None,
            to_db(step.check_at) if step.check_at else None,
            to_db(p.buffered_fire_at) if p.buffered_fire_at else None,
            last_task, to_db(now) if last_task else None,
        ))
    if planned:
        await tasks.insert_generated(cur, namespace_id, planned, now, payloads)
    if ledger:
        sql, params = multi_insert(INSERT_OCCURRENCES, OCCURRENCE_ROW, ledger)
        await cur.execute(sql, params)
    table, values = values_table(
        ["id", "covered_until", "processing_version", "next_fire_at", "check_at",
         "buffered_fire_at", "last_task_id", "last_fired_at"], progress_rows)
    await cur.execute(SAVE_PROGRESS.format(table=table), (*values, namespace_id))
    return FireStats(fired=stats["fired"], skipped=stats["skipped"], merged=stats["merged"],
                     lateness_ms=tuple(lateness))

"""Flow control: queue resources, application shared quotas and keyed concurrency permits.

Counters (maintained in the same transaction as the task or attempt change they count, never
reset by a configuration change, never touched by configuration updates):

===========================================  ====================================================
``pulse_queues.unfinished_tasks``             tasks in WAITING, LEASED, RUNNING or NEEDS_REVIEW
``pulse_queues.active_attempts``              attempts OFFERED or RUNNING
``pulse_queues.starts_in_window``             starts approved since ``start_window_until - 1 s``
``orbit_application_resources.*``             the same, summed over the application's namespaces,
                                              plus ``reserved_attempts`` (OFFERED, not started)
                                              -- kept only while the application has a count
                                              limit (:data:`TRACKED`); the limit change that
                                              sets the first one recounts them
                                              (:func:`recount_application`)
``pulse_concurrency_limits.held_permits``     valid permits of one concurrency key (0 or 1)
===========================================  ====================================================

Limits are checked where the specification puts them: ``max_unfinished_tasks`` at submit (a
refusal writes nothing: the whole transaction rolls back), ``max_concurrent_attempts`` /
``max_active_attempts`` / ``max_reserved_attempts`` at claim, the start windows at start
approval. Lowering a limit below the current usage refuses new work until usage falls; it never
deletes tasks or revokes grants.

Lock order: the one order of docs/architecture.md (its part here: tasks / attempts → queue rows
(by id) → concurrency-key rows (by digest) and their permits → the application's resource row →
the result stream, last), with no exception, which is why these do not deadlock. The
shared rows come after the tasks, and new rows (events, receipts) are written before them, so
the hot rows are held only for the end of each transaction. An application without count limits
is only share-locked (its counters are not kept), so the transactions of all its namespaces do
not queue behind one row; with them, every transaction of the application updates the row. A
claim that must count its room under locks (:func:`grantable`) takes them in the same order.

Keyed concurrency: a task may carry a ``concurrency_key`` (exact bytes). Its row in
``pulse_concurrency_limits`` (created at submit, never deleted) allows one valid permit. Each
grant and each release add one to the row's ``revision``; the value after a grant is the
attempt's fencing token (``pulse_attempts.concurrency_token``), strictly increasing per key.
A grant that could not also be released without passing :data:`MAX_TOKEN` is refused, so tokens
never wrap. One valid permit per key is also a database fact: ``uq_permits_held``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import as_utc, to_db
from orbit_common.model import digests, ids

KEY_DOMAIN = "orbit.concurrency-key.v1"
KEY_MAX_BYTES = 255
MAX_TOKEN = 2**63 - 1
WINDOW = dt.timedelta(seconds=1)
# An application's usage counters are kept only while one of its count limits is set.
TRACKED = ("(max_unfinished_tasks IS NOT NULL OR max_active_attempts IS NOT NULL"
           " OR max_reserved_attempts IS NOT NULL)")


def key_digest(key: bytes) -> bytes:
    """The concurrency key's row identity: domain-separated SHA-256 of its exact bytes."""
    return digests.domain_digest(KEY_DOMAIN, key)


class CounterDrift(errors.DatabaseError):
    """A counter would go negative or a resource row is missing: a bug, never a user error."""

    code = "counter_drift"


# --- the namespace's application --------------------------------------------------------------

_APPLICATION_OF: dict[bytes, bytes] = {}


async def application_of(cur: Any, namespace_id: bytes) -> bytes:
    """The application that owns ``namespace_id`` (immutable, so cached per process)."""
    found = _APPLICATION_OF.get(namespace_id)
    if found is None:
        await cur.execute("SELECT application_id FROM orbit_namespaces WHERE id = %s",
                          (namespace_id,))
        row = await cur.fetchone()
        if row is None:
            raise errors.NamespaceNotFound()
        found = _APPLICATION_OF[namespace_id] = row["application_id"]
    return found


# --- usage deltas -----------------------------------------------------------------------------


@attrs.define
class Usage:
    """Counter changes of one transaction, applied together by :func:`apply`."""

    unfinished: Counter[bytes] = attrs.field(factory=Counter)  # queue id -> delta
    active: Counter[bytes] = attrs.field(factory=Counter)  # queue id -> delta
    reserved: int = 0  # application level only

    def is_empty(self) -> bool:
        return (not any(self.unfinished.values()) and not any(self.active.values())
                and self.reserved == 0)


QUEUE_DELTA = """
UPDATE pulse_queues
SET unfinished_tasks = unfinished_tasks + %s, active_attempts = active_attempts + %s
WHERE namespace_id = %s AND id = %s
  AND unfinished_tasks + %s >= 0 AND active_attempts + %s >= 0
"""
QUEUE_LIMIT = " AND (max_unfinished_tasks IS NULL OR unfinished_tasks + %s <= max_unfinished_tasks)"
APP_DELTA = f"""
UPDATE orbit_application_resources
SET unfinished_tasks = unfinished_tasks + %s, active_attempts = active_attempts + %s,
    reserved_attempts = reserved_attempts + %s
WHERE application_id = %s AND {TRACKED}
  AND unfinished_tasks + %s >= 0 AND active_attempts + %s >= 0 AND reserved_attempts + %s >= 0
"""
APP_LIMIT = " AND (max_unfinished_tasks IS NULL OR unfinished_tasks + %s <= max_unfinished_tasks)"
APP_TRACKED_SHARED = (f"SELECT {TRACKED} AS tracked FROM orbit_application_resources"
                      " WHERE application_id = %s LOCK IN SHARE MODE")

class ConcurrencyLimitRaced(errors.OrbitError):
    """A claim that read its queue without a concurrency limit would pass one set since: its
    transaction must roll back and run again (``leases.run_claim``)."""

    code = "concurrency_limit_raced"


QUEUE_ACTIVE_CAP = (" AND (max_concurrent_attempts IS NULL"
                    " OR active_attempts + %s <= max_concurrent_attempts)")


async def apply(cur: Any, namespace_id: bytes, usage: Usage, *, admit: bool = False,
                between: Callable[[], Awaitable[Any]] | None = None,
                cap_active: bool = False) -> None:
    """Apply ``usage`` to the queue rows (by id), run ``between`` (the concurrency-key work of
    the same transaction), then update the application row: the one lock order
    (docs/architecture.md).

    With ``admit`` (submissions), an increase of unfinished tasks past a limit raises
    :class:`errors.QueueFull` or :class:`errors.ApplicationQuotaExceeded`; the caller's
    transaction then rolls back, so nothing is written. With ``cap_active`` (a claim that did
    not lock its queue row early), an increase of active attempts past a
    ``max_concurrent_attempts`` raises :class:`ConcurrencyLimitRaced`.
    """
    for queue_id in sorted(set(usage.unfinished) | set(usage.active)):
        du, da = usage.unfinished[queue_id], usage.active[queue_id]
        if du == 0 and da == 0:
            continue
        sql, params = QUEUE_DELTA, [du, da, namespace_id, queue_id, du, da]
        if admit and du > 0:
            sql, params = sql + QUEUE_LIMIT, [*params, du]
        if cap_active and da > 0:
            sql, params = sql + QUEUE_ACTIVE_CAP, [*params, da]
        await cur.execute(sql, params)
        if cur.rowcount != 1:
            if admit and du > 0:
                await _explain_queue_refusal(cur, namespace_id, queue_id, du)
            if cap_active and da > 0:
                await _explain_active_cap(cur, namespace_id, queue_id)
            raise CounterDrift(f"queue {queue_id.hex()} counters would go negative")
    if between is not None:
        await between()
    du, da = sum(usage.unfinished.values()), sum(usage.active.values())
    if du == 0 and da == 0 and usage.reserved == 0:
        return
    app = await application_of(cur, namespace_id)
    await _apply_application(cur, app, du, da, usage.reserved, admit=admit and du > 0)


# --- the application's counters ---------------------------------------------------------------

# Whether an application's counters were tracked when this process last looked: only a guess
# that picks the cheaper first statement; the database row decides (see _apply_application).
_TRACKED_HINT: dict[bytes, bool] = {}


async def _apply_application(cur: Any, app: bytes, du: int, da: int, dr: int, *,
                             admit: bool) -> None:
    """Add the deltas to the application's counters, if it tracks them.

    An untracked application (no count limit: the default) is left alone, so its row is not a
    lock every transaction of the application queues behind; only a shared lock is taken, which
    concurrent transactions share and a limit change waits for (see :func:`recount_application`
    for why that makes the recount exact). A tracked application's row is updated with an
    exclusive lock, as any counter row.
    """
    if _TRACKED_HINT.get(app, False) and await _update_application(
            cur, app, du, da, dr, admit=admit):
        return
    await cur.execute(APP_TRACKED_SHARED, (app,))
    row = await cur.fetchone()
    if row is None:
        raise CounterDrift(f"application {app.hex()} has no resource row")
    tracked = _TRACKED_HINT[app] = bool(row["tracked"])
    if not tracked or await _update_application(cur, app, du, da, dr, admit=admit):
        return
    if admit:
        await cur.execute("SELECT unfinished_tasks, max_unfinished_tasks FROM"
                          " orbit_application_resources WHERE application_id = %s", (app,))
        found = await cur.fetchone()
        if found is not None and found["max_unfinished_tasks"] is not None:
            raise errors.ApplicationQuotaExceeded(
                f"the application has {found['unfinished_tasks']} unfinished tasks; its limit"
                f" is {found['max_unfinished_tasks']} and this request adds {du}",
                limit=found["max_unfinished_tasks"], unfinished=found["unfinished_tasks"])
    raise CounterDrift(f"application {app.hex()} counters would go negative")


async def _update_application(cur: Any, app: bytes, du: int, da: int, dr: int, *,
                              admit: bool) -> bool:
    sql, params = APP_DELTA, [du, da, dr, app, du, da, dr]
    if admit:
        sql, params = sql + APP_LIMIT, [*params, du]
    await cur.execute(sql, params)
    return bool(cur.rowcount == 1)


@attrs.frozen(kw_only=True)
class ApplicationUsage:
    unfinished_tasks: int
    active_attempts: int
    reserved_attempts: int


async def application_usage(cur: Any, app: bytes) -> ApplicationUsage:
    """The application's usage recounted from its queues' counters and its LEASED tasks
    (plain reads: index lookups, no locks)."""
    await cur.execute(
        "SELECT COALESCE(SUM(q.unfinished_tasks), 0) AS unfinished,"
        " COALESCE(SUM(q.active_attempts), 0) AS active"
        " FROM orbit_namespaces n JOIN pulse_queues q ON q.namespace_id = n.id"
        " WHERE n.application_id = %s", (app,))
    sums = await cur.fetchone()
    await cur.execute(
        "SELECT COUNT(*) AS reserved FROM orbit_namespaces n"
        " JOIN pulse_tasks t ON t.namespace_id = n.id AND t.state = 'LEASED'"
        " WHERE n.application_id = %s", (app,))
    leased = await cur.fetchone()
    return ApplicationUsage(unfinished_tasks=int(sums["unfinished"]),
                            active_attempts=int(sums["active"]),
                            reserved_attempts=int(leased["reserved"]))


async def recount_application(cur: Any, app: bytes) -> ApplicationUsage:
    """Set the counters of an application that starts tracking them (a count limit set where
    none was), in the transaction that set it, after its guarded UPDATE locked the row.

    Why the plain reads are exact: every transaction that moves the usage of an untracked
    application holds a shared lock on this row from before its commit (``_apply_application``),
    so the exclusive lock the limit change holds was granted only after all of those committed,
    and those not yet at that point wait for it, then see the row tracked and add their own
    deltas. Nothing that changes the usage can commit between the lock and this recount.
    """
    usage = await application_usage(cur, app)
    await cur.execute(
        "UPDATE orbit_application_resources SET unfinished_tasks = %s, active_attempts = %s,"
        " reserved_attempts = %s WHERE application_id = %s",
        (usage.unfinished_tasks, usage.active_attempts, usage.reserved_attempts, app))
    return usage


async def _explain_active_cap(cur: Any, namespace_id: bytes, queue_id: bytes) -> None:
    await cur.execute("SELECT max_concurrent_attempts FROM pulse_queues"
                      " WHERE namespace_id = %s AND id = %s", (namespace_id, queue_id))
    row = await cur.fetchone()
    if row is not None and row["max_concurrent_attempts"] is not None:
        raise ConcurrencyLimitRaced(
            "the queue got a concurrency limit while this claim ran; run it again")


async def _explain_queue_refusal(cur: Any, namespace_id: bytes, queue_id: bytes,
                                 adding: int) -> None:
    await cur.execute("SELECT name, unfinished_tasks, max_unfinished_tasks FROM pulse_queues"
                      " WHERE namespace_id = %s AND id = %s", (namespace_id, queue_id))
    row = await cur.fetchone()
    if row is not None and row["max_unfinished_tasks"] is not None:
        raise errors.QueueFull(
            f"queue {row['name']!r} has {row['unfinished_tasks']} unfinished tasks; its limit is"
            f" {row['max_unfinished_tasks']} and this request adds {adding}",
            queue=row["name"], limit=row["max_unfinished_tasks"],
            unfinished=row["unfinished_tasks"])


# --- claim-time room ----------------------------------------------------------------------------

QUEUE_ROOM = """
SELECT active_attempts, max_concurrent_attempts FROM pulse_queues
WHERE namespace_id = %s AND id = %s
"""
QUEUE_ROOM_FOR_UPDATE = QUEUE_ROOM.rstrip() + " FOR UPDATE\n"
APP_ROOM = (
    "SELECT active_attempts, max_active_attempts, reserved_attempts, max_reserved_attempts"
    " FROM orbit_application_resources WHERE application_id = %s"
)


def _app_room(row: dict[str, Any]) -> int | None:
    """How many grants the application's claim-time limits allow (None: unlimited)."""
    values = [row[limit] - row[used] for limit, used in (
        ("max_active_attempts", "active_attempts"),
        ("max_reserved_attempts", "reserved_attempts")) if row[limit] is not None]
    return max(0, min(values)) if values else None


async def grantable(cur: Any, namespace_id: bytes, queue_id: bytes,
                    rows: list[dict[str, Any]]
                    ) -> tuple[list[dict[str, Any]], dict[bytes, KeyGrant], bool]:
    """Cut a claim's candidate tasks (locked already) to the room the queue, the keys and the
    application have, one per concurrency key, and take the keys' permits. Returns the chosen
    rows, the key grants by digest, and whether the queue row is locked here already.

    The queue and application rows are first read without a lock. When nothing needs counting
    under a lock, they are locked only at the end of the claim, by the counter update
    (:func:`apply`), so claims and finishes do not queue behind a claim's whole transaction.
    When the queue has ``max_concurrent_attempts``, a candidate has a concurrency key, or the
    application has claim-time limits (``max_active_attempts`` / ``max_reserved_attempts``),
    the rows are locked here, in the one lock order (docs/architecture.md): the queue row, then
    the keys' rows (by digest), then the application's row -- the order every other
    transaction takes them in, so there is no exception to deadlock on.
    """
    await cur.execute(QUEUE_ROOM, (namespace_id, queue_id))
    counters = await cur.fetchone()
    app = await application_of(cur, namespace_id)
    await cur.execute(APP_ROOM, (app,))
    app_row = await cur.fetchone()
    if app_row is None:
        raise CounterDrift(f"application {app.hex()} has no resource row")
    app_limited = _app_room(app_row) is not None
    keyed_candidates = any(r["concurrency_key_digest"] is not None for r in rows)
    locked = counters["max_concurrent_attempts"] is not None or keyed_candidates or app_limited
    if locked:
        await cur.execute(QUEUE_ROOM_FOR_UPDATE, (namespace_id, queue_id))
        counters = await cur.fetchone()
    room = len(rows)
    if counters["max_concurrent_attempts"] is not None:
        room = min(room, counters["max_concurrent_attempts"] - counters["active_attempts"])
    chosen: list[dict[str, Any]] = []
    seen: set[bytes] = set()
    for row in rows:
        if len(chosen) >= room:
            break
        digest = row["concurrency_key_digest"]
        if digest is not None:
            if digest in seen:
                continue
            seen.add(digest)
        chosen.append(row)
    free = await lock_keys(cur, namespace_id, sorted(seen & {r["concurrency_key_digest"]
                                                             for r in chosen}))
    chosen = [r for r in chosen
              if r["concurrency_key_digest"] is None or r["concurrency_key_digest"] in free]
    if app_limited and chosen:
        await cur.execute(APP_ROOM + " FOR UPDATE", (app,))
        allowed = _app_room(await cur.fetchone())
        if allowed is not None:
            chosen = chosen[:allowed]
    keyed = await take_permits(cur, namespace_id, {
        r["concurrency_key_digest"]: free[r["concurrency_key_digest"]]
        for r in chosen if r["concurrency_key_digest"] is not None})
    return chosen, keyed, locked


# --- start windows ------------------------------------------------------------------------------


@attrs.define
class Window:
    """One one-second start window (a queue's or the application's), locked for update."""

    limit: int | None
    until: dt.datetime | None
    used: int

    def room(self, now: dt.datetime) -> int | None:
        if self.limit is None:
            return None
        if self.until is None or self.until <= now:
            return self.limit
        return max(0, self.limit - self.used)

    def take(self, now: dt.datetime, n: int) -> None:
        if self.until is None or self.until <= now:
            self.until, self.used = now + WINDOW, 0
        self.used += n

    def retry_after_ms(self, now: dt.datetime) -> int:
        if self.until is None or self.until <= now:
            return 0
        return max(1, int((self.until - now) / dt.timedelta(milliseconds=1)) + 1)


async def queue_windows(cur: Any, namespace_id: bytes, queue_ids: Iterable[bytes],
                        limited: Iterable[bytes]) -> dict[bytes, Window]:
    """The queues' start windows. Only the ``limited`` queues (those the caller read with a
    start limit) are locked (FOR UPDATE, by id); a limit set by a transaction that commits
    after that read applies from the next start batch on."""
    windows = {q: Window(limit=None, until=None, used=0) for q in set(queue_ids)}
    ordered = sorted(set(limited) & set(windows))
    if ordered:
        await cur.execute(
            "SELECT id, max_starts_per_second, start_window_until, starts_in_window"
            f" FROM pulse_queues WHERE namespace_id = %s AND id IN ({placeholders(len(ordered))})"
            " ORDER BY id FOR UPDATE", (namespace_id, *ordered))
        for row in await cur.fetchall():
            windows[row["id"]] = Window(
                limit=row["max_starts_per_second"],
                until=as_utc(row["start_window_until"]) if row["start_window_until"] else None,
                used=row["starts_in_window"])
    return windows


async def application_window(cur: Any, namespace_id: bytes) -> Window:
    """The application's start window; its row is locked only when it has a start limit
    (its reserved count is decremented at the end of the start transaction either way)."""
    app = await application_of(cur, namespace_id)
    await cur.execute("SELECT max_starts_per_second FROM orbit_application_resources"
                      " WHERE application_id = %s", (app,))
    row = await cur.fetchone()
    if row is None:
        raise CounterDrift(f"application {app.hex()} has no resource row")
    if row["max_starts_per_second"] is None:
        return Window(limit=None, until=None, used=0)
    await cur.execute(
        "SELECT max_starts_per_second, start_window_until, starts_in_window"
        " FROM orbit_application_resources WHERE application_id = %s FOR UPDATE", (app,))
    row = await cur.fetchone()
    return Window(limit=row["max_starts_per_second"],
                  until=as_utc(row["start_window_until"]) if row["start_window_until"] else None,
                  used=row["starts_in_window"])


async def save_windows(cur: Any, namespace_id: bytes, queues: Mapping[bytes, Window], *,
                       touched: Iterable[bytes], app: Window | None, started: int) -> None:
    """Write back the windows that took starts, and the application's reserved count."""
    for queue_id in sorted(set(touched)):
        w = queues[queue_id]
        if w.limit is None:
            continue
        await cur.execute(
            "UPDATE pulse_queues SET start_window_until = %s, starts_in_window = %s"
            " WHERE namespace_id = %s AND id = %s",
            (to_db(w.until) if w.until else None, w.used, namespace_id, queue_id))
    if started == 0:
        return
    application = await application_of(cur, namespace_id)
    if app is not None and app.limit is not None:  # its row is locked by application_window
        await cur.execute(
            "UPDATE orbit_application_resources SET start_window_until = %s,"
            " starts_in_window = %s WHERE application_id = %s",
            (to_db(app.until) if app.until else None, app.used, application))
    # The attempts are started (locked) by now: the order _apply_application relies on.
    await _apply_application(cur, application, 0, 0, -started, admit=False)


# --- keyed permits ------------------------------------------------------------------------------

ENSURE_KEYS = (
    "INSERT INTO pulse_concurrency_limits (namespace_id, id, scope_key, key_digest, max_permits,"
    " held_permits, revision, created_at, updated_at)"
)


async def ensure_keys(cur: Any, namespace_id: bytes, keys: Iterable[bytes]) -> None:
    """Create the rows of keys seen for the first time (at submit; rows are never deleted)."""
    by_digest = {key_digest(k): k for k in keys}
    if not by_digest:
        return
    ordered = sorted(by_digest)
    await cur.execute(
        "SELECT key_digest FROM pulse_concurrency_limits WHERE namespace_id = %s"
        f" AND key_digest IN ({placeholders(len(ordered))})", (namespace_id, *ordered))
    known = {row["key_digest"] for row in await cur.fetchall()}
    rows = [(namespace_id, ids.new_id(), by_digest[d], d) for d in ordered if d not in known]
    if rows:
        sql, params = multi_insert(
            ENSURE_KEYS, "(%s, %s, %s, %s, 1, 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", rows)
        # A concurrent submit may create the same key: keep whichever row committed first.
        await cur.execute(sql + " ON DUPLICATE KEY UPDATE key_digest = key_digest", params)


@attrs.frozen(kw_only=True)
class KeyGrant:
    limit_id: bytes
    token: int


async def lock_keys(cur: Any, namespace_id: bytes, digests_wanted: Sequence[bytes]
                    ) -> dict[bytes, KeyGrant]:
    """Lock the keys' rows (by digest) and say which could be granted now, with the token a
    grant would carry; :func:`take_permits` takes them. A key that is held, missing, or whose
    token could not be released without passing :data:`MAX_TOKEN` is left out."""
    ordered = sorted(set(digests_wanted))
    if not ordered:
        return {}
    await cur.execute(
        "SELECT id, key_digest, held_permits, max_permits, revision FROM pulse_concurrency_limits"
        f" WHERE namespace_id = %s AND key_digest IN ({placeholders(len(ordered))})"
        " ORDER BY key_digest FOR UPDATE", (namespace_id, *ordered))
    free: dict[bytes, KeyGrant] = {}
    for row in await cur.fetchall():
        if row["held_permits"] >= row["max_permits"] or row["revision"] + 2 > MAX_TOKEN:
            continue
        free[row["key_digest"]] = KeyGrant(limit_id=row["id"], token=row["revision"] + 1)
    return free


async def take_permits(cur: Any, namespace_id: bytes, grants: Mapping[bytes, KeyGrant]
                       ) -> dict[bytes, KeyGrant]:
    """Take one permit on each key of ``grants`` (rows locked by :func:`lock_keys` in this
    transaction). Permit rows are written by :func:`record_permits` once the attempts exist."""
    for digest in sorted(grants):
        await cur.execute(
            "UPDATE pulse_concurrency_limits SET held_permits = held_permits + 1,"
            " revision = revision + 1, updated_at = UTC_TIMESTAMP(6)"
            " WHERE namespace_id = %s AND id = %s AND held_permits < max_permits",
            (namespace_id, grants[digest].limit_id))
        if cur.rowcount != 1:
            raise CounterDrift("a concurrency key changed under its row lock")
    return dict(grants)


async def acquire(cur: Any, namespace_id: bytes, digests_wanted: Sequence[bytes]
                  ) -> dict[bytes, KeyGrant]:
    """Lock the keys' rows (by digest) and take one permit on each free one."""
    return await take_permits(cur, namespace_id,
                              await lock_keys(cur, namespace_id, digests_wanted))


INSERT_PERMITS = (
    "INSERT INTO pulse_permits (namespace_id, id, limit_id, attempt_id, task_id, token,"
    " acquired_at)"
)


async def record_permits(cur: Any, namespace_id: bytes,
                         rows: Sequence[tuple[bytes, bytes, bytes, int]]) -> None:
    """Permit rows for ``(limit_id, attempt_id, task_id, token)`` grants.

    ``acquired_at`` is the database time of this statement, after the keys' rows were locked,
    not the claim's earlier ``now``: a claim held up between the two could otherwise record a
    grant from before the previous holder's release (two holders of one key at one instant).
    """
    if rows:
        sql, params = multi_insert(
            INSERT_PERMITS, "(%s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))",
            [(namespace_id, ids.new_id(), *r) for r in rows])
        await cur.execute(sql, params)


async def release(cur: Any, namespace_id: bytes, endings: Mapping[bytes, str],
                  now: dt.datetime) -> int:
    """Release the valid permits of ended attempts (attempt id -> its final state).

    Called in the transaction that ends the attempts, after the queue and application rows.
    Returns how many permits were released.
    """
    if not endings:
        return 0
    attempt_ids = sorted(endings)
    await cur.execute(
        "SELECT p.id, p.limit_id, p.attempt_id, l.key_digest FROM pulse_permits p"
        " JOIN pulse_concurrency_limits l ON l.namespace_id = p.namespace_id AND l.id = p.limit_id"
        f" WHERE p.namespace_id = %s AND p.attempt_id IN ({placeholders(len(attempt_ids))})"
        " AND p.released_at IS NULL", (namespace_id, *attempt_ids))
    held = sorted(await cur.fetchall(), key=lambda r: r["key_digest"])
    for row in held:
        await cur.execute(
            "UPDATE pulse_concurrency_limits SET held_permits = held_permits - 1,"
            " revision = revision + 1, updated_at = UTC_TIMESTAMP(6)"
            " WHERE namespace_id = %s AND id = %s AND held_permits >= 1",
            (namespace_id, row["limit_id"]))
        if cur.rowcount != 1:
            raise CounterDrift("a concurrency key's permit count would go negative")
        await cur.execute(
            "UPDATE pulse_permits SET released_at = %s, release_reason = %s"
            " WHERE namespace_id = %s AND id = %s AND released_at IS NULL",
            (to_db(now), endings[row["attempt_id"]], namespace_id, row["id"]))
        if cur.rowcount != 1:
            raise CounterDrift("a permit was released twice")
    return len(held)

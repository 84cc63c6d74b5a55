"""The invariant checker: plain SQL over the real pulse tables (DESIGN §5 and §9).

Run it after any test that drives tasks (fault tests at quiescence, the lease model after every
step). It reads; it never writes.

Usage
    check(conn, namespace_ids=None, *, quiescent=False, grace=..., ...)  -> list[str]
        A blocking PyMySQL connection with no transaction open. The probes run in one
        REPEATABLE READ, read-only snapshot (``START TRANSACTION WITH CONSISTENT SNAPSHOT``), so
        a workload still committing around the check cannot produce a torn view.
    await check_db(db, ...)       the same through the transaction runner (REPEATABLE READ).
    await check_cursor(cur, ...)  the probes on a cursor whose transaction the caller owns.

Every violation is one line that starts with its invariant code in brackets, e.g.
``[live_attempts] task 0123…/4567… has 2 unfinished attempts (OFFERED, RUNNING)``; an empty list
means every invariant holds. ``namespace_ids`` limits the check to some tenants (tests share one
database); ``None`` checks everything.

Invariants (code: what must hold)
    live_attempts         at most one unfinished attempt (OFFERED/RUNNING) per task
    generations           a task's attempt generations are unique and exactly 1..attempts_used
    orphan_attempt        every attempt belongs to an existing task
    current_attempt       a LEASED/RUNNING task's current attempt exists, is its own, agrees in
                          state (LEASED↔OFFERED, RUNNING↔RUNNING) and in lease expiry
    stray_live_attempt    an unfinished attempt is its task's current attempt (so a task in any
                          other state has no live attempt)
    idle_task_lease       a task that is not LEASED/RUNNING names no attempt and no lease
    completed_at          terminal ⇔ completed_at is set
    outcome_event         a terminal or NEEDS_REVIEW task has exactly one state event into that
                          state (its outcome event)
    result_event          … and exactly one result event in that state for its final revision
    result_event_mismatch every result event is the twin of a state event (same id, task,
                          revision, state), its task is in an outcome state, one per (task, state)
    result_sequence       each namespace's result sequences are gap-free 1..n, and the stream's
                          next_sequence is n + 1
    queue_counter         pulse_queues.active_attempts equals a recount of unfinished attempts
    queue_unfinished      pulse_queues.unfinished_tasks equals a recount of its tasks in WAITING,
                          LEASED, RUNNING or NEEDS_REVIEW
    application_counter   every application has its orbit_application_resources row; when it
                          has a count limit (its counters are kept), unfinished_tasks,
                          active_attempts (OFFERED/RUNNING) and reserved_attempts (OFFERED)
                          equal recounts over all its namespaces
    start_window          a current start window (start_window_until in the future, database
                          time) ends at most 1 s from now and has not approved more starts than
                          max_starts_per_second (queues and applications). Caveat: a limit
                          lowered inside a current window may leave it above the new limit for
                          the rest of that second; no test lowers a limit and checks within it
    key_row               a task with a concurrency key has its key's pulse_concurrency_limits
                          row (found by digest) and the row holds the same exact bytes
    attempt_token         an attempt carries a concurrency_token exactly when its task has a key
    permit_count          a key row's held_permits equals the count of its unreleased permits
    permit_held           at most one unreleased (valid) permit per key
    permit_holder         every permit names an existing attempt of its task with the same token,
                          on the task's own key row; a valid permit's attempt is OFFERED/RUNNING
                          and its task's current attempt; a released permit's attempt is
                          finished and the release reason is that attempt's final state
    permit_missing        every OFFERED/RUNNING attempt with a token holds exactly one valid
                          permit, with that token, on its task's key row
    permit_tokens         per key, in grant order (acquired_at, tie: token), each token is at
                          least 2 above the previous one (its release came in between), the
                          previous permit was released no later than the next was acquired (no
                          two holders at one instant), only the last permit may still be
                          valid, and no token exceeds the key row's revision
    permit_revision       a key row's revision == grants + releases, i.e. the count of its
                          permits plus the count of released ones, counted from the revision
                          before its first grant (0 unless a test started the key near the
                          token bound: first token - 1)
    uncertain_final       effect_uncertain is never set on SUCCEEDED/FAILED/CANCELLED
    uncertainty_dropped   a task one of whose attempts ended with an unknown effect (UNKNOWN,
                          LEASE_EXPIRED) still carries the flag unless a success or a human
                          review resolved it
    success_overwritten   a task with a SUCCEEDED attempt is SUCCEEDED, with only one such attempt
    transition            every task state event's (from, to) is in TASK_TRANSITIONS ∪
                          UNCERTAIN_TRANSITIONS, a creation (NULL → WAITING) or a same-state event
                          of an unfinished state (e.g. task.cancel_requested)
    event_revisions       a task's state events have unique revisions, ordered in time; the latest
                          is the task's revision and they are contiguous (every change is evented;
                          from 1 when the task has its creation event, which must then be at 1);
                          with ``require_creation_events`` every task must have one
    start_budget          the retry budget counts approved starts: a task's starts_used equals the
                          count of its attempts that started (started_at set), and never
                          exceeds max_attempts
    session_binding       a live attempt's recorded session is a session of the attempt's own
                          worker instance (the execution identity; adoption stays in-instance)
    stuck                 (``quiescent=True`` only) no LEASED/RUNNING task whose lease lapsed,
                          and no WAITING task past its deadline, longer than ``grace`` ago
    missing_task          every ``(namespace_id, task_id)`` in ``expected_tasks`` exists
    one_run_per_instant   at most one run (a FIRED or MERGED occurrence, any source) per
                          (schedule, fire_at); SKIPPED rows do not count (read from ``outcome``,
                          not from the generated column the unique key uses)
    task_owner            a task owned by a schedule (owner_kind SCHEDULE) is referenced by a
                          ledger row of that schedule, and a task a ledger row references is
                          owned by that row's schedule
    subscription_backlog  a subscription's backlog equals a recount of its PENDING and LEASED
                          deliveries
    delivery_unique       one delivery per (subscription, result event) (the unique key says
                          so; the probe counts anyway)
    delivery_source       a delivery belongs to an existing subscription of its namespace and
                          names an existing result event with the same sequence, task and task
                          revision, within the subscription's scanned range
    delivery_lease        a LEASED delivery has its lease fields (expiry, token digest) set and
                          attempts_used within its budget; any other state has no lease expiry,
                          a PENDING one no token digest
    delivery_attempts     a delivery's attempt log has exactly one row per ended attempt:
                          attempts_used rows, one fewer while LEASED, numbered 1..n
    scan_position         a subscription's scan position never passes its namespace stream's
                          committed next_sequence - 1 (0 without a stream)
    delivery_stuck        (``quiescent=True`` only) no LEASED delivery whose lease lapsed
                          longer than ``grace`` ago
    live_activation       (Weave) a step has at most one LIVE activation, and its
                          live_activation_id names exactly that activation (NULL when none);
                          its activation sequences are 1..activation_count
    workflow_inbox        every result event of a task a workflow owns has its weave_inbox row
                          (same source event, task, revision and state), and every inbox row
                          has that result event
    instance_state        an instance has exactly one $root step and its own WORKFLOW gate;
                          a finished instance (SUCCEEDED, FAILED, CANCELLED) has no LIVE
                          activation, no RUNNING or WAITING step and no unfinished pending
                          advance
    inbox_outcome         (Weave engine) a CONSUMED inbox row has an outcome and no other row
                          has one; a row consumed as ``advanced`` or ``duplicate`` names an
                          activation whose result_event_id is the row's source event (or, a
                          POLL round's result, the activation of its decided round)
    wait_winner           (Weave signals) a SIGNALLED wait's winner is a CONSUMED signal of its
                          instance naming that wait; no two CONSUMED signals name one wait; a
                          CONSUMED signal is the winner of the SIGNALLED wait it names
    poll_rounds           (Weave POLL) a query's rounds number 1..used_rounds without gaps and
                          never more than its max_rounds plus the rounds granted by a continue
                          (a round continued in a new activation counts once); every WAITING
                          query has its POLL pending advance (PENDING or LEASED, for the
                          query's activation)
    pause_control         (Weave pause) a RUNNING instance's gate is PAUSED exactly when it is
                          paused; a paused instance has its PENDING RESUME row, due never; its
                          ``checkpoints`` equals its parked rows (inbox rows consumed as
                          ``paused``, PENDING pending advances with ``parked_due_at``); a
                          resumed instance that still counts some has a RESUME row due to
                          replay them
    stop_intent           (Weave stop) stop_kind and stop_requested_at are set together, a
                          user's cancel_requested_at only with them; an instance with a stop
                          intent has its gate STOPPED; a STOPPING one has an intent; one that
                          ended by a stop ended as its kind says (CANCEL: CANCELLED, FAILURE:
                          FAILED) and keeps no LIVE activation; a CANCELLED instance was
                          cancelled; no step was created after its instance's stop intent
    wait_pending_advance  (Weave waits) every WAITING TIMER step has a WAITING wait and a
                          PENDING/LEASED TIMER pending advance for its LIVE activation; every
                          WAITING SIGNAL wait with a deadline has its SIGNAL pending advance
    step_hold             (Weave recovery) ``held_at`` and ``held_error`` are set together; a
                          held step is WAITING with a LIVE activation; a SUPERSEDED activation
                          has a successor (a newer activation of its step)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from orbit_common.pulse.model import (
    TASK_TRANSITIONS,
    TERMINAL_TASK_STATES,
    UNCERTAIN_TRANSITIONS,
    TaskState,
)

LIVE = "('OFFERED', 'RUNNING')"
UNFINISHED = "('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW')"
TERMINAL = "('SUCCEEDED', 'FAILED', 'CANCELLED')"
OUTCOMES = "('SUCCEEDED', 'FAILED', 'CANCELLED', 'NEEDS_REVIEW')"
DEFAULT_GRACE = dt.timedelta(seconds=30)

ALLOWED_TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    (a.value, b.value) for a, b in TASK_TRANSITIONS | UNCERTAIN_TRANSITIONS
)
UNFINISHED_STATES = frozenset(s.value for s in TaskState if s not in TERMINAL_TASK_STATES)

CODES = (
    "live_attempts", "generations", "orphan_attempt", "current_attempt", "stray_live_attempt",
    "idle_task_lease", "completed_at", "outcome_event", "result_event", "result_event_mismatch",
    "result_sequence", "queue_counter", "uncertain_final", "uncertainty_dropped",
    "success_overwritten", "transition", "event_revisions", "stuck", "missing_task",
    "queue_unfinished", "application_counter", "start_window", "key_row", "attempt_token",
    "permit_count", "permit_held", "permit_holder", "permit_missing", "permit_tokens",
    "permit_revision", "start_budget", "session_binding", "one_run_per_instant", "task_owner",
    "subscription_backlog", "delivery_unique", "delivery_source", "delivery_lease",
    "delivery_attempts", "scan_position", "delivery_stuck", "live_activation",
    "workflow_inbox", "instance_state", "inbox_outcome", "wait_pending_advance", "wait_winner",
    "poll_rounds", "pause_control", "step_hold", "stop_intent",
)


@attrs.frozen(kw_only=True)
class Scope:
    """What one check looks at; renders the namespace filter for a table alias."""

    namespace_ids: tuple[bytes, ...] | None
    quiescent: bool
    grace: dt.timedelta
    require_creation_events: bool
    expected: tuple[tuple[bytes, bytes], ...]

    def ns(self, alias: str) -> str:
        """``AND alias.namespace_id IN (…)`` (hex literals of our own ids), or nothing."""
        if self.namespace_ids is None:
            return ""
        if not self.namespace_ids:
            return " AND FALSE"
        ids = ", ".join(f"X'{ns.hex()}'" for ns in self.namespace_ids)
        return f" AND {alias}.namespace_id IN ({ids})"

    def apps(self, column: str) -> str:
        """``AND column IN (the applications owning the scoped namespaces)``, or nothing.

        Application counters span every namespace of the application, so a scoped check
        recounts all of them, not only the scoped ones."""
        if self.namespace_ids is None:
            return ""
        if not self.namespace_ids:
            return " AND FALSE"
        ids = ", ".join(f"X'{ns.hex()}'" for ns in self.namespace_ids)
        return (f" AND {column} IN (SELECT sn.application_id FROM orbit_namespaces sn"
                f" WHERE sn.id IN ({ids}))")

    @property
    def grace_us(self) -> int:
        return int(self.grace / dt.timedelta(microseconds=1))


def _h(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return str(value)


def _task(row: dict[str, Any], ns: str = "namespace_id", task: str = "task_id") -> str:
    return f"task {_h(row[ns])}/{_h(row[task])}"


@attrs.frozen
class Probe:
    code: str
    sql: Callable[[Scope], str]
    render: Callable[[dict[str, Any], Scope], str | None]
    when: Callable[[Scope], bool] = lambda _scope: True


# --- attempts --------------------------------------------------------------------------------

def _live_attempts_sql(s: Scope) -> str:
    return f"""
SELECT a.namespace_id, a.task_id, COUNT(*) AS n,
       GROUP_CONCAT(CONCAT('g', a.generation, ':', a.state) ORDER BY a.generation) AS which
FROM pulse_attempts a
WHERE a.state IN {LIVE}{s.ns('a')}
GROUP BY a.namespace_id, a.task_id
HAVING COUNT(*) > 1"""


def _generations_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.attempts_used, g.n, g.d, g.lo, g.hi
FROM pulse_tasks t
LEFT JOIN (
  SELECT a.namespace_id, a.task_id, COUNT(*) AS n, COUNT(DISTINCT a.generation) AS d,
         MIN(a.generation) AS lo, MAX(a.generation) AS hi
  FROM pulse_attempts a WHERE TRUE{s.ns('a')}
  GROUP BY a.namespace_id, a.task_id
) g ON g.namespace_id = t.namespace_id AND g.task_id = t.id
WHERE NOT (COALESCE(g.n, 0) = t.attempts_used AND COALESCE(g.d, 0) = t.attempts_used
           AND (t.attempts_used = 0 OR (g.lo = 1 AND g.hi = t.attempts_used))){s.ns('t')}"""


def _generations_render(row: dict[str, Any], _s: Scope) -> str:
    return (f"{_task(row)}: attempts_used={row['attempts_used']} but its attempts have"
            f" {row['n'] or 0} rows, {row['d'] or 0} distinct generations,"
            f" from {_h(row['lo'])} to {_h(row['hi'])} (expected exactly 1..attempts_used)")


def _orphan_sql(s: Scope) -> str:
    return f"""
SELECT a.namespace_id, a.id AS attempt_id, a.task_id, a.state
FROM pulse_attempts a
LEFT JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE t.id IS NULL{s.ns('a')}"""


def _current_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, t.current_attempt_id,
       t.lease_expires_at AS task_lease, a.id AS attempt_id, a.task_id AS attempt_task,
       a.state AS attempt_state, a.lease_expires_at AS attempt_lease
FROM pulse_tasks t
LEFT JOIN pulse_attempts a ON a.namespace_id = t.namespace_id AND a.id = t.current_attempt_id
WHERE t.state IN ('LEASED', 'RUNNING')
  AND NOT (a.id IS NOT NULL AND a.task_id = t.id
           AND a.state = CASE t.state WHEN 'LEASED' THEN 'OFFERED' ELSE 'RUNNING' END
           AND a.lease_expires_at <=> t.lease_expires_at){s.ns('t')}"""


def _current_render(row: dict[str, Any], _s: Scope) -> str:
    head = f"{_task(row)} is {row['state']}"
    if row["current_attempt_id"] is None:
        return f"{head} without a current attempt"
    if row["attempt_id"] is None:
        return f"{head} but its current attempt {_h(row['current_attempt_id'])} does not exist"
    if row["attempt_task"] != row["task_id"]:
        return (f"{head} but its current attempt {_h(row['attempt_id'])} belongs to task"
                f" {_h(row['attempt_task'])}")
    expected = "OFFERED" if row["state"] == "LEASED" else "RUNNING"
    if row["attempt_state"] != expected:
        return (f"{head} but its current attempt {_h(row['attempt_id'])} is"
                f" {row['attempt_state']} (expected {expected})")
    return (f"{head}: lease expiry {_h(row['task_lease'])} differs from its attempt's"
            f" {_h(row['attempt_lease'])}")


def _stray_sql(s: Scope) -> str:
    return f"""
SELECT a.namespace_id, a.id AS attempt_id, a.task_id, a.state, a.generation,
       t.state AS task_state, t.current_attempt_id
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE a.state IN {LIVE}
  AND (t.current_attempt_id IS NULL OR t.current_attempt_id <> a.id
       OR t.state NOT IN ('LEASED', 'RUNNING')){s.ns('a')}"""


def _stray_render(row: dict[str, Any], _s: Scope) -> str:
    return (f"{_task(row)} ({row['task_state']}, current attempt"
            f" {_h(row['current_attempt_id'])}) has another live attempt"
            f" {_h(row['attempt_id'])} (generation {row['generation']}, {row['state']})")


def _idle_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, t.current_attempt_id, t.lease_expires_at
FROM pulse_tasks t
WHERE t.state NOT IN ('LEASED', 'RUNNING')
  AND (t.current_attempt_id IS NOT NULL OR t.lease_expires_at IS NOT NULL){s.ns('t')}"""


# --- outcomes --------------------------------------------------------------------------------

def _completed_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, t.completed_at
FROM pulse_tasks t
WHERE (t.state IN {TERMINAL}) <> (t.completed_at IS NOT NULL){s.ns('t')}"""


def _completed_render(row: dict[str, Any], _s: Scope) -> str:
    if row["completed_at"] is None:
        return f"{_task(row)} is {row['state']} (terminal) without completed_at"
    return f"{_task(row)} is {row['state']} (not terminal) with completed_at {row['completed_at']}"


def _outcome_event_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, COUNT(e.id) AS n
FROM pulse_tasks t
LEFT JOIN orbit_events e ON e.namespace_id = t.namespace_id AND e.aggregate_type = 'task'
  AND e.aggregate_id = t.id AND e.to_state = t.state
WHERE t.state IN {OUTCOMES}{s.ns('t')}
GROUP BY t.namespace_id, t.id, t.state
HAVING COUNT(e.id) <> 1"""


def _result_event_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, t.revision, COUNT(r.id) AS n
FROM pulse_tasks t
LEFT JOIN orbit_result_events r ON r.namespace_id = t.namespace_id AND r.task_id = t.id
  AND r.task_revision = t.revision AND r.state = t.state
WHERE t.state IN {OUTCOMES}{s.ns('t')}
GROUP BY t.namespace_id, t.id, t.state, t.revision
HAVING COUNT(r.id) <> 1"""


def _result_mismatch_sql(s: Scope) -> str:
    return f"""
SELECT r.namespace_id, r.id AS result_id, r.task_id, r.sequence, r.state, r.task_revision,
       e.id AS event_id, e.aggregate_type, e.aggregate_id, e.aggregate_revision, e.to_state,
       t.id AS found_task, t.state AS task_state,
       (SELECT COUNT(*) FROM orbit_result_events r2 WHERE r2.namespace_id = r.namespace_id
          AND r2.task_id = r.task_id AND r2.state = r.state) AS same_state
FROM orbit_result_events r
LEFT JOIN orbit_events e ON e.namespace_id = r.namespace_id AND e.id = r.id
LEFT JOIN pulse_tasks t ON t.namespace_id = r.namespace_id AND t.id = r.task_id
WHERE (NOT (e.id IS NOT NULL AND e.aggregate_type = 'task' AND e.aggregate_id = r.task_id
            AND e.aggregate_revision = r.task_revision AND e.to_state <=> r.state
            AND t.id IS NOT NULL AND t.state IN {OUTCOMES})
       OR (SELECT COUNT(*) FROM orbit_result_events r3 WHERE r3.namespace_id = r.namespace_id
             AND r3.task_id = r.task_id AND r3.state = r.state) > 1){s.ns('r')}"""


def _result_mismatch_render(row: dict[str, Any], _s: Scope) -> str:
    head = f"result event #{row['sequence']} ({row['state']}, revision {row['task_revision']}) of"
    head += f" {_task(row)}"
    if row["event_id"] is None:
        return f"{head} has no state event with its id"
    if (row["aggregate_type"] != "task" or row["aggregate_id"] != row["task_id"]
            or row["aggregate_revision"] != row["task_revision"]
            or row["to_state"] != row["state"]):
        return (f"{head} differs from its state event ({row['aggregate_type']}"
                f" {_h(row['aggregate_id'])} revision {row['aggregate_revision']}"
                f" → {row['to_state']})")
    if row["found_task"] is None:
        return f"{head}: the task does not exist"
    if row["same_state"] > 1:
        return f"{head} is one of {row['same_state']} result events in state {row['state']}"
    return f"{head}: the task is {row['task_state']}, not an outcome state"


def _sequence_sql(s: Scope) -> str:
    return f"""
SELECT g.namespace_id, g.n, g.d, g.lo, g.hi, st.next_sequence
FROM (
  SELECT r.namespace_id, COUNT(*) AS n, COUNT(DISTINCT r.sequence) AS d,
         MIN(r.sequence) AS lo, MAX(r.sequence) AS hi
  FROM orbit_result_events r WHERE TRUE{s.ns('r')}
  GROUP BY r.namespace_id
) g
LEFT JOIN orbit_event_streams st ON st.namespace_id = g.namespace_id
WHERE NOT (g.n = g.d AND g.lo = 1 AND g.hi = g.n AND st.next_sequence <=> g.n + 1)
UNION ALL
SELECT st.namespace_id, 0, 0, NULL, NULL, st.next_sequence
FROM orbit_event_streams st
WHERE st.next_sequence <> 1 AND NOT EXISTS (
  SELECT 1 FROM orbit_result_events r WHERE r.namespace_id = st.namespace_id){s.ns('st')}"""


def _sequence_render(row: dict[str, Any], _s: Scope) -> str:
    return (f"namespace {_h(row['namespace_id'])}: {row['n']} result events with"
            f" {row['d']} distinct sequences from {_h(row['lo'])} to {_h(row['hi'])}, stream"
            f" next_sequence {_h(row['next_sequence'])} (expected 1..n gap-free, next n + 1)")


def _queue_counter_sql(s: Scope) -> str:
    return f"""
SELECT q.namespace_id, q.id AS queue_id, q.name, q.active_attempts, COALESCE(c.n, 0) AS live
FROM pulse_queues q
LEFT JOIN (
  SELECT a.namespace_id, a.queue_id, COUNT(*) AS n FROM pulse_attempts a
  WHERE a.state IN {LIVE}{s.ns('a')} GROUP BY a.namespace_id, a.queue_id
) c ON c.namespace_id = q.namespace_id AND c.queue_id = q.id
WHERE q.active_attempts <> COALESCE(c.n, 0){s.ns('q')}"""


def _uncertain_final_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state FROM pulse_tasks t
WHERE t.effect_uncertain <> 0 AND t.state IN {TERMINAL}{s.ns('t')}"""


def _uncertainty_dropped_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, t.outcome_reason,
       GROUP_CONCAT(CONCAT('g', a.generation, ':', a.state) ORDER BY a.generation) AS which
FROM pulse_tasks t
JOIN pulse_attempts a ON a.namespace_id = t.namespace_id AND a.task_id = t.id
  AND a.state IN ('UNKNOWN', 'LEASE_EXPIRED')
WHERE t.effect_uncertain = 0 AND t.state <> 'SUCCEEDED'
  AND NOT (t.state = 'FAILED' AND t.outcome_reason = 'reviewed_failed'){s.ns('t')}
GROUP BY t.namespace_id, t.id, t.state, t.outcome_reason"""


def _success_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, COUNT(*) AS n,
       GROUP_CONCAT(a.generation ORDER BY a.generation) AS generations
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE a.state = 'SUCCEEDED'{s.ns('a')}
GROUP BY t.namespace_id, t.id, t.state
HAVING t.state <> 'SUCCEEDED' OR COUNT(*) > 1"""


# --- flow control: counters, start windows, concurrency keys and permits ---------------------

def _queue_unfinished_sql(s: Scope) -> str:
    return f"""
SELECT q.namespace_id, q.id AS queue_id, q.name, q.unfinished_tasks, COALESCE(c.n, 0) AS found
FROM pulse_queues q
LEFT JOIN (
  SELECT t.namespace_id, t.queue_id, COUNT(*) AS n FROM pulse_tasks t
  WHERE t.state IN {UNFINISHED}{s.ns('t')} GROUP BY t.namespace_id, t.queue_id
) c ON c.namespace_id = q.namespace_id AND c.queue_id = q.id
WHERE q.unfinished_tasks <> COALESCE(c.n, 0){s.ns('q')}"""


def _application_counter_sql(s: Scope) -> str:
    return f"""
SELECT a.id AS application_id, a.name, r.application_id AS resource_row,
       r.unfinished_tasks, r.active_attempts, r.reserved_attempts,
       COALESCE(u.n, 0) AS unfinished, COALESCE(x.active, 0) AS active,
       COALESCE(x.reserved, 0) AS reserved
FROM orbit_applications a
LEFT JOIN orbit_application_resources r ON r.application_id = a.id
LEFT JOIN (
  SELECT n.application_id, COUNT(*) AS n
  FROM orbit_namespaces n JOIN pulse_tasks t ON t.namespace_id = n.id
  WHERE t.state IN {UNFINISHED}{s.apps('n.application_id')}
  GROUP BY n.application_id
) u ON u.application_id = a.id
LEFT JOIN (
  SELECT n.application_id, COUNT(*) AS active, SUM(x.state = 'OFFERED') AS reserved
  FROM orbit_namespaces n JOIN pulse_attempts x ON x.namespace_id = n.id
  WHERE x.state IN {LIVE}{s.apps('n.application_id')}
  GROUP BY n.application_id
) x ON x.application_id = a.id
WHERE (r.application_id IS NULL
       OR ((r.max_unfinished_tasks IS NOT NULL OR r.max_active_attempts IS NOT NULL
            OR r.max_reserved_attempts IS NOT NULL)
           AND (r.unfinished_tasks <> COALESCE(u.n, 0)
                OR r.active_attempts <> COALESCE(x.active, 0)
                OR r.reserved_attempts <> COALESCE(x.reserved, 0)))){s.apps('a.id')}"""


def _application_counter_render(row: dict[str, Any], _s: Scope) -> str:
    head = f"application {_h(row['application_id'])} ({row['name']})"
    if row["resource_row"] is None:
        return f"{head} has no orbit_application_resources row"
    return (f"{head} counts unfinished/active/reserved {row['unfinished_tasks']}/"
            f"{row['active_attempts']}/{row['reserved_attempts']}, a recount over its"
            f" namespaces finds {row['unfinished']}/{row['active']}/{row['reserved']}")


def _start_window_sql(s: Scope) -> str:
    current = "{t}.start_window_until > UTC_TIMESTAMP(6)"
    bad = ("({t}.start_window_until > UTC_TIMESTAMP(6) + INTERVAL 1 SECOND"
           " OR ({t}.max_starts_per_second IS NOT NULL"
           " AND {t}.starts_in_window > {t}.max_starts_per_second))")
    return f"""
SELECT 'queue' AS kind, q.namespace_id AS owner, q.name, q.max_starts_per_second AS lim,
       q.starts_in_window AS used, q.start_window_until AS until, UTC_TIMESTAMP(6) AS now
FROM pulse_queues q
WHERE {current.format(t='q')} AND {bad.format(t='q')}{s.ns('q')}
UNION ALL
SELECT 'application', r.application_id, NULL, r.max_starts_per_second, r.starts_in_window,
       r.start_window_until, UTC_TIMESTAMP(6)
FROM orbit_application_resources r
WHERE {current.format(t='r')} AND {bad.format(t='r')}{s.apps('r.application_id')}"""


def _start_window_render(row: dict[str, Any], _s: Scope) -> str:
    owner = (f"queue {_h(row['owner'])}/{row['name']}" if row["kind"] == "queue"
             else f"application {_h(row['owner'])}")
    return (f"{owner}: the start window until {row['until']} (now {row['now']}) holds"
            f" {row['used']} starts, limit {_h(row['lim'])} (a window lasts at most 1 s and"
            f" never holds more than its limit)")


def _key_row_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.concurrency_key, l.id AS limit_id, l.scope_key
FROM pulse_tasks t
LEFT JOIN pulse_concurrency_limits l ON l.namespace_id = t.namespace_id
  AND l.key_digest = t.concurrency_key_digest
WHERE t.concurrency_key_digest IS NOT NULL
  AND (l.id IS NULL OR l.scope_key <> t.concurrency_key){s.ns('t')}"""


def _key_row_render(row: dict[str, Any], _s: Scope) -> str:
    head = f"{_task(row)} with concurrency key {row['concurrency_key']!r}"
    if row["limit_id"] is None:
        return f"{head} has no key row"
    return f"{head}: its key row {_h(row['limit_id'])} holds {row['scope_key']!r}"


def _attempt_token_sql(s: Scope) -> str:
    return f"""
SELECT a.namespace_id, a.task_id, a.id AS attempt_id, a.generation, a.state,
       a.concurrency_token, t.concurrency_key
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE (a.concurrency_token IS NULL) <> (t.concurrency_key_digest IS NULL){s.ns('a')}"""


def _attempt_token_render(row: dict[str, Any], _s: Scope) -> str:
    which = f"attempt {_h(row['attempt_id'])} (generation {row['generation']}, {row['state']})"
    if row["concurrency_token"] is None:
        return (f"{_task(row)} has concurrency key {row['concurrency_key']!r} but its {which}"
                f" has no token")
    return (f"{_task(row)} has no concurrency key but its {which} carries token"
            f" {row['concurrency_token']}")


def _permit_count_sql(s: Scope) -> str:
    return f"""
SELECT l.namespace_id, l.id AS limit_id, l.scope_key, l.held_permits, COALESCE(c.n, 0) AS held
FROM pulse_concurrency_limits l
LEFT JOIN (
  SELECT p.namespace_id, p.limit_id, COUNT(*) AS n FROM pulse_permits p
  WHERE p.released_at IS NULL{s.ns('p')} GROUP BY p.namespace_id, p.limit_id
) c ON c.namespace_id = l.namespace_id AND c.limit_id = l.id
WHERE l.held_permits <> COALESCE(c.n, 0){s.ns('l')}"""


def _key(row: dict[str, Any]) -> str:
    return f"key {_h(row['namespace_id'])}/{row['scope_key']!r}"


def _permit_held_sql(s: Scope) -> str:
    return f"""
SELECT p.namespace_id, p.limit_id, l.scope_key, COUNT(*) AS n,
       GROUP_CONCAT(p.token ORDER BY p.token) AS tokens
FROM pulse_permits p
LEFT JOIN pulse_concurrency_limits l ON l.namespace_id = p.namespace_id AND l.id = p.limit_id
WHERE p.released_at IS NULL{s.ns('p')}
GROUP BY p.namespace_id, p.limit_id, l.scope_key
HAVING COUNT(*) > 1"""


def _permit_holder_sql(s: Scope) -> str:
    return f"""
SELECT p.namespace_id, p.id AS permit_id, p.task_id, p.attempt_id, p.token, p.released_at,
       p.release_reason, a.id AS found_attempt, a.task_id AS attempt_task,
       a.state AS attempt_state, a.concurrency_token, t.id AS found_task, t.current_attempt_id,
       t.concurrency_key_digest AS task_digest, l.id AS found_key, l.key_digest, l.scope_key
FROM pulse_permits p
LEFT JOIN pulse_attempts a ON a.namespace_id = p.namespace_id AND a.id = p.attempt_id
LEFT JOIN pulse_tasks t ON t.namespace_id = p.namespace_id AND t.id = p.task_id
LEFT JOIN pulse_concurrency_limits l ON l.namespace_id = p.namespace_id AND l.id = p.limit_id
WHERE NOT (a.id IS NOT NULL AND a.task_id = p.task_id AND a.concurrency_token <=> p.token
           AND t.id IS NOT NULL AND l.id IS NOT NULL AND l.key_digest <=> t.concurrency_key_digest
           AND CASE WHEN p.released_at IS NULL
                    THEN a.state IN {LIVE} AND t.current_attempt_id <=> a.id
                    ELSE a.state NOT IN {LIVE} AND p.release_reason <=> a.state END){s.ns('p')}"""


def _permit_holder_render(row: dict[str, Any], _s: Scope) -> str:
    valid = row["released_at"] is None
    head = (f"{'valid' if valid else 'released'} permit {_h(row['permit_id'])} (token"
            f" {row['token']}) of {_task(row)}")
    if row["found_attempt"] is None:
        return f"{head} names missing attempt {_h(row['attempt_id'])}"
    if row["attempt_task"] != row["task_id"]:
        return f"{head}: its attempt belongs to task {_h(row['attempt_task'])}"
    if row["concurrency_token"] != row["token"]:
        return f"{head}: its attempt carries token {_h(row['concurrency_token'])}"
    if row["found_task"] is None:
        return f"{head}: the task does not exist"
    if row["found_key"] is None or row["key_digest"] != row["task_digest"]:
        return f"{head} is on key row {_h(row['found_key'])}, not its task's key"
    if valid:
        return (f"{head}: its attempt {_h(row['attempt_id'])} is {row['attempt_state']} and"
                f" the task's current attempt is {_h(row['current_attempt_id'])}")
    return (f"{head}: released as {_h(row['release_reason'])} but its attempt is"
            f" {row['attempt_state']}")


def _permit_missing_sql(s: Scope) -> str:
    return f"""
SELECT a.namespace_id, a.task_id, a.id AS attempt_id, a.state, a.concurrency_token,
       COUNT(p.id) AS n
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
LEFT JOIN pulse_concurrency_limits l ON l.namespace_id = t.namespace_id
  AND l.key_digest = t.concurrency_key_digest
LEFT JOIN pulse_permits p ON p.namespace_id = a.namespace_id AND p.attempt_id = a.id
  AND p.released_at IS NULL AND p.token = a.concurrency_token AND p.limit_id = l.id
WHERE a.state IN {LIVE} AND a.concurrency_token IS NOT NULL{s.ns('a')}
GROUP BY a.namespace_id, a.task_id, a.id, a.state, a.concurrency_token
HAVING COUNT(p.id) <> 1"""


def _permit_tokens_sql(s: Scope) -> str:
    # Token differences, never sums: tokens may sit next to 2**63 - 1.
    return f"""
SELECT x.namespace_id, x.scope_key, x.token, x.acquired_at, x.released_at, x.revision,
       x.prev_token, x.prev_released, x.next_token
FROM (
  SELECT p.namespace_id, l.scope_key, l.revision, p.token, p.acquired_at, p.released_at,
         LAG(p.token) OVER w AS prev_token, LAG(p.released_at) OVER w AS prev_released,
         LAG(p.id) OVER w AS prev_id, LEAD(p.token) OVER w AS next_token
  FROM pulse_permits p
  JOIN pulse_concurrency_limits l ON l.namespace_id = p.namespace_id AND l.id = p.limit_id
  WHERE TRUE{s.ns('p')}
  WINDOW w AS (PARTITION BY p.namespace_id, p.limit_id ORDER BY p.acquired_at, p.token)
) x
WHERE x.token > x.revision
   OR (x.prev_id IS NOT NULL AND (x.token - x.prev_token < 2 OR x.prev_released IS NULL
                                  OR x.prev_released > x.acquired_at))
   OR (x.released_at IS NULL AND x.next_token IS NOT NULL)"""


def _permit_tokens_render(row: dict[str, Any], _s: Scope) -> str:
    head = f"{_key(row)}: the permit with token {row['token']} (acquired {row['acquired_at']})"
    if row["token"] > row["revision"]:
        return f"{head} is above the key's revision {row['revision']}"
    if row["released_at"] is None and row["next_token"] is not None:
        return f"{head} is still valid though token {row['next_token']} was granted after it"
    return (f"{head} follows token {_h(row['prev_token'])} (released"
            f" {_h(row['prev_released'])}): tokens must rise by at least 2 in grant order and"
            f" the previous holder must have released first")


def _permit_revision_sql(s: Scope) -> str:
    return f"""
SELECT l.namespace_id, l.id AS limit_id, l.scope_key, l.revision, COALESCE(c.n, 0) AS permits,
       COALESCE(c.released, 0) AS released, c.lo
FROM pulse_concurrency_limits l
LEFT JOIN (
  SELECT p.namespace_id, p.limit_id, COUNT(*) AS n, COUNT(p.released_at) AS released,
         MIN(p.token) AS lo
  FROM pulse_permits p WHERE TRUE{s.ns('p')} GROUP BY p.namespace_id, p.limit_id
) c ON c.namespace_id = l.namespace_id AND c.limit_id = l.id
WHERE CAST(l.revision AS DECIMAL(25)) <> COALESCE(CAST(c.lo AS DECIMAL(25)) - 1, 0)
      + COALESCE(c.n, 0) + COALESCE(c.released, 0){s.ns('l')}"""


def _permit_revision_render(row: dict[str, Any], _s: Scope) -> str:
    base = 0 if row["lo"] is None else row["lo"] - 1
    return (f"{_key(row)} is at revision {row['revision']}, but {row['permits']} grants and"
            f" {row['released']} releases from revision {base} make"
            f" {base + row['permits'] + row['released']}")


# --- state events ----------------------------------------------------------------------------

def _transitions_sql(s: Scope) -> str:
    return f"""
SELECT e.from_state, e.to_state, COUNT(*) AS n,
       MIN(CONCAT(HEX(e.namespace_id), '/', HEX(e.aggregate_id), ' r', e.aggregate_revision,
                  ' ', e.event_type)) AS example
FROM orbit_events e
WHERE e.aggregate_type = 'task'{s.ns('e')}
GROUP BY e.from_state, e.to_state"""


def transition_allowed(from_state: str | None, to_state: str | None) -> bool:
    if from_state is None:
        return to_state in (None, TaskState.WAITING.value)  # creation, or no state at all
    if to_state is None:
        return False
    if from_state == to_state:
        return from_state in UNFINISHED_STATES
    return (from_state, to_state) in ALLOWED_TRANSITIONS


def _transitions_render(row: dict[str, Any], _s: Scope) -> str | None:
    if transition_allowed(row["from_state"], row["to_state"]):
        return None
    return (f"{row['n']} task state event(s) {_h(row['from_state'])} → {_h(row['to_state'])}"
            f" is not an allowed transition (e.g. {row['example'].lower()})")


def _event_dup_sql(s: Scope) -> str:
    return f"""
SELECT e.namespace_id, e.aggregate_id AS task_id, e.aggregate_revision, COUNT(*) AS n,
       GROUP_CONCAT(e.event_type) AS types
FROM orbit_events e
WHERE e.aggregate_type = 'task'{s.ns('e')}
GROUP BY e.namespace_id, e.aggregate_id, e.aggregate_revision
HAVING COUNT(*) > 1"""


def _event_order_sql(s: Scope) -> str:
    return f"""
SELECT x.namespace_id, x.task_id, x.aggregate_revision, x.occurred_at, x.prev_revision,
       x.prev_at
FROM (
  SELECT e.namespace_id, e.aggregate_id AS task_id, e.aggregate_revision, e.occurred_at,
         LAG(e.aggregate_revision) OVER w AS prev_revision, LAG(e.occurred_at) OVER w AS prev_at
  FROM orbit_events e
  WHERE e.aggregate_type = 'task'{s.ns('e')}
  WINDOW w AS (PARTITION BY e.namespace_id, e.aggregate_id
               ORDER BY e.aggregate_revision, e.occurred_at)
) x
WHERE x.occurred_at < x.prev_at"""


def _event_revisions_sql(s: Scope) -> str:
    creation = "1" if s.require_creation_events else "0"
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.revision, g.n, g.d, g.lo, g.hi, g.creations,
       g.creation_revision
FROM pulse_tasks t
LEFT JOIN (
  SELECT e.namespace_id, e.aggregate_id, COUNT(*) AS n,
         COUNT(DISTINCT e.aggregate_revision) AS d,
         MIN(e.aggregate_revision) AS lo, MAX(e.aggregate_revision) AS hi,
         SUM(e.from_state IS NULL AND e.to_state IS NOT NULL) AS creations,
         MIN(CASE WHEN e.from_state IS NULL AND e.to_state IS NOT NULL
                  THEN e.aggregate_revision END) AS creation_revision
  FROM orbit_events e
  WHERE e.aggregate_type = 'task'{s.ns('e')}
  GROUP BY e.namespace_id, e.aggregate_id
) g ON g.namespace_id = t.namespace_id AND g.aggregate_id = t.id
WHERE (CASE
  WHEN g.n IS NULL THEN t.revision > 1 OR {creation} = 1
  ELSE NOT (g.hi = t.revision AND g.d = g.hi - g.lo + 1
            AND (g.creations = 0 OR (g.creations = 1 AND g.creation_revision = 1 AND g.lo = 1))
            AND (g.creations = 1 OR {creation} = 0))
END){s.ns('t')}"""


def _event_revisions_render(row: dict[str, Any], s: Scope) -> str:
    head = f"{_task(row)} at revision {row['revision']}"
    if row["n"] is None:
        if row["revision"] > 1:
            return f"{head} has no state events (a change was not evented)"
        return f"{head} has no creation event"
    if row["creations"] != 1 and (row["creations"] or s.require_creation_events):
        return f"{head} has {row['creations']} creation events"
    return (f"{head} has state events for revisions {row['lo']}..{row['hi']}"
            f" ({row['d']} distinct; creation at {_h(row['creation_revision'])}): expected a"
            f" contiguous run ending at the task's revision")


# --- schedules -------------------------------------------------------------------------------

def _one_run_sql(s: Scope) -> str:
    return f"""
SELECT o.namespace_id, o.schedule_id, o.fire_at, COUNT(*) AS n,
       GROUP_CONCAT(CONCAT(o.source, ' ', o.outcome) ORDER BY o.source SEPARATOR ', ') AS runs
FROM pulse_schedule_occurrences o
WHERE o.outcome <> 'SKIPPED'{s.ns('o')}
GROUP BY o.namespace_id, o.schedule_id, o.fire_at
HAVING COUNT(*) > 1"""


def _one_run_render(row: dict[str, Any], _s: Scope) -> str:
    return (f"schedule {_h(row['namespace_id'])}/{_h(row['schedule_id'])} ran"
            f" {row['n']} times for {row['fire_at']} ({row['runs']})")


def _task_owner_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.owner_kind, t.owner_id, o.schedule_id
FROM pulse_tasks t
LEFT JOIN pulse_schedule_occurrences o ON o.namespace_id = t.namespace_id AND o.task_id = t.id
WHERE t.owner_kind = 'SCHEDULE' AND (o.id IS NULL OR o.schedule_id <> t.owner_id){s.ns('t')}
UNION ALL
SELECT t.namespace_id, t.id, t.owner_kind, t.owner_id, o.schedule_id
FROM pulse_schedule_occurrences o
JOIN pulse_tasks t ON t.namespace_id = o.namespace_id AND t.id = o.task_id
WHERE (t.owner_kind IS NULL OR t.owner_kind <> 'SCHEDULE'
       OR t.owner_id <> o.schedule_id){s.ns('o')}"""


def _task_owner_render(row: dict[str, Any], _s: Scope) -> str:
    ledger = ("no ledger row" if row["schedule_id"] is None
              else f"the ledger row of schedule {_h(row['schedule_id'])}")
    return (f"{_task(row)} is owned by {row['owner_kind'] or 'nobody'}"
            f" {_h(row['owner_id'])}, but {ledger} made it")


# --- subscriptions and deliveries (orbit_common/relay) ---------------------------------------

def _backlog_sql(s: Scope) -> str:
    return f"""
SELECT sb.namespace_id, sb.id AS subscription_id, sb.name, sb.backlog, COALESCE(c.n, 0) AS open
FROM orbit_subscriptions sb
LEFT JOIN (
  SELECT d.namespace_id, d.subscription_id, COUNT(*) AS n FROM orbit_deliveries d
  WHERE d.state IN ('PENDING', 'LEASED'){s.ns('d')} GROUP BY d.namespace_id, d.subscription_id
) c ON c.namespace_id = sb.namespace_id AND c.subscription_id = sb.id
WHERE sb.backlog <> COALESCE(c.n, 0){s.ns('sb')}"""


def _delivery_unique_sql(s: Scope) -> str:
    return f"""
SELECT d.namespace_id, d.subscription_id, d.event_id, COUNT(*) AS n FROM orbit_deliveries d
WHERE TRUE{s.ns('d')}
GROUP BY d.namespace_id, d.subscription_id, d.event_id HAVING COUNT(*) > 1"""


def _delivery_source_sql(s: Scope) -> str:
    return f"""
SELECT d.namespace_id, d.id AS delivery_id, d.event_id, d.sequence, sb.id AS subscription_id,
       r.id AS found_event, r.sequence AS event_sequence, sb.start_after_sequence,
       sb.scan_after_sequence
FROM orbit_deliveries d
LEFT JOIN orbit_subscriptions sb ON sb.namespace_id = d.namespace_id AND sb.id = d.subscription_id
LEFT JOIN orbit_result_events r ON r.namespace_id = d.namespace_id AND r.id = d.event_id
WHERE (sb.id IS NULL OR r.id IS NULL OR r.sequence <> d.sequence OR r.task_id <> d.task_id
       OR r.task_revision <> d.task_revision OR d.sequence <= sb.start_after_sequence
       OR d.sequence > sb.scan_after_sequence){s.ns('d')}"""


def _delivery_source_render(row: dict[str, Any], _s: Scope) -> str:
    head = f"delivery {_h(row['namespace_id'])}/{_h(row['delivery_id'])}"
    if row["subscription_id"] is None:
        return f"{head} belongs to no subscription"
    if row["found_event"] is None:
        return f"{head} names result event {_h(row['event_id'])}, which does not exist"
    return (f"{head} (sequence {row['sequence']}) does not agree with its result event"
            f" (sequence {row['event_sequence']}) or lies outside its subscription's scanned"
            f" range ({row['start_after_sequence']}, {row['scan_after_sequence']}]")


def _delivery_lease_sql(s: Scope) -> str:
    return f"""
SELECT d.namespace_id, d.id AS delivery_id, d.state, d.lease_expires_at,
       d.lease_token_digest IS NOT NULL AS has_token, d.attempts_used, d.max_attempts
FROM orbit_deliveries d
WHERE (CASE d.state
         WHEN 'LEASED' THEN d.lease_expires_at IS NULL OR d.lease_token_digest IS NULL
                            OR d.attempts_used < 1 OR d.attempts_used > d.max_attempts
         WHEN 'PENDING' THEN d.lease_expires_at IS NOT NULL OR d.lease_token_digest IS NOT NULL
         ELSE d.lease_expires_at IS NOT NULL END){s.ns('d')}"""


def _delivery_attempts_sql(s: Scope) -> str:
    return f"""
SELECT d.namespace_id, d.id AS delivery_id, d.state, d.attempts_used,
       COALESCE(g.n, 0) AS n, g.lo, g.hi
FROM orbit_deliveries d
LEFT JOIN (
  SELECT a.namespace_id, a.delivery_id, COUNT(*) AS n, MIN(a.attempt) AS lo,
         MAX(a.attempt) AS hi
  FROM orbit_delivery_attempts a WHERE TRUE{s.ns('a')} GROUP BY a.namespace_id, a.delivery_id
) g ON g.namespace_id = d.namespace_id AND g.delivery_id = d.id
WHERE NOT (COALESCE(g.n, 0) = d.attempts_used - (d.state = 'LEASED')
           AND (COALESCE(g.n, 0) = 0 OR (g.lo = 1 AND g.hi = g.n))){s.ns('d')}"""


def _scan_position_sql(s: Scope) -> str:
    return f"""
SELECT sb.namespace_id, sb.id AS subscription_id, sb.name, sb.scan_after_sequence,
       st.next_sequence
FROM orbit_subscriptions sb
LEFT JOIN orbit_event_streams st ON st.namespace_id = sb.namespace_id
WHERE sb.scan_after_sequence > COALESCE(st.next_sequence, 1) - 1{s.ns('sb')}"""


def _delivery_stuck_sql(s: Scope) -> str:
    return f"""
SELECT d.namespace_id, d.id AS delivery_id, d.lease_expires_at FROM orbit_deliveries d
WHERE d.state = 'LEASED'
  AND d.lease_expires_at < UTC_TIMESTAMP(6) - INTERVAL {s.grace_us} MICROSECOND{s.ns('d')}"""


def _delivery(row: dict[str, Any]) -> str:
    return f"delivery {_h(row['namespace_id'])}/{_h(row['delivery_id'])}"


# --- quiescence and acknowledged tasks -------------------------------------------------------

# --- workflows (orbit_common/weave) ------------------------------------------------------------

def _live_activation_sql(s: Scope) -> str:
    return f"""
SELECT st.namespace_id, st.instance_id, st.name, st.live_activation_id, st.activation_count,
  COUNT(a.id) AS n, SUM(a.state = 'LIVE') AS live,
  MAX(IF(a.state = 'LIVE', a.id, NULL)) AS live_id, MIN(a.sequence) AS lo, MAX(a.sequence) AS hi
FROM weave_steps st
LEFT JOIN weave_activations a ON a.namespace_id = st.namespace_id
  AND a.instance_id = st.instance_id AND a.step_id = st.id
WHERE TRUE{s.ns('st')}
GROUP BY st.namespace_id, st.instance_id, st.id, st.name, st.live_activation_id,
  st.activation_count
HAVING COALESCE(SUM(a.state = 'LIVE'), 0) > 1
  OR NOT (st.live_activation_id <=> MAX(IF(a.state = 'LIVE', a.id, NULL)))
  OR COUNT(a.id) <> st.activation_count
  OR (COUNT(a.id) > 0 AND (MIN(a.sequence) <> 1 OR MAX(a.sequence) <> COUNT(a.id)))"""


def _live_activation_render(row: dict[str, Any], _s: Scope) -> str:
    return (f"step {_h(row['namespace_id'])}/{_h(row['instance_id'])}/{row['name']} names live"
            f" activation {_h(row['live_activation_id'])} and counts {row['activation_count']}"
            f" activations; it has {row['n']} (sequences {_h(row['lo'])}..{_h(row['hi'])}),"
            f" {_h(row['live'])} LIVE ({_h(row['live_id'])})")


def _workflow_inbox_sql(s: Scope) -> str:
    return f"""
SELECT r.namespace_id, r.task_id, r.id AS event_id, r.state, 'no inbox row' AS problem
FROM orbit_result_events r
JOIN pulse_tasks t ON t.namespace_id = r.namespace_id AND t.id = r.task_id
LEFT JOIN weave_inbox i ON i.namespace_id = r.namespace_id AND i.source_event_id = r.id
WHERE t.owner_kind = 'WORKFLOW' AND i.id IS NULL{s.ns('r')}
UNION ALL
SELECT i.namespace_id, i.task_id, i.source_event_id, i.task_state,
  'an inbox row without its result event'
FROM weave_inbox i
LEFT JOIN orbit_result_events r ON r.namespace_id = i.namespace_id
  AND r.id = i.source_event_id AND r.task_id = i.task_id
  AND r.task_revision = i.task_revision AND r.state = i.task_state
WHERE r.id IS NULL{s.ns('i')}"""


def _instance_state_sql(s: Scope) -> str:
    return f"""
SELECT i.namespace_id, i.id AS instance_id, i.state, 'root steps' AS what,
  COUNT(st.id) AS n
FROM weave_instances i
LEFT JOIN weave_steps st ON st.namespace_id = i.namespace_id AND st.instance_id = i.id
  AND st.name = '$root' AND st.kind = 'ROOT'
WHERE TRUE{s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state HAVING COUNT(st.id) <> 1
UNION ALL
SELECT i.namespace_id, i.id, i.state, 'own WORKFLOW gates', COUNT(g.id)
FROM weave_instances i
LEFT JOIN pulse_execution_gates g ON g.namespace_id = i.namespace_id AND g.id = i.gate_id
  AND g.owner_kind = 'WORKFLOW' AND g.owner_id = i.id
WHERE TRUE{s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state HAVING COUNT(g.id) <> 1
UNION ALL
SELECT i.namespace_id, i.id, i.state, 'LIVE activations', COUNT(*)
FROM weave_instances i
JOIN weave_activations a ON a.namespace_id = i.namespace_id AND a.instance_id = i.id
WHERE i.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND a.state = 'LIVE'{s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state
UNION ALL
SELECT i.namespace_id, i.id, i.state, 'unfinished pending advances', COUNT(*)
FROM weave_instances i
JOIN weave_pending_advances p ON p.namespace_id = i.namespace_id AND p.instance_id = i.id
WHERE i.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND p.state <> 'DONE'{s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state
UNION ALL
SELECT i.namespace_id, i.id, i.state, 'RUNNING or WAITING steps', COUNT(*)
FROM weave_instances i
JOIN weave_steps st ON st.namespace_id = i.namespace_id AND st.instance_id = i.id
WHERE i.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
  AND st.state IN ('RUNNING', 'WAITING'){s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state"""


def _pause_control_sql(s: Scope) -> str:
    return f"""
SELECT i.namespace_id, i.id AS instance_id, i.paused, g.state AS detail,
  'its gate is not PAUSED exactly when it is paused' AS problem
FROM weave_instances i
JOIN pulse_execution_gates g ON g.namespace_id = i.namespace_id AND g.id = i.gate_id
WHERE i.state = 'RUNNING' AND (i.paused = 1) <> (g.state = 'PAUSED'){s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.id, i.paused, NULL, 'paused without its PENDING RESUME row due never'
FROM weave_instances i
LEFT JOIN weave_pending_advances p ON p.namespace_id = i.namespace_id AND p.instance_id = i.id
  AND p.kind = 'RESUME' AND p.state = 'PENDING' AND p.due_at >= '9999-01-01'
WHERE i.state = 'RUNNING' AND i.paused = 1 AND p.id IS NULL{s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.id, i.paused,
  CONCAT(i.checkpoints, ' counted, ', COALESCE(x.n, 0), ' parked'), 'parked checkpoints'
FROM weave_instances i
LEFT JOIN (SELECT u.namespace_id, u.instance_id, COUNT(*) AS n FROM (
    SELECT namespace_id, instance_id FROM weave_inbox
    WHERE state = 'CONSUMED' AND outcome = 'paused'
    UNION ALL
    SELECT namespace_id, instance_id FROM weave_pending_advances
    WHERE state = 'PENDING' AND parked_due_at IS NOT NULL) u
  GROUP BY u.namespace_id, u.instance_id) x
  ON x.namespace_id = i.namespace_id AND x.instance_id = i.id
WHERE i.checkpoints <> COALESCE(x.n, 0){s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.id, i.paused, CONCAT(i.checkpoints, ' counted'),
  'resumed with parked checkpoints but no RESUME row due to replay them'
FROM weave_instances i
LEFT JOIN weave_pending_advances p ON p.namespace_id = i.namespace_id AND p.instance_id = i.id
  AND p.kind = 'RESUME' AND p.state IN ('PENDING', 'LEASED') AND p.due_at < '9999-01-01'
WHERE i.state = 'RUNNING' AND i.paused = 0 AND i.checkpoints > 0 AND p.id IS NULL{s.ns('i')}"""


def _step_hold_sql(s: Scope) -> str:
    return f"""
SELECT st.namespace_id, st.instance_id, st.name, st.state AS detail,
  'held_at and held_error are not set together' AS problem
FROM weave_steps st
WHERE (st.held_at IS NULL) <> (st.held_error IS NULL){s.ns('st')}
UNION ALL
SELECT st.namespace_id, st.instance_id, st.name, CONCAT(st.state, ', activation ',
  COALESCE(a.state, 'none')), 'held but not WAITING with a LIVE activation'
FROM weave_steps st
LEFT JOIN weave_activations a ON a.namespace_id = st.namespace_id
  AND a.instance_id = st.instance_id AND a.step_id = st.id AND a.id = st.live_activation_id
WHERE st.held_at IS NOT NULL AND (st.state <> 'WAITING' OR a.id IS NULL
  OR a.state <> 'LIVE'){s.ns('st')}
UNION ALL
SELECT st.namespace_id, st.instance_id, st.name, CONCAT('activation ', a.sequence),
  'a SUPERSEDED activation without a successor'
FROM weave_activations a
JOIN weave_steps st ON st.namespace_id = a.namespace_id AND st.instance_id = a.instance_id
  AND st.id = a.step_id
WHERE a.state = 'SUPERSEDED' AND NOT EXISTS (
  SELECT 1 FROM weave_activations n WHERE n.namespace_id = a.namespace_id
    AND n.instance_id = a.instance_id AND n.step_id = a.step_id
    AND n.sequence > a.sequence){s.ns('a')}"""


def _stop_intent_sql(s: Scope) -> str:
    """docs/weave/stop.md: the frozen stop intent and what it implies."""
    return f"""
SELECT i.namespace_id, i.id AS instance_id, i.state, i.stop_kind AS kind,
  CONCAT_WS(' ', IF(i.stop_requested_at IS NULL, 'no', 'a'), 'stop time') AS detail,
  'a half stop intent (kind and time go together; a cancel needs an intent)' AS problem
FROM weave_instances i
WHERE ((i.stop_kind IS NULL) <> (i.stop_requested_at IS NULL)
  OR (i.cancel_requested_at IS NOT NULL AND i.stop_kind IS NULL)
  OR (i.state = 'STOPPING' AND i.stop_kind IS NULL)){s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.id, i.state, i.stop_kind, g.state,
  'a stop intent but its gate is not STOPPED'
FROM weave_instances i
JOIN pulse_execution_gates g ON g.namespace_id = i.namespace_id AND g.id = i.gate_id
WHERE i.stop_kind IS NOT NULL AND g.state <> 'STOPPED'{s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.id, i.state, i.stop_kind, NULL,
  'ended otherwise than its stop intent says'
FROM weave_instances i
WHERE ((i.state = 'CANCELLED' AND NOT (i.stop_kind <=> 'CANCEL'))
  OR (i.state = 'SUCCEEDED' AND i.stop_kind IS NOT NULL)
  OR (i.state = 'FAILED' AND i.stop_kind = 'CANCEL')){s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.id, i.state, i.stop_kind, CONCAT(COUNT(*), ' LIVE'),
  'stopped but keeps LIVE activations'
FROM weave_instances i
JOIN weave_activations a ON a.namespace_id = i.namespace_id AND a.instance_id = i.id
WHERE i.stop_kind IS NOT NULL AND i.state IN ('CANCELLED', 'FAILED')
  AND a.state = 'LIVE'{s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state, i.stop_kind
UNION ALL
SELECT i.namespace_id, i.id, i.state, i.stop_kind, MIN(st.name),
  'a step created after the stop intent'
FROM weave_instances i
JOIN weave_steps st ON st.namespace_id = i.namespace_id AND st.instance_id = i.id
WHERE i.stop_requested_at IS NOT NULL AND st.created_at > i.stop_requested_at{s.ns('i')}
GROUP BY i.namespace_id, i.id, i.state, i.stop_kind"""


def _wait_winner_sql(s: Scope) -> str:
    return f"""
SELECT w.namespace_id, w.id AS wait_id, w.winner_signal_id AS signal_id,
  'its winner is not a CONSUMED signal of its instance naming it' AS problem
FROM weave_waits w
LEFT JOIN weave_signals g ON g.namespace_id = w.namespace_id AND g.id = w.winner_signal_id
  AND g.state = 'CONSUMED' AND g.wait_id = w.id AND g.instance_id = w.instance_id
WHERE w.state = 'SIGNALLED' AND g.id IS NULL{s.ns('w')}
UNION ALL
SELECT g.namespace_id, g.wait_id, MIN(g.id), CONCAT(COUNT(*), ' CONSUMED signals name it')
FROM weave_signals g
WHERE g.state = 'CONSUMED'{s.ns('g')}
GROUP BY g.namespace_id, g.wait_id HAVING COUNT(*) > 1
UNION ALL
SELECT g.namespace_id, g.wait_id, g.id, 'a CONSUMED signal names it but is not its winner'
FROM weave_signals g
LEFT JOIN weave_waits w ON w.namespace_id = g.namespace_id AND w.id = g.wait_id
  AND w.state = 'SIGNALLED' AND w.winner_signal_id = g.id
WHERE g.state = 'CONSUMED' AND w.id IS NULL{s.ns('g')}"""


def _inbox_outcome_sql(s: Scope) -> str:
    return f"""
SELECT i.namespace_id, i.task_id, i.source_event_id AS event_id, i.state, i.outcome,
  'an outcome that does not match the row' AS problem
FROM weave_inbox i
WHERE (i.state = 'CONSUMED') <> (i.outcome IS NOT NULL){s.ns('i')}
UNION ALL
SELECT i.namespace_id, i.task_id, i.source_event_id, i.state, i.outcome,
  'no activation with this result event'
FROM weave_inbox i
LEFT JOIN weave_activations a ON a.namespace_id = i.namespace_id AND a.id = i.activation_id
  AND a.result_event_id = i.source_event_id
LEFT JOIN weave_poll_rounds pr ON pr.namespace_id = i.namespace_id AND pr.task_id = i.task_id
  AND pr.activation_id = i.activation_id AND pr.state <> 'RUNNING'
WHERE i.state = 'CONSUMED' AND i.outcome IN ('advanced', 'duplicate')
  AND a.id IS NULL AND pr.task_id IS NULL{s.ns('i')}"""


def _poll_rounds_sql(s: Scope) -> str:
    return f"""
SELECT ps.namespace_id, ps.instance_id, ps.step_id, ps.state, ps.used_rounds,
  ps.max_rounds + ps.granted_rounds AS max_rounds,
  COUNT(DISTINCT r.round) AS n, MIN(r.round) AS lo, MAX(r.round) AS hi, 'rounds' AS problem
FROM weave_poll_states ps
LEFT JOIN weave_poll_rounds r ON r.namespace_id = ps.namespace_id
  AND r.instance_id = ps.instance_id AND r.step_id = ps.step_id
WHERE TRUE{s.ns('ps')}
GROUP BY ps.namespace_id, ps.instance_id, ps.step_id, ps.state, ps.used_rounds, ps.max_rounds,
  ps.granted_rounds
HAVING COUNT(DISTINCT r.round) > ps.max_rounds + ps.granted_rounds
  OR COUNT(DISTINCT r.round) <> ps.used_rounds
  OR (COUNT(r.round) > 0 AND (MIN(r.round) <> 1 OR MAX(r.round) <> COUNT(DISTINCT r.round)))
UNION ALL
SELECT ps.namespace_id, ps.instance_id, ps.step_id, ps.state, ps.used_rounds, ps.max_rounds,
  0, NULL, NULL, 'no pending advance'
FROM weave_poll_states ps
LEFT JOIN weave_pending_advances p ON p.namespace_id = ps.namespace_id
  AND p.instance_id = ps.instance_id AND p.step_id = ps.step_id AND p.kind = 'POLL'
  AND p.state IN ('PENDING', 'LEASED') AND p.activation_id = ps.activation_id
WHERE ps.state = 'WAITING' AND p.id IS NULL{s.ns('ps')}"""


def _poll_rounds_render(row: dict[str, Any], _s: Scope) -> str:
    where = f"POLL step {_h(row['namespace_id'])}/{_h(row['instance_id'])}/{_h(row['step_id'])}"
    if row["problem"] == "no pending advance":
        return f"{where} is WAITING without its PENDING or LEASED pending advance"
    return (f"{where} ({row['state']}) used {row['used_rounds']} of {row['max_rounds']} rounds"
            f" but has {row['n']} round rows numbered {_h(row['lo'])}..{_h(row['hi'])}")


def _wait_pending_advance_sql(s: Scope) -> str:
    """Every WAITING TIMER step has a WAITING wait and a PENDING / LEASED TIMER advance for its
    LIVE activation; every WAITING SIGNAL wait with a deadline has its SIGNAL advance
    (docs/weave/waits.md)."""
    return f"""
SELECT st.namespace_id, st.instance_id, st.name, st.live_activation_id AS activation_id,
  'TIMER' AS kind, 'no PENDING or LEASED TIMER pending advance' AS problem
FROM weave_steps st
LEFT JOIN weave_pending_advances p ON p.namespace_id = st.namespace_id
  AND p.instance_id = st.instance_id AND p.step_id = st.id AND p.kind = 'TIMER'
  AND p.activation_id = st.live_activation_id AND p.state IN ('PENDING', 'LEASED')
WHERE st.kind = 'TIMER' AND st.state = 'WAITING' AND p.id IS NULL{s.ns('st')}
UNION ALL
SELECT st.namespace_id, st.instance_id, st.name, st.live_activation_id, 'TIMER',
  'no WAITING wait'
FROM weave_steps st
LEFT JOIN weave_waits w ON w.namespace_id = st.namespace_id
  AND w.activation_id = st.live_activation_id AND w.kind = 'TIMER' AND w.state = 'WAITING'
  AND w.step_id = st.id
WHERE st.kind = 'TIMER' AND st.state = 'WAITING' AND w.id IS NULL{s.ns('st')}
UNION ALL
SELECT w.namespace_id, w.instance_id, st.name, w.activation_id, w.kind,
  'no PENDING or LEASED SIGNAL pending advance for its deadline'
FROM weave_waits w
LEFT JOIN weave_steps st ON st.namespace_id = w.namespace_id
  AND st.instance_id = w.instance_id AND st.id = w.step_id
LEFT JOIN weave_pending_advances p ON p.namespace_id = w.namespace_id
  AND p.instance_id = w.instance_id AND p.step_id = w.step_id AND p.kind = 'SIGNAL'
  AND p.activation_id = w.activation_id AND p.state IN ('PENDING', 'LEASED')
WHERE w.kind = 'SIGNAL' AND w.state = 'WAITING' AND w.deadline_at IS NOT NULL
  AND p.id IS NULL{s.ns('w')}"""


def _stuck_sql(s: Scope) -> str:
    cutoff = f"UTC_TIMESTAMP(6) - INTERVAL {s.grace_us} MICROSECOND"
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.state, 'lease' AS what, t.lease_expires_at AS at
FROM pulse_tasks t
WHERE t.state IN ('LEASED', 'RUNNING') AND t.lease_expires_at < {cutoff}{s.ns('t')}
UNION ALL
SELECT t.namespace_id, t.id, t.state, 'deadline', t.deadline_at
FROM pulse_tasks t
WHERE t.state = 'WAITING' AND t.deadline_at < {cutoff}{s.ns('t')}
UNION ALL
SELECT t.namespace_id, t.id, t.state, 'start deadline', t.start_deadline_at
FROM pulse_tasks t
WHERE t.state = 'WAITING' AND t.first_started_at IS NULL
  AND t.start_deadline_at < {cutoff}{s.ns('t')}"""


def _stuck_render(row: dict[str, Any], s: Scope) -> str:
    return (f"{_task(row)} is still {row['state']} though its {row['what']} passed at"
            f" {row['at']} (more than {s.grace} ago)")


def _start_budget_sql(s: Scope) -> str:
    return f"""
SELECT t.namespace_id, t.id AS task_id, t.starts_used, t.max_attempts, COALESCE(g.n, 0) AS n
FROM pulse_tasks t
LEFT JOIN (
  SELECT a.namespace_id, a.task_id, COUNT(*) AS n FROM pulse_attempts a
  WHERE a.started_at IS NOT NULL{s.ns('a')} GROUP BY a.namespace_id, a.task_id
) g ON g.namespace_id = t.namespace_id AND g.task_id = t.id
WHERE (t.starts_used <> COALESCE(g.n, 0) OR t.starts_used > t.max_attempts){s.ns('t')}"""


def _session_binding_sql(s: Scope) -> str:
    return f"""
SELECT a.namespace_id, a.task_id, a.id AS attempt_id, a.state, ws.instance_id
FROM pulse_attempts a
LEFT JOIN pulse_worker_sessions ws
  ON ws.namespace_id = a.namespace_id AND ws.id = a.worker_session_id
WHERE a.state IN {LIVE} AND (ws.id IS NULL OR ws.instance_id <> a.worker_instance_id){s.ns('a')}"""


def _expected_sql(s: Scope) -> str:
    wanted = [(ns, t) for ns, t in s.expected
              if s.namespace_ids is None or ns in s.namespace_ids]
    if not wanted:
        return "SELECT NULL AS namespace_id, NULL AS task_id FROM DUAL WHERE FALSE"
    rows = " UNION ALL ".join(
        f"SELECT X'{ns.hex()}' AS namespace_id, X'{t.hex()}' AS task_id" for ns, t in wanted)
    return f"""
SELECT w.namespace_id, w.task_id FROM ({rows}) w
LEFT JOIN pulse_tasks t ON t.namespace_id = w.namespace_id AND t.id = w.task_id
WHERE t.id IS NULL"""


PROBES: tuple[Probe, ...] = (
    Probe("live_attempts", _live_attempts_sql,
          lambda r, s: f"{_task(r)} has {r['n']} unfinished attempts ({r['which']})"),
    Probe("generations", _generations_sql, _generations_render),
    Probe("orphan_attempt", _orphan_sql,
          lambda r, s: f"attempt {_h(r['attempt_id'])} ({r['state']}) belongs to missing"
                       f" {_task(r)}"),
    Probe("current_attempt", _current_sql, _current_render),
    Probe("stray_live_attempt", _stray_sql, _stray_render),
    Probe("idle_task_lease", _idle_sql,
          lambda r, s: f"{_task(r)} is {r['state']} but names attempt"
                       f" {_h(r['current_attempt_id'])} and lease {_h(r['lease_expires_at'])}"),
    Probe("completed_at", _completed_sql, _completed_render),
    Probe("outcome_event", _outcome_event_sql,
          lambda r, s: f"{_task(r)} is {r['state']} with {r['n']} state events into"
                       f" {r['state']} (expected exactly one)"),
    Probe("result_event", _result_event_sql,
          lambda r, s: f"{_task(r)} is {r['state']} at revision {r['revision']} with {r['n']}"
                       f" result events for that state and revision (expected exactly one)"),
    Probe("result_event_mismatch", _result_mismatch_sql, _result_mismatch_render),
    Probe("result_sequence", _sequence_sql, _sequence_render),
    Probe("queue_counter", _queue_counter_sql,
          lambda r, s: f"queue {_h(r['namespace_id'])}/{r['name']} counts"
                       f" {r['active_attempts']} active attempts, a recount finds {r['live']}"),
    Probe("uncertain_final", _uncertain_final_sql,
          lambda r, s: f"{_task(r)} is {r['state']} with effect_uncertain set"),
    Probe("uncertainty_dropped", _uncertainty_dropped_sql,
          lambda r, s: f"{_task(r)} is {r['state']} ({r['outcome_reason']}) without"
                       f" effect_uncertain although attempts {r['which']} left the effect"
                       f" unknown"),
    Probe("success_overwritten", _success_sql,
          lambda r, s: f"{_task(r)} is {r['state']} with {r['n']} SUCCEEDED attempt(s)"
                       f" (generations {r['generations']})"),
    Probe("transition", _transitions_sql, _transitions_render),
    Probe("event_revisions", _event_dup_sql,
          lambda r, s: f"{_task(r)} has {r['n']} state events at revision"
                       f" {r['aggregate_revision']} ({r['types']})"),
    Probe("event_revisions", _event_order_sql,
          lambda r, s: f"{_task(r)}: the event at revision {r['aggregate_revision']}"
                       f" ({r['occurred_at']}) is older than revision {r['prev_revision']}"
                       f" ({r['prev_at']})"),
    Probe("event_revisions", _event_revisions_sql, _event_revisions_render),
    Probe("queue_unfinished", _queue_unfinished_sql,
          lambda r, s: f"queue {_h(r['namespace_id'])}/{r['name']} counts"
                       f" {r['unfinished_tasks']} unfinished tasks, a recount finds {r['found']}"),
    Probe("application_counter", _application_counter_sql, _application_counter_render),
    Probe("start_window", _start_window_sql, _start_window_render),
    Probe("key_row", _key_row_sql, _key_row_render),
    Probe("attempt_token", _attempt_token_sql, _attempt_token_render),
    Probe("permit_count", _permit_count_sql,
          lambda r, s: f"{_key(r)} counts {r['held_permits']} held permits, its valid permit"
                       f" rows number {r['held']}"),
    Probe("permit_held", _permit_held_sql,
          lambda r, s: f"{_key(r)} has {r['n']} valid permits (tokens {r['tokens']})"),
    Probe("permit_holder", _permit_holder_sql, _permit_holder_render),
    Probe("permit_missing", _permit_missing_sql,
          lambda r, s: f"{_task(r)}: live attempt {_h(r['attempt_id'])} ({r['state']}, token"
                       f" {r['concurrency_token']}) holds {r['n']} valid permits with that"
                       f" token on its key (expected exactly one)"),
    Probe("permit_tokens", _permit_tokens_sql, _permit_tokens_render),
    Probe("permit_revision", _permit_revision_sql, _permit_revision_render),
    Probe("start_budget", _start_budget_sql,
          lambda r, s: f"{_task(r)} counts starts_used={r['starts_used']} (max_attempts"
                       f" {r['max_attempts']}) but {r['n']} of its attempts started"),
    Probe("session_binding", _session_binding_sql,
          lambda r, s: f"{_task(r)}: live attempt {_h(r['attempt_id'])} ({r['state']}) is"
                       f" recorded on a session of instance {_h(r['instance_id'])}, not its own"),
    Probe("one_run_per_instant", _one_run_sql, _one_run_render),
    Probe("task_owner", _task_owner_sql, _task_owner_render),
    Probe("subscription_backlog", _backlog_sql,
          lambda r, s: f"subscription {_h(r['namespace_id'])}/{r['name']} counts a backlog of"
                       f" {r['backlog']}, a recount of its open deliveries finds {r['open']}"),
    Probe("delivery_unique", _delivery_unique_sql,
          lambda r, s: f"subscription {_h(r['namespace_id'])}/{_h(r['subscription_id'])} has"
                       f" {r['n']} deliveries of result event {_h(r['event_id'])}"),
    Probe("delivery_source", _delivery_source_sql, _delivery_source_render),
    Probe("delivery_lease", _delivery_lease_sql,
          lambda r, s: f"{_delivery(r)} is {r['state']} with lease expiry"
                       f" {_h(r['lease_expires_at'])}, token digest"
                       f" {'set' if r['has_token'] else 'unset'}, attempts"
                       f" {r['attempts_used']}/{r['max_attempts']}"),
    Probe("delivery_attempts", _delivery_attempts_sql,
          lambda r, s: f"{_delivery(r)} ({r['state']}) used {r['attempts_used']} attempts but"
                       f" its log has {r['n']} rows numbered {_h(r['lo'])}..{_h(r['hi'])}"),
    Probe("scan_position", _scan_position_sql,
          lambda r, s: f"subscription {_h(r['namespace_id'])}/{r['name']} scanned past"
                       f" {r['scan_after_sequence']}, but its stream's next_sequence is"
                       f" {_h(r['next_sequence'])}"),
    Probe("live_activation", _live_activation_sql, _live_activation_render),
    Probe("workflow_inbox", _workflow_inbox_sql,
          lambda r, s: f"{_task(r)}: {r['problem']} (event {_h(r['event_id'])},"
                       f" {r['state']})"),
    Probe("instance_state", _instance_state_sql,
          lambda r, s: f"instance {_h(r['namespace_id'])}/{_h(r['instance_id'])} ({r['state']})"
                       f" has {r['n']} {r['what']}"),
    Probe("inbox_outcome", _inbox_outcome_sql,
          lambda r, s: f"{_task(r)}: inbox row ({r['state']}, {_h(r['outcome'])}) has"
                       f" {r['problem']} (event {_h(r['event_id'])})"),
    Probe("wait_winner", _wait_winner_sql,
          lambda r, s: f"wait {_h(r['namespace_id'])}/{_h(r['wait_id'])}: {r['problem']}"
                       f" (signal {_h(r['signal_id'])})"),
    Probe("poll_rounds", _poll_rounds_sql, _poll_rounds_render),
    Probe("step_hold", _step_hold_sql,
          lambda r, s: f"step {_h(r['namespace_id'])}/{_h(r['instance_id'])}/{r['name']}:"
                       f" {r['problem']} ({_h(r['detail'])})"),
    Probe("pause_control", _pause_control_sql,
          lambda r, s: f"instance {_h(r['namespace_id'])}/{_h(r['instance_id'])} (paused"
                       f" {r['paused']}): {r['problem']} ({_h(r['detail'])})"),
    Probe("stop_intent", _stop_intent_sql,
          lambda r, s: f"instance {_h(r['namespace_id'])}/{_h(r['instance_id'])} ({r['state']},"
                       f" stop {_h(r['kind'])}): {r['problem']} ({_h(r['detail'])})"),
    Probe("wait_pending_advance", _wait_pending_advance_sql,
          lambda r, s: f"{r['kind']} wait of step {_h(r['namespace_id'])}/"
                       f"{_h(r['instance_id'])}/{r['name']} (activation"
                       f" {_h(r['activation_id'])}): {r['problem']}"),
    Probe("stuck", _stuck_sql, _stuck_render, when=lambda s: s.quiescent),
    Probe("delivery_stuck", _delivery_stuck_sql,
          lambda r, s: f"{_delivery(r)} is still LEASED though its lease lapsed at"
                       f" {r['lease_expires_at']} (more than {s.grace} ago)",
          when=lambda s: s.quiescent),
    Probe("missing_task", _expected_sql,
          lambda r, s: f"acknowledged {_task(r)} does not exist",
          when=lambda s: bool(s.expected)),
)


# --- running the probes ----------------------------------------------------------------------

def _scope(namespace_ids: Iterable[bytes] | None, quiescent: bool, grace: dt.timedelta,
           require_creation_events: bool,
           expected_tasks: Iterable[tuple[bytes, bytes]] | None) -> Scope:
    return Scope(
        namespace_ids=None if namespace_ids is None else tuple(namespace_ids),
        quiescent=quiescent, grace=grace, require_creation_events=require_creation_events,
        expected=tuple(expected_tasks or ()),
    )


def _rows(description: Sequence[Any] | None, rows: Sequence[Any]) -> list[dict[str, Any]]:
    names = [column[0] for column in description or ()]
    return [row if isinstance(row, dict) else dict(zip(names, row, strict=True)) for row in rows]


def _render(probe: Probe, rows: list[dict[str, Any]], scope: Scope) -> list[str]:
    found = []
    for row in rows:
        text = probe.render(row, scope)
        if text is not None:
            found.append(f"[{probe.code}] {text}")
    return found


def check(
    conn: Any,
    namespace_ids: Iterable[bytes] | None = None,
    *,
    quiescent: bool = False,
    grace: dt.timedelta = DEFAULT_GRACE,
    require_creation_events: bool = False,
    expected_tasks: Iterable[tuple[bytes, bytes]] | None = None,
) -> list[str]:
    """Every violated invariant, as human-readable lines (empty when all hold).

    ``conn`` is a blocking PyMySQL connection with no open transaction; the probes run in one
    consistent read-only snapshot that is ended (rolled back) before returning.
    """
    scope = _scope(namespace_ids, quiescent, grace, require_creation_events, expected_tasks)
    found: list[str] = []
    with conn.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            for probe in PROBES:
                if probe.when(scope):
                    cur.execute(probe.sql(scope))
                    found += _render(probe, _rows(cur.description, cur.fetchall()), scope)
        finally:
            conn.rollback()
    return found


async def check_cursor(
    cur: Any,
    namespace_ids: Iterable[bytes] | None = None,
    *,
    quiescent: bool = False,
    grace: dt.timedelta = DEFAULT_GRACE,
    require_creation_events: bool = False,
    expected_tasks: Iterable[tuple[bytes, bytes]] | None = None,
) -> list[str]:
    """The probes on an async (aiomysql) cursor, inside the transaction its caller owns. For a
    consistent answer under load, that transaction should be REPEATABLE READ (see check_db)."""
    scope = _scope(namespace_ids, quiescent, grace, require_creation_events, expected_tasks)
    found: list[str] = []
    for probe in PROBES:
        if probe.when(scope):
            await cur.execute(probe.sql(scope))
            found += _render(probe, _rows(cur.description, await cur.fetchall()), scope)
    return found


async def check_db(db: Any, namespace_ids: Iterable[bytes] | None = None,
                   **options: Any) -> list[str]:
    """:func:`check_cursor` in one REPEATABLE READ transaction of an Orbit ``Database``."""
    from orbit_common.db.tx import Isolation

    ids = None if namespace_ids is None else tuple(namespace_ids)
    return await db.transaction(
        "test.invariants", lambda cur: check_cursor(cur, ids, **options),
        isolation=Isolation.REPEATABLE_READ)


def codes(violations: Iterable[str]) -> set[str]:
    """The invariant codes of some violations (``"[code] …"`` → ``code``)."""
    return {v[1:v.index("]")] for v in violations}

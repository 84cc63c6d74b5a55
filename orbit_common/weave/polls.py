"""Bounded queries (POLL steps): the rows an advance reads and writes for them, and the pure
decisions beside them (docs/weave/waits.md § 有界查询（POLL））.

A POLL step runs one task per *round* until its ``until`` condition holds on a round's result.
Its state is one ``weave_poll_states`` row per step (used rounds, the fixed maximum, the stored
next interval, the absolute query deadline fixed when the step is entered) and one
``weave_poll_rounds`` row per round (unique (instance, activation, round), with its task). The
step has one activation for the whole query; the activation's ``task_id`` names the *current*
round's task, so the kernel's ending writer links that task's result to the activation (older
rounds' tasks are found through ``weave_poll_rounds``: ``pulse.leases.workflow_inbox``), and an
older round's late result is ``stale``.

State diagram of ``weave_poll_states.state``::

    ROUND --result, until holds------------------> SATISFIED
    ROUND --result, not yet, budget and time left-> WAITING --POLL advance due--> ROUND
    ROUND --result, not yet, no budget or time---> EXHAUSTED
    WAITING --POLL advance due, no budget/time---> EXHAUSTED
    ROUND --task FAILED / CANCELLED, bad result--> FAILED
    ROUND | WAITING --block closed / instance ended--> CANCELLED

The POLL pending advance (one row per step, ``uq_weave_advances_step``) is written DONE when the
step is entered (round 1 starts with the step) and re-armed -- the same row back to PENDING
with ``due_at`` = the next round's time -- each time the step starts WAITING. The next round is
made in the advance transaction that handles that row: it re-checks the activation, the poll
state, the instance's workflow gate (OPEN; read after the instance lock, which a pause takes
first), the budget and the deadline, then inserts the round, counts it, creates the task and
marks the row DONE -- together. Nothing of a poll lives only in memory: an engine that dies
mid-round leaves the rows as they were committed, and budgets never reset.

Lock order: inside the engine's (docs/weave/engine.md): after the instance row, with the
steps and activations (the poll rows are the step's), before tasks. These rows are read with
plain reads after the instance lock (every writer of them holds that lock first).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import as_utc, to_db
from orbit_common.model import ids, jsondoc
from orbit_common.weave.language import Backoff

# weave_poll_states.state
ROUND = "ROUND"
WAITING = "WAITING"
SATISFIED = "SATISFIED"
EXHAUSTED = "EXHAUSTED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
OPEN = (ROUND, WAITING)
# weave_poll_rounds.state
RUNNING = "RUNNING"
MET = "MET"
NOT_MET = "NOT_MET"

POLL_EXHAUSTED = "poll_exhausted"


@attrs.define
class PollState:
    """A POLL step's ``weave_poll_states`` row, in memory."""

    instance_id: bytes
    step_id: bytes
    activation_id: bytes
    state: str
    used_rounds: int
    max_rounds: int
    next_interval_ms: int
    next_round_at: dt.datetime | None
    deadline_at: dt.datetime | None
    last_result: Any = None
    granted_rounds: int = 0  # rounds an operator granted (continue): the budget grows by them
    continued_deadline_at: dt.datetime | None = None  # a continue's new query deadline
    extra_tasks: int = 0  # tasks of older activations beyond one each (continued queries)
    advance_id: bytes = b""
    advance_state: str = "DONE"
    arm_at: dt.datetime | None = None  # re-arm the POLL advance (PENDING at this time)
    new: bool = False
    dirty: bool = False

    @property
    def round_budget(self) -> int:
        """The rounds the query may use: the definition's, plus those granted by hand."""
        return self.max_rounds + self.granted_rounds

    @property
    def query_deadline(self) -> dt.datetime | None:
        """The query deadline in force: a continue's new one, else the first (which never
        moves)."""
        return self.continued_deadline_at or self.deadline_at


@attrs.define
class RoundRow:
    """One ``weave_poll_rounds`` row (only RUNNING rounds are loaded)."""

    instance_id: bytes
    activation_id: bytes
    round: int
    step_id: bytes
    task_id: bytes
    state: str
    result: Any = None
    new: bool = False
    dirty: bool = False


@attrs.define
class Book:
    """One instance's poll rows during an advance, and the advance's database time."""

    now: dt.datetime | None = None
    gate_open: bool = True
    states: dict[bytes, PollState] = attrs.field(factory=dict)  # by step id
    rounds: dict[bytes, RoundRow] = attrs.field(factory=dict)  # RUNNING, by task id
    retasked: dict[bytes, bytes] = attrs.field(factory=dict)  # activation id -> task id

    @property
    def time(self) -> dt.datetime:
        if self.now is None:
            raise RuntimeError("a poll decision without the advance's database time")
        return self.now


def grown(interval_ms: int, backoff: Backoff | None) -> int:
    """The interval after ``interval_ms`` (fixed without a backoff; else multiplied, rounded
    up, capped at the backoff's maximum)."""
    if backoff is None:
        return interval_ms
    return min(backoff.max_interval_ms, math.ceil(interval_ms * backoff.multiplier))


def remaining_ms(deadline_at: dt.datetime | None, now: dt.datetime) -> int | None:
    """Whole milliseconds left before the query deadline (None: no deadline)."""
    if deadline_at is None:
        return None
    return (deadline_at - now) // dt.timedelta(milliseconds=1)


def round_deadline_ms(task_deadline_ms: int | None, left_ms: int | None) -> int | None:
    """A round's task deadline: the step's own, never later than the query deadline."""
    if left_ms is None:
        return task_deadline_ms
    if task_deadline_ms is None:
        return left_ms
    return min(task_deadline_ms, left_ms)


def exhausted_error(step: str, state: PollState, reason: str) -> dict[str, Any]:
    """The step's error when the query ends without its condition (``reason``: ``max_rounds``
    or ``deadline``)."""
    return {"error": POLL_EXHAUSTED, "rounds": state.used_rounds, "reason": reason,
            "step": step}


def entered(instance_id: bytes, step_id: bytes, activation_id: bytes, *, task_id: bytes,
            max_rounds: int, interval_ms: int, deadline_at: dt.datetime | None,
            book: Book) -> None:
    """A POLL step was entered with round 1's task: its state, round and (DONE) advance."""
    book.states[step_id] = PollState(
        instance_id=instance_id, step_id=step_id, activation_id=activation_id, state=ROUND,
        used_rounds=1, max_rounds=max_rounds, next_interval_ms=interval_ms, next_round_at=None,
        deadline_at=deadline_at, advance_id=ids.new_id(), advance_state="NEW", new=True)
    book.rounds[task_id] = RoundRow(instance_id=instance_id, activation_id=activation_id,
                                    round=1, step_id=step_id, task_id=task_id, state=RUNNING,
                                    new=True)


def next_round(state: PollState, task_id: bytes, book: Book) -> RoundRow:
    """The next round of a WAITING query, counted (the caller checked gate and budget)."""
    state.used_rounds += 1
    state.state = ROUND
    state.next_round_at = None
    state.dirty = True
    row = RoundRow(instance_id=state.instance_id, activation_id=state.activation_id,
                   round=state.used_rounds, step_id=state.step_id, task_id=task_id,
                   state=RUNNING, new=True)
    book.rounds[task_id] = row
    book.retasked[state.activation_id] = task_id
    return row


def end_round(row: RoundRow, state: str, result: Any = None) -> None:
    row.state = state
    row.result = result
    row.dirty = True


# --- SQL ----------------------------------------------------------------------------------------

LOAD_STATES = ("SELECT * FROM weave_poll_states WHERE namespace_id = %s"
               " AND instance_id IN ({ids})")
LOAD_ROUNDS = ("SELECT instance_id, activation_id, round, step_id, task_id, state"
               " FROM weave_poll_rounds WHERE namespace_id = %s AND instance_id IN ({ids})"
               " AND state = 'RUNNING'")
LOAD_ADVANCES = ("SELECT instance_id, id, step_id, state FROM weave_pending_advances"
                 " WHERE namespace_id = %s AND instance_id IN ({ids}) AND kind = 'POLL'")
# Continued queries (granted_rounds > 0): their steps' tasks beyond one per activation that
# made one (a round continued in a new activation made a second task for that round).
LOAD_EXTRA_TASKS = (
    "SELECT ps.instance_id, ps.step_id,"
    " (SELECT COUNT(*) FROM weave_poll_rounds r WHERE r.namespace_id = ps.namespace_id"
    " AND r.instance_id = ps.instance_id AND r.step_id = ps.step_id)"
    " - (SELECT COUNT(*) FROM weave_activations a WHERE a.namespace_id = ps.namespace_id"
    " AND a.instance_id = ps.instance_id AND a.step_id = ps.step_id"
    " AND a.task_id IS NOT NULL) AS extra"
    " FROM weave_poll_states ps WHERE ps.namespace_id = %s AND ps.instance_id IN ({ids})"
    " AND ps.granted_rounds > 0")
LOAD_GATES = ("SELECT id, state FROM pulse_execution_gates WHERE namespace_id = %s"
              " AND id IN ({ids})")
INSERT_STATES = ("INSERT INTO weave_poll_states (namespace_id, instance_id, step_id,"
                 " activation_id, state, used_rounds, max_rounds, next_interval_ms,"
                 " next_round_at, deadline_at, last_result, created_at, updated_at)")
STATE_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
UPDATE_STATES = ("UPDATE weave_poll_states SET state = CASE step_id {state} END,"
                 " used_rounds = CASE step_id {used} END,"
                 " next_interval_ms = CASE step_id {interval} END,"
                 " next_round_at = CASE step_id {at} END,"
                 " last_result = CASE step_id {last} END, updated_at = %s"
                 " WHERE namespace_id = %s AND instance_id IN ({instances})"
                 " AND step_id IN ({ids})")
INSERT_ROUNDS = ("INSERT INTO weave_poll_rounds (namespace_id, instance_id, activation_id,"
                 " round, step_id, task_id, state, result, created_at, ended_at)")
ROUND_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
UPDATE_ROUNDS = ("UPDATE weave_poll_rounds SET state = CASE task_id {state} END,"
                 " result = CASE task_id {result} END, ended_at = %s"
                 " WHERE namespace_id = %s AND task_id IN ({ids})")
RETASK = ("UPDATE weave_activations SET task_id = CASE id {task} END"
          " WHERE namespace_id = %s AND id IN ({ids})")
INSERT_ADVANCES = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id,"
                   " activation_id, kind, state, due_at, created_at, done_at)")
ADVANCE_ROW = "(%s, %s, %s, %s, %s, 'POLL', 'DONE', %s, %s, %s)"
FINISH_ADVANCES = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s,"
                   " lease_owner = NULL, lease_expires_at = NULL"
                   " WHERE namespace_id = %s AND id IN ({ids}) AND state <> 'DONE'")
REARM = ("UPDATE weave_pending_advances SET state = 'PENDING', due_at = CASE id {due} END,"
         " done_at = NULL, lease_owner = NULL, lease_expires_at = NULL"
         " WHERE namespace_id = %s AND id IN ({ids})")


def _cases(rows: Sequence[tuple[bytes, Any]]) -> tuple[str, list[Any]]:
    return " ".join("WHEN %s THEN %s" for _ in rows), [v for row in rows for v in row]


def _json(value: Any) -> str | None:
    return None if value is None else jsondoc.dumps(value)


def _at(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else to_db(value)


async def load(cur: Any, ns: bytes, instances: Mapping[bytes, tuple[bytes, bool]],
               now: dt.datetime) -> dict[bytes, Book]:
    """A book per instance of ``instances`` (instance id -> (gate id, has POLL steps)); the
    poll rows, the POLL advances and the gate state only for those with POLL steps."""
    books = {instance_id: Book(now=now) for instance_id in instances}
    polling = sorted(i for i, (_, has) in instances.items() if has)
    if not polling:
        return books
    marks = placeholders(len(polling))
    await cur.execute(LOAD_ADVANCES.format(ids=marks), (ns, *polling))
    advances = {(r["instance_id"], r["step_id"]): r for r in await cur.fetchall()}
    await cur.execute(LOAD_STATES.format(ids=marks), (ns, *polling))
    for r in await cur.fetchall():
        advance = advances.get((r["instance_id"], r["step_id"]))
        books[r["instance_id"]].states[r["step_id"]] = PollState(
            instance_id=r["instance_id"], step_id=r["step_id"],
            activation_id=r["activation_id"], state=r["state"], used_rounds=r["used_rounds"],
            max_rounds=r["max_rounds"], next_interval_ms=r["next_interval_ms"],
            next_round_at=None if r["next_round_at"] is None else as_utc(r["next_round_at"]),
            deadline_at=None if r["deadline_at"] is None else as_utc(r["deadline_at"]),
            last_result=None if r["last_result"] is None
            else jsondoc.loads_strict(r["last_result"]),
            granted_rounds=r["granted_rounds"],
            continued_deadline_at=None if r["continued_deadline_at"] is None
            else as_utc(r["continued_deadline_at"]),
            advance_id=advance["id"] if advance else b"",
            advance_state=advance["state"] if advance else "NONE")
    if any(s.granted_rounds for b in books.values() for s in b.states.values()):
        await cur.execute(LOAD_EXTRA_TASKS.format(ids=marks), (ns, *polling))
        for r in await cur.fetchall():
            books[r["instance_id"]].states[r["step_id"]].extra_tasks = int(r["extra"])
    await cur.execute(LOAD_ROUNDS.format(ids=marks), (ns, *polling))
    for r in await cur.fetchall():
        books[r["instance_id"]].rounds[r["task_id"]] = RoundRow(
            instance_id=r["instance_id"], activation_id=r["activation_id"], round=r["round"],
            step_id=r["step_id"], task_id=r["task_id"], state=r["state"])
    gates = sorted({instances[i][0] for i in polling})
    await cur.execute(LOAD_GATES.format(ids=placeholders(len(gates))), (ns, *gates))
    open_gates = {r["id"] for r in await cur.fetchall() if r["state"] == "OPEN"}
    for instance_id in polling:
        books[instance_id].gate_open = instances[instance_id][0] in open_gates
    return books


def cancel_closed(book: Book, step_states: Mapping[bytes, str]) -> None:
    """Queries whose step was cancelled (its block closed, its instance ended) end CANCELLED
    with their running round."""
    for state in book.states.values():
        if state.state in OPEN and step_states.get(state.step_id) == "CANCELLED":
            state.state = CANCELLED
            state.next_round_at = None
            state.arm_at = None
            state.dirty = True
            for row in book.rounds.values():
                if row.step_id == state.step_id and row.state == RUNNING:
                    end_round(row, CANCELLED)


async def write(cur: Any, ns: bytes, books: Sequence[Book], now: dt.datetime) -> None:
    """The batch's poll rows: new and changed states and rounds, the activations that moved to
    a new round's task, new POLL advances (DONE) and the advances of ended queries (DONE); one
    statement per kind of change."""
    when = to_db(now)
    states = [s for b in books for s in b.states.values()]
    rounds = [r for b in books for r in b.rounds.values()]
    new_states = [s for s in states if s.new]
    dirty_states = [s for s in states if s.dirty and not s.new]
    if new_states:
        sql, params = multi_insert(INSERT_STATES, STATE_ROW, [
            (ns, s.instance_id, s.step_id, s.activation_id, s.state, s.used_rounds,
             s.max_rounds, s.next_interval_ms, _at(s.next_round_at), _at(s.deadline_at),
             _json(s.last_result), when, when) for s in new_states])
        await cur.execute(sql, params)
        sql, params = multi_insert(INSERT_ADVANCES, ADVANCE_ROW, [
            (ns, s.advance_id, s.instance_id, s.step_id, s.activation_id, when, when, when)
            for s in new_states])
        await cur.execute(sql, params)
    if dirty_states:
        columns: dict[str, list[tuple[bytes, Any]]] = {
            "state": [(s.step_id, s.state) for s in dirty_states],
            "used": [(s.step_id, s.used_rounds) for s in dirty_states],
            "interval": [(s.step_id, s.next_interval_ms) for s in dirty_states],
            "at": [(s.step_id, _at(s.next_round_at)) for s in dirty_states],
            "last": [(s.step_id, _json(s.last_result)) for s in dirty_states],
        }
        texts: dict[str, str] = {}
        values: list[Any] = []
        for key, rows in columns.items():
            texts[key], found = _cases(rows)
            values += found
        instances = sorted({s.instance_id for s in dirty_states})
        steps = [s.step_id for s in dirty_states]
        await cur.execute(UPDATE_STATES.format(**texts, instances=placeholders(len(instances)),
                                               ids=placeholders(len(steps))),
                          (*values, when, ns, *instances, *steps))
    new_rounds = [r for r in rounds if r.new]
    if new_rounds:
        sql, row_params = multi_insert(INSERT_ROUNDS, ROUND_ROW, [
            (ns, r.instance_id, r.activation_id, r.round, r.step_id, r.task_id, r.state,
             _json(r.result), when, None if r.state == RUNNING else when)
            for r in new_rounds])
        await cur.execute(sql, row_params)
    dirty_rounds = [r for r in rounds if r.dirty and not r.new]
    if dirty_rounds:
        state_sql, state_params = _cases([(r.task_id, r.state) for r in dirty_rounds])
        result_sql, result_params = _cases([(r.task_id, _json(r.result))
                                            for r in dirty_rounds])
        await cur.execute(UPDATE_ROUNDS.format(state=state_sql, result=result_sql,
                                               ids=placeholders(len(dirty_rounds))),
                          (*state_params, *result_params, when, ns,
                           *[r.task_id for r in dirty_rounds]))
    retasked = [pair for b in books for pair in b.retasked.items()]
    if retasked:
        task_sql, task_params = _cases(retasked)
        await cur.execute(RETASK.format(task=task_sql, ids=placeholders(len(retasked))),
                          (*task_params, ns, *[a for a, _ in retasked]))
    finished = [s.advance_id for s in dirty_states
                if s.state not in OPEN and s.advance_state in ("PENDING", "LEASED")]
    if finished:
        await cur.execute(FINISH_ADVANCES.format(ids=placeholders(len(finished))),
                          (when, ns, *finished))


async def rearm(cur: Any, ns: bytes, books: Sequence[Book]) -> None:
    """Re-arm the POLL advances of queries now WAITING (after the handled rows were marked
    DONE): the same row back to PENDING, due at the next round's time."""
    armed = [(s.advance_id, to_db(s.arm_at)) for b in books for s in b.states.values()
             if s.state == WAITING and s.arm_at is not None and s.advance_id]
    if armed:
        due_sql, params = _cases(armed)
        await cur.execute(REARM.format(due=due_sql, ids=placeholders(len(armed))),
                          (*params, ns, *[a for a, _ in armed]))


# --- reads (the API) ----------------------------------------------------------------------------

READ_STATE = ("SELECT * FROM weave_poll_states WHERE namespace_id = %s AND instance_id = %s"
              " AND step_id = %s")
READ_ROUNDS = ("SELECT r.round, r.activation_id, r.task_id, r.state, r.result, r.created_at,"
               " r.ended_at, t.state AS task_state FROM weave_poll_rounds r"
               " LEFT JOIN pulse_tasks t ON t.namespace_id = r.namespace_id AND t.id = r.task_id"
               " WHERE r.namespace_id = %s AND r.instance_id = %s AND r.step_id = %s"
               " AND r.round > %s ORDER BY r.round, r.created_at, r.task_id LIMIT %s")
# Every row of one round (a round continued in a new activation has one row per activation).
READ_ROUND = ("SELECT r.round, r.activation_id, r.task_id, r.state, r.result, r.created_at,"
              " r.ended_at, t.state AS task_state FROM weave_poll_rounds r"
              " LEFT JOIN pulse_tasks t ON t.namespace_id = r.namespace_id AND t.id = r.task_id"
              " WHERE r.namespace_id = %s AND r.instance_id = %s AND r.step_id = %s"
              " AND r.round = %s ORDER BY r.created_at, r.task_id")
READ_STATES = ("SELECT * FROM weave_poll_states WHERE namespace_id = %s"
               " AND instance_id = %s")


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


def state_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A query's public state (the instance detail's step and the rounds route)."""
    return {"state": row["state"], "used_rounds": row["used_rounds"],
            "max_rounds": row["max_rounds"], "granted_rounds": row["granted_rounds"],
            "next_interval_ms": row["next_interval_ms"],
            "next_round_at": _iso(row["next_round_at"]), "deadline_at": _iso(row["deadline_at"]),
            "continued_deadline_at": _iso(row["continued_deadline_at"]),
            "first_round": row["first_round"],
            "first_round_attempts_used": row["first_round_attempts_used"],
            "activation_id": row["activation_id"].hex()}


async def states_of(cur: Any, ns: bytes, instance_id: bytes) -> dict[bytes, dict[str, Any]]:
    """Each POLL step's public state, by step id."""
    await cur.execute(READ_STATES, (ns, instance_id))
    return {r["step_id"]: state_view(r) for r in await cur.fetchall()}


async def rounds_of(cur: Any, ns: bytes, instance_id: bytes, step_id: bytes, *, after: int,
                    limit: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A POLL step's public state (None: not a POLL step that was entered) and its rounds
    numbered after ``after``, in order, ``limit`` rows or a few more. Rounds are numbered
    across the step's activations, so the round number orders them; a round continued in a new
    activation (wait_recovery.py) has a row per activation, and a page never splits a round:
    it ends with every row of its last round."""
    await cur.execute(READ_STATE, (ns, instance_id, step_id))
    row = await cur.fetchone()
    if row is None:
        return None, []
    await cur.execute(READ_ROUNDS, (ns, instance_id, step_id, after, limit))
    found = list(await cur.fetchall())
    if len(found) == limit:
        last = found[-1]["round"]
        await cur.execute(READ_ROUND, (ns, instance_id, step_id, last))
        found = [r for r in found if r["round"] != last] + list(await cur.fetchall())
    rounds = [{
        "round": r["round"], "activation_id": r["activation_id"].hex(),
        "task_id": r["task_id"].hex(), "state": r["state"], "task_state": r["task_state"],
        "result": jsondoc.RawJson(r["result"]) if r["result"] is not None else None,
        "created_at": _iso(r["created_at"]), "ended_at": _iso(r["ended_at"]),
    } for r in found]
    return state_view(row), rounds

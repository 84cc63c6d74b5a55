"""Workflow signals (docs/weave/waits.md § 信号（SIGNAL）, docs/api/workflows.md § 信号):
acceptance, history reads, and the engine's part of SIGNAL waits.

Acceptance (000 §5 "信号受理") is one short transaction, like a task submission: the credential's
``workflows.signal`` in the namespace (namespace-wide: a grant on every queue), the idempotency
identity (a replay returns the original receipt, another request under the same key is
``idempotency_conflict``), the target instance (by id, or by definition and business key: the
one RUNNING instance with that key), and the signal row (PENDING, available at once) with its
``workflow.signal.accepted`` event. Nothing is matched then: a signal is durable whether or not
its wait exists yet, and the engine consumes it.
A finished target instance is ``409 workflow_instance_finished`` and writes nothing; a payload
version no step accepts, or a name no step waits for, is decided by the engine
(``payload_version`` / ``unknown_signal`` dispositions: the instance's pinned version is the
engine's to read, acceptance stays cheap).

Consumption (000 §5 "信号消费") happens in the instance's advance transaction
(``engine.py``): a SIGNAL step entered opens its wait (:class:`Wait`) and at once takes the
oldest PENDING or LEASED signal of the instance that matches it (name, correlation bytes, an
accepted payload version, not expired); a signal the engine leased (third work source of a round,
``leasing.lease_signals``) takes the open wait it matches. The winner is recorded once
(``weave_waits.winner_signal_id`` is unique, a wait has one such column), the step SUCCEEDS with
``{"signal_id", "payload", "payload_version", "accepted_at"}``, the signal is CONSUMED with its
wait, target activation sequence, disposition ``consumed`` and a ``workflow.signal.consumed``
event. A signal that can never win is REJECTED with a disposition (:data:`DISPOSITIONS`); one
whose wait may still come stays PENDING, ``available_at`` backed off (never past and never
moving ``expires_at``), until it expires. At most :data:`REJECT_BATCH` signals are resolved by
one transaction's sweep of an ended instance; the rest are leased and rejected later.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids, jsondoc
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.events import EventRecord, append_event, append_events
from orbit_common.platform.idempotency import Replay
from orbit_common.weave import expressions, instances, language, types

NAME_MAX = 64  # a signal name is an identifier (types.IDENTIFIER_RULE), as a SIGNAL step's
CORRELATION_MAX_BYTES = 512
PAYLOAD_MAX_BYTES = 256 * 1024
EVIDENCE_MAX = 512
PAYLOAD_VERSION_MAX = language.MAX_PAYLOAD_VERSION
EXPIRY_DEFAULT_MS = 7 * 24 * 3600 * 1000
EXPIRY_MIN_MS = 1000
EXPIRY_MAX_MS = language.MAX_WAIT_MS
LIST_MAX = 100
REJECT_BATCH = 32
BACKOFF_FIRST_MS = 1000
BACKOFF_MAX_MS = 60_000
AGGREGATE = "workflow_signal"

CONSUMED = "consumed"
PAYLOAD_VERSION = "payload_version"
INSTANCE_FINISHED = "instance_finished"
CORRELATION_MISMATCH = "correlation_mismatch"
WAIT_CLOSED = "wait_closed"
UNKNOWN_SIGNAL = "unknown_signal"
EXPIRED = "expired"
DISPOSITIONS = (CONSUMED, PAYLOAD_VERSION, INSTANCE_FINISHED, CORRELATION_MISMATCH, WAIT_CLOSED,
                UNKNOWN_SIGNAL, EXPIRED)
STATES = ("PENDING", "LEASED", "CONSUMED", "REJECTED")
SIGNAL_TIMEOUT = "signal_timeout"


class SignalNotFound(errors.NotFound):
    code = "workflow_signal_not_found"
    title = "Workflow signal not found"


class InstanceFinished(errors.Conflict):
    code = "workflow_instance_finished"
    title = "The workflow instance has finished"


class InstanceAmbiguous(errors.Conflict):
    code = "workflow_instance_ambiguous"
    title = "More than one running workflow instance has this business key"


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


def key_text(raw: bytes) -> str:
    """A correlation key as text: its UTF-8 (every accepted key is UTF-8)."""
    return bytes(raw).decode("utf-8", errors="replace")


def signal_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"].hex(), "workflow_id": row["instance_id"].hex(), "name": row["name"],
        "correlation_key": key_text(row["correlation_key"]),
        "payload": jsondoc.RawJson(row["payload"]), "payload_version": row["payload_version"],
        "evidence_ref": row["evidence_ref"], "state": row["state"],
        "disposition": row["disposition"],
        "wait_id": row["wait_id"].hex() if row["wait_id"] else None,
        "target_activation_sequence": row["target_activation_sequence"],
        "accepted_at": _iso(row["accepted_at"]), "expires_at": _iso(row["expires_at"]),
        "resolved_at": _iso(row["resolved_at"]),
    }


# --- acceptance ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SignalRequest:
    """A checked signal (:meth:`check`): the route and the SDK-facing domain share it."""

    name: str
    correlation_key: bytes
    payload_text: str
    payload_version: int
    evidence_ref: str | None
    expires_in_ms: int

    @classmethod
    def check(cls, *, name: Any, correlation_key: Any, payload_text: str,
              payload_version: Any, evidence_ref: Any, expires_in_ms: Any,
              problems: list[dict[str, str]] | None = None) -> SignalRequest:
        found = [] if problems is None else problems
        if not types.is_identifier(name):
            found.append({"path": "$.name", "message": types.IDENTIFIER_RULE})
        key = b""
        if correlation_key is not None:
            if not isinstance(correlation_key, str):
                found.append({"path": "$.correlation_key", "message": "a string"})
            else:
                key = correlation_key.encode("utf-8", errors="surrogatepass")
                if len(key) > CORRELATION_MAX_BYTES:
                    found.append({"path": "$.correlation_key",
                                  "message": f"at most {CORRELATION_MAX_BYTES} bytes of UTF-8"})
        if len(payload_text.encode()) > PAYLOAD_MAX_BYTES:
            found.append({"path": "$.payload", "message": f"at most {PAYLOAD_MAX_BYTES} bytes"})
        if (isinstance(payload_version, bool) or not isinstance(payload_version, int)
                or not 1 <= payload_version <= PAYLOAD_VERSION_MAX):
            found.append({"path": "$.payload_version",
                          "message": f"an integer from 1 to {PAYLOAD_VERSION_MAX}"})
        if evidence_ref is not None and (not isinstance(evidence_ref, str)
                                         or not 1 <= len(evidence_ref) <= EVIDENCE_MAX):
            found.append({"path": "$.evidence_ref",
                          "message": f"a string of 1-{EVIDENCE_MAX} characters"})
        expiry = EXPIRY_DEFAULT_MS if expires_in_ms is None else expires_in_ms
        if (isinstance(expiry, bool) or not isinstance(expiry, int)
                or not EXPIRY_MIN_MS <= expiry <= EXPIRY_MAX_MS):
            found.append({"path": "$.expires_in_ms",
                          "message": f"an integer from {EXPIRY_MIN_MS} to {EXPIRY_MAX_MS}"})
        if found:
            raise errors.ValidationFailed(found)
        return cls(name=name, correlation_key=key, payload_text=payload_text,
                   payload_version=payload_version, evidence_ref=evidence_ref,
                   expires_in_ms=expiry)

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "correlation_key": self.correlation_key.hex(),
                "payload": self.payload_text, "payload_version": self.payload_version,
                "evidence_ref": self.evidence_ref, "expires_in_ms": self.expires_in_ms}


@attrs.frozen(kw_only=True)
class Target:
    """The instance a signal goes to: its id, or a definition and a business key."""

    instance_id: bytes | None = None
    definition: str | None = None
    business_key: bytes | None = None

    def identity(self) -> dict[str, Any]:
        if self.instance_id is not None:
            return {"workflow_id": self.instance_id.hex()}
        return {"definition": self.definition,
                "business_key": (self.business_key or b"").hex()}


INSTANCE_STATE = "SELECT id, state FROM weave_instances WHERE namespace_id = %s AND id = %s"
BY_BUSINESS_KEY = (
    "SELECT i.id, i.state FROM weave_definitions d JOIN weave_instances i"
    " FORCE INDEX (ix_weave_instances_business_key) ON i.namespace_id = d.namespace_id"
    " AND i.business_key = %s AND i.definition_id = d.id"
    " WHERE d.namespace_id = %s AND d.name = %s ORDER BY i.created_at DESC, i.id DESC LIMIT 100"
)
INSERT_SIGNAL = (
    "INSERT INTO weave_signals (namespace_id, id, instance_id, name, correlation_key, payload,"
    " payload_version, state, evidence_ref, expires_at, available_at, accepted_by_credential_id,"
    " accepted_at) VALUES (%s, %s, %s, %s, %s, %s, %s, 'PENDING', %s, %s, %s, %s, %s)"
)


async def _target(cur: Any, namespace_id: bytes, target: Target) -> bytes:
    """The target instance's id; 404 when there is none, 409 when it has finished or (by
    business key) more than one RUNNING instance has the key."""
    if target.instance_id is not None:
        await cur.execute(INSTANCE_STATE, (namespace_id, target.instance_id))
        rows = [dict(r) for r in await cur.fetchall()]
    else:
        await cur.execute(BY_BUSINESS_KEY, (target.business_key, namespace_id,
                                            target.definition))
        rows = [dict(r) for r in await cur.fetchall()]
    if not rows:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")
    running = [r for r in rows if r["state"] == "RUNNING"]
    if len(running) > 1:
        raise InstanceAmbiguous(f"{len(running)} running instances have this business key;"
                                " signal one by its id")
    if not running:
        raise InstanceFinished(f"workflow instance {rows[0]['id'].hex()} is {rows[0]['state']}")
    found: bytes = running[0]["id"]
    return found


async def send_signal(db: Database, principal: credentials.Principal, *, namespace: str,
                      target: Target, signal: SignalRequest,
                      idempotency_key: str | None = None) -> Replay:
    """Accept one signal (see the module docstring); 201 with its receipt."""
    signal_id = ids.new_id()
    idem = namespaced.request("workflows.signals.send", idempotency_key, b"signal",
                              {**target.identity(), **signal.identity()}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        instance_id = await _target(cur, namespace_id, target)
        now = await db_now(cur)
        expires = now + dt.timedelta(milliseconds=signal.expires_in_ms)
        await cur.execute(INSERT_SIGNAL, (
            namespace_id, signal_id, instance_id, signal.name, signal.correlation_key,
            signal.payload_text, signal.payload_version, signal.evidence_ref, to_db(expires),
            to_db(now), principal.credential_id, to_db(now)))
        await append_event(cur, namespace_id=namespace_id, aggregate_type=AGGREGATE,
                           aggregate_id=signal_id, aggregate_revision=1,
                           event_type="workflow.signal.accepted", from_state=None,
                           to_state="PENDING",
                           payload={"workflow_id": instance_id.hex(), "name": signal.name,
                                    "payload_version": signal.payload_version})
        row = {"id": signal_id, "instance_id": instance_id, "name": signal.name,
               "correlation_key": signal.correlation_key, "payload": signal.payload_text,
               "payload_version": signal.payload_version, "evidence_ref": signal.evidence_ref,
               "state": "PENDING", "disposition": None, "wait_id": None,
               "target_activation_sequence": None, "accepted_at": now, "expires_at": expires,
               "resolved_at": None}
        return 201, signal_view(row), signal_id

    return await namespaced.run(db, "workflows.signals.send", principal=principal,
                                action=authz.Action.WORKFLOWS_SIGNAL, namespace=namespace,
                                idem=idem, act=act)


# --- reads --------------------------------------------------------------------------------------


SIGNAL_COLUMNS = ("id, instance_id, name, correlation_key, payload, payload_version,"
                  " evidence_ref, state, disposition, wait_id, target_activation_sequence,"
                  " accepted_at, expires_at, resolved_at")


def _instance_id(text: str) -> bytes:
    try:
        return ids.from_hex(text)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc


async def _exists(cur: Any, namespace_id: bytes, instance_id: bytes) -> None:
    await cur.execute(INSTANCE_STATE, (namespace_id, instance_id))
    if await cur.fetchone() is None:
        raise instances.InstanceNotFound("no such workflow instance in this namespace")


async def list_signals(db: Database, principal: credentials.Principal, *, namespace: str,
                       instance_id: str, limit: int = LIST_MAX,
                       cursor: str | None = None) -> cursors.Page:
    """An instance's signals newest first (accepted_at, id), cursor-paged
    (``ix_weave_signals_history``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_MAX:
        raise errors.ValidationFailed([{"path": "limit", "message": f"1-{LIST_MAX}"}])
    raw_id = _instance_id(instance_id)
    filters = {"namespace": namespace, "workflow_id": raw_id.hex()}
    position = (cursors.time_position(cursors.decode(cursor, "workflow_signals", filters))
                if cursor else None)

    async def body(cur: Any) -> cursors.Page:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await history(cur, ns.id, raw_id, limit, position, filters)

    return await db.read("workflows.signals.list", body)


async def history(cur: Any, namespace_id: bytes, instance_id: bytes, limit: int,  # noqa: PLR0917
                  position: tuple[dt.datetime, bytes] | None,
                  filters: dict[str, Any]) -> cursors.Page:
    """One page of an instance's signals from ``position`` (None: the newest); the next cursor
    is bound to ``filters``."""
    await _exists(cur, namespace_id, instance_id)
    where = "namespace_id = %s AND instance_id = %s"
    params: list[Any] = [namespace_id, instance_id]
    if position is not None:
        where += " AND (accepted_at < %s OR (accepted_at = %s AND id < %s))"
        params += [to_db(position[0]), to_db(position[0]), position[1]]
    await cur.execute(f"SELECT {SIGNAL_COLUMNS} FROM weave_signals"
                      " FORCE INDEX (ix_weave_signals_history)"
                      f" WHERE {where} ORDER BY accepted_at DESC, id DESC LIMIT %s",
                      (*params, limit + 1))
    rows = [dict(r) for r in await cur.fetchall()]
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        next_cursor = cursors.encode("workflow_signals", filters, [
            as_utc(rows[-1]["accepted_at"]).isoformat(), rows[-1]["id"].hex()])
    return cursors.Page(items=[signal_view(r) for r in rows], next_cursor=next_cursor)


async def detail(cur: Any, namespace_id: bytes, instance_id: bytes,
                 signal_id: bytes | None) -> dict[str, Any]:
    """One signal of an instance; ``InstanceNotFound`` / ``SignalNotFound``."""
    await _exists(cur, namespace_id, instance_id)
    if signal_id is None:
        raise SignalNotFound("no such signal of this workflow instance")
    await cur.execute(f"SELECT {SIGNAL_COLUMNS} FROM weave_signals WHERE namespace_id = %s"
                      " AND id = %s AND instance_id = %s", (namespace_id, signal_id, instance_id))
    row = await cur.fetchone()
    if row is None:
        raise SignalNotFound("no such signal of this workflow instance")
    return signal_view(dict(row))


def _signal_id(text: str) -> bytes | None:
    try:
        return ids.from_hex(text)
    except ValueError:
        return None


async def get_signal(db: Database, principal: credentials.Principal, *, namespace: str,
                     instance_id: str, signal_id: str) -> dict[str, Any]:
    raw_id = _instance_id(instance_id)
    raw_signal = _signal_id(signal_id)

    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await detail(cur, ns.id, raw_id, raw_signal)

    return await db.read("workflows.signals.get", body)


async def operator_signals(db: Database, *, namespace: str, instance_id: str,
                           limit: int = LIST_MAX) -> cursors.Page:
    """``orbit admin workflows signals list``: an instance's newest signals, by the operator
    (the database credentials; no grant)."""
    from orbit_common.weave import operator  # noqa: PLC0415 - operator imports the views

    raw_id = _instance_id(instance_id)

    async def body(cur: Any) -> cursors.Page:
        ns = await operator.namespace_of(cur, namespace)
        return await history(cur, ns.id, raw_id, limit, None,
                             {"namespace": namespace, "workflow_id": raw_id.hex()})

    return await db.read("weave.operator.signals", body)


async def operator_signal(db: Database, *, namespace: str, instance_id: str,
                          signal_id: str) -> dict[str, Any]:
    """``orbit admin workflows signals get``: one signal of an instance, by the operator."""
    from orbit_common.weave import operator  # noqa: PLC0415 - operator imports the views

    raw_id = _instance_id(instance_id)
    raw_signal = _signal_id(signal_id)

    async def body(cur: Any) -> dict[str, Any]:
        ns = await operator.namespace_of(cur, namespace)
        return await detail(cur, ns.id, raw_id, raw_signal)

    return await db.read("weave.operator.signal", body)


# --- the engine's part --------------------------------------------------------------------------


@attrs.define
class Wait:
    """A SIGNAL wait of an instance (a ``weave_waits`` row of kind SIGNAL)."""

    id: bytes
    step_id: bytes
    activation_id: bytes
    sequence: int
    name: str
    key: bytes
    versions: tuple[int, ...]
    deadline_at: dt.datetime | None
    state: str
    created_at: dt.datetime
    winner: bytes | None = None
    fired_at: dt.datetime | None = None
    late_ms: int | None = None
    new: bool = False
    dirty: bool = False

    def matches(self, signal: Signal) -> bool:
        return (signal.name == self.name and signal.key == self.key
                and signal.version in self.versions)


@attrs.define
class Signal:
    """A PENDING or LEASED signal of an instance, and what this advance decides for it."""

    id: bytes
    name: str
    key: bytes
    payload: str
    version: int
    accepted_at: dt.datetime
    expires_at: dt.datetime
    checks: int
    leased: bool = False  # leased by this round and fenced: this advance must decide it
    disposition: str | None = None
    wait: Wait | None = None
    retry_at: dt.datetime | None = None

    @property
    def resolved(self) -> bool:
        return self.disposition is not None

    def result(self) -> dict[str, Any]:
        return {"signal_id": self.id.hex(), "payload": jsondoc.loads_strict(self.payload),
                "payload_version": self.version,
                "accepted_at": as_utc(self.accepted_at).isoformat(timespec="microseconds")}


@attrs.define
class Book:
    """An instance's SIGNAL waits and unresolved signals during one advance, and the pending
    advances it adds, finishes or re-arms."""

    now: dt.datetime
    waits: dict[bytes, Wait] = attrs.field(factory=dict)  # by activation id
    signals: list[Signal] = attrs.field(factory=list)  # oldest first
    advances: list[tuple[bytes, bytes, dt.datetime]] = attrs.field(factory=list)
    done_steps: set[bytes] = attrs.field(factory=set)
    rearm: list[tuple[bytes, dt.datetime]] = attrs.field(factory=list)  # (row id, due at)

    def open_wait(self, step_id: bytes, activation_id: bytes, *, name: str, key: bytes,
                  versions: tuple[int, ...], timeout_ms: int | None) -> Wait:
        deadline = (None if timeout_ms is None
                    else self.now + dt.timedelta(milliseconds=timeout_ms))
        wait = Wait(id=ids.new_id(), step_id=step_id, activation_id=activation_id, sequence=1,
                    name=name, key=key, versions=versions, deadline_at=deadline,
                    state="WAITING", created_at=self.now, new=True)
        self.waits[activation_id] = wait
        if deadline is not None:
            self.advances.append((step_id, activation_id, deadline))
        return wait

    def take(self, wait: Wait) -> Signal | None:
        """The oldest unresolved signal that matches ``wait`` and has not expired."""
        for signal in self.signals:
            if not signal.resolved and signal.expires_at > self.now and wait.matches(signal):
                return signal
        return None

    def win(self, wait: Wait, signal: Signal) -> None:
        wait.state = "SIGNALLED"
        wait.winner = signal.id
        wait.fired_at = self.now
        wait.dirty = True
        signal.disposition = CONSUMED
        signal.wait = wait
        self.done_steps.add(wait.step_id)

    def time_out(self, wait: Wait) -> None:
        wait.state = "TIMED_OUT"
        wait.fired_at = self.now
        if wait.deadline_at is not None:
            wait.late_ms = max(0, int((self.now - wait.deadline_at) / dt.timedelta(
                milliseconds=1)))
        wait.dirty = True

    def later(self, signal: Signal) -> None:
        """No wait for it yet: back off, never past (and never moving) its expiry."""
        delay = min(BACKOFF_FIRST_MS * 2 ** min(signal.checks, 16), BACKOFF_MAX_MS)
        signal.retry_at = min(self.now + dt.timedelta(milliseconds=delay), signal.expires_at)


def correlation_of(value: Any) -> bytes:
    """A SIGNAL step's correlation key from its expression's value."""
    if not isinstance(value, str):
        raise expressions.ExpressionError("the correlation is not a string")
    raw = value.encode("utf-8", errors="surrogatepass")
    if len(raw) > CORRELATION_MAX_BYTES:
        raise expressions.ExpressionError(
            f"the correlation key is {len(raw)} bytes; at most {CORRELATION_MAX_BYTES}")
    return raw


SIGNAL_FENCE = ("SELECT * FROM weave_signals WHERE namespace_id = %s AND id IN ({ids})"
                " ORDER BY accepted_at, id FOR UPDATE")
LOAD_WAITS = ("SELECT w.*, a.sequence FROM weave_waits w JOIN weave_activations a"
              " ON a.namespace_id = w.namespace_id AND a.id = w.activation_id"
              " WHERE w.namespace_id = %s AND w.instance_id IN ({ids}) AND w.kind = 'SIGNAL'"
              " AND w.state = 'WAITING'")
LOAD_SIGNALS = ("SELECT id, instance_id, name, correlation_key, payload, payload_version,"
                " accepted_at, expires_at, checks FROM weave_signals"
                " FORCE INDEX (ix_weave_signals_match) WHERE namespace_id = %s"
                " AND instance_id IN ({ids}) AND state IN ('PENDING', 'LEASED')"
                " ORDER BY accepted_at, id FOR UPDATE")


async def fence(cur: Any, namespace_id: bytes, leased: Sequence[dict[str, Any]],
                owner: str) -> list[dict[str, Any]]:
    """The signals of ``leased`` this owner still holds (LEASED at the attempts this round
    leased them at), locked, oldest first."""
    if not leased:
        return []
    attempts = {r["id"]: r["attempts"] for r in leased}
    await cur.execute(SIGNAL_FENCE.format(ids=placeholders(len(attempts))),
                      (namespace_id, *attempts))
    return [dict(r) for r in await cur.fetchall()
            if r["state"] == "LEASED" and r["lease_owner"] == owner
            and r["attempts"] == attempts[r["id"]]]


async def load(cur: Any, namespace_id: bytes, instance_ids: Iterable[bytes], now: dt.datetime,
               leased: Iterable[bytes] = ()) -> dict[bytes, Book]:
    """Each instance's open SIGNAL waits and its PENDING / LEASED signals, locked (after the
    instance rows: the lock order of an advance). ``leased``: the fenced signal ids this round
    holds."""
    wanted = sorted(set(instance_ids))
    books = {i: Book(now=now) for i in wanted}
    if not wanted:
        return books
    marks = placeholders(len(wanted))
    await cur.execute(LOAD_WAITS.format(ids=marks), (namespace_id, *wanted))
    for r in await cur.fetchall():
        books[r["instance_id"]].waits[r["activation_id"]] = Wait(
            id=r["id"], step_id=r["step_id"], activation_id=r["activation_id"],
            sequence=r["sequence"], name=r["signal_name"], key=bytes(r["correlation_key"]),
            versions=tuple(jsondoc.loads_strict(r["payload_versions"])),
            deadline_at=None if r["deadline_at"] is None else as_utc(r["deadline_at"]),
            state=r["state"], created_at=as_utc(r["created_at"]))
    held = set(leased)
    await cur.execute(LOAD_SIGNALS.format(ids=marks), (namespace_id, *wanted))
    for r in await cur.fetchall():
        books[r["instance_id"]].signals.append(Signal(
            id=r["id"], name=r["name"], key=bytes(r["correlation_key"]), payload=r["payload"],
            version=r["payload_version"], accepted_at=as_utc(r["accepted_at"]),
            expires_at=as_utc(r["expires_at"]), checks=r["checks"], leased=r["id"] in held))
    return books


def sweep(books: Iterable[tuple[Book, bool]]) -> None:
    """Signals of instances that ended in this advance: ``instance_finished``, at most
    :data:`REJECT_BATCH` per transaction together with the leased ones it decided (the rest
    are leased and rejected by later rounds)."""
    pairs = list(books)
    budget = REJECT_BATCH - sum(1 for book, _ in pairs for s in book.signals
                                if s.leased and s.disposition not in (None, CONSUMED))
    for book, ended in pairs:
        if not ended:
            continue
        for signal in book.signals:
            if budget <= 0:
                return
            if not signal.resolved and not signal.leased:
                signal.disposition = INSTANCE_FINISHED
                budget -= 1


INSERT_WAITS = ("INSERT INTO weave_waits (namespace_id, id, instance_id, step_id, activation_id,"
                " kind, generation, signal_name, correlation_key, payload_versions,"
                " first_deadline_at, deadline_at, state, winner_signal_id, fired_at, late_ms,"
                " created_at, updated_at)")
WAIT_ROW = "(%s, %s, %s, %s, %s, 'SIGNAL', 1, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
UPDATE_WAITS = ("UPDATE weave_waits SET state = CASE id {state} END,"
                " winner_signal_id = CASE id {winner} END, fired_at = CASE id {fired} END,"
                " late_ms = CASE id {late} END, updated_at = %s"
                " WHERE namespace_id = %s AND id IN ({ids})")
INSERT_ADVANCES = ("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id,"
                   " activation_id, kind, state, due_at, created_at)")
ADVANCE_ROW = "(%s, %s, %s, %s, %s, 'SIGNAL', 'PENDING', %s, %s)"
FINISH_ADVANCES = ("UPDATE weave_pending_advances SET state = 'DONE', done_at = %s,"
                   " lease_owner = NULL, lease_expires_at = NULL WHERE namespace_id = %s"
                   " AND instance_id IN ({instances}) AND step_id IN ({steps})"
                   " AND kind = 'SIGNAL' AND state <> 'DONE'")
REARM = ("UPDATE weave_pending_advances SET state = 'PENDING', due_at = CASE id {due} END,"
         " done_at = NULL, lease_owner = NULL, lease_expires_at = NULL"
         " WHERE namespace_id = %s AND id IN ({ids})")
RESOLVE = ("UPDATE weave_signals SET state = CASE id {state} END,"
           " disposition = CASE id {disposition} END, wait_id = CASE id {wait} END,"
           " target_activation_sequence = CASE id {sequence} END, resolved_at = %s,"
           " lease_owner = NULL, lease_expires_at = NULL"
           " WHERE namespace_id = %s AND id IN ({ids})")
LATER = ("UPDATE weave_signals SET state = 'PENDING', checks = checks + 1,"
         " available_at = CASE id {available} END, lease_owner = NULL, lease_expires_at = NULL"
         " WHERE namespace_id = %s AND id IN ({ids})")


def _cases(rows: Sequence[tuple[bytes, Any]]) -> tuple[str, list[Any]]:
    return " ".join("WHEN %s THEN %s" for _ in rows), [v for row in rows for v in row]


async def _case_update(cur: Any, sql: str, columns: dict[str, list[tuple[bytes, Any]]],
                       head: Sequence[Any], row_ids: Sequence[bytes]) -> None:
    texts: dict[str, str] = {}
    params: list[Any] = []
    for name, rows in columns.items():
        texts[name], found = _cases(rows)
        params += found
    await cur.execute(sql.format(**texts, ids=placeholders(len(row_ids))),
                      (*params, *head, *row_ids))


async def write(cur: Any, namespace_id: bytes, books: Sequence[tuple[bytes, Book]],
                now: dt.datetime) -> None:
    """The batch's SIGNAL waits, their pending advances and its decided signals (one statement
    per table and kind of change), with an event for each resolved signal. Called after the
    advance's steps are written and its leased rows consumed (a re-armed early timeout goes back
    to PENDING after the consume marked it DONE)."""
    when = to_db(now)
    new_waits, changed = [], []
    for instance_id, book in books:
        for w in book.waits.values():
            if w.new:
                new_waits.append((namespace_id, w.id, instance_id, w.step_id, w.activation_id,
                                  w.name, w.key, jsondoc.dumps(list(w.versions)),
                                  _db(w.deadline_at), _db(w.deadline_at), w.state, w.winner,
                                  _db(w.fired_at), w.late_ms, when, when))
            elif w.dirty:
                changed.append(w)
    if new_waits:
        sql, params = multi_insert(INSERT_WAITS, WAIT_ROW, new_waits)
        await cur.execute(sql, params)
    if changed:
        await _case_update(cur, UPDATE_WAITS, {
            "state": [(w.id, w.state) for w in changed],
            "winner": [(w.id, w.winner) for w in changed],
            "fired": [(w.id, _db(w.fired_at)) for w in changed],
            "late": [(w.id, w.late_ms) for w in changed],
        }, (when, namespace_id), [w.id for w in changed])
    new_advances = [(namespace_id, ids.new_id(), instance_id, step_id, activation_id,
                     to_db(due), when)
                    for instance_id, book in books for step_id, activation_id, due in
                    book.advances
                    if book.waits[activation_id].state == "WAITING"]
    if new_advances:
        sql, params = multi_insert(INSERT_ADVANCES, ADVANCE_ROW, new_advances)
        await cur.execute(sql, params)
    finished = [(instance_id, step_id) for instance_id, book in books
                for step_id in sorted(book.done_steps)]
    if finished:
        await cur.execute(FINISH_ADVANCES.format(
            instances=placeholders(len({i for i, _ in finished})),
            steps=placeholders(len(finished))),
            (when, namespace_id, *sorted({i for i, _ in finished}),
             *[s for _, s in finished]))
    rearm = [(row_id, to_db(due)) for _, book in books for row_id, due in book.rearm]
    if rearm:
        await _case_update(cur, REARM, {"due": rearm}, (namespace_id,), [r for r, _ in rearm])
    await _write_signals(cur, namespace_id, books, now)


async def _write_signals(cur: Any, namespace_id: bytes, books: Sequence[tuple[bytes, Book]],
                         now: dt.datetime) -> None:
    resolved = [(instance_id, s) for instance_id, book in books for s in book.signals
                if s.resolved]
    later = [s for _, book in books for s in book.signals
             if not s.resolved and s.retry_at is not None]
    when = to_db(now)
    if resolved:
        await _case_update(cur, RESOLVE, {
            "state": [(s.id, "CONSUMED" if s.disposition == CONSUMED else "REJECTED")
                      for _, s in resolved],
            "disposition": [(s.id, s.disposition) for _, s in resolved],
            "wait": [(s.id, s.wait.id if s.wait else None) for _, s in resolved],
            "sequence": [(s.id, s.wait.sequence if s.wait else None) for _, s in resolved],
        }, (when, namespace_id), [s.id for _, s in resolved])
        await append_events(cur, [EventRecord(
            namespace_id=namespace_id, id=ids.new_id(), aggregate_type=AGGREGATE,
            aggregate_id=s.id, aggregate_revision=2,
            event_type=("workflow.signal.consumed" if s.disposition == CONSUMED
                        else "workflow.signal.rejected"),
            from_state="PENDING",
            to_state="CONSUMED" if s.disposition == CONSUMED else "REJECTED",
            payload={"workflow_id": instance_id.hex(), "disposition": s.disposition,
                     "wait_id": s.wait.id.hex() if s.wait else None,
                     "target_activation_sequence": s.wait.sequence if s.wait else None})
            for instance_id, s in resolved])
    if later:
        await _case_update(cur, LATER, {
            "available": [(s.id, to_db(s.retry_at)) for s in later if s.retry_at is not None],
        }, (namespace_id,), [s.id for s in later])


def _db(value: dt.datetime | None) -> Any:
    return None if value is None else to_db(value)


# Signals leased for an instance that is gone or not RUNNING (no advance of it loads a book).
async def reject_orphans(cur: Any, namespace_id: bytes, rows: Sequence[dict[str, Any]],
                         now: dt.datetime) -> None:
    """Leased signals whose instance is not RUNNING: ``instance_finished``."""
    books = []
    for r in rows:
        signal = Signal(id=r["id"], name=r["name"], key=bytes(r["correlation_key"]),
                        payload=r["payload"], version=r["payload_version"],
                        accepted_at=as_utc(r["accepted_at"]),
                        expires_at=as_utc(r["expires_at"]), checks=r["checks"], leased=True,
                        disposition=INSTANCE_FINISHED)
        books.append((r["instance_id"], Book(now=now, signals=[signal])))
    await _write_signals(cur, namespace_id, books, now)

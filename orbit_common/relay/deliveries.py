"""Deliveries: lease, acknowledge, fail, lapse recovery, extra budget, history, retention
protection.

State diagram (orbit_deliveries.state)::

    PENDING --lease--> LEASED --acknowledge--> ACKNOWLEDGED (final)
       ^                 |  \\--fail / lapse, budget left (backoff)--> PENDING
       |                 \\----fail / lapse, budget spent----------> EXHAUSTED
       \\---------------------- add budget (operator, audited) -------/

* A holder that sent nothing (an open endpoint circuit, a draining pump) may release its
  leases: back to PENDING after a delay, the attempt not counted (:func:`release`).
* A lease counts an attempt (``attempts_used + 1``) and hands out a fresh random token; only
  its SHA-256 is stored. Acknowledge and fail need that token and a live lease (database time);
  acknowledging again with the token that acknowledged is an idempotent success that changes
  nothing, so the backlog is decremented exactly once.
* ``orbit_subscriptions.backlog`` counts PENDING + LEASED deliveries: +1 per delivery created
  (fan-out) or given budget again, −1 when one is acknowledged or exhausted, in the same
  transaction as that change.
* Every attempt's end (acknowledged, failed, lapsed) is appended to orbit_delivery_attempts.

Lock order (docs/architecture.md): delivery rows (ascending id) before their subscription row,
which is taken last and held shortest (only its backlog changes). Fan-out takes the
subscription row and inserts *new* delivery rows only, so the two never wait on each other in a
cycle. Leasing and recovery use ``FOR UPDATE SKIP LOCKED`` over ix_deliveries_due and
ix_deliveries_lease. Isolation: READ COMMITTED.
"""

from __future__ import annotations

import datetime as dt
import hmac
import secrets
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert, placeholders
from orbit_common.db.clock import as_utc, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, digests, jsondoc
from orbit_common.platform import credentials, namespaced
from orbit_common.platform.audit import AuditRecord, append_audit
from orbit_common.platform.idempotency import Replay
from orbit_common.relay import model, payload, subscriptions
from orbit_common.relay.model import (
    DeliveryLeaseLost,
    DeliveryNotExhausted,
    DeliveryNotFound,
    DeliveryState,
    Kind,
    NotPullSubscription,
    SubscriptionNotActive,
    SubscriptionState,
)

LEASE_BATCH_MAX = 500
HISTORY_PAGE_MAX = 500
TIME_MAX = cursors.TIME_MAX
ID_MAX = b"\xff" * 16

COLUMNS = (
    "namespace_id, id, subscription_id, event_id, sequence, task_id, task_revision, state,"
    " attempts_used, max_attempts, available_at, lease_expires_at, lease_token_digest,"
    " last_status_code, last_error, last_duration_ms, created_at, updated_at,"
    " acknowledged_at, exhausted_at"
)


@attrs.frozen(kw_only=True)
class AttemptError:
    """Why an attempt failed: a webhook's status code (None: no response) and body, or a pull
    consumer's reason; the text is truncated to model.ERROR_MAX characters."""

    status_code: int | None = None
    body: str | None = None
    duration_ms: int | None = None


@attrs.frozen(kw_only=True)
class Leased:
    """One leased delivery: its token (shown to the holder only) and its payload."""

    delivery_id: bytes
    token: str = attrs.field(repr=False)
    attempt: int
    lease_expires_at: dt.datetime
    payload: dict[str, Any]


def token_digest(token: str) -> bytes:
    return digests.domain_digest("orbit.delivery.lease.v1", token.encode("utf-8"))


# --- lease --------------------------------------------------------------------------------------

SUBSCRIPTION = """
SELECT s.namespace_id, s.id, s.name, s.kind, s.state, s.lease_ms, n.name AS namespace_name
FROM orbit_subscriptions s JOIN orbit_namespaces n ON n.id = s.namespace_id
WHERE s.namespace_id = %s AND s.id = %s
"""
DUE = """
SELECT id FROM orbit_deliveries FORCE INDEX (ix_deliveries_due)
WHERE namespace_id = %s AND subscription_id = %s AND state = 'PENDING'
  AND available_at <= UTC_TIMESTAMP(6)
ORDER BY available_at, sequence LIMIT %s FOR UPDATE SKIP LOCKED
"""
# One statement for the whole batch: each row gets its own token digest (CASE over the ids,
# values only from driver parameters).
TAKE = """
UPDATE orbit_deliveries
SET state = 'LEASED', attempts_used = attempts_used + 1,
    lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
    lease_token_digest = CASE id {cases} END, updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id IN ({ids}) AND state = 'PENDING'
"""
LEASED_ROWS = """
SELECT d.id, d.subscription_id, d.event_id, d.sequence, d.task_id, d.task_revision,
       d.attempts_used, d.lease_expires_at, r.state, r.committed_at, r.snapshot,
       q.name AS queue_name
FROM orbit_deliveries d
JOIN orbit_result_events r ON r.namespace_id = d.namespace_id AND r.id = d.event_id
LEFT JOIN pulse_queues q ON q.namespace_id = r.namespace_id AND q.id = r.queue_id
WHERE d.namespace_id = %s AND d.id IN ({})
ORDER BY d.available_at, d.sequence
"""


async def lease(cur: Any, namespace_id: bytes, subscription_id: bytes, limit: int
                ) -> list[Leased]:
    """Lease up to ``limit`` due PENDING deliveries of an ACTIVE subscription, oldest due first
    (then by sequence), skipping rows another transaction holds."""
    if not 1 <= limit <= LEASE_BATCH_MAX:
        raise errors.ValidationFailed([{"path": "limit",
                                        "message": f"1 to {LEASE_BATCH_MAX}"}])
    await cur.execute(SUBSCRIPTION, (namespace_id, subscription_id))
    sub = await cur.fetchone()
    if sub is None:
        raise model.SubscriptionNotFound()
    if sub["state"] != SubscriptionState.ACTIVE:
        raise SubscriptionNotActive(f"subscription {sub['name']!r} is {sub['state']}")
    await cur.execute(DUE, (namespace_id, subscription_id, limit))
    chosen = [r["id"] for r in await cur.fetchall()]
    if not chosen:
        return []
    tokens = {delivery_id: secrets.token_urlsafe(32) for delivery_id in chosen}
    cases = " ".join("WHEN %s THEN %s" for _ in chosen)
    await cur.execute(TAKE.format(cases=cases, ids=placeholders(len(chosen))), (
        sub["lease_ms"] * 1000,
        *[v for d in chosen for v in (d, token_digest(tokens[d]))],
        namespace_id, *chosen))
    if cur.rowcount != len(chosen):
        raise errors.StaleRevision("a delivery changed under its lock")
    await cur.execute(LEASED_ROWS.format(placeholders(len(chosen))), (namespace_id, *chosen))
    return [
        Leased(delivery_id=r["id"], token=tokens[r["id"]], attempt=r["attempts_used"],
               lease_expires_at=as_utc(r["lease_expires_at"]),
               payload=payload.build(
                   delivery_id=r["id"], subscription_id=subscription_id,
                   subscription=sub["name"], namespace=sub["namespace_name"],
                   sequence=r["sequence"], event_id=r["event_id"], task_id=r["task_id"],
                   queue=r["queue_name"] or "", task_revision=r["task_revision"],
                   state=r["state"], committed_at=as_utc(r["committed_at"]),
                   attempt=r["attempts_used"], snapshot=r["snapshot"]))
        for r in await cur.fetchall()
    ]


# --- acknowledge, fail, lapse -------------------------------------------------------------------

LOCK_ONE = f"""
SELECT {COLUMNS}, (lease_expires_at > UTC_TIMESTAMP(6)) AS live FROM orbit_deliveries
WHERE namespace_id = %s AND id = %s AND subscription_id = %s FOR UPDATE
"""
LOCK_MANY = f"""
SELECT {COLUMNS}, (lease_expires_at > UTC_TIMESTAMP(6)) AS live FROM orbit_deliveries
WHERE namespace_id = %s AND subscription_id = %s AND id IN ({{}}) ORDER BY id FOR UPDATE
"""
# One statement for every acknowledgement of a batch (durations per row by CASE over the ids).
ACK = """
UPDATE orbit_deliveries SET state = 'ACKNOWLEDGED', acknowledged_at = UTC_TIMESTAMP(6),
  lease_expires_at = NULL, last_duration_ms = COALESCE(CASE id {cases} END, last_duration_ms),
  updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id IN ({ids}) AND state = 'LEASED'
"""
RETRY = """
UPDATE orbit_deliveries SET state = %s, lease_expires_at = NULL,
  lease_token_digest = NULL, available_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
  exhausted_at = IF(%s = 'EXHAUSTED', UTC_TIMESTAMP(6), exhausted_at),
  last_status_code = %s, last_error = %s, last_duration_ms = %s,
  updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id = %s AND state = 'LEASED'
"""
INSERT_LOG = (
    "INSERT INTO orbit_delivery_attempts (namespace_id, delivery_id, attempt, subscription_id,"
    " outcome, status_code, error, duration_ms, ended_at)"
)
LOG_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))"
BACKLOG = """
UPDATE orbit_subscriptions SET backlog = backlog + %s WHERE namespace_id = %s AND id = %s
"""
POLICY = """
SELECT id, backoff_initial_ms, backoff_max_ms FROM orbit_subscriptions
WHERE namespace_id = %s AND id IN ({})
"""


@attrs.frozen(kw_only=True)
class Settled:
    """The state a delivery is in after acknowledge or fail; ``repeated``: an acknowledgement
    that had already been recorded with the same token (nothing changed)."""

    delivery_id: bytes
    state: DeliveryState
    attempts_used: int
    repeated: bool = False


@attrs.frozen(kw_only=True)
class Report:
    """The end of one leased attempt, told by its holder: ``acknowledged`` (a consumer's
    acknowledgement, a webhook's 2xx) or failed with ``error``."""

    delivery_id: bytes
    token: str = attrs.field(repr=False)
    acknowledged: bool
    error: AttemptError = AttemptError()


async def _held(cur: Any, namespace_id: bytes, subscription_id: bytes, delivery_id: bytes
                ) -> dict[str, Any]:
    await cur.execute(LOCK_ONE, (namespace_id, delivery_id, subscription_id))
    row = await cur.fetchone()
    if row is None:
        raise DeliveryNotFound(f"no delivery {delivery_id.hex()} of this subscription")
    return dict(row)


def _token_matches(row: dict[str, Any], token: str) -> bool:
    stored = row["lease_token_digest"]
    return stored is not None and hmac.compare_digest(stored, token_digest(token))


async def _backoffs(cur: Any, namespace_id: bytes, subscription_ids: Sequence[bytes]
                    ) -> dict[bytes, tuple[int, int]]:
    wanted = sorted(set(subscription_ids))
    await cur.execute(POLICY.format(placeholders(len(wanted))), (namespace_id, *wanted))
    return {r["id"]: (r["backoff_initial_ms"], r["backoff_max_ms"])
            for r in await cur.fetchall()}


def next_state(attempts_used: int, max_attempts: int) -> DeliveryState:
    """After a failed or lapsed attempt: PENDING while budget is left, else EXHAUSTED."""
    return DeliveryState.EXHAUSTED if attempts_used >= max_attempts else DeliveryState.PENDING


def judge(row: dict[str, Any], report: Report) -> Settled | errors.OrbitError | None:
    """The answer to ``report`` that needs no write (a repeat, or a refusal), or None when
    the report applies: the delivery is LEASED with this token and the lease is live."""
    if report.acknowledged and row["state"] == DeliveryState.ACKNOWLEDGED \
            and _token_matches(row, report.token):
        return Settled(delivery_id=report.delivery_id, state=DeliveryState.ACKNOWLEDGED,
                       attempts_used=row["attempts_used"], repeated=True)
    if row["state"] != DeliveryState.LEASED or not row["live"] \
            or not _token_matches(row, report.token):
        return DeliveryLeaseLost(f"delivery {report.delivery_id.hex()} is not leased with this"
                                 " token (its lease lapsed or it was leased again)")
    return None


async def _settle_failure(cur: Any, namespace_id: bytes, row: dict[str, Any],  # noqa: PLR0917
                          outcome: str, error: AttemptError,
                          backoff: tuple[int, int]) -> DeliveryState:
    """Fail or lapse one LEASED delivery (locked); returns its new state. The caller adjusts
    the subscription's backlog (−1 per EXHAUSTED) after all its delivery rows."""
    target = next_state(row["attempts_used"], row["max_attempts"])
    wait_ms = 0 if target is DeliveryState.EXHAUSTED else model.backoff_ms(
        row["attempts_used"], *backoff)
    text = model.truncate(error.body)
    await cur.execute(RETRY, (target.value, wait_ms * 1000, target.value, error.status_code,
                              text, error.duration_ms, namespace_id, row["id"]))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the delivery changed under its lock")
    await cur.execute(INSERT_LOG + " VALUES " + LOG_ROW, (
        namespace_id, row["id"], row["attempts_used"], row["subscription_id"], outcome,
        error.status_code, text, error.duration_ms))
    return target


async def settle(cur: Any, namespace_id: bytes, subscription_id: bytes,
                 reports: Sequence[Report]) -> list[Settled | errors.OrbitError]:
    """Apply the holders' reports of one subscription's leased deliveries in one transaction,
    answered per report (a :class:`Settled`, or the error for that report: not found, lease
    lost). Locks the delivery rows in id order, then the subscription row (backlog) once."""
    if not reports:
        return []
    wanted = [r.delivery_id for r in reports]
    if len(set(wanted)) != len(wanted):
        raise errors.ValidationFailed([{"path": "$", "message": "a delivery is listed twice"}])
    await cur.execute(LOCK_MANY.format(placeholders(len(wanted))),
                      (namespace_id, subscription_id, *sorted(wanted)))
    rows = {r["id"]: dict(r) for r in await cur.fetchall()}
    answers: list[Settled | errors.OrbitError] = []
    acked: list[tuple[dict[str, Any], Report]] = []
    backoff: tuple[int, int] | None = None
    delta = 0
    for report in reports:
        row = rows.get(report.delivery_id)
        if row is None:
            answers.append(DeliveryNotFound(
                f"no delivery {report.delivery_id.hex()} of this subscription"))
            continue
        early = judge(row, report)
        if early is not None:
            answers.append(early)
            continue
        if report.acknowledged:
            acked.append((row, report))
            delta -= 1
            answers.append(Settled(delivery_id=report.delivery_id,
                                   state=DeliveryState.ACKNOWLEDGED,
                                   attempts_used=row["attempts_used"]))
            continue
        if backoff is None:
            backoff = (await _backoffs(cur, namespace_id, [subscription_id]))[subscription_id]
        target = await _settle_failure(cur, namespace_id, row, "FAILED", report.error, backoff)
        if target is DeliveryState.EXHAUSTED:
            delta -= 1
        answers.append(Settled(delivery_id=report.delivery_id, state=target,
                               attempts_used=row["attempts_used"]))
    if acked:
        ids = [row["id"] for row, _ in acked]
        cases = " ".join("WHEN %s THEN %s" for _ in acked)
        await cur.execute(ACK.format(cases=cases, ids=placeholders(len(ids))), (
            *[v for row, rep in acked for v in (row["id"], rep.error.duration_ms)],
            namespace_id, *ids))
        if cur.rowcount != len(ids):
            raise errors.StaleRevision("a delivery changed under its lock")
        sql, params = multi_insert(INSERT_LOG, LOG_ROW, [
            (namespace_id, row["id"], row["attempts_used"], subscription_id, "ACKNOWLEDGED",
             rep.error.status_code, None, rep.error.duration_ms) for row, rep in acked])
        await cur.execute(sql, params)
    if delta:
        await cur.execute(BACKLOG, (delta, namespace_id, subscription_id))
    return answers


async def _settle_one(cur: Any, namespace_id: bytes, subscription_id: bytes,
                      report: Report) -> Settled:
    (answer,) = await settle(cur, namespace_id, subscription_id, [report])
    if isinstance(answer, errors.OrbitError):
        raise answer
    return answer


async def acknowledge(cur: Any, namespace_id: bytes, subscription_id: bytes,
                      delivery_id: bytes, *, token: str, status_code: int | None = None,
                      duration_ms: int | None = None) -> Settled:
    """Acknowledge a leased delivery with its lease token (see the module docstring)."""
    return await _settle_one(cur, namespace_id, subscription_id, Report(
        delivery_id=delivery_id, token=token, acknowledged=True,
        error=AttemptError(status_code=status_code, duration_ms=duration_ms)))


async def fail(cur: Any, namespace_id: bytes, subscription_id: bytes, delivery_id: bytes, *,
               token: str, error: AttemptError) -> Settled:
    """A failed attempt (a consumer's nack, a webhook's non-2xx or timeout): back to PENDING
    after the backoff, or EXHAUSTED when the budget is spent (row kept)."""
    return await _settle_one(cur, namespace_id, subscription_id, Report(
        delivery_id=delivery_id, token=token, acknowledged=False, error=error))


def webhook_report(delivery_id: bytes, token: str, status_code: int | None,
                   body: str | None, duration_ms: int) -> Report:
    """The pump's report of one POST: a 2xx acknowledges; anything else (or no response,
    ``status_code`` None) is a failed attempt with the status, truncated body and timing."""
    ok = status_code is not None and 200 <= status_code <= 299
    return Report(delivery_id=delivery_id, token=token, acknowledged=ok,
                  error=AttemptError(status_code=status_code, body=None if ok else body,
                                     duration_ms=duration_ms))


async def record_webhook_result(cur: Any, namespace_id: bytes, subscription_id: bytes,
                                delivery_id: bytes, *, token: str, status_code: int | None,
                                body: str | None, duration_ms: int) -> Settled:
    """:func:`webhook_report` applied alone (the pump batches with :func:`settle`)."""
    return await _settle_one(cur, namespace_id, subscription_id, webhook_report(
        delivery_id, token, status_code, body, duration_ms))


RELEASE = """
UPDATE orbit_deliveries SET state = 'PENDING', attempts_used = attempts_used - 1,
  lease_expires_at = NULL, lease_token_digest = NULL,
  available_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, updated_at = UTC_TIMESTAMP(6)
WHERE namespace_id = %s AND id IN ({}) AND state = 'LEASED'
"""


async def release(cur: Any, namespace_id: bytes, subscription_id: bytes,
                  leases: Sequence[tuple[bytes, str]], delay_ms: int
                  ) -> list[Settled | errors.OrbitError]:
    """Hand leased deliveries back unsent — e.g. the endpoint's circuit is open, or the pump is
    draining: each ``(delivery_id, token)`` whose lease is live goes back to PENDING, due after
    ``delay_ms``, and its attempt is **not** counted (nothing was sent; no attempt log row).
    Answered per lease like :func:`settle`; the backlog does not change (still open)."""
    if delay_ms < 0:
        raise errors.ValidationFailed([{"path": "delay_ms", "message": "at least 0"}])
    if not leases:
        return []
    wanted = [delivery_id for delivery_id, _ in leases]
    if len(set(wanted)) != len(wanted):
        raise errors.ValidationFailed([{"path": "$", "message": "a delivery is listed twice"}])
    await cur.execute(LOCK_MANY.format(placeholders(len(wanted))),
                      (namespace_id, subscription_id, *sorted(wanted)))
    rows = {r["id"]: dict(r) for r in await cur.fetchall()}
    answers: list[Settled | errors.OrbitError] = []
    freed: list[bytes] = []
    for delivery_id, token in leases:
        row = rows.get(delivery_id)
        if row is None:
            answers.append(DeliveryNotFound(
                f"no delivery {delivery_id.hex()} of this subscription"))
            continue
        refusal = judge(row, Report(delivery_id=delivery_id, token=token, acknowledged=False))
        if refusal is not None:
            answers.append(refusal)
            continue
        freed.append(delivery_id)
        answers.append(Settled(delivery_id=delivery_id, state=DeliveryState.PENDING,
                               attempts_used=row["attempts_used"] - 1))
    if freed:
        await cur.execute(RELEASE.format(placeholders(len(freed))),
                          (delay_ms * 1000, namespace_id, *freed))
        if cur.rowcount != len(freed):
            raise errors.StaleRevision("a delivery changed under its lock")
    return answers


LAPSED = f"""
SELECT {COLUMNS} FROM orbit_deliveries FORCE INDEX (ix_deliveries_lease)
WHERE state = 'LEASED' AND lease_expires_at <= UTC_TIMESTAMP(6)
ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED
"""


async def recover_lapsed(cur: Any, limit: int = 500) -> int:
    """Leases past their expiry (database time) → PENDING with backoff, or EXHAUSTED when the
    budget is spent; each lapse is an attempt in the log. Returns how many were recovered."""
    await cur.execute(LAPSED, (limit,))
    rows = sorted((dict(r) for r in await cur.fetchall()),
                  key=lambda r: (r["namespace_id"], r["id"]))
    if not rows:
        return 0
    exhausted: Counter[tuple[bytes, bytes]] = Counter()
    by_namespace: dict[bytes, list[dict[str, Any]]] = {}
    for row in rows:
        by_namespace.setdefault(row["namespace_id"], []).append(row)
    for namespace_id, group in by_namespace.items():
        backoffs = await _backoffs(cur, namespace_id, [r["subscription_id"] for r in group])
        for row in group:
            target = await _settle_failure(
                cur, namespace_id, row, "LAPSED",
                AttemptError(body="the lease lapsed without an acknowledgement"),
                backoffs.get(row["subscription_id"], (0, 0)))
            if target is DeliveryState.EXHAUSTED:
                exhausted[(namespace_id, row["subscription_id"])] += 1
    for (namespace_id, subscription_id), count in sorted(exhausted.items()):
        await cur.execute(BACKLOG, (-count, namespace_id, subscription_id))
    return len(rows)


# --- consumer-facing commands (credential checks inside the transaction) ------------------------


async def _consumer(cur: Any, principal: credentials.Principal, namespace: str, name: str,
                    action: Any = subscriptions.CONSUME) -> dict[str, Any]:
    ns = await credentials.authorize(cur, principal, action, namespace)
    row = await subscriptions.find(cur, ns.id, name)
    await subscriptions.in_scope(cur, principal, action, namespace, row)
    return row


async def lease_deliveries(db: Database, principal: credentials.Principal, *, namespace: str,
                           name: str, limit: int = 10) -> list[Leased]:
    """A pull consumer's lease (``subscriptions.consume``); PULL subscriptions only."""

    async def body(cur: Any) -> list[Leased]:
        row = await _consumer(cur, principal, namespace, name)
        if row["kind"] != Kind.PULL:
            raise NotPullSubscription(f"subscription {name!r} is delivered by webhook")
        return await lease(cur, row["namespace_id"], row["id"], limit)

    return await db.transaction("relay.lease", body)


async def acknowledge_delivery(db: Database, principal: credentials.Principal, *,
                               namespace: str, name: str, delivery_id: bytes,
                               token: str) -> Settled:
    async def body(cur: Any) -> Settled:
        row = await _consumer(cur, principal, namespace, name)
        return await acknowledge(cur, row["namespace_id"], row["id"], delivery_id, token=token)

    async def recheck(cur: Any) -> Settled | None:
        # The commit's outcome is unknown: acknowledged with this token means it committed.
        row = await _consumer(cur, principal, namespace, name)
        found = await _held(cur, row["namespace_id"], row["id"], delivery_id)
        if found["state"] == DeliveryState.ACKNOWLEDGED and _token_matches(found, token):
            return Settled(delivery_id=delivery_id, state=DeliveryState.ACKNOWLEDGED,
                           attempts_used=found["attempts_used"], repeated=True)
        return None

    return await db.transaction("relay.acknowledge", body, recheck=recheck)


async def fail_delivery(db: Database, principal: credentials.Principal, *, namespace: str,
                        name: str, delivery_id: bytes, token: str,
                        error: AttemptError) -> Settled:
    async def body(cur: Any) -> Settled:
        row = await _consumer(cur, principal, namespace, name)
        return await fail(cur, row["namespace_id"], row["id"], delivery_id, token=token,
                          error=error)

    return await db.transaction("relay.fail", body)


async def add_budget(db: Database, principal: credentials.Principal, *, namespace: str,
                     name: str, delivery_id: bytes, attempts: int, reason: str,
                     idempotency_key: str | None = None,
                     request_id: str | None = None) -> Replay:
    """An operator gives an EXHAUSTED delivery ``attempts`` more attempts: it is PENDING and due
    now, its attempts used and its attempt log are kept, the backlog counts it again; audited
    with the reason (``subscriptions.manage``)."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) \
            or not 1 <= attempts <= model.BUDGET_ADD_MAX:
        raise errors.ValidationFailed([{"path": "$.attempts",
                                        "message": f"an integer from 1 to"
                                                   f" {model.BUDGET_ADD_MAX}"}])
    reason_text = model.check_reason(reason, required=True)
    idem = namespaced.request("subscriptions.add_budget", idempotency_key, delivery_id,
                              {"attempts": attempts, "reason": reason_text}, principal)

    async def locate(cur: Any, namespace_id: bytes) -> None:
        row = await subscriptions.find(cur, namespace_id, name)
        await subscriptions.in_scope(cur, principal, subscriptions.MANAGE, namespace, row)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        view = await give_budget(cur, principal, namespace_id, name, delivery_id,
                                 attempts=attempts, reason=reason_text, request_id=request_id)
        return 200, view, delivery_id

    return await namespaced.run(
        db, "subscriptions.add_budget", principal=principal,
        action=subscriptions.MANAGE, namespace=namespace, idem=idem, act=act, locate=locate)


async def give_budget(cur: Any, who: subscriptions.Acting, namespace_id: bytes,
                      name: str, delivery_id: bytes, *, attempts: int, reason: str | None,
                      request_id: str | None) -> dict[str, Any]:
    """:func:`add_budget`'s change in the caller's transaction (also the operator's, in
    relay/operator.py; arguments already checked); returns the delivery's view."""
    sub = await subscriptions.find(cur, namespace_id, name)
    await cur.execute(f"SELECT {COLUMNS} FROM orbit_deliveries WHERE namespace_id = %s"
                      " AND id = %s AND subscription_id = %s FOR UPDATE",
                      (namespace_id, delivery_id, sub["id"]))
    row = await cur.fetchone()
    if row is None:
        raise DeliveryNotFound(f"no delivery {delivery_id.hex()} of subscription {name!r}")
    if row["state"] != DeliveryState.EXHAUSTED:
        raise DeliveryNotExhausted(f"delivery {delivery_id.hex()} is {row['state']}")
    await cur.execute(
        "UPDATE orbit_deliveries SET state = 'PENDING', max_attempts = max_attempts + %s,"
        " available_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s AND state = 'EXHAUSTED'",
        (attempts, namespace_id, delivery_id))
    await cur.execute(BACKLOG, (1, namespace_id, sub["id"]))
    after = await _row(cur, namespace_id, delivery_id)
    await append_audit(cur, AuditRecord(
        actor=who.actor, action="delivery.budget_added", resource_type="delivery",
        resource_id=delivery_id, namespace_id=namespace_id,
        application_id=who.application_id, reason=reason,
        before={"state": row["state"], "attempts_used": row["attempts_used"],
                "max_attempts": row["max_attempts"]},
        after={"state": after["state"], "attempts_used": after["attempts_used"],
               "max_attempts": after["max_attempts"], "added": attempts},
        request_id=request_id))
    return model.delivery_view(after)


# --- history ------------------------------------------------------------------------------------


async def _row(cur: Any, namespace_id: bytes, delivery_id: bytes) -> dict[str, Any]:
    await cur.execute(f"SELECT {COLUMNS} FROM orbit_deliveries WHERE namespace_id = %s"
                      " AND id = %s", (namespace_id, delivery_id))
    return dict(await cur.fetchone())


HISTORY = f"""
SELECT {COLUMNS} FROM orbit_deliveries FORCE INDEX (ix_deliveries_history)
WHERE namespace_id = %s AND subscription_id = %s
  AND (created_at < %s OR (created_at = %s AND id < %s))
ORDER BY created_at DESC, id DESC LIMIT %s
"""
HISTORY_BY_STATE = f"""
SELECT {COLUMNS} FROM orbit_deliveries FORCE INDEX (ix_deliveries_state_history)
WHERE namespace_id = %s AND subscription_id = %s AND state = %s
  AND (created_at < %s OR (created_at = %s AND id < %s))
ORDER BY created_at DESC, id DESC LIMIT %s
"""


Page = cursors.Page


async def list_deliveries(db: Database, principal: credentials.Principal, *, namespace: str,
                          name: str, state: str | None = None, limit: int = 100,
                          cursor: str | None = None) -> Page:
    """A subscription's deliveries newest first by ``(created_at, id)`` — a key no lease,
    acknowledgement or retry changes — optionally of one state; the cursor is bound to the
    subscription and the state."""
    if state is not None and state not in DeliveryState.__members__:
        raise errors.ValidationFailed([{"path": "state", "message": ", ".join(DeliveryState)}])
    if not 1 <= limit <= HISTORY_PAGE_MAX:
        raise errors.ValidationFailed([{"path": "limit",
                                        "message": f"1 to {HISTORY_PAGE_MAX}"}])

    async def body(cur: Any) -> Page:
        row = await _consumer(cur, principal, namespace, name, subscriptions.READ)
        bound = {"subscription": row["id"].hex(), "state": state}
        at, last = (TIME_MAX, ID_MAX) if cursor is None else cursors.time_position(
            cursors.decode(cursor, "deliveries", bound))
        head = (row["namespace_id"], row["id"]) + ((state,) if state else ())
        await cur.execute(HISTORY_BY_STATE if state else HISTORY,
                          (*head, to_db(at), to_db(at), last, limit))
        rows = list(await cur.fetchall())
        items = [model.delivery_view(r) for r in rows]
        next_cursor = None
        if len(rows) == limit:
            tail = rows[-1]
            next_cursor = cursors.encode("deliveries", bound,
                                         [model.iso(tail["created_at"]), tail["id"].hex()])
        return Page(items=items, next_cursor=next_cursor)

    return await db.read("relay.deliveries", body)


async def get_delivery(db: Database, principal: credentials.Principal, *, namespace: str,
                       name: str, delivery_id: bytes) -> dict[str, Any]:
    """One delivery with its frozen snapshot (read from its result event) and attempt log;
    never a secret or a token."""

    async def body(cur: Any) -> dict[str, Any]:
        sub = await _consumer(cur, principal, namespace, name, subscriptions.READ)
        await cur.execute(f"SELECT {COLUMNS} FROM orbit_deliveries WHERE namespace_id = %s"
                          " AND id = %s AND subscription_id = %s",
                          (sub["namespace_id"], delivery_id, sub["id"]))
        row = await cur.fetchone()
        if row is None:
            raise DeliveryNotFound(f"no delivery {delivery_id.hex()} of subscription {name!r}")
        await cur.execute(
            "SELECT r.state, r.committed_at, r.snapshot, q.name AS queue_name"
            " FROM orbit_result_events r LEFT JOIN pulse_queues q"
            " ON q.namespace_id = r.namespace_id AND q.id = r.queue_id"
            " WHERE r.namespace_id = %s AND r.id = %s", (sub["namespace_id"], row["event_id"]))
        event = await cur.fetchone()
        await cur.execute(
            "SELECT attempt, outcome, status_code, error, duration_ms, ended_at"
            " FROM orbit_delivery_attempts WHERE namespace_id = %s AND delivery_id = %s"
            " ORDER BY attempt", (sub["namespace_id"], delivery_id))
        attempts = [{"attempt": a["attempt"], "outcome": a["outcome"],
                     "status_code": a["status_code"], "error": a["error"],
                     "duration_ms": a["duration_ms"], "ended_at": model.iso(a["ended_at"])}
                    for a in await cur.fetchall()]
        view = model.delivery_view(row)
        view.update({
            "subscription": sub["name"],
            "queue": event["queue_name"] if event else None,
            "result_state": event["state"] if event else None,
            "committed_at": model.iso(event["committed_at"]) if event else None,
            "snapshot": jsondoc.RawJson(event["snapshot"]) if event else None,
            "attempts": attempts,
        })
        return view

    return await db.read("relay.delivery", body)


# --- retention ----------------------------------------------------------------------------------

UNACKNOWLEDGED = """
SELECT DISTINCT event_id FROM orbit_deliveries FORCE INDEX (ix_deliveries_source)
WHERE namespace_id = %s AND event_id IN ({}) AND state IN ('PENDING', 'LEASED')
"""


async def unacknowledged_events(cur: Any, namespace_id: bytes, event_ids: Sequence[bytes]
                                ) -> set[bytes]:
    """The result events among ``event_ids`` that a retention job must keep: those with a
    PENDING or LEASED delivery of any subscription (000 §7). EXHAUSTED deliveries do not hold
    an event (the operator may add budget only while the event is kept: the retention job's
    alert is the place to decide); ACKNOWLEDGED ones are done. Call it inside the retention
    transaction, after locking the events to remove."""
    wanted = sorted(set(event_ids))
    if not wanted:
        return set()
    await cur.execute(UNACKNOWLEDGED.format(placeholders(len(wanted))), (namespace_id, *wanted))
    return {r["event_id"] for r in await cur.fetchall()}

"""Per-endpoint circuits of WEBHOOK subscriptions (kept on the subscription row), so an endpoint
that keeps failing does not hold up the others.

States (``orbit_subscriptions.circuit_state``)::

    CLOSED --threshold consecutive failures--> OPEN (until circuit_open_until)
    OPEN --open_until passed, a pump claims the probe--> HALF_OPEN (until the probe window ends)
    HALF_OPEN --probe succeeds--> CLOSED;  --probe fails--> OPEN again
    any --a success--> CLOSED (failures reset)

A pump sends to a subscription only while :func:`sendable` (CLOSED, or its window passed: an OPEN
circuit due for a probe, or a HALF_OPEN probe whose pump went silent). :func:`begin_probe` is a
guarded update, so one pump of many sends the probe. Every decision uses database time. The
writers lock only the subscription row (the last lock of the one order).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.relay import subscriptions
from orbit_common.relay.model import SubscriptionNotFound


class CircuitState(enum.StrEnum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


@attrs.frozen(kw_only=True)
class Circuit:
    state: CircuitState
    open_until: dt.datetime | None
    failures: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Circuit:
        until = row["circuit_open_until"]
        return cls(state=CircuitState(row["circuit_state"]),
                   open_until=None if until is None else as_utc(until),
                   failures=row["consecutive_failures"])


def sendable(circuit: Circuit, now: dt.datetime) -> bool:
    """Whether a pump may send now (see the module docstring)."""
    if circuit.state is CircuitState.CLOSED:
        return True
    return circuit.open_until is not None and circuit.open_until <= now


def after(circuit: Circuit, ok: bool, now: dt.datetime, *, threshold: int,
          open_for: dt.timedelta) -> Circuit:
    """The circuit after one attempt's outcome (``threshold`` ≥ 1 consecutive failures open
    it; a failed probe re-opens it at once)."""
    if ok:
        return Circuit(state=CircuitState.CLOSED, open_until=None, failures=0)
    failures = circuit.failures + 1
    if circuit.state is not CircuitState.CLOSED or failures >= threshold:
        return Circuit(state=CircuitState.OPEN, open_until=now + open_for, failures=failures)
    return Circuit(state=CircuitState.CLOSED, open_until=None, failures=failures)


LOCK = """
SELECT circuit_state, circuit_open_until, consecutive_failures FROM orbit_subscriptions
WHERE namespace_id = %s AND id = %s FOR UPDATE
"""
WRITE = """
UPDATE orbit_subscriptions SET circuit_state = %s, circuit_open_until = %s,
  consecutive_failures = %s WHERE namespace_id = %s AND id = %s
"""
PROBE = """
UPDATE orbit_subscriptions SET circuit_state = 'HALF_OPEN',
  circuit_open_until = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND
WHERE namespace_id = %s AND id = %s AND circuit_state IN ('OPEN', 'HALF_OPEN')
  AND circuit_open_until <= UTC_TIMESTAMP(6)
"""
TARGETS = f"""
SELECT {subscriptions.COLUMNS} FROM orbit_subscriptions FORCE INDEX (ix_subscriptions_state)
WHERE state = 'ACTIVE' AND kind = 'WEBHOOK' AND backlog > 0
  AND (circuit_state = 'CLOSED' OR circuit_open_until <= UTC_TIMESTAMP(6))
  AND EXISTS (SELECT 1 FROM orbit_deliveries d FORCE INDEX (ix_deliveries_due)
              WHERE d.namespace_id = orbit_subscriptions.namespace_id
                AND d.subscription_id = orbit_subscriptions.id AND d.state = 'PENDING'
                AND d.available_at <= UTC_TIMESTAMP(6))
LIMIT %s
"""


async def record(cur: Any, namespace_id: bytes, subscription_id: bytes, *,
                 ok: bool, threshold: int, open_for: dt.timedelta) -> Circuit:
    """Record one endpoint outcome (in the pump's settle transaction, after the deliveries);
    returns the new circuit."""
    await cur.execute(LOCK, (namespace_id, subscription_id))
    row = await cur.fetchone()
    if row is None:
        raise SubscriptionNotFound()
    now = await db_now(cur)
    new = after(Circuit.from_row(row), ok, now, threshold=threshold, open_for=open_for)
    await cur.execute(WRITE, (new.state.value,
                              None if new.open_until is None else to_db(new.open_until),
                              new.failures, namespace_id, subscription_id))
    return new


async def begin_probe(cur: Any, namespace_id: bytes, subscription_id: bytes,
                      window: dt.timedelta) -> bool:
    """Claim the probe of a circuit whose window passed (HALF_OPEN for ``window``); False when
    another pump claimed it first or the circuit is not due."""
    await cur.execute(PROBE, (int(window / dt.timedelta(microseconds=1)), namespace_id,
                              subscription_id))
    return bool(cur.rowcount == 1)


async def webhook_targets(cur: Any, limit: int = 100) -> list[dict[str, Any]]:
    """ACTIVE WEBHOOK subscriptions with a delivery due now (PENDING, past its backoff) whose
    circuit lets a pump send now (plain read; the rows carry the sealed secrets for
    :func:`model.signing_secrets`). A subscription whose deliveries all wait out a backoff is
    not a target, so a failing endpoint costs no lease transactions between its retries."""
    await cur.execute(TARGETS, (limit,))
    return [dict(r) for r in await cur.fetchall()]

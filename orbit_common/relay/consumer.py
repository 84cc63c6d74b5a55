"""A pull consumer's commands beyond lease, acknowledge and fail (deliveries.py): a batch of
acknowledgements and failures in one transaction, handing back leases never sent (a WebSocket
stream that closed before it pushed them), and the cheap read a waiting consumer polls.

Every command checks ``subscriptions.consume`` on the subscription's scope inside its
transaction, like the lease (deliveries.lease_deliveries); the poll read (:func:`poll`) is not an
authorization fact (the lease that follows it checks again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.relay import deliveries, subscriptions
from orbit_common.relay.deliveries import Report, Settled
from orbit_common.relay.model import Kind, NotPullSubscription, SubscriptionState

SETTLE_BATCH_MAX = 500
Answer = Settled | errors.OrbitError


@attrs.frozen(kw_only=True)
class Target:
    """A pull subscription a consumer may consume (ids for the poll read)."""

    namespace_id: bytes
    subscription_id: bytes
    name: str


async def _pull(cur: Any, principal: credentials.Principal, namespace: str, name: str
                ) -> dict[str, Any]:
    ns = await credentials.authorize(cur, principal, subscriptions.CONSUME, namespace)
    row = await subscriptions.find(cur, ns.id, name)
    await subscriptions.in_scope(cur, principal, subscriptions.CONSUME, namespace, row)
    if row["kind"] != Kind.PULL:
        raise NotPullSubscription(f"subscription {name!r} is delivered by webhook")
    return row


async def locate(db: Database, principal: credentials.Principal, *, namespace: str,
                 name: str) -> Target:
    """The pull subscription ``name`` if the credential may consume it (404, 403, 409 as the
    lease would answer)."""

    async def body(cur: Any) -> Target:
        row = await _pull(cur, principal, namespace, name)
        return Target(namespace_id=row["namespace_id"], subscription_id=row["id"],
                      name=row["name"])

    return await db.read("relay.locate_consumer", body)


async def settle_deliveries(db: Database, principal: credentials.Principal, *, namespace: str,
                            name: str, reports: Sequence[Report]) -> list[Answer]:
    """Acknowledgements and failures of many leased deliveries of one subscription in one
    transaction, answered per report (deliveries.settle)."""
    if not 1 <= len(reports) <= SETTLE_BATCH_MAX:
        raise errors.ValidationFailed([{"path": "$.items",
                                        "message": f"1 to {SETTLE_BATCH_MAX} items"}])

    async def body(cur: Any) -> list[Answer]:
        row = await _pull(cur, principal, namespace, name)
        return await deliveries.settle(cur, row["namespace_id"], row["id"], reports)

    return await db.transaction("relay.settle", body)


async def release_deliveries(db: Database, principal: credentials.Principal, *,
                             namespace: str, name: str, leases: Sequence[tuple[bytes, str]],
                             delay_ms: int = 0) -> list[Answer]:
    """Hand back leases that were never shown to the consumer (deliveries.release: PENDING
    again after ``delay_ms``, the attempt not counted)."""

    async def body(cur: Any) -> list[Answer]:
        row = await _pull(cur, principal, namespace, name)
        return await deliveries.release(cur, row["namespace_id"], row["id"], leases, delay_ms)

    return await db.transaction("relay.release", body)


POLL = """
SELECT s.state,
  (SELECT GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(d.available_at)))
   FROM orbit_deliveries d FORCE INDEX (ix_deliveries_due)
   WHERE d.namespace_id = s.namespace_id AND d.subscription_id = s.id
     AND d.state = 'PENDING') AS wait_us
FROM orbit_subscriptions s WHERE s.namespace_id = %s AND s.id = %s
"""


@attrs.frozen(kw_only=True)
class Poll:
    """What a waiting consumer learns from one cheap read: the subscription's state (None: it
    is gone) and in how many milliseconds its earliest PENDING delivery is due (0: now; None:
    nothing is pending)."""

    state: str | None
    due_in_ms: int | None

    @property
    def due(self) -> bool:
        return self.state == SubscriptionState.ACTIVE and self.due_in_ms == 0


async def poll(db: Database, target: Target) -> Poll:
    """One primary-key read and one index range read (ix_deliveries_due), no lock."""

    async def body(cur: Any) -> Poll:
        await cur.execute(POLL, (target.namespace_id, target.subscription_id))
        row = await cur.fetchone()
        if row is None:
            return Poll(state=None, due_in_ms=None)
        wait = row["wait_us"]
        return Poll(state=str(row["state"]), due_in_ms=None if wait is None
                    else int(wait) // 1000)

    return await db.read("relay.poll", body)

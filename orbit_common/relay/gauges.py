"""What the delivery pump's gauges show (plain reads, database time): open deliveries per
subscription and webhook subscriptions per circuit state."""

from __future__ import annotations

from typing import Any

import attrs

BACKLOGS = """
SELECT n.name AS namespace, s.name AS subscription, s.backlog
FROM orbit_subscriptions s JOIN orbit_namespaces n ON n.id = s.namespace_id
WHERE s.state = 'ACTIVE'
"""
CIRCUITS = """
SELECT circuit_state, COUNT(*) AS n FROM orbit_subscriptions
WHERE state = 'ACTIVE' AND kind = 'WEBHOOK' GROUP BY circuit_state
"""


@attrs.frozen(kw_only=True)
class Backlog:
    namespace: str
    subscription: str
    backlog: int


async def backlogs(cur: Any) -> list[Backlog]:
    """Every ACTIVE subscription's backlog (PENDING + LEASED deliveries)."""
    await cur.execute(BACKLOGS)
    return [Backlog(namespace=r["namespace"], subscription=r["subscription"],
                    backlog=int(r["backlog"])) for r in await cur.fetchall()]


async def circuits(cur: Any) -> dict[str, int]:
    """ACTIVE webhook subscriptions per circuit state (``CLOSED``, ``OPEN``, ``HALF_OPEN``)."""
    await cur.execute(CIRCUITS)
    return {r["circuit_state"]: int(r["n"]) for r in await cur.fetchall()}

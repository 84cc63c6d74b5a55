"""Concurrency: producers, pumps and consumers at once never lose, duplicate or double-lease a
delivery (real transactions racing on the real database; no sleeps)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.relay import deliveries, fanout
from tests.conftest import Tenant
from tests.support import relay
from tests.support.invariants import check_db
from tests.support.lease_fixtures import make_queue


async def _fan_out_loop(db: Database, tenant: Tenant, subscription_id: bytes,
                        stop: asyncio.Event) -> None:
    """A pump's fan-out loop for one subscription, until ``stop`` and caught up."""
    while True:
        outcome = await db.transaction("test.pump", lambda cur: fanout.fan_out_subscription(
            cur, tenant.namespace_id, subscription_id, 3))
        if stop.is_set() and outcome is not None and outcome.caught_up:
            return
        await asyncio.sleep(0)  # let the producers and the other pump run


async def test_two_pumps_and_concurrent_producers_leave_no_gap_and_no_duplicate(
    db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant)
    sub = await relay.subscription_row(db, tenant)
    stop = asyncio.Event()
    pumps = [asyncio.create_task(_fan_out_loop(db, tenant, sub["id"], stop)) for _ in range(2)]
    producers = [relay.cancelled_results(db, tenant, queue, 6) for _ in range(3)]
    produced = [t for batch in await asyncio.gather(*producers) for t in batch]
    stop.set()
    await asyncio.wait_for(asyncio.gather(*pumps), 30)
    rows = await relay.delivery_rows(db, tenant)
    assert sorted(r["task_id"] for r in rows) == sorted(produced)  # none lost, none twice
    assert [r["sequence"] for r in rows] == list(range(1, len(produced) + 1))
    assert (await relay.subscription_row(db, tenant))["backlog"] == len(produced)
    assert await check_db(db, [tenant.namespace_id]) == []


async def test_concurrent_consumers_never_share_a_lease(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 12)
    await relay.fan_out_all(db, tenant)
    who = await relay.principal_of(db, tenant.api_key)
    taken: Counter[bytes] = Counter()

    async def consumer() -> None:
        while True:
            leased = await deliveries.lease_deliveries(db, who, namespace=tenant.namespace,
                                                       name="sub", limit=2)
            if not leased:
                return
            for item in leased:
                taken[item.delivery_id] += 1
                await deliveries.acknowledge_delivery(
                    db, who, namespace=tenant.namespace, name="sub",
                    delivery_id=item.delivery_id, token=item.token)

    await asyncio.wait_for(asyncio.gather(*(consumer() for _ in range(4))), 30)
    assert len(taken) == 12
    assert set(taken.values()) == {1}
    assert (await relay.subscription_row(db, tenant))["backlog"] == 0
    assert await check_db(db, [tenant.namespace_id]) == []


async def test_concurrent_acknowledgements_of_one_lease_decrement_once(
    db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    (leased,) = await relay.lease(db, tenant)
    who = await relay.principal_of(db, tenant.api_key)

    async def ack() -> Any:
        return await deliveries.acknowledge_delivery(
            db, who, namespace=tenant.namespace, name="sub", delivery_id=leased.delivery_id,
            token=leased.token)

    answers = await asyncio.gather(*(ack() for _ in range(5)))
    assert sorted(a.repeated for a in answers) == [False, True, True, True, True]
    assert (await relay.subscription_row(db, tenant))["backlog"] == 0
    assert await check_db(db, [tenant.namespace_id]) == []

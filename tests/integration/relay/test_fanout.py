"""Fan-out (orbit_common/relay/fanout.py): one delivery per matching result event, the scan
position and backlog committed with them, no stream/task/queue/application lock."""

from __future__ import annotations

import asyncio
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.relay import fanout
from tests.conftest import Tenant
from tests.support import relay
from tests.support.lease_fixtures import make_queue


async def test_every_matching_event_gets_one_delivery(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    other = await make_queue(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 2)  # before the subscription: not seen
    await relay.subscribe(db, tenant, "all")
    await relay.subscribe(db, tenant, "failed-only", filters={"states": ["FAILED"]})
    await relay.subscribe(db, tenant, "other-queue", filters={"queues": [other.name]})
    await relay.subscribe(db, tenant, "handler-h", filters={"handlers": ["h"]})
    cancelled = await relay.cancelled_results(db, tenant, queue, 3)
    finished = await relay.finished_results(db, tenant, queue, ["succeeded", "failed"],
                                            handler="h")
    assert await relay.fan_out_all(db, tenant) == 5 + 1 + 0 + 2
    rows = await relay.delivery_rows(db, tenant)
    by_sub: dict[str, list[dict[str, Any]]] = {}
    subs = {r["id"]: r["name"] for r in await relay.rows(
        db, "SELECT id, name FROM orbit_subscriptions WHERE namespace_id = %s",
        tenant.namespace_id)}
    for row in rows:
        by_sub.setdefault(subs[row["subscription_id"]], []).append(row)
    assert [r["task_id"] for r in by_sub["all"]] == cancelled + finished
    assert [r["sequence"] for r in by_sub["all"]] == [3, 4, 5, 6, 7]
    assert {r["task_id"] for r in by_sub["handler-h"]} == set(finished)
    assert len(by_sub["failed-only"]) == 1
    assert "other-queue" not in by_sub
    for name, expected in (("all", 5), ("failed-only", 1), ("other-queue", 0),
                           ("handler-h", 2)):
        sub = await relay.subscription_row(db, tenant, name)
        assert sub["backlog"] == expected
        assert sub["scan_after_sequence"] == 7  # past every event read, matching or not
    # A second pass finds nothing new: no duplicate.
    assert await relay.fan_out_all(db, tenant) == 0
    assert len(await relay.delivery_rows(db, tenant)) == 8


async def test_a_replayed_batch_never_duplicates(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 3)
    assert await relay.fan_out_all(db, tenant) == 3
    sub = await relay.subscription_row(db, tenant)

    async def rewind(cur: Any) -> None:  # as if the scan position had not committed
        await cur.execute("UPDATE orbit_subscriptions SET scan_after_sequence = 0,"
                          " start_after_sequence = 0 WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, sub["id"]))

    await db.transaction("test.rewind", rewind)
    assert await relay.fan_out_all(db, tenant) == 0
    assert len(await relay.delivery_rows(db, tenant)) == 3
    assert (await relay.subscription_row(db, tenant))["backlog"] == 3


async def test_bounded_batches_and_start_position(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 4)
    await relay.subscribe(db, tenant, "from-2", start_after_sequence=2)
    await relay.subscribe(db, tenant, "now")
    await relay.cancelled_results(db, tenant, queue, 1)
    sub = await relay.subscription_row(db, tenant, "from-2")
    outcome = await db.transaction("test", lambda cur: fanout.fan_out_subscription(
        cur, tenant.namespace_id, sub["id"], 2))
    assert outcome == fanout.Outcome(scanned=2, created=2, caught_up=False)
    assert (await relay.subscription_row(db, tenant, "from-2"))["scan_after_sequence"] == 4
    assert await relay.fan_out_all(db, tenant) == 1 + 1
    seqs = sorted(r["sequence"] for r in await relay.delivery_rows(db, tenant))
    assert seqs == [3, 4, 5, 5]


async def test_paused_subscriptions_are_not_fanned_out(db: Database, tenant: Tenant) -> None:
    from orbit_common.relay import subscriptions
    from orbit_common.relay.model import SubscriptionState

    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant)
    who = await relay.principal_of(db, tenant.api_key)
    await subscriptions.set_state(db, who, namespace=tenant.namespace, name="sub",
                                  target=SubscriptionState.PAUSED)
    await relay.cancelled_results(db, tenant, queue, 1)
    sub = await relay.subscription_row(db, tenant)
    assert await db.transaction("test", lambda cur: fanout.fan_out_subscription(
        cur, tenant.namespace_id, sub["id"])) is None
    assert await relay.delivery_rows(db, tenant) == []


async def test_fan_out_takes_no_stream_lock(db: Database, tenant: Tenant) -> None:
    """A producer holding the stream row (mid-commit) does not block fan-out, which reads
    only the committed prefix."""
    queue = await make_queue(db, tenant)
    await relay.subscribe(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 2)
    held = asyncio.Event()
    release = asyncio.Event()

    async def producer(cur: Any) -> None:
        await cur.execute("SELECT next_sequence FROM orbit_event_streams WHERE namespace_id = %s"
                          " FOR UPDATE", (tenant.namespace_id,))
        held.set()
        await release.wait()

    task = asyncio.create_task(db.transaction("test.producer", producer))
    await held.wait()
    try:
        created = await asyncio.wait_for(relay.fan_out_all(db, tenant), 5)
    finally:
        release.set()
        await task
    assert created == 2


async def test_passes_take_turns_round_the_due_subscriptions(db: Database,
                                                             tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    for name in ("a", "b", "c"):
        await relay.subscribe(db, tenant, name)
    await relay.cancelled_results(db, tenant, queue, 2)
    ours = {r["id"] for r in await relay.rows(
        db, "SELECT id FROM orbit_subscriptions WHERE namespace_id = %s", tenant.namespace_id)}
    served: list[bytes] = []
    after = None
    for _ in range(200):  # other tests' subscriptions share the database
        done = await fanout.fan_out(db, batch=1, subscriptions=1, after=after)
        assert done.subscriptions <= 1
        if done.next_after is not None and done.next_after[1] in ours:
            served.append(done.next_after[1])
        after = done.next_after
        if len(await relay.delivery_rows(db, tenant)) == 6:
            break
    assert len(await relay.delivery_rows(db, tenant)) == 6
    # One event per pass and subscription: each was served twice, taking turns.
    assert sorted(served) == sorted(list(ours) * 2)
    assert set(served[:3]) == ours

"""The engine's leases (orbit_common.weave.leasing), on a database of their own (a lease scan
reads every namespace): oldest first, SKIP LOCKED between replicas, lapsed leases leased again,
QUARANTINED inbox rows never."""

from __future__ import annotations

import asyncio
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.weave import instances, leasing
from orbit_common.weave.engine import Engine
from tests.conftest import make_tenant
from tests.integration.test_interventions import cancel
from tests.integration.weave.support import principal, published
from tests.integration.weave.test_inbox import workflow_task
from tests.support import database
from tests.support.lease_fixtures import make_queue, wait_db_time_past

own_url, own_db = database.own_database("orbit_weave_leasing", pool_max=4,
                                       names=("own_url", "own_db"))


async def test_advances_are_leased_once_skipped_while_held_and_again_after_a_lapse(
        own_db: Database) -> None:
    db = own_db
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    who = await principal(db, tenant.api_key)
    started = [(await instances.start_instance(db, who, namespace=tenant.namespace,
                                               definition=name, input_json=b'{"n": 1}')
                ).body["id"] for _ in range(3)]
    held = asyncio.Event()
    release = asyncio.Event()

    async def first(cur: Any) -> list[dict[str, Any]]:
        rows = await leasing.lease_advances(cur, owner="engine-1", lease_ms=60_000, limit=2)
        held.set()
        await release.wait()
        return rows

    holder = asyncio.create_task(db.transaction("test.lease1", first))
    await held.wait()
    second = await db.transaction("test.lease2", lambda cur: leasing.lease_advances(
        cur, owner="engine-2", lease_ms=1, limit=10))
    release.set()
    leased_first = await holder
    assert len(leased_first) == 2
    assert len(second) == 1  # the two rows the first replica holds are skipped, not waited for
    everyone = {r["instance_id"].hex() for r in leased_first + second}
    assert everyone == set(started)
    assert {r["state"] for r in leased_first + second} == {"LEASED"}
    # engine-2's lease (1 ms) lapses: the next scan leases that row again, and only that one.

    async def lapsed(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("SELECT SLEEP(0.01)")
        return await leasing.lease_advances(cur, owner="engine-3", lease_ms=60_000, limit=10)

    again = await db.transaction("test.lease3", lapsed)
    assert [(r["id"], r["lease_owner"], r["attempts"]) for r in again] == [
        (second[0]["id"], "engine-3", 2)]


async def test_inbox_rows_are_leased_but_quarantined_ones_never(own_db: Database) -> None:
    db = own_db
    tenant = await make_tenant(db)
    good, _, _ = await workflow_task(db, tenant)
    broken, _, _ = await workflow_task(db, tenant, activation=False)
    await cancel(db, tenant, good)
    await cancel(db, tenant, broken)
    rows = await db.transaction("test.lease", lambda cur: leasing.lease_inbox(
        cur, owner="engine-1", lease_ms=60_000, limit=10))
    assert [(r["task_id"], r["state"]) for r in rows] == [(good, "LEASED")]
    assert await db.transaction("test.lease", lambda cur: leasing.lease_inbox(
        cur, owner="engine-2", lease_ms=60_000, limit=10)) == []


async def _lapse(db: Database, tenant: Any, count: int) -> set[bytes]:
    """Start ``count`` instances and lease their ROOT advances to a replica that dies: a 1 ms
    lease, waited out in database time. Returns the advances' ids."""
    name = await published(db, tenant, (await make_queue(db, tenant)).name)
    who = await principal(db, tenant.api_key)
    instance_ids = {bytes.fromhex((await instances.start_instance(
        db, who, namespace=tenant.namespace, definition=name, input_json=b'{"n": 1}')
        ).body["id"]) for _ in range(count)}
    dead = await db.transaction("test.dead", lambda cur: leasing.lease_advances(
        cur, owner="engine-dead", lease_ms=1, limit=100))
    mine = [r for r in dead if r["instance_id"] in instance_ids]
    assert len(mine) == count
    await wait_db_time_past(db, max(r["lease_expires_at"] for r in mine))
    return {r["id"] for r in mine}


async def _stored(db: Database, table: str, namespace_ids: list[bytes]
                  ) -> dict[bytes, dict[str, Any]]:
    """The rows of ``table`` in those namespaces as stored, by id (a plain pool cursor: the
    values exactly as the server returns them). ``table`` is one of the test's literals."""
    marks = ", ".join(["%s"] * len(namespace_ids))
    async with db.pool.acquire() as conn, conn.cursor() as cur:
        await cur.execute(f"SELECT * FROM {table} WHERE namespace_id IN ({marks})",
                          tuple(namespace_ids))
        columns = [d[0] for d in cur.description]
        rows = [dict(zip(columns, r, strict=True)) for r in await cur.fetchall()]
    return {r["id"]: r for r in rows}


async def test_a_lease_returns_the_rows_as_it_wrote_them(own_db: Database) -> None:
    db = own_db
    tenant = await make_tenant(db)
    lapsed = await _lapse(db, tenant, 2)
    rows = await db.transaction("test.lease", lambda cur: leasing.lease_advances(
        cur, owner="engine-4", lease_ms=60_000, limit=100))
    mine = [r for r in rows if r["id"] in lapsed]
    assert len(mine) == 2
    by_id = await _stored(db, "weave_pending_advances", [tenant.namespace_id])
    for row in mine:
        assert by_id[row["id"]] == row
        assert (row["state"], row["lease_owner"], row["attempts"]) == ("LEASED", "engine-4", 2)


async def test_the_lapsed_scan_is_skipped_when_asked_and_paced_by_the_engine(
        own_db: Database) -> None:
    db = own_db
    tenant = await make_tenant(db)
    first = await _lapse(db, tenant, 1)
    # Without the second scan a lapsed lease is not taken; with it, it is.
    assert first.isdisjoint(r["id"] for r in await db.transaction(
        "test.lease", lambda cur: leasing.lease_advances(
            cur, owner="engine-5", lease_ms=60_000, limit=100, lapsed=False)))
    # An engine's first lease transaction scans for lapsed leases; within recover_interval_s
    # the next ones do not, so a lease that lapses meanwhile waits for a later scan.
    paced = Engine(db, owner="engine-paced", lease_ms=60_000, batch=100,
                   recover_interval_s=3600)
    assert first <= {r["id"] for r in (await paced.lease_round()).advances}
    second = await _lapse(db, tenant, 1)
    assert second.isdisjoint(r["id"] for r in (await paced.lease_round()).advances)
    eager = Engine(db, owner="engine-eager", lease_ms=60_000, batch=100)
    assert second <= {r["id"] for r in (await eager.lease_round()).advances}


async def test_one_lease_marks_the_inbox_rows_of_every_namespace_it_scanned(
        own_db: Database) -> None:
    # The mark is one statement per namespace (``namespace_id = ? AND id IN (…)``): rows of two
    # tenants leased in one scan are all marked, and come back as stored.
    db = own_db
    tenants = [await make_tenant(db), await make_tenant(db)]
    tasks = []
    for tenant in tenants:
        for _ in range(2):
            task_id, _, _ = await workflow_task(db, tenant)
            await cancel(db, tenant, task_id)
            tasks.append(task_id)
    rows = await db.transaction("test.lease", lambda cur: leasing.lease_inbox(
        cur, owner="engine-both", lease_ms=60_000, limit=100))
    assert sorted(r["task_id"] for r in rows) == sorted(tasks)
    stored = await _stored(db, "weave_inbox", [t.namespace_id for t in tenants])
    assert {r["namespace_id"] for r in rows} == {t.namespace_id for t in tenants}
    for row in rows:
        assert stored[row["id"]] == row
        assert (row["state"], row["lease_owner"], row["attempts"]) == (
            "LEASED", "engine-both", 1)

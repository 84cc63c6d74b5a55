"""Keyed concurrency permits at their edges (orbit_common/pulse/resources.py, "Keyed
concurrency"), through the lease kernel against the real database.

One valid permit per key, tokens strictly increasing per key, exact-byte keys, no head-of-line
blocking behind a held or exhausted key, the token bound (no wrap), and releases in the very
transaction that ends the attempt: finish, recovery of a lapsed lease or offer, withdrawal by a
cancel. Every test ends with the invariant checker green for its tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.pulse import interventions, leases, resources
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant, StartOutcome
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant
from tests.support import held, pulse
from tests.support.invariants import check
from tests.support.lease_fixtures import (
    add_tasks,
    key_row,
    make_queue,
    open_session,
    task_row,
    wait_db_time_past,
)
from tests.support.waiting import statements_waiting, until

MAX = resources.MAX_TOKEN  # 2**63 - 1


# --- helpers ---------------------------------------------------------------------------------


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


async def claim(db: Database, session: Session, queue: QueueRef, n: int = 10) -> list[Grant]:
    return await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))


async def start(db: Database, tenant: Tenant, grants: Sequence[Grant]) -> list[StartOutcome]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.start",
                                lambda cur: held.start(cur, tenant.namespace_id, refs))


async def finish(db: Database, tenant: Tenant, grant: Grant, outcome: str = "succeeded",
                 **kw: Any) -> str | None:
    if outcome == "succeeded":
        kw.setdefault("result", "{}")
    else:
        kw.setdefault("error", {"type": outcome})
    report = FinishReport(ref=ref(grant), report_id=b"r1", outcome=outcome, **kw)
    (done,) = await db.transaction("test.finish", lambda cur: held.finish(
        cur, tenant.namespace_id, [report]))
    assert done.accepted, done
    return done.task_state


async def run_to_end(db: Database, tenant: Tenant, grant: Grant) -> None:
    (started,) = await start(db, tenant, [grant])
    assert started.approved
    assert await finish(db, tenant, grant) == "SUCCEEDED"


async def recover(db: Database) -> int:
    return await db.transaction("test.recover", lambda cur: leases.recover_expired(cur, 1000))


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]

    return await db.read("test.rows", body)


async def permits(db: Database, tenant: Tenant, key: bytes) -> list[dict[str, Any]]:
    """The key's permit rows in token order."""
    return await rows(db, "SELECT p.* FROM pulse_permits p JOIN pulse_concurrency_limits l"
                          " ON l.namespace_id = p.namespace_id AND l.id = p.limit_id"
                          " WHERE p.namespace_id = %s AND l.key_digest = %s ORDER BY p.token",
                      tenant.namespace_id, resources.key_digest(key))


async def set_revision(db: Database, tenant: Tenant, key: bytes, revision: int) -> None:
    async def body(cur: Any) -> None:
        await cur.execute("UPDATE pulse_concurrency_limits SET revision = %s"
                          " WHERE namespace_id = %s AND key_digest = %s",
                          (revision, tenant.namespace_id, resources.key_digest(key)))

    await db.transaction("test.revision", body)


async def push_back(db: Database, tenant: Tenant, task_ids: Sequence[bytes], seconds: int) -> None:
    """Make tasks due earlier (so they come first in claim order), deterministically."""
    async def body(cur: Any) -> None:
        for task_id in task_ids:
            await cur.execute("UPDATE pulse_tasks SET available_at = available_at - INTERVAL %s"
                              " SECOND WHERE namespace_id = %s AND id = %s",
                              (seconds, tenant.namespace_id, task_id))

    await db.transaction("test.push_back", body)


def green(conn: pymysql.connections.Connection[Any], tenant: Tenant) -> None:
    assert check(conn, [tenant.namespace_id]) == []


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> QueueRef:
    return await make_queue(db, tenant)


@pytest.fixture
async def session(db: Database, tenant: Tenant, queue: QueueRef) -> Session:
    return await open_session(db, tenant, [queue])


# --- one holder per key ----------------------------------------------------------------------


async def test_one_valid_permit_per_key_and_the_next_token_is_larger(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    first, second = await add_tasks(db, tenant, queue, 2, concurrency_key=b"acct-1")
    await push_back(db, tenant, [first], 1)
    (held,) = await claim(db, session, queue)
    assert held.task_id == first
    assert (held.concurrency_key, held.concurrency_token) == (b"acct-1", 1)
    green(sync_conn, tenant)
    # Neither a second claim nor another session gets the key while the grant is valid,
    # offered or running.
    other = await open_session(db, tenant, [queue])
    assert await claim(db, session, queue) == []
    (started,) = await start(db, tenant, [held])
    assert started.approved
    assert await claim(db, other, queue) == []
    assert (await task_row(db, tenant, second))["state"] == "WAITING"
    row = await key_row(db, tenant, b"acct-1")
    assert row is not None
    assert (row["held_permits"], row["revision"]) == (1, 1)

    assert await finish(db, tenant, held) == "SUCCEEDED"
    row = await key_row(db, tenant, b"acct-1")
    assert row is not None
    assert (row["held_permits"], row["revision"]) == (0, 2)
    (after,) = await claim(db, other, queue)
    assert after.task_id == second
    assert after.concurrency_token == 3 > held.concurrency_token
    (attempt,) = await rows(db, "SELECT concurrency_token FROM pulse_attempts"
                                " WHERE namespace_id = %s AND id = %s",
                            tenant.namespace_id, after.attempt_id)
    assert attempt["concurrency_token"] == 3
    found = await permits(db, tenant, b"acct-1")
    assert [(p["token"], p["release_reason"]) for p in found] == [(1, "SUCCEEDED"), (3, None)]
    assert found[0]["released_at"] <= found[1]["acquired_at"]
    green(sync_conn, tenant)


async def test_different_keys_and_unkeyed_tasks_run_in_parallel(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    for key in (b"a", b"b", b"c"):
        await add_tasks(db, tenant, queue, 2, concurrency_key=key)
    await add_tasks(db, tenant, queue, 3)
    grants = await claim(db, session, queue, 50)
    keyed = sorted(g.concurrency_key for g in grants if g.concurrency_key is not None)
    assert keyed == [b"a", b"b", b"c"]  # one per key, in one claim
    assert sum(1 for g in grants if g.concurrency_key is None) == 3
    assert {g.concurrency_token for g in grants if g.concurrency_key} == {1}
    assert await claim(db, session, queue, 50) == []  # the second of each key waits
    green(sync_conn, tenant)


async def test_keys_are_exact_bytes(
    db: Database, tenant: Tenant, api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """No case folding, trimming or Unicode normalisation: these are five different keys."""
    queue_id = await pulse.create_queue(db, tenant.namespace_id, "exact")
    spellings = ["K", "k", "K ", "\u00e9", "e\u0301"]
    for spelling in spellings:
        response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks",
                                  json={"queue": "exact", "handler": "noop",
                                        "concurrency_key": spelling}, headers=tenant.auth)
        assert response.status == 201, await response.text()
        assert (await response.json())["concurrency_key"] == spelling
    stored = await rows(db, "SELECT scope_key FROM pulse_concurrency_limits"
                            " WHERE namespace_id = %s", tenant.namespace_id)
    assert sorted(r["scope_key"] for r in stored) == sorted(s.encode() for s in spellings)
    (found,) = await rows(db, "SELECT gate_id FROM pulse_queues WHERE namespace_id = %s"
                              " AND id = %s", tenant.namespace_id, queue_id)
    queue = QueueRef(id=queue_id, name="exact", gate_id=found["gate_id"])
    session = await open_session(db, tenant, [queue])
    grants = await claim(db, session, queue, 50)
    assert sorted(g.concurrency_key for g in grants) == sorted(s.encode() for s in spellings)
    green(sync_conn, tenant)


# --- head-of-line ----------------------------------------------------------------------------


async def test_a_run_on_a_held_key_does_not_block_the_tasks_behind_it(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    busy = await add_tasks(db, tenant, queue, 101, concurrency_key=b"busy")
    await push_back(db, tenant, busy, 60)  # all 101 come first in claim order
    (holder,) = await claim(db, session, queue, 1)
    assert holder.concurrency_key == b"busy"
    (other,) = await add_tasks(db, tenant, queue, concurrency_key=b"quiet")
    (plain,) = await add_tasks(db, tenant, queue)
    # A claim of one finds the first task whose key is free, past the 100 waiting on "busy".
    (first,) = await claim(db, session, queue, 1)
    (second,) = await claim(db, session, queue, 1)
    assert {first.task_id, second.task_id} == {other, plain}
    assert await claim(db, session, queue, 1) == []
    green(sync_conn, tenant)


# --- the token bound ---------------------------------------------------------------------------


async def test_one_grant_fits_below_the_bound_and_then_the_key_is_refused(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """A grant needs revision + 2 <= 2**63 - 1 (its release must fit too). From 2**63 - 3 one
    grant and its release fit; at 2**63 - 2 (and 2**63 - 1) the key is refused and its tasks
    stay WAITING: nothing wraps, nothing overflows."""
    await add_tasks(db, tenant, queue, 2, concurrency_key=b"edge")
    await set_revision(db, tenant, b"edge", MAX - 2)
    (last,) = await claim(db, session, queue)
    assert last.concurrency_token == MAX - 1
    assert await claim(db, session, queue) == []
    await run_to_end(db, tenant, last)
    row = await key_row(db, tenant, b"edge")
    assert row is not None
    assert (row["revision"], row["held_permits"]) == (MAX, 0)
    assert await claim(db, session, queue) == []
    left = await rows(db, "SELECT state, attempts_used FROM pulse_tasks WHERE namespace_id = %s"
                          " AND concurrency_key = 'edge' AND state <> 'SUCCEEDED'",
                      tenant.namespace_id)
    assert left == [{"state": "WAITING", "attempts_used": 0}]
    row = await key_row(db, tenant, b"edge")
    assert row is not None
    assert (row["revision"], row["held_permits"]) == (MAX, 0)

    # Started one below: after one grant and release the key sits at 2**63 - 2 and is refused.
    await add_tasks(db, tenant, queue, 2, concurrency_key=b"edge-2")
    await set_revision(db, tenant, b"edge-2", MAX - 3)
    (grant,) = await claim(db, session, queue)
    assert (grant.concurrency_key, grant.concurrency_token) == (b"edge-2", MAX - 2)
    await run_to_end(db, tenant, grant)
    row = await key_row(db, tenant, b"edge-2")
    assert row is not None
    assert row["revision"] == MAX - 1
    assert await claim(db, session, queue) == []
    green(sync_conn, tenant)


async def test_an_exhausted_key_does_not_block_the_tasks_behind_it(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    spent = await add_tasks(db, tenant, queue, 21, concurrency_key=b"spent")
    await push_back(db, tenant, spent, 60)
    await set_revision(db, tenant, b"spent", MAX - 3)
    (last,) = await claim(db, session, queue, 1)  # the key's last grant ...
    await run_to_end(db, tenant, last)  # ... and release: at 2**63 - 2 it is spent for good
    (behind,) = await add_tasks(db, tenant, queue, concurrency_key=b"fresh")
    (grant,) = await claim(db, session, queue, 1)
    assert grant.task_id == behind
    green(sync_conn, tenant)


# --- releases commit with the end of the attempt ---------------------------------------------


async def test_recovery_of_a_lapsed_lease_releases_the_permit_in_its_transaction(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    (task_id,) = await add_tasks(db, tenant, queue, concurrency_key=b"lapse", rerun_safe=True,
                                 execution_lease_ms=100)
    (grant,) = await claim(db, session, queue)
    (started,) = await start(db, tenant, [grant])
    assert started.approved
    assert started.lease_expires_at is not None
    # Held while the lease runs, and still held after it lapsed until recovery runs.
    await wait_db_time_past(db, started.lease_expires_at.replace(tzinfo=None))
    assert await claim(db, session, queue) == []
    row = await key_row(db, tenant, b"lapse")
    assert row is not None
    assert (row["held_permits"], row["revision"]) == (1, 1)
    assert await recover(db) >= 1
    (permit,) = await permits(db, tenant, b"lapse")
    (attempt,) = await rows(db, "SELECT state, finished_at FROM pulse_attempts"
                                " WHERE namespace_id = %s AND id = %s",
                            tenant.namespace_id, grant.attempt_id)
    assert attempt["state"] == permit["release_reason"] == "LEASE_EXPIRED"
    assert permit["released_at"] == attempt["finished_at"]  # one transaction, one instant
    row = await key_row(db, tenant, b"lapse")
    assert row is not None
    assert (row["held_permits"], row["revision"]) == (0, 2)
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"  # rerun-safe retry
    (again,) = await claim(db, session, queue)
    assert again.task_id == task_id
    assert again.concurrency_token == 3 > grant.concurrency_token
    green(sync_conn, tenant)


async def test_a_lapsed_offer_and_a_withdrawn_offer_release_their_permits(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    (lapsing,) = await add_tasks(db, tenant, queue, concurrency_key=b"offer", offer_lease_ms=100)
    (offer,) = await claim(db, session, queue)
    assert offer.task_id == lapsing
    await wait_db_time_past(db, offer.offer_expires_at.replace(tzinfo=None))
    assert await recover(db) >= 1
    (regrant,) = await claim(db, session, queue)
    assert regrant.task_id == lapsing
    assert regrant.concurrency_token == 3
    who = await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))
    await interventions.cancel_task(db, who, namespace=tenant.namespace, task_id=lapsing,
                                    reason="withdraw")
    found = await permits(db, tenant, b"offer")
    assert [(p["token"], p["release_reason"]) for p in found] == [
        (1, "OFFER_EXPIRED"), (3, "WITHDRAWN")]
    row = await key_row(db, tenant, b"offer")
    assert row is not None
    assert (row["held_permits"], row["revision"]) == (0, 4)
    assert all(o.reason == "attempt_finished" for o in await start(db, tenant, [regrant]))
    green(sync_conn, tenant)


async def test_every_outcome_releases_the_key(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """succeeded, failed (retryable and not), unknown, cancelled: each ends the attempt and
    releases its permit in the finish transaction; a retry waits for the key like anyone."""
    who = await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))
    cases = [("succeeded", {}, "SUCCEEDED"), ("failed", {"retryable": True}, "WAITING"),
             ("failed", {"retryable": False}, "FAILED"), ("unknown", {}, "NEEDS_REVIEW"),
             ("cancelled", {}, "CANCELLED")]
    tokens = []
    for number, (outcome, extra, state) in enumerate(cases):
        key = f"outcome-{number}".encode()
        (task_id,) = await add_tasks(db, tenant, queue, concurrency_key=key, max_attempts=2)
        (grant,) = await claim(db, session, queue)
        assert grant.task_id == task_id
        (started,) = await start(db, tenant, [grant])
        assert started.approved
        if outcome == "cancelled":
            await interventions.cancel_task(db, who, namespace=tenant.namespace,
                                            task_id=task_id, reason="stop")
        assert await finish(db, tenant, grant, outcome, **extra) == state
        row = await key_row(db, tenant, key)
        assert row is not None
        assert (row["held_permits"], row["revision"]) == (0, 2)
        tokens.append(grant.concurrency_token)
        if state == "WAITING":
            (retry,) = await claim(db, session, queue)
            assert (retry.task_id, retry.concurrency_token) == (task_id, 3)
            await run_to_end(db, tenant, retry)
    assert tokens == [1] * len(cases)
    green(sync_conn, tenant)


async def test_a_manual_retry_queues_for_the_same_key(
    db: Database, tenant: Tenant, queue: QueueRef, session: Session,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    who = await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))
    (failed,) = await add_tasks(db, tenant, queue, concurrency_key=b"again", max_attempts=1)
    (grant,) = await claim(db, session, queue)
    (started,) = await start(db, tenant, [grant])
    assert started.approved
    assert await finish(db, tenant, grant, "failed") == "FAILED"
    (holder,) = await add_tasks(db, tenant, queue, concurrency_key=b"again")
    (held,) = await claim(db, session, queue)
    assert held.task_id == holder
    retried = await interventions.retry_task(db, who, namespace=tenant.namespace, task_id=failed,
                                             reason="again", rerun_confirmed=True)
    successor = bytes.fromhex(retried.body["id"])
    assert (await task_row(db, tenant, successor))["concurrency_key"] == b"again"
    assert await claim(db, session, queue) == []  # the key is held by another task
    await run_to_end(db, tenant, held)
    (next_grant,) = await claim(db, session, queue)
    assert (next_grant.task_id, next_grant.concurrency_token) == (successor, 5)
    green(sync_conn, tenant)


# --- grant order is time order -----------------------------------------------------------------


async def test_a_grant_records_when_it_took_the_key_not_when_its_claim_began(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """A claim reads the database time first and reaches the key's row last. Held up in
    between (here: on its queue row) while another queue's task takes, uses and releases the
    same key, it must still record its permit as acquired after that release: no two holders
    of one key at any instant, and grant order (tokens) is time order."""
    q1, q2 = await make_queue(db, tenant), await make_queue(db, tenant)
    (task_a,) = await add_tasks(db, tenant, q1, concurrency_key=b"shared")
    (task_b,) = await add_tasks(db, tenant, q2, concurrency_key=b"shared")
    s1, s2 = await open_session(db, tenant, [q1]), await open_session(db, tenant, [q2])
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold_q2(cur: Any) -> None:
        await cur.execute("SELECT id FROM pulse_queues WHERE namespace_id = %s AND id = %s"
                          " FOR UPDATE", (tenant.namespace_id, q2.id))
        locked.set()
        await release.wait()

    holder = asyncio.create_task(db.transaction("test.hold", hold_q2))
    await locked.wait()
    late = asyncio.create_task(claim(db, s2, q2, 1))
    try:
        await wait_for_lock_wait(sync_conn)  # the claim read its time and waits on q2's row
        (first,) = await claim(db, s1, q1, 1)
        assert first.task_id == task_a
        await run_to_end(db, tenant, first)
    finally:
        release.set()
        await holder
    (second,) = await late
    assert second.task_id == task_b
    assert second.concurrency_token == 3 > first.concurrency_token
    found = await permits(db, tenant, b"shared")
    assert [p["token"] for p in found] == [1, 3]
    assert found[0]["released_at"] <= found[1]["acquired_at"]
    green(sync_conn, tenant)


async def wait_for_lock_wait(conn: pymysql.connections.Connection[Any],
                             timeout: float = 10) -> None:
    """Poll until the claim's locking read of a queue row (leases.QUEUE_FOR_UPDATE) is in
    progress in this test's database: it would finish at once unless it waits for the lock.
    (PROCESSLIST, not INNODB_TRX: that one needs the PROCESS privilege.)"""
    await until(lambda: statements_waiting(
        conn, "%max_concurrent_attempts FROM pulse_queues%FOR UPDATE%"), timeout=timeout,
        message="the claim to wait for the queue row")

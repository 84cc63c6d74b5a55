"""Concurrent first uses of one idempotency key (platform/idempotency.py), single and batch.

Each race holds the first transaction open after it recorded the identity, and lets the second
reach its INSERT, where it waits on the unique index (``statements_waiting``). Then the first
commits (the second replays it), or stays open past the second's lock wait (the second answers
``409 idempotency_in_progress`` and writes nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.model import ids
from orbit_common.platform import idempotency
from orbit_common.platform.idempotency import Claim, Entry, IdempotencyRequest, Replay
from tests.conftest import Tenant
from tests.support.waiting import statements_waiting, until

INSERTING = "INSERT INTO orbit_idempotency_keys%"


def request(tenant: Tenant, key: str, body: Any = None) -> IdempotencyRequest:
    return IdempotencyRequest.build(namespace_id=tenant.namespace_id, operation="test.race",
                                    scope=b"", key=key, request=body or {"n": 1},
                                    credential_id=ids.new_id())


@pytest.fixture
async def impatient(db_url: DatabaseUrl) -> AsyncIterator[Database]:
    """A one-connection pool whose lock waits end after 1 s (the default is 10 s)."""
    pool = await open_database(db_url, minsize=1, maxsize=1)

    async def short(cur: Any) -> None:
        await cur.execute("SET SESSION innodb_lock_wait_timeout = 1")

    await pool.transaction("test.lock_wait", short)
    try:
        yield pool
    finally:
        await pool.close()


async def race(db: Database, sync_conn: pymysql.connections.Connection[Any],
               first: Callable[[Any], Awaitable[Any]],
               second: Callable[[], Awaitable[Any]], *, commit_first: bool = True
               ) -> tuple[Any, Any]:
    """Run ``first`` in a transaction held open until ``second`` waits at its INSERT."""
    recorded = asyncio.Event()
    release = asyncio.Event()

    async def held(cur: Any) -> Any:
        out = await first(cur)
        recorded.set()
        await release.wait()
        return out

    winner = asyncio.create_task(db.transaction("test.first", held))
    await until(recorded.is_set, message="the first use to record its identity")
    loser = asyncio.create_task(second())
    try:
        await until(lambda: statements_waiting(sync_conn, INSERTING),
                    message="the second use to wait at its insert")
        if commit_first:
            release.set()
            return await winner, await loser
        try:
            return None, await loser
        finally:
            release.set()
            await winner
    finally:
        release.set()


async def test_the_second_first_use_replays_the_committed_winner(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    req = request(tenant, "k-single")

    async def first(cur: Any) -> Replay:
        return await idempotency.once(cur, req, lambda: asyncio.sleep(0, Replay(
            status=201, body={"winner": True}, resource_id=None)))

    _, second = await race(db, sync_conn, first, lambda: db.transaction(
        "test.second", lambda cur: idempotency.once(cur, req, never)))
    assert second == Replay(status=201, body={"winner": True}, resource_id=None)


async def never() -> Replay:
    raise AssertionError("a replayed request must not run its effect")


async def test_a_different_request_racing_on_the_key_is_a_conflict(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    async def first(cur: Any) -> Any:
        return await idempotency.begin(cur, request(tenant, "k-conflict"), ids.new_id())

    with pytest.raises(errors.IdempotencyConflict):
        await race(db, sync_conn, first, lambda: db.transaction(
            "test.second", lambda cur: idempotency.once(
                cur, request(tenant, "k-conflict", {"n": 2}), never)))


async def test_a_winner_still_running_answers_in_progress_and_writes_nothing(
    db: Database, impatient: Database, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    req = request(tenant, "k-slow")

    async def first(cur: Any) -> Any:
        return await idempotency.begin(cur, req, ids.new_id())

    async def second() -> Any:
        return await impatient.transaction("test.second", lambda cur: idempotency.once(
            cur, req, never))

    started = time.monotonic()
    with pytest.raises(idempotency.IdempotencyInProgress) as caught:
        await race(db, sync_conn, first, second, commit_first=False)
    assert caught.value.status == 409
    assert caught.value.code == "idempotency_in_progress"
    # Answered after one lock wait, not after the runner's retries of it.
    assert time.monotonic() - started < 5
    with sync_conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM orbit_idempotency_keys WHERE namespace_id = %s AND"
                    " operation = 'test.race' AND idem_key = 'k-slow'", (tenant.namespace_id,))
        assert cur.fetchone()[0] == 1  # only the first one's record


async def test_batches_overlapping_on_a_key_replay_it_and_claim_the_rest(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    shared, mine, theirs = (request(tenant, k) for k in ("b-shared", "b-mine", "b-theirs"))
    answer = Replay(status=201, body={"receipt": "theirs"}, resource_id=ids.new_id())

    async def first(cur: Any) -> list[Replay | Claim]:
        return await idempotency.record_many(cur, [
            Entry(request=theirs, record_id=ids.new_id(), response=answer),
            Entry(request=shared, record_id=ids.new_id(), response=answer)])

    _, outcomes = await race(db, sync_conn, first, lambda: db.transaction(
        "test.second", lambda cur: idempotency.claim_many(cur, [
            Entry(request=mine, record_id=ids.new_id()),
            Entry(request=shared, record_id=ids.new_id())])))
    assert isinstance(outcomes[0], Claim)
    assert outcomes[1] == answer

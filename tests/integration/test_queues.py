"""The queue transactions against the real server: how they serialise with the lease protocol's
row locks, and authorization re-checked inside each transaction (orbit_common.pulse.queues).

Waiting is never a sleep: a test that needs "the transaction is now blocked on a lock" polls
``information_schema.PROCESSLIST`` until the blocked statement is executing on the server.
"""

from __future__ import annotations

import asyncio
import decimal
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.platform import credentials
from orbit_common.platform.audit import Actor
from orbit_common.pulse import queues
from tests.conftest import Tenant, unique


async def _principal(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


async def _create(db: Database, principal: credentials.Principal, tenant: Tenant,
                  name: str, **settings: Any) -> dict[str, Any]:
    outcome = await queues.create_queue(
        db, principal, namespace=tenant.namespace, name=name,
        settings=queues.QueueSettings(**settings), idempotency_key=None,
    )
    assert outcome.status == 201
    body: dict[str, Any] = outcome.body
    return body


def _row(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> dict[str, Any]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
        assert row is not None
        return dict(row)


async def _reached_the_server(db_url: DatabaseUrl, task: asyncio.Task[Any], prefix: str) -> None:
    """Return once a statement starting with ``prefix`` is executing on the server (poll, no
    sleep-and-hope). While the holder keeps its row lock, such a statement can only be waiting
    for it."""
    conn = connect_sync(db_url, autocommit=True)
    try:
        for _ in range(4000):
            assert not task.done(), "the transaction finished instead of waiting for the lock"
            with conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                            " WHERE COMMAND = 'Query' AND INFO LIKE %s", (prefix + "%",))
                row = cur.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.005)  # yield so the transaction under test makes progress
        raise AssertionError(f"no statement {prefix!r} ever reached the server")
    finally:
        conn.close()


async def _while_holding(
    db_url: DatabaseUrl, lock_sql: str, args: tuple[Any, ...], waits_in: str,
    action: Callable[[], Awaitable[Any]],
) -> Any:
    """Run ``action`` while another connection holds ``lock_sql``'s row lock; release it once
    ``action`` is seen waiting, and return ``action``'s result."""
    holder = connect_sync(db_url, autocommit=False)
    try:
        with holder.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute(lock_sql, args)
        task = asyncio.create_task(action())
        await _reached_the_server(db_url, task, waits_in)
        holder.commit()
        return await asyncio.wait_for(task, 30)
    finally:
        holder.close()


async def test_an_update_waits_for_a_runtime_counter_change_and_keeps_it(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    principal = await _principal(db, tenant)
    name = unique("busy")
    created = await _create(db, principal, tenant, name)
    queue_id = bytes.fromhex(created["id"])

    # What a claim does: bump the counter under the queue row lock, without a new revision.
    updated = await _while_holding(
        db_url,
        "UPDATE pulse_queues SET active_attempts = active_attempts + 1"
        " WHERE namespace_id = %s AND id = %s",
        (tenant.namespace_id, queue_id),
        queues.UPDATE_SETTINGS_IF_REVISION.strip()[:24],
        lambda: queues.update_queue(db, principal, namespace=tenant.namespace, name=name,
                                    revision=1, patch=queues.QueuePatch(max_attempts=8)),
    )
    assert (updated["revision"], updated["active_attempts"]) == (2, 1)
    assert updated["retry"]["max_attempts"] == 8
    row = _row(sync_conn, "SELECT revision, active_attempts, max_attempts FROM pulse_queues"
                          " WHERE id = %s", queue_id)
    assert row == {"revision": 2, "active_attempts": 1, "max_attempts": 8}


async def test_a_pause_waits_for_a_claim_reading_the_gate(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    principal = await _principal(db, tenant)
    name = unique("gated")
    created = await _create(db, principal, tenant, name)
    gate_id = _row(sync_conn, "SELECT gate_id FROM pulse_queues WHERE id = %s",
                   bytes.fromhex(created["id"]))["gate_id"]

    # A claim or a start reads the gate with a shared lock; the pause must wait for it, so a
    # grant decided on OPEN commits before the gate turns PAUSED, never after.
    paused = await _while_holding(
        db_url,
        "SELECT state FROM pulse_execution_gates WHERE namespace_id = %s AND id = %s"
        " LOCK IN SHARE MODE",
        (tenant.namespace_id, gate_id),
        queues.SELECT_GATE_FOR_UPDATE.strip()[:40],
        lambda: queues.set_paused(db, principal, namespace=tenant.namespace, name=name,
                                  paused=True, reason="drain"),
    )
    assert paused["gate"] == {"state": "PAUSED", "control_revision": 2, "reason": "drain"}


async def test_a_config_update_and_a_pause_do_not_block_each_other(
    db: Database, db_url: DatabaseUrl, tenant: Tenant
) -> None:
    principal = await _principal(db, tenant)
    name = unique("apart")
    created = await _create(db, principal, tenant, name)
    # Hold the queue row (as a config update would); a pause touches only the gate row.
    holder = connect_sync(db_url, autocommit=False)
    try:
        with holder.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute("SELECT id FROM pulse_queues WHERE namespace_id = %s AND id = %s"
                        " FOR UPDATE", (tenant.namespace_id, bytes.fromhex(created["id"])))
        paused = await asyncio.wait_for(queues.set_paused(
            db, principal, namespace=tenant.namespace, name=name, paused=True, reason="drain"), 5)
        assert paused["paused"] is True
    finally:
        holder.rollback()
        holder.close()


@pytest.mark.parametrize("operation", ["get", "list", "create", "update", "pause"])
async def test_a_credential_revoked_after_authentication_is_refused_inside_the_transaction(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
    operation: str,
) -> None:
    principal = await _principal(db, tenant)  # authenticated: a snapshot
    name = unique("q")
    await _create(db, principal, tenant, name)
    await db.transaction("test.revoke", lambda cur: credentials.revoke_credential(
        cur, prefix=principal.prefix, actor=Actor.operator("pytest"), reason="leaked"))
    before = _row(sync_conn, "SELECT COUNT(*) AS n FROM pulse_queues WHERE namespace_id = %s",
                  tenant.namespace_id)
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "get": lambda: queues.get_queue(db, principal, namespace=tenant.namespace, name=name),
        "list": lambda: queues.list_queues(db, principal, namespace=tenant.namespace,
                                           after_name="", limit=10),
        "create": lambda: _create(db, principal, tenant, unique("q")),
        "update": lambda: queues.update_queue(db, principal, namespace=tenant.namespace,
                                              name=name, revision=1,
                                              patch=queues.QueuePatch(description="x")),
        "pause": lambda: queues.set_paused(db, principal, namespace=tenant.namespace,
                                           name=name, paused=True, reason="drain"),
    }
    with pytest.raises(errors.InvalidCredential):
        await calls[operation]()
    assert _row(sync_conn, "SELECT COUNT(*) AS n FROM pulse_queues WHERE namespace_id = %s",
                tenant.namespace_id) == before


async def test_settings_validation_matches_the_check_constraints(
    sync_conn: pymysql.connections.Connection[Any], tenant: Tenant
) -> None:
    """Every value the domain accepts at a bound, the database accepts; one step beyond, the
    domain refuses it (so no CHECK violation can surface as a 500)."""
    edges = [
        queues.QueueSettings(),
        queues.QueueSettings(offer_lease_ms=100, execution_lease_ms=100,
                             max_concurrent_attempts=1, description="d" * 512),
        queues.QueueSettings(offer_lease_ms=3_600_000, execution_lease_ms=86_400_000,
                             max_concurrent_attempts=queues.INT_MAX),
        queues.QueueSettings(retry=queues.RetryPolicy(
            max_attempts=1, initial_ms=0, max_ms=0, multiplier=decimal.Decimal(1),
            jitter=decimal.Decimal(0))),
        queues.QueueSettings(retry=queues.RetryPolicy(
            max_attempts=1000, initial_ms=queues.INT_MAX, max_ms=queues.INT_MAX,
            multiplier=decimal.Decimal("999.999"), jitter=decimal.Decimal(1))),
    ]
    for settings in edges:
        assert settings.problems() == []
        retry = settings.retry
        with sync_conn.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute(queues.INSERT_QUEUE, (
                tenant.namespace_id, secrets.token_bytes(16), unique("edge"),
                secrets.token_bytes(16), settings.description,
                settings.offer_lease_ms, settings.execution_lease_ms, retry.max_attempts,
                retry.initial_ms, retry.max_ms, retry.multiplier, retry.jitter,
                settings.max_concurrent_attempts, settings.max_unfinished_tasks,
                settings.max_starts_per_second,
            ))
            cur.execute("ROLLBACK")
    beyond = {
        "$.offer_lease_ms": queues.QueueSettings(offer_lease_ms=99),
        "$.execution_lease_ms": queues.QueueSettings(execution_lease_ms=86_400_001),
        "$.retry.max_attempts": queues.QueueSettings(
            retry=queues.RetryPolicy(max_attempts=1001)),
        "$.retry.initial_ms": queues.QueueSettings(retry=queues.RetryPolicy(initial_ms=-1)),
        "$.retry.max_ms": queues.QueueSettings(retry=queues.RetryPolicy(initial_ms=10,
                                                                        max_ms=9)),
        "$.retry.multiplier": queues.QueueSettings(
            retry=queues.RetryPolicy(multiplier=decimal.Decimal("0.999"))),
        "$.retry.jitter": queues.QueueSettings(
            retry=queues.RetryPolicy(jitter=decimal.Decimal("1.0001"))),
        "$.max_concurrent_attempts": queues.QueueSettings(max_concurrent_attempts=0),
        "$.max_unfinished_tasks": queues.QueueSettings(max_unfinished_tasks=0),
        "$.max_starts_per_second": queues.QueueSettings(max_starts_per_second=0),
        "$.description": queues.QueueSettings(description="d" * 513),
    }
    for path, settings in beyond.items():
        assert [p["path"] for p in settings.problems()] == [path]

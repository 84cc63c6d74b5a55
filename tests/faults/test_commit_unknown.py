"""A connection lost during COMMIT: re-checked by the operation's identity, never re-run blind.

A TCP proxy in front of the real server cuts the client's connection exactly at COMMIT, either
before forwarding it (the server rolls back) or after the server answered (committed, but the
client cannot know).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.db.tx import TX_COMMIT_UNKNOWN
from orbit_common.platform import commands, credentials
from orbit_common.platform.audit import Actor
from tests.conftest import Tenant
from tests.support.proxy import Fault, FaultProxy


async def _count(db: Database, sql: str, *params: Any) -> int:
    async def body(cur: Any) -> int:
        await cur.execute(sql, params)
        return int((await cur.fetchone())["n"])

    return await db.read("test.count", body)


async def _principal(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


def _resolution(name: str, resolution: str) -> float:
    return TX_COMMIT_UNKNOWN.labels(name, resolution)._value.get()  # type: ignore[no-any-return]


@pytest.mark.parametrize("with_key", [True, False], ids=["idempotency-key", "no-key"])
async def test_commit_that_happened_is_found_by_identity(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant, with_key: bool
) -> None:
    principal = await _principal(db, tenant)
    name = f"ns-{secrets.token_hex(5)}"
    before = _resolution("namespaces.create", "committed")
    proxy.arm(Fault.CUT_AFTER_COMMIT)

    outcome = await commands.create_namespace(
        proxied_db, principal, name=name, description="",
        idempotency_key="k-" + name if with_key else None,
    )

    assert proxy.fired.is_set()
    assert outcome.status == 201
    assert outcome.body["name"] == name
    assert _resolution("namespaces.create", "committed") == before + 1
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_namespaces WHERE name = %s",
                        name) == 1
    ns_id = bytes.fromhex(outcome.body["id"])
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_events WHERE aggregate_id = %s",
                        ns_id) == 1
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_audit_events"
                            " WHERE resource_id = %s", ns_id) == 1
    if with_key:
        assert await _count(
            db, "SELECT COUNT(*) AS n FROM orbit_idempotency_keys WHERE idem_key = %s",
            ("k-" + name).encode()) == 1


async def test_commit_that_did_not_happen_is_rerun_with_the_same_identity(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant
) -> None:
    principal = await _principal(db, tenant)
    name = f"ns-{secrets.token_hex(5)}"
    before = _resolution("namespaces.create", "not_committed")
    proxy.arm(Fault.CUT_BEFORE_COMMIT)

    outcome = await commands.create_namespace(
        proxied_db, principal, name=name, description="", idempotency_key="k-" + name
    )

    assert proxy.fired.is_set()
    assert outcome.status == 201
    assert _resolution("namespaces.create", "not_committed") == before + 1
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_namespaces WHERE name = %s",
                        name) == 1
    stored = await _count(db, "SELECT COUNT(*) AS n FROM orbit_namespaces WHERE id = %s",
                          bytes.fromhex(outcome.body["id"]))
    assert stored == 1


async def test_without_a_recheck_the_outcome_is_reported_unknown(
    db: Database, proxied_db: Database, proxy: FaultProxy
) -> None:
    application = f"app-{secrets.token_hex(5)}"
    proxy.arm(Fault.CUT_AFTER_COMMIT)

    with pytest.raises(errors.CommitOutcomeUnknown):
        await commands.bootstrap(proxied_db, application=application, namespace=application,
                                 credential="c", actor=Actor.operator("pytest"))

    # It did commit: that is exactly why the caller must be told "unknown", not "failed".
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_applications WHERE name = %s",
                        application) == 1


async def test_a_caller_cancelled_during_commit_waits_for_the_commit(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant
) -> None:
    """Cancellation mid-COMMIT must not abandon the commit: the write lands, then the task
    sees CancelledError. (Abandoning it would close the connection and the server would roll
    back: the proxy reports that as ``client_left_during_delay``.)"""
    principal = await _principal(db, tenant)
    name = f"ns-{secrets.token_hex(5)}"
    proxy.delay_s = 0.5
    proxy.arm(Fault.DELAY_COMMIT)
    task = asyncio.create_task(commands.create_namespace(
        proxied_db, principal, name=name, description="", idempotency_key=None))
    await asyncio.wait_for(proxy.fired.wait(), 10)  # COMMIT is being held by the proxy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not proxy.client_left_during_delay
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_namespaces WHERE name = %s",
                        name) == 1

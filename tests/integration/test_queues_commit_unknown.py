"""Queue writes whose connection is lost at COMMIT: re-checked by identity, never run twice.

A TCP proxy in front of the real server cuts the client's connection exactly at COMMIT, either
after the server committed (the client cannot know) or before forwarding it (nothing committed).
"""

from __future__ import annotations

from typing import Any

import pytest

from orbit_common.db.pool import Database
from orbit_common.db.tx import TX_COMMIT_UNKNOWN
from orbit_common.platform import credentials
from orbit_common.pulse import queues
from tests.conftest import Tenant, unique
from tests.support.proxy import Fault, FaultProxy


@pytest.fixture
async def principal(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


async def _count(db: Database, sql: str, *params: Any) -> int:
    async def body(cur: Any) -> int:
        await cur.execute(sql, params)
        return int((await cur.fetchone())["n"])

    return await db.read("test.count", body)


def _resolution(name: str, resolution: str) -> float:
    return TX_COMMIT_UNKNOWN.labels(name, resolution)._value.get()  # type: ignore[no-any-return]


async def _create(db: Database, principal: credentials.Principal, tenant: Tenant, name: str,
                  key: str | None = None) -> dict[str, Any]:
    outcome = await queues.create_queue(db, principal, namespace=tenant.namespace, name=name,
                                        settings=queues.QueueSettings(), idempotency_key=key)
    assert outcome.status == 201
    body: dict[str, Any] = outcome.body
    return body


@pytest.mark.parametrize("with_key", [True, False], ids=["idempotency-key", "no-key"])
async def test_a_create_that_committed_is_found_by_identity(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal, with_key: bool,
) -> None:
    name = unique("lost")
    before = _resolution("queues.create", "committed")
    proxy.arm(Fault.CUT_AFTER_COMMIT)
    created = await _create(proxied_db, principal, tenant, name,
                            key="k-" + name if with_key else None)
    assert proxy.fired.is_set()
    assert _resolution("queues.create", "committed") == before + 1
    assert created["name"] == name
    queue_id = bytes.fromhex(created["id"])
    assert await _count(db, "SELECT COUNT(*) AS n FROM pulse_queues WHERE namespace_id = %s",
                        tenant.namespace_id) == 1
    assert await _count(db, "SELECT COUNT(*) AS n FROM pulse_execution_gates"
                            " WHERE namespace_id = %s", tenant.namespace_id) == 1
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_events WHERE aggregate_id = %s",
                        queue_id) == 1


async def test_a_create_that_did_not_commit_is_rerun_with_the_same_ids(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal,
) -> None:
    name = unique("rerun")
    before = _resolution("queues.create", "not_committed")
    proxy.arm(Fault.CUT_BEFORE_COMMIT)
    created = await _create(proxied_db, principal, tenant, name, key="k-" + name)
    assert proxy.fired.is_set()
    assert _resolution("queues.create", "not_committed") == before + 1
    assert await _count(db, "SELECT COUNT(*) AS n FROM pulse_queues WHERE id = %s",
                        bytes.fromhex(created["id"])) == 1


async def test_an_update_that_committed_answers_success_not_stale_revision(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal,
) -> None:
    name = unique("upd")
    created = await _create(db, principal, tenant, name)
    before = _resolution("queues.update", "committed")
    proxy.arm(Fault.CUT_AFTER_COMMIT)
    # A blind re-run would find revision 2 and answer 409; the re-check finds the transition.
    updated = await queues.update_queue(proxied_db, principal, namespace=tenant.namespace,
                                        name=name, revision=1,
                                        patch=queues.QueuePatch(description="after"))
    assert proxy.fired.is_set()
    assert _resolution("queues.update", "committed") == before + 1
    assert (updated["revision"], updated["description"]) == (2, "after")
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_events WHERE aggregate_id = %s"
                            " AND event_type = 'queue.updated'",
                        bytes.fromhex(created["id"])) == 1


async def test_an_update_that_did_not_commit_is_rerun(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal,
) -> None:
    name = unique("upd")
    await _create(db, principal, tenant, name)
    proxy.arm(Fault.CUT_BEFORE_COMMIT)
    updated = await queues.update_queue(proxied_db, principal, namespace=tenant.namespace,
                                        name=name, revision=1,
                                        patch=queues.QueuePatch(offer_lease_ms=2000))
    assert proxy.fired.is_set()
    assert (updated["revision"], updated["offer_lease_ms"]) == (2, 2000)


@pytest.mark.parametrize("fault", [Fault.CUT_AFTER_COMMIT, Fault.CUT_BEFORE_COMMIT])
async def test_a_pause_whose_commit_is_lost_is_applied_once(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal, fault: Fault,
) -> None:
    name = unique("pause")
    created = await _create(db, principal, tenant, name)
    proxy.arm(fault)
    paused = await queues.set_paused(proxied_db, principal, namespace=tenant.namespace,
                                     name=name, paused=True, reason="lost commit")
    assert proxy.fired.is_set()
    assert paused["gate"] == {"state": "PAUSED", "control_revision": 2, "reason": "lost commit"}
    assert await _count(db, "SELECT COUNT(*) AS n FROM orbit_audit_events WHERE resource_id = %s"
                            " AND action = 'queue.pause'", bytes.fromhex(created["id"])) == 1

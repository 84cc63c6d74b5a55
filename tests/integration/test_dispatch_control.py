"""The platform-wide dispatch freeze and fence-all (orbit_common/pulse/control.py).

The freeze is platform-wide, so each test that sets it thaws it again (the ``frozen`` fixture):
tests of one xdist worker share a database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pymysql
import pytest

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.platform.audit import Actor
from orbit_common.pulse import control, leases
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant
from orbit_common.pulse.workers import SessionLost
from tests.conftest import Tenant
from tests.integration.test_admin_cli import orbit_admin
from tests.support import held
from tests.support.invariants import check_db
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, scalar, task_row
from tests.support.waiting import statements_waiting, until

ACTOR = Actor.operator("ops@pytest")


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


@pytest.fixture
async def thawed(db: Database) -> AsyncIterator[None]:
    """Dispatch is open before and after the test, whatever the test did."""
    await control.thaw(db, actor=ACTOR, reason="test set-up")
    try:
        yield
    finally:
        await control.thaw(db, actor=ACTOR, reason="test clean-up")


async def audit_rows(db: Database, action: str) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("SELECT actor_id, reason, before_doc, after_doc FROM"
                          " orbit_audit_events WHERE action = %s ORDER BY occurred_at, id",
                          (action,))
        return [dict(r) for r in await cur.fetchall()]

    return await db.read("test.audit", body)


async def test_frozen_claims_grant_nothing_and_starts_are_refused_without_spending(
    db: Database, tenant: Tenant, thawed: None,
) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 3)
    session = await open_session(db, tenant, [queue])
    grants = await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, 1))
    assert len(grants) == 1
    before = await task_row(db, tenant, grants[0].task_id)

    controls, changed = await control.freeze(db, actor=ACTOR, reason="restore drill")
    assert changed
    assert controls.dispatch_state is control.DispatchState.FROZEN
    # Freezing again changes (and audits) nothing.
    assert not (await control.freeze(db, actor=ACTOR, reason="again"))[1]

    assert await db.transaction("test.claim", lambda cur: leases.claim(
        cur, session, queue, 10)) == []
    assert await scalar(db, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND"
                        " state = 'WAITING'", tenant.namespace_id) == 2

    (refused,) = await db.transaction("test.start", lambda cur: held.start(
        cur, tenant.namespace_id, [ref(grants[0])]))
    assert not refused.approved
    assert refused.reason == "dispatch_frozen"
    after = await task_row(db, tenant, grants[0].task_id)
    # Nothing withdrawn, nothing spent: the offer stands exactly as it was.
    assert after["state"] == "LEASED"
    assert after["revision"] == before["revision"]
    assert after["attempts_used"] == before["attempts_used"]
    assert after["current_attempt_id"] == grants[0].attempt_id
    assert await scalar(db, "SELECT state FROM pulse_attempts WHERE namespace_id = %s AND"
                        " id = %s", tenant.namespace_id, grants[0].attempt_id) == "OFFERED"

    _, changed = await control.thaw(db, actor=ACTOR, reason="restore checked")
    assert changed
    (started,) = await db.transaction("test.start", lambda cur: held.start(
        cur, tenant.namespace_id, [ref(grants[0])]))
    assert started.approved
    assert len(await db.transaction("test.claim", lambda cur: leases.claim(
        cur, session, queue, 10))) == 2

    freezes = await audit_rows(db, "dispatch.freeze")
    assert freezes[-1]["reason"] == "restore drill"
    assert freezes[-1]["actor_id"] == "ops@pytest"
    assert '"dispatch":"FROZEN"' in freezes[-1]["after_doc"].replace(" ", "")
    assert (await audit_rows(db, "dispatch.thaw"))[-1]["reason"] == "restore checked"
    assert await check_db(db, [tenant.namespace_id]) == []


async def test_fence_all_needs_the_freeze(db: Database, thawed: None) -> None:
    with pytest.raises(control.DispatchNotFrozen):
        await control.fence_all(db, actor=ACTOR, reason="too early")
    with pytest.raises(control.errors.ValidationFailed):
        await control.freeze(db, actor=ACTOR, reason="   ")


async def test_fence_all_fences_sessions_and_recovery_decides_every_lease(
    db: Database, tenant: Tenant, thawed: None,
) -> None:
    queue = await make_queue(db, tenant, max_attempts=3)
    safe = await add_tasks(db, tenant, queue, 2, rerun_safe=True)
    unsafe = await add_tasks(db, tenant, queue, 2, rerun_safe=False)
    offered = await add_tasks(db, tenant, queue, 1, rerun_safe=False)
    session = await open_session(db, tenant, [queue])
    grants = await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, 4))
    by_task = {g.task_id: g for g in grants}
    assert set(by_task) == set(safe + unsafe)
    await db.transaction("test.start", lambda cur: held.start(
        cur, tenant.namespace_id, [ref(g) for g in grants]))
    (offer,) = await db.transaction("test.claim", lambda cur: leases.claim(
        cur, session, queue, 1))
    assert offer.task_id == offered[0]

    await control.freeze(db, actor=ACTOR, reason="restored the 02:00 backup")
    report = await control.fence_all(db, actor=ACTOR, reason="restored the 02:00 backup")
    assert report.sessions >= 1
    assert report.leases >= 5

    assert await scalar(db, "SELECT state FROM pulse_worker_sessions WHERE namespace_id = %s"
                        " AND id = %s", tenant.namespace_id, session.id) == "FENCED"
    with pytest.raises(SessionLost):
        await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, 1))
    # The fenced holders' calls no longer count: their session is fenced (the execution
    # identity), so a renewal is refused and a finish becomes late evidence.
    renewed = await db.transaction("test.renew", lambda cur: held.renew(
        cur, tenant.namespace_id, [ref(by_task[safe[0]])]))
    assert (renewed[0].renewed, renewed[0].reason) == (False, "session_fenced")
    (finished,) = await db.transaction("test.finish", lambda cur: held.finish(
        cur, tenant.namespace_id, [FinishReport(ref=ref(by_task[unsafe[0]]), report_id=b"r",
                                                outcome="succeeded", result="{}")]))
    assert (finished.accepted, finished.reason) == (False, "session_fenced")

    # The recovery scan decides every lease by the usual rules, while dispatch stays frozen.
    await db.transaction("test.recover", lambda cur: leases.recover_expired(cur, 1000))
    states = {t: (await task_row(db, tenant, t))["state"] for t in safe + unsafe + offered}
    assert {states[t] for t in safe} == {"WAITING"}
    assert {states[t] for t in unsafe} == {"NEEDS_REVIEW"}
    assert states[offered[0]] == "WAITING"
    fresh = await open_session(db, tenant, [queue])
    assert await db.transaction("test.claim", lambda cur: leases.claim(
        cur, fresh, queue, 10)) == []

    # Running it again finds nothing left to fence.
    again = await control.fence_all(db, actor=ACTOR, reason="to be sure")
    assert again.leases == 0
    assert await scalar(db, "SELECT state FROM pulse_worker_sessions WHERE namespace_id = %s"
                        " AND id = %s", tenant.namespace_id, fresh.id) == "FENCED"

    fences = await audit_rows(db, "sessions.fence_all")
    assert [f["reason"] for f in fences[-2:]] == ["restored the 02:00 backup", "to be sure"]
    assert (await control.read(db)).sessions_fenced_at == again.fenced_at
    await control.thaw(db, actor=ACTOR, reason="reconciled")
    thawed_session = await open_session(db, tenant, [queue])
    regranted = await db.transaction("test.claim", lambda cur: leases.claim(
        cur, thawed_session, queue, 10))
    assert {g.task_id for g in regranted} == {*safe, *offered}
    assert await check_db(db, [tenant.namespace_id]) == []


async def test_a_freeze_waits_for_the_claim_in_flight(
    db: Database, tenant: Tenant, thawed: None, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """A claim holds the control row shared until it commits: the freeze waits for it, and no
    claim that starts after the freeze committed grants anything."""
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 2)
    session = await open_session(db, tenant, [queue])
    inside = asyncio.Event()
    release = asyncio.Event()

    async def slow_claim(cur: Any) -> list[Grant]:
        grants = await leases.claim(cur, session, queue, 1)
        inside.set()
        await release.wait()  # the claim's transaction stays open, holding its locks
        return grants

    claiming = asyncio.create_task(db.transaction("test.claim", slow_claim))
    await until(inside.is_set, message="the claim to hold its locks")
    freezing = asyncio.create_task(control.freeze(db, actor=ACTOR, reason="race"))
    await until(lambda: statements_waiting(sync_conn, "%orbit_platform_controls%FOR UPDATE%"),
                message="the freeze to wait for the claim")
    assert not freezing.done()
    release.set()
    assert len(await claiming) == 1
    assert (await freezing)[1]
    assert await db.transaction("test.claim", lambda cur: leases.claim(
        cur, session, queue, 1)) == []


async def test_admin_commands(db: Database, db_url: DatabaseUrl, thawed: None) -> None:
    """``orbit admin dispatch …`` and ``sessions fence-all``: the real CLI as a subprocess."""
    refused = await orbit_admin(db_url, "sessions", "fence-all", "--reason", "not frozen yet")
    assert refused.code == 1
    assert "dispatch_not_frozen" in refused.err
    assert (await orbit_admin(db_url, "dispatch", "freeze")).code == 2  # --reason is required

    frozen = await orbit_admin(db_url, "dispatch", "freeze", "--reason", "cli drill")
    assert frozen.code == 0, frozen.err
    assert frozen.json()["dispatch"] == "FROZEN"
    assert frozen.json()["changed"] is True
    fenced = await orbit_admin(db_url, "sessions", "fence-all", "--reason", "cli drill")
    assert fenced.code == 0, fenced.err
    assert set(fenced.json()) == {"fenced_at", "sessions_fenced", "leases_expired"}
    status = (await orbit_admin(db_url, "dispatch", "status")).json()
    assert status["dispatch"] == "FROZEN"
    assert status["sessions_fenced_at"] == fenced.json()["fenced_at"]
    thawed_ = await orbit_admin(db_url, "dispatch", "thaw", "--reason", "cli drill over")
    assert thawed_.json()["dispatch"] == "OPEN"
    actions = [(r["actor_id"], r["reason"]) for r in await audit_rows(db, "dispatch.thaw")]
    assert actions[-1] == ("ops@pytest", "cli drill over")

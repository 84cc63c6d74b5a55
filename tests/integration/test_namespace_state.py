"""What a DISABLED namespace means to workers and the scheduler (docs/api/namespaces.md).

The API side (every namespaced route answers namespace_not_found) is in
tests/integration/api/test_namespaces.py.
"""

from __future__ import annotations

import datetime as dt

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.platform import namespaces
from orbit_common.platform.audit import Actor
from tests.conftest import Tenant
from tests.integration.test_leases import claim
from tests.integration.test_schedule_firing import fire_until_idle, ledger, make_schedule
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, task_row


async def set_state(db: Database, tenant: Tenant, to: namespaces.NamespaceState) -> None:
    await db.transaction("test.namespace", lambda cur: namespaces.set_namespace_state(
        cur, name=tenant.namespace, to=to, actor=Actor.operator("pytest"), reason="test"))


async def test_a_session_of_a_disabled_namespace_claims_nothing(
    db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    await set_state(db, tenant, namespaces.NamespaceState.DISABLED)
    with pytest.raises(errors.NamespaceNotFound):
        await claim(db, session, queue)
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"
    with pytest.raises(errors.NamespaceNotFound):  # and no new session registers
        await open_session(db, tenant, [queue])

    await set_state(db, tenant, namespaces.NamespaceState.ACTIVE)
    (grant,) = await claim(db, session, queue)
    assert grant.task_id == task_id


async def test_the_schedules_of_a_disabled_namespace_do_not_fire(
    db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    schedule_id = await make_schedule(
        db, tenant, queue.id, rule={"interval_ms": 60_000}, since=dt.timedelta(minutes=3),
        misfire="EACH", grace_ms=3_600_000)
    await set_state(db, tenant, namespaces.NamespaceState.DISABLED)
    await fire_until_idle(db)
    assert await ledger(db, tenant, schedule_id) == []

    await set_state(db, tenant, namespaces.NamespaceState.ACTIVE)
    # The disabled pass put the check off; an operator's enable is followed by the next check.
    await db.transaction("test.due", lambda cur: cur.execute(
        "UPDATE pulse_schedules SET check_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s"
        " AND id = %s", (tenant.namespace_id, schedule_id)))
    await fire_until_idle(db)
    assert [r["outcome"] for r in await ledger(db, tenant, schedule_id)][:1] == ["FIRED"]


async def test_disable_needs_a_reason_and_is_idempotent(db: Database, tenant: Tenant) -> None:
    with pytest.raises(errors.ValidationFailed):
        await db.transaction("test.namespace", lambda cur: namespaces.set_namespace_state(
            cur, name=tenant.namespace, to=namespaces.NamespaceState.DISABLED,
            actor=Actor.operator("pytest"), reason=""))
    await set_state(db, tenant, namespaces.NamespaceState.DISABLED)
    await set_state(db, tenant, namespaces.NamespaceState.DISABLED)
    row = await db.read("t", lambda cur: namespaces.find_namespace(cur, tenant.namespace))
    assert row is not None
    assert (row.state, row.revision) == (namespaces.NamespaceState.DISABLED, 2)

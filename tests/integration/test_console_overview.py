"""The console's overview read model (orbit_common/console/overview.py) over real task states
reached through the lease protocol, and filtered by the caller's grants."""

from __future__ import annotations

import pytest

from orbit_common import errors
from orbit_common.console import overview
from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.test_leases import claim, expire_now, finish, recover, report, start
from tests.support.lease_fixtures import add_tasks, make_queue, open_session


async def principal(db: Database, key: str) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, key))


async def test_queue_figures_failures_and_sections(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant, name="a-busy")
    quiet = await make_queue(db, tenant, name="b-quiet")
    await add_tasks(db, tenant, quiet, 1)
    task_ids = await add_tasks(db, tenant, queue, 5)
    session = await open_session(db, tenant, [queue])
    grants = await claim(db, session, queue, n=3)
    await start(db, tenant, grants)
    by_task = {g.task_id: g for g in grants}
    failed, uncertain, running = (by_task[t] for t in task_ids if t in by_task)
    await finish(db, tenant, [report(failed, "failed", error={"type": "Boom"})])
    await expire_now(db, tenant, uncertain.task_id)  # not rerun-safe: NEEDS_REVIEW
    await recover(db)

    found = await overview.namespace_overview(db, await principal(db, tenant.api_key),
                                              namespace=tenant.namespace)
    lines = {q.name: q for q in found.queues}
    busy = lines["a-busy"]
    assert (busy.depth, busy.waiting, busy.running, busy.needs_review) == (4, 2, 1, 1)
    assert busy.starts_per_minute == 3
    assert busy.oldest_waiting_s >= 0
    assert (lines["b-quiet"].depth, lines["b-quiet"].running) == (1, 0)
    assert [f.task_id for f in found.failures] == [failed.task_id.hex()]
    assert found.failures[0].queue == "a-busy"
    assert found.failures_counted == 1
    assert found.failure_buckets[-1] == 1  # the newest bucket
    assert sum(found.failure_buckets) == 1
    # An all-access credential sees the delivery and workflow sections (empty here).
    assert (found.delivery_backlog, found.exhausted_deliveries, found.inbox_backlog) == (0, 0, 0)
    assert running.task_id not in {bytes.fromhex(f.task_id) for f in found.failures}


async def test_a_narrow_credential_sees_only_its_queues_and_sections(
    db: Database, tenant: Tenant
) -> None:
    mine = await make_queue(db, tenant, name="mine-1")
    other = await make_queue(db, tenant, name="other-1")
    await add_tasks(db, tenant, mine, 2)
    await add_tasks(db, tenant, other, 3)
    key = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                       "actions": ["queues.read", "tasks.read"],
                                       "queues": ["mine-*"]}])
    found = await overview.namespace_overview(db, await principal(db, key),
                                              namespace=tenant.namespace)
    assert [q.name for q in found.queues] == ["mine-1"]
    assert found.delivery_backlog is None
    assert found.inbox_backlog is None


@pytest.mark.parametrize("forged", ["other", "bad\udcffname", "UPPER", "x" * 300])
async def test_another_applications_or_a_malformed_namespace_is_not_found(
    db: Database, tenant: Tenant, forged: str
) -> None:
    namespace = (await make_tenant(db)).namespace if forged == "other" else forged
    with pytest.raises(errors.NamespaceNotFound):
        await overview.namespace_overview(db, await principal(db, tenant.api_key),
                                          namespace=namespace)

"""``orbit bench tasks``' kernel phase survives a machine slower than the session timeout.

Its sessions heartbeat like a dispatcher's: here the session timeout is 1 s and no task is due
until 2.5 s after the sessions registered (a slow machine, compressed), so without heartbeats
every claim after the first second fails with ``session_lost``.
"""

from __future__ import annotations

from typing import Any

from bench.kernelcycle import run_kernel_cycle
from orbit_common.db.pool import Database, DatabaseUrl
from tests.conftest import Tenant
from tests.support.lease_fixtures import add_tasks, make_queue, scalar


async def test_the_kernel_cycle_outlives_the_session_timeout(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
) -> None:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue, 6)

    async def later(cur: Any) -> None:
        await cur.execute("UPDATE pulse_tasks SET available_at = UTC_TIMESTAMP(6)"
                          " + INTERVAL 2500000 MICROSECOND WHERE namespace_id = %s",
                          (tenant.namespace_id,))

    await db.transaction("test.delay", later)
    result = await run_kernel_cycle(db_url, tenant.api_key, tenant.namespace, queue.name,
                                    tasks=6, loops=2, session_ttl_s=1)
    assert result["kernel_tasks"] == 6
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
                        " AND state = 'SUCCEEDED'", tenant.namespace_id) == 6

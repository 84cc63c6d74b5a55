"""Fixtures for relay (subscription and delivery) tests: real result events made through the
real ending writer, subscriptions through the real commands."""

from __future__ import annotations

from typing import Any

from orbit_common.db.pool import Database
from orbit_common.model.sealing import Sealer, new_key_text
from orbit_common.platform import credentials
from orbit_common.pulse import interventions, leases
from orbit_common.pulse.leases import AttemptRef, FinishReport
from orbit_common.pulse.workers import QueueRef
from orbit_common.relay import deliveries, fanout, model, subscriptions
from orbit_common.relay.model import RelaySettings
from tests.conftest import Tenant
from tests.support import held
from tests.support.lease_fixtures import add_tasks, open_session

SETTINGS = RelaySettings(sealer=Sealer.from_config(new_key_text()))


async def principal_of(db: Database, api_key: str) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, api_key))


async def cancelled_results(db: Database, tenant: Tenant, queue: QueueRef, count: int = 1, *,
                            handler: str = "noop") -> list[bytes]:
    """``count`` tasks that end CANCELLED (one result event each, in order)."""
    who = await principal_of(db, tenant.api_key)
    task_ids = await add_tasks(db, tenant, queue, count, handler=handler)
    for task_id in task_ids:
        await interventions.cancel_task(db, who, namespace=tenant.namespace, task_id=task_id,
                                        reason="test")
    return task_ids


async def finished_results(db: Database, tenant: Tenant, queue: QueueRef,
                           outcomes: list[str], *, handler: str = "noop") -> list[bytes]:
    """Tasks claimed, started and finished with ``outcomes`` ("succeeded", "failed")."""
    await add_tasks(db, tenant, queue, len(outcomes), handler=handler, max_attempts=1)
    session = await open_session(db, tenant, [queue], handlers=(handler,))
    grants = await db.transaction("test.claim", lambda cur: leases.claim(
        cur, session, queue, len(outcomes)))
    refs = [AttemptRef(attempt_id=g.attempt_id, token=g.token, generation=g.generation)
            for g in grants]
    await db.transaction("test.start", lambda cur: held.start(cur, tenant.namespace_id, refs))
    reports = []
    for ref, outcome in zip(refs, outcomes, strict=True):
        extra: dict[str, Any] = ({"result": '{"ok": true}'} if outcome == "succeeded"
                                 else {"error": {"type": outcome}})
        reports.append(FinishReport(ref=ref, report_id=b"r1", outcome=outcome, **extra))
    await db.transaction("test.finish",
                         lambda cur: held.finish(cur, tenant.namespace_id, reports))
    return [g.task_id for g in grants]


async def subscribe(db: Database, tenant: Tenant, name: str = "sub", *,
                    settings: RelaySettings = SETTINGS, api_key: str | None = None,
                    **fields: Any) -> subscriptions.Created:
    who = await principal_of(db, api_key or tenant.api_key)
    doc = {"name": name, "kind": "PULL", **fields}
    spec = model.parse_create(doc, settings.policy)
    return await subscriptions.create_subscription(db, who, settings,
                                                   namespace=tenant.namespace, spec=spec)


async def fan_out_all(db: Database, tenant: Tenant, batch: int = 500) -> int:
    """Fan out this tenant's subscriptions until they are caught up."""
    total = 0

    async def targets(cur: Any) -> list[bytes]:
        await cur.execute("SELECT id FROM orbit_subscriptions WHERE namespace_id = %s"
                          " AND state = 'ACTIVE' ORDER BY name", (tenant.namespace_id,))
        return [r["id"] for r in await cur.fetchall()]

    for subscription_id in await db.read("test.subs", targets):
        while True:
            outcome = await db.transaction("test.fan_out", lambda cur, s=subscription_id:
                                           fanout.fan_out_subscription(
                                               cur, tenant.namespace_id, s, batch))
            if outcome is None:
                break
            total += outcome.created
            if outcome.caught_up:
                break
    return total


async def lease(db: Database, tenant: Tenant, name: str = "sub", limit: int = 10,
                api_key: str | None = None) -> list[deliveries.Leased]:
    who = await principal_of(db, api_key or tenant.api_key)
    return await deliveries.lease_deliveries(db, who, namespace=tenant.namespace, name=name,
                                             limit=limit)


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]

    return await db.read("test.rows", body)


async def subscription_row(db: Database, tenant: Tenant, name: str = "sub") -> dict[str, Any]:
    (row,) = await rows(db, "SELECT * FROM orbit_subscriptions WHERE namespace_id = %s"
                        " AND name = %s", tenant.namespace_id, name)
    return row


async def delivery_rows(db: Database, tenant: Tenant) -> list[dict[str, Any]]:
    return await rows(db, "SELECT * FROM orbit_deliveries WHERE namespace_id = %s"
                      " ORDER BY sequence", tenant.namespace_id)


async def expire_delivery_leases(db: Database, tenant: Tenant) -> None:
    """Move this tenant's delivery leases into the past (as if their holders went silent)."""

    async def body(cur: Any) -> None:
        await cur.execute("UPDATE orbit_deliveries SET lease_expires_at = UTC_TIMESTAMP(6)"
                          " - INTERVAL 1 SECOND WHERE namespace_id = %s AND state = 'LEASED'",
                          (tenant.namespace_id,))

    await db.transaction("test.expire_deliveries", body)


async def make_due(db: Database, tenant: Tenant) -> None:
    """Make this tenant's PENDING deliveries due now (skip their backoff)."""

    async def body(cur: Any) -> None:
        await cur.execute("UPDATE orbit_deliveries SET available_at = UTC_TIMESTAMP(6)"
                          " - INTERVAL 1 SECOND WHERE namespace_id = %s AND state = 'PENDING'",
                          (tenant.namespace_id,))

    await db.transaction("test.due", body)

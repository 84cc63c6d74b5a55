"""The console's audit log read (orbit_common/console/audit_log.py): keyset pages bound to their
filters, the filters, and who may read it (``namespaces.manage``)."""

from __future__ import annotations

import pytest

from orbit_common import errors
from orbit_common.console import audit_log
from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.pulse import queues
from tests.conftest import Tenant, make_key, make_tenant


async def principal(db: Database, key: str) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, key))


async def paused_queues(db: Database, tenant: Tenant, count: int) -> None:
    who = await principal(db, tenant.api_key)
    for n in range(count):
        name = f"audited-{n}"
        await queues.create_queue(db, who, namespace=tenant.namespace, name=name,
                                  settings=queues.QueueSettings(), idempotency_key=None)
        await queues.set_paused(db, who, namespace=tenant.namespace, name=name, paused=True,
                                reason=f"reason {n}")


async def test_pages_newest_first_with_filters(db: Database, tenant: Tenant) -> None:
    await paused_queues(db, tenant, 3)
    who = await principal(db, tenant.api_key)
    seen: list[str] = []
    cursor = None
    pause = audit_log.AuditFilter(action="queue.pause")
    while True:
        page = await audit_log.list_audit(db, who, namespace=tenant.namespace, filters=pause,
                                          cursor=cursor, limit=2)
        seen += [item["reason"] for item in page.items]
        assert all(item["action"] == "queue.pause" for item in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ["reason 2", "reason 1", "reason 0"]
    everything = await audit_log.list_audit(db, who, namespace=tenant.namespace,
                                            filters=audit_log.AuditFilter(), cursor=None)
    assert [i["action"] for i in everything.items].count("queue.create") == 3
    first = await audit_log.list_audit(db, who, namespace=tenant.namespace,
                                       filters=pause, cursor=None, limit=1)
    with pytest.raises(errors.InvalidCursor):  # a cursor belongs to its filter
        await audit_log.list_audit(db, who, namespace=tenant.namespace,
                                   filters=audit_log.AuditFilter(), cursor=first.next_cursor)
    with pytest.raises(errors.ValidationFailed):
        await audit_log.list_audit(db, who, namespace=tenant.namespace,
                                   filters=audit_log.AuditFilter(actor_kind="robot"),
                                   cursor=None)


async def test_only_an_operator_grant_reads_it(db: Database, tenant: Tenant) -> None:
    await paused_queues(db, tenant, 1)
    narrow = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                          "actions": ["queues.read", "queues.manage"]}])
    with pytest.raises(errors.Forbidden):
        await audit_log.list_audit(db, await principal(db, narrow), namespace=tenant.namespace,
                                   filters=audit_log.AuditFilter(), cursor=None)
    other = await make_tenant(db)
    with pytest.raises(errors.NamespaceNotFound):
        await audit_log.list_audit(db, await principal(db, tenant.api_key),
                                   namespace=other.namespace, filters=audit_log.AuditFilter(),
                                   cursor=None)

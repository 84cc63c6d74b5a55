"""A submission whose COMMIT is cut: re-checked by its pre-made task ids, never accepted twice.

The fault proxy (tests/support/proxy.py) drops the connection at COMMIT, after the server
committed (the outcome is unknown to the client) or before forwarding it (rolled back).
"""

from __future__ import annotations

from typing import Any

import pytest

from orbit_common.db.pool import Database
from orbit_common.db.tx import TX_COMMIT_UNKNOWN
from orbit_common.model import jsondoc, strict
from orbit_common.platform import credentials
from orbit_common.pulse import tasks
from tests.conftest import Tenant
from tests.support import pulse
from tests.support.proxy import Fault, FaultProxy


@pytest.fixture
async def principal(db: Database, tenant: Tenant) -> credentials.Principal:
    await pulse.create_queue(db, tenant.namespace_id, "work")
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


def items(principal: credentials.Principal, count: int, key: str | None) -> list[tasks.Item]:
    raw = {"queue": "work", "handler": "h", "input": {"n": 1.10}}
    dto = strict.structure(raw, tasks.SubmitRequest)
    spec, _ = tasks.validate(dto, jsondoc.loads_strict('{"n": 1.10}', keep_number_text=True),
                             "$")
    assert spec is not None
    return tasks.make_items(principal, [
        (spec, None if key is None else f"{key}-{n}", f"$.tasks[{n}]", "-")
        for n in range(count)])


async def rows(db: Database, namespace_id: bytes) -> dict[str, int]:
    async def body(cur: Any) -> dict[str, int]:
        counts = {}
        for table, where in (("pulse_tasks", "namespace_id = %s"),
                             ("orbit_events", "namespace_id = %s AND aggregate_type = 'task'"),
                             ("orbit_idempotency_keys", "namespace_id = %s")):
            await cur.execute(f"SELECT COUNT(*) AS n FROM {table} WHERE {where}",  # literals
                              (namespace_id,))
            counts[table] = int((await cur.fetchone())["n"])
        return counts

    return await db.read("test.count", body)


def resolved(resolution: str) -> float:
    return TX_COMMIT_UNKNOWN.labels("tasks.submit", resolution)._value.get()  # type: ignore[no-any-return]


@pytest.mark.parametrize("key", [None, "k"], ids=["no-key", "keys"])
@pytest.mark.parametrize("count", [1, 50])
async def test_a_commit_that_happened_is_found_and_answered_once(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal, key: str | None, count: int,
) -> None:
    batch = items(principal, count, key)
    before = resolved("committed")
    proxy.arm(Fault.CUT_AFTER_COMMIT)
    accepted = await tasks.submit(proxied_db, principal, namespace=tenant.namespace,
                                  items=batch)
    assert proxy.fired.is_set()
    assert resolved("committed") == before + 1
    assert [a.task_id for a in accepted] == [i.task_id for i in batch]
    assert not any(a.replayed for a in accepted)
    assert await rows(db, tenant.namespace_id) == {
        "pulse_tasks": count, "orbit_events": count,
        "orbit_idempotency_keys": 0 if key is None else count}


async def test_a_commit_that_did_not_happen_runs_again_with_the_same_ids(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal,
) -> None:
    batch = items(principal, 10, "k")
    before = resolved("not_committed")
    proxy.arm(Fault.CUT_BEFORE_COMMIT)
    accepted = await tasks.submit(proxied_db, principal, namespace=tenant.namespace,
                                  items=batch)
    assert proxy.fired.is_set()
    assert resolved("not_committed") == before + 1
    assert [a.task_id for a in accepted] == [i.task_id for i in batch]
    assert await rows(db, tenant.namespace_id) == {
        "pulse_tasks": 10, "orbit_events": 10, "orbit_idempotency_keys": 10}


async def test_a_lost_commit_of_pure_replays_replays_again(
    db: Database, proxied_db: Database, proxy: FaultProxy, tenant: Tenant,
    principal: credentials.Principal,
) -> None:
    first = await tasks.submit(db, principal, namespace=tenant.namespace,
                               items=items(principal, 3, "k"))
    proxy.arm(Fault.CUT_AFTER_COMMIT)
    again = await tasks.submit(proxied_db, principal, namespace=tenant.namespace,
                               items=items(principal, 3, "k"))
    assert proxy.fired.is_set()
    assert [a.receipt for a in again] == [a.receipt for a in first]
    assert all(a.replayed for a in again)
    assert await rows(db, tenant.namespace_id) == {
        "pulse_tasks": 3, "orbit_events": 3, "orbit_idempotency_keys": 3}

"""orbit_common.pulse.usage against real rows: the backlog reads and the usage gauges.

The oldest due task is found with two bounded index reads (the module docstring proves the
bound); here it is compared with a plain ``MIN(available_at)`` over random priorities and times.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import prometheus_client
import pytest

from orbit_common.db.pool import Database
from orbit_common.pulse import leases, usage
from orbit_common.pulse.workers import QueueRef
from tests.conftest import Tenant, make_tenant
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, scalar


async def _shift(db: Database, tenant: Tenant, task_id: bytes, seconds: float,
                 priority: int) -> None:
    """Make a WAITING task due ``seconds`` from now (negative: in the past) at ``priority``."""
    async def body(cur: Any) -> None:
        await cur.execute(
            "UPDATE pulse_tasks SET available_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,"
            " priority = %s WHERE namespace_id = %s AND id = %s",
            (int(seconds * 1_000_000), priority, tenant.namespace_id, task_id))
    await db.transaction("test.shift", body)


async def _brute_force_oldest(db: Database, tenant: Tenant, queue: QueueRef,
                              now: dt.datetime) -> dt.datetime | None:
    value = await scalar(
        db, "SELECT MIN(available_at) FROM pulse_tasks WHERE namespace_id = %s AND queue_id = %s"
            " AND state = 'WAITING' AND available_at <= %s",
        tenant.namespace_id, queue.id, now.replace(tzinfo=None))
    return None if value is None else value.replace(tzinfo=dt.UTC)


@pytest.mark.parametrize("seed", range(6))
async def test_the_bounded_oldest_read_equals_a_full_minimum(
    db: Database, tenant: Tenant, seed: int,
) -> None:
    rng = random.Random(seed)
    queue = await make_queue(db, tenant)
    task_ids = await add_tasks(db, tenant, queue, 25)
    for task_id in task_ids:
        # Due or not, spread over ten minutes either side, any priority.
        await _shift(db, tenant, task_id, rng.uniform(-600, 600), rng.randrange(10))
    found = await db.read("test.backlog", lambda cur: usage.backlog(
        cur, tenant.namespace_id, queue.id, count=True))
    expected = await _brute_force_oldest(db, tenant, queue, found.measured_at)
    assert found.oldest_available_at == expected
    due = await scalar(db, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND"
                           " queue_id = %s AND available_at <= %s", tenant.namespace_id,
                       queue.id, found.measured_at.replace(tzinfo=None))
    assert found.due_tasks == due
    if expected is None:
        assert found.oldest_age_ms == 0
    else:
        assert found.oldest_age == found.measured_at - expected


async def test_an_empty_queue_has_no_backlog(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    found = await db.read("test.backlog", lambda cur: usage.backlog(
        cur, tenant.namespace_id, queue.id, count=True))
    assert (found.oldest_available_at, found.due_tasks, found.oldest_age_ms) == (None, 0, 0)


def _value(registry: prometheus_client.CollectorRegistry, name: str,
           **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_the_gauges_are_set_from_real_rows(db: Database, tenant: Tenant) -> None:
    other = await make_tenant(db)
    busy = await make_queue(db, tenant, name="busy")
    idle = await make_queue(db, tenant, name="idle")
    calm = await make_queue(db, other, name="calm")
    waiting = await add_tasks(db, tenant, busy, 3, handler="h")
    keyed = await add_tasks(db, tenant, busy, 1, handler="h", concurrency_key=b"account:1")
    await add_tasks(db, other, calm, 1)
    await _shift(db, tenant, waiting[0], -90, 0)
    await _shift(db, tenant, waiting[1], -30, 9)
    await _shift(db, tenant, waiting[2], 3600, 0)  # not due
    await _shift(db, tenant, keyed[0], -1000, 0)  # claimed below: no longer waiting
    session = await open_session(db, tenant, [busy], handlers=("h",))
    grants = await db.transaction("test.claim", lambda cur: leases.claim(cur, session, busy, 1))
    assert [g.task_id for g in grants] == keyed

    registry = prometheus_client.CollectorRegistry()
    gauges = usage.UsageGauges(registry)
    snapshot = await gauges.refresh(db)

    def value(name: str, **labels: str) -> float | None:
        return _value(registry, name, **labels)

    ns = tenant.namespace
    assert value("orbit_queue_unfinished_tasks", namespace=ns, queue="busy") == 4
    assert value("orbit_queue_unfinished_tasks", namespace=ns, queue="idle") == 0
    assert value("orbit_queue_unfinished_tasks", namespace=other.namespace, queue="calm") == 1
    oldest = value("orbit_queue_oldest_waiting_seconds", namespace=ns, queue="busy")
    assert oldest is not None
    assert 90 <= oldest < 120
    assert value("orbit_queue_oldest_waiting_seconds", namespace=ns, queue="idle") == 0
    calm_age = value("orbit_queue_oldest_waiting_seconds", namespace=other.namespace,
                     queue="calm")
    assert calm_age is not None
    assert 0 <= calm_age < 30
    assert value("orbit_permits_held", namespace=ns) == 1
    assert value("orbit_permits_held", namespace=other.namespace) == 0
    assert idle.name in {lag.queue for lag in snapshot.queues if lag.namespace == ns}

    # A queue (or namespace) that leaves the snapshot leaves the gauges.
    gone = usage.Snapshot(measured_at=snapshot.measured_at,
                          queues=tuple(lag for lag in snapshot.queues
                                       if not (lag.namespace == ns and lag.queue == "idle")),
                          permits_held={k: v for k, v in snapshot.permits_held.items()
                                        if k != other.namespace})
    gauges.set(gone)
    assert value("orbit_queue_unfinished_tasks", namespace=ns, queue="idle") is None
    assert value("orbit_queue_oldest_waiting_seconds", namespace=ns, queue="idle") is None
    assert value("orbit_permits_held", namespace=other.namespace) is None
    assert value("orbit_queue_unfinished_tasks", namespace=ns, queue="busy") == 4


async def test_without_tenant_labels_the_gauges_are_one_series_naming_no_tenant(
    db: Database, tenant: Tenant
) -> None:
    busy = await make_queue(db, tenant, name="busy")
    waiting = await add_tasks(db, tenant, busy, 2, handler="h")
    await _shift(db, tenant, waiting[0], -600, 0)
    registry = prometheus_client.CollectorRegistry()
    snapshot = await usage.UsageGauges(registry, tenant_labels=False).refresh(db)
    assert (tenant.namespace, "busy") in {(lag.namespace, lag.queue) for lag in snapshot.queues}

    text = prometheus_client.generate_latest(registry).decode()
    assert tenant.namespace not in text
    assert 'queue="busy"' not in text
    every = {"namespace": usage.ALL, "queue": usage.ALL}
    # The aggregate of the very snapshot the gauges were set from: sums, and the worst age.
    assert _value(registry, "orbit_queue_unfinished_tasks", **every) == sum(
        lag.unfinished_tasks for lag in snapshot.queues)
    oldest = _value(registry, "orbit_queue_oldest_waiting_seconds", **every)
    assert oldest == max(lag.oldest_waiting for lag in snapshot.queues).total_seconds()
    assert oldest is not None
    assert oldest >= 600
    assert _value(registry, "orbit_permits_held", namespace=usage.ALL) == sum(
        snapshot.permits_held.values())
    series = [s for m in registry.collect() for s in m.samples]
    assert len(series) == 3  # one per gauge


def test_collapsing_an_installation_without_queues_reports_zeros() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    empty = usage.collapsed(usage.Snapshot(measured_at=now, queues=(), permits_held={}))
    assert empty.queues == (usage.QueueLag(namespace=usage.ALL, queue=usage.ALL,
                                           unfinished_tasks=0,
                                           oldest_waiting=dt.timedelta(0)),)
    assert empty.permits_held == {usage.ALL: 0}


async def test_the_default_gauges_are_served_by_the_process_registry(db: Database) -> None:
    first, second = usage.UsageGauges(), usage.UsageGauges()
    assert first.oldest is second.oldest  # registered once per process
    await first.refresh(db)
    text = prometheus_client.generate_latest().decode()
    assert "orbit_queue_unfinished_tasks{" in text

"""Direct-SQL fixtures for lease-protocol tests: queues and WAITING tasks without the API."""

from __future__ import annotations

import datetime as dt
import secrets
from collections import Counter
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import credentials
from orbit_common.pulse import resources, workers
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant
from tests.support.waiting import until


async def make_queue(db: Database, tenant: Tenant, *, name: str | None = None,
                     max_concurrent: int | None = None, offer_lease_ms: int = 30_000,
                     execution_lease_ms: int = 60_000, max_attempts: int = 3) -> QueueRef:
    queue_id, gate_id = ids.new_id(), ids.new_id()
    name = name or f"q-{secrets.token_hex(4)}"

    async def body(cur: Any) -> None:
        await cur.execute(
            "INSERT INTO pulse_execution_gates (namespace_id, id, owner_kind, owner_id, state,"
            " control_revision, created_at, updated_at) VALUES (%s, %s, 'QUEUE', %s, 'OPEN', 1,"
            " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", (tenant.namespace_id, gate_id, queue_id))
        await cur.execute(
            "INSERT INTO pulse_queues (namespace_id, id, name, gate_id, revision, offer_lease_ms,"
            " execution_lease_ms, max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier,"
            " retry_jitter, max_concurrent_attempts, active_attempts, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, 1, %s, %s, %s, 0, 0, 1, 0, %s, 0, UTC_TIMESTAMP(6),"
            " UTC_TIMESTAMP(6))",
            (tenant.namespace_id, queue_id, name, gate_id, offer_lease_ms, execution_lease_ms,
             max_attempts, max_concurrent))

    await db.transaction("test.queue", body)
    return QueueRef(id=queue_id, name=name, gate_id=gate_id)


async def add_tasks(db: Database, tenant: Tenant, queue: QueueRef, count: int = 1, *,
                    handler: str = "noop", rerun_safe: bool = False, max_attempts: int = 3,
                    offer_lease_ms: int = 30_000, execution_lease_ms: int = 60_000,
                    attempt_timeout_ms: int | None = None, deadline_s: float | None = None,
                    input_json: str = "{}", concurrency_key: bytes | None = None) -> list[bytes]:
    """WAITING tasks, with the counters a submission maintains (resources.py)."""
    task_ids = [ids.new_id() for _ in range(count)]
    digest = None if concurrency_key is None else resources.key_digest(concurrency_key)

    async def body(cur: Any) -> None:
        for task_id in task_ids:
            await cur.execute(
                "INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state,"
                " revision, priority, available_at, deadline_at, attempt_timeout_ms,"
                " max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter,"
                " offer_lease_ms, execution_lease_ms, rerun_safe, concurrency_key,"
                " concurrency_key_digest, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, 'WAITING', 1, 0, UTC_TIMESTAMP(6),"
                " IF(%s IS NULL, NULL, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND), %s, %s,"
                " 0, 0, 1, 0, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                (tenant.namespace_id, task_id, queue.id, handler, input_json, deadline_s,
                 int((deadline_s or 0) * 1_000_000), attempt_timeout_ms, max_attempts,
                 offer_lease_ms, execution_lease_ms, rerun_safe, concurrency_key, digest))
        await resources.apply(cur, tenant.namespace_id,
                              resources.Usage(unfinished=Counter({queue.id: count})))
        if concurrency_key is not None:
            await resources.ensure_keys(cur, tenant.namespace_id, [concurrency_key])

    await db.transaction("test.tasks", body)
    return task_ids


async def open_session(db: Database, tenant: Tenant, queues: list[QueueRef], *,
                       handlers: tuple[str, ...] = ("noop",), instance_key: str | None = None,
                       max_in_flight: int = 64) -> Session:
    principal = await db.read("test.auth",
                              lambda cur: credentials.authenticate(cur, tenant.api_key))
    session_id, instance_id = ids.new_id(), ids.new_id()
    return await db.transaction("test.session", lambda cur: workers.register(
        cur, principal, namespace=tenant.namespace,
        instance_key=instance_key or f"worker-{secrets.token_hex(4)}",
        queues=[q.name for q in queues], handlers=list(handlers), max_in_flight=max_in_flight,
        session_id=session_id, instance_id=instance_id, node="test"))


async def task_row(db: Database, tenant: Tenant, task_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, task_id))
        return dict(await cur.fetchone())

    return await db.read("test.task", body)


async def scalar(db: Database, sql: str, *params: Any) -> Any:
    async def body(cur: Any) -> Any:
        await cur.execute(sql, params)
        row = await cur.fetchone()
        return next(iter(row.values()))

    return await db.read("test.scalar", body)


# --- flow control: limits, counters and database time -------------------------------------------

# Limit columns a test may set with plain SQL (identifiers from these fixed whitelists only).
QUEUE_LIMITS = frozenset({"max_unfinished_tasks", "max_concurrent_attempts",
                          "max_starts_per_second"})
APPLICATION_LIMITS = frozenset({"max_unfinished_tasks", "max_active_attempts",
                                "max_reserved_attempts", "max_starts_per_second"})


async def set_queue_limits(db: Database, tenant: Tenant, queue_id: bytes,
                           **limits: int | None) -> None:
    """Set a queue's limits directly (config columns only; counters are never touched)."""
    assert set(limits) <= QUEUE_LIMITS, limits
    assignments = ", ".join(f"{column} = %s" for column in sorted(limits))

    async def body(cur: Any) -> None:
        await cur.execute(f"UPDATE pulse_queues SET {assignments}"
                          " WHERE namespace_id = %s AND id = %s",
                          (*[limits[c] for c in sorted(limits)], tenant.namespace_id, queue_id))

    await db.transaction("test.queue_limits", body)


async def set_application_limits(db: Database, tenant: Tenant, **limits: int | None) -> None:
    """Set the tenant's application-wide limits directly (config columns only)."""
    assert set(limits) <= APPLICATION_LIMITS, limits
    assignments = ", ".join(f"{column} = %s" for column in sorted(limits))

    async def body(cur: Any) -> None:
        await cur.execute(f"SELECT {resources.TRACKED} AS tracked FROM"
                          " orbit_application_resources WHERE application_id = %s",
                          (tenant.application_id,))
        was_tracked = bool((await cur.fetchone())["tracked"])
        await cur.execute(f"UPDATE orbit_application_resources SET {assignments}"
                          " WHERE application_id = %s",
                          (*[limits[c] for c in sorted(limits)], tenant.application_id))
        # As quotas.update_limits: the first count limit starts the counters from a recount.
        await cur.execute(f"SELECT {resources.TRACKED} AS tracked FROM"
                          " orbit_application_resources WHERE application_id = %s",
                          (tenant.application_id,))
        if bool((await cur.fetchone())["tracked"]) and not was_tracked:
            await resources.recount_application(cur, tenant.application_id)

    await db.transaction("test.application_limits", body)


async def queue_counters(db: Database, tenant: Tenant, queue_id: bytes) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute(
            "SELECT unfinished_tasks, active_attempts, starts_in_window, start_window_until,"
            " max_unfinished_tasks, max_concurrent_attempts, max_starts_per_second"
            " FROM pulse_queues WHERE namespace_id = %s AND id = %s",
            (tenant.namespace_id, queue_id))
        return dict(await cur.fetchone())

    return await db.read("test.queue_counters", body)


async def application_counters(db: Database, tenant: Tenant) -> dict[str, Any]:
    """The application's limits, start window and usage: its counters when it keeps them
    (a count limit is set), else the recount the resources view shows."""
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute(
            "SELECT unfinished_tasks, active_attempts, reserved_attempts, starts_in_window,"
            " start_window_until, max_unfinished_tasks, max_active_attempts,"
            " max_reserved_attempts, max_starts_per_second"
            f" , {resources.TRACKED} AS tracked"
            " FROM orbit_application_resources WHERE application_id = %s",
            (tenant.application_id,))
        found = dict(await cur.fetchone())
        if not found["tracked"]:
            # Without a count limit the row's counters are not kept: the usage is a recount.
            usage = await resources.application_usage(cur, tenant.application_id)
            found.update(unfinished_tasks=usage.unfinished_tasks,
                         active_attempts=usage.active_attempts,
                         reserved_attempts=usage.reserved_attempts)
        return found

    return await db.read("test.application_counters", body)


async def key_row(db: Database, tenant: Tenant, key: bytes) -> dict[str, Any] | None:
    """The concurrency key's row (exact bytes), or None."""
    async def body(cur: Any) -> dict[str, Any] | None:
        await cur.execute("SELECT * FROM pulse_concurrency_limits WHERE namespace_id = %s"
                          " AND key_digest = %s",
                          (tenant.namespace_id, resources.key_digest(key)))
        row = await cur.fetchone()
        return None if row is None else dict(row)

    return await db.read("test.key_row", body)


async def db_time(db: Database) -> dt.datetime:
    """The database's clock (naive UTC, as DATETIME(6) columns read)."""
    return (await scalar(db, "SELECT UTC_TIMESTAMP(6)")).replace(tzinfo=None)


async def wait_db_time_past(db: Database, moment: dt.datetime, *, timeout: float = 10) -> None:
    """Poll the database clock until it is past ``moment`` (naive UTC, or aware): database time
    decides leases and windows, so tests wait on it, never on the local clock."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)

    async def passed() -> bool:
        return await db_time(db) > moment

    await until(passed, timeout=timeout, message=f"the database clock to pass {moment}")

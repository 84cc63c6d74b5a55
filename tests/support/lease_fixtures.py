"""Direct-SQL fixtures for lease-protocol tests: queues and WAITING tasks without the API."""

from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import credentials
from orbit_common.pulse import resources, workers
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant


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

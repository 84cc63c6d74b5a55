"""Pulse rows for tests.

Queues are made with the queue module's own insert (gate and queue, no API round trip); the
EXPLAIN seed writes them in bulk with plain SQL. Attempts and late evidence are inserted with
plain SQL so the query tests do not depend on the dispatcher: each helper writes what the real
code would, and nothing more.
"""

from __future__ import annotations

from typing import Any

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.pulse import queues
from orbit_common.pulse.queues import QueueSettings

INSERT_GATE = """
INSERT INTO pulse_execution_gates (namespace_id, id, owner_kind, owner_id, state,
  control_revision, created_at, updated_at)
VALUES (%s, %s, 'QUEUE', %s, 'OPEN', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
INSERT_QUEUE = """
INSERT INTO pulse_queues (namespace_id, id, name, gate_id, offer_lease_ms, execution_lease_ms,
  max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter,
  created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""


def queue_rows(namespace_id: bytes, name: str,
               ) -> tuple[bytes, tuple[Any, ...], tuple[Any, ...]]:
    """The queue id and the parameters of its gate and queue rows (default settings), for
    ``executemany`` of INSERT_GATE and INSERT_QUEUE."""
    d = QueueSettings()
    queue_id, gate_id = ids.new_id(), ids.new_id()
    gate = (namespace_id, gate_id, queue_id)
    queue = (namespace_id, queue_id, name, gate_id, d.offer_lease_ms, d.execution_lease_ms,
             d.retry.max_attempts, d.retry.initial_ms, d.retry.max_ms, d.retry.multiplier,
             d.retry.jitter)
    return queue_id, gate, queue


async def create_queue(db: Database, namespace_id: bytes, name: str,
                       settings: QueueSettings | None = None) -> bytes:
    """A queue with an open gate (default settings unless given); returns its id."""
    queue_id, gate_id = ids.new_id(), ids.new_id()
    await db.transaction("test.queue", lambda cur: queues.insert_queue(
        cur, namespace_id=namespace_id, queue_id=queue_id, gate_id=gate_id, name=name,
        settings=settings or QueueSettings()))
    return queue_id


INSERT_ATTEMPT = """
INSERT INTO pulse_attempts (namespace_id, id, task_id, queue_id, generation, token_digest,
  worker_instance_id, worker_session_id, state, offered_at, started_at, lease_expires_at,
  finished_at, retryable, result, error)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), %s, UTC_TIMESTAMP(6), %s, %s, %s,
  %s)
"""
INSERT_EVIDENCE = """
INSERT INTO pulse_attempt_evidence (namespace_id, id, attempt_id, task_id, generation, kind,
  retryable, payload, rejected_because, received_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)
"""


async def insert_attempt(
    db: Database, *, namespace_id: bytes, task_id: bytes, queue_id: bytes, generation: int,
    state: str = "FAILED", result: str | None = None, error: str | None = '{"type":"boom"}',
) -> bytes:
    """A finished (or live, for OFFERED/RUNNING) attempt row, as the dispatcher would leave it."""
    attempt_id = ids.new_id()
    live = state in {"OFFERED", "RUNNING"}
    started = state != "OFFERED"

    async def body(cur: Any) -> None:
        await cur.execute("SELECT UTC_TIMESTAMP(6) AS now")
        now = (await cur.fetchone())["now"]
        await cur.execute(INSERT_ATTEMPT, (
            namespace_id, attempt_id, task_id, queue_id, generation, b"\x01" * 32,
            ids.new_id(), ids.new_id(), state, now if started else None,
            None if live else now, 0 if state == "FAILED" else None, result, error,
        ))

    await db.transaction("test.attempt", body)
    return attempt_id


async def insert_evidence(
    db: Database, *, namespace_id: bytes, task_id: bytes, attempt_id: bytes, generation: int,
    count: int, payload: str = '{"late":1.50}',
) -> list[bytes]:
    """``count`` late reports about an attempt, one microsecond apart."""
    rows = [(namespace_id, ids.new_id(), attempt_id, task_id, generation, "SUCCEEDED", None,
             payload, "attempt_finished", n) for n in range(count)]

    async def body(cur: Any) -> None:
        await cur.executemany(INSERT_EVIDENCE, rows)

    await db.transaction("test.evidence", body)
    return [r[1] for r in rows]


# Every table a submission writes to: a refused request must leave all of them unchanged.
SUBMIT_TABLES = ("pulse_tasks", "orbit_events", "orbit_idempotency_keys")


def submit_counts(conn: Any) -> dict[str, int]:
    counts = {}
    with conn.cursor() as cur:
        for table in SUBMIT_TABLES:  # fixed whitelist above
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            counts[table] = int(cur.fetchone()[0])
    return counts

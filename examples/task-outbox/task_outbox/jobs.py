"""The business side: a job and its pending request in one transaction, and the job's link to
the receipt (or to the give-up) written by the sender's recording transaction.

:func:`create_job` is the application's business transaction: it inserts the ``sender_jobs``
row and, through :func:`orbit_sdk.outbox.enqueue_async`, the ``sender_outbox`` row, with the
caller's cursor; the caller commits (both rows exist) or rolls back (neither does).
:class:`JobLink` is what the sender calls inside its own transactions, after the outbox row's
guarded update succeeded, so the business row moves together with the request.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Final

import attrs
from orbit_sdk import TaskRequest
from orbit_sdk.models import Task
from orbit_sdk.outbox import OutboxEntry, Receipt, enqueue_async

log = logging.getLogger(__name__)

TABLE: Final = "sender_jobs"


@attrs.frozen(kw_only=True)
class CreatedJob:
    """The job row's id (hex) and the pending request written with it."""

    id: str
    request: OutboxEntry


async def create_job(cur: Any, *, name: str, namespace: str, request: TaskRequest,
                     max_attempts: int = 10,
                     send_within_ms: int = 24 * 3600 * 1000) -> CreatedJob:
    """Insert a job and its pending request with ``cur`` (the caller's transaction; not
    committed here). ``request`` is the task to submit; its input is the job's input.

    Lock order: the new outbox row, then the new job row (both inserts; nothing else is
    locked), the order the sender's recording transaction uses too.
    """
    job_id = secrets.token_bytes(16)
    entry = await enqueue_async(cur, request, namespace=namespace, business_table=TABLE,
                                business_id=job_id.hex(), max_attempts=max_attempts,
                                send_within_ms=send_within_ms)
    await cur.execute(
        "INSERT INTO sender_jobs (id, name, input, state, outbox_id, created_at, updated_at)"
        " VALUES (%s, %s, %s, 'REQUESTED', %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        (job_id, name, entry.input_json, entry.id))
    return CreatedJob(id=job_id.hex(), request=entry)


class JobLink:
    """Moves the ``sender_jobs`` row with its request, inside the sender's transaction."""

    table: Final = TABLE

    async def on_sent(self, cur: Any, entry: OutboxEntry, receipt: Receipt) -> None:
        if not isinstance(receipt, Task):
            raise TypeError(f"a job got a workflow receipt {receipt.id}")
        task = receipt
        await cur.execute(
            "UPDATE sender_jobs SET state = 'SUBMITTED', task_id = %s,"
            " updated_at = UTC_TIMESTAMP(6)"
            " WHERE id = %s AND outbox_id = %s AND state = 'REQUESTED'",
            (task.id, bytes.fromhex(entry.business_id), entry.id))
        if cur.rowcount != 1:
            log.warning("job %s of request %s was not REQUESTED; its receipt is kept on the"
                        " request only", entry.business_id, entry.id.hex())

    async def on_failed(self, cur: Any, entry: OutboxEntry, reason: str) -> None:
        await cur.execute(
            "UPDATE sender_jobs SET state = 'SUBMIT_FAILED', last_error = %s,"
            " updated_at = UTC_TIMESTAMP(6)"
            " WHERE id = %s AND outbox_id = %s AND state = 'REQUESTED'",
            (reason[:1024], bytes.fromhex(entry.business_id), entry.id))

"""The sender: lease pending requests, send each to Orbit outside any transaction with its
original idempotency key, record the receipt with the business link in one transaction.

Operations. A row is a task submission (``tasks.submit``), a workflow start
(``workflows.start``) or a signal (``workflows.signal``); :func:`orbit_sdk.outbox.send` sends
each with the matching client call and checks the receipt. A sender leases by *lane*
(``Settings.queues``): the ``queue`` column, which is the task's queue or the workflow
definition's name. Rows are not ordered relative to each other: one pass sends its batch
concurrently, and backoff reorders further (a signal sent ahead of its instance's start gets a
404 and is retried after backoff).

Identities. A request row (``sender_outbox.id``) carries the idempotency key fixed when the
business transaction wrote it; every send of the row uses that key, so Orbit accepts it at most
once and answers every later send with the original receipt. A lease is ``(generation,
lease_token)``: each lease increments the generation and draws a fresh random token; its expiry
is ``wake_at``, computed by the database clock (``UTC_TIMESTAMP(6)`` plus the lease length).

States (``wake_at`` is the next time a row needs a sender; terminal rows have none)::

    PENDING --lease--> LEASED --receipt recorded--> SENT
                         |--retryable failure--> PENDING (wake_at = now + backoff)
                         |--permanent failure--> FAILED
                         '--lease lapses (crash, stall)--> leased again, same key
    PENDING / lapsed LEASED --budget spent or send deadline passed, at lease time--> FAILED

Invariants.
- ``attempts`` counts leases, i.e. sends including those whose outcome is unknown, and never
  passes ``max_attempts``; nothing is sent after ``expires_at`` (both checked at lease time).
- Only the holder of the current token whose lease has not lapsed (database time) writes an
  outcome: the receipt, the backoff or the give-up are guarded updates on
  ``(id, state = 'LEASED', lease_token, wake_at > now)``. A sender whose lease lapsed may still
  send (it stalled before its HTTP call): harmless, the key makes it the same submission; it
  cannot record.
- The receipt, the task id and the business row's link commit together (one transaction:
  outbox row, then business row — the order the business transaction inserts them in).
- FAILED rows are kept with their reason; the business row is marked in the same transaction.

Failure handling. A sender killed after Orbit accepted and before it recorded leaves the row
LEASED; its lease lapses, another pass leases it again and re-sends it with the same key, and
Orbit returns the original receipt (its idempotency records live 7 days, so the total send
period is capped below that). A lost commit of the recording transaction is the same case.
Orbit down or overloaded (no answer, 5xx, 429, 401/403/404): back off and try again within the
budget. A refusal of the request itself (400, 409 idempotency conflict) or a receipt that does
not match the stored request: FAILED at once. When the last lease of a row lapses, the outcome of
that send is unknown; the row is marked FAILED with a reason that says so and names the key,
under which Orbit's receipt (if any) can be looked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs
from orbit_sdk import BadRequest, Client, Conflict, OrbitError, TooManyRequests, jsonvalue
from orbit_sdk.models import Task
from orbit_sdk.outbox import OutboxEntry, OutboxMismatch, Receipt, send

from task_outbox.database import transaction

log = logging.getLogger(__name__)

_COLUMNS: Final = (
    "id, operation, namespace, queue, handler, input, options, idempotency_key,"
    " request_digest, business_table, business_id, state, attempts, max_attempts, generation")

_SELECT_DUE: Final = (
    f"SELECT {_COLUMNS}, expires_at <= UTC_TIMESTAMP(6) AS expired FROM sender_outbox"
    " WHERE namespace = %s AND queue = %s AND wake_at <= UTC_TIMESTAMP(6)"
    " ORDER BY wake_at LIMIT %s FOR UPDATE SKIP LOCKED")
"""Due rows of one (namespace, queue) in wake-up order, on ``ix_sender_outbox_wake``: pending
rows whose backoff is over and leased rows whose lease lapsed. Rows another sender is leasing
right now are skipped, not waited for."""

_LEASE: Final = (
    "UPDATE sender_outbox SET state = 'LEASED', attempts = attempts + 1,"
    " generation = generation + 1, lease_token = %s,"
    " wake_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL %s MICROSECOND),"
    " updated_at = UTC_TIMESTAMP(6)"
    " WHERE id = %s AND generation = %s AND state IN ('PENDING', 'LEASED')")

_FAIL_AT_LEASE: Final = (
    "UPDATE sender_outbox SET state = 'FAILED', wake_at = NULL, lease_token = NULL,"
    " last_error = %s, updated_at = UTC_TIMESTAMP(6)"
    " WHERE id = %s AND generation = %s AND state IN ('PENDING', 'LEASED')")

_HELD: Final = "id = %s AND state = 'LEASED' AND lease_token = %s AND wake_at > UTC_TIMESTAMP(6)"
"""The lease guard: this token, and the lease has not lapsed by the database clock."""

_RECORD_SENT: Final = (
    "UPDATE sender_outbox SET state = 'SENT', task_id = %s, receipt = %s, wake_at = NULL,"
    " lease_token = NULL, last_error = NULL, updated_at = UTC_TIMESTAMP(6) WHERE " + _HELD)

_HOLD_FOR_RETRY: Final = (
    "SELECT attempts, max_attempts,"
    " expires_at <= DATE_ADD(UTC_TIMESTAMP(6), INTERVAL %s MICROSECOND) AS too_late"
    " FROM sender_outbox WHERE " + _HELD + " FOR UPDATE")

_BACK_OFF: Final = (
    "UPDATE sender_outbox SET state = 'PENDING', lease_token = NULL, last_error = %s,"
    " wake_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL %s MICROSECOND),"
    " updated_at = UTC_TIMESTAMP(6) WHERE " + _HELD)

_GIVE_UP: Final = (
    "UPDATE sender_outbox SET state = 'FAILED', wake_at = NULL, lease_token = NULL,"
    " last_error = %s, updated_at = UTC_TIMESTAMP(6) WHERE " + _HELD)


class LeaseLost(Exception):
    """The lease lapsed or was taken over: this sender may not record an outcome."""


class BusinessLink(Protocol):
    """Moves a business row with its request, inside the sender's transaction (after the
    request's guarded update succeeded). Registered per ``business_table``."""

    async def on_sent(self, cur: Any, entry: OutboxEntry, receipt: Receipt) -> None: ...

    async def on_failed(self, cur: Any, entry: OutboxEntry, reason: str) -> None: ...


@attrs.frozen(kw_only=True)
class Lease:
    """A leased request: send it, then record with ``token`` while the lease lasts."""

    entry: OutboxEntry
    token: bytes = attrs.field(repr=False)
    generation: int
    attempts: int
    max_attempts: int


@attrs.frozen(kw_only=True)
class Settings:
    """How a sender leases and backs off (durations in milliseconds, applied by the database
    clock). The lease must outlast one send: the client's timeout is a third of it."""

    queues: tuple[str, ...]
    batch_size: int = 16
    lease_ms: int = 30_000
    backoff_initial_ms: int = 1_000
    backoff_max_ms: int = 300_000
    poll_interval_s: float = 1.0

    def backoff_ms(self, attempts: int) -> int:
        """Exponential in the sends so far, capped, with jitter (half to full)."""
        base = min(self.backoff_max_ms, self.backoff_initial_ms * 2 ** max(0, attempts - 1))
        return max(1, int(base * (0.5 + random.random() / 2)))  # noqa: S311 - jitter only


@attrs.define
class PassResult:
    """What one pass did, by outcome."""

    leased: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0


async def _link_failed(cur: Any, links: Mapping[str, BusinessLink], entry: OutboxEntry,
                       reason: str) -> None:
    link = links.get(entry.business_table)
    if link is not None:
        await link.on_failed(cur, entry, reason)


async def lease(pool: Any, *, namespace: str, queue: str, limit: int, lease_ms: int,
                links: Mapping[str, BusinessLink]) -> list[Lease]:
    """Lease up to ``limit`` due requests of one namespace and queue (one transaction).

    Rows whose send deadline passed or whose budget is spent are marked FAILED here instead
    (with their business rows). Locks: the selected outbox rows (wake-up order, skipping rows
    locked by another sender), then the business rows of those that fail.
    """
    async def body(cur: Any) -> list[Lease]:
        await cur.execute(_SELECT_DUE, (namespace, queue, limit))
        leases: list[Lease] = []
        for row in await cur.fetchall():
            entry = OutboxEntry.from_row(row)
            unknown = (" The last send's outcome is unknown (its lease lapsed): look up"
                       f" idempotency key {entry.idempotency_key} in queue {entry.queue}."
                       if row["state"] == "LEASED" else "")
            reason = None
            if row["expired"]:
                reason = "send deadline passed." + unknown
            elif row["attempts"] >= row["max_attempts"]:
                reason = f"send budget of {row['max_attempts']} spent." + unknown
            if reason is not None:
                await cur.execute(_FAIL_AT_LEASE, (reason[:1024], entry.id, row["generation"]))
                if cur.rowcount == 1:
                    await _link_failed(cur, links, entry, reason)
                continue
            token = secrets.token_bytes(16)
            await cur.execute(_LEASE, (token, lease_ms * 1000, entry.id, row["generation"]))
            if cur.rowcount == 1:
                leases.append(Lease(entry=entry, token=token, generation=row["generation"] + 1,
                                    attempts=row["attempts"] + 1,
                                    max_attempts=row["max_attempts"]))
        return leases

    return await transaction(pool, body)


async def record_sent(pool: Any, held: Lease, receipt: Receipt,
                      links: Mapping[str, BusinessLink]) -> None:
    """Save the receipt and the business link in one transaction, if the lease still holds
    (else :class:`LeaseLost`, nothing written). Locks: the outbox row, then the business row.
    ``task_id`` is written for a task's receipt only; a workflow's or a signal's id is in the
    receipt (and on the business row).
    """
    task_id = receipt.id if isinstance(receipt, Task) else None

    async def body(cur: Any) -> None:
        await cur.execute(_RECORD_SENT, (task_id, _receipt_json(receipt), held.entry.id,
                                         held.token))
        if cur.rowcount != 1:
            raise LeaseLost(f"request {held.entry.id.hex()}: lease {held.generation} is gone")
        link = links.get(held.entry.business_table)
        if link is not None:
            await link.on_sent(cur, held.entry, receipt)

    await transaction(pool, body)


async def retry_later(pool: Any, held: Lease, *, delay_ms: int, reason: str,
                      links: Mapping[str, BusinessLink]) -> str:
    """After a retryable failure: back to PENDING after ``delay_ms`` (database clock) — or
    FAILED when the budget is spent or the deadline comes first. Returns ``"retry"``,
    ``"failed"`` or ``"lost"`` (the lease lapsed: the next holder decides). One transaction;
    locks the outbox row, then the business row when it fails."""
    async def body(cur: Any) -> str:
        await cur.execute(_HOLD_FOR_RETRY, (delay_ms * 1000, held.entry.id, held.token))
        row = await cur.fetchone()
        if row is None:
            return "lost"
        if row["attempts"] >= row["max_attempts"]:
            final = f"{reason}; send budget of {row['max_attempts']} spent"
        elif row["too_late"]:
            final = f"{reason}; the send deadline passes before the next try"
        else:
            await cur.execute(_BACK_OFF, (reason[:1024], delay_ms * 1000, held.entry.id,
                                          held.token))
            # The row is locked, but the lease may lapse between the two statements.
            return "retry" if cur.rowcount == 1 else "lost"
        await cur.execute(_GIVE_UP, (final[:1024], held.entry.id, held.token))
        if cur.rowcount != 1:
            return "lost"
        await _link_failed(cur, links, held.entry, final)
        return "failed"

    return await transaction(pool, body)


async def give_up(pool: Any, held: Lease, *, reason: str,
                  links: Mapping[str, BusinessLink]) -> bool:
    """Mark a request FAILED (kept) after a permanent refusal, with its business row, if the
    lease still holds. Returns whether it did."""
    async def body(cur: Any) -> bool:
        await cur.execute(_GIVE_UP, (reason[:1024], held.entry.id, held.token))
        if cur.rowcount != 1:
            return False
        await _link_failed(cur, links, held.entry, reason)
        return True

    return await transaction(pool, body)


def _receipt_json(receipt: Receipt) -> str:
    if receipt.raw:
        return jsonvalue.dumps(receipt.raw)
    return jsonvalue.dumps({"id": receipt.id, "state": receipt.state})


AfterSend = Callable[[Lease, Receipt], Awaitable[None] | None]


class Sender:
    """Leases due requests of its namespace and lanes (``Settings.queues``: task queues and
    workflow definition names), sends them concurrently (outside any
    transaction) and records each outcome. ``after_send`` runs between Orbit's acceptance and
    the recording transaction: a fault-injection point for tests."""

    def __init__(self, pool: Any, client: Client, settings: Settings, *,
                 links: Mapping[str, BusinessLink], after_send: AfterSend | None = None) -> None:
        self.pool = pool
        self.client = client
        self.settings = settings
        self.links = links
        self.after_send = after_send

    async def run_once(self) -> PassResult:
        """One pass: lease a batch per queue, deliver the batch, return the counts."""
        result = PassResult()
        for queue in self.settings.queues:
            leases = await lease(self.pool, namespace=self.client.namespace, queue=queue,
                                 limit=self.settings.batch_size,
                                 lease_ms=self.settings.lease_ms, links=self.links)
            result.leased += len(leases)
            outcomes = await asyncio.gather(*(self._deliver(held) for held in leases),
                                            return_exceptions=True)
            for held, outcome in zip(leases, outcomes, strict=True):
                name = outcome if isinstance(outcome, str) else "lost"
                if isinstance(outcome, BaseException):
                    # Nothing was recorded (the database failed, or a bug): the lease lapses
                    # and the request is taken again, under the same key.
                    log.error("request %s: delivery failed; its lease will lapse",
                              held.entry.id.hex(), exc_info=outcome)
                setattr(result, name, getattr(result, name) + 1)
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until ``stop`` is set; idle passes wait ``poll_interval_s`` (jittered)."""
        while not stop.is_set():
            try:
                result = await self.run_once()
            except Exception:
                # A pass that fails (database unreachable, a bug) changes nothing it did not
                # commit; leases it took lapse and are taken again. Keep the loop alive.
                log.exception("sender pass failed; trying again after the poll interval")
                result = PassResult()
            if result.leased == 0:
                pause = self.settings.poll_interval_s * (0.5 + random.random())  # noqa: S311
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=pause)

    async def _deliver(self, held: Lease) -> str:
        entry = held.entry
        try:
            receipt = await send(self.client, entry)
        except (OutboxMismatch, BadRequest, Conflict) as exc:
            # The request itself was refused (or does not match what was written): sending it
            # again cannot succeed. Kept as FAILED for a human.
            done = await give_up(self.pool, held, reason=f"refused: {exc}", links=self.links)
            log.warning("request %s refused: %s", entry.id.hex(), exc)
            return "failed" if done else "lost"
        except OrbitError as exc:
            delay = self.settings.backoff_ms(held.attempts)
            if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
                delay = max(delay, int(exc.retry_after * 1000))
            outcome = await retry_later(self.pool, held, delay_ms=delay,
                                        reason=f"send {held.attempts} failed: {exc}",
                                        links=self.links)
            log.info("request %s: send %d failed (%s): %s", entry.id.hex(), held.attempts,
                     exc, outcome)
            return "retried" if outcome == "retry" else outcome
        if self.after_send is not None:
            maybe = self.after_send(held, receipt)
            if maybe is not None:
                await maybe
        try:
            await record_sent(self.pool, held, receipt, self.links)
        except LeaseLost:
            log.warning("request %s (%s) accepted as %s, but lease %d lapsed before it was"
                        " recorded; the next holder re-sends it and records the same receipt",
                        entry.id.hex(), entry.operation, receipt.id, held.generation)
            return "lost"
        log.info("request %s (%s) accepted as %s", entry.id.hex(), entry.operation, receipt.id)
        return "sent"


def queues_of(values: Sequence[str]) -> tuple[str, ...]:
    """The queue list of a sender (at least one, no duplicates, order kept)."""
    out = tuple(dict.fromkeys(values))
    if not out:
        raise ValueError("a sender sends for at least one queue")
    return out

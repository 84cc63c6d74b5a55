"""``orbit_sdk.Worker``: runs handlers for the tasks a dispatcher grants (docs/api/worker.md).

Life of an attempt in this worker
    grant (pushed, or polled) → ``start`` (batched with the grants of the next few ms) →
    approved: the handler runs as its own asyncio task, renewed with every other running
    attempt in one ``renew`` every third of the lease → its outcome becomes a *report* with a
    fresh ``report_id`` → ``finish`` (batched) until the dispatcher acknowledges it. A start
    that is not approved ends the attempt here, silently -- except ``start_rate_limited`` (a
    start window of the queue or the application is full): the offer stays valid, so the start
    is sent again after ``retry_after_ms`` while the offer has not expired, keeping its slot.

Outcomes
    return value → ``succeeded``; :class:`RetryableError` (or any exception whose
    ``retryable`` attribute is true) → ``failed`` with ``retryable=true``; any other exception →
    ``failed``, not retryable; :class:`OutcomeUnknown` → ``unknown``; ``CancelledError`` after
    a cancel request → ``cancelled``. A lost lease cancels the handler; if the handler finished
    anyway, its report is still sent: the dispatcher refuses it and keeps it as late evidence
    for a human review (it changes nothing).
    A handler still running when a shutdown's drain time is over is cancelled too: reported
    ``failed`` and retryable when the task declared ``rerun_safe``, else ``unknown``.

Connection
    Register a session (``instance_key`` fences this instance's older sessions), open the
    WebSocket, offer free slots with ``ready``. When the WebSocket drops, register a new session
    and reconnect with jittered backoff; in-flight attempts keep their own credentials, so they
    are renewed and finished through the new session, and unacknowledged reports are re-sent
    with their original ``report_id``. When the WebSocket upgrade is refused, the same session
    runs over HTTP long-polling instead.

Shutdown (SIGTERM, SIGINT or :meth:`Worker.stop`)
    Offer no more slots, leave unstarted grants to expire, wait up to ``drain_timeout`` for
    running handlers, send their reports, close the session. A second signal cuts the wait.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import attrs

from orbit_sdk import jsonvalue, outcomes
from orbit_sdk._backoff import Backoff
from orbit_sdk._channel import (
    TRANSIENT_CODES,
    Channel,
    ChannelDown,
    PollChannel,
    WebSocketChannel,
)
from orbit_sdk._http import Transport
from orbit_sdk._signals import stopping_on_signals
from orbit_sdk.context import Context, Grant
from orbit_sdk.errors import (
    BadRequest,
    ConnectionFailed,
    Forbidden,
    NotFound,
    OrbitError,
    ProtocolError,
    Unauthorized,
)

__all__ = ["Handler", "Worker"]

log = logging.getLogger("orbit_sdk.worker")

Handler = Callable[[Context, Any], Awaitable[Any]]
H = TypeVar("H", bound=Handler)

MAX_BATCH = 256
# Errors that retrying cannot fix: a worker with a wrong key or namespace stops at once.
FATAL_REGISTRATION = (Unauthorized, Forbidden, NotFound, BadRequest)
# A refused WebSocket upgrade with one of these statuses is not a reason to fall back to
# long-polling (any other status, e.g. a proxy's 400/404/426, is).
RECONNECT_STATUSES = frozenset({401, 403, 408, 409, 429, 500, 502, 503, 504})


@attrs.define(eq=False)
class _Attempt:
    grant: Grant
    ctx: Context
    task: asyncio.Task[None] | None = None
    started: bool = False
    stop_reason: str | None = None  # "cancel" | "lost" | "shutdown"
    renew_due: float = 0.0
    lease_deadline: float = 0.0
    offer_deadline: float | None = None  # monotonic; None when this machine cannot tell
    resend: asyncio.TimerHandle | None = None  # a rate-limited start waiting to be re-sent


def _remaining_lease(value: Any, fallback: float) -> float:
    """Seconds until a lease expiry sent by the dispatcher, by this machine's clock; the
    fallback when the clocks disagree badly (an answer in the past, or days ahead)."""
    try:
        expires = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        expires = None
    if expires is None or expires.tzinfo is None:
        return fallback
    remaining = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    return remaining if 0.05 < remaining < 86_400 else fallback


def _offer_deadline(offer_expires_at: dt.datetime | None) -> float | None:
    """The offer's expiry on this machine's monotonic clock; None when unknown or when the
    clocks disagree badly (the dispatcher's answer then decides)."""
    if offer_expires_at is None:
        return None
    remaining = (offer_expires_at - dt.datetime.now(dt.UTC)).total_seconds()
    return time.monotonic() + remaining if 0 < remaining < 86_400 else None


def _sized(reports: list[outcomes.Report], budget: int) -> list[outcomes.Report]:
    """The first reports whose results and errors fit one finish (at least one report)."""
    batch: list[outcomes.Report] = []
    total = 0
    for report in reports:
        if batch and total + report.size > budget:
            break
        batch.append(report)
        total += report.size
    return batch


class Worker:
    """An automatic worker: ``@worker.handler("name")`` registers ``async def fn(ctx, input)``,
    ``await worker.run()`` works until SIGTERM/SIGINT (or :meth:`stop`).

    ``base_url`` is the dispatcher's. ``concurrency`` bounds the handlers running at once. The
    session is registered with ``max_in_flight = 2 * concurrency``: the dispatcher counts an
    attempt until its finish commits, and a handler's slot is free as soon as its report is
    filed, so up to ``concurrency`` reports may still be on their way while as many handlers
    run.
    ``instance_key`` is this process's stable identity (default ``host:pid``); a new session
    under the same key fences the older ones. ``max_result_bytes`` (the dispatcher's
    ``[dispatcher].max_result_bytes``) bounds a result and the results of one finish batch: a
    larger result is reported ``failed`` (``ResultTooLarge``) instead of being sent.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        namespace: str,
        queues: Iterable[str],
        *,
        concurrency: int = 8,
        instance_key: str | None = None,
        drain_timeout: float = 30.0,
        finish_timeout: float = 10.0,
        request_timeout: float = 30.0,
        batch_delay: float = 0.0,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        poll_wait_ms: int = 20_000,
        default_lease: float = 30.0,
        exact_numbers: bool = False,
        transport: str = "auto",
        max_result_bytes: int = outcomes.MAX_RESULT_BYTES,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if transport not in {"auto", "websocket", "long-poll"}:
            raise ValueError("transport is 'auto', 'websocket' or 'long-poll'")
        self.namespace = namespace
        self.queues = list(queues)
        if not self.queues:
            raise ValueError("give at least one queue")
        self.concurrency = concurrency
        self.instance_key = instance_key or f"{socket.gethostname()}:{os.getpid()}"
        self.drain_timeout = drain_timeout
        self.finish_timeout = finish_timeout
        self.request_timeout = request_timeout
        self.batch_delay = batch_delay
        self.poll_wait_ms = poll_wait_ms
        self.default_lease = default_lease
        self.exact_numbers = exact_numbers
        self.transport = transport
        self.max_result_bytes = max_result_bytes
        self._http = Transport(base_url, api_key, timeout=request_timeout, max_retries=0,
                               exact_numbers=exact_numbers)
        self._reconnect = Backoff(reconnect_initial, reconnect_max)
        self._handlers: dict[str, Handler] = {}
        self._attempts: dict[str, _Attempt] = {}
        self._backlog: collections.deque[str] = collections.deque()
        self._to_start: list[str] = []
        self._reports: dict[str, outcomes.Report] = {}
        self._channel: Channel | None = None
        self._session_path: str | None = None
        self._credit = 0
        self._draining = False
        self._starting: set[str] = set()
        self._deferred: set[str] = set()  # rate-limited starts waiting for their re-send
        self.starts_deferred = 0  # how many times a start was rate limited and re-scheduled
        self._loops: list[asyncio.Task[None]] = []
        self._events = self._new_events()
        self._stop = asyncio.Event()
        self._cut = asyncio.Event()
        self._running = False
        self._finish_retry = Backoff(0.2, 2.0)
        self._fatal: BaseException | None = None
        self.sessions_opened = 0

    def __repr__(self) -> str:
        return f"Worker({self._http.base_url!r}, namespace={self.namespace!r})"

    # --- registration ------------------------------------------------------------------------

    def handler(self, name: str) -> Callable[[H], H]:
        """Register ``async def fn(ctx, input)`` for the handler ``name``."""
        def register(fn: H) -> H:
            if name in self._handlers:
                raise ValueError(f"handler {name!r} is already registered")
            self._handlers[name] = fn
            return fn
        return register

    def add_handler(self, name: str, fn: Handler) -> None:
        self.handler(name)(fn)

    # --- running -----------------------------------------------------------------------------

    def run_forever(self) -> None:
        """Run in a new event loop until SIGTERM/SIGINT; blocks."""
        asyncio.run(self.run())

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Work until :meth:`stop`, SIGTERM or SIGINT, then drain and return. Raises the
        registration error when the dispatcher refuses this worker's credential or namespace."""
        if not self._handlers:
            raise ValueError("register at least one handler before running")
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._stop = asyncio.Event()
        self._cut = asyncio.Event()
        self._events = self._new_events()
        self._draining = False
        self._fatal = None
        loop = asyncio.get_running_loop()
        self._loops = [
            loop.create_task(self._session_loop(), name="orbit-worker-session"),
            loop.create_task(self._start_loop(), name="orbit-worker-start"),
            loop.create_task(self._renew_loop(), name="orbit-worker-renew"),
            loop.create_task(self._finish_loop(), name="orbit-worker-finish"),
            loop.create_task(self._slots_loop(), name="orbit-worker-slots"),
        ]
        for task in self._loops:
            task.add_done_callback(self._supervise)
        try:
            with stopping_on_signals(self.stop, install=install_signal_handlers):
                await self._stop.wait()
                if self._fatal is None:
                    await self._drain()
        finally:
            for task in self._loops:
                task.cancel()
            # Their failures were recorded by _supervise; here we only wait for them to end.
            await asyncio.gather(*self._loops, return_exceptions=True)
            await self._abandon()
            await self._close_session()
            await self._http.close()
            self._running = False
        if self._fatal is not None:
            raise self._fatal

    @staticmethod
    def _new_events() -> dict[str, asyncio.Event]:
        return {name: asyncio.Event()
                for name in ("start", "finish", "slots", "renew", "connected", "idle")}

    def stop(self) -> None:
        """Begin a graceful drain; a second call cuts the wait for running handlers short.
        Does nothing before :meth:`run`."""
        if not self._running:
            return
        if self._stop.is_set():
            if not self._cut.is_set():
                log.warning("second stop: cancelling running handlers now")
                self._cut.set()
            return
        log.info("stopping: draining %d running attempt(s)", len(self._attempts))
        self._stop.set()

    def _supervise(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("worker loop %s failed: %r", task.get_name(), exc)
            self._fatal = exc
            self._stop.set()

    def _wake(self, name: str) -> None:
        event = self._events.get(name)
        if event is not None:
            event.set()

    @property
    def connected(self) -> bool:
        """True while a dispatcher channel is open."""
        return self._channel is not None and not self._channel.closed.is_set()

    @property
    def channel_kind(self) -> str | None:
        """``"websocket"`` or ``"long-poll"`` while connected."""
        return self._channel.kind if self.connected and self._channel is not None else None

    @property
    def in_flight(self) -> int:
        """Attempts granted and not yet done here (starting, running or waiting for a slot)."""
        return len(self._attempts)

    @property
    def pending_reports(self) -> int:
        """Reports not yet acknowledged by a dispatcher."""
        return len(self._reports)

    # --- session and channel -----------------------------------------------------------------

    async def _register(self) -> str:
        body = {"instance_key": self.instance_key, "queues": self.queues,
                "handlers": sorted(self._handlers),
                "max_in_flight": min(10_000, 2 * self.concurrency)}
        path = f"/v1/namespaces/{quote(self.namespace, safe='')}/worker/sessions"
        answer = await self._http.request("POST", path, body=jsonvalue.dumps(body))
        session_id = answer.get("session_id") if isinstance(answer, dict) else None
        if not isinstance(session_id, str):
            raise ProtocolError("the session registration answer has no session_id",
                                code="invalid_response")
        self.sessions_opened += 1
        return f"{path}/{quote(session_id, safe='')}"

    async def _open_channel(self, path: str) -> Channel:
        if self.transport != "long-poll":
            try:
                return await WebSocketChannel.open(
                    self._http, f"{path}/ws", on_grants=self._on_grants,
                    on_cancel=self._on_cancel, request_timeout=self.request_timeout,
                    exact_numbers=self.exact_numbers,
                )
            except aiohttp.WSServerHandshakeError as exc:
                # 409 session_lost (fenced meanwhile), 401/403, 5xx (a draining dispatcher):
                # the session or server is the problem, not the WebSocket; register again.
                if self.transport == "websocket" or exc.status in RECONNECT_STATUSES:
                    raise ConnectionFailed(f"WebSocket refused ({exc.status})") from exc
                log.warning("WebSocket upgrade refused (%s); using HTTP long-polling",
                            exc.status)
        return PollChannel(
            self._http, path, on_grants=self._on_grants, on_cancel=self._on_cancel,
            request_timeout=self.request_timeout, wait_ms=self.poll_wait_ms,
            heartbeat_s=max(1.0, self.poll_wait_ms / 2000),
        )

    async def _session_loop(self) -> None:
        while not self._stop.is_set():
            try:
                path = await self._register()
                self._session_path = path
                channel = await self._open_channel(path)
            except FATAL_REGISTRATION:
                raise  # a wrong key, namespace or queue: retrying cannot help
            except (OrbitError, ChannelDown) as exc:
                delay = self._reconnect.next_delay()
                log.warning("cannot reach the dispatcher (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            self._channel = channel
            self._credit = 0
            self._reconnect.reset()
            log.info("connected to the dispatcher over %s (session %d)", channel.kind,
                     self.sessions_opened)
            for name in ("connected", "slots", "start", "finish", "renew"):
                self._wake(name)
            await channel.closed.wait()
            self._events["connected"].clear()
            await channel.close()
            if self._stop.is_set():
                return
            delay = self._reconnect.next_delay()
            log.warning("dispatcher channel lost; reconnecting in %.2fs", delay)
            await asyncio.sleep(delay)

    async def _channel_up(self) -> Channel:
        """The open channel, waiting for one if needed."""
        while True:
            channel = self._channel
            if channel is not None and not channel.closed.is_set():
                return channel
            self._events["connected"].clear()
            await self._events["connected"].wait()

    async def _close_session(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
        if self._session_path is not None:
            with contextlib.suppress(OrbitError):
                await self._http.request("DELETE", self._session_path, time_limit=5.0)
            self._session_path = None

    # --- flow control ------------------------------------------------------------------------

    def _free_slots(self) -> int:
        return 0 if self._draining else max(0, self.concurrency - len(self._attempts))

    async def _slots_loop(self) -> None:
        """Keep the dispatcher's credit for this session equal to our free slots (``ready``)."""
        event = self._events["slots"]
        while True:
            await event.wait()
            event.clear()
            channel = self._channel
            if channel is None or channel.closed.is_set():
                continue
            free = self._free_slots()
            if free > self._credit or (free == 0 and self._credit > 0):
                try:
                    await channel.offer_slots(free)
                    self._credit = free
                except ChannelDown:
                    continue

    # --- grants and starts -------------------------------------------------------------------

    def _on_grants(self, raws: list[dict[str, Any]]) -> None:
        self._credit = max(0, self._credit - len(raws))
        for raw in raws:
            try:
                grant = Grant.from_json(raw)
            except (ValueError, TypeError) as exc:
                log.warning("ignoring a malformed grant: %s", exc)
                continue
            if grant.attempt_id in self._attempts or self._draining:
                continue  # a duplicate push, or we are leaving: the offer expires unused
            self._attempts[grant.attempt_id] = _Attempt(
                grant=grant, ctx=Context(grant),
                offer_deadline=_offer_deadline(grant.offer_expires_at))
            admitted = len(self._attempts) - len(self._backlog)  # this one included
            if admitted <= self.concurrency:
                self._to_start.append(grant.attempt_id)
            else:  # granted beyond our slots (a ready raced a push): wait for a slot
                self._backlog.append(grant.attempt_id)
        self._wake("start")
        self._wake("slots")

    async def _start_loop(self) -> None:
        event = self._events["start"]
        while True:
            await event.wait()
            event.clear()
            if not self._to_start:
                continue
            channel = await self._channel_up()
            # Coalesce the grants already received (0: one turn of the event loop; more waits for
            # later ones, at the price of every start's latency).
            await asyncio.sleep(self.batch_delay)
            batch, self._to_start = self._to_start[:MAX_BATCH], self._to_start[MAX_BATCH:]
            if self._to_start:
                event.set()
            attempts = [self._attempts[i] for i in batch if i in self._attempts]
            self._starting.update(a.grant.attempt_id for a in attempts)
            try:
                answers = await channel.request("start", [a.grant.ref() for a in attempts])
            except ChannelDown:
                self._to_start[:0] = [a.grant.attempt_id for a in attempts
                                      if a.grant.attempt_id in self._attempts]
                continue  # re-sent on the next channel (a repeated start is approved again)
            except ProtocolError as exc:
                if exc.code in TRANSIENT_CODES:
                    self._to_start[:0] = [a.grant.attempt_id for a in attempts]
                    await asyncio.sleep(0.5)
                    event.set()
                    continue
                log.warning("start refused: %s", exc)
                answers = []
            finally:
                self._starting.difference_update(a.grant.attempt_id for a in attempts)
            by_id = {a.get("attempt_id"): a for a in answers}
            for attempt in attempts:
                answer = by_id.get(attempt.grant.attempt_id, {})
                if attempt.grant.attempt_id not in self._attempts:
                    continue
                if answer.get("approved") is True:
                    self._launch(attempt, answer.get("lease_expires_at"))
                elif (answer.get("reason") == "start_rate_limited"
                      and self._defer_start(attempt, answer.get("retry_after_ms"))):
                    continue
                else:
                    log.info("start of attempt %s not approved: %s", attempt.grant.attempt_id,
                             answer.get("reason"))
                    self._release(attempt.grant.attempt_id)

    def _defer_start(self, attempt: _Attempt, retry_after_ms: Any) -> bool:
        """Schedule the start of a rate-limited attempt again after ``retry_after_ms``, if its
        offer is still valid then; False when it is not (the attempt is released)."""
        if self._draining:
            return False
        valid = isinstance(retry_after_ms, int) and not isinstance(retry_after_ms, bool)
        delay = max(0.001, retry_after_ms / 1000) if valid else 0.1
        deadline = attempt.offer_deadline
        if deadline is not None and time.monotonic() + delay >= deadline:
            log.info("start of attempt %s rate limited until after its offer expires",
                     attempt.grant.attempt_id)
            return False
        attempt_id = attempt.grant.attempt_id
        self._deferred.add(attempt_id)
        self.starts_deferred += 1
        attempt.resend = asyncio.get_running_loop().call_later(
            delay, self._resend_start, attempt_id)
        return True

    def _resend_start(self, attempt_id: str) -> None:
        self._deferred.discard(attempt_id)
        attempt = self._attempts.get(attempt_id)
        if attempt is None or attempt.started or self._draining:
            return
        attempt.resend = None
        self._to_start.append(attempt_id)
        self._wake("start")

    def _launch(self, attempt: _Attempt, lease_expires_at: Any) -> None:
        attempt.started = True
        self._set_lease(attempt, lease_expires_at)
        attempt.task = asyncio.get_running_loop().create_task(
            self._run_handler(attempt), name=f"orbit-handler-{attempt.grant.attempt_id}")
        self._wake("renew")

    def _release(self, attempt_id: str) -> None:
        """The attempt is done here: free its slot and admit a waiting grant."""
        self._attempts.pop(attempt_id, None)
        while self._backlog:
            waiting = self._backlog.popleft()
            if waiting in self._attempts:
                self._to_start.append(waiting)
                self._wake("start")
                break
        self._wake("slots")
        if not self._attempts:
            self._wake("idle")

    # --- handlers ----------------------------------------------------------------------------

    async def _run_handler(self, attempt: _Attempt) -> None:
        grant = attempt.grant
        fn = self._handlers.get(grant.handler)
        if fn is None:
            self._file(attempt, outcomes.missing_handler(grant))
            return
        report: outcomes.Report | None
        try:
            report = outcomes.succeeded(grant, await fn(attempt.ctx, grant.input),
                                        self.max_result_bytes)
        except asyncio.CancelledError:
            report = outcomes.interrupted(grant, attempt.stop_reason)
            if attempt.stop_reason is None:  # cancelled from outside the worker: propagate
                self._file(attempt, report)
                raise
            if attempt.stop_reason == "lost":
                report = None  # cut off by the lost lease: nothing ran to completion
        except Exception as exc:  # noqa: BLE001 - any handler error is a reported outcome
            report = outcomes.from_exception(grant, exc)
            if report.outcome == "failed" and not report.retryable:
                log.info("handler %s failed (not retryable): %r", grant.handler, exc)
        # A handler that completed after its lease was lost still reports: the dispatcher
        # refuses the report (the attempt is over) and keeps it as evidence of the effect.
        self._file(attempt, report)

    def _file(self, attempt: _Attempt, report: outcomes.Report | None) -> None:
        if report is not None:
            self._reports[attempt.grant.attempt_id] = report
            self._wake("finish")
        self._release(attempt.grant.attempt_id)

    def _on_cancel(self, attempt_ids: list[str]) -> None:
        for attempt_id in attempt_ids:
            attempt = self._attempts.get(attempt_id)
            if attempt is not None:
                self._cancel(attempt, "cancel")

    def _cancel(self, attempt: _Attempt, reason: str) -> None:
        if reason == "cancel":
            attempt.ctx._request_cancel()
        elif reason == "lost":
            attempt.ctx._lose_lease()
        if attempt.stop_reason in {None, "shutdown"} or reason == "lost":
            attempt.stop_reason = reason
        if attempt.task is not None and not attempt.task.done():
            attempt.task.cancel()

    # --- renewals ----------------------------------------------------------------------------

    def _set_lease(self, attempt: _Attempt, lease_expires_at: Any) -> None:
        remaining = _remaining_lease(lease_expires_at, self.default_lease)
        now = time.monotonic()
        attempt.lease_deadline = now + remaining
        attempt.renew_due = now + max(0.02, remaining / 3)
        attempt.ctx.lease_expires_at = (dt.datetime.fromisoformat(lease_expires_at)
                                        if isinstance(lease_expires_at, str) else None)

    async def _renew_loop(self) -> None:
        """Renew every running attempt in one batch once the first of them is a third into its
        lease; cancel the handlers whose lease is gone."""
        event = self._events["renew"]
        while True:
            running = [a for a in self._attempts.values() if a.started and a.task is not None
                       and not a.task.done() and a.stop_reason != "lost"]
            now = time.monotonic()
            connected = self._channel is not None and not self._channel.closed.is_set()
            for attempt in running:
                if now >= attempt.lease_deadline and not connected:
                    log.warning("lease of attempt %s ran out unrenewed; cancelling its handler",
                                attempt.grant.attempt_id)
                    self._cancel(attempt, "lost")
                # Connected: the renewal below asks the dispatcher, whose database clock
                # decides (a stale holder's renewal is refused and kept as evidence).
            running = [a for a in running if a.stop_reason != "lost"]
            due = min((a.renew_due for a in running), default=None)
            if due is None or due > now:
                event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if due is None else due - now):
                        await event.wait()
                continue
            channel = self._channel
            if channel is None or channel.closed.is_set():
                event.clear()
                with contextlib.suppress(TimeoutError):  # wake up to check lease deadlines
                    async with asyncio.timeout(max(0.05, min(a.lease_deadline for a in running)
                                                   - now)):
                        await self._events["connected"].wait()
                continue
            for start in range(0, len(running), MAX_BATCH):
                await self._renew(channel, running[start:start + MAX_BATCH])

    async def _renew(self, channel: Channel, batch: list[_Attempt]) -> None:
        now = time.monotonic()
        retry_at = now + 1.0
        for attempt in batch:  # unless an answer says otherwise, try again in a second
            # (sooner when the lease runs out before that, but never in a tight loop: during a
            # database outage the dispatcher refuses every renewal while the handler runs on,
            # and the first renewal after it finds the lease extended by the outage)
            attempt.renew_due = min(max(attempt.lease_deadline, now + 0.25), retry_at)
        try:
            answers = await channel.request("renew", [a.grant.ref() for a in batch])
        except ChannelDown:
            return
        except ProtocolError as exc:
            log.warning("renew refused: %s", exc)
            return
        by_id = {a.get("attempt_id"): a for a in answers}
        for attempt in batch:
            answer = by_id.get(attempt.grant.attempt_id)
            if answer is None:
                continue
            if answer.get("renewed") is True:
                self._set_lease(attempt, answer.get("lease_expires_at"))
                if answer.get("cancel_requested") is True:
                    self._cancel(attempt, "cancel")
            else:
                log.warning("attempt %s lost its lease (%s); cancelling its handler",
                            attempt.grant.attempt_id, answer.get("reason"))
                self._cancel(attempt, "lost")

    # --- finish reports ----------------------------------------------------------------------

    async def _finish_loop(self) -> None:
        event = self._events["finish"]
        while True:
            await event.wait()
            event.clear()
            if not self._reports:
                continue
            channel = await self._channel_up()
            await asyncio.sleep(self.batch_delay)
            reports = list(self._reports.values())
            solo = [r for r in reports if r.solo]
            batch = solo[:1] if solo else _sized(reports[:MAX_BATCH], self.max_result_bytes)
            if len(batch) < len(reports):
                event.set()
            try:
                answers = await channel.request("finish", [r.item() for r in batch])
            except ChannelDown:
                continue  # kept, with the same report ids, for the next channel
            except ProtocolError as exc:
                if exc.code in TRANSIENT_CODES:
                    await asyncio.sleep(self._finish_retry.next_delay())
                self._finish_refused(batch, exc)
                event.set()
                continue
            self._finish_retry.reset()
            by_id = {a.get("attempt_id"): a for a in answers}
            for report in batch:
                answer = by_id.get(report.grant.attempt_id)
                if answer is None:
                    continue
                if self._reports.get(report.grant.attempt_id) is report:
                    del self._reports[report.grant.attempt_id]
                if answer.get("accepted") is not True:
                    log.warning("report on attempt %s rejected: %s (kept as late evidence)",
                                report.grant.attempt_id, answer.get("reason"))
            if not self._reports:
                self._wake("idle")

    def _finish_refused(self, batch: list[outcomes.Report], exc: ProtocolError) -> None:
        """A refused batch changed nothing: retry transient refusals; otherwise find the bad
        report by sending them one at a time, and drop a single report refused for good."""
        if exc.code in TRANSIENT_CODES:
            return
        if len(batch) > 1:
            for report in batch:
                report.solo = True
            return
        report = batch[0]
        if exc.code == "result_too_large" and report.outcome == "succeeded":
            # The dispatcher stores less than this worker allowed: the lease goes on, so the
            # attempt is reported failed instead (a new report, under a new report id).
            log.error("result of attempt %s refused as too large; reporting it failed",
                      report.grant.attempt_id)
            self._reports[report.grant.attempt_id] = outcomes.too_large(report.grant, str(exc))
            return
        log.error("report on attempt %s refused (%s); dropping it", report.grant.attempt_id,
                  exc)
        self._reports.pop(report.grant.attempt_id, None)

    # --- shutdown ----------------------------------------------------------------------------

    async def _drain(self) -> None:
        self._draining = True
        self._wake("slots")
        unsent = set(self._to_start) | set(self._backlog) | self._deferred
        for attempt_id in unsent:  # their offers expire unused; a start in flight runs
            attempt = self._attempts.pop(attempt_id, None)
            if attempt is not None and attempt.resend is not None:
                attempt.resend.cancel()
        self._to_start.clear()
        self._backlog.clear()
        self._deferred.clear()
        self._wake("idle")
        await self._wait_until(lambda: not self._attempts, self.drain_timeout)
        for attempt in list(self._attempts.values()):
            log.warning("drain time over: cancelling the handler of attempt %s",
                        attempt.grant.attempt_id)
            self._cancel(attempt, "shutdown")
        await self._wait_until(lambda: not self._attempts, 5.0)
        if self._reports:
            self._wake("finish")
            await self._wait_until(lambda: not self._reports, self.finish_timeout,
                                   cut=False)
        if self._reports:
            log.warning("%d report(s) were not acknowledged before shutdown; the dispatcher "
                        "will treat those attempts as lost leases", len(self._reports))

    async def _wait_until(self, done: Callable[[], bool], limit_s: float, *,
                          cut: bool = True) -> None:
        deadline = time.monotonic() + limit_s
        idle = self._events["idle"]
        while not done() and not (cut and self._cut.is_set()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            idle.clear()
            waiters = [asyncio.ensure_future(idle.wait())]
            if cut:
                waiters.append(asyncio.ensure_future(self._cut.wait()))
            _, pending = await asyncio.wait(waiters, timeout=min(remaining, 0.5),
                                            return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()

    async def _abandon(self) -> None:
        """Cancel whatever handler is still running when the worker exits."""
        tasks = [a.task for a in self._attempts.values() if a.task is not None]
        for attempt in list(self._attempts.values()):
            attempt.stop_reason = attempt.stop_reason or "shutdown"
            if attempt.resend is not None:
                attempt.resend.cancel()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

"""``orbit_sdk.Subscriber``: consumes a PULL result subscription (docs/api/subscriptions.md).

Life of a delivery in this subscriber
    pushed over the WebSocket stream (or leased over HTTP) → the handler runs as its own
    asyncio task → it returned: **acknowledge**; it raised: **fail** with the error's text (the
    server schedules the next try after the subscription's backoff, or ends the delivery
    EXHAUSTED when its budget is spent). Only then is its slot free again. Orbit delivers at
    least once: a handler must tolerate seeing a delivery again (keep the ``event_id``, as
    ``examples/result-inbox`` does).

Flow control
    At most ``concurrency`` deliveries are held at once (running, or waiting for their
    acknowledgement). Over the WebSocket the subscriber grants credit (``ready``) only for free
    slots, so the server never pushes more, and only once a quarter of the slots (at least one)
    are free, so the server leases in fewer, larger transactions; over HTTP it leases at most the
    free slots.

Connection
    The WebSocket ``…/subscriptions/{name}/stream`` with pings (heartbeats); when it drops,
    reconnect with jittered backoff (deliveries pushed but not acknowledged are settled over
    HTTP meanwhile, or lapse and come again). When the upgrade is refused (a proxy that does not
    pass WebSockets answers 4xx), the subscriber long-polls ``…/lease`` instead;
    ``transport="long-poll"`` chooses that from the start. Over HTTP, acknowledgements and
    failures go through the batch ``…/settle`` route: the ones ready within
    HTTP_SETTLE_WINDOW_S of the first (or while the previous call runs), at most
    HTTP_SETTLE_BATCH_MAX, share one request (one transaction), answered per delivery.

Shutdown (SIGTERM, SIGINT or :meth:`Subscriber.stop`)
    Grant no more credit and lease no more, wait up to ``drain_timeout`` for running handlers
    and settle them (a handler still running then is cancelled and its delivery reported
    failed), then close. A second stop cuts the wait. Deliveries the server leased but had not
    pushed yet are handed back unsent by the server when the stream closes; one pushed in the
    very instant of closing (credit was still open) is not seen here, lapses with its lease and
    comes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from orbit_sdk._backoff import Backoff
from orbit_sdk._frames import FrameSocket
from orbit_sdk._signals import stopping_on_signals
from orbit_sdk.client import Client, DeliveryReport
from orbit_sdk.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    NotFound,
    OrbitError,
    ProtocolError,
    ServiceUnavailable,
    Unauthorized,
)
from orbit_sdk.models import LeasedDelivery, ResultDelivery, Settlement

__all__ = ["DeliveryHandler", "Subscriber"]

log = logging.getLogger("orbit_sdk.subscriber")

DeliveryHandler = Callable[[ResultDelivery], Awaitable[Any]]

ERROR_TEXT_MAX = 1024
HTTP_SETTLE_WINDOW_S = 0.005  # how long the first HTTP settlement waits for others to join it
HTTP_SETTLE_BATCH_MAX = 100  # settlements in one ``…/settle`` request at most
REFUSED_CODES = frozenset({"delivery_lease_lost", "delivery_not_found"})
# A refused upgrade with one of these statuses is a reason to try again later, not to fall back
# to HTTP long-polling (a proxy that refuses WebSockets answers 400, 404, 426, ...).
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Close codes of the stream after which reconnecting cannot help (docs/api/subscriptions.md).
CLOSE_CREDENTIAL = 4401
CLOSE_FORBIDDEN = 4403
FATAL = (Unauthorized, Forbidden, NotFound, BadRequest)
NOT_ACTIVE = "subscription_not_active"


class StreamClosed(Exception):
    """The WebSocket closed before the answer arrived (the effect is unknown)."""


def error_text(exc: BaseException) -> str:
    """What a failed handler reports: the exception's type and message, at most 1024
    characters."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:ERROR_TEXT_MAX]


def _closed_for(close_code: int, last: OrbitError | None) -> OrbitError:
    """The error a 4401 or 4403 close stands for, typed by the ``error`` frame before it."""
    code = last.code if last is not None else None
    detail = last.detail if last is not None else f"the stream was closed with {close_code}"
    if close_code == CLOSE_CREDENTIAL:
        return Unauthorized(detail, code=code or "invalid_credential")
    if code is None or code == "forbidden":
        return Forbidden(detail, code="forbidden")
    if code.endswith("_not_found"):
        return NotFound(detail, code=code)
    return Conflict(detail, code=code)


def _answer_all(batch: list[tuple[DeliveryReport, asyncio.Future[Settlement]]],
                exc: BaseException) -> None:
    for _report, future in batch:
        if not future.done():
            future.set_exception(exc)


class _Held:
    """One delivery held by this subscriber, from receipt to settlement."""

    __slots__ = ("leased", "task")

    def __init__(self, leased: LeasedDelivery) -> None:
        self.leased = leased
        self.task: asyncio.Task[None] | None = None


class _Stream(FrameSocket):
    """One WebSocket connection: ``delivery`` frames in, ``ack``/``fail`` answered by ``id``
    (the frame plumbing: :class:`~orbit_sdk._frames.FrameSocket`)."""

    down = StreamClosed
    label = "stream"

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, exact_numbers: bool,
                 on_delivery: Callable[[LeasedDelivery], None], request_timeout: float) -> None:
        self._on_delivery = on_delivery
        self.close_code: int | None = None
        self.fatal: OrbitError | None = None
        self._last_error: OrbitError | None = None
        super().__init__(ws, request_timeout=request_timeout, exact_numbers=exact_numbers)

    async def send(self, frame: dict[str, Any]) -> None:
        await self._send(frame)

    async def settle(self, kind: str, leased: LeasedDelivery, error: str | None
                     ) -> dict[str, Any]:
        """Send ``ack`` or ``fail``; the ``settled`` frame's fields, or the error raised."""
        frame: dict[str, Any] = {"type": kind, "delivery_id": leased.delivery.id,
                                 "token": leased.lease_token}
        if error is not None:
            frame["error"] = error
        answer: dict[str, Any] = await self._call(frame, kind)
        return answer

    def _on_frame(self, kind: Any, frame: dict[str, Any]) -> bool:
        if kind == "delivery":
            self._on_delivery(LeasedDelivery.from_json(frame))
        elif kind == "settled":
            self._resolve(frame, frame)
        else:
            return False
        return True

    def _unanswered_error(self, error: ProtocolError) -> None:
        self._last_error = error
        log.warning("subscription stream error: %s", error)

    def _on_closed(self) -> None:
        self.close_code = self._ws.close_code
        if self.close_code in (CLOSE_CREDENTIAL, CLOSE_FORBIDDEN):
            self.fatal = _closed_for(self.close_code, self._last_error)


class Subscriber:
    """Runs ``handler(delivery)`` for every delivery of the PULL subscription ``subscription``.

    >>> async def handle(delivery: ResultDelivery) -> None:
    ...     print(delivery.task_id, delivery.state, delivery.snapshot["result"])
    >>> await Subscriber(api_url, api_key, "prod", "billing-results", handle).run()

    ``base_url`` is the API's. ``concurrency`` bounds the deliveries held at once.
    ``exact_numbers=True`` reads fractional numbers as ``Decimal`` (results keep their digits).
    ``transport``: ``"auto"`` (WebSocket, HTTP long-polling when the upgrade is refused),
    ``"websocket"`` or ``"long-poll"``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        namespace: str,
        subscription: str,
        handler: DeliveryHandler,
        *,
        concurrency: int = 8,
        transport: str = "auto",
        drain_timeout: float = 30.0,
        request_timeout: float = 30.0,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        poll_wait_ms: int = 10_000,
        heartbeat: float = 15.0,
        exact_numbers: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if transport not in {"auto", "websocket", "long-poll"}:
            raise ValueError("transport is 'auto', 'websocket' or 'long-poll'")
        self.namespace = namespace
        self.subscription = subscription
        self.handler = handler
        self.concurrency = concurrency
        self.transport = transport
        self.drain_timeout = drain_timeout
        self.request_timeout = request_timeout
        self.poll_wait_ms = max(0, min(poll_wait_ms, 20_000))
        self.heartbeat = heartbeat
        self.exact_numbers = exact_numbers
        self._client = Client(base_url, api_key, namespace, timeout=request_timeout,
                              max_retries=2, exact_numbers=exact_numbers)
        self._reconnect = Backoff(reconnect_initial, reconnect_max)
        self._held: dict[str, _Held] = {}
        # Credit is granted in steps of a quarter of the slots (at least one): fewer, larger
        # leases on the server. Below a step, more than three quarters of the slots are held or
        # credited, so a step always comes free again.
        self._credit_step = max(1, concurrency // 4)
        # HTTP settlements waiting for their batch request, and the task sending them.
        self._http_reports: list[tuple[DeliveryReport, asyncio.Future[Settlement]]] = []
        self._http_settler: asyncio.Task[None] | None = None
        self._stream: _Stream | None = None
        self._credit = 0  # granted on the current stream and not yet used by a push
        self._polling = transport == "long-poll"
        self._stop = asyncio.Event()
        self._cut = asyncio.Event()
        self._changed = asyncio.Event()  # a slot was freed, or the stream changed
        self._running = False
        self._fatal: BaseException | None = None
        self.acknowledged = 0  # deliveries acknowledged
        self.failed = 0  # deliveries reported failed
        self.lost = 0  # settlements refused (lease lapsed or delivery gone): it comes again
        self.connections = 0  # streams opened
        # ``ready`` frames sent over the WebSocket, and the smallest and largest credit one gave
        # (None before the first): credit goes out in steps of a quarter of the slots at least.
        self.credit_frames = 0
        self.smallest_grant: int | None = None
        self.largest_grant: int | None = None

    def __repr__(self) -> str:
        return f"Subscriber({self.namespace!r}, {self.subscription!r})"

    # --- state -------------------------------------------------------------------------------

    @property
    def channel_kind(self) -> str | None:
        """``"websocket"`` while a stream is open, ``"long-poll"`` once it fell back."""
        if self._polling:
            return "long-poll"
        stream = self._stream
        return "websocket" if stream is not None and not stream.closed.is_set() else None

    @property
    def in_flight(self) -> int:
        """Deliveries held now (their handler running, or their settlement on its way)."""
        return len(self._held)

    def _free(self) -> int:
        return max(0, self.concurrency - len(self._held) - self._credit)

    # --- running -----------------------------------------------------------------------------

    def run_forever(self) -> None:
        """Run in a new event loop until SIGTERM/SIGINT; blocks."""
        asyncio.run(self.run())

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until :meth:`stop`, SIGTERM or SIGINT, then drain and return. Raises the
        server's refusal when the credential, the subscription or its kind is wrong."""
        if self._running:
            raise RuntimeError("this subscriber is already running")
        self._running = True
        self._stop, self._cut, self._changed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._fatal = None
        loop = asyncio.get_running_loop()
        consuming = loop.create_task(self._consume(), name="orbit-subscriber")
        try:
            with stopping_on_signals(self.stop, install=install_signal_handlers):
                stop = loop.create_task(self._stop.wait())
                await asyncio.wait({consuming, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if consuming.done() and not consuming.cancelled() and consuming.exception():
                    self._fatal = consuming.exception()
                self._stop.set()
                await self._drain(consuming)
        finally:
            consuming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await consuming
            await self._abandon()
            if self._http_settler is not None:
                self._http_settler.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._http_settler
                self._http_settler = None
            if self._stream is not None:
                await self._stream.close()
                self._stream = None
            await self._client.close()
            self._running = False
        if self._fatal is not None:
            raise self._fatal

    def stop(self) -> None:
        """Begin a graceful drain; a second call cuts the wait for running handlers short."""
        if not self._running:
            return
        if self._stop.is_set():
            self._cut.set()
            return
        log.info("stopping: draining %d held deliveries", len(self._held))
        self._stop.set()
        self._changed.set()

    async def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                if self._polling:
                    await self._poll()
                else:
                    await self._stream_once()
                continue
            except FATAL:
                raise  # a wrong key, subscription or kind: retrying cannot help
            except OrbitError as exc:
                if isinstance(exc, Conflict) and exc.code not in (NOT_ACTIVE, "conflict"):
                    raise  # subscription_not_pull, subscription_disabled
                delay = self._reconnect.next_delay()
                log.warning("cannot consume (%s); trying again in %.2fs", exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    # --- the WebSocket stream ----------------------------------------------------------------

    def _path(self, suffix: str) -> str:
        return (f"/v1/namespaces/{quote(self.namespace, safe='')}/subscriptions/"
                f"{quote(self.subscription, safe='')}{suffix}")

    async def _open(self) -> _Stream | None:
        http = self._client._http
        try:
            ws = await http.session().ws_connect(
                http.url(self._path("/stream")), headers=http.headers,
                heartbeat=self.heartbeat, autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0))
        except aiohttp.WSServerHandshakeError as exc:
            if self.transport == "websocket" or exc.status in RETRY_STATUSES:
                raise ServiceUnavailable(f"WebSocket refused ({exc.status})",
                                         status=exc.status) from exc
            # A proxy refusing the upgrade, or the server refusing the subscription: HTTP
            # tells which (its lease answers with the problem document).
            log.warning("WebSocket upgrade refused (%s); using HTTP long-polling", exc.status)
            self._polling = True
            return None
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise ConnectionFailed(f"WebSocket: {type(exc).__name__}") from exc
        return _Stream(ws, exact_numbers=self.exact_numbers, on_delivery=self._on_delivery,
                       request_timeout=self.request_timeout)

    async def _stream_once(self) -> None:
        stream = await self._open()
        if stream is None:
            return
        self._stream, self._credit = stream, 0
        self.connections += 1
        log.info("consuming %s over a WebSocket", self.subscription)
        try:
            while not stream.closed.is_set() and not self._stop.is_set():
                free = self._free()
                if free >= self._credit_step:
                    await stream.send({"type": "ready", "credit": free})
                    self._credit += free
                    self.credit_frames += 1
                    self.smallest_grant = min(self.smallest_grant or free, free)
                    self.largest_grant = max(self.largest_grant or free, free)
                    self._reconnect.reset()
                self._changed.clear()
                waiters = {asyncio.ensure_future(self._changed.wait()),
                           asyncio.ensure_future(stream.closed.wait())}
                _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for waiter in pending:
                    waiter.cancel()
        except StreamClosed:
            pass
        if self._stop.is_set() and not stream.closed.is_set():
            return  # the drain closes it when the held deliveries are settled
        await stream.close()
        self._stream, self._credit = None, 0
        if stream.fatal is not None:
            raise stream.fatal
        delay = self._reconnect.next_delay()
        log.warning("subscription stream lost (close code %s); reconnecting in %.2fs",
                    stream.close_code, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    def _on_delivery(self, leased: LeasedDelivery) -> None:
        self._credit = max(0, self._credit - 1)
        self._hold(leased)

    def _hold(self, leased: LeasedDelivery) -> None:
        held = _Held(leased)
        self._held[leased.delivery.id] = held
        held.task = asyncio.get_running_loop().create_task(
            self._run_handler(held), name=f"orbit-delivery-{leased.delivery.id}")

    # --- HTTP long-polling -------------------------------------------------------------------

    async def _poll(self) -> None:
        log.info("consuming %s over HTTP long-polling", self.subscription)
        while not self._stop.is_set():
            free = self._free()
            if free <= 0:
                self._changed.clear()
                await self._changed.wait()
                continue
            leased = await self._client.lease_deliveries(
                self.subscription, max=min(free, 500), wait_ms=self.poll_wait_ms)
            self._reconnect.reset()
            for item in leased:
                self._hold(item)

    # --- handlers and settlement -------------------------------------------------------------

    async def _run_handler(self, held: _Held) -> None:
        leased = held.leased
        error: str | None = None
        try:
            await self.handler(leased.delivery)
        except asyncio.CancelledError:
            error = "the subscriber stopped before the handler finished"
        except Exception as exc:  # noqa: BLE001 - any handler failure is reported as such
            log.info("handler failed on delivery %s (attempt %d): %r", leased.delivery.id,
                     leased.delivery.attempt, exc)
            error = error_text(exc)
        try:
            await self._settle(leased, error)
        finally:
            self._held.pop(leased.delivery.id, None)
            self._changed.set()

    async def _settle(self, leased: LeasedDelivery, error: str | None) -> None:
        kind = "ack" if error is None else "fail"
        stream = self._stream
        answer: Any = None
        if stream is not None and not stream.closed.is_set():
            try:
                answer = await stream.settle(kind, leased, error)
            except StreamClosed:
                answer = None  # settle over HTTP instead (an ack is idempotent per token)
            except ProtocolError as exc:
                self._refused(leased, exc)
                return
        if answer is None:
            try:
                settled = await self._settle_http(leased, error)
            except OrbitError as exc:
                log.warning("could not settle delivery %s (%s); its lease will lapse and it "
                            "comes again", leased.delivery.id, exc)
                self.lost += 1
                return
            if not settled.settled:
                if settled.code in REFUSED_CODES:
                    self._refused(leased, Conflict(settled.detail or "", code=settled.code))
                else:
                    log.warning("could not settle delivery %s (%s); its lease will lapse and "
                                "it comes again", leased.delivery.id, settled.code)
                    self.lost += 1
                return
        if error is None:
            self.acknowledged += 1
        else:
            self.failed += 1

    async def _settle_http(self, leased: LeasedDelivery, error: str | None) -> Settlement:
        """This delivery's answer from a batch ``…/settle`` request (raises what the whole
        request raised)."""
        report = DeliveryReport(delivery_id=leased.delivery.id, token=leased.lease_token,
                                acknowledged=error is None, error=error)
        future: asyncio.Future[Settlement] = asyncio.get_running_loop().create_future()
        self._http_reports.append((report, future))
        if self._http_settler is None or self._http_settler.done():
            self._http_settler = asyncio.get_running_loop().create_task(
                self._http_settle_batches(), name="orbit-subscriber-settler")
        return await future

    async def _http_settle_batches(self) -> None:
        while self._http_reports:
            if len(self._http_reports) < HTTP_SETTLE_BATCH_MAX:
                await asyncio.sleep(HTTP_SETTLE_WINDOW_S)
            batch = self._take_http_batch()
            reports = [report for report, _future in batch]
            try:
                answers = await self._client.settle_deliveries(
                    self.subscription, reports,
                    retry=all(report.acknowledged for report in reports))
            except OrbitError as exc:
                _answer_all(batch, exc)
                continue
            except BaseException:
                _answer_all(batch, ConnectionFailed("the settlement was cut off"))
                raise
            for (report, future), answer in itertools.zip_longest(batch, answers[:len(batch)]):
                if future.done():
                    continue
                if answer is None:
                    future.set_exception(ProtocolError(
                        f"no answer for delivery {report.delivery_id}"))
                else:
                    future.set_result(answer)

    def _take_http_batch(self) -> list[tuple[DeliveryReport, asyncio.Future[Settlement]]]:
        """Queued settlements in order, at most HTTP_SETTLE_BATCH_MAX, ending before a second
        one for the same delivery."""
        batch: list[tuple[DeliveryReport, asyncio.Future[Settlement]]] = []
        seen: set[str] = set()
        for report, future in self._http_reports:
            if len(batch) >= HTTP_SETTLE_BATCH_MAX or report.delivery_id in seen:
                break
            seen.add(report.delivery_id)
            batch.append((report, future))
        del self._http_reports[:len(batch)]
        return batch

    def _refused(self, leased: LeasedDelivery, exc: OrbitError) -> None:
        log.warning("settling delivery %s refused (%s): it comes again", leased.delivery.id,
                    exc.code)
        self.lost += 1

    # --- shutdown ----------------------------------------------------------------------------

    async def _drain(self, consuming: asyncio.Task[None]) -> None:
        """No more credit or leases; wait for held deliveries (cancelled after the drain
        timeout), settle them, close."""
        self._changed.set()
        deadline = time.monotonic() + self.drain_timeout
        if self._polling and not consuming.done():
            # A lease call in flight returns within poll_wait_ms; its deliveries are run too.
            with contextlib.suppress(Exception):
                await asyncio.wait({consuming},
                                   timeout=max(0.0, deadline - time.monotonic()))
        await self._wait_held(deadline)
        for held in list(self._held.values()):
            if held.task is not None and not held.task.done():
                log.warning("drain time over: cancelling the handler of delivery %s",
                            held.leased.delivery.id)
                held.task.cancel()
        await self._wait_held(time.monotonic() + 5.0, cut=False)

    async def _wait_held(self, deadline: float, *, cut: bool = True) -> None:
        while self._held and not (cut and self._cut.is_set()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            tasks = {h.task for h in self._held.values() if h.task is not None}
            waiters: set[asyncio.Future[Any]] = set(tasks)
            cutting = asyncio.ensure_future(self._cut.wait()) if cut else None
            if cutting is not None:
                waiters.add(cutting)
            await asyncio.wait(waiters, timeout=min(remaining, 0.5),
                               return_when=asyncio.FIRST_COMPLETED)
            if cutting is not None:
                cutting.cancel()

    async def _abandon(self) -> None:
        tasks = [h.task for h in self._held.values() if h.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

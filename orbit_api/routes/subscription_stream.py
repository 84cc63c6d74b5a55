"""``GET …/subscriptions/{subscription}/stream``: a pull subscription's deliveries pushed over a
WebSocket within the credit the consumer grants (docs/api/subscriptions.md, "WebSocket").

The consumer grants credit with ``ready`` frames (each adds ``credit``); the server leases at
most the outstanding credit (each lease is a transaction that checks ``subscriptions.consume``)
and pushes one ``delivery`` frame per leased delivery, spending one credit each. ``ack`` and
``fail`` frames are settled in batches: the frames that arrive within the settle window
(``[api] stream_settle_window_ms``) of the first one waiting (or while the previous batch's
transaction runs), at most SETTLE_BATCH_MAX, are settled in one transaction
(consumer.settle_deliveries), and each is answered with its own ``settled`` (or ``error``) frame
carrying the request's ``id``. Frames received before the socket
closes are still settled. With credit but nothing due, the server polls a cheap read
(consumer.due_in_ms) with a back-off from POLL_MIN_MS to POLL_MAX_MS — never a lease loop; a
lease that took all it asked for is followed by the next one without that read.
When the socket closes, leases taken but not yet pushed are handed back unsent
(deliveries.release); pushed but unsettled ones lapse with their lease and are delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import WSMsgType, web

from orbit_api.openapi import _problem
from orbit_api.routes import subscriptions as routes
from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc
from orbit_common.platform import credentials
from orbit_common.platform.principals import principal_of
from orbit_common.relay import consumer, deliveries
from orbit_common.relay.deliveries import Leased, Report
from orbit_common.relay.model import (
    SubscriptionDisabled,
    SubscriptionNotActive,
    SubscriptionState,
)
from orbit_common.service.http.body import query_params
from orbit_common.service.http.context import CONFIG, DB

log = logging.getLogger(__name__)

PATH = routes.ITEM + "/stream"
MAX_FRAME_BYTES = 64 * 1024  # a larger client frame closes the socket with 1009
CREDIT_MAX = 1000  # outstanding credit at most
LEASE_STEP = 100  # deliveries leased per transaction at most
POLL_MIN_MS = 50
POLL_MAX_MS = 2000
HEARTBEAT_S = 20.0  # WebSocket ping interval; a peer that misses the pong is closed
SETTLE_BATCH_MAX = 100  # ack/fail frames settled in one transaction at most
SETTLE_DRAIN_S = 10.0  # after the socket closed, how long frames received may take to settle
MAX_INVALID_FRAMES = 10  # refused frames on one connection before it is closed (1008)
CLOSE_CREDENTIAL = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_GOING_AWAY = 1001  # the API is draining: reconnect (to another replica)


class Stream:
    """One consumer connection."""

    def __init__(self, db: Database, principal: credentials.Principal, *, namespace: str,
                 name: str, ws: web.WebSocketResponse, target: consumer.Target,
                 settle_window_ms: int = 2) -> None:
        self.db = db
        self.settle_window_s = settle_window_ms / 1000
        self.principal = principal
        self.namespace = namespace
        self.name = name
        self.ws = ws
        self.target = target
        self.credit = 0
        self.invalid = 0
        self.wake = asyncio.Event()
        self.closing = False
        # ack/fail frames received and not yet settled, in arrival order; the settler runs them.
        self.reports: list[tuple[str, Report]] = []
        self.queued = asyncio.Event()  # a report was queued, or the connection ends
        self.room = asyncio.Event()  # the queue is below its bound again
        self.room.set()
        self.ending = False

    # --- sending ----------------------------------------------------------------------------

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.ws.closed:
            return False
        try:
            await self.ws.send_str(jsondoc.dumps(frame))
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def send_error(self, exc: errors.OrbitError, request_id: Any = None) -> None:
        frame: dict[str, Any] = {"type": "error", "id": request_id, "code": exc.code,
                                 "detail": exc.detail}
        found = getattr(exc, "errors", None)
        if found:
            frame["errors"] = found
        await self.send(frame)

    async def close_for(self, exc: errors.OrbitError, code: int) -> None:
        await self.send_error(exc)
        self.closing = True
        self.wake.set()
        await self.ws.close(code=code, message=exc.code.encode())

    # --- the pump: lease within credit and push ---------------------------------------------

    async def pump(self) -> None:
        try:
            await self._pump()
        except Exception:
            log.exception("the subscription stream failed; closing it")
            self.closing = True
            with contextlib.suppress(Exception):
                await self.ws.close(code=1011, message=b"internal error")

    async def _pump(self) -> None:
        pause_ms = POLL_MIN_MS
        full = False  # the last lease took all it asked for: more are likely due
        while not self.closing:
            if self.credit <= 0:
                self.wake.clear()
                await self.wake.wait()
                continue
            leased: list[Leased] = []
            polled = not full
            full = False
            try:
                found = await self._look(polled)
                if found is None:
                    return
                if found.due:
                    asked = min(self.credit, LEASE_STEP)
                    leased = await deliveries.lease_deliveries(
                        self.db, self.principal, namespace=self.namespace, name=self.name,
                        limit=asked)
                    full = len(leased) == asked
            except SubscriptionNotActive:
                if not polled:
                    continue  # paused or disabled since the last lease: the poll tells which
                found = consumer.Poll(state=SubscriptionState.PAUSED, due_in_ms=None)
            except errors.Unauthenticated as exc:
                await self.close_for(exc, CLOSE_CREDENTIAL)
                return
            except errors.ServiceUnavailable:
                found = consumer.Poll(state=None, due_in_ms=None)
                pause_ms = POLL_MAX_MS
            except errors.OrbitError as exc:  # not found, forbidden, not a pull subscription
                await self.close_for(exc, CLOSE_FORBIDDEN)
                return
            if leased:
                pause_ms = POLL_MIN_MS
                await self.push(leased)
                continue
            if found.state == SubscriptionState.PAUSED:
                pause_ms = POLL_MAX_MS  # wait for a resume at the slowest pace
            due = found.due_in_ms
            nap = pause_ms if due is None or due == 0 else min(pause_ms, due)
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), nap / 1000)
            pause_ms = min(pause_ms * 2, POLL_MAX_MS)

    async def _look(self, polled: bool) -> consumer.Poll | None:
        """The cheap read's answer (None: the subscription is disabled and the stream closed);
        without the read (the last lease was full), due now -- the lease checks the state."""
        if not polled:
            return consumer.Poll(state=SubscriptionState.ACTIVE, due_in_ms=0)
        found = await consumer.poll(self.db, self.target)
        if found.state in (None, SubscriptionState.DISABLED):
            await self.close_for(SubscriptionDisabled(
                f"subscription {self.name!r} is disabled"), CLOSE_FORBIDDEN)
            return None
        return found

    async def push(self, leased: list[Leased]) -> None:
        """One ``delivery`` frame per lease, one credit each; leases that could not be pushed
        (the socket closed) are handed back unsent."""
        unsent: list[Leased] = []
        for item in leased:
            if self.closing or not await self.send({"type": "delivery",
                                                    **routes.leased_view(item)}):
                unsent.append(item)
                continue
            self.credit -= 1
        if unsent:
            with contextlib.suppress(errors.OrbitError):
                await consumer.release_deliveries(
                    self.db, self.principal, namespace=self.namespace, name=self.name,
                    leases=[(item.delivery_id, item.token) for item in unsent])

    # --- client frames ----------------------------------------------------------------------

    async def receive(self, text: str) -> bool:
        """Handle one client frame; False when the connection must close."""
        request_id = None
        try:
            doc = jsondoc.loads_strict(text.encode(), max_containers=16)
            if not isinstance(doc, dict) or not isinstance(doc.get("type"), str):
                raise errors.ValidationFailed([{"path": "$.type", "message": "required"}])
            request_id = doc.get("id")
            if request_id is not None and (not isinstance(request_id, str)
                                           or not 1 <= len(request_id) <= 64):
                request_id = None
                raise errors.ValidationFailed([{"path": "$.id",
                                                "message": "a string of 1-64 characters"}])
            kind = doc["type"]
            if kind == "ready":
                self.ready(doc)
            elif kind in ("ack", "fail"):
                if request_id is None:
                    raise errors.ValidationFailed([{"path": "$.id", "message": "required"}])
                await self.settle(doc, request_id,
                                  "acknowledged" if kind == "ack" else "failed")
            else:
                raise errors.ValidationFailed([{"path": "$.type",
                                                "message": "ready, ack or fail"}])
        except errors.Unauthenticated as exc:
            await self.send_error(exc, request_id)
            await self.close_for(exc, CLOSE_CREDENTIAL)
            return False
        except errors.OrbitError as exc:
            await self.send_error(exc, request_id)
            if exc.status in (400, 413):
                self.invalid += 1
                if self.invalid >= MAX_INVALID_FRAMES:
                    await self.close_for(errors.ValidationFailed(
                        [{"path": "$", "message": "too many invalid frames"}]), 1008)
                    return False
        return True

    def ready(self, doc: dict[str, Any]) -> None:
        unknown = sorted(set(doc) - {"type", "id", "credit"})
        if unknown:
            raise errors.ValidationFailed([{"path": f"$.{k}", "message": "unknown field"}
                                           for k in unknown])
        credit = doc.get("credit")
        if isinstance(credit, bool) or not isinstance(credit, int) \
                or not 1 <= credit <= CREDIT_MAX:
            raise errors.ValidationFailed([{"path": "$.credit",
                                            "message": f"an integer from 1 to {CREDIT_MAX}"}])
        if self.credit + credit > CREDIT_MAX:
            raise errors.ValidationFailed([{"path": "$.credit", "message": (
                f"at most {CREDIT_MAX} outstanding credit ({self.credit} now)")}])
        self.credit += credit
        self.wake.set()

    async def settle(self, doc: dict[str, Any], request_id: str, outcome: str) -> None:
        """Queue one ack/fail frame for the settler (waits while SETTLE_BATCH_MAX × 2 frames
        are queued: a consumer cannot pile up unsettled frames)."""
        problems: routes.Problems = []
        fields = {k: v for k, v in doc.items() if k not in ("type", "id")}
        report = routes.parse_report(fields, "$", problems, outcome=outcome)
        if problems or report is None:
            raise errors.ValidationFailed(problems)
        while len(self.reports) >= 2 * SETTLE_BATCH_MAX:
            self.room.clear()
            await self.room.wait()
        self.reports.append((request_id, report))
        self.queued.set()

    # --- the settler: queued ack/fail frames, a batch per transaction -----------------------

    async def settler(self) -> None:
        try:
            await self._settler()
        except Exception:
            log.exception("the subscription stream's settler failed; closing it")
            self.closing = True
            self.wake.set()
            with contextlib.suppress(Exception):
                await self.ws.close(code=1011, message=b"internal error")

    async def _settler(self) -> None:
        while True:
            if not self.reports:
                if self.ending:
                    return
                self.queued.clear()
                await self.queued.wait()
                continue
            if len(self.reports) < SETTLE_BATCH_MAX and not self.ending:
                # The first frame waits a moment for the ones a busy consumer sends right after.
                await asyncio.sleep(self.settle_window_s)
            batch = self._take()
            self.room.set()
            if not await self._settle_batch(batch):
                return

    def _take(self) -> list[tuple[str, Report]]:
        """The next batch: frames in arrival order up to SETTLE_BATCH_MAX, ending before a
        second frame for the same delivery (it goes into the next batch, after the first)."""
        batch: list[tuple[str, Report]] = []
        seen: set[bytes] = set()
        for request_id, report in self.reports:
            if len(batch) >= SETTLE_BATCH_MAX or report.delivery_id in seen:
                break
            seen.add(report.delivery_id)
            batch.append((request_id, report))
        del self.reports[:len(batch)]
        return batch

    async def _settle_batch(self, batch: list[tuple[str, Report]]) -> bool:
        """Settle one batch in one transaction and answer each frame; False when the
        connection must close (the credential was revoked)."""
        try:
            answers = await consumer.settle_deliveries(
                self.db, self.principal, namespace=self.namespace, name=self.name,
                reports=[report for _id, report in batch])
        except errors.Unauthenticated as exc:
            for request_id, _report in batch:
                await self.send_error(exc, request_id)
            if not self.ws.closed:
                await self.close_for(exc, CLOSE_CREDENTIAL)
            return False
        except errors.OrbitError as exc:  # forbidden, gone, unavailable: nothing was settled
            for request_id, _report in batch:
                await self.send_error(exc, request_id)
            return True
        for (request_id, report), answer in zip(batch, answers, strict=True):
            if isinstance(answer, errors.OrbitError):
                await self.send_error(answer, request_id)
            else:
                await self.send({"type": "settled", "id": request_id,
                                 **routes.settled_view(answer, report.delivery_id)})
        return True


async def stream(request: web.Request) -> web.StreamResponse:
    query_params(request, ())
    db, principal = request.app[DB], principal_of(request)
    namespace, name = routes._namespace(request), routes._subscription(request)
    target = await consumer.locate(db, principal, namespace=namespace, name=name)
    # aiohttp refuses a frame of max_msg_size bytes or more from its header and closes with 1009.
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=MAX_FRAME_BYTES + 1)
    await ws.prepare(request)
    conn = Stream(db, principal, namespace=namespace, name=name, ws=ws, target=target,
                  settle_window_ms=request.app[CONFIG].api.stream_settle_window_ms)
    streams = request.app[STREAMS]
    streams.add(conn)
    pumping = asyncio.create_task(conn.pump(), name="subscription-stream")
    settling = asyncio.create_task(conn.settler(), name="subscription-stream-settler")
    try:
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                if not await conn.receive(message.data):
                    break
            elif message.type == WSMsgType.BINARY:
                await conn.send_error(errors.BinaryFrameUnsupported())
                await ws.close(code=1003, message=b"binary frames are not supported")
                break
            elif message.type == WSMsgType.ERROR:
                log.info("subscription stream closed on a protocol error: %s", message.data,
                         extra={"close_code": ws.close_code})
                break
            if pumping.done() or settling.done():
                break
    finally:
        streams.discard(conn)
        conn.closing = True
        conn.wake.set()
        # Frames received are settled even though their answers can no longer be sent.
        conn.ending = True
        conn.queued.set()
        conn.room.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(settling, timeout=SETTLE_DRAIN_S)
        # The pump finishes its step (a lease in flight is pushed or handed back), bounded.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(pumping, timeout=10)
        if not ws.closed:
            await ws.close()
    return ws


STREAMS: web.AppKey[set[Stream]] = web.AppKey("subscription_streams")


async def close_streams(app: web.Application) -> None:
    """On shutdown (the API draining): stop pushing and close every stream with 1001, so the
    consumers reconnect elsewhere; leases pushed but not settled lapse as on any disconnect."""
    streams: set[Stream] = app[STREAMS]
    for conn in list(streams):
        conn.closing = True
        conn.wake.set()
        with contextlib.suppress(Exception):
            await conn.ws.close(code=CLOSE_GOING_AWAY, message=b"the API is draining")


def add_routes(app: web.Application) -> None:
    streams: set[Stream] = set()
    app[STREAMS] = streams
    app.on_shutdown.append(close_streams)
    app.router.add_get(PATH, stream)


OPENAPI_PATHS: dict[str, Any] = {
    PATH: {
        "parameters": [routes._NAMESPACE_PARAM, routes._SUBSCRIPTION_PARAM],
        "get": {
            "summary": "Consume a PULL subscription over a WebSocket: upgrade, then JSON text "
                       "frames",
            "description": "Client frames: ready {credit} (adds credit, at most "
                           f"{CREDIT_MAX} outstanding), ack {{id, delivery_id, token}}, fail "
                           "{id, delivery_id, token, error?}. Server frames: delivery "
                           "{delivery, lease_token, lease_expires_at} (one credit each), "
                           "settled {id, delivery_id, settled, state, attempts_used, "
                           "repeated}, error {id, code, detail}. A frame over "
                           f"{MAX_FRAME_BYTES} bytes closes with 1009, a binary frame with "
                           f"1003, {MAX_INVALID_FRAMES} invalid frames with 1008, a revoked "
                           "credential with 4401, a lost authorization or a disabled "
                           "subscription with 4403, a draining API with 1001 "
                           "(docs/api/subscriptions.md).",
            "operationId": "subscriptionStream",
            "responses": {
                "101": {"description": "Switching protocols"},
                **routes._ERRORS,
                "400": _problem("validation_failed (an unknown query parameter), or "
                                "bad_request (a GET that is no WebSocket handshake)"),
                "404": routes._NOT_FOUND,
                "409": _problem("subscription_not_pull"),
            },
        },
    },
}


"""The dispatcher daemon: worker sessions over WebSocket (or HTTP long-poll) and recovery.

Sessions register *demand* with the node's claim pool (``orbit_dispatcher/pool.py``): a WebSocket
session while the worker has announced free slots (``ready``), a long poll for its ``wait_ms``.
The pool runs the short batched claim transactions in a fair order (round-robin over
applications, then queues, then sessions; a bounded number at once; queues recently found empty
are passed over) and hands each turn's grants to its session: pushed as a ``grants`` frame, or
as the long poll's answer. Per WebSocket the dispatcher also heartbeats the session row while the
connection lives and pushes ``cancel`` notices for running attempts whose task has a cancel
request. A connection's frames start in the order they arrive, and up to
:data:`OPS_IN_FLIGHT` of them run at once: a start is not held up behind a slow finish of the
same worker (each answer carries its request's ``id``; ``ready`` frames take effect in order,
since they complete without waiting). Nothing in memory is authoritative: a killed dispatcher
loses only connections and the pool's order; leases it granted expire and the recovery scan
(here too, on every replica, SKIP LOCKED) resolves them.

Revocation (docs/api/worker.md): a WebSocket is authenticated once, at the upgrade; after that,
every start, renew and finish re-reads the session's credential in its transaction, and a watch
re-reads the credentials of all open sessions every ``credential_check_s``. A session whose
credential was revoked (or application disabled) gets an ``invalid_credential`` error frame and is
closed with :data:`CREDENTIAL_CLOSE_CODE`; its leases take the lost-session path.

Limits (docs/api/worker.md §6): one message (frame or HTTP body) is at most
``max_message_bytes`` (aiohttp refuses a larger frame from its header and closes with 1009),
parsed off the event loop when large, with its arrays and objects counted before parsing; the
results of one finish are at most ``max_result_bytes`` (``result_too_large``, the lease goes
on); a socket sending more than ``max_frames_per_second`` frames, or more than
``max_invalid_frames`` refused ones a minute, is closed with 1008.

Liveness (docs/runbooks/liveness.md): renewals and session heartbeats run on their own small
connection pool (the *renewal lane*), so they never wait for a connection behind claims and
finishes held up by a lock; renewals touch only attempt and task rows, never a counter row. The
heartbeat (``orbit_dispatcher/heartbeat.py``) detects database outages and extends live leases by
their length; start, renew, finish and the recovery scan run only after a fresh heartbeat. A
database error in a connection's heartbeat or cancel loop is logged and retried: the WebSocket
stays open through an outage, so the worker keeps its handlers running and retries its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import prometheus_client
from aiohttp import WSCloseCode, WSMsgType, web

from orbit_common import errors
from orbit_common.db.pool import Database, open_database
from orbit_common.model import ids
from orbit_common.platform import principals
from orbit_common.platform.principals import principal_of
from orbit_common.pulse import dispatch, leases, usage, workers
from orbit_common.pulse.workers import Session
from orbit_common.service.config import OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.http.body import read_document
from orbit_common.service.http.middleware import BACKPRESSURE_REFUSALS
from orbit_common.service.http.server import ServiceRunner, service_app
from orbit_dispatcher import openapi, protocol
from orbit_dispatcher.heartbeat import Heartbeat
from orbit_dispatcher.pool import ClaimPool, ProbeCache, probe_key

log = logging.getLogger(__name__)

GRANTS = prometheus_client.Counter("orbit_dispatch_grants_total", "Attempts granted to workers.")
CLAIMS = prometheus_client.Counter("orbit_dispatch_claims_total",
                                   "Claim transactions, by whether they found work.", ["found"])
DUE_PROBES = prometheus_client.Counter(
    "orbit_dispatch_due_probes_total",
    "Lock-free reads for a due task before claiming from a queue whose last claim found"
    " nothing, by whether they found one (no: the turn ends without a claim transaction).",
    ["found"])
RECOVERED = prometheus_client.Counter("orbit_recovery_tasks_total",
                                      "Tasks resolved by the recovery scan.", ["kind"])
SESSIONS = prometheus_client.Gauge("orbit_dispatch_sessions", "WebSocket sessions connected.")
REVOKED_SESSIONS = prometheus_client.Counter(
    "orbit_dispatch_sessions_revoked_total",
    "WebSocket sessions closed because their credential was revoked or application disabled.")
HEARTBEAT_S = 10.0
CANCEL_SCAN_S = 1.0
MAX_POLL_WAIT_MS = 30_000
OPS_IN_FLIGHT = 4  # frames of one WebSocket running at once (each one transaction at most)
# Close code of a WebSocket whose credential was revoked or whose application was disabled
# (the private-use range; 4401 after HTTP 401): register again with a valid key.
CREDENTIAL_CLOSE_CODE = 4401
PARSE_INLINE_CHARS = 64 * 1024  # larger frames are parsed off the event loop
INVALID_WINDOW_S = 60.0  # max_invalid_frames counts the request errors of this long
FLOOD_CLOSE = WSCloseCode.POLICY_VIOLATION  # 1008: too many frames, or too many invalid ones


class RateWindow:
    """Whether more than ``limit`` events fell within ``window_s`` (a sliding window over the
    last ``limit`` event times, monotonic clock)."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.window_s = window_s
        self.times: deque[float] = deque(maxlen=limit)

    def exceeded(self, now: float) -> bool:
        """Record one event at ``now``; True when it is one too many."""
        full = len(self.times) == self.times.maxlen
        if full and now - self.times[0] < self.window_s:
            return True
        self.times.append(now)
        return False


def _parse_frame(text: str) -> Any:
    """A client frame as a document, or the request error it is."""
    try:
        return protocol.loads(text)
    except errors.OrbitError as exc:
        return exc


class Connection:
    """One worker session on one WebSocket."""

    def __init__(self, service: DispatcherService, session: Session,
                 ws: web.WebSocketResponse) -> None:
        self.service = service
        self.session = session
        self.ws = ws
        self.send_lock = asyncio.Lock()
        self.notified: set[bytes] = set()
        self.closing = False
        self.demand = service.pool.open_stream(session, deliver=self.deliver,
                                               fail=self.claim_failed)
        self.in_flight = asyncio.Semaphore(OPS_IN_FLIGHT)
        self.renewals_in_flight = asyncio.Semaphore(OPS_IN_FLIGHT)
        self.frames: set[asyncio.Task[None]] = set()
        limits = service.config.dispatcher
        self.frame_rate = RateWindow(limits.max_frames_per_second, 1.0)
        self.invalid = RateWindow(limits.max_invalid_frames, INVALID_WINDOW_S)

    @property
    def slots(self) -> int:
        """Credit left from the worker's last ``ready`` (the pool subtracts what it grants)."""
        return self.demand.slots

    async def send(self, text: str) -> None:
        async with self.send_lock:
            if not self.ws.closed:
                await self.ws.send_str(text)

    async def send_json(self, doc: dict[str, Any]) -> None:
        await self.send(json.dumps(doc, ensure_ascii=False))

    async def deliver(self, grants: list[leases.Grant]) -> None:
        """The claim pool's grants for this session (its slots are already reduced)."""
        try:
            await self.send(protocol.grants_frame(grants))
        except (ConnectionError, RuntimeError) as exc:
            # The socket went away under us: the offers expire and recovery re-queues them.
            log.info("grants not delivered: %s", exc)

    async def claim_failed(self, exc: BaseException) -> None:
        """A claim for this session failed for good (the pool has dropped its demand)."""
        if self.closing:
            return
        if isinstance(exc, workers.SessionLost):
            await self.lost()
            return
        if isinstance(exc, errors.InvalidCredential):
            await self.revoked()
            return
        code = exc.code if isinstance(exc, errors.OrbitError) else "internal_error"
        detail = exc.detail if isinstance(exc, errors.OrbitError) else "claiming failed"
        log.warning("closing a worker session after a failed claim: %s", exc,
                    extra={"code": code})
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.send_json({"type": "error", "id": None, "code": code, "detail": detail})
        await self.ws.close()

    async def lost(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.send_json({"type": "error", "id": None, "code": "session_lost",
                                  "detail": "the session was fenced by a newer one or "
                                            "expired; register again"})
        await self.ws.close()

    async def revoked(self, request_id: str | None = None) -> None:
        """The session's credential was revoked or its application disabled: an ``error``
        frame (``invalid_credential``), then close with :data:`CREDENTIAL_CLOSE_CODE`; the
        session row is closed as the connection ends (``http_ws``)."""
        if self.closing:
            return
        self.closing = True
        self.service.pool.discard(self.demand)
        REVOKED_SESSIONS.inc()
        refusal = errors.InvalidCredential("the session's credential was revoked or its "
                                           "application disabled; closing")
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.send_json({"type": "error", "id": request_id, "code": refusal.code,
                                  "detail": refusal.detail})
        await self.ws.close(code=CREDENTIAL_CLOSE_CODE, message=b"credential revoked")

    async def refuse_binary(self) -> None:
        """The protocol is JSON text frames: say so, then close with 1003 (unsupported data)."""
        refusal = errors.BinaryFrameUnsupported("frames must be JSON text frames; closing")
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.send_json({"type": "error", "id": None, "code": refusal.code,
                                  "detail": refusal.detail})
        await self.ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"text frames only")

    async def close_for(self, refusal: errors.OrbitError, reason: bytes) -> None:
        """Answer a flood with an ``error`` frame, then close with 1008 (policy violation)."""
        self.closing = True
        log.warning("closing a worker WebSocket: %s", refusal.detail,
                    extra={"code": refusal.code})
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.send_json({"type": "error", "id": None, "code": refusal.code,
                                  "detail": refusal.detail})
        await self.ws.close(code=FLOOD_CLOSE, message=reason)

    async def heartbeat(self) -> None:
        while not self.closing:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await dispatch.heartbeat(self.service.lane, self.session)
            except workers.SessionLost:
                await self.lost()
                return
            except errors.OrbitError as exc:
                # The database is away: keep the socket (the worker's handlers keep running and
                # its calls are answered with transient errors); an outage extends the session.
                log.warning("session heartbeat not written: %s", exc, extra={"code": exc.code})

    async def cancel_notices(self) -> None:
        while not self.closing:
            await asyncio.sleep(CANCEL_SCAN_S)
            try:
                found = await dispatch.cancel_requested(self.service.db, self.session)
            except errors.OrbitError as exc:
                log.warning("cancel scan failed: %s", exc, extra={"code": exc.code})
                continue
            fresh = [a for a in found if a not in self.notified]
            if fresh:
                self.notified.update(fresh)
                await self.send_json({"type": "cancel",
                                      "attempt_ids": [a.hex() for a in fresh]})

    async def receive(self, text: str) -> bool:
        """Start handling one client frame; waits (so the socket is not read further) while
        :data:`OPS_IN_FLIGHT` frames of its kind are running. Renewals have a budget of their
        own: a renewal never waits behind finishes stuck on a lock. False when the frame was
        one too many (the socket is closed: stop reading)."""
        if self.frame_rate.exceeded(asyncio.get_running_loop().time()):
            limit = self.service.config.dispatcher.max_frames_per_second
            await self.close_for(errors.TooManyFrames(
                f"more than {limit} frames in one second; closing"), b"too many frames")
            return False
        if len(text) <= PARSE_INLINE_CHARS:
            doc: Any = _parse_frame(text)
        else:  # tens to hundreds of milliseconds of parsing: not on the event loop
            doc = await asyncio.to_thread(_parse_frame, text)
        renewal = isinstance(doc, dict) and doc.get("type") == "renew"
        budget = self.renewals_in_flight if renewal else self.in_flight
        await budget.acquire()
        task = asyncio.create_task(self._run_frame(doc, budget), name="ws-frame")
        self.frames.add(task)
        task.add_done_callback(self.frames.discard)
        return True

    async def _run_frame(self, doc: Any, budget: asyncio.Semaphore) -> None:
        try:
            await self.handle(doc)
        except (ConnectionError, RuntimeError) as exc:
            log.info("a worker frame's answer was not delivered: %s", exc)
        except Exception:
            log.exception("a worker frame failed; closing the connection")
            await self.ws.close()
        finally:
            budget.release()

    async def settle(self) -> None:
        """Wait for the frames still running (their transactions are short)."""
        if self.frames:
            await asyncio.gather(*self.frames, return_exceptions=True)

    async def handle(self, doc: Any) -> None:
        """One parsed client frame (or the error that parsing it raised); a malformed one gets
        an ``error`` frame and changes nothing."""
        request_id = None
        try:
            if isinstance(doc, errors.OrbitError):
                raise doc
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
                slots = doc.get("slots")
                if isinstance(slots, bool) or not isinstance(slots, int) \
                        or not 0 <= slots <= 10_000:
                    raise errors.ValidationFailed([{"path": "$.slots",
                                                    "message": "an integer from 0 to 10000"}])
                self.service.pool.set_slots(self.demand, slots)
                return
            op = self.service.operations().get(kind)
            if op is None:
                raise errors.ValidationFailed([{"path": "$.type",
                                                "message": "ready, start, renew or finish"}])
            if request_id is None:  # its reply could not be matched to it: do nothing
                raise errors.ValidationFailed([{"path": "$.id", "message":
                                                "required: a string of 1-64 characters"}])
            items = await op(self.session, doc)
            await self.send_json({"type": "reply", "id": request_id, "op": kind,
                                  "items": items})
        except errors.InvalidCredential:
            await self.revoked(request_id)  # the operation's transaction found it revoked
        except errors.OrbitError as exc:
            await self.send_json({"type": "error", "id": request_id, "code": exc.code,
                                  "detail": exc.detail, **exc.extra,
                                  **({"errors": exc.errors}
                                     if isinstance(exc, errors.ValidationFailed) else {})})
            if exc.status < 500 and self.invalid.exceeded(asyncio.get_running_loop().time()):
                # A request error is the client's; a worker that keeps making them is broken
                # or hostile (a database outage, 503, is nobody's fault and never counts).
                limit = self.service.config.dispatcher.max_invalid_frames
                await self.close_for(errors.TooManyInvalidFrames(
                    f"more than {limit} invalid frames in {INVALID_WINDOW_S:.0f} seconds;"
                    " closing"), b"too many invalid frames")


class DispatcherService:
    """``orbit dispatcher``: the aiohttp application plus the recovery loop."""

    name = "dispatcher"

    def __init__(self, config: OrbitConfig, db: Database, gate: ReadinessGate) -> None:
        self.config = config
        self.db = db
        self.gate = gate
        self.node = config.dispatcher.node or f"{socket.gethostname()}:{os.getpid()}"
        self.connections: set[Connection] = set()
        dispatcher = config.dispatcher
        self.pool = ClaimPool(
            self._claim_turn, batch=dispatcher.claim_batch,
            concurrency=dispatcher.claim_concurrency,
            probes=ProbeCache(first_ms=dispatcher.empty_probe_ms or dispatcher.idle_poll_min_ms,
                              max_ms=dispatcher.idle_poll_max_ms),
            ready=lambda: gate.is_ready, error_pause_ms=dispatcher.idle_poll_max_ms)
        self.runner: ServiceRunner | None = None
        self.recovery: asyncio.Task[None] | None = None
        self.beating: asyncio.Task[None] | None = None
        # The renewal lane: its own small pool, opened with the application (_lane_ctx).
        self.lane: Database = db
        self.beats = Heartbeat(self.lane, self.node, interval_s=dispatcher.heartbeat_interval_s,
                               threshold_s=dispatcher.outage_threshold_s)
        self.app = self._make_app()

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.runner = ServiceRunner(self.app, access_log=None,
                                    shutdown_timeout=self.config.service.drain_timeout_s,
                                    http=self.config.http)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.dispatcher.host, self.config.dispatcher.port)
        await site.start()
        self.beating = asyncio.create_task(self.beats.run(), name="dispatch-heartbeat")
        self.recovery = asyncio.create_task(self._recovery_loop(), name="dispatch-recovery")
        log.info("dispatcher listening", extra={"host": self.config.dispatcher.host,
                                                "port": self.config.dispatcher.port,
                                                "node": self.node})

    @property
    def draining(self) -> bool:
        return self.pool.stopped

    @draining.setter
    def draining(self, value: bool) -> None:
        if value:
            self.pool.stop_claiming()

    async def drain(self) -> None:
        """Stop granting, tell workers to reconnect elsewhere, let in-flight calls finish."""
        self.pool.stop_claiming()
        for conn in list(self.connections):
            conn.closing = True
            await conn.ws.close(code=1001, message=b"dispatcher draining")
        await self.pool.close()
        for loop_task in (self.recovery, self.beating):
            if loop_task is not None:
                loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop_task
        self.recovery = self.beating = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def close(self) -> None:
        await self.drain()

    # --- domain calls -----------------------------------------------------------------------

    async def _claim_turn(self, session: Session, queue: workers.QueueRef,
                          limit: int) -> list[leases.Grant]:
        """One claim transaction, run by the claim pool. A queue whose last claim (same probe
        key) found nothing is first read without locks: no task due there now, no claim."""
        key = probe_key(session, queue)
        if self.pool.probes.expires_at(key) is not None:
            due = await dispatch.any_due(self.db, session.namespace_id, queue)
            DUE_PROBES.labels("yes" if due else "no").inc()
            if not due:
                return []
        grants = await dispatch.claim(self.db, session, queue, limit)
        CLAIMS.labels("yes" if grants else "no").inc()
        GRANTS.inc(len(grants))
        return grants

    async def _pool_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        """The claim pool runs while the application does (started and stopped as a pair)."""
        self.pool.start()
        yield
        await self.pool.close()

    async def _credentials_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        """The credential watch runs while the application does."""
        watch = asyncio.create_task(self._credential_watch(), name="dispatch-credentials")
        try:
            yield
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _credential_watch(self) -> None:
        """Every ``credential_check_s``: re-read the credentials of the open WebSocket sessions
        (one read for all of them) and close the sessions of those revoked or of a disabled
        application. A database error keeps the sockets (the next pass decides)."""
        interval = self.config.dispatcher.credential_check_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_credentials()
            except Exception:
                log.exception("credential check failed")  # the next pass tries again

    async def check_credentials(self) -> int:
        """One pass of the credential watch; returns how many sessions it closed."""
        open_ = [c for c in self.connections if not c.closing]
        if not open_:
            return 0
        try:
            active = await dispatch.active_credentials(
                self.db, [c.session.credential_id for c in open_])
        except errors.OrbitError as exc:
            log.warning("credential check failed: %s", exc, extra={"code": exc.code})
            return 0
        revoked = [c for c in open_ if c.session.credential_id not in active]
        for conn in revoked:
            log.info("closing a worker session: its credential is no longer valid",
                     extra={"session_id": conn.session.id.hex(),
                            "credential_id": conn.session.credential_id.hex()})
        # At once, not one after another: a client slow to answer the close delays no other.
        await asyncio.gather(*(conn.revoked() for conn in revoked), return_exceptions=True)
        return len(revoked)

    async def _lane_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        """The renewal lane's pool lives as long as the application."""
        lane = await open_database(self.db.url, minsize=1,
                                   maxsize=max(1, self.config.dispatcher.renew_pool_size),
                                   session=self.config.database.session())
        self.lane = self.beats.db = lane
        try:
            yield
        finally:
            self.lane = self.beats.db = self.db
            await lane.close()

    def operations(self) -> dict[str, Callable[[Session, Any], Awaitable[list[dict[str, Any]]]]]:
        return {"start": self.op_start, "renew": self.op_renew, "finish": self.op_finish}

    async def op_start(self, session: Session, doc: Any) -> list[dict[str, Any]]:
        refs = protocol.parse_refs(doc)
        await self.beats.fresh()
        out = await dispatch.start(self.db, session, refs)
        limited = sum(1 for o in out if o.reason == "start_rate_limited")
        if limited:
            BACKPRESSURE_REFUSALS.labels("start_rate_limited").inc(limited)
        return [protocol.start_json(o) for o in out]

    async def op_renew(self, session: Session, doc: Any) -> list[dict[str, Any]]:
        refs = protocol.parse_refs(doc)
        await self.beats.fresh()
        out = await dispatch.renew(self.lane, session, refs)
        return [protocol.renew_json(o) for o in out]

    async def op_finish(self, session: Session, doc: Any) -> list[dict[str, Any]]:
        # Encoding and measuring the results can take a while (up to max_result_bytes): in a
        # thread, so the event loop keeps serving the other sessions and the health probes.
        reports = await asyncio.to_thread(protocol.parse_finish, doc,
                                          self.config.dispatcher.max_result_bytes)
        await self.beats.fresh()
        out = await dispatch.finish(self.db, session, reports)
        return [protocol.finish_json(o) for o in out]

    async def _recovery_loop(self) -> None:
        interval = self.config.dispatcher.recovery_interval_s
        gauges = usage.UsageGauges(tenant_labels=self.config.service.metrics_tenant_labels)
        next_gauges = 0.0
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))  # noqa: S311
            if not self.gate.is_ready:
                continue
            loop_time = asyncio.get_running_loop().time()
            if loop_time >= next_gauges:
                # Usage gauges (queue lag, unfinished tasks, permits held): one read-only
                # transaction every gauge_interval_s per dispatcher, not per request.
                next_gauges = loop_time + self.config.dispatcher.gauge_interval_s
                try:
                    await gauges.refresh(self.db)
                except errors.OrbitError as exc:
                    log.warning("usage gauges not refreshed: %s", exc, extra={"code": exc.code})
            try:
                while True:
                    handled = await self._recover_leases()
                    if handled is None:
                        break
                    RECOVERED.labels("lease").inc(handled)
                    if handled < 128:
                        break
                if handled is None:
                    continue  # an outage not yet compensated: no session expires either
                n = await dispatch.expire_waiting(self.db, 128)
                RECOVERED.labels("deadline").inc(n)
                await dispatch.expire_sessions(self.db, 500)
            except errors.OrbitError as exc:
                log.warning("recovery pass failed: %s", exc, extra={"code": exc.code})

    async def _recover_leases(self) -> int | None:
        """One lease-recovery transaction, after a fresh heartbeat of this node (which
        compensates an outage that just ended); it decides nothing (None) while the fleet's
        heartbeat shows a gap no beat has compensated yet (outages.recover_expired)."""
        await self.beats.fresh()
        return await dispatch.recover_leases(
            self.db, 128, outage_threshold=self.beats.threshold,
            max_offer_lapses=self.config.dispatcher.max_offer_lapses)

    # --- HTTP -------------------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = service_app(self.config, self.db, self.gate,
                          authenticate=principals.authenticate,
                          max_body_bytes=self.config.dispatcher.max_message_bytes)
        app.cleanup_ctx.append(self._lane_ctx)
        app.cleanup_ctx.append(self._pool_ctx)
        app.cleanup_ctx.append(self._credentials_ctx)
        app.router.add_get("/v1/openapi.json", openapi.openapi)
        base = "/v1/namespaces/{namespace}/worker/sessions"  # documented in openapi.py
        app.router.add_post(base, self.http_register)
        app.router.add_get(base + "/{session_id}/ws", self.http_ws)
        app.router.add_post(base + "/{session_id}/poll", self.http_poll)
        app.router.add_post(base + "/{session_id}/start", self._http_op("start"))
        app.router.add_post(base + "/{session_id}/renew", self._http_op("renew"))
        app.router.add_post(base + "/{session_id}/finish", self._http_op("finish"))
        app.router.add_post(base + "/{session_id}/heartbeat", self.http_heartbeat)
        app.router.add_delete(base + "/{session_id}", self.http_close)
        return app

    async def _load(self, request: web.Request, *, live: bool) -> Session:
        try:
            session_id = ids.from_hex(request.match_info["session_id"])
        except ValueError as exc:
            raise workers.SessionNotFound() from exc
        principal = principal_of(request)
        namespace = request.match_info["namespace"]
        session, alive = await dispatch.load_session(self.db, principal, namespace=namespace,
                                                     session_id=session_id)
        if live and not alive:
            raise workers.SessionLost()
        return session

    async def http_register(self, request: web.Request) -> web.Response:
        doc = await _read_object(request)
        allowed = {"instance_key", "queues", "handlers", "max_in_flight"}
        unknown = set(doc) - allowed
        if unknown:
            raise errors.ValidationFailed([{"path": "$", "message":
                                            f"unknown fields {sorted(unknown)}"}])
        instance_key, queues = doc.get("instance_key"), doc.get("queues")
        handlers, max_in_flight = doc.get("handlers"), doc.get("max_in_flight", 16)
        problems = []
        if not isinstance(instance_key, str):
            problems.append({"path": "$.instance_key", "message": "a string"})
        if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
            problems.append({"path": "$.queues", "message": "an array of queue names"})
        if not isinstance(handlers, list) or not all(isinstance(h, str) for h in handlers):
            problems.append({"path": "$.handlers", "message": "an array of handler names"})
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            problems.append({"path": "$.max_in_flight", "message": "an integer"})
        if problems:
            raise errors.ValidationFailed(problems)
        instance_key = cast(str, instance_key)
        queues, handlers = cast(list[str], queues), cast(list[str], handlers)
        principal = principal_of(request)
        session_id, instance_id = ids.new_id(), ids.new_id()
        session = await dispatch.register(
            self.db, principal, namespace=request.match_info["namespace"],
            instance_key=instance_key, queues=queues, handlers=handlers,
            max_in_flight=max_in_flight, session_id=session_id, instance_id=instance_id,
            node=self.node)
        return web.json_response({
            "session_id": session.id.hex(), "generation": session.generation,
            "expires_at": session.expires_at.isoformat(timespec="microseconds"),
            "heartbeat_interval_ms": int(HEARTBEAT_S * 1000),
        }, status=201)

    async def http_ws(self, request: web.Request) -> web.StreamResponse:
        session = await self._load(request, live=True)
        if self.draining:
            raise errors.ServiceUnavailable("the dispatcher is draining; connect to another")
        # aiohttp refuses a frame of max_msg_size bytes or more from its header, before any of
        # its payload is buffered, and closes with 1009 (message too big).
        ws = web.WebSocketResponse(
            heartbeat=20, max_msg_size=self.config.dispatcher.max_message_bytes + 1)
        await ws.prepare(request)
        conn = Connection(self, session, ws)
        self.connections.add(conn)
        SESSIONS.inc()
        loops = [asyncio.create_task(conn.heartbeat(), name="ws-heartbeat"),
                 asyncio.create_task(conn.cancel_notices(), name="ws-cancel")]
        try:
            async for message in ws:
                if message.type == WSMsgType.TEXT:
                    if not await conn.receive(message.data):
                        break
                elif message.type == WSMsgType.BINARY:
                    await conn.refuse_binary()
                    break
                elif message.type == WSMsgType.ERROR:
                    # aiohttp has closed the socket (1009 for a frame over max_message_bytes).
                    log.info("worker WebSocket closed on a protocol error: %s", message.data,
                             extra={"close_code": ws.close_code})
                    break
                if any(t.done() for t in loops):
                    break
        finally:
            conn.closing = True
            self.pool.discard(conn.demand)
            await conn.settle()
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.connections.discard(conn)
            SESSIONS.dec()
            with contextlib.suppress(errors.OrbitError):
                await dispatch.close(self.db, session)
        return ws

    async def http_poll(self, request: web.Request) -> web.Response:
        session = await self._load(request, live=True)
        doc = await _read_object(request)
        unknown = set(doc) - {"max", "wait_ms"}
        max_, wait_ms = doc.get("max", 1), doc.get("wait_ms", 0)
        if unknown or isinstance(max_, bool) or not isinstance(max_, int) \
                or not 1 <= max_ <= leases.MAX_BATCH or isinstance(wait_ms, bool) \
                or not isinstance(wait_ms, int) or not 0 <= wait_ms <= MAX_POLL_WAIT_MS:
            raise errors.ValidationFailed([{"path": "$", "message": "max 1-256, wait_ms "
                                            f"0-{MAX_POLL_WAIT_MS}, no other fields"}])
        await dispatch.heartbeat(self.lane, session)
        grants = await self.pool.poll(session, max_, wait_ms / 1000)
        cancels = await dispatch.cancel_requested(self.db, session)
        body = ('{"grants": [' + ", ".join(protocol.grant_json(g) for g in grants) + '],'
                ' "cancel": ' + json.dumps([c.hex() for c in cancels]) + "}")
        return web.Response(text=body, content_type="application/json")

    def _http_op(self, kind: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            session = await self._load(request, live=False)
            doc = await _read_object(request)
            items = await self.operations()[kind](session, doc)
            return web.json_response({"items": items})

        return handler

    async def http_heartbeat(self, request: web.Request) -> web.Response:
        session = await self._load(request, live=False)
        await dispatch.heartbeat(self.lane, session)
        return web.json_response({"session_id": session.id.hex(), "alive": True})

    async def http_close(self, request: web.Request) -> web.Response:
        session = await self._load(request, live=False)
        await dispatch.close(self.db, session)
        return web.Response(status=204)


async def _read_object(request: web.Request) -> dict[str, Any]:
    """A JSON object body (strict parsing, size and container limits, content type) for worker
    calls."""
    doc = await read_document(request, max_containers=protocol.MAX_CONTAINERS)
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "expected a JSON object"}])
    return doc

"""An in-process fake dispatcher speaking the worker protocol of docs/api/worker.md.

It is the SDK's unit seam: enough state to approve starts, renew leases, keep receipts by
report id and push grants and cancel notices, plus switches to misbehave (refuse the WebSocket
upgrade, lose the reply to a finish). Every client message is recorded in ``messages``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from orbit_sdk import jsonvalue  # only to splice RawJson task inputs into grants verbatim

API_KEY = "orbit_test_key_not_a_secret"


@attrs.define
class FakeAttempt:
    task_id: str
    attempt_id: str
    token: str
    generation: int
    handler: str
    input: Any
    rerun_safe: bool
    session_id: str
    state: str = "OFFERED"  # OFFERED | RUNNING | FINISHED
    limited: int = 0  # starts refused as start_rate_limited so far
    cancel_requested: bool = False
    lease_lost: bool = False
    outcome: str | None = None


@attrs.define
class FakeSession:
    session_id: str
    instance_key: str
    fenced: bool = False
    ws: web.WebSocketResponse | None = None
    slots: int = 0
    closed: bool = False


@attrs.define
class Message:
    session_id: str
    transport: str  # "ws" | "http"
    type: str
    body: dict[str, Any]


def _iso(seconds_from_now: float) -> str:
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now)
    return at.isoformat(timespec="microseconds")


class FakeDispatcher:
    def __init__(self, *, websocket: bool = True, lease_ms: int = 3000) -> None:
        self.websocket = websocket
        self.lease_ms = lease_ms
        self.sessions: dict[str, FakeSession] = {}
        self.registrations: list[dict[str, Any]] = []
        self.pending: deque[dict[str, Any]] = deque()
        self.attempts: dict[str, FakeAttempt] = {}
        self.messages: list[Message] = []
        self.raw_frames: list[str] = []  # every WebSocket text frame received, as sent
        self.receipts: dict[str, tuple[str, dict[str, Any]]] = {}
        self.deleted: list[str] = []
        self.lose_finish_replies = 0  # commit the next N finishes, then drop the connection
        # Refuse each attempt's first N starts with start_rate_limited and this retry_after_ms.
        self.rate_limit_starts = 0
        self.rate_limit_ms = 50
        self.offer_s = 30.0  # offer_expires_at of new grants, seconds from now
        self.refuse_starts: str | None = None  # refuse every start with this reason
        self.max_result_bytes: int | None = None  # refuse larger finishes: result_too_large
        self.work = asyncio.Event()
        self.server: TestServer | None = None
        self.url = ""

    # --- test controls -----------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        base = "/v1/namespaces/{namespace}/worker/sessions"
        app.router.add_post(base, self.register)
        app.router.add_get(base + "/{session_id}/ws", self.ws)
        app.router.add_post(base + "/{session_id}/poll", self.poll)
        for op in ("start", "renew", "finish"):
            app.router.add_post(base + "/{session_id}/" + op, self._http_op(op))
        app.router.add_post(base + "/{session_id}/heartbeat", self.heartbeat)
        app.router.add_delete(base + "/{session_id}", self.close_session)
        self.server = TestServer(app)
        await self.server.start_server()
        self.url = str(self.server.make_url("")).rstrip("/")
        return self.url

    async def stop(self) -> None:
        for session in self.sessions.values():
            if session.ws is not None and not session.ws.closed:
                await session.ws.close()
        if self.server is not None:
            await self.server.close()

    def add_task(self, handler: str, input: Any = None, *, rerun_safe: bool = False,
                 **extra: Any) -> str:
        task_id = secrets.token_hex(16)
        self.pending.append({"task_id": task_id, "handler": handler, "input": input,
                             "rerun_safe": rerun_safe, **extra})
        self.work.set()
        asyncio.get_running_loop().create_task(self._push_all())
        return task_id

    async def cancel(self, attempt_id: str, *, push: bool = True) -> None:
        """Request cancellation; push a ``cancel`` frame (else only renewals say so)."""
        attempt = self.attempts[attempt_id]
        attempt.cancel_requested = True
        session = self.sessions[attempt.session_id]
        if push and session.ws is not None and not session.ws.closed:
            await session.ws.send_json({"type": "cancel", "attempt_ids": [attempt_id]})

    async def drop_connections(self) -> None:
        for session in self.sessions.values():
            if session.ws is not None and not session.ws.closed:
                await session.ws.close()

    def of_type(self, kind: str) -> list[Message]:
        return [m for m in self.messages if m.type == kind]

    def finish_items(self) -> list[dict[str, Any]]:
        return [item for m in self.of_type("finish") for item in m.body["items"]]

    def attempt_for(self, task_id: str) -> FakeAttempt:
        """The latest attempt of a task (KeyError before its first grant)."""
        found = [a for a in self.attempts.values() if a.task_id == task_id]
        if not found:
            raise KeyError(task_id)
        return found[-1]

    def state(self, task_id: str) -> str | None:
        """The latest attempt's state, ``None`` before the task was granted."""
        try:
            return self.attempt_for(task_id).state
        except KeyError:
            return None

    async def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.01)

    # --- protocol ----------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            raise web.HTTPUnauthorized(
                text=json.dumps({"status": 401, "code": "invalid_credential"}),
                content_type="application/problem+json")

    def _session(self, request: web.Request, *, live: bool) -> FakeSession:
        self._authorized(request)
        session = self.sessions.get(request.match_info["session_id"])
        if session is None:
            raise web.HTTPNotFound()
        if live and (session.fenced or session.closed):
            raise web.HTTPConflict(text=json.dumps({"status": 409, "code": "session_lost"}),
                                   content_type="application/problem+json")
        return session

    async def register(self, request: web.Request) -> web.Response:
        self._authorized(request)
        body = await request.json()
        self.registrations.append(body)
        for old in self.sessions.values():
            if old.instance_key == body["instance_key"] and not old.fenced:
                old.fenced = True
                if old.ws is not None and not old.ws.closed:
                    await old.ws.close()
        session = FakeSession(session_id=secrets.token_hex(16),
                              instance_key=body["instance_key"])
        self.sessions[session.session_id] = session
        return web.json_response({"session_id": session.session_id,
                                  "generation": len(self.registrations),
                                  "expires_at": _iso(30), "heartbeat_interval_ms": 10000},
                                 status=201)

    def _grant(self, session: FakeSession, task: dict[str, Any]) -> dict[str, Any]:
        extra = {k: v for k, v in task.items()
                 if k not in {"task_id", "handler", "input", "rerun_safe"}}
        attempt = FakeAttempt(task_id=task["task_id"], attempt_id=secrets.token_hex(16),
                              token=secrets.token_urlsafe(24),
                              generation=1 + sum(1 for a in self.attempts.values()
                                                 if a.task_id == task["task_id"]),
                              handler=task["handler"], input=task["input"],
                              rerun_safe=task["rerun_safe"], session_id=session.session_id)
        self.attempts[attempt.attempt_id] = attempt
        return {"task_id": attempt.task_id, "attempt_id": attempt.attempt_id,
                "generation": attempt.generation, "token": attempt.token, "queue": "q",
                "handler": attempt.handler, "input": attempt.input, "priority": 0,
                "business_key": None, "rerun_safe": attempt.rerun_safe,
                "offer_expires_at": _iso(self.offer_s), "deadline_at": None,
                "attempt_timeout_ms": None, "max_attempts": 3, **extra}

    def _take(self, session: FakeSession, limit: int) -> list[dict[str, Any]]:
        grants = []
        while self.pending and len(grants) < limit:
            grants.append(self._grant(session, self.pending.popleft()))
        if not self.pending:
            self.work.clear()
        return grants

    async def _push_all(self) -> None:
        for session in list(self.sessions.values()):
            await self._push(session)

    async def _push(self, session: FakeSession) -> None:
        if session.ws is None or session.ws.closed or session.fenced or session.slots <= 0:
            return
        grants = self._take(session, session.slots)
        if grants:
            session.slots -= len(grants)
            await session.ws.send_str(jsonvalue.dumps({"type": "grants", "grants": grants}))

    def _start(self, item: dict[str, Any]) -> dict[str, Any]:
        attempt = self._authentic(item)
        answer: dict[str, Any] = {"attempt_id": item["attempt_id"], "approved": False,
                                  "reason": None, "lease_expires_at": None}
        if attempt is None:
            answer["reason"] = "invalid_attempt"
        elif attempt.state == "FINISHED":
            answer["reason"] = "attempt_finished"
        elif attempt.cancel_requested:
            answer["reason"] = "cancel_requested"
        elif self.refuse_starts is not None:
            answer["reason"] = self.refuse_starts
        elif attempt.state == "OFFERED" and attempt.limited < self.rate_limit_starts:
            attempt.limited += 1
            answer.update(reason="start_rate_limited", retry_after_ms=self.rate_limit_ms)
        else:
            attempt.state = "RUNNING"
            answer.update(approved=True, lease_expires_at=_iso(self.lease_ms / 1000))
        return answer

    def _renew(self, item: dict[str, Any]) -> dict[str, Any]:
        attempt = self._authentic(item)
        answer: dict[str, Any] = {"attempt_id": item["attempt_id"], "renewed": False,
                                  "reason": None, "lease_expires_at": None,
                                  "cancel_requested": False}
        if attempt is None:
            answer["reason"] = "invalid_attempt"
        elif attempt.state != "RUNNING":
            answer["reason"] = "attempt_finished"
        elif attempt.lease_lost:
            answer["reason"] = "lease_expired"
        else:
            answer.update(renewed=True, lease_expires_at=_iso(self.lease_ms / 1000),
                          cancel_requested=attempt.cancel_requested)
        return answer

    def _finish(self, item: dict[str, Any]) -> dict[str, Any]:
        content = {k: v for k, v in item.items() if k != "report_id"}
        known = self.receipts.get(item["report_id"])
        if known is not None:
            if known[0] != json.dumps(content, sort_keys=True):
                raise ValueError("report_conflict")
            return {**known[1], "replayed": True}
        attempt = self._authentic(item)
        answer: dict[str, Any] = {"attempt_id": item["attempt_id"], "accepted": False,
                                  "reason": None, "task_state": None, "replayed": False}
        if attempt is None:
            answer["reason"] = "invalid_attempt"
        elif attempt.state != "RUNNING":
            answer["reason"] = "attempt_finished"
        elif attempt.lease_lost:
            answer["reason"] = "lease_expired"
        elif item["outcome"] == "cancelled" and not attempt.cancel_requested:
            answer["reason"] = "cancel_not_requested"
        else:
            attempt.state = "FINISHED"
            attempt.outcome = item["outcome"]
            answer.update(accepted=True, task_state={
                "succeeded": "SUCCEEDED", "unknown": "NEEDS_REVIEW", "cancelled": "CANCELLED",
                "failed": "WAITING" if item.get("retryable") else "FAILED",
            }[item["outcome"]])
        self.receipts[item["report_id"]] = (json.dumps(content, sort_keys=True), answer)
        return answer

    def _authentic(self, item: dict[str, Any]) -> FakeAttempt | None:
        attempt = self.attempts.get(item["attempt_id"])
        if attempt is None or attempt.token != item["token"] \
                or attempt.generation != item["generation"]:
            return None
        return attempt

    def _answer(self, op: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not items or len(items) > 256:
            raise ValueError("batch_too_large")
        if op == "finish" and self.max_result_bytes is not None and sum(
                len(json.dumps(i.get("result"), separators=(",", ":")).encode())
                for i in items if i["outcome"] == "succeeded") > self.max_result_bytes:
            raise ValueError("result_too_large")
        handle = {"start": self._start, "renew": self._renew, "finish": self._finish}[op]
        return [handle(item) for item in items]

    async def ws(self, request: web.Request) -> web.StreamResponse:
        if not self.websocket:
            raise web.HTTPNotFound()
        session = self._session(request, live=True)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        session.ws = ws
        try:
            async for message in ws:
                if message.type is not WSMsgType.TEXT:
                    continue
                self.raw_frames.append(message.data)
                frame = json.loads(message.data)
                self.messages.append(Message(session.session_id, "ws", frame["type"], frame))
                if frame["type"] == "ready":
                    session.slots = frame["slots"]
                    await self._push(session)
                    continue
                try:
                    items = self._answer(frame["type"], frame["items"])
                except ValueError as exc:
                    await ws.send_json({"type": "error", "id": frame.get("id"),
                                        "code": str(exc), "detail": "refused"})
                    continue
                if frame["type"] == "finish" and self.lose_finish_replies > 0:
                    self.lose_finish_replies -= 1
                    await ws.close()  # committed, but the reply never arrives
                    break
                await ws.send_json({"type": "reply", "id": frame["id"], "op": frame["type"],
                                    "items": items})
        finally:
            session.closed = True
        return ws

    async def poll(self, request: web.Request) -> web.Response:
        session = self._session(request, live=True)
        body = await request.json()
        self.messages.append(Message(session.session_id, "http", "poll", body))
        assert 1 <= body["max"] <= 256
        assert 0 <= body["wait_ms"] <= 30_000
        if not self.pending:
            try:
                async with asyncio.timeout(body["wait_ms"] / 1000):
                    await self.work.wait()
            except TimeoutError:
                pass
        grants = self._take(session, body["max"])
        cancels = [a.attempt_id for a in self.attempts.values()
                   if a.session_id == session.session_id and a.cancel_requested
                   and a.state == "RUNNING"]
        return web.Response(text=jsonvalue.dumps({"grants": grants, "cancel": cancels}),
                            content_type="application/json")

    def _http_op(self, op: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            session = self._session(request, live=False)
            body = await request.json()
            self.messages.append(Message(session.session_id, "http", op, body))
            try:
                items = self._answer(op, body["items"])
            except ValueError as exc:
                return web.json_response({"status": 409, "code": str(exc)}, status=409,
                                         content_type="application/problem+json")
            return web.json_response({"items": items})
        return handler

    async def heartbeat(self, request: web.Request) -> web.Response:
        session = self._session(request, live=True)
        self.messages.append(Message(session.session_id, "http", "heartbeat", {}))
        return web.json_response({"session_id": session.session_id, "alive": True})

    async def close_session(self, request: web.Request) -> web.Response:
        session = self._session(request, live=False)
        session.closed = True
        self.deleted.append(session.session_id)
        return web.Response(status=204)

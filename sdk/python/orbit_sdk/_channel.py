"""The worker's two ways to talk to a dispatcher session: a WebSocket, or HTTP long-polling.

Both offer the same surface to the worker: ``request(op, items)`` for the batched ``start``,
``renew`` and ``finish`` calls (answered per item), ``offer_slots(n)`` for flow control, and
callbacks for pushed grants and cancel notices. A channel that fails sets ``closed`` and fails
every request in flight with :class:`ChannelDown`; the worker then opens a new session.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from orbit_sdk import jsonvalue
from orbit_sdk._frames import FrameSocket
from orbit_sdk._http import Transport
from orbit_sdk.errors import (
    ConnectionFailed,
    OrbitError,
    ProtocolError,
    ServiceUnavailable,
    SessionLost,
)

log = logging.getLogger("orbit_sdk.worker")

GrantsCallback = Callable[[list[dict[str, Any]]], None]
CancelCallback = Callable[[list[str]], None]

# Error codes after which the same request may succeed later (the server changed nothing).
TRANSIENT_CODES = frozenset({
    "service_unavailable", "database_unavailable", "transaction_retries_exhausted",
    "commit_outcome_unknown",
})


POLL_MAX = 256  # grants per poll (the dispatcher's batch limit)
MAX_POLL_WAIT_MS = 30_000


class ChannelDown(Exception):
    """The channel failed before the answer arrived: the request's effect is unknown."""


class Channel(abc.ABC):
    """One dispatcher session's transport."""

    def __init__(self, on_grants: GrantsCallback, on_cancel: CancelCallback) -> None:
        self.on_grants = on_grants
        self.on_cancel = on_cancel
        self.closed = asyncio.Event()

    @property
    @abc.abstractmethod
    def kind(self) -> str: ...

    @abc.abstractmethod
    async def request(self, op: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send one batched call; its per-item answers. Raises :class:`ChannelDown` or
        :class:`ProtocolError` (the call was refused as a whole and changed nothing)."""

    @abc.abstractmethod
    async def offer_slots(self, slots: int) -> None:
        """Tell the dispatcher how many new grants this worker can take now."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the transport (idempotent)."""


def _items(answer: Any) -> list[dict[str, Any]]:
    items = answer.get("items") if isinstance(answer, dict) else answer
    if not isinstance(items, list):
        raise ProtocolError("an answer without items", code="invalid_response")
    return [item for item in items if isinstance(item, dict)]


class WebSocketChannel(FrameSocket, Channel):
    """``GET …/worker/sessions/{id}/ws``: grants and cancel notices pushed, requests matched to
    replies by ``id`` (the frame plumbing: :class:`~orbit_sdk._frames.FrameSocket`)."""

    down = ChannelDown
    label = "WebSocket"

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, on_grants: GrantsCallback,
                 on_cancel: CancelCallback, request_timeout: float,
                 exact_numbers: bool) -> None:
        Channel.__init__(self, on_grants, on_cancel)
        FrameSocket.__init__(self, ws, request_timeout=request_timeout,
                             exact_numbers=exact_numbers)

    @property
    def kind(self) -> str:
        return "websocket"

    @classmethod
    async def open(cls, http: Transport, path: str, *, on_grants: GrantsCallback,
                   on_cancel: CancelCallback, request_timeout: float,
                   exact_numbers: bool) -> WebSocketChannel:
        """Upgrade to a WebSocket. Raises ``aiohttp.WSServerHandshakeError`` when the server
        refuses the upgrade, :class:`ConnectionFailed` when it cannot be reached."""
        try:
            ws = await http.session().ws_connect(
                http.url(path), headers=http.headers, heartbeat=15.0, autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            )
        except aiohttp.WSServerHandshakeError:
            raise
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise ConnectionFailed(f"WebSocket {path}: {type(exc).__name__}") from exc
        return cls(ws, on_grants=on_grants, on_cancel=on_cancel,
                   request_timeout=request_timeout, exact_numbers=exact_numbers)

    async def request(self, op: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._call({"type": op, "items": items}, op)
        return answer

    async def offer_slots(self, slots: int) -> None:
        await self._send({"type": "ready", "id": f"r{next(self._ids)}", "slots": slots})

    def _on_frame(self, kind: Any, frame: dict[str, Any]) -> bool:
        if kind == "grants":
            grants = frame.get("grants")
            self.on_grants([g for g in grants if isinstance(g, dict)]
                           if isinstance(grants, list) else [])
        elif kind == "cancel":
            ids = frame.get("attempt_ids")
            self.on_cancel([i for i in ids if isinstance(i, str)] if isinstance(ids, list)
                           else [])
        elif kind == "reply":
            try:
                self._resolve(frame, _items(frame))
            except ProtocolError as exc:
                self._resolve(frame, error=exc)
        else:
            return False
        return True


class PollChannel(Channel):
    """The HTTP long-poll fallback: ``poll`` for grants and cancel notices (it also heartbeats),
    ``start``/``renew``/``finish`` as plain POSTs, ``heartbeat`` while no slot is free."""

    def __init__(self, http: Transport, session_path: str, *, on_grants: GrantsCallback,
                 on_cancel: CancelCallback, request_timeout: float, wait_ms: int,
                 heartbeat_s: float) -> None:
        super().__init__(on_grants, on_cancel)
        self._http = http
        self._path = session_path
        self._timeout = request_timeout
        self._wait_ms = max(0, min(wait_ms, MAX_POLL_WAIT_MS))
        self._heartbeat_s = heartbeat_s
        self._slots = 0
        self._slots_changed = asyncio.Event()
        self._poller = asyncio.get_running_loop().create_task(self._poll(),
                                                              name="orbit-long-poll")

    @property
    def kind(self) -> str:
        return "long-poll"

    async def _call(self, op: str, body: Any, *, time_limit: float | None = None) -> Any:
        if self.closed.is_set():
            raise ChannelDown("the session is closed")
        try:
            return await self._http.request(
                "POST", f"{self._path}/{op}",
                body=None if body is None else jsonvalue.dumps(body),
                time_limit=time_limit or self._timeout,
            )
        except SessionLost as exc:
            self.closed.set()
            raise ChannelDown("the session was fenced or expired") from exc
        except (ConnectionFailed, ServiceUnavailable) as exc:
            self.closed.set()
            raise ChannelDown(f"{op}: {exc.code}") from exc
        except OrbitError as exc:
            raise ProtocolError(exc.detail, status=exc.status, code=exc.code,
                                errors=exc.errors) from exc

    async def request(self, op: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _items(await self._call(op, {"items": items}))

    async def offer_slots(self, slots: int) -> None:
        self._slots = slots
        self._slots_changed.set()

    async def _poll(self) -> None:
        try:
            while not self.closed.is_set():
                if self._slots <= 0:
                    self._slots_changed.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._heartbeat_s):
                            await self._slots_changed.wait()
                    if self._slots <= 0:
                        await self._call("heartbeat", None)
                    continue
                answer = await self._call(
                    "poll", {"max": min(self._slots, POLL_MAX), "wait_ms": self._wait_ms},
                    time_limit=self._wait_ms / 1000 + self._timeout,
                )
                if not isinstance(answer, dict):
                    continue
                grants = answer.get("grants")
                if isinstance(grants, list) and grants:
                    self._slots -= len(grants)
                    self.on_grants([g for g in grants if isinstance(g, dict)])
                cancel = answer.get("cancel")
                if isinstance(cancel, list) and cancel:
                    self.on_cancel([c for c in cancel if isinstance(c, str)])
        except ChannelDown as exc:
            log.info("long-poll channel down: %s", exc)
        except ProtocolError as exc:
            log.warning("long-poll refused: %s", exc)
        finally:
            self.closed.set()

    async def close(self) -> None:
        self.closed.set()
        if self._poller is not asyncio.current_task():
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

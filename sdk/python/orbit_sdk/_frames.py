"""A WebSocket of JSON frames, shared by the worker's channel and the subscriber's stream.

Requests carry an ``id`` and are answered by a frame with the same ``id`` (or an ``error``
frame, raised as :class:`ProtocolError`); frames the server pushes go to ``_on_frame``. When the
socket fails -- a send or a read error, no answer within the request timeout, a close -- every
request in flight fails with the subclass's ``down`` exception and ``closed`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any

import aiohttp

from orbit_sdk import jsonvalue
from orbit_sdk.errors import ProtocolError

log = logging.getLogger("orbit_sdk")


class FrameSocket:
    """The frame plumbing; subclasses say what a pushed frame means (``_on_frame``)."""

    #: Raised to senders and to requests in flight once the socket is down.
    down: type[Exception] = ConnectionError
    #: What the socket is, in log lines and the reader task's name.
    label = "WebSocket"

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, request_timeout: float,
                 exact_numbers: bool) -> None:
        self._ws = ws
        self._timeout = request_timeout
        self._exact = exact_numbers
        self._ids = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self.closed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(
            self._read(), name=f"orbit-{self.label.lower().replace(' ', '-')}-reader")

    async def _send(self, frame: dict[str, Any]) -> None:
        if self.closed.is_set():
            raise self.down(f"the {self.label} is closed")
        try:
            await self._ws.send_str(jsonvalue.dumps(frame))
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            self._fail()
            raise self.down(f"sending failed: {type(exc).__name__}") from exc

    async def _call(self, frame: dict[str, Any], what: str) -> Any:
        """Send ``frame`` (its ``id`` set here) and wait for its answer (``_resolve``)."""
        request_id = frame["id"] = f"r{next(self._ids)}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            await self._send(frame)
            async with asyncio.timeout(self._timeout):
                return await future
        except TimeoutError as exc:
            self._fail()  # a socket that stopped answering is replaced, not trusted
            raise self.down(f"no answer to {what} within {self._timeout}s") from exc
        finally:
            self._waiting.pop(request_id, None)

    def _resolve(self, frame: dict[str, Any], value: Any = None,
                 error: BaseException | None = None) -> bool:
        """Answer the request ``frame`` names by its ``id``; False when none is waiting."""
        future = self._waiting.get(str(frame.get("id")))
        if future is None or future.done():
            return False
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
        return True

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                if message.type is aiohttp.WSMsgType.TEXT:
                    self._dispatch(message.data)
                elif message.type in {aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE}:
                    break
        except (aiohttp.ClientError, ConnectionError) as exc:
            log.info("%s read failed: %s", self.label, type(exc).__name__)
        finally:
            self._on_closed()
            self._fail()

    def _dispatch(self, data: str) -> None:
        try:
            frame = jsonvalue.loads(data, exact_numbers=self._exact)
        except ValueError:
            log.warning("ignoring a %s frame that is not JSON", self.label)
            return
        if not isinstance(frame, dict):
            log.warning("ignoring a %s frame that is not an object", self.label)
            return
        kind = frame.get("type")
        if kind == "error":
            code, detail = frame.get("code"), frame.get("detail")
            error = ProtocolError(detail if isinstance(detail, str) else "",
                                  code=code if isinstance(code, str) else None)
            if not self._resolve(frame, error=error):
                self._unanswered_error(error)
        elif not self._on_frame(kind, frame):
            log.debug("ignoring a %s frame of type %r", self.label, kind)

    def _on_frame(self, kind: Any, frame: dict[str, Any]) -> bool:
        """Handle a frame other than ``error``; False when its type means nothing here."""
        return False

    def _unanswered_error(self, error: ProtocolError) -> None:
        """An ``error`` frame no request waits for."""
        log.warning("%s error frame: %s", self.label, error)

    def _on_closed(self) -> None:
        """The reader ended (the socket closed or failed), before requests in flight fail."""

    def _fail(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(self.down(f"the {self.label} closed"))

    async def close(self) -> None:
        self._fail()
        with contextlib.suppress(Exception):
            await self._ws.close()
        if self._reader is not asyncio.current_task():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

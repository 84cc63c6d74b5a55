"""A small TCP proxy on 127.0.0.1 that injects faults into MySQL client connections.

It understands just enough of the MySQL protocol (length-prefixed packets) to recognise a
``COM_QUERY "COMMIT"`` from the client, and can then, once:

* ``CUT_BEFORE_COMMIT``: drop the connection without forwarding COMMIT (the server rolls back);
* ``CUT_AFTER_COMMIT``: forward COMMIT, wait for the server's answer, and drop the connection
  instead of relaying it (committed, but the client cannot know).

* ``DELAY_COMMIT``: hold COMMIT for ``delay_s``; if the client disconnects meanwhile, never
  forward it (the server then rolls back), otherwise forward it late.

Other modes: ``BLACKHOLE`` (accept, forward nothing) and ``RESET`` (close new connections at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum

COM_QUERY = 0x03


class Fault(enum.Enum):
    NONE = "none"
    CUT_BEFORE_COMMIT = "cut_before_commit"
    CUT_AFTER_COMMIT = "cut_after_commit"
    DELAY_COMMIT = "delay_commit"
    BLACKHOLE = "blackhole"
    RESET = "reset"


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.fault = Fault.NONE
        self.armed = False
        self.fired = asyncio.Event()
        self.commits_seen = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.delay_s = 0.5
        self.client_left_during_delay = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def arm(self, fault: Fault) -> None:
        """Inject ``fault`` once (commit faults fire on the next COMMIT)."""
        self.fault = fault
        self.armed = True
        self.fired.clear()

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.armed and self.fault is Fault.RESET:
            writer.transport.abort()
            return
        if self.armed and self.fault is Fault.BLACKHOLE:
            await reader.read()  # hold the connection open, forward nothing
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer=writer, up_writer=up_writer)
        self._spawn(self._pump_server(up_reader, link))
        await self._pump_client(reader, link)

    async def _pump_server(self, up_reader: asyncio.StreamReader, link: _Link) -> None:
        try:
            while data := await up_reader.read(65536):
                if link.hold:
                    link.server_answered.set()  # swallowed: the client never sees it
                    continue
                link.writer.write(data)
                await link.writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.writer.transport.abort()
            link.up_writer.transport.abort()

    async def _pump_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        try:
            while True:
                header = await reader.readexactly(4)
                length = int.from_bytes(header[:3], "little")
                payload = await reader.readexactly(length)
                is_commit = (
                    length > 0
                    and payload[0] == COM_QUERY
                    and payload[1:].strip().upper() == b"COMMIT"
                )
                if is_commit:
                    self.commits_seen += 1
                if is_commit and self.armed and self.fault is Fault.CUT_BEFORE_COMMIT:
                    self.armed = False
                    self.fired.set()
                    return
                if is_commit and self.armed and self.fault is Fault.DELAY_COMMIT:
                    self.armed = False
                    self.fired.set()
                    try:
                        # The client sends nothing while it awaits the answer, so a read
                        # returns only at EOF: the client gave up on the connection.
                        early = await asyncio.wait_for(reader.read(1), self.delay_s)
                    except TimeoutError:
                        early = None
                    if early == b"":
                        self.client_left_during_delay = True
                        return
                    link.up_writer.write(header + payload + (early or b""))
                    await link.up_writer.drain()
                    continue
                if is_commit and self.armed and self.fault is Fault.CUT_AFTER_COMMIT:
                    self.armed = False
                    # Forward COMMIT, wait until the server has answered (the commit is
                    # durable), and cut the client off without relaying the answer.
                    link.hold = True
                    link.up_writer.write(header + payload)
                    await link.up_writer.drain()
                    await asyncio.wait_for(link.server_answered.wait(), 10)
                    self.fired.set()
                    return
                link.up_writer.write(header + payload)
                await link.up_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            link.writer.transport.abort()
            link.up_writer.transport.abort()


class _Link:
    """One proxied client connection."""

    def __init__(self, *, writer: asyncio.StreamWriter, up_writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.up_writer = up_writer
        self.hold = False
        self.server_answered = asyncio.Event()

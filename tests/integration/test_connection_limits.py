"""The ``[http]`` connection limits of every listener (orbit_common/service/http/server.py).

Raw sockets against in-process listeners with short settings: a request head or body that does
not arrive in time is answered 408 ``request_timeout`` and its connection closed; an idle
keep-alive connection closes; a client address holding its share of connections gets 503
``too_many_connections`` at accept; a WebSocket after its upgrade is not cut by the timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import prometheus_client
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.config import ConfigError, HttpConfig, load_config
from orbit_common.service.health import ReadinessGate
from orbit_common.service.runner import start_operator_server
from orbit_dispatcher.service import DispatcherService
from tests.conftest import Tenant, api_config
from tests.support.lease_fixtures import make_queue
from tests.support.servers import ServiceTestServer
from tests.support.waiting import until

SHORT = HttpConfig(header_timeout_s=0.5, body_timeout_s=0.5, keepalive_timeout_s=1.0,
                   max_connections_per_client=4)
# Scheduling slack on a shared, loaded 2-core machine; still far below what would close the
# connections without these limits (aiohttp lingers 10 s, keeps idle connections 3630 s).
MARGIN = 3.0

Address = tuple[str, int]
Serve = Callable[[str, HttpConfig], Awaitable[Address]]


def limited(reason: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_http_connections_limited_total", {"reason": reason}) or 0.0


def answered(route: str, method: str, status: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_http_requests_total", {"route": route, "method": method, "status": status}) or 0.0


@pytest.fixture
async def serve(db: Database, db_url: DatabaseUrl) -> AsyncIterator[Serve]:
    """Starts the API's, the dispatcher's or the operator listener with the given limits."""
    gate = ReadinessGate(SchemaChecker(db))
    await gate.refresh()
    clients: list[TestClient[Any, Any]] = []
    runners: list[web.AppRunner] = []
    services: list[DispatcherService] = []

    async def start(kind: str, http: HttpConfig) -> Address:
        if kind == "operator":
            runner = await start_operator_server(gate, "127.0.0.1", 0, http=http)
            runners.append(runner)
            host, port = runner.addresses[0][:2]
            assert isinstance(port, int)
            return str(host), port
        if kind == "api":
            app = create_app(api_config(db_url), db, gate)
        else:
            service = DispatcherService(api_config(db_url), db, gate)
            services.append(service)
            app = service.app
        client = TestClient(ServiceTestServer(app, http=http))
        await client.start_server()
        clients.append(client)
        assert client.port is not None
        return str(client.host), client.port

    try:
        yield start
    finally:
        for service in services:
            service.draining = True
        for client in clients:
            await client.close()
        for runner in runners:
            await runner.cleanup()


class Raw:
    """One client connection on a raw socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.opened = asyncio.get_running_loop().time()

    @classmethod
    async def open(cls, address: Address) -> Raw:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_closed(self, timeout: float) -> tuple[bytes, float]:
        """Everything the server sends until it closes the connection, and when it closed
        (seconds since the connection opened); fails if it is still open after ``timeout``."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            data = await self.reader.read()
        return data, loop.time() - self.opened

    async def response(self) -> tuple[int, bytes]:
        """One response (status and body) on a keep-alive connection."""
        async with asyncio.timeout(10):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next(int(line.split(":", 1)[1]) for line in lines
                          if line.lower().startswith("content-length:"))
            body = await self.reader.readexactly(length)
        return int(lines[0].split()[1]), body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def problem(data: bytes, status: int) -> dict[str, Any]:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    assert int(status_line.split()[1]) == status, data
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    assert headers["content-type"].startswith("application/problem+json"), headers
    # Answers without a request (HTTP/1.0, like aiohttp's parser refusals) close implicitly.
    assert headers.get("connection") == "close" or status_line.startswith("HTTP/1.0"), data
    doc: dict[str, Any] = json.loads(body)
    assert doc["status"] == status
    return doc


def clean(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], (
        caplog.text)


@pytest.mark.parametrize("kind", ["api", "dispatcher", "operator"])
async def test_a_connection_that_sends_nothing_gets_408_at_the_header_timeout(
    serve: Serve, kind: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    before = limited("header_timeout")
    conn = await Raw.open(await serve(kind, SHORT))
    data, closed_after = await conn.until_closed(SHORT.header_timeout_s + MARGIN)
    await conn.close()
    doc = problem(data, 408)
    assert doc["code"] == "request_timeout"
    assert closed_after >= SHORT.header_timeout_s - 0.05
    assert limited("header_timeout") == before + 1
    lines = [r for r in caplog.records if "request head not received" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO], caplog.text
    clean(caplog)


async def test_a_head_trickled_line_by_line_is_cut_at_the_header_timeout(
    serve: Serve, caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's slow client: a header line at a time, each well within any idle timeout."""
    caplog.set_level(logging.INFO)
    conn = await Raw.open(await serve("api", SHORT))

    async def trickle() -> None:
        await conn.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        with contextlib.suppress(ConnectionError):
            for n in range(1000):
                await asyncio.sleep(0.05)  # the slow client's pace, not a wait for the server
                await conn.send(b"X-Slow-%d: 1\r\n" % n)

    sender = asyncio.create_task(trickle())
    try:
        data, closed_after = await conn.until_closed(SHORT.header_timeout_s + MARGIN)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        await conn.close()
    assert problem(data, 408)["code"] == "request_timeout"
    assert closed_after >= SHORT.header_timeout_s - 0.05
    clean(caplog)


async def test_a_client_still_sending_after_the_408_reads_it_whole_and_sees_an_orderly_close(
    serve: Serve, caplog: pytest.LogCaptureFixture,
) -> None:
    """The answer is followed by a half-close, and what the client sends after it is read and
    discarded (not answered with a reset) until the client closes too (RFC 9112 §9.6)."""
    caplog.set_level(logging.INFO)
    conn = await Raw.open(await serve("api", SHORT))
    await conn.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
    data, _ = await conn.until_closed(SHORT.header_timeout_s + MARGIN)
    assert problem(data, 408)["code"] == "request_timeout"
    # The server has half-closed; a closed socket would answer these bytes with a reset.
    for n in range(64):
        await conn.send(b"X-Late-%d: %s\r\n" % (n, b"x" * 1000))
    conn.writer.write_eof()
    conn.writer.close()
    await conn.writer.wait_closed()  # raises ConnectionResetError after a reset
    clean(caplog)


async def test_keep_alive_idle_is_bounded_and_the_next_head_is_timed_from_its_first_byte(
    serve: Serve, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    address = await serve("api", SHORT)
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"

    idle = await Raw.open(address)
    await idle.send(request)
    assert (await idle.response())[0] == 200
    answered_at = asyncio.get_running_loop().time() - idle.opened
    data, closed_after = await idle.until_closed(SHORT.keepalive_timeout_s + MARGIN)
    await idle.close()
    # Closed silently by the keep-alive timer, not by the (shorter) header timeout.
    assert data == b""
    assert closed_after - answered_at >= SHORT.keepalive_timeout_s - 0.05

    slow = await Raw.open(address)
    await slow.send(request)
    assert (await slow.response())[0] == 200
    await slow.send(b"GET /healthz HTTP/1.1\r\n")  # the next head, never finished
    loop = asyncio.get_running_loop()
    started = loop.time()
    data, _ = await slow.until_closed(SHORT.header_timeout_s + MARGIN)
    await slow.close()
    assert problem(data, 408)["code"] == "request_timeout"
    assert loop.time() - started >= SHORT.header_timeout_s - 0.05
    clean(caplog)


def body_target(kind: str, tenant: Tenant) -> bytes:
    """A route of each application that authenticates and then reads its JSON body."""
    if kind == "dispatcher":
        return f"/v1/namespaces/{tenant.namespace}/worker/sessions".encode()
    return b"/v1/namespaces"


@pytest.mark.parametrize("kind", ["api", "dispatcher"])
async def test_a_body_slower_than_the_body_timeout_is_answered_408_and_closed(
    serve: Serve, kind: str, tenant: Tenant, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    route = ("/v1/namespaces/{namespace}/worker/sessions" if kind == "dispatcher"
             else "/v1/namespaces")
    before = (limited("body_timeout"), answered(route, "POST", "408"),
              answered(route, "POST", "500"))
    conn = await Raw.open(await serve(kind, SHORT))
    await conn.send(b"\r\n".join([
        b"POST " + body_target(kind, tenant) + b" HTTP/1.1", b"Host: localhost",
        b"Authorization: Bearer " + tenant.api_key.encode(),
        b"Content-Type: application/json", b"Content-Length: 1000",
    ]) + b"\r\n\r\n" + b'{"name": "slo')
    data, closed_after = await conn.until_closed(SHORT.body_timeout_s + MARGIN)
    await conn.close()
    doc = problem(data, 408)
    assert doc["code"] == "request_timeout"
    assert "body" in doc["detail"]
    assert closed_after >= SHORT.body_timeout_s - 0.05
    assert (limited("body_timeout"), answered(route, "POST", "408"),
            answered(route, "POST", "500")) == (before[0] + 1, before[1] + 1, before[2])
    lines = [r for r in caplog.records if "request body not received" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO], caplog.text
    clean(caplog)


async def test_a_slow_body_no_handler_reads_is_closed_at_the_body_timeout(
    serve: Serve, caplog: pytest.LogCaptureFixture,
) -> None:
    """The route answers without reading the body (405 here); aiohttp would then read and drop
    the rest for its 10 s lingering time. The body timeout closes it sooner."""
    caplog.set_level(logging.INFO)
    before = limited("body_timeout")
    conn = await Raw.open(await serve("api", SHORT))
    await conn.send(b"POST /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n"
                    b"x")
    status, _ = await conn.response()
    assert status == 405
    data, _ = await conn.until_closed(SHORT.body_timeout_s + MARGIN)
    await conn.close()
    assert data == b""
    assert limited("body_timeout") == before + 1
    clean(caplog)


async def test_a_websocket_is_not_cut_by_the_read_timers(
    serve: Serve, tenant: Tenant, db: Database,
) -> None:
    host, port = await serve("dispatcher", SHORT)
    queue = await make_queue(db, tenant)
    before = [limited(reason) for reason in ("header_timeout", "body_timeout")]
    sessions = f"/v1/namespaces/{tenant.namespace}/worker/sessions"
    async with aiohttp.ClientSession(f"http://{host}:{port}") as client:
        async with client.post(sessions, headers=tenant.auth, json={
                "instance_key": "w-1", "queues": [queue.name], "handlers": ["noop"],
                "max_in_flight": 8}) as response:
            assert response.status == 201, await response.text()
            session_id = (await response.json())["session_id"]
        async with client.ws_connect(f"{sessions}/{session_id}/ws", headers=tenant.auth,
                                     autoping=False) as ws:
            # Nothing must happen here: a stretch three times the longest read timer.
            await asyncio.sleep(3 * max(SHORT.header_timeout_s, SHORT.body_timeout_s))
            await ws.ping(b"still there")
            async with asyncio.timeout(10):
                message = await ws.receive()
            assert message.type == aiohttp.WSMsgType.PONG, message
            assert not ws.closed
    assert [limited(reason) for reason in ("header_timeout", "body_timeout")] == before


@pytest.mark.parametrize("kind", ["api", "dispatcher"])
async def test_connections_over_the_per_client_limit_get_503_at_accept(
    serve: Serve, kind: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    http = HttpConfig(header_timeout_s=30, max_connections_per_client=4)
    address = await serve(kind, http)
    before = limited("too_many_connections")
    held = [await Raw.open(address) for _ in range(http.max_connections_per_client)]
    # The server admits a connection when its loop accepts it; these answer, so all are in.
    for conn in held:
        await conn.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert (await conn.response())[0] == 200
    try:
        for _ in range(2):
            extra = await Raw.open(address)
            data, _ = await extra.until_closed(MARGIN)
            await extra.close()
            doc = problem(data, 503)
            assert doc["code"] == "too_many_connections"
        assert limited("too_many_connections") == before + 2
        refusals = [r for r in caplog.records if "connections refused" in r.getMessage()]
        assert [r.levelno for r in refusals] == [logging.WARNING], caplog.text  # once

        await held.pop().close()

        async def admitted() -> bool:
            conn = await Raw.open(address)
            try:
                await conn.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
                                b"Connection: close\r\n\r\n")
                data, _ = await conn.until_closed(10)
            finally:
                await conn.close()
            return data.startswith(b"HTTP/1.1 200")

        await until(admitted, message="a connection admitted once one of the four closed")
    finally:
        for conn in held:
            await conn.close()
    clean(caplog)


def test_the_defaults_are_generous_and_checked() -> None:
    defaults = HttpConfig()
    assert defaults.checked() is defaults
    assert defaults.max_connections_per_client >= 256
    assert defaults.keepalive_timeout_s > defaults.header_timeout_s
    loaded = load_config(environ={"ORBIT_HTTP_HEADER_TIMEOUT_S": "2.5",
                                  "ORBIT_HTTP_MAX_CONNECTIONS_PER_CLIENT": "0"}).http
    assert (loaded.header_timeout_s, loaded.max_connections_per_client) == (2.5, 0)
    for bad in ({"header_timeout_s": 0}, {"body_timeout_s": -1},
                {"keepalive_timeout_s": 1e9}, {"max_connections_per_client": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            HttpConfig(**bad).checked()

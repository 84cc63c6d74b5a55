"""The webhook sender (orbit_delivery/sender.py) against real aiohttp servers on loopback."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orbit_delivery.sender import (
    IPAddress,
    SenderLimits,
    TransportError,
    WebhookSender,
    endpoint_key,
)
from tests.support.waiting import until

BODY = b'{"type":"task.result"}'
HEADERS = {"webhook-id": "d" * 32}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def allow_all(_ip: IPAddress) -> bool:
    return False


def refuse_loopback(ip: IPAddress) -> bool:
    return ip.is_loopback


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[TestServer]]]:
    """Start a real aiohttp server on 127.0.0.1 answering POST /hook with ``handler``."""
    servers: list[TestServer] = []

    async def start(handler: Handler, **kwargs: Any) -> TestServer:
        app = web.Application()
        app.router.add_post("/hook", handler)
        server = TestServer(app, host="127.0.0.1", **kwargs)
        await server.start_server()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


def hook(server: TestServer, *, host: str = "127.0.0.1", scheme: str = "http") -> str:
    return f"{scheme}://{host}:{server.port}/hook"


async def test_a_2xx_is_delivered_with_body_and_headers(serve: Any) -> None:
    seen: list[tuple[bytes, str, str]] = []

    async def ok(request: web.Request) -> web.Response:
        seen.append((await request.read(), request.headers["webhook-id"],
                     request.headers["Content-Type"]))
        return web.Response(status=204)

    server = await serve(ok)
    async with WebhookSender(SenderLimits(), address_refused=allow_all) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    assert outcome.delivered
    assert outcome.status == 204
    assert outcome.kind == "delivered"
    assert outcome.duration_ms >= 0
    assert seen == [(BODY, "d" * 32, "application/json")]


async def test_a_500_is_a_failure_with_status_and_body(serve: Any) -> None:
    async def broken(_request: web.Request) -> web.Response:
        return web.Response(status=500, text="database down")

    server = await serve(broken)
    async with WebhookSender(SenderLimits(), address_refused=allow_all) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    assert not outcome.delivered
    assert (outcome.status, outcome.body, outcome.truncated) == (500, "database down", False)
    assert outcome.error is None
    assert outcome.kind == "http_5xx"


async def test_a_slow_receiver_times_out(serve: Any) -> None:
    release = asyncio.Event()

    async def slow(_request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    server = await serve(slow)
    limits = SenderLimits(total_timeout_s=0.3)
    async with WebhookSender(limits, address_refused=allow_all) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    release.set()
    assert not outcome.delivered
    assert outcome.error is TransportError.TIMEOUT
    assert outcome.status is None
    assert 250 <= outcome.duration_ms < 5000


async def test_a_redirect_is_not_followed(serve: Any) -> None:
    async def moved(_request: web.Request) -> web.Response:
        # Followed, the POST would reach /hook again and loop until aiohttp gave up.
        raise web.HTTPTemporaryRedirect("/hook")

    server = await serve(moved)
    async with WebhookSender(SenderLimits(), address_refused=allow_all) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    assert not outcome.delivered
    assert outcome.status == 307
    assert outcome.kind == "http_3xx"


async def test_a_huge_response_body_is_truncated(serve: Any) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=400)
        await response.prepare(request)
        chunk = b"x" * 65536
        for _ in range(160):  # 10 MiB, streamed: the sender must stop reading early
            await response.write(chunk)
        await response.write_eof()
        return response

    server = await serve(huge)
    limits = SenderLimits(max_response_bytes=1000)
    async with WebhookSender(limits, address_refused=allow_all) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    assert outcome.status == 400
    assert outcome.body == "x" * 1000
    assert outcome.truncated


async def test_a_body_of_exactly_the_bound_is_not_truncated(serve: Any) -> None:
    async def exact(_request: web.Request) -> web.Response:
        return web.Response(status=422, body=b"y" * 1000)

    server = await serve(exact)
    limits = SenderLimits(max_response_bytes=1000)
    async with WebhookSender(limits, address_refused=allow_all) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    assert (outcome.status, outcome.body, outcome.truncated) == (422, "y" * 1000, False)


async def test_connection_refused() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with WebhookSender(SenderLimits(), address_refused=allow_all) as sender:
        outcome = await sender.send(f"http://127.0.0.1:{port}/hook", BODY, HEADERS)
    assert not outcome.delivered
    assert outcome.error is TransportError.REFUSED


class FixedResolver(AbstractResolver):
    """Resolves every name to fixed addresses, as a rebinding DNS server would answer."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        if not self.addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ResolveResult(hostname=host, host=address, port=port,
                              family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST)
                for address in self.addresses]

    async def close(self) -> None:
        return None


async def counting_server(serve: Any) -> tuple[TestServer, list[int]]:
    calls: list[int] = []

    async def ok(_request: web.Request) -> web.Response:
        calls.append(1)
        return web.Response()

    return await serve(ok), calls


async def test_dns_rebinding_to_loopback_is_refused(serve: Any) -> None:
    server, calls = await counting_server(serve)
    resolver = FixedResolver("127.0.0.1")
    async with WebhookSender(SenderLimits(), address_refused=refuse_loopback,
                             resolver=resolver) as sender:
        outcome = await sender.send(hook(server, host="hooks.example.com"), BODY, HEADERS)
    assert resolver.asked == ["hooks.example.com"]
    assert outcome.error is TransportError.ADDRESS_REFUSED
    assert calls == []
    # The same name with a policy that allows loopback reaches the server.
    async with WebhookSender(SenderLimits(), address_refused=allow_all,
                             resolver=FixedResolver("127.0.0.1")) as sender:
        outcome = await sender.send(hook(server, host="hooks.example.com"), BODY, HEADERS)
    assert outcome.delivered
    assert calls == [1]


async def test_a_refused_address_is_dropped_from_a_mixed_answer(serve: Any) -> None:
    server, calls = await counting_server(serve)
    # 127.0.0.2 is loopback too; a policy refusing only 127.0.0.2 must connect to 127.0.0.1.
    target = ipaddress.ip_address("127.0.0.2")
    async with WebhookSender(SenderLimits(), address_refused=lambda ip: ip == target,
                             resolver=FixedResolver("127.0.0.2", "127.0.0.1")) as sender:
        outcome = await sender.send(hook(server, host="hooks.example.com"), BODY, HEADERS)
    assert outcome.delivered
    assert calls == [1]


async def test_an_ip_literal_is_checked_at_connect_time(serve: Any) -> None:
    server, calls = await counting_server(serve)
    async with WebhookSender(SenderLimits(), address_refused=refuse_loopback) as sender:
        outcome = await sender.send(hook(server), BODY, HEADERS)
    assert outcome.error is TransportError.ADDRESS_REFUSED
    assert calls == []


async def test_a_name_that_does_not_resolve_is_a_dns_error() -> None:
    async with WebhookSender(SenderLimits(), address_refused=allow_all,
                             resolver=FixedResolver()) as sender:
        outcome = await sender.send("https://nowhere.example.com/hook", BODY, HEADERS)
    assert outcome.error is TransportError.DNS


async def test_not_a_url_is_refused_without_a_request() -> None:
    async with WebhookSender(SenderLimits(), address_refused=allow_all) as sender:
        for url in ("ftp://example.com/x", "/relative", "http://", "http://[::1", "http://a:99999/"):
            outcome = await sender.send(url, BODY, HEADERS)
            assert outcome.error is TransportError.INVALID_URL, url


def self_signed(directory: Path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    return context


async def test_an_untrusted_certificate_is_a_tls_error(tmp_path: Path) -> None:
    async def ok(_request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", ok)
    tls = TestServer(app, host="127.0.0.1")
    await tls.start_server(ssl=self_signed(tmp_path))
    try:
        async with WebhookSender(SenderLimits(), address_refused=allow_all) as sender:
            outcome = await sender.send(f"https://127.0.0.1:{tls.port}/hook", BODY, HEADERS)
        assert outcome.error is TransportError.TLS, outcome
        assert "CERTIFICATE_VERIFY_FAILED" in outcome.detail, outcome
        # Trusting the certificate, the same endpoint delivers (the failure was the trust).
        trusting = ssl.create_default_context(cafile=tmp_path / "cert.pem")
        async with WebhookSender(SenderLimits(), address_refused=allow_all,
                                 ssl_context=trusting) as sender:
            outcome = await sender.send(f"https://127.0.0.1:{tls.port}/hook", BODY, HEADERS)
        assert outcome.delivered, outcome
    finally:
        await tls.close()


class Gate:
    """A handler that holds every request until released and records the peak concurrency."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.served = 0
        self.release = asyncio.Event()

    async def handle(self, _request: web.Request) -> web.Response:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await self.release.wait()
        finally:
            self.active -= 1
        self.served += 1
        return web.Response()


async def test_the_per_endpoint_bound_holds(serve: Any) -> None:
    gate = Gate()
    server = await serve(gate.handle)
    limits = SenderLimits(per_endpoint=3, global_concurrency=50)
    async with WebhookSender(limits, address_refused=allow_all) as sender:
        sends = [asyncio.create_task(sender.send(hook(server), BODY, HEADERS))
                 for _ in range(12)]
        # Stable state: 3 requests at the server, the other 9 waiting in the sender.
        await until(lambda: gate.active == 3 and sender.waiting == 9,
                    message="3 requests in flight and 9 waiting")
        assert gate.peak == 3
        assert sender.in_flight == 3
        gate.release.set()
        outcomes = await asyncio.gather(*sends)
    assert all(o.delivered for o in outcomes)
    assert gate.served == 12
    assert gate.peak == 3


async def test_the_global_bound_holds_across_endpoints(serve: Any) -> None:
    gates = [Gate(), Gate()]
    servers = [await serve(gate.handle) for gate in gates]
    limits = SenderLimits(per_endpoint=4, global_concurrency=5)
    async with WebhookSender(limits, address_refused=allow_all) as sender:
        sends = [asyncio.create_task(sender.send(hook(server), BODY, HEADERS))
                 for server in servers for _ in range(6)]
        await until(lambda: sum(g.active for g in gates) == 5 and sender.waiting == 7,
                    message="5 requests in flight and 7 waiting")
        assert sum(g.active for g in gates) == 5
        assert max(g.peak for g in gates) <= 4
        for gate in gates:
            gate.release.set()
        outcomes = await asyncio.gather(*sends)
    assert all(o.delivered for o in outcomes)
    assert sum(g.served for g in gates) == 12


async def test_a_slow_endpoint_does_not_hold_global_slots(serve: Any) -> None:
    """A send queued for a full endpoint holds no global slot: another endpoint still gets
    through while the slow one's queue waits."""
    slow, fast = Gate(), Gate()
    slow_server, fast_server = await serve(slow.handle), await serve(fast.handle)
    fast.release.set()
    limits = SenderLimits(per_endpoint=2, global_concurrency=3)
    async with WebhookSender(limits, address_refused=allow_all) as sender:
        stuck = [asyncio.create_task(sender.send(hook(slow_server), BODY, HEADERS))
                 for _ in range(10)]
        await until(lambda: slow.active == 2 and sender.waiting == 8)
        outcome = await asyncio.wait_for(sender.send(hook(fast_server), BODY, HEADERS), 10)
        assert outcome.delivered
        slow.release.set()
        assert all(o.delivered for o in await asyncio.gather(*stuck))


def test_endpoint_keys() -> None:
    from yarl import URL

    assert endpoint_key(URL("https://Example.com/a?b")) == "https://example.com:443"
    assert endpoint_key(URL("http://example.com:8080/")) == "http://example.com:8080"
    assert endpoint_key(URL("https://[::1]:9/x")) == "https://[::1]:9"


def test_a_sender_can_be_made_outside_the_event_loop() -> None:
    """The daemon builds its parts before the loop runs; the sender needs the loop only to send."""
    sender = WebhookSender(SenderLimits(), address_refused=allow_all)
    assert (sender.in_flight, sender.waiting) == (0, 0)

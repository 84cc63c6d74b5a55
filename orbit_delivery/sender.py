"""The webhook sender: one HTTP POST per delivery attempt, with bounds and an address policy.

Bounds. At most ``per_endpoint`` requests are in flight to one endpoint (scheme, host, port) and
at most ``global_concurrency`` in all. A send waits for its endpoint's slot *before* it takes a
global one, so a slow endpoint's queue holds no global slots and cannot starve the others.
Every request has a connect timeout and a total timeout (connect, send, response headers and
the bounded body read); the response body is read up to ``max_response_bytes`` and the
connection is dropped rather than drained when more follows.

Outcomes. A 2xx answer is a delivery; any other status -- a 3xx included, since redirects are
never followed (a receiver moving its endpoint updates the subscription) -- is a failure with
its status code and truncated body; no answer is a failure with a :class:`TransportError` kind.
Every outcome carries the attempt's duration (monotonic, milliseconds).

Address policy (SSRF). The injected predicate ``address_refused(ip) -> bool`` is checked twice:
on every address a name resolves to (a name whose addresses are all refused fails as
``address_refused``; refused ones are dropped from a mixed answer, so they are never cached),
and on the address each socket is about to connect to, which also covers IP-literal URLs (aiohttp
does not resolve those). The second check is on the address actually used, so DNS rebinding --
a name that resolves to a public address when the subscription is checked and to 127.0.0.1 when
the pump sends -- is refused at send time. Proxies from the environment are ignored.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import attrs
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressPolicy = Callable[[IPAddress], bool]


class TransportError(enum.StrEnum):
    """Why no HTTP answer arrived (the values are metric labels and stored error kinds)."""

    TIMEOUT = "timeout"  # connect or total timeout
    REFUSED = "refused"  # the connection was refused (nothing listens)
    DNS = "dns"  # the name did not resolve
    TLS = "tls"  # certificate or handshake failure
    ADDRESS_REFUSED = "address_refused"  # the address policy refused every address
    CONNECTION = "connection"  # reset, closed early, unreachable, malformed answer
    INVALID_URL = "invalid_url"  # not an absolute http(s) URL


class AddressRefusedError(OSError):
    """Raised by the resolver and the socket factory for an address the policy refuses.

    The message is fixed: with several refused addresses aiohappyeyeballs re-raises the first
    error only when all messages are equal, which keeps the kind recognisable."""

    def __init__(self) -> None:
        super().__init__("address refused by the endpoint policy")


@attrs.frozen(kw_only=True)
class SenderLimits:
    global_concurrency: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    per_endpoint: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    connect_timeout_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    total_timeout_s: float = attrs.field(default=15.0, validator=attrs.validators.gt(0))
    max_response_bytes: int = attrs.field(default=4096, validator=attrs.validators.ge(0))


@attrs.frozen(kw_only=True)
class SendOutcome:
    """One attempt's result: ``delivered`` (a 2xx), else ``status`` + ``body`` (an HTTP
    failure) or ``error`` + ``detail`` (no answer). ``body`` is at most the configured number
    of bytes, decoded as UTF-8 with replacement; ``truncated`` says whether more followed."""

    delivered: bool
    duration_ms: int
    status: int | None = None
    body: str = ""
    truncated: bool = False
    error: TransportError | None = None
    detail: str = ""

    @property
    def kind(self) -> str:
        """One label for metrics: ``delivered``, ``http_<class>xx`` or the transport error."""
        if self.delivered:
            return "delivered"
        if self.status is not None:
            return f"http_{self.status // 100}xx"
        return (self.error or TransportError.CONNECTION).value


def webhook_url(url: str) -> URL | None:
    """``url`` parsed, if it is an absolute http(s) URL with a host; else ``None``."""
    try:
        target = URL(url)
        if target.scheme in {"http", "https"} and target.raw_host and target.port:
            return target
    except ValueError:
        pass
    return None


def endpoint_key(url: URL) -> str:
    """The endpoint a URL belongs to: ``scheme://host:port`` (the unit of concurrency and of
    circuit breaking)."""
    host = url.raw_host or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{url.scheme}://{host}:{url.port}"


class GuardedResolver(AbstractResolver):
    """Resolves with ``inner`` and keeps only the addresses the policy allows."""

    def __init__(self, inner: AbstractResolver, address_refused: AddressPolicy) -> None:
        self.inner = inner
        self.address_refused = address_refused

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        allowed = [r for r in results if not self.address_refused(_ip(r["host"]))]
        if not allowed:
            raise AddressRefusedError
        return allowed

    async def close(self) -> None:
        await self.inner.close()


def _ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone index


class _Slots:
    """Per-endpoint semaphores that exist only while someone holds or waits for them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.semaphores: dict[str, asyncio.Semaphore] = {}
        self.users: dict[str, int] = {}

    def enter(self, key: str) -> asyncio.Semaphore:
        self.users[key] = self.users.get(key, 0) + 1
        return self.semaphores.setdefault(key, asyncio.Semaphore(self.size))

    def leave(self, key: str) -> None:
        self.users[key] -= 1
        if not self.users[key]:
            del self.users[key], self.semaphores[key]


class WebhookSender:
    """POSTs signed bodies to webhook endpoints; see the module docstring for the rules.

    ``resolver`` defaults to aiohttp's; ``ssl_context`` to the system's verifying context.
    Use as an async context manager, or call :meth:`close` when done.
    """

    def __init__(self, limits: SenderLimits, *, address_refused: AddressPolicy,
                 resolver: AbstractResolver | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 user_agent: str = "Orbit-Webhooks/1") -> None:
        self.limits = limits
        self.address_refused = address_refused
        self._inner_resolver = resolver
        self._resolver: GuardedResolver | None = None
        self._ssl = ssl_context if ssl_context is not None else True
        self._user_agent = user_agent
        self._global = asyncio.Semaphore(limits.global_concurrency)
        self._endpoints = _Slots(limits.per_endpoint)
        self._session: aiohttp.ClientSession | None = None
        self.in_flight = 0  # requests on the wire now
        self.waiting = 0  # sends waiting for a slot

    async def __aenter__(self) -> WebhookSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Made here, not in __init__: aiohttp's resolvers need the running loop.
            self._resolver = GuardedResolver(self._inner_resolver or aiohttp.DefaultResolver(),
                                             self.address_refused)
            connector = aiohttp.TCPConnector(
                resolver=self._resolver, socket_factory=self._socket, ssl=self._ssl,
                limit=self.limits.global_concurrency, limit_per_host=self.limits.per_endpoint)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self.limits.total_timeout_s,
                                              sock_connect=self.limits.connect_timeout_s),
                headers={"User-Agent": self._user_agent}, auto_decompress=False)
        return self._session

    def _socket(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, address = addr_info
        if self.address_refused(_ip(address[0])):
            raise AddressRefusedError
        return socket.socket(family=family, type=type_, proto=proto)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._resolver is not None:
            await self._resolver.close()  # a connector does not close a resolver it was given
            self._resolver = None

    async def send(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   deadline: float | None = None) -> SendOutcome:
        """POST ``body`` (JSON) with ``headers`` to ``url``; never raises for network trouble.

        ``deadline`` (a ``time.monotonic()`` reading): the request ends by then at the latest,
        whatever the total timeout says -- the pump passes its lease's end, so a request is
        over before another pump may lease the delivery again. A deadline already passed
        when a slot frees up is a ``timeout`` outcome without a request."""
        target = webhook_url(url)
        if target is None:
            return SendOutcome(delivered=False, duration_ms=0, error=TransportError.INVALID_URL,
                               detail="not an absolute http(s) URL")
        key = endpoint_key(target)
        endpoint = self._endpoints.enter(key)
        self.waiting += 1
        waiting = True
        try:
            async with endpoint, self._global:
                self.waiting -= 1
                waiting = False
                total = self.limits.total_timeout_s
                if deadline is not None:
                    total = min(total, deadline - time.monotonic())
                    if total <= 0:
                        return SendOutcome(delivered=False, duration_ms=0,
                                           error=TransportError.TIMEOUT,
                                           detail="the lease ended before a slot was free")
                self.in_flight += 1
                try:
                    return await self._post(target, body, headers, total)
                finally:
                    self.in_flight -= 1
        finally:
            if waiting:
                self.waiting -= 1
            self._endpoints.leave(key)

    async def _post(self, url: URL, body: bytes, headers: Mapping[str, str],
                    total_s: float) -> SendOutcome:
        started = time.monotonic()

        def took() -> int:
            return round((time.monotonic() - started) * 1000)

        request_headers = {**headers, "Content-Type": "application/json"}
        try:
            timeout = aiohttp.ClientTimeout(
                total=total_s, sock_connect=min(self.limits.connect_timeout_s, total_s))
            async with self._client().post(url, data=body, headers=request_headers,
                                           allow_redirects=False, timeout=timeout) as response:
                text, truncated = await _read_bounded(response, self.limits.max_response_bytes)
                if truncated:
                    response.close()  # drop the connection instead of draining the rest
                delivered = 200 <= response.status < 300
                return SendOutcome(delivered=delivered, duration_ms=took(),
                                   status=response.status, body=text, truncated=truncated)
        except Exception as exc:  # every failure to get an answer becomes an outcome
            kind = classify(exc)
            if kind is None:
                raise
            return SendOutcome(delivered=False, duration_ms=took(), error=kind,
                               detail=_detail(exc))


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> tuple[str, bool]:
    """Up to ``limit`` bytes of the body (as text) and whether more followed."""
    data = bytearray()
    while len(data) < limit:
        chunk = await response.content.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    truncated = not response.content.at_eof()
    if truncated and len(data) >= limit:
        # at_eof() is false until a read returns b""; one more byte tells "more" from "exactly".
        truncated = bool(await response.content.read(1))
    return data.decode("utf-8", errors="replace"), truncated


def _detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def classify(exc: BaseException) -> TransportError | None:
    """The transport error kind of an exception raised by a request (``None``: not one)."""
    if isinstance(exc, TimeoutError):  # aiohttp's connect/read timeouts subclass it
        return TransportError.TIMEOUT
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        if isinstance(exc.os_error, AddressRefusedError):
            return TransportError.ADDRESS_REFUSED
        return TransportError.DNS
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return TransportError.TLS
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, AddressRefusedError):
            return TransportError.ADDRESS_REFUSED
        if isinstance(exc.os_error, ConnectionRefusedError) or (
                exc.os_error.errno == errno.ECONNREFUSED):
            return TransportError.REFUSED
        if isinstance(exc.os_error, ssl.SSLError):
            return TransportError.TLS
        return TransportError.CONNECTION
    if isinstance(exc, aiohttp.InvalidURL):
        return TransportError.INVALID_URL
    if isinstance(exc, aiohttp.ClientError | OSError):
        return TransportError.CONNECTION
    return None

"""Resource-exhaustion tests of a daemon (issue 11): a ``/healthz`` probe in its own process
whose slowest answer bounds how long the event loop was blocked, the process's RSS, and slow
clients that hold connections open by trickling a request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol, TypeVar

from tests.support.waiting import until


class _Stoppable(Protocol):
    def stop(self) -> None: ...


D = TypeVar("D", bound=_Stoppable)

# Issue 11: the probe must stay under 100 ms. The tests that assert it are marked ``alone``
# (script/test runs them with no other test beside them): the probe measures the daemon's event
# loop, not a neighbour's load on the machine's two cores.
PROBE_BOUND_S = 0.1
RSS_BOUND_KIB = 200 * 1024

# The probe loop, run in a process of its own: a thread of the test's process would share its
# interpreter lock with the test's event loop (the slow clients, the worst requests' answers)
# and time that too. It asks every 10 ms until its stdin closes and it has asked at least
# ``minimum`` times, then prints one JSON line.
_PROBE_SCRIPT = r"""
import http.client, json, sys, threading, time
host, port, minimum = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
halt = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), halt.set()), daemon=True).start()
latencies, failures = [], []
conn = http.client.HTTPConnection(host, port, timeout=10)
print("ready", flush=True)
while not halt.is_set() or len(latencies) < minimum:
    started = time.perf_counter()
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as exc:
        failures.append(repr(exc))
        conn.close()
        continue
    latencies.append(time.perf_counter() - started)
    if response.status != 200:
        failures.append(f"status {response.status}")
    halt.wait(0.01)
conn.close()
print(json.dumps({"latencies": latencies, "failures": failures}), flush=True)
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


class Probe:
    """``GET /healthz`` on one keep-alive connection, every 10 ms, timing each answer, from a
    process of its own. ``start()`` returns once it runs; ``stop()`` collects its timings (at
    least ``minimum`` probes: it waits for them). Use it through :func:`probed`."""

    def __init__(self, host: str, port: int, minimum: int = 21) -> None:
        self.host, self.port, self.minimum = host, port, minimum
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE_SCRIPT, self.host, str(self.port), str(self.minimum)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        assert self._proc.stdout.readline().strip() == "ready"

    def stop(self, timeout: float = 15) -> None:
        proc = self._proc
        assert proc is not None
        try:
            out, _ = proc.communicate(input="", timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        found = json.loads(out.strip().splitlines()[-1])
        self.latencies, self.failures = found["latencies"], found["failures"]

    @property
    def worst(self) -> float:
        return max(self.latencies)

    @property
    def p99(self) -> float:
        return sorted(self.latencies)[int(len(self.latencies) * 0.99)]

    def summary(self) -> str:
        return (f"healthz probes: {len(self.latencies)}, max {self.worst * 1000:.1f} ms, "
                f"p99 {self.p99 * 1000:.1f} ms")

    def assert_unblocked(self) -> None:
        """Every probe answered 200, and none waited as long as :data:`PROBE_BOUND_S`."""
        assert self.failures == []
        assert len(self.latencies) > 20
        assert self.worst < PROBE_BOUND_S, f"/healthz blocked for {self.worst:.3f} s"


class Crowd:
    """How many of the slow clients' connections are open now."""

    open = 0


async def _pause(halt: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1):  # the slow client's pace
            await halt.wait()


async def trickle_head(host: str, port: int, halt: asyncio.Event,
                       request_line: bytes = b"GET /healthz HTTP/1.1") -> int:
    """Holds a connection by sending a request head a line a second; reconnects when cut.
    Returns how often it was cut."""
    cuts = 0
    while not halt.is_set():
        with contextlib.suppress(ConnectionError):
            reader, writer = await asyncio.open_connection(host, port)
            Crowd.open += 1
            try:
                writer.write(request_line + b"\r\nHost: localhost\r\n")
                n = 0
                while not halt.is_set() and not reader.at_eof():
                    await _pause(halt)
                    writer.write(b"X-Slow-%d: 1\r\n" % n)
                    await writer.drain()
                    n += 1
            finally:
                Crowd.open -= 1
                writer.close()
            cuts += 1
    return cuts


async def trickle_body(host: str, port: int, head: bytes, piece: bytes,
                       halt: asyncio.Event) -> int:
    """Holds a connection by sending ``head`` (a request head and the body's first bytes), then
    ``piece`` a second; reconnects when cut. Returns how often it was cut."""
    cuts = 0
    while not halt.is_set():
        with contextlib.suppress(ConnectionError):
            reader, writer = await asyncio.open_connection(host, port)
            Crowd.open += 1
            try:
                writer.write(head)
                while not halt.is_set() and not reader.at_eof():
                    await _pause(halt)
                    writer.write(piece)
                    await writer.drain()
            finally:
                Crowd.open -= 1
                writer.close()
            cuts += 1
    return cuts


def post_head(path: str, content_length: int, headers: dict[str, str] | None = None) -> bytes:
    """The head of a JSON POST to ``path`` announcing ``content_length`` bytes."""
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", "Content-Type: application/json",
             f"Content-Length: {content_length}",
             *(f"{name}: {value}" for name, value in (headers or {}).items())]
    return "\r\n".join(lines).encode() + b"\r\n\r\n"


@contextlib.asynccontextmanager
async def probed(host: str, port: int, *, minimum: int = 21) -> AsyncIterator[Probe]:
    """A :class:`Probe` running for the body of the ``async with``; its timings are there after."""
    probe = Probe(host, port, minimum)
    await asyncio.to_thread(probe.start)
    try:
        yield probe
    finally:
        await asyncio.to_thread(probe.stop)


SLOW_HEADS = 100
SLOW_BODIES = 100


@contextlib.asynccontextmanager
async def under_attack(host: str, port: int, body_head: bytes, piece: bytes, *,
                       minimum: int = 21) -> AsyncIterator[Probe]:
    """The probe and a crowd of slow clients: :data:`SLOW_HEADS` trickling a request head and
    :data:`SLOW_BODIES` sending ``body_head`` then ``piece`` a second. Enters once every slow
    connection is open; on leaving, the crowd stops and the probe's timings are collected."""
    halt = asyncio.Event()
    async with probed(host, port, minimum=minimum) as probe:
        crowd = [asyncio.create_task(trickle_head(host, port, halt)) for _ in range(SLOW_HEADS)]
        crowd += [asyncio.create_task(trickle_body(host, port, body_head, piece, halt))
                  for _ in range(SLOW_BODIES)]
        try:
            await until(lambda: Crowd.open == SLOW_HEADS + SLOW_BODIES,
                        message="the slow clients' connections")
            yield probe
        finally:
            halt.set()
            await asyncio.gather(*crowd)


@contextlib.asynccontextmanager
async def running(daemon: D, ready: Callable[[], object]) -> AsyncIterator[D]:
    """``daemon`` once ``ready()`` (a blocking wait) returns; stopped at the end."""
    try:
        await asyncio.to_thread(ready)
        yield daemon
    finally:
        daemon.stop()

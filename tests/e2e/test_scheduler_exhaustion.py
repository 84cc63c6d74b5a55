"""Resource exhaustion of the scheduler daemon (issue 11): the scheduler's only listener is its
operator listener (``[service] metrics_host:metrics_port``: ``/healthz``, ``/readyz``,
``/metrics``), so its worst inputs are requests to that listener; they do not stall it, and the
schedules keep firing meanwhile.

A real ``orbit scheduler`` process with its default limits, firing five schedules due every
second, gets at the same time:

* 1 MiB bodies POSTed to ``/healthz`` and ``/metrics`` (refused 405: both are GET-only);
* request heads at the header-size limit: a 8190-byte URL and 127 header fields of 8190 bytes
  each (about 1 MiB of head, answered);
* repeated ``/metrics`` scrapes;
* 100 clients trickling a request head a line at a time and 100 trickling a 1 MiB body, each
  reconnecting when the server cuts it.

Meanwhile a probe on its own thread and connection asks ``/healthz`` on the operator listener
every 10 ms: its slowest answer bounds how long the event loop was blocked. The process's RSS is
read before and after, and the schedules' ledger must grow during the attack.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from orbit_common.db.pool import Database, DatabaseUrl
from tests.conftest import Tenant
from tests.integration.test_schedule_firing import make_schedule
from tests.support.exhaustion import (
    RSS_BOUND_KIB,
    SLOW_BODIES,
    SLOW_HEADS,
    Crowd,
    post_head,
    rss_kib,
    running,
    under_attack,
)
from tests.support.lease_fixtures import make_queue, scalar
from tests.support.processes import Daemon, http, wait_until
from tests.support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.alone]

MIB = 1024 * 1024
SCHEDULES = 5
ROUNDS = 3
FIELD_LIMIT = 8190  # the longest URL or header field value the HTTP parser accepts
HEADER_FIELDS = 127  # with Host, the HTTP parser's limit of 128 header fields


def large_head(path: str, *, over: int = 0) -> bytes:
    """A GET head whose URL (query string) and 127 header fields besides Host are each
    ``FIELD_LIMIT + over`` bytes long: about 1 MiB."""
    url = path + "?" + "a" * (FIELD_LIMIT + over - len(path) - 1)
    fields = "".join(f"X-Large-{n}: {'a' * (FIELD_LIMIT + over)}\r\n"
                     for n in range(HEADER_FIELDS))
    return f"GET {url} HTTP/1.1\r\nHost: localhost\r\n{fields}\r\n".encode()


async def raw_request(host: str, port: int, head: bytes) -> tuple[int, bytes]:
    """Send ``head`` on a new connection; the answer's status and body."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in {b"\r\n", b""}:
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await reader.readexactly(length)
    finally:
        writer.close()


@pytest.fixture
async def scheduler_process(db_url: DatabaseUrl, tmp_path: Path) -> AsyncIterator[Daemon]:
    daemon = Daemon(["scheduler"], db_url=db_url, log=tmp_path / "scheduler.log",
                    env={"ORBIT_SERVICE_LOG_LEVEL": "WARNING"})

    def up() -> bool:
        if daemon.proc.poll() is not None:
            raise AssertionError(f"scheduler exited:\n{daemon.output()}")
        return http("GET", f"{daemon.ops_url}/healthz", timeout=2)[0] == 200

    async with running(daemon, lambda: wait_until(up, timeout=20,
                                                  message="the scheduler's operator listener")):
        yield daemon


async def test_the_worst_requests_and_slow_clients_do_not_stall_the_scheduler(
    scheduler_process: Daemon, db: Database, tenant: Tenant,
) -> None:
    queue = await make_queue(db, tenant)
    for _ in range(SCHEDULES):
        await make_schedule(db, tenant, queue.id, rule={"interval_ms": 1000},
                            since=dt.timedelta(seconds=1))

    async def ledger() -> int:
        return int(await scalar(db, "SELECT COUNT(*) AS n FROM pulse_schedule_occurrences"
                                    " WHERE namespace_id = %s", tenant.namespace_id))

    host, port = "127.0.0.1", scheduler_process.ops_port
    pid = scheduler_process.proc.pid
    ops = scheduler_process.ops_url
    body = b" " * MIB
    posts = {"post-1mib-healthz": "/healthz", "post-1mib-metrics": "/metrics"}
    heads = {"head-at-limit-healthz": (large_head("/healthz"), 200),
             "head-at-limit-metrics": (large_head("/metrics"), 200),
             "head-over-limit": (large_head("/healthz", over=1), 400)}
    names = [*posts, *heads, "metrics-scrape"]
    assert all(MIB * 0.95 < len(head) < MIB * 1.05 for head, _ in heads.values())
    timings: dict[str, list[float]] = {name: [] for name in names}

    async def send(client: aiohttp.ClientSession, name: str) -> None:
        started = time.perf_counter()
        if name in heads:
            head, status = heads[name]
            code, answer = await raw_request(host, port, head)
        else:
            method, path, data = (("POST", posts[name], body) if name in posts
                                  else ("GET", "/metrics", None))
            status = 405 if name in posts else 200  # /healthz and /metrics are GET-only
            async with client.request(method, ops + path, data=data) as response:
                code, answer = response.status, await response.read()
        timings[name].append(time.perf_counter() - started)
        assert code == status, (name, answer[:500])

    async with aiohttp.ClientSession() as client:
        await until(ledger, message="the first occurrence")  # the scheduler is firing
        for name in names:  # warm up every route once, so the baseline holds them
            await send(client, name)
        rss_before = rss_kib(pid)

        async with under_attack(host, port, post_head("/healthz", MIB), b" " * 100) as probe:
            fired_before = await ledger()
            for _ in range(ROUNDS):
                for name in names:
                    await send(client, name)
                for _ in range(10):
                    await send(client, "metrics-scrape")
            # Two seconds' occurrences of every schedule, fired while the crowd holds on.
            fired_during = await until(
                lambda: _grown(ledger, fired_before + 2 * SCHEDULES), timeout=20,
                message="the schedules to keep firing")
            assert Crowd.open == SLOW_HEADS + SLOW_BODIES
        rss_after = rss_kib(pid)

    print(f"\nslow connections held: {SLOW_HEADS + SLOW_BODIES}; {probe.summary()}; "
          f"RSS {rss_before // 1024} -> {rss_after // 1024} MiB; "
          f"occurrences fired during the attack: {fired_during - fired_before}; "
          + "; ".join(f"{name} {max(t) * 1000:.0f} ms" for name, t in timings.items()))
    probe.assert_unblocked()
    assert rss_after - rss_before < RSS_BOUND_KIB, (rss_before, rss_after)
    assert "Traceback" not in scheduler_process.output()


async def _grown(count: Callable[[], Awaitable[int]], at_least: int) -> int | None:
    now = await count()
    return now if now >= at_least else None

"""Resource exhaustion of the dispatcher daemon (issue 11): the worst frames it accepts and a
crowd of slow clients on its worker port do not stall it for everyone.

A real ``orbit dispatcher`` process with its default limits gets, at the same time:

* from one registered worker session's WebSocket, the largest frames it reads (1 MiB, the
  default ``[dispatcher].max_message_bytes``) of the content that costs it most
  (``worker_calls.worst_frames``): 1 MiB of ``[`` and 1 MiB of tiny batch items, each refused,
  three rounds, then a finish whose result at the limit holds the most arrays a message may and
  exact decimals after them, which is stored;
* 100 clients trickling a request head a line at a time and 100 trickling a 1 MiB ``renew``
  body, each reconnecting when the server cuts it.

Meanwhile a probe on its own thread and connection asks ``/healthz`` on the same (public) port
every 10 ms: its slowest answer bounds how long the event loop was blocked. The process's RSS is
read before and after.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from orbit_common.db.pool import Database, DatabaseUrl
from tests.conftest import Tenant
from tests.support.exhaustion import (
    RSS_BOUND_KIB,
    SLOW_BODIES,
    SLOW_HEADS,
    post_head,
    rss_kib,
    running,
    under_attack,
)
from tests.support.lease_fixtures import task_row
from tests.support.stack import DispatcherDaemon
from tests.support.worker_calls import MIB, next_frame, running_attempt, worst_frames

pytestmark = [pytest.mark.slow, pytest.mark.alone]

ROUNDS = 3
# Waiting for the answer to a 1 MiB frame: a second of CPU or so, which two shared cores can
# stretch far past the usual 10 s.
LARGE_S = 60


@pytest.fixture
async def dispatcher_process(db_url: DatabaseUrl,
                             tmp_path: Path) -> AsyncIterator[DispatcherDaemon]:
    daemon = DispatcherDaemon(db_url=db_url, log=tmp_path / "dispatcher.log",
                              env={"ORBIT_SERVICE_LOG_LEVEL": "WARNING"})
    async with running(daemon, daemon.wait_listening):
        yield daemon


async def test_the_worst_frames_and_slow_clients_do_not_stall_healthz(
    dispatcher_process: DispatcherDaemon, db: Database, tenant: Tenant,
) -> None:
    host, port = "127.0.0.1", dispatcher_process.port
    pid = dispatcher_process.proc.pid
    async with aiohttp.ClientSession(base_url=dispatcher_process.url) as client:
        url, (task_id,), (ref,) = await running_attempt(client, db, tenant)
        frames, worst_result = worst_frames(ref)
        renew_head = post_head(f"{url}/renew", MIB, tenant.auth) + b'{"items": ['
        async with client.ws_connect(f"{url}/ws", headers=tenant.auth, max_msg_size=0) as ws:
            # Warm up: one refused frame, so the baseline holds the first allocations.
            await ws.send_str(frames[0])
            assert (await next_frame(ws, "error", timeout=LARGE_S))["code"] == "json_too_complex"
            rss_before = rss_kib(pid)

            # The frames may take under a second on a quiet machine: probe on a while.
            async with under_attack(host, port, renew_head, b" " * 100,
                                    minimum=100) as probe:
                refused: list[str] = []
                for _ in range(ROUNDS):
                    for frame in frames[:2]:
                        await ws.send_str(frame)
                        refused.append((await next_frame(ws, "error", timeout=LARGE_S))["code"])
                began = time.perf_counter()
                await ws.send_str(frames[2])
                reply = await next_frame(ws, "reply", timeout=LARGE_S)
                finish_s = time.perf_counter() - began
            rss_after = rss_kib(pid)

    print(f"\nslow connections held: {SLOW_HEADS + SLOW_BODIES}; {probe.summary()}; "
          f"RSS {rss_before // 1024} -> {rss_after // 1024} MiB; "
          f"the worst finish answered in {finish_s * 1000:.0f} ms")
    assert set(refused) <= {"malformed_json", "json_too_complex"}, refused
    assert len(refused) == 2 * ROUNDS
    assert reply["items"][0]["accepted"] is True, reply
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "SUCCEEDED"
    assert len(row["result"]) == len(worst_result)
    probe.assert_unblocked()
    assert rss_after - rss_before < RSS_BOUND_KIB, (rss_before, rss_after)
    assert "Traceback" not in dispatcher_process.output()

"""The signal phase of ``orbit bench workflows --waits`` (bench/waits.py): signal acceptance
against task submission, and signal accepted → step advanced (issue 15, "Performance").

One fresh database with its API and dispatcher (bench/tasks.py's ``_Phase``), a definition whose
instances wait at a SIGNAL step (``wait`` → ``done``):

1. **instances** -- N instances started (domain layer, no engine yet: they wait at their root).
2. **submit** -- N single no-op tasks through ``POST …/tasks``, one task a request, CLIENTS
   concurrent clients, each with an ``Idempotency-Key``: ``submit_per_s``.
3. **accept** -- one signal to each of the N instances through ``POST …/workflows/{id}/signals``
   the same way: ``signal_per_s``; ``signal_ratio`` = ``signal_per_s / submit_per_s``
   (target ≥ 0.8).
4. **advance** -- an engine (``orbit weave``) starts; it takes the N instances to their wait, and
   each wait consumes its signal at once (sent before the wait existed). Then N/2 more
   instances are started and brought to their wait, and one signal each is sent at half of
   ``signal_per_s``: ``signal_advance_p50_ms`` / ``_p99_ms`` are, per signal, the SIGNAL step's
   end (``weave_steps.updated_at``) minus the signal's ``accepted_at`` (database time; target
   p99 < 100 ms). ``signals_consumed`` must equal the signals sent, ``signal_duplicates``
   (waits with another winner count, signals consumed twice) must be 0.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import free_port, percentile, poll_until, wait_ready
from bench.tasks import _Phase
from orbit_common.db.pool import DatabaseUrl, connect_sync, open_database
from orbit_common.platform import credentials
from orbit_common.weave import definitions, instances

CLIENTS = 16
STARTERS = 4
DOCUMENT = {"format": "orbit.weave/1", "start": "wait", "steps": {
    "wait": {"kind": "SIGNAL", "signal": "go", "next": "done"},
    "done": {"kind": "SUCCEED"}}}


async def _define_and_start(url: DatabaseUrl, api_key: str, namespace: str, count: int,
                            first: bool) -> list[str]:
    db = await open_database(url, minsize=1, maxsize=STARTERS)
    try:
        who = await db.read("bench.auth", lambda cur: credentials.authenticate(cur, api_key))
        if first:
            await definitions.create_definition(db, who, namespace=namespace, name="waiting")
            await definitions.publish_version(db, who, namespace=namespace, name="waiting",
                                              revision=1, document=json.dumps(DOCUMENT).encode())
        started: list[str] = []
        numbers = iter(range(count))

        async def starter() -> None:
            for n in numbers:
                receipt = await instances.start_instance(
                    db, who, namespace=namespace, definition="waiting",
                    input_json=b'{"n": %d}' % n)
                started.append(receipt.body["id"])

        await asyncio.gather(*(starter() for _ in range(STARTERS)))
        return started
    finally:
        await db.close()


async def _post_each(urls_and_bodies: list[tuple[str, dict[str, Any]]], key: str,
                     rate: float | None = None) -> float:
    """POST each body, CLIENTS at once (or paced at ``rate`` per second); returns posts/s."""
    work = iter(enumerate(urls_and_bodies))
    began = time.perf_counter()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def client() -> None:
            for n, (url, body) in work:
                if rate is not None:
                    await asyncio.sleep(max(0.0, began + n / rate - time.perf_counter()))
                async with session.post(url, json=body, headers={
                        "Idempotency-Key": secrets.token_hex(8)}) as response:
                    if response.status != 201:
                        raise RuntimeError(await response.text())

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return len(urls_and_bodies) / (time.perf_counter() - began)


def _count(conn: Any, sql: str) -> int:
    with conn.cursor() as cur:
        cur.execute(sql)
        return int(cur.fetchone()[0])


def _lags(conn: Any, since_ids: list[str]) -> list[float]:
    wanted = set(since_ids)
    with conn.cursor() as cur:
        cur.execute("SELECT g.instance_id, TIMESTAMPDIFF(MICROSECOND, g.accepted_at,"
                    " s.updated_at) FROM weave_signals g JOIN weave_steps s"
                    " ON s.namespace_id = g.namespace_id AND s.instance_id = g.instance_id"
                    " AND s.name = 'wait' WHERE g.state = 'CONSUMED'")
        return [us / 1000 for instance_id, us in cur.fetchall()
                if instance_id.hex() in wanted]


def measure(server: DatabaseUrl, logs: Path, db_pid: int | None, count: int) -> dict[str, Any]:
    """The four phases on a fresh database of ``server``."""
    phase = _Phase(server, 1, logs, db_pid)
    try:
        key, namespace = phase.tenants[0]
        base = f"{phase.api}/v1/namespaces/{namespace}"
        waiting = asyncio.run(_define_and_start(phase.url, key, namespace, count, True))
        submit_per_s = asyncio.run(_post_each(
            [(f"{base}/tasks", {"queue": "bench", "handler": "noop", "input": {}})
             for _ in range(count)], key))
        signal_per_s = asyncio.run(_post_each(
            [(f"{base}/workflows/{i}/signals", {"name": "go", "payload_version": 1})
             for i in waiting], key))
        ops = free_port()
        phase._spawn("engine", [sys.executable, "-m", "orbit_cli", "weave"], {
            "ORBIT_SERVICE_METRICS_PORT": str(ops), "ORBIT_SERVICE_LOG_LEVEL": "WARNING"})
        wait_ready(f"http://127.0.0.1:{ops}/readyz")
        conn = connect_sync(phase.url, autocommit=True)
        try:
            poll_until(lambda: _count(conn, "SELECT COUNT(*) FROM weave_instances"
                                            " WHERE state = 'SUCCEEDED'"),
                       lambda n: n >= count, "the first instances to consume their signals")
            later = asyncio.run(_define_and_start(phase.url, key, namespace,
                                                  max(1, count // 2), False))
            poll_until(lambda: _count(conn, "SELECT COUNT(*) FROM weave_steps WHERE"
                                            " name = 'wait' AND state = 'WAITING'"),
                       lambda n: n >= len(later), "the later instances to wait")
            asyncio.run(_post_each(
                [(f"{base}/workflows/{i}/signals", {"name": "go", "payload_version": 1})
                 for i in later], key, rate=signal_per_s / 2))
            total = count + len(later)
            poll_until(lambda: _count(conn, "SELECT COUNT(*) FROM weave_instances"
                                            " WHERE state = 'SUCCEEDED'"),
                       lambda n: n >= total, "every instance to consume its signal")
            lags = _lags(conn, later)
            consumed = _count(conn, "SELECT COUNT(*) FROM weave_signals"
                                    " WHERE state = 'CONSUMED'")
            duplicates = _count(
                conn, "SELECT COUNT(*) FROM (SELECT wait_id FROM weave_signals"
                      " WHERE state = 'CONSUMED' GROUP BY wait_id HAVING COUNT(*) > 1) x")
        finally:
            conn.close()
    finally:
        phase.close()
    return {
        "instances": count, "clients": CLIENTS,
        "submit_per_s": round(submit_per_s, 1), "signal_per_s": round(signal_per_s, 1),
        "signal_ratio": round(signal_per_s / submit_per_s, 3),
        "signal_rate_for_latency": round(signal_per_s / 2, 1),
        "signal_advance_p50_ms": round(percentile(lags, 0.5), 1),
        "signal_advance_p99_ms": round(percentile(lags, 0.99), 1),
        "signals_consumed": consumed, "signals_sent": count + len(later),
        "signal_duplicates": duplicates,
    }

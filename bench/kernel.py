"""Foundation benchmark: the cost of the transaction runner and of the API's hot paths.

Every figure is measured in the same run against the same server, with a raw-driver baseline,
because these machines are noisy; compare ratios, not absolute numbers across runs.

* ``raw_tx_per_s``: a bare aiomysql loop -- START TRANSACTION, INSERT one event row, COMMIT.
* ``runner_tx_per_s``: the same INSERT through ``Database.transaction`` (retry rules, metrics,
  session isolation); ``runner_overhead_ratio`` = runner / raw.
* ``api_whoami_per_s``: authenticated ``GET /v1/whoami`` over HTTP (two read transactions).
* ``api_create_per_s``: ``POST /v1/namespaces`` with an Idempotency-Key (authorization,
  idempotency record, namespace, event and audit row in one transaction).
* ``api_replay_per_s``: the same POSTs replayed (answered from the idempotency record).

Usage: ``python -m bench.kernel [--seconds 5] [--concurrency 16]``; uses ``ORBIT_DATABASE_URL``
(a server; a scratch database is created and dropped) or starts a private instance. The last
line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import orbit_devdb as devdb
from orbit_api.app import create_app
from orbit_common.db.migrator import Migrator
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.db.schema import SchemaChecker
from orbit_common.model import ids
from orbit_common.platform import commands
from orbit_common.platform.audit import Actor
from orbit_common.service.config import ApiConfig, DatabaseConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate

INSERT_EVENT = (
    "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
    " aggregate_revision, event_type, payload, occurred_at)"
    " VALUES (%s, %s, 'bench', %s, 1, 'bench.tick', '{}', UTC_TIMESTAMP(6))"
)
NAMESPACE = bytes(16)


async def measure(concurrency: int, seconds: float,
                  op: Callable[[int, int], Awaitable[None]]) -> float:
    """Operations per second of ``op(worker, i)`` run by ``concurrency`` workers."""
    deadline = time.perf_counter() + seconds
    counts = [0] * concurrency

    async def worker(w: int) -> None:
        while time.perf_counter() < deadline:
            await op(w, counts[w])
            counts[w] += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return sum(counts) / (time.perf_counter() - started)


async def run(url: DatabaseUrl, seconds: float, concurrency: int) -> dict[str, Any]:
    db = await open_database(url, minsize=concurrency, maxsize=concurrency)
    results: dict[str, Any] = {}
    try:
        async def raw(_w: int, _i: int) -> None:
            conn = await db.pool.acquire()
            try:
                async with conn.cursor() as cur:
                    await cur.execute("START TRANSACTION")
                    await cur.execute(INSERT_EVENT, (NAMESPACE, ids.new_id(), ids.new_id()))
                await conn.commit()
            finally:
                db.pool.release(conn)

        async def runner(_w: int, _i: int) -> None:
            event_id, aggregate_id = ids.new_id(), ids.new_id()

            async def body(cur: Any) -> None:
                await cur.execute(INSERT_EVENT, (NAMESPACE, event_id, aggregate_id))

            await db.transaction("bench.insert", body)

        await measure(concurrency, 1, raw)  # warm-up
        results["raw_tx_per_s"] = round(await measure(concurrency, seconds, raw), 1)
        results["runner_tx_per_s"] = round(await measure(concurrency, seconds, runner), 1)
        results["runner_overhead_ratio"] = round(
            results["runner_tx_per_s"] / results["raw_tx_per_s"], 3
        )
        results.update(await run_api(db, url, seconds, concurrency))
    finally:
        await db.close()
    return results


async def run_api(db: Database, url: DatabaseUrl, seconds: float,
                  concurrency: int) -> dict[str, Any]:
    boot = await commands.bootstrap(db, application=f"bench-{secrets.token_hex(4)}",
                                    namespace=f"bench-{secrets.token_hex(4)}",
                                    credential="bench", actor=Actor.operator("bench"))
    auth = {"Authorization": f"Bearer {boot.issued.api_key}"}
    config = OrbitConfig(database=DatabaseConfig(url=url.render(hide_password=False)),
                         api=ApiConfig())
    app = create_app(config, db, ReadinessGate(SchemaChecker(db)))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {}
    prefix = secrets.token_hex(3)
    created: list[int] = [0] * concurrency
    try:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def whoami(_w: int, _i: int) -> None:
                async with session.get(f"{base}/v1/whoami", headers=auth) as response:
                    assert response.status == 200
                    await response.read()

            async def create(w: int, i: int) -> None:
                name = f"b{prefix}-{w}-{i}"
                headers = {**auth, "Idempotency-Key": name}
                async with session.post(f"{base}/v1/namespaces", headers=headers,
                                        json={"name": name}) as response:
                    assert response.status == 201, await response.text()
                    await response.read()
                created[w] = i + 1

            async def replay(w: int, i: int) -> None:
                j = i % max(created[w], 1)
                name = f"b{prefix}-{w}-{j}"
                headers = {**auth, "Idempotency-Key": name}
                async with session.post(f"{base}/v1/namespaces", headers=headers,
                                        json={"name": name}) as response:
                    assert response.status == 201, await response.text()
                    await response.read()

            await measure(concurrency, 1, whoami)  # warm-up
            results["api_whoami_per_s"] = round(await measure(concurrency, seconds, whoami), 1)
            results["api_create_per_s"] = round(await measure(concurrency, seconds, create), 1)
            results["api_replay_per_s"] = round(await measure(concurrency, seconds, replay), 1)
    finally:
        await runner.cleanup()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    server = os.environ.get("ORBIT_DATABASE_URL")
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if server:
        base = DatabaseUrl.parse(server)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="orbit-bench-")
        base = DatabaseUrl.parse(devdb.start(Path(tmp.name)).url())
    name = f"orbit_bench_{secrets.token_hex(4)}"
    admin = connect_sync(base.with_database(""), autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {devdb.database_identifier(name)}")
        url = base.with_database(name)
        Migrator(url).up(log=lambda _m: None)
        with admin.cursor() as cur:
            cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin")
            version, flush, log_bin = cur.fetchone()
        results = asyncio.run(run(url, args.seconds, args.concurrency))
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {devdb.database_identifier(name)}")
        admin.close()
        if tmp is not None:
            devdb.stop(Path(tmp.name))
            tmp.cleanup()
    results |= {
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "server": version,
        "flush_log_at_trx_commit": int(flush),
        "log_bin": int(log_bin),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()

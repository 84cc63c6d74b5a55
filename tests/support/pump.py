"""The delivery pump as a real process, subscriptions made through the real commands, and a real
webhook receiver -- examples/result-inbox's, on a loopback port, with hooks to count concurrent
deliveries per id, lose an acknowledgement after the commit, or stop listening for a while."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.model.endpoints import EndpointPolicy
from orbit_common.model.sealing import Sealer, new_key_text
from orbit_common.platform import credentials
from orbit_common.relay import model, subscriptions
from orbit_common.relay.model import RelaySettings
from tests.support import database
from tests.support.processes import Daemon, http, wait_until
from tests.support.stack import Stack

# The example is an independent module, not a package of this repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "result-inbox"))

from result_inbox import database as inbox_database
from result_inbox.receiver import PATH, create_app


class PumpDaemon(Daemon):
    """``orbit delivery`` with fast loops (poll, recovery, gauges) for tests."""

    def __init__(self, stack: Stack, key: str, log: Path, **settings: str) -> None:
        env = {
            "ORBIT_DELIVERY_SECRET_KEY": key,
            "ORBIT_DELIVERY_ALLOW_HTTP": "true",
            "ORBIT_DELIVERY_ALLOW_LOOPBACK": "true",
            "ORBIT_DELIVERY_POLL_MAX_MS": "50",
            "ORBIT_DELIVERY_RECOVERY_INTERVAL_S": "0.2",
            "ORBIT_DELIVERY_GAUGE_INTERVAL_S": "0.2",
            "ORBIT_DELIVERY_CONNECT_TIMEOUT_S": "1",
            "ORBIT_DELIVERY_TIMEOUT_S": "3",
            "ORBIT_DELIVERY_RELEASE_DELAY_MS": "0",
            "ORBIT_SERVICE_DRAIN_TIMEOUT_S": "8",
        }
        env.update({f"ORBIT_DELIVERY_{k.upper()}": v for k, v in settings.items()})
        super().__init__(["delivery"], db_url=stack.daemon_url, log=log, env=env)

    def wait_ready(self, timeout: float = 20) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the pump exited {self.proc.returncode}:\n"
                                     f"{self.output()}")
            return http("GET", f"{self.ops_url}/readyz", timeout=2)[0] == 200

        wait_until(up, timeout=timeout, message="the pump to be ready")

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the pump's /metrics (None: not exported)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.ops_url}/metrics", timeout=5) as response:  # noqa: S310
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None


class Relay:
    """Subscriptions of a stack's tenant, made with the domain commands (the HTTP routes are
    another part of the issue), sealed with ``key``."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.key = new_key_text()
        self.settings = RelaySettings(sealer=Sealer.from_config(self.key),
                                      policy=EndpointPolicy(allow_http=True, allow_loopback=True))

    def subscribe(self, name: str, **fields: Any) -> str | None:
        """Create a subscription; returns its signing secret (webhooks)."""

        async def run() -> str | None:
            db = await open_database(self.stack.url, minsize=1, maxsize=2)
            try:
                who = await db.read("test.auth", lambda cur: credentials.authenticate(
                    cur, self.stack.api_key))
                spec = model.parse_create({"name": name, **fields}, self.settings.policy)
                created = await subscriptions.create_subscription(
                    db, who, self.settings, namespace=self.stack.namespace, spec=spec)
                return created.secret
            finally:
                await db.close()

        return asyncio.run(run())

    def namespace_id(self) -> bytes:
        with self.stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM orbit_namespaces WHERE name = %s",
                        (self.stack.namespace,))
            return bytes(cur.fetchone()[0])

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.stack.sql() as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def subscription(self, name: str) -> dict[str, Any]:
        with self.stack.sql() as conn, conn.cursor(dictionary_cursor()) as cur:
            cur.execute("SELECT s.* FROM orbit_subscriptions s JOIN orbit_namespaces n"
                        " ON n.id = s.namespace_id WHERE n.name = %s AND s.name = %s",
                        (self.stack.namespace, name))
            return dict(cur.fetchone())

    def deliveries(self, name: str) -> list[dict[str, Any]]:
        with self.stack.sql() as conn, conn.cursor(dictionary_cursor()) as cur:
            cur.execute("SELECT d.* FROM orbit_deliveries d JOIN orbit_subscriptions s"
                        " ON s.namespace_id = d.namespace_id AND s.id = d.subscription_id"
                        " JOIN orbit_namespaces n ON n.id = s.namespace_id"
                        " WHERE n.name = %s AND s.name = %s ORDER BY d.sequence",
                        (self.stack.namespace, name))
            return [dict(r) for r in cur.fetchall()]

    def result_events(self) -> list[dict[str, Any]]:
        with self.stack.sql() as conn, conn.cursor(dictionary_cursor()) as cur:
            cur.execute("SELECT r.* FROM orbit_result_events r JOIN orbit_namespaces n"
                        " ON n.id = r.namespace_id WHERE n.name = %s ORDER BY r.sequence",
                        (self.stack.namespace,))
            return [dict(r) for r in cur.fetchall()]


def dictionary_cursor() -> Any:
    import pymysql.cursors

    return pymysql.cursors.DictCursor


def cancel_all(stack: Stack, task_ids: list[str]) -> None:
    """End each task CANCELLED through the API: one result event each."""
    for task_id in task_ids:
        status, body = stack.api_call("POST", f"/tasks/{task_id}/cancel", {"reason": "test"})
        assert status == 200, body


class InboxReceiver:
    """examples/result-inbox's webhook receiver on ``127.0.0.1:port`` in a thread of its own
    (its own event loop), applying into its own scratch database.

    Bookkeeping per ``webhook-id``: requests, the most in flight at once, and the answers.
    With ``lose_first`` every delivery's first answer is lost after the receiver committed (the
    connection is closed instead of answering); ``lost`` collects those ids. :meth:`stop` stops
    listening (connections are refused) and :meth:`start` listens again on the same port."""

    def __init__(self, server: DatabaseUrl, port: int, secret: str, *,
                 work_s: float = 0.0) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}{PATH}"
        self.secret = secret
        self.work_s = work_s  # the receiver's own processing time per request
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.active: Counter[str] = Counter()
        self.max_active: Counter[str] = Counter()
        self.outcomes: list[tuple[str, int, str | None]] = []
        self.lose_first = False
        self.lost: set[str] = set()
        self.db_name = database.scratch_name("inbox")
        self.server = server
        self.db_url = database.create_database(server, self.db_name, migrate=False).render(
            hide_password=False)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool: Any = None
        self.runner: web.AppRunner | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self) -> None:
        self._run(self._start())

    def stop(self) -> None:
        self._run(self._stop())

    async def _start(self) -> None:
        if self.pool is None:
            await inbox_database.init_db(self.db_url)
            self.pool = await inbox_database.open_pool(self.db_url)
        app = create_app(self.pool, [self.secret])
        app.middlewares.append(self._track)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def _stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        delivery_id = request.headers.get("webhook-id", "")
        with self.lock:
            self.requests[delivery_id] += 1
            first = self.requests[delivery_id] == 1
            self.active[delivery_id] += 1
            self.max_active[delivery_id] = max(self.max_active[delivery_id],
                                               self.active[delivery_id])
        try:
            if self.work_s:
                await asyncio.sleep(self.work_s)
            response = await handler(request)
        finally:
            with self.lock:
                self.active[delivery_id] -= 1
        outcome = None
        if isinstance(response, web.Response) and response.status == 200 and response.body:
            outcome = json.loads(bytes(response.body)).get("outcome")
        with self.lock:
            self.outcomes.append((delivery_id, response.status, outcome))
        if first and self.lose_first and response.status == 200:
            self.lost.add(delivery_id)
            assert request.transport is not None
            request.transport.close()  # committed, but the 2xx never reaches the pump
        return response

    def inbox(self) -> dict[str, tuple[int, str]]:
        """event_id (hex) -> (task_revision, outcome) of every applied delivery."""

        async def read() -> dict[str, tuple[int, str]]:
            async with self.pool.acquire() as conn, conn.cursor() as cur:
                await conn.commit()
                await cur.execute("SELECT event_id, task_revision, outcome FROM receiver_inbox")
                rows = await cur.fetchall()
                await conn.commit()
            return {r[0]: (r[1], r[2]) for r in rows}

        return dict(self._run(read()))

    def close(self) -> None:
        async def shutdown() -> None:
            await self._stop()
            if self.pool is not None:
                self.pool.close()
                await self.pool.wait_closed()

        try:
            self._run(shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            database.drop_database(self.server, self.db_name)

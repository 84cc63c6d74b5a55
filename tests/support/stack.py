"""A real Orbit stack for end-to-end and fault tests: a fresh database, the API and N
dispatchers as subprocesses, plus helpers to submit work and wait for outcomes."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pymysql

import orbit_devdb as devdb
from orbit_common.db.pool import DatabaseUrl, connect_sync
from tests.support import database
from tests.support.processes import Daemon, free_port, http, wait_until


class DispatcherDaemon(Daemon):
    def __init__(self, *, db_url: DatabaseUrl, log: Path, port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["dispatcher"], db_url=db_url, log=log, env={
            "ORBIT_DISPATCHER_PORT": str(self.port),
            "ORBIT_DISPATCHER_RECOVERY_INTERVAL_S": "0.3",
            "ORBIT_DISPATCHER_GAUGE_INTERVAL_S": "0.5",
            "ORBIT_SERVICE_DRAIN_TIMEOUT_S": "5",
            **(env or {}),
        })

    def wait_listening(self, timeout: float = 20) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"dispatcher exited {self.proc.returncode}:\n"
                                     f"{self.output()}")
            return http("GET", f"{self.url}/readyz", timeout=2)[0] == 200

        wait_until(up, timeout=timeout, message="the dispatcher to be ready")


class Stack:
    """API + dispatchers on a fresh, migrated database with a bootstrapped tenant.

    ``url`` is the administrator's (tests' assertions, migrations); the bootstrap and the
    daemons use ``daemon_url``: the same, or with ``runtime_user`` a least-privileged user
    made for this stack (orbit_devdb.grant_runtime: rows only), as the dev stack runs them."""

    def __init__(self, tmp: Path, *, dispatchers: int = 1,
                 server: DatabaseUrl | None = None, runtime_user: bool = False,
                 api_env: dict[str, str] | None = None) -> None:
        from tests.support.processes import ApiDaemon

        self.tmp = tmp
        self.server = server or database.server_url()
        self.db_name = database.scratch_name("orbit_stack")
        self.url = database.create_database(self.server, self.db_name)
        self.runtime_user: str | None = None
        self.daemon_url = self.url
        if runtime_user:
            self.runtime_user = f"rt_{secrets.token_hex(6)}"
            password = secrets.token_urlsafe(18)
            conn = database.admin_connection(self.server)
            try:
                devdb.grant_runtime(conn, self.db_name, self.runtime_user, password)
            finally:
                conn.close()
            self.daemon_url = attrs.evolve(self.url, user=self.runtime_user, password=password,
                                           host="127.0.0.1", unix_socket=None)
        boot = subprocess.run(
            [sys.executable, "-m", "orbit_cli", "admin", "bootstrap", "--application",
             "stack", "--namespace", "stack"],
            env={**os.environ,
                 "ORBIT_DATABASE_URL": self.daemon_url.render(hide_password=False)},
            capture_output=True, text=True, check=True)
        doc = json.loads(boot.stdout)
        self.api_key = doc["api_key"]
        self.namespace = doc["namespace"]
        self.auth = {"Authorization": f"Bearer {self.api_key}"}
        self.api = ApiDaemon(db_url=self.daemon_url, log=tmp / "api.log", env=api_env)
        self.dispatchers = [DispatcherDaemon(db_url=self.daemon_url,
                                             log=tmp / f"dispatcher-{i}.log")
                            for i in range(dispatchers)]
        self.api.wait_listening()
        for d in self.dispatchers:
            d.wait_listening()
        self.workers: list[subprocess.Popen[Any]] = []

    # --- HTTP helpers -------------------------------------------------------------------------

    def api_call(self, method: str, path: str, body: Any = None,
                 headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return http(method, f"{self.api.url}/v1/namespaces/{self.namespace}{path}",
                    headers={**self.auth, **(headers or {})}, body=body, timeout=30)

    def create_queue(self, name: str, **settings: Any) -> None:
        status, body = self.api_call("POST", "/queues", {"name": name, **settings})
        assert status == 201, body

    def submit(self, queue: str, handler: str, inputs: list[Any], **fields: Any) -> list[str]:
        ids: list[str] = []
        for start in range(0, len(inputs), 500):
            chunk = inputs[start:start + 500]
            status, body = self.api_call("POST", "/tasks/batch", {"tasks": [
                {"queue": queue, "handler": handler, "input": item, **fields}
                for item in chunk]})
            assert status in (200, 201), body
            ids.extend(item["id"] for item in body["tasks"])
        return ids

    # --- database helpers ---------------------------------------------------------------------

    @contextmanager
    def sql(self) -> Iterator[pymysql.connections.Connection[Any]]:
        conn = connect_sync(self.url, autocommit=True)
        try:
            yield conn
        finally:
            conn.close()

    def states(self) -> dict[str, int]:
        with self.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT state, COUNT(*) FROM pulse_tasks GROUP BY state")
            return dict(cur.fetchall())

    def wait_settled(self, total: int, timeout: float,
                     settled: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED",
                                                          "NEEDS_REVIEW"})) -> dict[str, int]:
        def done() -> dict[str, int] | None:
            states = self.states()
            return states if sum(states.get(s, 0) for s in settled) >= total else None

        return wait_until(done, timeout=timeout, interval=0.2,
                          message=f"{total} tasks to settle (when the wait began:"
                                  f" {self.states()})")

    # --- workers ------------------------------------------------------------------------------

    def start_worker(self, *args: str, log_name: str, env: dict[str, str] | None = None,
                     dispatcher: int = 0) -> subprocess.Popen[Any]:
        with (self.tmp / log_name).open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, *args],
                env={**os.environ, "ORBIT_API_URL": self.api.url,
                     "ORBIT_DISPATCHER_URL": self.dispatchers[dispatcher].url,
                     "ORBIT_API_KEY": self.api_key, "ORBIT_NAMESPACE": self.namespace,
                     **(env or {})},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.workers.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for daemon in [self.api, *self.dispatchers]:
            daemon.stop()
        with contextlib.suppress(pymysql.err.MySQLError):
            database.drop_database(self.server, self.db_name)
        if self.runtime_user is not None:
            with contextlib.suppress(pymysql.err.MySQLError):
                conn = database.admin_connection(self.server)
                try:
                    with conn.cursor() as cur:
                        for host in devdb.ACCOUNT_HOSTS:
                            # generated and checked by grant_runtime
                            cur.execute(f"DROP USER IF EXISTS '{self.runtime_user}'@'{host}'")
                finally:
                    conn.close()



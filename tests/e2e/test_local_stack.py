"""The local stack end to end: ``orbit dev up`` as a real process against a real database.

Covers what the README promises a newcomer: the stack migrates, bootstraps once (a 0600
``bootstrap.json`` with a working key), answers ``/readyz`` and ``/v1/whoami``, stops cleanly on
Ctrl-C (SIGINT), and keeps its state across a restart without bootstrapping a second time.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import orbit_devdb as devdb
from orbit_common.db import migrator
from tests.support import database
from tests.support.processes import wait_until

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
FOUNDATION_MIGRATIONS = {
    "0001_platform_identity",
    "0002_idempotency_keys",
    "0003_events_and_audit",
}


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - loopback http
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


class Stack:
    """One ``orbit dev up`` process with its output captured to a file."""

    def __init__(self, state: Path, port: int, env: dict[str, str], log: Path,
                 dispatcher_port: int, operator_port: int = 0, extra: tuple[str, ...] = ()
                 ) -> None:
        self.state = state
        self.api_url = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "orbit"), "dev", "up", "--dir", str(state), "--api-port", str(port),
                 "--dispatcher-port", str(dispatcher_port),
                 "--operator-port", str(operator_port), *extra],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until bootstrap.json exists and /readyz answers 200 (or the deadline passes)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"orbit dev up exited with {self.proc.returncode}:\n{self.output()}")
            if (self.state / "bootstrap.json").exists():
                try:
                    if _get(f"{self.api_url}/readyz")[0] == 200:
                        return
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
            time.sleep(0.1)
        pytest.fail(f"the stack was not ready within {timeout_s}s:\n{self.output()}")

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT, then the exit status (fails if it takes longer than 60 s)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"orbit dev up did not stop within {STOP_TIMEOUT_S}s:\n{self.output()}")

    def kill(self) -> None:
        """Last-resort cleanup of the whole process group (the stack and its daemons)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture
def stack_env() -> Iterator[dict[str, str]]:
    """Environment for the stack: a fresh, unmigrated database and no other ORBIT_ settings."""
    server = database.server_url()
    name = database.scratch_name("orbit_e2e_stack")
    url = database.create_database(server, name, migrate=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_DATABASE_URL"] = url.render(hide_password=False)
    try:
        yield env
    finally:
        database.drop_database(server, name)


@pytest.mark.slow
def test_dev_up_bootstraps_once_serves_and_survives_restart(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    state = tmp_path / "state"
    port, dispatcher_port = devdb.free_port(), devdb.free_port()

    operator_port = devdb.free_port()
    first = Stack(state, port, stack_env, tmp_path / "first.log", dispatcher_port,
                  operator_port)
    try:
        first.wait_ready()
        # Operator data only on the API's operator listener (--operator-port), not its port.
        assert _get(f"{first.api_url}/metrics")[0] == 404
        assert _get(f"{first.api_url}/readyz") == (200, {"ready": True})
        status, details = _get(f"http://127.0.0.1:{operator_port}/readyz")
        assert status == 200, details
        assert set(details["migrations"].values()) == {"applied"}
        bootstrap_file = state / "bootstrap.json"
        assert stat.S_IMODE(bootstrap_file.stat().st_mode) == 0o600
        original = bootstrap_file.read_bytes()
        doc = json.loads(original)
        assert doc["api_url"] == first.api_url
        assert doc["api_key"].startswith("orb_")
        assert doc["namespace"]

        status, whoami = _get(
            f"{first.api_url}/v1/whoami", {"Authorization": f"Bearer {doc['api_key']}"}
        )
        assert status == 200, whoami
        assert whoami["application"]["name"] == doc["application"]
        assert doc["namespace"] in whoami["namespaces"]
        # The console's URL and how to get in are printed at start-up.
        console_line = (f"console: {first.api_url}/console/  (first time: orbit admin console"
                        f" set-password --credential {doc['credential_prefix']}")
        wait_until(lambda: console_line in first.output(), timeout=30,
                   message="the console URL in the start-up output")
        with urllib.request.urlopen(f"{first.api_url}/console/login",  # noqa: S310 - loopback
                                    timeout=5) as page:
            assert page.status == 200
            assert "orbit_console_login=" in page.headers["Set-Cookie"]

        migrate = subprocess.run(
            [str(BIN / "orbit"), "migrate", "status", "--json"],
            env=stack_env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        listed = {e["id"]: e["status"] for e in json.loads(migrate.stdout)}
        assert set(listed) >= FOUNDATION_MIGRATIONS
        assert set(listed) == {f.id for f in migrator.discover()}
        assert set(listed.values()) == {"applied"}

        assert first.interrupt() == 0, first.output()
    finally:
        first.kill()

    second = Stack(state, port, stack_env, tmp_path / "second.log", dispatcher_port)
    try:
        second.wait_ready()
        assert bootstrap_file.read_bytes() == original, "bootstrap ran a second time"
        assert "bootstrap: already done" in second.output()
        status, _ = _get(
            f"{second.api_url}/v1/whoami", {"Authorization": f"Bearer {doc['api_key']}"}
        )
        assert status == 200
        assert second.interrupt() == 0, second.output()
    finally:
        second.kill()


@pytest.mark.slow
def test_dev_up_on_the_private_database_runs_the_daemons_as_the_runtime_user(
    tmp_path: Path,
) -> None:
    """Without ORBIT_DATABASE_URL: the private instance, migrated by its administrator; the
    bootstrap and every daemon connect as the runtime user (rows only)."""
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    port, dispatcher_port = devdb.free_port(), devdb.free_port()
    stack = Stack(state, port, env, tmp_path / "private.log", dispatcher_port)
    try:
        try:
            stack.wait_ready(timeout_s=90)  # includes initialising a new instance
        except pytest.fail.Exception:
            error_log = state / "mysql" / "error.log"  # shown with the failure
            print(error_log.read_text()[-3000:] if error_log.exists() else "no error.log")
            raise
        doc = json.loads((state / "bootstrap.json").read_text())
        status, _ = _get(f"{stack.api_url}/v1/whoami",
                         {"Authorization": f"Bearer {doc['api_key']}"})
        assert status == 200
        instance = devdb.load(state / "mysql")
        assert instance is not None
        assert instance.runtime_password is not None  # kept in db.json for the next start
        # The whole log: the line comes before the migrations and the daemons' start-up lines,
        # which can push it out of output()'s tail.
        assert "orbit_runtime" in stack.log.read_text(errors="replace")

        def users() -> dict[str, int]:
            conn = instance.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT user, COUNT(*) FROM information_schema.PROCESSLIST"
                                " WHERE db = 'orbit' GROUP BY user")
                    return dict(cur.fetchall())
            finally:
                conn.close()

        # Each of the four daemons holds connections (the scheduler's and the pump's loops poll
        # on theirs).
        wait_until(lambda: users().get(devdb.RUNTIME_USER, 0) >= 4, timeout=20, interval=0.2,
                   message="four daemons connected as the runtime user")
        assert set(users()) == {devdb.RUNTIME_USER}, users()
        assert users()[devdb.RUNTIME_USER] >= 4
        key = state / "delivery.key"
        assert key.stat().st_mode & 0o777 == 0o600  # the webhook sealing key, made once
        assert stack.interrupt() == 0, stack.output()
    finally:
        stack.kill()
        devdb.stop(state / "mysql")

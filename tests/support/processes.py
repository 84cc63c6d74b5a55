"""Real Orbit daemons as subprocesses, for end-to-end and fault tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from orbit_common.db.pool import DatabaseUrl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, *, headers: dict[str, str] | None = None,
         body: Any = None, timeout: float = 10) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,  # noqa: S310 - loopback
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def wait_until(condition: Any, *, timeout: float, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Poll ``condition()`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (OSError, ConnectionError) as exc:
            last_error, value = exc, None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} ({last_error})")


class Daemon:
    """``python -m orbit_cli <command>`` with its output captured to a log file."""

    def __init__(self, command: list[str], *, db_url: DatabaseUrl, log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.log = log
        full_env = {
            **os.environ,
            "ORBIT_DATABASE_URL": db_url.render(hide_password=False),
            "ORBIT_SERVICE_READINESS_INTERVAL_S": "0.5",
            "ORBIT_SERVICE_METRICS_PORT": str(free_port()),
            **(env or {}),
        }
        # The operator listener: /metrics and the detailed /readyz (never on a public port).
        self.ops_port = int(full_env["ORBIT_SERVICE_METRICS_PORT"])
        self.ops_url = f"http://127.0.0.1:{self.ops_port}"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orbit_cli", *command],
                env=full_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def json_logs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.output().splitlines()
                if line.startswith("{")]

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


class ApiDaemon(Daemon):
    def __init__(self, *, db_url: DatabaseUrl, log: Path, port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["api"], db_url=db_url, log=log,
                         env={"ORBIT_API_PORT": str(self.port), **(env or {})})

    def wait_listening(self, timeout: float = 20) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"api exited with {self.proc.returncode}:\n{self.output()}")
            return http("GET", f"{self.url}/healthz", timeout=2)[0] == 200

        wait_until(up, timeout=timeout, message="the API to listen")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def kill_and_wait(pid: int, *, timeout: float = 10) -> None:
    """SIGKILL ``pid`` and wait (with a deadline) until it has exited."""
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _gone(pid), timeout=timeout, interval=0.02, message=f"pid {pid} to exit")


class WeaveDaemon(Daemon):
    """``orbit weave`` with short leases and fast polling."""

    def __init__(self, url: DatabaseUrl, log: Path, owner: str, **settings: str) -> None:
        env = {"ORBIT_WEAVE_OWNER": owner, "ORBIT_WEAVE_LEASE_MS": "1500",
               "ORBIT_WEAVE_POLL_MAX_MS": "50", "ORBIT_WEAVE_GAUGE_INTERVAL_S": "0.2",
               "ORBIT_SERVICE_DRAIN_TIMEOUT_S": "5"}
        env.update({f"ORBIT_WEAVE_{k.upper()}": v for k, v in settings.items()})
        super().__init__(["weave"], db_url=url, log=log, env=env)

    def wait_ready(self, timeout: float = 20) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"orbit weave exited {self.proc.returncode}:\n"
                                     f"{self.output()}")
            return http("GET", f"{self.ops_url}/readyz", timeout=2)[0] == 200

        wait_until(up, timeout=timeout, message="orbit weave to be ready")

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"{self.ops_url}/metrics", timeout=5) as answer:  # noqa: S310
            text = answer.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        series = f"{name}{{{want}}}" if want else name
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0.0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

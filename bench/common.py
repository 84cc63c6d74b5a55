"""Helpers the benchmark runners share: the database server, ports, readiness, posting JSON,
percentiles."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs

import orbit_devdb as devdb
from orbit_common.db.pool import DatabaseUrl

T = TypeVar("T")


@attrs.frozen
class BenchServer:
    """Where a benchmark runs: the server (no database selected), a directory for logs, and
    the server's process id when the benchmark started it (for its CPU figures)."""

    server: DatabaseUrl
    logs: Path
    db_pid: int | None


@contextlib.contextmanager
def bench_server(url_text: str | None, prefix: str) -> Iterator[BenchServer]:
    """The server at ``url_text``, or a private MariaDB started in a temporary directory and
    stopped (with the directory) at the end."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    private = None
    try:
        if url_text:
            yield BenchServer(DatabaseUrl.parse(url_text).with_database(""), Path(tmp.name), None)
            return
        private = Path(tmp.name) / "mysql"
        instance = devdb.start(private)
        yield BenchServer(DatabaseUrl.parse(instance.url()), Path(tmp.name),
                          int(instance.pidfile.read_text().strip()))
    finally:
        if private is not None:
            devdb.stop(private)
        tmp.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


def paced_batch(rate: float, per_second: int, limit: int) -> int:
    """Items a request when ``rate`` items a second go out in ``per_second`` requests a second:
    the one pacing rule of every paced phase (at least 1, at most ``limit``)."""
    return max(1, min(limit, int(rate / per_second)))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def post_json(url: str, key: str, doc: dict[str, Any]) -> None:
    request = urllib.request.Request(  # noqa: S310 - loopback
        url, method="POST", data=json.dumps(doc).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()  # noqa: S310


def poll_until(progress: Callable[[], T], done: Callable[[T], bool], what: str,
               timeout: float = 900, every: float = 0.25) -> T:
    """Call ``progress()`` every ``every`` seconds until ``done`` holds for its answer (returned);
    RuntimeError naming ``what`` and the last answer at ``timeout``. The pace is slow on
    purpose: the counts are scans of the server being measured."""
    deadline = time.monotonic() + timeout
    while True:
        seen = progress()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: only {seen} after {timeout} s")
        time.sleep(every)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (Linux ``/proc``); 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name (field 2) may hold spaces; the fields after its ')' are fixed.
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

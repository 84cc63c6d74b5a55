"""No credential, cookie or lease token reaches a daemon's log (issue 11 §9).

Real processes — the API and a daemon's health listener (the scheduler's) — receive requests
whose Authorization and Cookie headers the HTTP parser refuses or the authentication rejects;
their whole logs are then searched for every secret sent.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import pytest

from orbit_common.db.pool import DatabaseUrl
from tests.support.processes import ApiDaemon, Daemon, free_port, http, wait_until

pytestmark = pytest.mark.slow


def _secret() -> str:
    return secrets.token_urlsafe(32)


def _raw(port: int, head: bytes) -> bytes:
    """One raw HTTP/1.1 request; the answer's first bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: orbit\r\n" + head + b"\r\n\r\n")
        return sock.recv(64)


def _attack(port: int) -> list[str]:
    """Malformed and invalid credentials of every kind; returns the secrets they carried."""
    sent = []
    for shape in (b"Authorization: Bearer orb_0123456789ab_%s\x01tail",   # a control character
                  b"Authorization: Bearer orb_0123456789ab_%s\x00",       # NUL
                  b"Authorization: Bearer orb_%s \xff\xfe",               # not UTF-8
                  b"Authorization: Bearer orb_0123456789ab_%s" + b" " + b"A" * 9000,  # too long
                  b"Authorization: Bearer %s\r\n folded",                 # obsolete folding
                  b"Authorization : Basic %s",                            # space before colon
                  b"Authorization: Bearer orb_0123456789ab_%s",           # well formed, unknown
                  b"Cookie: session=%s\x01"):
        secret = _secret()
        sent.append(secret)
        assert _raw(port, shape.replace(b"%s", secret.encode())).startswith(b"HTTP/1.")
    return sent


def _assert_clean(daemon: Daemon, sent: list[str]) -> None:
    log = daemon.output()
    for secret in sent:
        assert secret not in log
        assert secret[:16] not in log  # nor a part of it
    assert "refused by the HTTP parser" in log  # the log does record the refusals


def test_the_api_log_holds_no_credential(db_url: DatabaseUrl, tmp_path: Path) -> None:
    daemon = ApiDaemon(db_url=db_url, log=tmp_path / "api.log")
    try:
        daemon.wait_listening()
        sent = _attack(daemon.port)
    finally:
        daemon.stop()
    _assert_clean(daemon, sent)


def test_a_health_listener_log_holds_no_credential(db_url: DatabaseUrl, tmp_path: Path) -> None:
    port = free_port()
    daemon = Daemon(["scheduler"], db_url=db_url, log=tmp_path / "scheduler.log",
                    env={"ORBIT_SERVICE_METRICS_PORT": str(port)})
    try:
        def up() -> bool:
            if daemon.proc.poll() is not None:
                raise AssertionError(f"scheduler exited:\n{daemon.output()}")
            try:
                return http("GET", f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200
            except OSError:
                return False

        wait_until(up, timeout=20, message="the scheduler's health listener")
        sent = _attack(port)
    finally:
        daemon.stop()
    _assert_clean(daemon, sent)

"""The API daemon as a real process: readiness gate, JSON logs, graceful drain on SIGTERM."""

from __future__ import annotations

import concurrent.futures
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit_common.db.pool import DatabaseUrl, connect_sync
from orbit_common.model import digests, ids, jsondoc
from orbit_common.platform import PLATFORM_NAMESPACE_ID
from tests.conftest import Tenant
from tests.support import database
from tests.support.processes import ApiDaemon, http, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def api_process(db_url: DatabaseUrl, tmp_path: Path) -> Iterator[ApiDaemon]:
    daemon = ApiDaemon(db_url=db_url, log=tmp_path / "api.log")
    try:
        daemon.wait_listening()
        yield daemon
    finally:
        daemon.stop()


def test_api_serves_and_stops_cleanly_on_sigterm(api_process: ApiDaemon, tenant: Tenant) -> None:
    assert http("GET", f"{api_process.url}/readyz")[0] == 200
    status, body = http("GET", f"{api_process.url}/v1/whoami", headers=tenant.auth)
    assert status == 200
    assert body["namespaces"] == [tenant.namespace]

    api_process.signal(signal.SIGTERM)
    assert api_process.wait(timeout=30) == 0
    messages = [entry["msg"] for entry in api_process.json_logs()]
    assert "api started" in messages
    assert messages[-1] == "api stopped"
    assert all(entry["service"] == "api" for entry in api_process.json_logs())


def test_sigterm_lets_an_in_flight_request_finish(
    api_process: ApiDaemon, tenant: Tenant, db_url: DatabaseUrl
) -> None:
    """A request blocked on a row lock when SIGTERM arrives still gets its answer."""
    application_id = tenant.application_id
    key = f"drain-{secrets.token_hex(4)}"
    request = {"name": f"ns-{secrets.token_hex(5)}", "description": ""}
    # Hold the idempotency identity the request will try to claim, so it blocks on our lock.
    holder = connect_sync(db_url, autocommit=False)
    digest = digests.domain_digest("orbit.idempotency.v1", b"namespaces.create",
                                   application_id, jsondoc.canonical(request))
    with holder.cursor() as cur:
        cur.execute(
            "INSERT INTO orbit_idempotency_keys (namespace_id, id, operation, scope, idem_key,"
            " request_digest, credential_id, response_status, response_body, created_at,"
            " expires_at) VALUES (%s, %s, 'namespaces.create', %s, %s, %s, %s, 102, '{}',"
            " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
            (PLATFORM_NAMESPACE_ID, ids.new_id(), application_id, key.encode(), digest,
             ids.new_id()),
        )
    observer = connect_sync(db_url, autocommit=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(http, "POST", f"{api_process.url}/v1/namespaces",
                                 headers={**tenant.auth, "Idempotency-Key": key}, body=request,
                                 timeout=30)

            def blocked() -> bool:
                # The API's INSERT of the same identity is in flight on another connection; it
                # cannot finish while we hold the key. (MariaDB does not always list such a
                # waiter in INNODB_TRX, so the process list is the reliable signal.)
                with observer.cursor() as cur:
                    cur.execute(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE id <> %s"
                        " AND command = 'Query'"
                        " AND info LIKE 'INSERT INTO orbit_idempotency_keys%%'",
                        (holder.thread_id(),),
                    )
                    return bool(cur.fetchone()[0])

            wait_until(lambda: future.done() or blocked(), timeout=10,
                       message="the request to block on the lock")
            assert not future.done(), future.result()
            api_process.signal(signal.SIGTERM)
            wait_until(lambda: "api draining" in api_process.output(), timeout=10,
                       message="the API to start draining")
            holder.rollback()  # the request now owns the key and completes
            status, body = future.result(timeout=30)
    finally:
        holder.close()
        observer.close()
    assert status == 201
    assert body["name"] == request["name"]
    assert api_process.wait(timeout=30) == 0


def test_not_ready_until_migrated(server_url: DatabaseUrl, tmp_path: Path) -> None:
    name = database.scratch_name()
    url = database.create_database(server_url, name, migrate=False)
    daemon = ApiDaemon(db_url=url, log=tmp_path / "api.log")
    try:
        daemon.wait_listening()
        assert http("GET", f"{daemon.url}/readyz") == (503, {"ready": False})
        status, body = http("GET", f"{daemon.ops_url}/readyz")  # the reasons: operators only
        assert status == 503
        assert any("pending" in problem for problem in body["problems"])
        assert http("GET", f"{daemon.url}/healthz")[0] == 200

        migrate = subprocess.run(
            [sys.executable, "-m", "orbit_cli", "migrate", "up"],
            env={"ORBIT_DATABASE_URL": url.render(hide_password=False), "PATH": ""},
            capture_output=True, text=True, check=False,
        )
        assert migrate.returncode == 0, migrate.stderr
        wait_until(lambda: http("GET", f"{daemon.url}/readyz")[0] == 200, timeout=10,
                   message="readiness after migrating")
    finally:
        daemon.stop()
        database.drop_database(server_url, name)

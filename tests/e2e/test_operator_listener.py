"""Each daemon as a real process keeps operator data off its public port (issue 11 §5).

The public port (the API's, the dispatcher's worker port) answers ``/healthz`` and a ``/readyz``
that says only ready or not; ``/metrics`` there is a 404 problem document. The operator listener
(``ORBIT_SERVICE_METRICS_PORT``) serves ``/metrics`` and the detailed ``/readyz``. With
``ORBIT_SERVICE_METRICS_TENANT_LABELS=false`` the dispatcher's usage gauges name no namespace.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.pulse import usage
from tests.conftest import Tenant
from tests.support.lease_fixtures import add_tasks, make_queue
from tests.support.processes import ApiDaemon, Daemon, http, wait_until
from tests.support.stack import DispatcherDaemon

pytestmark = pytest.mark.slow


def get(url: str) -> tuple[int, str, str]:
    """Status, content type and body text of a GET (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.headers.get_content_type(), response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers.get_content_type(), exc.read().decode()


def assert_public_port_keeps_operator_data(daemon: Daemon, public_url: str) -> None:
    status, content_type, body = get(f"{public_url}/metrics")
    assert (status, content_type) == (404, "application/problem+json"), body
    assert json.loads(body)["code"] == "not_found"
    assert "orbit_" not in body
    status, _, body = get(f"{public_url}/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True})
    details = http("GET", f"{daemon.ops_url}/readyz")[1]
    assert details["durability"]["version"]
    assert details["durability"]["version"] not in body
    assert not any(migration in body for migration in details["migrations"])
    assert http("GET", f"{public_url}/healthz") == (200, {"status": "ok"})


def assert_operator_listener_serves(daemon: Daemon, metric: str) -> str:
    status, content_type, text = get(f"{daemon.ops_url}/metrics")
    assert (status, content_type) == (200, "text/plain"), text
    assert "orbit_ready 1.0" in text
    assert f"# TYPE {metric} " in text
    status, details = http("GET", f"{daemon.ops_url}/readyz")
    assert status == 200, details
    assert details["ready"] is True
    assert set(details["migrations"].values()) == {"applied"}
    assert http("GET", f"{daemon.ops_url}/healthz") == (200, {"status": "ok"})
    return text


async def _with_work(db: Database, tenant: Tenant) -> str:
    queue = await make_queue(db, tenant, name="visible")
    await add_tasks(db, tenant, queue, 2)
    return f'namespace="{tenant.namespace}"'


def test_the_api_serves_metrics_only_on_its_operator_listener(
    db_url: DatabaseUrl, tmp_path: Path
) -> None:
    daemon = ApiDaemon(db_url=db_url, log=tmp_path / "api.log")
    try:
        daemon.wait_listening()
        assert_public_port_keeps_operator_data(daemon, daemon.url)
        text = assert_operator_listener_serves(daemon, "orbit_http_requests_total")
        # The public port's own 404 for /metrics is counted like any request.
        assert 'route="unmatched",status="404"' in text
    finally:
        daemon.stop()


@pytest.mark.parametrize("tenant_labels", [True, False])
async def test_the_dispatcher_serves_metrics_only_on_its_operator_listener(
    db: Database, tenant: Tenant, db_url: DatabaseUrl, tmp_path: Path,
    tenant_labels: bool,
) -> None:
    label = await _with_work(db, tenant)
    daemon = DispatcherDaemon(db_url=db_url, log=tmp_path / "dispatcher.log", env={
        "ORBIT_SERVICE_METRICS_TENANT_LABELS": "true" if tenant_labels else "false"})
    try:
        daemon.wait_listening()
        assert_public_port_keeps_operator_data(daemon, daemon.url)
        assert_operator_listener_serves(daemon, "orbit_dispatch_sessions")

        def gauges() -> str | None:
            text = get(f"{daemon.ops_url}/metrics")[2]
            return text if "orbit_queue_unfinished_tasks{" in text else None

        text = wait_until(gauges, timeout=20, message="the usage gauges")
        every = f'namespace="{usage.ALL}",queue="{usage.ALL}"'
        if tenant_labels:
            assert f'orbit_queue_unfinished_tasks{{{label},queue="visible"}} 2.0' in text
            assert every not in text
        else:
            assert tenant.namespace not in text
            assert 'queue="visible"' not in text
            assert f"orbit_queue_unfinished_tasks{{{every}}}" in text
            assert f'orbit_permits_held{{namespace="{usage.ALL}"}}' in text
    finally:
        daemon.stop()


def test_the_scheduler_serves_metrics_on_its_operator_listener(
    db_url: DatabaseUrl, tmp_path: Path
) -> None:
    daemon = Daemon(["scheduler"], db_url=db_url, log=tmp_path / "scheduler.log")
    try:
        def up() -> bool:
            if daemon.proc.poll() is not None:
                raise AssertionError(f"scheduler exited:\n{daemon.output()}")
            # Ready, not merely alive: /healthz answers before the first readiness check
            # (database and migrations) has set orbit_ready.
            return http("GET", f"{daemon.ops_url}/readyz", timeout=2)[0] == 200

        wait_until(up, timeout=20, message="the scheduler's operator listener (ready)")
        assert_operator_listener_serves(daemon, "orbit_schedules_due")
        status, content_type, _ = get(f"{daemon.ops_url}/v1/openapi.json")
        assert (status, content_type) == (404, "application/problem+json")
    finally:
        daemon.stop()

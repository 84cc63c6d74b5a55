"""HTTP edges shared by the API and the dispatcher (orbit_common/service/http).

Requests the HTTP parser refuses never reach the application: they must still be answered with
a problem document and cost one WARNING line, not a text/plain body and an ERROR traceback. A
client that goes away while sending its body is a client disconnect, not a server error: one
INFO line, counted as status 499 in the request metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import prometheus_client
import pytest
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.health import ReadinessGate
from orbit_dispatcher.service import DispatcherService
from tests.conftest import Tenant, api_config
from tests.support.servers import ServiceTestServer
from tests.support.waiting import until


def authentications() -> float:
    """Authentications done in this process (the runner's transaction histogram)."""
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_db_transaction_seconds_count", {"transaction": "auth.authenticate"}) or 0.0


@pytest.fixture(params=["api", "dispatcher"])
async def server(request: pytest.FixtureRequest, db: Database,
                 db_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    """The API's or the dispatcher's application, served like the daemons serve it."""
    gate = ReadinessGate(SchemaChecker(db))
    config = api_config(db_url)
    service = None
    if request.param == "api":
        app = create_app(config, db, gate)
    else:
        service = DispatcherService(config, db, gate)
        app = service.app
    client = TestClient(ServiceTestServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        if service is not None:
            service.draining = True
        await client.close()


async def exchange(client: TestClient[Any, Any], data: bytes) -> tuple[int, dict[str, str],
                                                                        bytes]:
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(10):
            raw = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def request(target: bytes = b"/v1/whoami", *, headers: tuple[bytes, ...] = (), body: bytes = b"",
            method: bytes = b"POST") -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: localhost", *headers,
             b"Content-Length: " + str(len(body)).encode(), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.mark.parametrize(("data", "status", "code"), [
    (request(b"/v1/whoami?" + b"q" * 9000, method=b"GET"), 400, "request_head_too_large"),
    (request(headers=(b"X-Long: " + b"h" * 9000,)), 400, "request_head_too_large"),
    (request(headers=(b"Content-Type: application/json", b"Content-Encoding: br"), body=b"{}"),
     415, "unsupported_content_encoding"),
    (request(headers=(b"Content-Type: application/json", b"Content-Encoding: zstd"),
             body=b"{}"), 415, "unsupported_content_encoding"),
    (b"NOT-HTTP\r\n\r\n", 400, "malformed_http_request"),
], ids=["long-url", "long-header", "br", "zstd", "garbage"])
async def test_parser_refusals_are_problem_documents_logged_once_as_warning(
    server: TestClient[Any, Any], caplog: pytest.LogCaptureFixture, data: bytes, status: int,
    code: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    answered, headers, body = await exchange(server, data)
    assert answered == status, body
    assert headers["content-type"].startswith("application/problem+json"), headers
    doc = json.loads(body)
    assert doc["code"] == code
    assert doc["status"] == status
    assert doc["type"] == f"/problems/{code}"
    assert doc["title"]
    assert doc["detail"]
    refusals = [r for r in caplog.records if r.name == "orbit_common.service.http.server"]
    assert [r.levelno for r in refusals] == [logging.WARNING], caplog.text
    assert code in refusals[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], (
        caplog.text)


async def test_a_client_gone_mid_body_is_one_line_not_an_unhandled_error(
    server: TestClient[Any, Any], tenant: Tenant, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    # Both applications read this route's body after authenticating (the API: namespaces; the
    # dispatcher: worker registration).
    assert server.app is not None
    dispatcher = any("worker" in r.canonical for r in server.app.router.resources())
    target = (f"/v1/namespaces/{tenant.namespace}/worker/sessions".encode() if dispatcher
              else b"/v1/namespaces")
    route = ("/v1/namespaces/{namespace}/worker/sessions" if dispatcher else "/v1/namespaces")

    def counted(status: str) -> float:
        return prometheus_client.REGISTRY.get_sample_value(
            "orbit_http_requests_total",
            {"route": route, "method": "POST", "status": status}) or 0.0

    before = {status: counted(status) for status in ("400", "499", "500")}
    head = b"\r\n".join([
        b"POST " + target + b" HTTP/1.1", b"Host: localhost",
        b"Authorization: Bearer " + tenant.api_key.encode(),
        b"Content-Type: application/json", b"Content-Length: 1000",
    ]) + b"\r\n\r\n"
    authenticated = authentications()
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head + b'{"name": "half')
    await writer.drain()
    # Authenticated means the handler is waiting for the rest of the body (980 bytes short).
    await until(lambda: authentications() > authenticated, message="the request authenticated")
    writer.close()
    await writer.wait_closed()

    def disconnect_logged() -> bool:
        return any("client disconnected" in r.getMessage() for r in caplog.records)

    await until(disconnect_logged)
    gone = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert len(gone) == 1
    assert gone[0].levelno == logging.INFO
    assert gone[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], (
        caplog.text)
    # Counted as nginx's 499 (client closed request): neither a server error nor a 400 answer.
    await until(lambda: counted("499") > before["499"], message="the request counted")
    assert {status: counted(status) for status in ("400", "499", "500")} == {
        **before, "499": before["499"] + 1}

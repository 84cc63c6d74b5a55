"""Shared fixtures: a real database per xdist worker, tenants, an in-process API client."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.db.schema import SchemaChecker
from orbit_common.model import ids
from orbit_common.platform import authz, commands
from orbit_common.platform.audit import Actor
from orbit_common.service.config import ApiConfig, DatabaseConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.http.server import operator_app
from tests.support import database
from tests.support.proxy import FaultProxy
from tests.support.servers import ServiceTestServer


@pytest.fixture(scope="session")
def server_url() -> DatabaseUrl:
    """The test server (no database selected)."""
    return database.server_url()


@pytest.fixture(scope="session")
def db_url(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """This worker's migrated database (unique per process, dropped at the end)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"orbit_test_{worker}_{os.getpid()}"
    yield database.create_database(server_url, name)
    database.drop_database(server_url, name)


@pytest.fixture
async def db(db_url: DatabaseUrl) -> AsyncIterator[Database]:
    database_ = await open_database(db_url, minsize=1, maxsize=10)
    try:
        yield database_
    finally:
        await database_.close()


@pytest.fixture
def sync_conn(db_url: DatabaseUrl) -> Iterator[pymysql.connections.Connection[Any]]:
    """A plain autocommit connection for assertions on raw rows."""
    conn = connect_sync(db_url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


@attrs.frozen(kw_only=True)
class Tenant:
    application: str
    application_id: bytes
    namespace: str
    namespace_id: bytes
    api_key: str = attrs.field(repr=False)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


async def make_tenant(db: Database) -> Tenant:
    result = await commands.bootstrap(
        db, application=unique("app"), namespace=unique("ns"), credential="test",
        actor=Actor.operator("pytest"),
    )
    return Tenant(
        application=result.application.name, application_id=result.application.id,
        namespace=result.namespace.name, namespace_id=result.namespace.id,
        api_key=result.issued.api_key,
    )


@pytest.fixture
async def tenant(db: Database) -> Tenant:
    """A fresh application + namespace + all-access key: tests isolate by tenant."""
    return await make_tenant(db)


async def make_key(db: Database, tenant: Tenant, grants: list[dict[str, Any]]) -> str:
    """Another credential of ``tenant``'s application with the given grants."""
    from orbit_common.platform import credentials

    credential_id = ids.new_id()
    issued = await db.transaction("test.credential", lambda cur: credentials.create_credential(
        cur, credential_id=credential_id, application_id=tenant.application_id,
        name=unique("cred"), grants=authz.parse_grants(grants), actor=Actor.operator("pytest")))
    return issued.api_key


def api_config(db_url: DatabaseUrl, **api: Any) -> OrbitConfig:
    return OrbitConfig(database=DatabaseConfig(url=db_url.render(hide_password=False)),
                       api=ApiConfig(**api))


@pytest.fixture
async def api(db: Database, db_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    """The API application served in-process on a real socket, backed by the real database."""
    config = api_config(db_url)
    gate = ReadinessGate(SchemaChecker(db))
    client = TestClient(ServiceTestServer(create_app(config, db, gate)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def operator(db: Database) -> AsyncIterator[TestClient[Any, Any]]:
    """The operator listener (/metrics, detailed /readyz) served in-process on its own socket;
    it reports this process's metrics, so it sees what the ``api`` fixture counted."""
    client = TestClient(ServiceTestServer(operator_app(ReadinessGate(SchemaChecker(db)))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def proxy(db_url: DatabaseUrl) -> AsyncIterator[FaultProxy]:
    """A fault-injecting TCP proxy in front of the test database (tests/support/proxy.py)."""
    p = FaultProxy(db_url.host, db_url.port)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def proxied_db(db_url: DatabaseUrl, proxy: FaultProxy) -> AsyncIterator[Database]:
    """A pool that reaches the database through ``proxy``."""
    url = attrs.evolve(db_url, host="127.0.0.1", port=proxy.port, unix_socket=None)
    # One pre-opened connection: PyMySQL commits after its init command, and the fault must
    # fire on the transaction's COMMIT, not on connection set-up.
    db = await open_database(url, minsize=1, maxsize=1)
    try:
        yield db
    finally:
        await db.close()


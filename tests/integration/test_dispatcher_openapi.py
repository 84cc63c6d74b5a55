"""The dispatcher's /v1/openapi.json is served and tells the truth about its routes.

Mirrors tests/integration/api/test_openapi.py for the worker gateway: the comparison fails when
someone adds a dispatcher route without documenting it, or documents a path that has no route.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from orbit_common import errors
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.health import ReadinessGate
from orbit_common.service.http.middleware import PUBLIC_PATHS
from orbit_dispatcher import openapi
from orbit_dispatcher.service import DispatcherService
from tests.conftest import api_config
from tests.support.openapi_routes import HTTP_METHODS, documented_routes, served_routes
from tests.support.servers import ServiceTestServer


def _service(db: Database, db_url: DatabaseUrl) -> DispatcherService:
    return DispatcherService(api_config(db_url), db, ReadinessGate(SchemaChecker(db)))


@pytest.fixture
async def gateway(db: Database, db_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    service = _service(db, db_url)
    client = TestClient(ServiceTestServer(service.app))
    await client.start_server()
    try:
        yield client
    finally:
        service.draining = True
        await client.close()


def _routes(app: web.Application) -> set[tuple[str, str]]:
    return served_routes(app)


def _documented() -> set[tuple[str, str]]:
    return documented_routes(openapi.DOCUMENT)


async def test_the_document_is_served_as_openapi_3_1(gateway: TestClient[Any, Any]) -> None:
    response = await gateway.get("/v1/openapi.json")  # public: no credential
    assert response.status == 200
    assert response.content_type == "application/json"
    document = json.loads(await response.read())
    assert document["openapi"] == "3.1.0"
    assert document == json.loads(json.dumps(openapi.DOCUMENT))


async def test_every_route_is_documented_and_every_documented_path_has_a_route(
    gateway: TestClient[Any, Any],
) -> None:
    served = _routes(gateway.server.app)
    documented = _documented()
    assert served - documented == set(), "routes missing from orbit_dispatcher/openapi.py"
    assert documented - served == set(), "documented paths without a route"


async def test_the_comparison_sees_a_new_route(db: Database, db_url: DatabaseUrl) -> None:
    app = _service(db, db_url).app

    async def handler(_request: web.Request) -> web.Response:
        return web.Response()

    app.router.add_post("/v1/namespaces/{namespace}/worker/sessions/{session_id}/pause",
                        handler)
    assert _routes(app) - _documented() == {
        ("/v1/namespaces/{namespace}/worker/sessions/{session_id}/pause", "post")}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [r for key, value in node.items()
                for r in ([value] if key == "$ref" else _refs(value))]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_every_reference_resolves_and_operation_ids_are_unique() -> None:
    schemas = openapi.DOCUMENT["components"]["schemas"]
    for ref in _refs(openapi.DOCUMENT):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    operation_ids = [operation["operationId"] for item in openapi.DOCUMENT["paths"].values()
                     for method, operation in item.items() if method in HTTP_METHODS]
    assert len(operation_ids) == len(set(operation_ids))


def test_public_paths_are_documented_without_security() -> None:
    for path, item in openapi.DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                assert (operation.get("security") == []) is (path in PUBLIC_PATHS), (path, method)


def test_the_documented_problem_codes_exist() -> None:
    # The dispatcher's modules (imported above) define session_lost, report_conflict, ….
    def codes(cls: type[errors.OrbitError]) -> set[str]:
        return {cls.code} | {c for sub in cls.__subclasses__() for c in codes(sub)}

    known = codes(errors.OrbitError)
    text = " ".join(response["description"] for item in openapi.DOCUMENT["paths"].values()
                    for method, operation in item.items() if method in HTTP_METHODS
                    for response in operation["responses"].values())
    for mentioned in re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", text):
        if mentioned in {"report_id", "workers_work"}:
            continue
        assert mentioned in known, mentioned

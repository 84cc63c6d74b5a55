"""/v1/openapi.json is served and tells the truth about the routes.

The route/document comparison fails when someone adds a route without documenting it, or
documents a path that has no route.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from orbit_api import openapi
from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.service.health import ReadinessGate
from tests.conftest import api_config
from tests.support.openapi_routes import HTTP_METHODS, documented_routes, served_routes


def _routes(app: web.Application) -> set[tuple[str, str]]:
    return served_routes(app)


def _documented() -> set[tuple[str, str]]:
    return documented_routes(openapi.DOCUMENT)


async def test_the_document_is_served_as_openapi_3_1(api: TestClient[Any, Any]) -> None:
    response = await api.get("/v1/openapi.json")
    assert response.status == 200
    assert response.content_type == "application/json"
    document = json.loads(await response.read())
    assert document["openapi"] == "3.1.0"
    assert document == json.loads(json.dumps(openapi.DOCUMENT))
    assert document["info"]["title"]
    assert document["paths"]


async def test_every_route_is_documented_and_every_documented_path_has_a_route(
    api: TestClient[Any, Any],
) -> None:
    served = _routes(api.server.app)
    documented = _documented()
    assert served - documented == set(), "routes missing from orbit_api/openapi.py"
    assert documented - served == set(), "documented paths without a route"


async def test_the_comparison_sees_a_new_route(db: Database, db_url: DatabaseUrl) -> None:
    # Guard the guard: an undocumented route added to the application is noticed.
    app = create_app(api_config(db_url), db, ReadinessGate(SchemaChecker(db)))

    async def handler(_request: web.Request) -> web.Response:
        return web.Response()

    app.router.add_delete("/v1/namespaces/{name}", handler)
    assert _routes(app) - _documented() == {("/v1/namespaces/{name}", "delete")}


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_every_reference_resolves() -> None:
    schemas = openapi.DOCUMENT["components"]["schemas"]
    for ref in _refs(openapi.DOCUMENT):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


def test_every_operation_has_a_unique_id_and_responses() -> None:
    ids = []
    for path, item in openapi.DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            assert operation.get("responses"), (path, method)
            assert all(re.fullmatch(r"[1-5]\d\d", status) for status in operation["responses"])
            ids.append(operation["operationId"])
    assert len(ids) == len(set(ids))


def test_public_paths_are_documented_without_security() -> None:
    from orbit_common.service.http.middleware import PUBLIC_PATHS

    for path, item in openapi.DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            public = operation.get("security") == []
            assert public is (path in PUBLIC_PATHS), (path, method)


def test_the_documented_problem_codes_exist() -> None:
    from orbit_common import errors

    def codes(cls: type[errors.OrbitError]) -> set[str]:
        return {cls.code} | {c for sub in cls.__subclasses__() for c in codes(sub)}

    known = codes(errors.OrbitError)
    # Codes are named in the descriptions of responses; schemas are full of snake_case fields.
    text = " ".join(
        response["description"]
        for item in openapi.DOCUMENT["paths"].values()
        for method, operation in item.items()
        if method in HTTP_METHODS
        for response in operation["responses"].values()
    )
    for mentioned in re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", text):
        if mentioned in {"max_body_bytes", "next_cursor", "created_at", "updated_at"}:
            continue
        assert mentioned in known, mentioned

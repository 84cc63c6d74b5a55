"""Bad input on POST /v1/namespaces, GET /v1/namespaces and GET /v1/whoami.

Every refusal is an RFC 9457 problem document with its stable code, and writes nothing: the row
counts of every platform table are the same before and after.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from multidict import CIMultiDict

from orbit_common.model import cursors
from tests.conftest import Tenant, unique
from tests.integration.api.conftest import WriteWatch, assert_problem, raw_http, raw_request

MIB = 1024 * 1024


def _json_headers(tenant: Tenant, **extra: str) -> dict[str, str]:
    return {**tenant.auth, "Content-Type": "application/json", **extra}


# --- POST /v1/namespaces: the body ---------------------------------------------------------------

DEEP = '{"name": "deep-x", "description": ' + "[" * 40 + "]" * 40 + "}"

BODY_CASES: list[tuple[str, bytes, str, str | None]] = [
    # (id, raw body, code, the path of errors[0] for validation_failed)
    ("malformed", b'{"name": "x"', "malformed_json", None),
    ("trailing-garbage", b'{"name": "x"} x', "malformed_json", None),
    ("single-quotes", b"{'name': 'x'}", "malformed_json", None),
    ("empty", b"", "malformed_json", None),
    ("whitespace-only", b"  \n ", "malformed_json", None),
    ("invalid-utf8", b'{"name": "caf\xe9"}', "malformed_json", None),
    ("lone-surrogate", b'{"name": "x-sur", "description": "\\ud800"}', "malformed_json", None),
    ("nan", b'{"name": "x", "description": NaN}', "malformed_json", None),
    ("duplicate-key", b'{"name": "dup-a", "name": "dup-b"}', "duplicate_json_key", None),
    (
        "nested-duplicate-key",
        b'{"name": "dup-c", "description": {"a": 1, "a": 2}}',
        "duplicate_json_key",
        None,
    ),
    ("too-deep", DEEP.encode(), "json_too_deep", None),
    ("name-int", b'{"name": 1}', "validation_failed", "$.name"),
    ("name-bool", b'{"name": true}', "validation_failed", "$.name"),
    ("name-null", b'{"name": null}', "validation_failed", "$.name"),
    ("name-list", b'{"name": ["team-a"]}', "validation_failed", "$.name"),
    (
        "description-int",
        b'{"name": "t-int", "description": 5}',
        "validation_failed",
        "$.description",
    ),
    ("unknown-field", b'{"name": "t-unk", "color": "red"}', "validation_failed", "$"),
    ("missing-name", b'{"description": "no name"}', "validation_failed", "$.name"),
    ("empty-object", b"{}", "validation_failed", "$.name"),
    ("name-uppercase", b'{"name": "Team-A"}', "validation_failed", "$.name"),
    ("name-too-long", json.dumps({"name": "a" * 65}).encode(), "validation_failed", "$.name"),
    ("name-leading-dash", b'{"name": "-team"}', "validation_failed", "$.name"),
    ("name-trailing-dot", b'{"name": "team."}', "validation_failed", "$.name"),
    ("name-empty", b'{"name": ""}', "validation_failed", "$.name"),
    ("name-space", b'{"name": "team a"}', "validation_failed", "$.name"),
    (
        "description-too-long",
        json.dumps({"name": "t-long", "description": "d" * 513}).encode(),
        "validation_failed",
        "$.description",
    ),
    ("top-level-array", b'[{"name": "t-arr"}]', "validation_failed", "$"),
    ("top-level-string", b'"t-str"', "validation_failed", "$"),
    ("top-level-null", b"null", "validation_failed", "$"),
    ("top-level-number", b"12345678901234567890.5", "validation_failed", "$"),
]


@pytest.mark.parametrize(
    ("body", "code", "path"),
    [pytest.param(b, c, p, id=i) for i, b, c, p in BODY_CASES],
)
async def test_bad_bodies_are_problems_and_write_nothing(
    api: TestClient[Any, Any],
    tenant: Tenant,
    *,
    writes: WriteWatch,
    body: bytes,
    code: str,
    path: str | None,
) -> None:
    writes.reset()
    response = await api.post("/v1/namespaces", data=body, headers=_json_headers(tenant))
    problem = await assert_problem(response, 400, code)
    assert problem["instance"] == "/v1/namespaces"
    if path is not None:
        assert problem["errors"][0]["path"] == path, problem
        assert problem["errors"][0]["message"]
    writes.assert_unchanged()


async def test_validation_failed_lists_every_field(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    response = await api.post(
        "/v1/namespaces", json={"name": 1, "description": 2}, headers=tenant.auth
    )
    problem = await assert_problem(response, 400, "validation_failed")
    assert sorted(e["path"] for e in problem["errors"]) == ["$.description", "$.name"]
    writes.assert_unchanged()


async def test_the_longest_valid_description_and_name_are_accepted(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    name = unique("max")
    name += "x" * (64 - len(name))
    response = await api.post(
        "/v1/namespaces", json={"name": name, "description": "é" * 512}, headers=tenant.auth
    )
    assert response.status == 201, await response.text()
    assert (await response.json())["description"] == "é" * 512


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
        "application/merge-patch+json",
        "multipart/form-data; boundary=x",
    ],
)
async def test_a_body_that_is_not_application_json_is_415(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch, content_type: str | None
) -> None:
    writes.reset()
    headers = dict(tenant.auth)
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = await api.post(
        "/v1/namespaces", data=json.dumps({"name": unique("ct")}).encode(), headers=headers
    )
    await assert_problem(response, 415, "unsupported_media_type")
    writes.assert_unchanged()


async def test_application_json_with_a_charset_parameter_is_accepted(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    response = await api.post(
        "/v1/namespaces",
        data=json.dumps({"name": unique("charset")}).encode(),
        headers=_json_headers(tenant, **{"Content-Type": "application/json; charset=utf-8"}),
    )
    assert response.status == 201, await response.text()


def _oversized() -> bytes:
    # A valid document, so only its size can be the reason for the refusal.
    filler = "x" * (MIB + 16)
    return json.dumps({"name": unique("big"), "description": filler}).encode()


async def test_an_oversized_body_with_content_length_is_413(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    body = _oversized()
    response = await api.post(
        "/v1/namespaces", data=io.BytesIO(body), headers=_json_headers(tenant)
    )
    assert response.request_info.headers["Content-Length"] == str(len(body))
    await assert_problem(response, 413, "payload_too_large")
    writes.assert_unchanged()


async def test_an_oversized_chunked_body_is_413(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    body = _oversized()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    response = await api.post("/v1/namespaces", data=chunks(), headers=_json_headers(tenant))
    assert response.request_info.headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in response.request_info.headers
    await assert_problem(response, 413, "payload_too_large")
    writes.assert_unchanged()


async def test_a_chunked_body_within_the_limit_is_accepted(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    body = json.dumps({"name": unique("chunked"), "description": "y" * 300}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    response = await api.post("/v1/namespaces", data=chunks(), headers=_json_headers(tenant))
    assert response.status == 201, await response.text()


async def test_a_gzip_body_that_does_not_inflate_is_a_400_problem(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    response = await api.post(
        "/v1/namespaces",
        data=b"this is not gzip",
        headers=_json_headers(tenant, **{"Content-Encoding": "gzip"}),
    )
    await assert_problem(response, 400, "content_encoding_invalid")
    writes.assert_unchanged()


async def test_a_gzip_body_inflating_beyond_the_limit_is_413(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    bomb = gzip.compress(_oversized() * 4)
    assert len(bomb) < MIB // 10
    response = await api.post(
        "/v1/namespaces", data=bomb, headers=_json_headers(tenant, **{"Content-Encoding": "gzip"})
    )
    await assert_problem(response, 413, "payload_too_large")
    writes.assert_unchanged()


async def test_a_gzip_body_within_the_limit_is_accepted(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    body = gzip.compress(json.dumps({"name": unique("gzip")}).encode())
    response = await api.post(
        "/v1/namespaces", data=body, headers=_json_headers(tenant, **{"Content-Encoding": "gzip"})
    )
    assert response.status == 201, await response.text()


# --- POST /v1/namespaces: headers and query ----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("k" * 256, "1-255 bytes"),
        ("é" * 128, "1-255 bytes"),  # 128 characters, 256 bytes
        ("", "1-255 bytes"),
        ("tab\there", "printable"),
    ],
    ids=["256-ascii", "256-bytes-utf8", "empty", "control-character"],
)
async def test_a_bad_idempotency_key_is_refused(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch, key: str, message: str
) -> None:
    writes.reset()
    response = await api.post(
        "/v1/namespaces",
        data=json.dumps({"name": unique("idem")}).encode(),
        headers=_json_headers(tenant, **{"Idempotency-Key": key}),
    )
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"] == [
        {"path": "Idempotency-Key", "message": problem["errors"][0]["message"]}
    ]
    assert message in problem["errors"][0]["message"]
    writes.assert_unchanged()


async def test_a_255_byte_idempotency_key_is_accepted(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    response = await api.post(
        "/v1/namespaces",
        json={"name": unique("idem255")},
        headers={**tenant.auth, "Idempotency-Key": "é" * 127 + "k"},
    )
    assert response.status == 201, await response.text()


async def test_an_idempotency_key_given_twice_is_refused(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    headers = CIMultiDict(_json_headers(tenant))
    headers.add("Idempotency-Key", "first")
    headers.add("Idempotency-Key", "second")
    response = await api.post(
        "/v1/namespaces", data=json.dumps({"name": unique("twice")}).encode(), headers=headers
    )
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"] == [{"path": "Idempotency-Key", "message": "given more than once"}]
    writes.assert_unchanged()


async def test_an_idempotency_key_that_is_not_utf8_is_refused_not_a_crash(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    request = raw_http(
        "POST",
        b"/v1/namespaces",
        [
            (b"Authorization", b"Bearer " + tenant.api_key.encode()),
            (b"Content-Type", b"application/json"),
            (b"Idempotency-Key", b"\xff\xfe-key"),
        ],
        json.dumps({"name": unique("rawkey")}).encode(),
    )
    response = await raw_request(api, request)
    assert response.status == 400, response.body
    assert response.headers["content-type"] == "application/problem+json"
    problem = json.loads(response.body)
    assert problem["code"] == "validation_failed"
    assert problem["errors"][0]["path"] == "Idempotency-Key"
    writes.assert_unchanged()


async def test_post_refuses_query_parameters(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    response = await api.post(
        "/v1/namespaces?dry_run=1", json={"name": unique("query")}, headers=tenant.auth
    )
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"] == [{"path": "?dry_run", "message": "unknown query parameter"}]
    writes.assert_unchanged()


# --- GET /v1/namespaces --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "path", "message"),
    [
        ("?filter=team", "?filter", "unknown query parameter"),
        ("?Limit=5", "?Limit", "unknown query parameter"),
        ("?limit=0", "?limit", "an integer from 1 to 500"),
        ("?limit=abc", "?limit", "an integer from 1 to 500"),
        ("?limit=501", "?limit", "an integer from 1 to 500"),
        ("?limit=-1", "?limit", "an integer from 1 to 500"),
        ("?limit=%2B5", "?limit", "an integer from 1 to 500"),
        ("?limit=1.5", "?limit", "an integer from 1 to 500"),
        ("?limit=", "?limit", "an integer from 1 to 500"),
        ("?limit=%20", "?limit", "an integer from 1 to 500"),
        ("?limit=%C2%B2", "?limit", "an integer from 1 to 500"),  # superscript two
        ("?limit=%D9%A3", "?limit", "an integer from 1 to 500"),  # Arabic-Indic three
        ("?limit=" + "9" * 5000, "?limit", "an integer from 1 to 500"),
        ("?limit=5&limit=5", "?limit", "given more than once"),
        ("?cursor=a&cursor=a", "?cursor", "given more than once"),
    ],
)
async def test_bad_list_queries_are_refused(
    api: TestClient[Any, Any],
    tenant: Tenant,
    *,
    writes: WriteWatch,
    query: str,
    path: str,
    message: str,
) -> None:
    writes.reset()
    response = await api.get("/v1/namespaces" + query, headers=tenant.auth)
    problem = await assert_problem(response, 400, "validation_failed")
    assert {"path": path, "message": message} in problem["errors"]
    writes.assert_unchanged()


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "%FF%FE",
        "",
        cursors.encode("other", {}, ["x"]),
        cursors.encode("namespaces", {"state": "ACTIVE"}, ["x"]),
        cursors.encode("namespaces", {}, [1]),
        cursors.encode("namespaces", {}, ["a", "b"]),
        cursors.encode("namespaces", {}, []),
        cursors.encode("namespaces", {}, [None]),
    ],
    ids=[
        "garbage",
        "not-utf8",
        "empty",
        "other-kind",
        "other-filter",
        "position-not-a-name",
        "position-too-long",
        "position-empty",
        "position-null",
    ],
)
async def test_a_foreign_or_garbage_cursor_is_invalid(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch, cursor: str
) -> None:
    writes.reset()
    response = await api.get(f"/v1/namespaces?cursor={cursor}", headers=tenant.auth)
    await assert_problem(response, 400, "invalid_cursor")
    writes.assert_unchanged()


async def test_a_deeply_nested_forged_cursor_is_invalid_not_a_crash(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    import base64

    forged = base64.urlsafe_b64encode(b"[" * 3000 + b"]" * 3000).decode().rstrip("=")
    response = await api.get(f"/v1/namespaces?cursor={forged}", headers=tenant.auth)
    await assert_problem(response, 400, "invalid_cursor")


# --- GET /v1/whoami ------------------------------------------------------------------------------


async def test_whoami_refuses_query_parameters(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    response = await api.get("/v1/whoami?verbose=1", headers=tenant.auth)
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"] == [{"path": "?verbose", "message": "unknown query parameter"}]
    writes.assert_unchanged()


# --- routing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/nope", "/v1/nope", "/v1/namespaces/x/y", "/v2/whoami"])
async def test_an_unknown_route_is_a_404_problem(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch, path: str
) -> None:
    writes.reset()
    response = await api.get(path, headers=tenant.auth)
    body = await assert_problem(response, 404, "not_found")
    assert body["instance"] == path
    writes.assert_unchanged()


async def test_an_unknown_v1_route_without_a_key_is_401_not_404(
    api: TestClient[Any, Any],
) -> None:
    # Routes under /v1 are not enumerable without a credential.
    response = await api.get("/v1/nope")
    await assert_problem(response, 401, "unauthenticated")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/namespaces", {"GET", "HEAD", "POST"}),
        ("DELETE", "/v1/namespaces", {"GET", "HEAD", "POST"}),
        ("PATCH", "/v1/namespaces", {"GET", "HEAD", "POST"}),
        ("POST", "/v1/whoami", {"GET", "HEAD"}),
        ("DELETE", "/v1/whoami", {"GET", "HEAD"}),
        ("POST", "/healthz", {"GET", "HEAD"}),
        ("POST", "/v1/openapi.json", {"GET", "HEAD"}),
    ],
)
async def test_a_wrong_method_is_a_405_problem_with_allow(
    api: TestClient[Any, Any],
    tenant: Tenant,
    *,
    writes: WriteWatch,
    method: str,
    path: str,
    allow: set[str],
) -> None:
    writes.reset()
    response = await api.request(
        method, path, headers=_json_headers(tenant), data=json.dumps({"name": unique("m")})
    )
    await assert_problem(response, 405, "method_not_allowed")
    assert {m.strip() for m in response.headers["Allow"].split(",")} == allow
    writes.assert_unchanged()


@pytest.mark.parametrize("encoding", ["foo", "compress", "identity, foo"])
async def test_an_unsupported_content_encoding_is_a_415_problem(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch, encoding: str
) -> None:
    writes.reset()
    response = await api.post(
        "/v1/namespaces",
        data=b'{"name": "enc-x"}',
        headers=_json_headers(tenant, **{"Content-Encoding": encoding}),
    )
    await assert_problem(response, 415, "unsupported_content_encoding")
    writes.assert_unchanged()

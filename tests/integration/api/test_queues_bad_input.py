"""Bad input on every queue route: a problem document with its stable code, and nothing written.

Row counts of the platform and queue tables are compared before and after; for PATCH, pause and
resume the queue's representation is compared too (an UPDATE does not change a row count).
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from orbit_common.model import cursors
from tests.conftest import Tenant, unique
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_queues_support import QueueWrites, create, get, qwrites, url

__all__ = ["qwrites"]

INT_TOO_BIG = 2_147_483_648

# (id, body, code, the paths of errors[] for validation_failed)
CREATE_CASES: list[tuple[str, Any, str, list[str] | None]] = [
    ("malformed", b'{"name": "x"', "malformed_json", None),
    ("empty", b"", "malformed_json", None),
    ("duplicate-key", b'{"name": "a", "name": "b"}', "duplicate_json_key", None),
    ("nested-duplicate-key", b'{"name": "a", "retry": {"jitter": "0", "jitter": "1"}}',
     "duplicate_json_key", None),
    ("too-deep", b'{"name": "a", "description": ' + b"[" * 40 + b"]" * 40 + b"}",
     "json_too_deep", None),
    ("top-level-array", [{"name": "a"}], "validation_failed", ["$"]),
    ("missing-name", {"description": "x"}, "validation_failed", ["$.name"]),
    ("name-uppercase", {"name": "Orders"}, "validation_failed", ["$.name"]),
    ("name-too-long", {"name": "q" * 65}, "validation_failed", ["$.name"]),
    ("name-int", {"name": 5}, "validation_failed", ["$.name"]),
    ("description-int", {"name": "a", "description": 5}, "validation_failed",
     ["$.description"]),
    ("description-too-long", {"name": "a", "description": "d" * 513}, "validation_failed",
     ["$.description"]),
    ("offer-too-short", {"name": "a", "offer_lease_ms": 99}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("offer-too-long", {"name": "a", "offer_lease_ms": 3_600_001}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("offer-string", {"name": "a", "offer_lease_ms": "30000"}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("offer-float", {"name": "a", "offer_lease_ms": 1500.0}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("offer-bool", {"name": "a", "offer_lease_ms": True}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("offer-null", {"name": "a", "offer_lease_ms": None}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("offer-huge", b'{"name": "a", "offer_lease_ms": 99999999999999999999}',
     "validation_failed", ["$.offer_lease_ms"]),
    ("execution-too-short", {"name": "a", "execution_lease_ms": 99}, "validation_failed",
     ["$.execution_lease_ms"]),
    ("execution-too-long", {"name": "a", "execution_lease_ms": 86_400_001},
     "validation_failed", ["$.execution_lease_ms"]),
    ("retry-array", {"name": "a", "retry": []}, "validation_failed", ["$.retry"]),
    ("retry-null", {"name": "a", "retry": None}, "validation_failed", ["$.retry"]),
    ("retry-unknown", {"name": "a", "retry": {"base_ms": 5}}, "validation_failed", ["$.retry"]),
    ("attempts-zero", {"name": "a", "retry": {"max_attempts": 0}}, "validation_failed",
     ["$.retry.max_attempts"]),
    ("attempts-1001", {"name": "a", "retry": {"max_attempts": 1001}}, "validation_failed",
     ["$.retry.max_attempts"]),
    ("initial-negative", {"name": "a", "retry": {"initial_ms": -1}}, "validation_failed",
     ["$.retry.initial_ms"]),
    ("max-below-initial", {"name": "a", "retry": {"initial_ms": 5000, "max_ms": 4999}},
     "validation_failed", ["$.retry.max_ms"]),
    ("initial-above-default-max", {"name": "a", "retry": {"initial_ms": 60_001}},
     "validation_failed", ["$.retry.max_ms"]),
    ("max-too-big", {"name": "a", "retry": {"max_ms": INT_TOO_BIG}}, "validation_failed",
     ["$.retry.max_ms"]),
    ("multiplier-bool", {"name": "a", "retry": {"multiplier": True}}, "validation_failed",
     ["$.retry.multiplier"]),
    ("multiplier-below-1", {"name": "a", "retry": {"multiplier": "0.999"}}, "validation_failed",
     ["$.retry.multiplier"]),
    ("multiplier-4-places", {"name": "a", "retry": {"multiplier": "1.2345"}},
     "validation_failed", ["$.retry.multiplier"]),
    ("multiplier-exponent", {"name": "a", "retry": {"multiplier": "1e2"}}, "validation_failed",
     ["$.retry.multiplier"]),
    ("multiplier-1000", {"name": "a", "retry": {"multiplier": "1000"}}, "validation_failed",
     ["$.retry.multiplier"]),
    ("multiplier-spaces", {"name": "a", "retry": {"multiplier": " 2"}}, "validation_failed",
     ["$.retry.multiplier"]),
    ("multiplier-nan", {"name": "a", "retry": {"multiplier": "NaN"}}, "validation_failed",
     ["$.retry.multiplier"]),
    ("jitter-above-1", {"name": "a", "retry": {"jitter": "1.001"}}, "validation_failed",
     ["$.retry.jitter"]),
    ("jitter-negative", {"name": "a", "retry": {"jitter": "-0.1"}}, "validation_failed",
     ["$.retry.jitter"]),
    ("jitter-four-places", {"name": "a", "retry": {"jitter": 0.2001}}, "validation_failed",
     ["$.retry.jitter"]),
    ("concurrency-zero", {"name": "a", "max_concurrent_attempts": 0}, "validation_failed",
     ["$.max_concurrent_attempts"]),
    ("concurrency-string", {"name": "a", "max_concurrent_attempts": "4"}, "validation_failed",
     ["$.max_concurrent_attempts"]),
    ("concurrency-too-big", {"name": "a", "max_concurrent_attempts": INT_TOO_BIG},
     "validation_failed", ["$.max_concurrent_attempts"]),
    # The runtime counter, the revision and the gate are not the caller's to set.
    ("active-attempts", {"name": "a", "active_attempts": 5}, "validation_failed", ["$"]),
    ("revision", {"name": "a", "revision": 7}, "validation_failed", ["$"]),
    ("paused", {"name": "a", "paused": True}, "validation_failed", ["$"]),
    ("every-problem-at-once",
     {"name": "A", "offer_lease_ms": 1, "retry": {"multiplier": "x", "jitter": "2"},
      "max_concurrent_attempts": 0},
     "validation_failed",
     ["$.retry.multiplier", "$.name", "$.offer_lease_ms", "$.retry.jitter",
      "$.max_concurrent_attempts"]),
]


async def _send(
    api: TestClient[Any, Any], method: str, target: str, body: Any, headers: dict[str, str]
) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await api.request(method, target, data=data,
                             headers={**headers, "Content-Type": "application/json"})


async def _check(response: Any, code: str, paths: list[str] | None) -> None:
    status = 400
    problem = await assert_problem(response, status, code)
    if paths is not None:
        assert sorted(e["path"] for e in problem["errors"]) == sorted(paths), problem


@pytest.mark.parametrize(("body", "code", "paths"), [c[1:] for c in CREATE_CASES],
                         ids=[c[0] for c in CREATE_CASES])
async def test_bad_create_bodies(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, body: Any, code: str,
    paths: list[str] | None,
) -> None:
    qwrites.reset()
    for key in (None, unique("key")):
        headers = {**tenant.auth, **({"Idempotency-Key": key} if key else {})}
        await _check(await _send(api, "POST", url(tenant.namespace), body, headers), code, paths)
    qwrites.assert_unchanged()


PATCH_CASES: list[tuple[str, Any, str, list[str] | None]] = [
    ("malformed", b"{", "malformed_json", None),
    ("empty", b"", "malformed_json", None),
    ("duplicate-key", b'{"revision": 1, "revision": 1}', "duplicate_json_key", None),
    ("missing-revision", {"description": "x"}, "validation_failed", ["$.revision"]),
    ("revision-zero", {"revision": 0, "description": "x"}, "validation_failed", ["$.revision"]),
    ("revision-string", {"revision": "1"}, "validation_failed", ["$.revision"]),
    ("revision-null", {"revision": None}, "validation_failed", ["$.revision"]),
    ("rename", {"revision": 1, "name": "other"}, "validation_failed", ["$"]),
    ("active-attempts", {"revision": 1, "active_attempts": 0}, "validation_failed", ["$"]),
    ("gate", {"revision": 1, "gate": {"state": "PAUSED"}}, "validation_failed", ["$"]),
    ("description-null", {"revision": 1, "description": None}, "validation_failed",
     ["$.description"]),
    ("offer-null", {"revision": 1, "offer_lease_ms": None}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("retry-null", {"revision": 1, "retry": None}, "validation_failed", ["$.retry"]),
    ("retry-field-null", {"revision": 1, "retry": {"max_attempts": None}}, "validation_failed",
     ["$.retry.max_attempts"]),
    ("retry-unknown", {"revision": 1, "retry": {"base_ms": 1}}, "validation_failed",
     ["$.retry"]),
    ("offer-too-short", {"revision": 1, "offer_lease_ms": 99}, "validation_failed",
     ["$.offer_lease_ms"]),
    ("execution-too-long", {"revision": 1, "execution_lease_ms": 86_400_001},
     "validation_failed", ["$.execution_lease_ms"]),
    ("description-too-long", {"revision": 1, "description": "d" * 513}, "validation_failed",
     ["$.description"]),
    ("multiplier-below-1", {"revision": 1, "retry": {"multiplier": "0.5"}},
     "validation_failed", ["$.retry.multiplier"]),
    ("jitter-text", {"revision": 1, "retry": {"jitter": "a lot"}}, "validation_failed",
     ["$.retry.jitter"]),
    ("initial-above-max-in-one-patch", {"revision": 1, "retry": {"initial_ms": 10,
                                                                  "max_ms": 9}},
     "validation_failed", ["$.retry.max_ms"]),
    ("concurrency-zero", {"revision": 1, "max_concurrent_attempts": 0}, "validation_failed",
     ["$.max_concurrent_attempts"]),
    ("several", {"revision": 0, "offer_lease_ms": 5, "retry": {"jitter": "9"}},
     "validation_failed", ["$.revision", "$.offer_lease_ms", "$.retry.jitter"]),
]


@pytest.fixture
async def existing(api: TestClient[Any, Any], tenant: Tenant) -> dict[str, Any]:
    return await create(api, tenant, unique("victim"), max_concurrent_attempts=3)


@pytest.mark.parametrize(("body", "code", "paths"), [c[1:] for c in PATCH_CASES],
                         ids=[c[0] for c in PATCH_CASES])
async def test_bad_patch_bodies(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, existing: dict[str, Any],
    body: Any, code: str, paths: list[str] | None,
) -> None:
    qwrites.reset()
    response = await _send(api, "PATCH", url(tenant.namespace, existing["name"]), body,
                           tenant.auth)
    await _check(response, code, paths)
    qwrites.assert_unchanged()
    assert await get(api, tenant, existing["name"]) == existing


GATE_CASES: list[tuple[str, Any, str, list[str] | None]] = [
    ("malformed", b'{"reason": ', "malformed_json", None),
    ("duplicate-key", b'{"reason": "a", "reason": "b"}', "duplicate_json_key", None),
    ("array", ["why"], "validation_failed", ["$"]),
    ("reason-int", {"reason": 42}, "validation_failed", ["$.reason"]),
    ("reason-too-long", {"reason": "r" * 1025}, "validation_failed", ["$.reason"]),
    ("unknown-field", {"reason": "x", "until": "tomorrow"}, "validation_failed", ["$"]),
    ("no-reason", {}, "validation_failed", ["$.reason"]),
    ("empty-reason", {"reason": ""}, "validation_failed", ["$.reason"]),
    ("null-reason", {"reason": None}, "validation_failed", ["$.reason"]),
    ("no-body", b"", "validation_failed", ["$.reason"]),
]


@pytest.mark.parametrize("action", ["pause", "resume"])
@pytest.mark.parametrize(("body", "code", "paths"), [c[1:] for c in GATE_CASES],
                         ids=[c[0] for c in GATE_CASES])
async def test_bad_pause_and_resume_bodies(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, existing: dict[str, Any],
    action: str, body: Any, code: str, paths: list[str] | None,
) -> None:
    name = existing["name"]
    if action == "resume":  # so that a resume would change something
        assert (await api.post(url(tenant.namespace, name, "pause"), json={"reason": "x"},
                               headers=tenant.auth)).status == 200
    before = await get(api, tenant, name)
    qwrites.reset()
    await _check(await _send(api, "POST", url(tenant.namespace, name, action), body,
                             tenant.auth), code, paths)
    qwrites.assert_unchanged()
    assert await get(api, tenant, name) == before


async def test_media_type_and_size_are_checked_on_every_body_route(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, existing: dict[str, Any]
) -> None:
    ns, name = tenant.namespace, existing["name"]
    routes = [("POST", url(ns), {"name": unique("q")}),
              ("PATCH", url(ns, name), {"revision": 1, "description": "x"}),
              ("POST", url(ns, name, "pause"), {"reason": "x"})]
    qwrites.reset()
    for method, target, body in routes:
        response = await api.request(method, target, data=json.dumps(body).encode(),
                                     headers={**tenant.auth, "Content-Type": "text/plain"})
        await assert_problem(response, 415, "unsupported_media_type")
        response = await api.request(
            method, target, data=json.dumps(body).encode(),
            headers={**tenant.auth, "Content-Type": "application/json",
                     "Content-Encoding": "compress"},
        )
        await assert_problem(response, 415, "unsupported_content_encoding")
        big = json.dumps({**body, "description": "d" * (2 * 1024 * 1024)})
        response = await api.request(method, target, data=io.BytesIO(big.encode()),
                                     headers={**tenant.auth, "Content-Type": "application/json"})
        await assert_problem(response, 413, "payload_too_large")
    qwrites.assert_unchanged()
    assert await get(api, tenant, name) == existing


async def test_bad_query_strings(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, existing: dict[str, Any]
) -> None:
    ns, name = tenant.namespace, existing["name"]
    foreign_kind = cursors.encode("namespaces", {}, [name])
    not_a_name = cursors.encode("queues", {"namespace": ns}, [7])
    two_positions = cursors.encode("queues", {"namespace": ns}, ["a", "b"])
    qwrites.reset()
    for query, code, path in [
        ("limit=0", "validation_failed", "?limit"),
        ("limit=501", "validation_failed", "?limit"),
        ("limit=abc", "validation_failed", "?limit"),
        ("limit=%C2%B2", "validation_failed", "?limit"),
        ("limit=1&limit=2", "validation_failed", "?limit"),
        ("color=red", "validation_failed", "?color"),
        ("cursor=garbage!", "invalid_cursor", None),
        ("cursor=", "invalid_cursor", None),
        (f"cursor={foreign_kind}", "invalid_cursor", None),
        (f"cursor={not_a_name}", "invalid_cursor", None),
        (f"cursor={two_positions}", "invalid_cursor", None),
    ]:
        response = await api.get(f"{url(ns)}?{query}", headers=tenant.auth)
        problem = await assert_problem(response, 400, code)
        if path is not None:
            assert problem["errors"][0]["path"] == path, query
    # Routes that take no query parameter refuse one.
    for method, target, body in [
        ("GET", url(ns, name), None),
        ("POST", url(ns), {"name": unique("q")}),
        ("PATCH", url(ns, name), {"revision": 1, "description": "x"}),
        ("POST", url(ns, name, "pause"), None),
        ("POST", url(ns, name, "resume"), None),
    ]:
        response = await api.request(method, target + "?dry_run=1", json=body,
                                     headers=tenant.auth)
        problem = await assert_problem(response, 400, "validation_failed")
        assert problem["errors"][0]["path"] == "?dry_run"
    qwrites.assert_unchanged()
    assert await get(api, tenant, name) == existing


async def test_bad_idempotency_keys(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    qwrites.reset()
    for key in ("k" * 256, "tab\there"):
        response = await api.post(url(tenant.namespace), json={"name": unique("q")},
                                  headers={**tenant.auth, "Idempotency-Key": key})
        problem = await assert_problem(response, 400, "validation_failed")
        assert problem["errors"][0]["path"] == "Idempotency-Key"
    response = await api.post(
        url(tenant.namespace), json={"name": unique("q")},
        headers=[*tenant.auth.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
    )
    await assert_problem(response, 400, "validation_failed")
    qwrites.assert_unchanged()


async def test_names_in_the_path_that_cannot_exist_are_not_found(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    ns = tenant.namespace
    qwrites.reset()
    for segment in ("Orders", "q" * 300, "%ff", "%ED%A0%80", "a%20b", "-a", "%00"):
        for method, suffix, body in [("GET", "", None), ("PATCH", "", {"revision": 1}),
                                     ("POST", "/pause", None), ("POST", "/resume", None)]:
            response = await api.request(method, f"{url(ns)}/{segment}{suffix}", json=body,
                                         headers=tenant.auth)
            await assert_problem(response, 404, "queue_not_found")
        for method, target, body in [("GET", f"/v1/namespaces/{segment}/queues", None),
                                     ("POST", f"/v1/namespaces/{segment}/queues",
                                      {"name": unique("q")}),
                                     ("GET", f"/v1/namespaces/{segment}/queues/q", None)]:
            response = await api.request(method, target, json=body, headers=tenant.auth)
            await assert_problem(response, 404, "namespace_not_found")
    qwrites.assert_unchanged()


async def test_unknown_namespace_is_namespace_not_found_before_anything_else(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    missing = unique("nowhere")
    qwrites.reset()
    for method, target, body in [
        ("GET", url(missing), None),
        ("POST", url(missing), {"name": unique("q")}),
        ("GET", url(missing, "q"), None),
        ("PATCH", url(missing, "q"), {"revision": 1}),
        ("POST", url(missing, "q", "pause"), None),
        ("POST", url(missing, "q", "resume"), None),
    ]:
        response = await api.request(method, target, json=body, headers=tenant.auth)
        await assert_problem(response, 404, "namespace_not_found")
    qwrites.assert_unchanged()


async def test_no_credential_and_wrong_methods(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites, existing: dict[str, Any]
) -> None:
    ns, name = tenant.namespace, existing["name"]
    qwrites.reset()
    for method, target in [("GET", url(ns)), ("POST", url(ns)), ("GET", url(ns, name)),
                           ("PATCH", url(ns, name)), ("POST", url(ns, name, "pause")),
                           ("POST", url(ns, name, "resume"))]:
        response = await api.request(method, target, json={"name": unique("q")})
        await assert_problem(response, 401, "unauthenticated")
    for method, target in [("DELETE", url(ns, name)), ("PUT", url(ns, name)),
                           ("GET", url(ns, name, "pause")), ("PATCH", url(ns))]:
        response = await api.request(method, target, headers=tenant.auth)
        problem = await assert_problem(response, 405, "method_not_allowed")
        assert response.headers["Allow"], problem
    qwrites.assert_unchanged()
    assert await get(api, tenant, name) == existing

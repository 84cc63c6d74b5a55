"""Bad input on every task route: a problem document with its stable code (and, for
validation_failed, the path of the offending field), and nothing written -- pulse_tasks,
orbit_events and orbit_idempotency_keys keep their row counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.model import cursors
from tests.conftest import Tenant
from tests.integration.api.conftest import assert_problem
from tests.support import pulse

OK = {"queue": "work", "handler": "h"}
DAY_MS = 24 * 3600 * 1000


def _with(**fields: Any) -> bytes:
    return json.dumps({**OK, **fields}).encode()


SUBMIT_CASES: list[tuple[str, bytes, str, str | None]] = [
    # (id, body, code, path of errors[0])
    ("malformed", b'{"queue": "work"', "malformed_json", None),
    ("empty", b"", "malformed_json", None),
    ("not-an-object", b"[1]", "validation_failed", "$"),
    ("duplicate-key", b'{"queue": "work", "queue": "work", "handler": "h"}',
     "duplicate_json_key", None),
    ("duplicate-key-in-input", b'{"queue": "work", "handler": "h", "input": {"a": 1, "a": 2}}',
     "duplicate_json_key", None),
    ("too-deep-input", b'{"queue": "work", "handler": "h", "input": ' + b"[" * 40 + b"]" * 40
     + b"}", "json_too_deep", None),
    # 50,001 arrays and objects in all (the body's own object is one), counted before parsing
    ("too-complex-input", b'{"queue": "work", "handler": "h", "input": ['
     + b",".join([b"[]"] * 49_999) + b"]}", "json_too_complex", None),
    ("nan-input", b'{"queue": "work", "handler": "h", "input": [NaN]}', "malformed_json", None),
    ("double-overflow-input", b'{"queue": "work", "handler": "h", "input": {"x": 1e400}}',
     "validation_failed", "$.input"),
    ("missing-queue", b'{"handler": "h"}', "validation_failed", "$.queue"),
    ("missing-handler", b'{"queue": "work"}', "validation_failed", "$.handler"),
    # Unknown fields are reported at their object, with their names in the message.
    ("unknown-field", _with(queue_name="work"), "validation_failed", "$"),
    ("queue-int", _with(queue=1), "validation_failed", "$.queue"),
    ("queue-upper", _with(queue="Work"), "validation_failed", "$.queue"),
    ("queue-space", _with(queue="wo rk"), "validation_failed", "$.queue"),
    ("handler-empty", _with(handler=""), "validation_failed", "$.handler"),
    ("handler-space", _with(handler="send mail"), "validation_failed", "$.handler"),
    ("handler-non-ascii", _with(handler="hé"), "validation_failed", "$.handler"),
    ("handler-129", _with(handler="h" * 129), "validation_failed", "$.handler"),
    ("delay-negative", _with(delay_ms=-1), "validation_failed", "$.delay_ms"),
    ("delay-over-31-days", _with(delay_ms=31 * DAY_MS + 1), "validation_failed", "$.delay_ms"),
    ("delay-string", _with(delay_ms="5"), "validation_failed", "$.delay_ms"),
    ("delay-fraction", b'{"queue": "work", "handler": "h", "delay_ms": 1.5}',
     "validation_failed", "$.delay_ms"),
    ("delay-and-not-before", _with(delay_ms=5, not_before="2030-01-01T00:00:00Z"),
     "validation_failed", "$.not_before"),
    ("not-before-naive", _with(not_before="2030-01-01T00:00:00"), "validation_failed",
     "$.not_before"),
    ("not-before-date", _with(not_before="2030-01-01"), "validation_failed", "$.not_before"),
    ("not-before-words", _with(not_before="tomorrow"), "validation_failed", "$.not_before"),
    ("not-before-bad-day", _with(not_before="2030-02-30T00:00:00Z"), "validation_failed",
     "$.not_before"),
    ("not-before-far", _with(not_before="2099-01-01T00:00:00Z"), "validation_failed",
     "$.not_before"),
    ("business-key-empty", _with(business_key=""), "validation_failed", "$.business_key"),
    ("business-key-513-bytes", _with(business_key="é" * 256 + "x"), "validation_failed",
     "$.business_key"),
    ("business-key-int", _with(business_key=5), "validation_failed", "$.business_key"),
    ("deadline-zero", _with(deadline_ms=0), "validation_failed", "$.deadline_ms"),
    ("deadline-before-delay", _with(deadline_ms=1000, delay_ms=1000), "validation_failed",
     "$.deadline_ms"),
    ("start-deadline-zero", _with(start_deadline_ms=0), "validation_failed",
     "$.start_deadline_ms"),
    ("attempt-timeout-small", _with(attempt_timeout_ms=99), "validation_failed",
     "$.attempt_timeout_ms"),
    ("offer-lease-small", _with(offer_lease_ms=99), "validation_failed", "$.offer_lease_ms"),
    ("execution-lease-large", _with(execution_lease_ms=DAY_MS + 1), "validation_failed",
     "$.execution_lease_ms"),
    ("rerun-safe-string", _with(rerun_safe="yes"), "validation_failed", "$.rerun_safe"),
    ("retry-not-object", _with(retry=[3]), "validation_failed", "$.retry"),
    ("retry-unknown", _with(retry={"attempts": 3}), "validation_failed", "$.retry"),
    ("retry-attempts-zero", _with(retry={"max_attempts": 0}), "validation_failed",
     "$.retry.max_attempts"),
    ("retry-attempts-1001", _with(retry={"max_attempts": 1001}), "validation_failed",
     "$.retry.max_attempts"),
    ("retry-initial-negative", _with(retry={"initial_ms": -1}), "validation_failed",
     "$.retry.initial_ms"),
    ("retry-max-below-initial", _with(retry={"initial_ms": 500, "max_ms": 499}),
     "validation_failed", "$.retry.max_ms"),
    ("retry-multiplier-below-1", b'{"queue": "work", "handler": "h", "retry": {"multiplier":'
     b" 0.5}}", "validation_failed", "$.retry.multiplier"),
    ("retry-multiplier-4-places", b'{"queue": "work", "handler": "h", "retry": {"multiplier":'
     b" 1.2345}}", "validation_failed", "$.retry.multiplier"),
    ("retry-multiplier-string", _with(retry={"multiplier": "2"}), "validation_failed",
     "$.retry.multiplier"),
    ("retry-multiplier-bool", _with(retry={"multiplier": True}), "validation_failed",
     "$.retry.multiplier"),
    ("retry-jitter-above-1", b'{"queue": "work", "handler": "h", "retry": {"jitter": 1.001}}',
     "validation_failed", "$.retry.jitter"),
    ("idempotency-key-in-body", _with(idempotency_key="k"), "validation_failed", "$"),
]


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, "work")
    return "work"


@pytest.fixture
def unchanged(sync_conn: pymysql.connections.Connection[Any]) -> Iterator[None]:
    """Fails the test if any submission table gained or lost a row."""
    before = pulse.submit_counts(sync_conn)
    yield
    assert pulse.submit_counts(sync_conn) == before


def _json_headers(tenant: Tenant, **extra: str) -> dict[str, str]:
    return {**tenant.auth, "Content-Type": "application/json", **extra}


@pytest.mark.parametrize(("body", "code", "path"), [c[1:] for c in SUBMIT_CASES],
                         ids=[c[0] for c in SUBMIT_CASES])
@pytest.mark.parametrize("key", [None, "a-key"], ids=["no-key", "with-key"])
async def test_a_bad_submission_is_a_problem_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, sync_conn: Any,
    body: bytes, code: str, path: str | None, key: str | None,
) -> None:
    before = pulse.submit_counts(sync_conn)
    extra = {"Idempotency-Key": key} if key else {}
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks", data=body,
                              headers=_json_headers(tenant, **extra))
    problem = await assert_problem(response, 400, code)
    if path is not None:
        assert problem["errors"][0]["path"] == path, problem
    assert pulse.submit_counts(sync_conn) == before


@pytest.mark.parametrize(("body", "code", "path"), [c[1:] for c in SUBMIT_CASES
                                                   if c[0] != "idempotency-key-in-body"],
                         ids=[c[0] for c in SUBMIT_CASES if c[0] != "idempotency-key-in-body"])
async def test_the_same_mistake_in_a_batch_points_at_the_item(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, sync_conn: Any,
    body: bytes, code: str, path: str | None,
) -> None:
    before = pulse.submit_counts(sync_conn)
    batch = b'{"tasks": [{"queue": "work", "handler": "ok"}, ' + (body or b"{") + b"]}"
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/batch", data=batch,
                              headers=_json_headers(tenant))
    problem = await assert_problem(response, 400, code)
    if path is not None and code == "validation_failed":
        expected = "$.tasks[1]" if path == "$" else path.replace("$", "$.tasks[1]", 1)
        assert problem["errors"][0]["path"] == expected, problem
    assert pulse.submit_counts(sync_conn) == before


BATCH_CASES: list[tuple[str, bytes, dict[str, str], str, str | None]] = [
    ("no-tasks", b"{}", {}, "validation_failed", "$.tasks"),
    ("tasks-not-a-list", b'{"tasks": {"queue": "work"}}', {}, "validation_failed", "$.tasks"),
    ("empty", b'{"tasks": []}', {}, "validation_failed", "$.tasks"),
    ("501-items", json.dumps({"tasks": [OK] * 501}).encode(), {}, "validation_failed",
     "$.tasks"),
    ("key-header", json.dumps({"tasks": [OK]}).encode(), {"Idempotency-Key": "k"},
     "validation_failed", "Idempotency-Key"),
    ("repeated-key", json.dumps({"tasks": [
        {**OK, "idempotency_key": "a"}, {**OK, "idempotency_key": "b"},
        {**OK, "idempotency_key": "a"}]}).encode(), {}, "validation_failed",
     "$.tasks[2].idempotency_key"),
    ("key-too-long", json.dumps({"tasks": [OK, {**OK, "idempotency_key": "k" * 256}]}).encode(),
     {}, "validation_failed", "$.tasks[1].idempotency_key"),
    ("key-not-printable", json.dumps({"tasks": [{**OK, "idempotency_key": "a\nb"}]}).encode(),
     {}, "validation_failed", "$.tasks[0].idempotency_key"),
    ("unknown-top-field", json.dumps({"tasks": [OK], "atomic": True}).encode(), {},
     "validation_failed", "$"),
]


@pytest.mark.parametrize(("body", "extra", "code", "path"), [c[1:] for c in BATCH_CASES],
                         ids=[c[0] for c in BATCH_CASES])
async def test_a_bad_batch_is_a_problem_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, sync_conn: Any,
    body: bytes, extra: dict[str, str], code: str, path: str | None,
) -> None:
    before = pulse.submit_counts(sync_conn)
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/batch", data=body,
                              headers=_json_headers(tenant, **extra))
    problem = await assert_problem(response, 400, code)
    if path is not None:
        assert problem["errors"][0]["path"] == path, problem
    assert pulse.submit_counts(sync_conn) == before


@pytest.mark.parametrize("suffix", ["", "/batch"])
@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/json", "Idempotency-Key": "k" * 256}, 400,
         "validation_failed"),
    ],
    ids=["content-type", "long-key-header"],
)
async def test_bad_headers_are_problems(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, sync_conn: Any,
    suffix: str, headers: dict[str, str], status: int, code: str,
) -> None:
    before = pulse.submit_counts(sync_conn)
    body = json.dumps({"tasks": [OK]} if suffix else OK).encode()
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks{suffix}", data=body,
                              headers={**tenant.auth, **headers})
    await assert_problem(response, status, code)
    assert pulse.submit_counts(sync_conn) == before


async def test_an_unknown_query_parameter_on_submit_is_refused(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, sync_conn: Any,
) -> None:
    before = pulse.submit_counts(sync_conn)
    for suffix, body in (("", OK), ("/batch", {"tasks": [OK]})):
        response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks{suffix}?wait=1",
                                  json=body, headers=tenant.auth)
        problem = await assert_problem(response, 400, "validation_failed")
        assert problem["errors"][0]["path"] == "?wait"
    assert pulse.submit_counts(sync_conn) == before


# --- the read routes ----------------------------------------------------------------------------

VALID_ID = "0" * 32
LIST_CASES: list[tuple[str, str, str, str | None]] = [
    ("state-lowercase", "state=waiting", "validation_failed", "?state"),
    ("state-unknown", "state=DONE", "validation_failed", "?state"),
    ("queue-invalid", "queue=Bad%20Queue", "validation_failed", "?queue"),
    ("limit-zero", "limit=0", "validation_failed", "?limit"),
    ("limit-501", "limit=501", "validation_failed", "?limit"),
    ("limit-word", "limit=ten", "validation_failed", "?limit"),
    ("created-after-date", "created_after=2030-01-01", "validation_failed", "?created_after"),
    ("created-after-naive", "created_after=2030-01-01T00:00:00", "validation_failed",
     "?created_after"),
    ("created-before-plus-unencoded", "created_before=2030-01-01T00:00:00+08:00",
     "validation_failed", "?created_before"),
    ("business-key-empty", "business_key=", "validation_failed", "?business_key"),
    ("business-key-long", "business_key=" + "x" * 513, "validation_failed", "?business_key"),
    ("unknown", "sort=asc", "validation_failed", "?sort"),
    ("repeated", "state=WAITING&state=FAILED", "validation_failed", "?state"),
    ("cursor-garbage", "cursor=not-a-cursor", "invalid_cursor", None),
    ("cursor-of-another-list", "cursor=" + cursors.encode("namespaces", {}, ["x"]),
     "invalid_cursor", None),
    ("cursor-bad-position", "cursor=" + cursors.encode("tasks", {
        "queue": None, "state": None, "business_key": None, "created_after": None,
        "created_before": None}, ["yesterday", "00"]), "invalid_cursor", None),
]


@pytest.mark.parametrize(("query", "code", "path"), [c[1:] for c in LIST_CASES],
                         ids=[c[0] for c in LIST_CASES])
async def test_a_bad_list_query_is_a_problem(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, unchanged: None,
    query: str, code: str, path: str | None,
) -> None:
    response = await api.get(f"/v1/namespaces/{tenant.namespace}/tasks?{query}",
                             headers=tenant.auth)
    problem = await assert_problem(response, 400, code)
    if path is not None:
        assert problem["errors"][0]["path"] == path, problem


BAD_IDS = ["A" * 32, "0" * 31, "0" * 33, "z" * 32, "0" * 30 + "-1", "%20" + "0" * 29]
TASK_ROUTES = ["/{id}", "/{id}/attempts", "/{id}/events",
               f"/{{id}}/attempts/{VALID_ID}/evidence"]


@pytest.mark.parametrize("route", TASK_ROUTES)
@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_task_id_that_is_not_32_lowercase_hex_is_a_400(
    api: TestClient[Any, Any], tenant: Tenant, unchanged: None, route: str, bad: str,
) -> None:
    response = await api.get(f"/v1/namespaces/{tenant.namespace}/tasks" + route.format(id=bad),
                             headers=tenant.auth)
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"][0]["path"] == "{task_id}"


async def test_the_batch_path_is_not_a_task_id(
    api: TestClient[Any, Any], tenant: Tenant, unchanged: None,
) -> None:
    # GET …/tasks/batch is no route (the task-id route leaves "batch" to the batch resource):
    # a 405 whose Allow names exactly the documented method, as the OpenAPI document says.
    response = await api.get(f"/v1/namespaces/{tenant.namespace}/tasks/batch",
                             headers=tenant.auth)
    await assert_problem(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "POST"


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_an_attempt_id_that_is_not_32_lowercase_hex_is_a_400(
    api: TestClient[Any, Any], tenant: Tenant, unchanged: None, bad: str,
) -> None:
    response = await api.get(
        f"/v1/namespaces/{tenant.namespace}/tasks/{VALID_ID}/attempts/{bad}/evidence",
        headers=tenant.auth)
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"][0]["path"] == "{attempt_id}"


@pytest.mark.parametrize("route", TASK_ROUTES[1:])
@pytest.mark.parametrize(
    ("query", "code"),
    [("limit=0", "validation_failed"), ("cursor=%%%", "invalid_cursor"),
     ("cursor=" + cursors.encode("tasks.attempts", {"task_id": "1" * 32}, [1]),
      "invalid_cursor"),
     ("since=1", "validation_failed")],
)
async def test_bad_paging_on_a_tasks_lists_is_a_problem(
    api: TestClient[Any, Any], tenant: Tenant, unchanged: None, route: str, query: str,
    code: str,
) -> None:
    # The cursor belongs to another task: refused before the task is even looked up.
    response = await api.get(
        f"/v1/namespaces/{tenant.namespace}/tasks" + route.format(id=VALID_ID) + "?" + query,
        headers=tenant.auth)
    await assert_problem(response, 400, code)


async def test_the_detail_takes_no_query_parameters(
    api: TestClient[Any, Any], tenant: Tenant, unchanged: None,
) -> None:
    response = await api.get(f"/v1/namespaces/{tenant.namespace}/tasks/{VALID_ID}?full=1",
                             headers=tenant.auth)
    await assert_problem(response, 400, "validation_failed")


@pytest.mark.parametrize("route", TASK_ROUTES)
async def test_an_unknown_task_is_not_found(
    api: TestClient[Any, Any], tenant: Tenant, unchanged: None, route: str,
) -> None:
    response = await api.get(
        f"/v1/namespaces/{tenant.namespace}/tasks" + route.format(id=VALID_ID),
        headers=tenant.auth)
    await assert_problem(response, 404, "task_not_found")

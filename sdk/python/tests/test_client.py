"""The Client against a scripted fake API: problems → exceptions, retries, keys, pages."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from orbit_sdk import (
    Client,
    Conflict,
    ConnectionFailed,
    Forbidden,
    IdempotencyConflict,
    NotFound,
    OrbitError,
    QueueFull,
    QuotaExceeded,
    RawJson,
    RetryPolicy,
    ServerError,
    ServiceUnavailable,
    StaleRevision,
    TaskRequest,
    TooManyRequests,
    Unauthorized,
    ValidationError,
)

Reply = Callable[[web.Request, bytes], web.StreamResponse | None]


@attrs.define
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


class FakeApi:
    """Answers each request with the next scripted reply for its route (the last one repeats);
    a reply of ``None`` drops the connection without an answer."""

    def __init__(self) -> None:
        self.script: dict[str, list[Reply]] = {}
        self.seen: list[Seen] = []

    def on(self, method: str, path: str, *replies: Reply) -> None:
        self.script[f"{method} {path}"] = list(replies)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path, dict(request.query),
                              dict(request.headers), body))
        replies = self.script.get(f"{request.method} {request.path}")
        if not replies:
            return problem(404, "not_found")(request, body) or web.Response(status=500)
        reply = replies.pop(0) if len(replies) > 1 else replies[0]
        response = reply(request, body)
        if response is None:
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=204)  # never reaches the client
        return response


def problem(status: int, code: str, detail: str = "", **extra: Any) -> Reply:
    def reply(request: web.Request, body: bytes) -> web.StreamResponse:
        doc = {"type": f"/problems/{code}", "title": code, "status": status, "code": code,
               "detail": detail, "instance": request.path, **extra}
        return web.Response(status=status, text=json.dumps(doc),
                            content_type="application/problem+json",
                            headers={"X-Request-Id": "req-1"})
    return reply


def ok(doc: Any, status: int = 200) -> Reply:
    def reply(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response(doc, status=status)
    return reply


def drop() -> Reply:
    def reply(request: web.Request, body: bytes) -> None:
        return None
    return reply


RECEIPT = {"id": "ab" * 16, "queue": "emails", "handler": "send", "state": "WAITING",
           "priority": 0, "business_key": None, "created_at": "2030-01-02T03:04:05.000006+00:00",
           "available_at": "2030-01-02T03:04:05.000006+00:00", "deadline_at": None,
           "start_deadline_at": None, "rerun_safe": False, "revision": 1}
NS = "/v1/namespaces/team-a"


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, Client]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app)
    await server.start_server()
    client = Client(str(server.make_url("")), "key-123", "team-a", backoff_initial=0.001,
                    backoff_max=0.01, max_retries=3)
    yield fake, client
    await client.close()
    await server.close()


@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "validation_failed", ValidationError),
    (400, "invalid_cursor", OrbitError),
    (401, "invalid_credential", Unauthorized),
    (403, "forbidden", Forbidden),
    (404, "task_not_found", NotFound),
    (409, "idempotency_conflict", IdempotencyConflict),
    (409, "stale_revision", StaleRevision),
    (409, "already_exists", Conflict),
    (500, "internal_error", ServerError),
])
async def test_problem_documents_become_exceptions(
        api: tuple[FakeApi, Client], status: int, code: str, cls: type[OrbitError]) -> None:
    fake, client = api
    errors = [{"path": "$.name", "message": "too long"}]
    fake.on("GET", f"{NS}/tasks/{'cd' * 16}", problem(status, code, "it went wrong",
                                                      errors=errors))
    with pytest.raises(cls) as caught:
        await client.get_task("cd" * 16)
    exc = caught.value
    assert (exc.status, exc.code, exc.detail) == (status, code, "it went wrong")
    assert exc.errors == errors
    assert exc.request_id == "req-1"
    assert isinstance(exc, OrbitError)
    assert len(fake.seen) == 1, "an answered error is not retried"


async def test_a_body_that_is_not_a_problem_still_raises_by_status(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api

    def html(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(status=502, text="<html>bad gateway</html>")

    fake.on("GET", "/v1/whoami", html)
    with pytest.raises(ServerError) as caught:
        await client.whoami()
    assert caught.value.status == 502
    assert "bad gateway" in caught.value.detail


async def test_submit_reuses_its_generated_idempotency_key_across_retries(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", drop(), problem(503, "commit_outcome_unknown"),
            ok(RECEIPT, 201))
    task = await client.submit("emails", "send", {"to": "a@example.com"}, priority=3)
    assert task.id == RECEIPT["id"]
    assert task.state == "WAITING"
    keys = [s.headers.get("Idempotency-Key") for s in fake.seen]
    assert len(keys) == 3
    assert keys[0] is not None
    assert len(set(keys)) == 1, "one key for the submit, re-sent on every retry"
    assert len({s.body for s in fake.seen}) == 1
    assert json.loads(fake.seen[0].body) == {"queue": "emails", "handler": "send",
                                             "input": {"to": "a@example.com"}, "priority": 3}
    assert fake.seen[0].headers["Authorization"] == "Bearer key-123"


async def test_each_submit_gets_its_own_key_and_a_caller_key_is_kept(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok(RECEIPT, 201))
    await client.submit("emails", "send", {})
    await client.submit("emails", "send", {})
    await client.submit("emails", "send", {}, idempotency_key="order-42")
    keys = [s.headers["Idempotency-Key"] for s in fake.seen]
    assert keys[0] != keys[1]
    assert keys[2] == "order-42"


async def test_retries_are_bounded(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", problem(503, "database_unavailable"))
    with pytest.raises(ServiceUnavailable):
        await client.submit("emails", "send", {})
    assert len(fake.seen) == 4, "one try and max_retries=3 retries"


async def test_calls_without_a_key_are_not_retried(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("PATCH", f"{NS}/queues/emails", drop())
    with pytest.raises(ConnectionFailed):
        await client.update_queue("emails", revision=3, description="x")
    assert len(fake.seen) == 1
    assert json.loads(fake.seen[0].body) == {"revision": 3, "description": "x"}


async def test_gets_are_retried_after_503(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    queue = {"id": "ef" * 16, "name": "emails", "revision": 2, "paused": True,
             "gate": {"state": "PAUSED", "control_revision": 2, "reason": "maintenance"},
             "retry": {"max_attempts": 3, "initial_ms": 1000, "max_ms": 60000,
                       "multiplier": 2, "jitter": 0.2}}
    fake.on("GET", f"{NS}/queues/emails", problem(503, "service_unavailable"), ok(queue))
    got = await client.get_queue("emails")
    assert (got.name, got.revision, got.paused, got.gate_state) == ("emails", 2, True, "PAUSED")
    assert (got.retry.multiplier, got.retry.jitter) == (Decimal("2"), Decimal("0.2"))
    assert len(fake.seen) == 2


async def test_retry_policy_decimals_travel_as_exact_numbers(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok(RECEIPT, 201))
    fake.on("POST", f"{NS}/queues", ok({"name": "emails", "retry": {"multiplier": 1.5}}, 201))
    await client.submit("emails", "send", {},
                        retry=RetryPolicy(max_attempts=4, multiplier="1.5", jitter=0.25))
    created = await client.create_queue("emails", retry=RetryPolicy(multiplier=Decimal("1.5")))
    assert created.retry.multiplier == Decimal("1.5")
    submitted, queue = (s.body for s in fake.seen)
    assert b'"retry":{"max_attempts":4,"multiplier":1.5,"jitter":0.25}' in submitted
    assert b'"retry":{"multiplier":1.5}' in queue


async def test_queue_pause_and_resume_send_their_reasons(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    view = {"id": "ef" * 16, "name": "emails", "revision": 2, "paused": True,
            "gate": {"state": "PAUSED", "control_revision": 2, "reason": "maintenance"}}
    fake.on("POST", f"{NS}/queues/emails/pause", ok(view))
    fake.on("POST", f"{NS}/queues/emails/resume", ok({**view, "paused": False}))
    assert (await client.pause_queue("emails", "maintenance")).paused is True
    assert (await client.resume_queue("emails", "maintenance done")).paused is False
    assert [json.loads(s.body) for s in fake.seen] == [
        {"reason": "maintenance"}, {"reason": "maintenance done"}]


async def test_batch_items_carry_keys_kept_across_retries(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks/batch", drop(),
            ok({"tasks": [{**RECEIPT, "replayed": True}, RECEIPT]}, 201))
    receipts = await client.submit_batch([
        TaskRequest(queue="emails", handler="send", input=1, idempotency_key="mine"),
        TaskRequest(queue="emails", handler="send", input=2, rerun_safe=True),
    ])
    assert [r.replayed for r in receipts] == [True, False]
    first, second = (json.loads(s.body) for s in fake.seen)
    assert first == second
    assert first["tasks"][0]["idempotency_key"] == "mine"
    assert first["tasks"][1]["idempotency_key"].startswith("sdk-")
    assert first["tasks"][1]["rerun_safe"] is True
    assert "Idempotency-Key" not in fake.seen[0].headers


async def test_raw_json_input_is_sent_byte_exact(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok(RECEIPT, 201))
    await client.submit("emails", "send", RawJson('{"amount": 12345678901234567890.123456789}'))
    await client.submit("emails", "send", {"amount": Decimal("0.10000000000000000001")})
    assert b'"input":{"amount": 12345678901234567890.123456789}' in fake.seen[0].body
    assert b'"input":{"amount":0.10000000000000000001}' in fake.seen[1].body


async def test_list_tasks_follows_cursors_through_short_pages(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    pages = iter([
        {"items": [{**RECEIPT, "id": "01" * 16}], "next_cursor": "c1"},
        {"items": [], "next_cursor": "c2"},
        {"items": [{**RECEIPT, "id": "02" * 16}], "next_cursor": None},
    ])

    def page(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response(next(pages))

    fake.on("GET", f"{NS}/tasks", page)
    ids = [t.id async for t in client.list_tasks(queue="emails", state="FAILED",
                                                 page_size=1)]
    assert ids == ["01" * 16, "02" * 16]
    assert [s.query.get("cursor") for s in fake.seen] == [None, "c1", "c2"]
    assert all(s.query["queue"] == "emails" and s.query["state"] == "FAILED"
               for s in fake.seen)


async def test_interventions_send_their_fields_and_keys(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    task = "ab" * 16
    fake.on("POST", f"{NS}/tasks/{task}/cancel", ok({**RECEIPT, "state": "CANCELLED"}))
    fake.on("POST", f"{NS}/tasks/{task}/review", ok({**RECEIPT, "state": "SUCCEEDED"}))
    fake.on("POST", f"{NS}/tasks/{task}/retry", ok({**RECEIPT, "retry_of": task}, 201))
    assert (await client.cancel_task(task, "not needed")).state == "CANCELLED"
    reviewed = await client.review_task(task, "succeeded", "checked the ledger",
                                        evidence_ref="TICKET-7", execution_ended=True,
                                        revision=4, result={"paid": True})
    assert reviewed.state == "SUCCEEDED"
    assert (await client.retry_task(task, "fixed the bug")).retry_of == task
    bodies = [json.loads(s.body) for s in fake.seen]
    assert bodies == [
        {"reason": "not needed"},
        {"decision": "succeeded", "reason": "checked the ledger", "evidence_ref": "TICKET-7",
         "execution_ended": True, "revision": 4, "result": {"paid": True}},
        {"reason": "fixed the bug", "rerun_confirmed": True},
    ]
    assert all(s.headers.get("Idempotency-Key") for s in fake.seen)


# --- flow control --------------------------------------------------------------------------------


def too_many(code: str, retry_after: str | None = "3", **extra: Any) -> Reply:
    def reply(request: web.Request, body: bytes) -> web.StreamResponse:
        doc = {"type": f"/problems/{code}", "title": code, "status": 429, "code": code,
               "detail": "full", "retry_after_s": 2, **extra}
        headers = {} if retry_after is None else {"Retry-After": retry_after}
        return web.Response(status=429, text=json.dumps(doc), headers=headers,
                            content_type="application/problem+json")
    return reply


@pytest.mark.parametrize(("code", "cls"), [
    ("queue_full", QueueFull),
    ("application_quota_exceeded", QuotaExceeded),
    ("too_many_requests", TooManyRequests),
])
async def test_a_refusal_by_a_limit_is_typed_carries_retry_after_and_is_not_retried(
        api: tuple[FakeApi, Client], code: str, cls: type[TooManyRequests]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", too_many(code, limit=100, unfinished=100))
    with pytest.raises(cls) as caught:
        await client.submit("emails", "send", {})
    exc = caught.value
    assert isinstance(exc, TooManyRequests)
    assert (exc.status, exc.code, exc.retry_after, exc.limit) == (429, code, 3.0, 100)
    assert len(fake.seen) == 1, "backpressure is the caller's to handle"


async def test_retry_after_falls_back_to_the_problem_document(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks/batch", too_many("queue_full", retry_after=None))
    with pytest.raises(QueueFull) as caught:
        await client.submit_batch([TaskRequest(queue="emails", handler="send")])
    assert caught.value.retry_after == 2.0
    assert caught.value.limit is None


async def test_queue_limits_and_usage(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    view = {"id": "ef" * 16, "name": "emails", "revision": 4, "max_concurrent_attempts": None,
            "max_unfinished_tasks": 1000, "max_starts_per_second": 50, "active_attempts": 3,
            "paused": False, "gate": {"state": "OPEN", "control_revision": 1, "reason": None}}
    usage = {"measured_at": "2030-01-02T03:04:05.000006+00:00", "unfinished_tasks": 12,
             "active_attempts": 3, "starts_in_window": 7,
             "start_window_until": "2030-01-02T03:04:05.500000+00:00", "waiting_tasks": 9,
             "oldest_waiting_age_ms": 1532}
    fake.on("GET", f"{NS}/queues/emails", ok({**view, "usage": usage}))
    fake.on("POST", f"{NS}/queues", ok(view, 201))
    fake.on("PATCH", f"{NS}/queues/emails", ok({**view, "revision": 5}))
    got = await client.get_queue("emails")
    assert (got.max_unfinished_tasks, got.max_starts_per_second) == (1000, 50)
    assert got.usage is not None
    assert (got.usage.unfinished_tasks, got.usage.waiting_tasks, got.usage.starts_in_window,
            got.usage.oldest_waiting_age_ms) == (12, 9, 7, 1532)
    assert got.usage.oldest_waiting_age.total_seconds() == 1.532
    assert got.usage.measured_at is not None
    assert got.usage.start_window_until is not None

    created = await client.create_queue("emails", max_unfinished_tasks=1000,
                                        max_starts_per_second=50)
    assert created.usage is None
    await client.update_queue("emails", revision=4, max_unfinished_tasks=None,
                              max_starts_per_second=10)
    await client.update_queue("emails", revision=5, description="only this")
    _, create_body, patch_body, plain_body = (json.loads(s.body or b"null") for s in fake.seen)
    assert create_body == {"name": "emails", "max_unfinished_tasks": 1000,
                           "max_starts_per_second": 50}
    assert patch_body == {"revision": 4, "max_unfinished_tasks": None,
                          "max_starts_per_second": 10}
    assert plain_body == {"revision": 5, "description": "only this"}


RESOURCES = {"application": "shop", "application_id": "aa" * 16, "revision": 3,
             "max_unfinished_tasks": 5000, "max_active_attempts": None,
             "max_reserved_attempts": 100, "max_starts_per_second": None,
             "usage": {"measured_at": "2030-01-02T03:04:05.000006+00:00",
                       "unfinished_tasks": 42, "active_attempts": 7, "reserved_attempts": 2,
                       "starts_in_window": 0, "start_window_until": None},
             "updated_at": "2030-01-01T00:00:00.000000+00:00"}


async def test_application_resources(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    path = "/v1/applications/shop/resources"
    fake.on("GET", "/v1/whoami", ok({"application": {"id": "aa" * 16, "name": "shop"},
                                     "credential": {}, "grants": [], "namespaces": []}))
    fake.on("GET", path, ok(RESOURCES))
    fake.on("PATCH", path, ok({**RESOURCES, "revision": 4, "max_unfinished_tasks": None}))
    got = await client.get_application_resources()
    assert (got.application, got.revision, got.max_unfinished_tasks,
            got.max_reserved_attempts, got.max_active_attempts) == ("shop", 3, 5000, 100, None)
    assert (got.unfinished_tasks, got.active_attempts, got.reserved_attempts) == (42, 7, 2)
    assert [s.path for s in fake.seen] == ["/v1/whoami", path]

    changed = await client.update_application_resources(
        "shop", revision=3, max_unfinished_tasks=None, max_active_attempts=20,
        reason="INC-9")
    assert (changed.revision, changed.max_unfinished_tasks) == (4, None)
    assert json.loads(fake.seen[-1].body) == {"revision": 3, "max_unfinished_tasks": None,
                                              "max_active_attempts": 20, "reason": "INC-9"}
    assert "Idempotency-Key" not in fake.seen[-1].headers


async def test_a_stale_revision_on_application_resources_is_not_retried(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("PATCH", "/v1/applications/shop/resources", problem(409, "stale_revision"))
    with pytest.raises(StaleRevision):
        await client.update_application_resources("shop", revision=1, max_active_attempts=1)
    assert len(fake.seen) == 1


async def test_concurrency_keys_are_sent_and_read_back(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/tasks", ok({**RECEIPT, "concurrency_key": "账户:42"}, 201))
    fake.on("POST", f"{NS}/tasks/batch", ok({"tasks": [RECEIPT]}, 201))
    fake.on("GET", f"{NS}/tasks/{'ab' * 16}/attempts", ok({"items": [
        {"id": "cd" * 16, "generation": 1, "state": "RUNNING", "concurrency_token": 9},
        {"id": "ce" * 16, "generation": 2, "state": "OFFERED", "concurrency_token": None}],
        "next_cursor": None}))
    task = await client.submit("emails", "send", {}, concurrency_key="账户:42")
    assert task.concurrency_key == "账户:42"
    await client.submit_batch([TaskRequest(queue="emails", handler="send",
                                           concurrency_key="k")])
    assert json.loads(fake.seen[0].body)["concurrency_key"] == "账户:42"
    assert json.loads(fake.seen[1].body)["tasks"][0]["concurrency_key"] == "k"
    attempts = await client.task_attempts("ab" * 16)
    assert [a.concurrency_token for a in attempts] == [9, None]


@pytest.mark.parametrize(("doc", "expected"), [
    ({"kind": "submitted"}, {"kind": "submitted"}),
    ({"kind": "retry", "retry_of": "ab" * 16}, {"kind": "retry", "retry_of": "ab" * 16}),
    ({"kind": "schedule", "schedule_id": "cd" * 16, "schedule_name": "nightly", "version": 3,
      "occurrence_id": "ef" * 16, "fire_at": "2030-01-02T09:00:00.000000+00:00"},
     {"kind": "schedule", "schedule_id": "cd" * 16, "schedule_name": "nightly", "version": 3,
      "occurrence_id": "ef" * 16,
      "fire_at": dt.datetime(2030, 1, 2, 9, tzinfo=dt.UTC)}),
    ({"kind": "workflow", "workflow_id": "01" * 16}, {"kind": "workflow",
                                                      "workflow_id": "01" * 16}),
], ids=["submitted", "retry", "schedule", "workflow"])
async def test_task_source_reads_each_kind(
        api: tuple[FakeApi, Client], doc: dict[str, Any], expected: dict[str, Any]) -> None:
    fake, client = api
    fake.on("GET", f"{NS}/tasks/{'cd' * 16}/source", ok(doc))
    found = await client.task_source("cd" * 16)
    fields = ("kind", "retry_of", "schedule_id", "schedule_name", "version", "occurrence_id",
              "fire_at", "workflow_id")
    assert {f: getattr(found, f) for f in fields} == {f: expected.get(f) for f in fields}
    assert found.raw == doc
    assert fake.seen[-1].method == "GET"


async def test_a_missing_source_link_is_a_conflict(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("GET", f"{NS}/tasks/{'cd' * 16}/source",
            problem(409, "source_link_missing", "its schedule is gone"))
    with pytest.raises(Conflict) as caught:
        await client.task_source("cd" * 16)
    assert caught.value.code == "source_link_missing"

"""The workflow calls of the Client against a scripted fake API: bodies, keys, retries, pages,
errors and the DTOs read from the answers (the real API: tests/integration/api/
test_workflows_api.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_client import FakeApi, drop, ok, problem

from orbit_sdk import (
    Client,
    RawJson,
    ValidationError,
    WorkflowDefinition,
    WorkflowInstance,
    WorkflowWait,
)

NS = "/v1/namespaces/team-a"
T0 = "2030-01-02T03:04:05.000006+00:00"
DOCUMENT = {"format": "orbit.weave/1", "start": "done", "steps": {"done": {"kind": "SUCCEED"}}}
VERSION = {"version": 1, "digest": "ab" * 32, "document": None, "created_by": "cd" * 16,
           "created_at": T0}
DEFINITION = {"id": "ef" * 16, "name": "orders", "description": "", "revision": 2,
              "latest_version": 1, "created_at": T0, "updated_at": T0, "versions": [VERSION],
              "published_version": 1}
INSTANCE = {"id": "12" * 16, "definition": "orders", "version": 1, "version_digest": "ab" * 32,
            "state": "RUNNING", "revision": 1, "business_key": "o-1", "input": {"n": 1},
            "output": None, "error": None, "created_at": T0, "updated_at": T0,
            "completed_at": None,
            "steps": [{"id": "34" * 16, "name": "a", "kind": "TASK", "state": "RUNNING",
                       "revision": 1, "output": None, "error": None, "created_at": T0,
                       "updated_at": T0,
                       "activations": [{"id": "56" * 16, "sequence": 1, "state": "LIVE",
                                        "task_id": "78" * 16, "created_at": T0,
                                        "ended_at": None, "task_state": "SUCCEEDED",
                                        "result": "recorded"}]}]}


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


def sent(fake: FakeApi, index: int = 0) -> Any:
    return json.loads(fake.seen[index].body)


async def test_publish_sends_the_document_and_keeps_its_key_across_retries(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/workflow-definitions/orders/versions", drop(),
            problem(503, "commit_outcome_unknown"), ok(DEFINITION, 201))
    out = await client.publish_workflow_version("orders", DOCUMENT, revision=1)
    assert isinstance(out, WorkflowDefinition)
    assert (out.published_version, out.latest_version, out.versions[0].digest) == (
        1, 1, "ab" * 32)
    assert len(fake.seen) == 3
    assert len({s.headers["Idempotency-Key"] for s in fake.seen}) == 1
    assert sent(fake) == {"revision": 1, "document": DOCUMENT}


async def test_validate_is_retried_and_reports_each_path(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    errors = [{"path": "$.document.start", "code": "missing_target", "message": "no step"}]
    fake.on("POST", f"{NS}/workflow-validations", drop(),
            problem(400, "definition_invalid", "bad", errors=errors))
    with pytest.raises(ValidationError) as caught:
        await client.validate_workflow_definition(DOCUMENT)
    assert caught.value.code == "definition_invalid"
    assert caught.value.errors == errors
    assert len(fake.seen) == 2, "a validation writes nothing: a lost answer is retried"
    assert "Idempotency-Key" not in fake.seen[0].headers


async def test_start_sends_the_input_byte_exact_and_reads_the_detail(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/workflows", ok(INSTANCE, 201))
    fake.on("GET", f"{NS}/workflows/{'12' * 16}", ok(INSTANCE))
    started = await client.start_workflow("orders", RawJson('{"n": 1.10}'), version=1,
                                          business_key="o-1", idempotency_key="w-1")
    assert fake.seen[0].headers["Idempotency-Key"] == "w-1"
    assert b'"input":{"n": 1.10}' in fake.seen[0].body
    assert json.loads(fake.seen[0].body)["version"] == 1
    detail = await client.get_workflow(started.id)
    assert isinstance(detail, WorkflowInstance)
    (step,) = detail.steps
    (activation,) = step.activations
    assert (activation.task_state, activation.result) == ("SUCCEEDED", "recorded")
    assert not detail.finished


async def test_list_follows_cursors_with_the_filters(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    item = {k: v for k, v in INSTANCE.items() if k != "steps"}
    fake.on("GET", f"{NS}/workflows", ok({"items": [item], "next_cursor": "c1"}),
            ok({"items": [], "next_cursor": None}))
    found = [w async for w in client.list_workflows(definition="orders", state="RUNNING",
                                                   created_from=T0, page_size=1)]
    assert [w.id for w in found] == ["12" * 16]
    assert fake.seen[0].query == {"definition": "orders", "state": "RUNNING",
                                  "created_from": T0, "limit": "1"}
    assert fake.seen[1].query["cursor"] == "c1"


WAIT = {"id": "9a" * 16, "step": "pay_by", "step_id": "34" * 16, "activation_id": "56" * 16,
        "activation_sequence": 1, "kind": "SIGNAL", "state": "WAITING", "generation": 1,
        "first_deadline_at": T0, "deadline_at": T0, "signal_name": "paid",
        "correlation_key": "/wBv", "correlation_key_encoding": "base64",
        "payload_versions": [1, 2], "winner_signal_id": None, "fired_at": None,
        "late_ms": None, "created_at": T0, "updated_at": T0, "future_field": 1}


async def test_waits_are_read_and_retried(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("GET", f"{NS}/workflows/{'12' * 16}/waits", drop(), ok({"items": [WAIT]}))
    (wait,) = await client.list_workflow_waits("12" * 16)
    assert isinstance(wait, WorkflowWait)
    assert (wait.kind, wait.state, wait.step, wait.signal_name, wait.payload_versions,
            wait.correlation_key, wait.correlation_key_encoding, wait.late_ms) == (
        "SIGNAL", "WAITING", "pay_by", "paid", (1, 2), "/wBv", "base64", None)
    assert wait.first_deadline_at == wait.deadline_at
    assert wait.first_deadline_at is not None
    assert wait.first_deadline_at.isoformat() == T0
    assert wait.raw["future_field"] == 1  # kept, not refused
    assert len(fake.seen) == 2, "a read is retried"


async def test_a_steps_waits_are_read_from_the_detail(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    timer = {**WAIT, "kind": "TIMER", "state": "FIRED", "signal_name": None,
             "correlation_key": None, "correlation_key_encoding": None,
             "payload_versions": None, "fired_at": T0, "late_ms": 31402}
    detail = json.loads(json.dumps(INSTANCE))
    detail["steps"][0].update(kind="TIMER", waits=[timer])
    fake.on("GET", f"{NS}/workflows/{'12' * 16}", ok(detail))
    (step,) = (await client.get_workflow("12" * 16)).steps
    (wait,) = step.waits
    assert (wait.kind, wait.state, wait.late_ms, wait.payload_versions) == (
        "TIMER", "FIRED", 31402, None)


WORKFLOW_TASK = {"task_id": "7a" * 16, "queue": "payments", "handler": "payments.status",
                 "state": "RUNNING", "retry_of": None, "created_at": T0, "completed_at": None,
                 "verified": True, "step": "settle", "step_kind": "POLL",
                 "activation_id": "56" * 16, "activation_sequence": 1,
                 "activation_state": "LIVE", "round": 3}


async def test_an_instances_tasks_follow_cursors(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    broken = {**WORKFLOW_TASK, "task_id": "7b" * 16, "verified": False, "step": None,
              "step_kind": None, "activation_id": None, "activation_sequence": None,
              "activation_state": None, "round": None}
    fake.on("GET", f"{NS}/workflows/{'12' * 16}/tasks",
            ok({"items": [WORKFLOW_TASK], "next_cursor": "c1"}),
            ok({"items": [broken], "next_cursor": None}))
    found = [t async for t in client.list_workflow_tasks("12" * 16, page_size=1)]
    assert [(t.task_id, t.step, t.step_kind, t.activation_sequence, t.round, t.verified)
            for t in found] == [("7a" * 16, "settle", "POLL", 1, 3, True),
                                ("7b" * 16, None, None, None, None, False)]
    assert fake.seen[0].query == {"limit": "1"}
    assert fake.seen[1].query["cursor"] == "c1"


async def test_a_tasks_detail_carries_its_source(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    task = {"id": "7a" * 16, "queue": "payments", "handler": "payments.status",
            "state": "RUNNING", "revision": 2}
    fake.on("GET", f"{NS}/tasks/{'7a' * 16}", ok({**task, "source": {
        "kind": "workflow", "workflow_id": "12" * 16, "definition": "payment", "version": 1,
        "step": "settle", "activation": "56" * 16, "sequence": 1, "round": 3,
        "retry_of": None, "verified": True, "problem": None}}),
        ok({**task, "source": {"kind": "workflow", "workflow_id": "12" * 16, "retry_of": None,
                               "verified": False, "problem": "no workflow activation"}}))
    shown = (await client.get_task("7a" * 16)).source
    assert shown is not None
    assert (shown.kind, shown.workflow_id, shown.step, shown.round, shown.verified) == (
        "workflow", "12" * 16, "settle", 3, True)
    broken = (await client.get_task("7a" * 16)).source
    assert broken is not None
    assert (broken.verified, broken.problem, broken.step) == (False, "no workflow activation",
                                                              None)

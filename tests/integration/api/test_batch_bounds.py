"""A submission's work is bounded before it is done (issue 11 §1).

The path is authorized before the body is read; a batch of more than 500 items is refused while
its array is read (no item is materialised past the 501st, none is validated); a refused request
answers with a problem document of bounded size. Work is counted, not timed: the number of full
parses and of item validations.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.errors import MAX_LISTED_ERRORS
from orbit_common.model import jsondoc
from orbit_common.pulse import tasks
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.support import pulse

HUGE = b'{"tasks": [' + b",".join([b"{}"] * 100_000) + b"]}"


class Work:
    """Counts the full parses of a body and the item validations of a request: spies that call
    the real functions (the request runs against the real database), only counting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.parses = self.validated = 0
        parse, validate = jsondoc.loads_strict, tasks.validate

        def counting_parse(data: Any, *args: Any, **kwargs: Any) -> Any:
            if len(data) > 1000:  # a request body (not a credential's grants)
                self.parses += 1
            return parse(data, *args, **kwargs)

        def counting_validate(*args: Any, **kwargs: Any) -> Any:
            self.validated += 1
            return validate(*args, **kwargs)

        monkeypatch.setattr(jsondoc, "loads_strict", counting_parse)
        monkeypatch.setattr(tasks, "validate", counting_validate)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    return Work(monkeypatch)


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}


async def test_an_oversized_batch_is_refused_before_its_items_are_built(
    api: TestClient[Any, Any], tenant: Tenant, work: Work,
) -> None:
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/batch", data=HUGE,
                              headers=_headers(tenant.api_key))
    text = await response.text()
    assert len(text) < 1024, len(text)
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"] == [{"path": "$.tasks", "message": "1-500 items"}]
    assert (work.parses, work.validated) == (0, 0)


async def test_the_problems_of_a_batch_are_listed_up_to_a_bound(
    api: TestClient[Any, Any], db: Database, tenant: Tenant,
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "work")
    bad = {"queue": "work", "handler": "h", "priority": 10**6, "delay_ms": -1,
           "deadline_ms": -1}
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/batch",
                              data=json.dumps({"tasks": [bad] * 500}).encode(),
                              headers=_headers(tenant.api_key))
    text = await response.text()
    problem = await assert_problem(response, 400, "validation_failed")
    assert len(problem["errors"]) == MAX_LISTED_ERRORS
    assert problem["errors"][0]["path"].startswith("$.tasks[0].")
    assert problem["errors_omitted"] >= 500 * 3 - MAX_LISTED_ERRORS
    assert len(text) < 16 * 1024, len(text)


async def test_a_caller_that_may_not_submit_is_refused_before_the_body_is_parsed(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, work: Work,
) -> None:
    reader = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["tasks.read"]}])
    stranger = await make_tenant(db)
    ns = f"/v1/namespaces/{tenant.namespace}"
    for api_key, status, code in ((reader, 403, "forbidden"),
                                  (stranger.api_key, 404, "namespace_not_found")):
        for path in (f"{ns}/tasks/batch", f"{ns}/tasks"):
            response = await api.post(path, data=HUGE, headers=_headers(api_key))
            await assert_problem(response, status, code)
    assert (work.parses, work.validated) == (0, 0)
    # A caller that may submit to some queue only still gets the body parsed (the queue is in
    # the body) and the per-queue answer.
    scoped = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["tasks.submit"],
                                          "queues": ["other"]}])
    await pulse.create_queue(db, tenant.namespace_id, "work")
    response = await api.post(f"{ns}/tasks", json={"queue": "work", "handler": "h",
                                                      "input": {"pad": "x" * 2000}},
                              headers={"Authorization": f"Bearer {scoped}"})
    await assert_problem(response, 404, "queue_not_found")
    assert work.parses > 0

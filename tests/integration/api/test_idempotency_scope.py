"""Authorization before every idempotency replay (issue 11 §3).

A key limited to one queue that sends another caller's ``Idempotency-Key`` for an object of
another queue gets the answer it gets without the key (404, or 403 when it can see the object):
never the original receipt, never an ``idempotency_conflict`` that confirms the object exists.
"""

from __future__ import annotations

import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.support import pulse
from tests.support.lease_fixtures import add_tasks, make_queue

TABLES = ("pulse_schedules", "pulse_schedule_occurrences", "pulse_tasks", "orbit_events",
          "orbit_audit_events", "orbit_idempotency_keys")


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, TABLES)


def _headers(api_key: str, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
            "Idempotency-Key": key}


async def _post(api: TestClient[Any, Any], path: str, api_key: str, key: str | None,
                body: dict[str, Any] | None = None) -> Any:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return await api.post(path, headers=headers,
                          data=None if body is None else json.dumps(body).encode())


async def test_schedule_replays_stay_inside_the_queue_scope(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, watch: WriteWatch,
) -> None:
    for name in ("qa1", "qa2"):
        await pulse.create_queue(db, tenant.namespace_id, name)
    owner = tenant.auth["Authorization"].removeprefix("Bearer ")
    base = f"/v1/namespaces/{tenant.namespace}/schedules"
    created = await _post(api, base, owner, None, {
        "name": "sa2", "queue": "qa2", "rule": {"cron": "0 9 * * *", "timezone": "UTC"},
        "template": {"handler": "h"}})
    assert created.status == 201, await created.text()
    first = await _post(api, f"{base}/sa2/trigger", owner, "victim-trigger")
    assert first.status == 201
    paused = await _post(api, f"{base}/sa2/pause", owner, "victim-pause", {"reason": "r"})
    assert paused.status == 200

    hidden = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"],
                                          "queues": ["qa1"]}])
    seeing = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["schedules.read"]},
        {"namespaces": ["*"], "actions": ["*"], "queues": ["qa1"]}])
    watch.reset()
    for api_key, status, code in ((hidden, 404, "schedule_not_found"),
                                  (seeing, 403, "forbidden")):
        for path, key, body in (
            ("trigger", "victim-trigger", None),       # the same request: a replay today
            ("trigger", "victim-pause", None),         # another request: a conflict today
            ("pause", "victim-pause", {"reason": "r"}),
            ("pause", "victim-pause", {"reason": "other"}),
            ("resume", "victim-pause", {"reason": "r"}),
            ("versions", "victim-trigger", {"revision": 1, "rule": {"interval_ms": 1000},
                                            "template": {"handler": "h"}}),
            ("backfill", "victim-trigger", {"start": "2020-01-01T00:00:00Z",
                                            "end": "2020-01-02T00:00:00Z", "reason": "r"}),
        ):
            for idem in (key, None):  # with the key exactly as without it
                response = await _post(api, f"{base}/sa2/{path}", api_key, idem, body)
                await assert_problem(response, status, code)
    watch.assert_unchanged()


async def test_task_intervention_replays_stay_inside_the_queue_scope(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, watch: WriteWatch,
) -> None:
    await make_queue(db, tenant, name="qa1")
    qa2 = await make_queue(db, tenant, name="qa2")
    (task_id,) = await add_tasks(db, tenant, qa2)
    owner = tenant.auth["Authorization"].removeprefix("Bearer ")
    base = f"/v1/namespaces/{tenant.namespace}/tasks/{task_id.hex()}"
    cancelled = await _post(api, f"{base}/cancel", owner, "victim-cancel", {"reason": "r"})
    assert cancelled.status == 200
    retried = await _post(api, f"{base}/retry", owner, "victim-retry",
                          {"reason": "r", "rerun_confirmed": True})
    assert retried.status == 201

    hidden = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"],
                                          "queues": ["qa1"]}])
    seeing = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["tasks.read"]},
        {"namespaces": ["*"], "actions": ["*"], "queues": ["qa1"]}])
    watch.reset()
    for api_key, status, code in ((hidden, 404, "task_not_found"), (seeing, 403, "forbidden")):
        for path, key, body in (
            ("cancel", "victim-cancel", {"reason": "r"}),
            ("cancel", "victim-cancel", {"reason": "other"}),
            ("retry", "victim-retry", {"reason": "r", "rerun_confirmed": True}),
            ("retry", "victim-retry", {"reason": "other", "rerun_confirmed": True}),
            ("review", "victim-cancel", {"decision": "failed", "reason": "r",
                                         "evidence_ref": "e", "execution_ended": True,
                                         "revision": 1}),
        ):
            for idem in (key, None):
                response = await _post(api, f"{base}/{path}", api_key, idem, body)
                await assert_problem(response, status, code)
    watch.assert_unchanged()


async def test_submission_replays_stay_inside_the_queue_scope(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, watch: WriteWatch,
) -> None:
    """Submissions already authorized every queue before their replays; kept so."""
    await make_queue(db, tenant, name="qa1")
    await make_queue(db, tenant, name="qa2")
    owner = tenant.auth["Authorization"].removeprefix("Bearer ")
    base = f"/v1/namespaces/{tenant.namespace}/tasks"
    item = {"queue": "qa2", "handler": "h"}
    assert (await _post(api, base, owner, "victim-submit", item)).status == 201
    assert (await _post(api, f"{base}/batch", owner, None,
                        {"tasks": [{**item, "idempotency_key": "victim-item"}]})).status == 201
    hidden = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"],
                                          "queues": ["qa1"]}])
    watch.reset()
    for body in (item, {**item, "handler": "other"}):
        for key in ("victim-submit", None):
            await assert_problem(await _post(api, base, hidden, key, body), 404,
                                 "queue_not_found")
        for key in ("victim-item", "victim-submit"):
            response = await _post(api, f"{base}/batch", hidden, None,
                                   {"tasks": [{**body, "idempotency_key": key}]})
            await assert_problem(response, 404, "queue_not_found")
    watch.assert_unchanged()

"""GET /v1/namespaces/{namespace}/tasks/{task_id}/source: a task's direct source.

Each kind from the real path that makes it: a client's submission, a manual retry, a schedule's
rule fire and trigger, a workflow-owned task (owner, gate and activation as the engine writes
them). Authorization is the task detail's: another tenant's task,
or one of a queue the credential may not read, is 404 with nothing about it. A link that should
exist but does not is 409 ``source_link_missing``, never a plain submission.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, Conflict, NotFound

from orbit_common.db.pool import Database
from orbit_common.model import ids
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.test_schedule_firing import fire_until_idle, make_schedule
from tests.integration.weave.test_inbox import workflow_task
from tests.support import pulse

QUEUE = "work"


def url(tenant: Tenant, task_id: str, suffix: str = "/source") -> str:
    return f"/v1/namespaces/{tenant.namespace}/tasks/{task_id}{suffix}"


async def source(api: TestClient[Any, Any], tenant: Tenant, task_id: str,
                 auth: dict[str, str] | None = None) -> dict[str, Any]:
    response = await api.get(url(tenant, task_id), headers=auth or tenant.auth)
    text = await response.text()
    assert response.status == 200, text
    body: dict[str, Any] = json.loads(text)
    return body


async def submit(api: TestClient[Any, Any], tenant: Tenant, queue: str = QUEUE) -> str:
    response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks",
                              json={"queue": queue, "handler": "h"}, headers=tenant.auth)
    assert response.status == 201, await response.text()
    task_id: str = (await response.json())["id"]
    return task_id


def execute(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


@pytest.fixture
async def queue_id(db: Database, tenant: Tenant) -> bytes:
    return await pulse.create_queue(db, tenant.namespace_id, QUEUE)


async def _failed_then_retried(api: TestClient[Any, Any], tenant: Tenant,
                               sync_conn: pymysql.connections.Connection[Any]) -> tuple[str, str]:
    original = await submit(api, tenant)
    # Ended behind the API's back (the dispatcher's job), then retried through the API.
    execute(sync_conn, "UPDATE pulse_tasks SET state = 'FAILED', revision = revision + 1,"
                       " completed_at = UTC_TIMESTAMP(6), outcome_reason = 'attempts_exhausted'"
                       " WHERE id = %s", bytes.fromhex(original))
    response = await api.post(url(tenant, original, "/retry"), headers=tenant.auth,
                              json={"reason": "the upstream is back", "rerun_confirmed": True})
    assert response.status == 201, await response.text()
    successor: str = (await response.json())["id"]
    return original, successor


async def _scheduled_task(db: Database, tenant: Tenant, queue_id: bytes
                          ) -> tuple[bytes, dict[str, Any]]:
    """A schedule fired by the real scheduler; its first RULE run (the ledger row)."""
    schedule_id = await make_schedule(db, tenant, queue_id,
                                      rule={"cron": "*/10 * * * *", "timezone": "UTC"},
                                      since=dt.timedelta(minutes=25), misfire="EACH")
    await fire_until_idle(db)

    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                          " AND schedule_id = %s AND outcome = 'FIRED' ORDER BY fire_at LIMIT 1",
                          (tenant.namespace_id, schedule_id))
        return dict(await cur.fetchone())
    return schedule_id, await db.read("test.occurrence", body)


# --- each kind ----------------------------------------------------------------------------------


async def test_a_submitted_task(api: TestClient[Any, Any], tenant: Tenant,
                                queue_id: bytes) -> None:
    task_id = await submit(api, tenant)
    assert await source(api, tenant, task_id) == {"kind": "submitted"}


async def test_a_retry_names_the_task_it_retries(
    api: TestClient[Any, Any], tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    original, successor = await _failed_then_retried(api, tenant, sync_conn)
    assert await source(api, tenant, successor) == {"kind": "retry", "retry_of": original}
    assert await source(api, tenant, original) == {"kind": "submitted"}


async def test_a_rule_fire_names_its_schedule_version_and_occurrence(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    schedule_id, occurrence = await _scheduled_task(db, tenant, queue_id)
    ((name,),) = execute(sync_conn, "SELECT name FROM pulse_schedules WHERE id = %s",
                         schedule_id)
    found = await source(api, tenant, occurrence["task_id"].hex())
    assert found == {
        "kind": "schedule", "schedule_id": schedule_id.hex(), "schedule_name": name,
        "version": 1, "occurrence_id": occurrence["id"].hex(),
        "fire_at": occurrence["fire_at"].replace(tzinfo=dt.UTC).isoformat(
            timespec="microseconds"),
    }
    # The owner columns the firing transaction wrote.
    assert execute(sync_conn, "SELECT owner_kind, owner_id FROM pulse_tasks WHERE id = %s",
                   occurrence["task_id"]) == (("SCHEDULE", schedule_id),)


async def test_a_trigger_names_its_schedule_and_occurrence(
    api: TestClient[Any, Any], tenant: Tenant, queue_id: bytes,
) -> None:
    base = f"/v1/namespaces/{tenant.namespace}/schedules"
    response = await api.post(base, headers=tenant.auth, json={
        "name": "nightly", "queue": QUEUE, "rule": {"cron": "0 9 * * *", "timezone": "UTC"},
        "template": {"handler": "reports.build"}})
    assert response.status == 201, await response.text()
    schedule = await response.json()
    response = await api.post(f"{base}/nightly/trigger", headers=tenant.auth)
    assert response.status == 201, await response.text()
    run = await response.json()
    response = await api.get(f"{base}/nightly/occurrences", headers=tenant.auth)
    (occurrence,) = (await response.json())["items"]
    assert occurrence["source"] == "TRIGGER"
    assert await source(api, tenant, run["task_id"]) == {
        "kind": "schedule", "schedule_id": schedule["id"], "schedule_name": "nightly",
        "version": 1, "occurrence_id": occurrence["id"], "fire_at": run["fire_at"]}


async def test_a_workflow_owned_task(api: TestClient[Any, Any], db: Database,
                                     tenant: Tenant) -> None:
    """A task as the engine makes it (owner, workflow gate and a LIVE activation of step
    ``a`` naming it): the instance, its definition and version, the step and the activation."""
    task_id, instance, activation_id = await workflow_task(db, tenant)
    assert activation_id is not None
    found = await source(api, tenant, task_id.hex())
    assert found.pop("definition").startswith("wf-")  # tests/integration/weave/support.py
    assert found == {"kind": "workflow", "workflow_id": instance["id"].hex(), "version": 1,
                     "step": "a", "activation": activation_id.hex(), "sequence": 1,
                     "round": None, "retry_of": None}


@pytest.mark.parametrize("break_link", [
    "DELETE FROM weave_activations WHERE namespace_id = %s AND task_id = %s",
    "DELETE FROM weave_instances WHERE namespace_id = %s AND id = (SELECT owner_id FROM"
    " pulse_tasks WHERE namespace_id = %s AND id = %s)",
    "DELETE FROM weave_steps WHERE namespace_id = %s AND id = (SELECT step_id FROM"
    " weave_activations WHERE namespace_id = %s AND task_id = %s)",
    "UPDATE pulse_tasks SET owner_id = UNHEX(REPEAT('ab', 16)) WHERE namespace_id = %s"
    " AND id = %s",
])
async def test_a_workflow_task_whose_link_is_gone(
    api: TestClient[Any, Any], db: Database, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any], break_link: str,
) -> None:
    task_id, _, _ = await workflow_task(db, tenant)
    args = ((tenant.namespace_id, task_id) if break_link.count("%s") == 2
            else (tenant.namespace_id, tenant.namespace_id, task_id))
    execute(sync_conn, break_link, *args)
    await assert_problem(await api.get(url(tenant, task_id.hex()), headers=tenant.auth), 409,
                         "source_link_missing")


async def test_a_workflow_task_of_another_instances_activation(
    api: TestClient[Any, Any], db: Database, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    task_id, _, _ = await workflow_task(db, tenant)
    _, other, _ = await workflow_task(db, tenant)
    # The task names another existing instance than the one whose activation references it.
    execute(sync_conn, "UPDATE pulse_tasks SET owner_id = %s WHERE namespace_id = %s"
                       " AND id = %s", other["id"], tenant.namespace_id, task_id)
    body = await assert_problem(await api.get(url(tenant, task_id.hex()), headers=tenant.auth),
                                409, "source_link_missing")
    assert "another instance" in body["detail"]


# --- authorization: the task detail's ---------------------------------------------------------


async def test_another_tenants_task_is_not_found(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
) -> None:
    other = await make_tenant(db)
    await pulse.create_queue(db, other.namespace_id, QUEUE)
    theirs = await submit(api, other)
    ours = await submit(api, tenant)
    # Their task id in our namespace: no such task, and nothing about it.
    body = await assert_problem(await api.get(url(tenant, theirs), headers=tenant.auth), 404,
                                "task_not_found")
    assert other.namespace not in json.dumps(body)
    # Our key on their namespace: no such namespace.
    await assert_problem(await api.get(url(other, ours), headers=tenant.auth), 404,
                         "namespace_not_found")
    # A task id that exists nowhere answers the same as theirs.
    await assert_problem(await api.get(url(tenant, ids.new_id().hex()), headers=tenant.auth),
                         404, "task_not_found")


async def test_a_reader_of_another_queue_does_not_see_the_source(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "other")
    hidden = await submit(api, tenant)
    visible = await submit(api, tenant, "other")
    reader = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                          "actions": ["tasks.read"], "queues": ["other"]}])
    auth = {"Authorization": f"Bearer {reader}"}
    await assert_problem(await api.get(url(tenant, hidden), headers=auth), 404,
                         "task_not_found")
    assert await source(api, tenant, visible, auth) == {"kind": "submitted"}
    submitter = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                             "actions": ["tasks.submit"]}])
    await assert_problem(await api.get(url(tenant, visible),
                                       headers={"Authorization": f"Bearer {submitter}"}),
                         403, "forbidden")


async def test_a_malformed_task_id_is_a_400(api: TestClient[Any, Any], tenant: Tenant) -> None:
    response = await api.get(url(tenant, "XYZ"), headers=tenant.auth)
    body = await assert_problem(response, 400, "validation_failed")
    assert body["errors"][0]["path"] == "{task_id}"


# --- a missing link is an error -----------------------------------------------------------------


async def test_a_schedule_task_whose_schedule_is_gone(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    schedule_id, occurrence = await _scheduled_task(db, tenant, queue_id)
    execute(sync_conn, "DELETE FROM pulse_schedules WHERE namespace_id = %s AND id = %s",
            tenant.namespace_id, schedule_id)
    body = await assert_problem(await api.get(url(tenant, occurrence["task_id"].hex()),
                                              headers=tenant.auth), 409, "source_link_missing")
    assert schedule_id.hex() in body["detail"]


async def test_a_schedule_task_that_lost_its_owner_is_not_a_submission(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    _, occurrence = await _scheduled_task(db, tenant, queue_id)
    execute(sync_conn, "UPDATE pulse_tasks SET owner_kind = NULL, owner_id = NULL"
                       " WHERE namespace_id = %s AND id = %s",
            tenant.namespace_id, occurrence["task_id"])
    await assert_problem(await api.get(url(tenant, occurrence["task_id"].hex()),
                                       headers=tenant.auth), 409, "source_link_missing")


async def test_a_schedule_owner_without_its_occurrence(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    schedule_id, occurrence = await _scheduled_task(db, tenant, queue_id)
    # A submitted task claiming the schedule as its owner: no ledger row made it.
    task_id = await submit(api, tenant)
    execute(sync_conn, "UPDATE pulse_tasks SET owner_kind = 'SCHEDULE', owner_id = %s"
                       " WHERE id = %s", schedule_id, bytes.fromhex(task_id))
    await assert_problem(await api.get(url(tenant, task_id), headers=tenant.auth), 409,
                         "source_link_missing")
    # A schedule task naming another schedule than its ledger row's.
    execute(sync_conn, "UPDATE pulse_tasks SET owner_id = %s WHERE id = %s", ids.new_id(),
            occurrence["task_id"])
    await assert_problem(await api.get(url(tenant, occurrence["task_id"].hex()),
                                       headers=tenant.auth), 409, "source_link_missing")


async def test_a_retry_whose_parent_is_gone(
    api: TestClient[Any, Any], tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    original, successor = await _failed_then_retried(api, tenant, sync_conn)
    execute(sync_conn, "DELETE FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
            tenant.namespace_id, bytes.fromhex(original))
    body = await assert_problem(await api.get(url(tenant, successor), headers=tenant.auth),
                                409, "source_link_missing")
    assert original in body["detail"]


# --- the SDK ------------------------------------------------------------------------------------


async def test_the_sdk_reads_the_source(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, queue_id: bytes,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    schedule_id, occurrence = await _scheduled_task(db, tenant, queue_id)
    submitted = await submit(api, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        found = await orbit.task_source(occurrence["task_id"].hex())
        assert (found.kind, found.schedule_id, found.version, found.occurrence_id) == (
            "schedule", schedule_id.hex(), 1, occurrence["id"].hex())
        assert found.fire_at == occurrence["fire_at"].replace(tzinfo=dt.UTC)
        assert (await orbit.task_source(submitted)).kind == "submitted"
        with pytest.raises(NotFound):
            await orbit.task_source(ids.new_id().hex())
        execute(sync_conn, "DELETE FROM pulse_schedules WHERE namespace_id = %s AND id = %s",
                tenant.namespace_id, schedule_id)
        with pytest.raises(Conflict) as caught:
            await orbit.task_source(occurrence["task_id"].hex())
        assert caught.value.code == "source_link_missing"

"""HTTP: POST …/tasks/{id}/cancel, /review and /retry."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from orbit_api.routes.interventions import PATH
from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.test_interventions import running_task
from tests.integration.test_leases import finish, report
from tests.support.contract import assert_documented
from tests.support.lease_fixtures import add_tasks, make_queue, scalar, task_row


def url(tenant: Tenant, task_id: bytes, op: str) -> str:
    return f"/v1/namespaces/{tenant.namespace}/tasks/{task_id.hex()}/{op}"


async def test_cancel_over_http(api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    response = await api.post(url(tenant, task_id, "cancel"), headers=tenant.auth,
                              json={"reason": "duplicate order"})
    assert response.status == 200
    body = await response.json()
    assert body["state"] == "CANCELLED"
    assert body["id"] == task_id.hex()
    assert_documented(PATH + "/cancel", "post", 200, body)
    again = await api.post(url(tenant, task_id, "cancel"), headers=tenant.auth,
                           json={"reason": "duplicate order"})
    assert (await again.json())["state"] == "CANCELLED"


async def test_a_client_cancel_may_omit_the_reason_an_operator_cancel_may_not(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    # tenant.auth holds every action, queues.manage included: an operator credential.
    refused = await api.post(url(tenant, task_id, "cancel"), headers=tenant.auth)
    assert refused.status == 400
    problem = await refused.json()
    assert (problem["code"], problem["errors"][0]["path"]) == ("validation_failed", "$.reason")
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"
    client_key = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                              "actions": ["tasks.read", "tasks.cancel"]}])
    response = await api.post(url(tenant, task_id, "cancel"),
                              headers={"Authorization": f"Bearer {client_key}"})
    assert response.status == 200
    body = await response.json()
    assert body["state"] == "CANCELLED"
    assert_documented(PATH + "/cancel", "post", 200, body)


async def test_cancel_of_a_running_task_replies_as_documented(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    task_id, _grant = await running_task(db, tenant)
    response = await api.post(url(tenant, task_id, "cancel"), headers=tenant.auth,
                              json={"reason": "stop"})
    body = await response.json()
    assert (body["state"], body["cancel_requested"], body["completed_at"]) == (
        "RUNNING", True, None)
    assert_documented(PATH + "/cancel", "post", 200, body)


async def test_review_and_retry_over_http(api: TestClient[Any, Any], db: Database,
                                          tenant: Tenant) -> None:
    task_id, grant = await running_task(db, tenant)
    await finish(db, tenant, [report(grant, "unknown", error={"type": "Timeout"})])
    revision = (await task_row(db, tenant, task_id))["revision"]
    response = await api.post(url(tenant, task_id, "review"), headers=tenant.auth, json={
        "decision": "failed", "reason": "the charge never happened", "evidence_ref": "PSP-1",
        "execution_ended": True, "revision": revision})
    assert response.status == 200
    reviewed = await response.json()
    assert (reviewed["state"], reviewed["revision"]) == ("FAILED", revision + 1)
    assert_documented(PATH + "/review", "post", 200, reviewed)
    response = await api.post(url(tenant, task_id, "retry"), headers=tenant.auth,
                              json={"reason": "psp fixed", "rerun_confirmed": True})
    assert response.status == 201
    retried = await response.json()
    assert retried["retry_of"] == task_id.hex()
    assert_documented(PATH + "/retry", "post", 201, retried)
    successor = bytes.fromhex(retried["id"])
    assert (await task_row(db, tenant, successor))["retry_of"] == task_id
    second = await api.post(url(tenant, task_id, "retry"), headers=tenant.auth,
                            json={"reason": "again", "rerun_confirmed": True})
    assert second.status == 409
    assert (await second.json())["code"] == "already_retried"


REVIEW = {"decision": "failed", "reason": "x", "evidence_ref": "T-1", "execution_ended": True,
          "revision": 1}


def without(body: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != field}


@pytest.mark.parametrize(
    ("op", "body", "status", "code"),
    [
        ("cancel", {"reason": 5}, 400, "validation_failed"),
        ("cancel", {"why": "x"}, 400, "validation_failed"),
        ("cancel", {"reason": ""}, 400, "validation_failed"),
        ("review", {**REVIEW, "decision": "maybe"}, 400, "validation_failed"),
        ("review", without(REVIEW, "reason"), 400, "validation_failed"),
        ("review", without(REVIEW, "evidence_ref"), 400, "validation_failed"),
        ("review", {**REVIEW, "evidence_ref": ""}, 400, "validation_failed"),
        ("review", without(REVIEW, "revision"), 400, "validation_failed"),
        ("review", without(REVIEW, "execution_ended"), 400, "confirmation_required"),
        ("review", {**REVIEW, "execution_ended": False}, 400, "confirmation_required"),
        ("retry", {"reason": "x", "rerun_confirmed": False}, 400, "confirmation_required"),
        ("retry", {"reason": "x"}, 400, "validation_failed"),
        ("retry", {"reason": "", "rerun_confirmed": True}, 400, "validation_failed"),
        ("review", REVIEW, 409, "task_not_reviewable"),
        ("retry", {"reason": "x", "rerun_confirmed": True}, 409, "task_not_retryable"),
    ],
)
async def test_bad_interventions_are_problems_and_write_nothing(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, op: str, body: dict[str, Any],
    status: int, code: str,
) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    before = await scalar(db, "SELECT COUNT(*) AS n FROM orbit_audit_events"
                              " WHERE namespace_id = %s", tenant.namespace_id)
    response = await api.post(url(tenant, task_id, op), headers=tenant.auth, json=body)
    assert response.status == status
    assert response.content_type == "application/problem+json"
    assert (await response.json())["code"] == code
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "WAITING"
    assert row["revision"] == 1
    assert await scalar(db, "SELECT COUNT(*) AS n FROM orbit_audit_events"
                            " WHERE namespace_id = %s", tenant.namespace_id) == before


async def test_unknown_or_foreign_task_is_404(api: TestClient[Any, Any], db: Database,
                                              tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    other = await make_tenant(db)
    for path, auth in [
        (f"/v1/namespaces/{tenant.namespace}/tasks/{'0' * 32}/cancel", tenant.auth),
        (f"/v1/namespaces/{other.namespace}/tasks/{task_id.hex()}/cancel", other.auth),
        (f"/v1/namespaces/{tenant.namespace}/tasks/{task_id.hex()}/cancel", other.auth),
    ]:
        response = await api.post(path, headers=auth, json={})
        assert response.status == 404, path
        assert (await response.json())["code"] in {"task_not_found", "namespace_not_found"}
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"


async def test_a_malformed_task_id_is_a_400_naming_the_path_parameter(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    for op in ("cancel", "review", "retry"):
        response = await api.post(f"/v1/namespaces/{tenant.namespace}/tasks/NOT-HEX/{op}",
                                  headers=tenant.auth, json={})
        assert response.status == 400, op
        body = await response.json()
        assert body["code"] == "validation_failed"
        assert body["errors"][0]["path"] == "{task_id}"


async def test_a_review_of_a_changed_task_is_a_stale_revision(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    task_id, grant = await running_task(db, tenant)
    await finish(db, tenant, [report(grant, "unknown", error={"type": "Timeout"})])
    current = (await task_row(db, tenant, task_id))["revision"]
    response = await api.post(url(tenant, task_id, "review"), headers=tenant.auth,
                              json={**REVIEW, "revision": current - 1})
    assert response.status == 409
    problem = await response.json()
    assert (problem["code"], problem["current_revision"]) == ("stale_revision", current)
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["revision"]) == ("NEEDS_REVIEW", current)

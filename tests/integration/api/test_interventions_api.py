"""HTTP: POST …/tasks/{id}/cancel, /review and /retry."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_tenant
from tests.integration.test_interventions import running_task
from tests.integration.test_leases import finish, report
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
    # No body at all is fine too (reason optional); the task is already cancelled.
    again = await api.post(url(tenant, task_id, "cancel"), headers=tenant.auth)
    assert (await again.json())["state"] == "CANCELLED"


async def test_review_and_retry_over_http(api: TestClient[Any, Any], db: Database,
                                          tenant: Tenant) -> None:
    task_id, grant = await running_task(db, tenant)
    await finish(db, tenant, [report(grant, "unknown", error={"type": "Timeout"})])
    response = await api.post(url(tenant, task_id, "review"), headers=tenant.auth, json={
        "decision": "failed", "reason": "the charge never happened", "evidence_ref": "PSP-1"})
    assert response.status == 200
    assert (await response.json())["state"] == "FAILED"
    response = await api.post(url(tenant, task_id, "retry"), headers=tenant.auth,
                              json={"reason": "psp fixed", "rerun_confirmed": True})
    assert response.status == 201
    successor = bytes.fromhex((await response.json())["id"])
    assert (await task_row(db, tenant, successor))["retry_of"] == task_id
    second = await api.post(url(tenant, task_id, "retry"), headers=tenant.auth,
                            json={"reason": "again", "rerun_confirmed": True})
    assert second.status == 409
    assert (await second.json())["code"] == "already_retried"


@pytest.mark.parametrize(
    ("op", "body", "status", "code"),
    [
        ("cancel", {"reason": 5}, 400, "validation_failed"),
        ("cancel", {"why": "x"}, 400, "validation_failed"),
        ("review", {"decision": "maybe", "reason": "x"}, 400, "validation_failed"),
        ("review", {"decision": "failed"}, 400, "validation_failed"),
        ("retry", {"reason": "x", "rerun_confirmed": False}, 400, "confirmation_required"),
        ("retry", {"reason": "x"}, 400, "validation_failed"),
        ("review", {"decision": "failed", "reason": "x"}, 409, "task_not_reviewable"),
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

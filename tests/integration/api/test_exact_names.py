"""Names in a path compare exactly (issue 11 §11).

The name columns use a PAD SPACE collation: ``'a-ns '`` equals ``'a-ns'`` in SQL. A path whose
namespace, queue, schedule or application name differs from a stored one — a trailing space, a
case variant — is not that object: 404, and nothing is written.
"""

from __future__ import annotations

from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from tests.conftest import Tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.support import pulse

TABLES = ("orbit_namespaces", "pulse_queues", "pulse_execution_gates", "pulse_schedules",
          "pulse_tasks", "orbit_events", "orbit_audit_events", "orbit_idempotency_keys")


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, TABLES)


def _variants(name: str) -> list[str]:
    return [name + "%20", name + "%20%20", name.upper(), name[0].upper() + name[1:]]


async def test_every_path_name_compares_exactly(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, watch: WriteWatch,
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "work")
    headers = {**tenant.auth, "Content-Type": "application/json"}
    created = await api.post(f"/v1/namespaces/{tenant.namespace}/schedules", headers=headers,
                             json={"name": "nightly", "queue": "work",
                                   "rule": {"interval_ms": 60000}, "template": {"handler": "h"}})
    assert created.status == 201, await created.text()
    ns = f"/v1/namespaces/{tenant.namespace}"
    # The exact names answer: the variants below are refused only because they differ.
    for path in (f"{ns}/queues/work", f"{ns}/schedules/nightly",
                 f"/v1/applications/{tenant.application}/resources"):
        response = await api.get(path, headers=headers)
        assert response.status == 200, (path, await response.text())

    watch.reset()
    for variant in _variants(tenant.namespace):
        other = f"/v1/namespaces/{variant}"
        for method, path, body in (
            ("GET", f"{other}/queues", None),
            ("GET", f"{other}/queues/work", None),
            ("GET", f"{other}/tasks", None),
            ("POST", f"{other}/tasks", {"queue": "work", "handler": "h"}),
            ("POST", f"{other}/queues", {"name": "fresh"}),
            ("POST", f"{other}/schedules/nightly/trigger", None),
            ("POST", f"{other}/disable", {"reason": "r"}),
        ):
            response = await api.request(method, path, headers=headers, json=body)
            await assert_problem(response, 404, "namespace_not_found")
    for variant in _variants("work"):
        for method, path, body in (
            ("GET", f"{ns}/queues/{variant}", None),
            ("PATCH", f"{ns}/queues/{variant}", {"revision": 1, "offer_lease_ms": 1000}),
            ("POST", f"{ns}/queues/{variant}/pause", {"reason": "r"}),
        ):
            response = await api.request(method, path, headers=headers, json=body)
            await assert_problem(response, 404, "queue_not_found")
    for variant in _variants("nightly"):
        for method, path, body in (
            ("GET", f"{ns}/schedules/{variant}", None),
            ("GET", f"{ns}/schedules/{variant}/occurrences", None),
            ("POST", f"{ns}/schedules/{variant}/trigger", None),
            ("POST", f"{ns}/schedules/{variant}/pause", {"reason": "r"}),
            ("DELETE", f"{ns}/schedules/{variant}", {"reason": "r"}),
        ):
            response = await api.request(method, path, headers=headers, json=body)
            await assert_problem(response, 404, "schedule_not_found")
    for variant in _variants(tenant.application):
        response = await api.get(f"/v1/applications/{variant}/resources", headers=headers)
        await assert_problem(response, 404, "application_not_found")
    watch.assert_unchanged()

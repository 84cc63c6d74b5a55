"""``/v1/applications/{application}/resources``: the shared quotas of an application.

GET answers the limits, the counters and the start window; PATCH changes the limits by
compare-and-set on ``revision`` with an event and an audit record, never touching a counter.
Bad input is a problem document that writes nothing; authorization needs a grant covering the
whole application.
"""

from __future__ import annotations

import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.platform.audit import Actor
from orbit_common.pulse import leases, quotas
from orbit_common.pulse.workers import QueueRef
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.api.conftest import WRITE_TABLES, WriteWatch, assert_problem
from tests.integration.api.test_queues_support import bearer, create, refusals, rows
from tests.support import pulse
from tests.support.lease_fixtures import open_session

TABLES = (*WRITE_TABLES, "orbit_application_resources", "pulse_tasks")
LIMITS = quotas.LIMIT_FIELDS
COUNTERS = ("unfinished_tasks", "active_attempts", "reserved_attempts", "start_window_until",
            "starts_in_window")


def path(application: str) -> str:
    return f"/v1/applications/{application}/resources"


def resource_row(conn: pymysql.connections.Connection[Any], tenant: Tenant) -> dict[str, Any]:
    (row,) = rows(conn, "SELECT * FROM orbit_application_resources WHERE application_id = %s",
                  tenant.application_id)
    return row


async def read(api: TestClient[Any, Any], tenant: Tenant,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await api.get(path(tenant.application), headers=headers or tenant.auth)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def patch(api: TestClient[Any, Any], tenant: Tenant, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await api.patch(path(tenant.application), json=body,
                               headers=headers or tenant.auth)
    assert response.status == 200, await response.text()
    result: dict[str, Any] = await response.json()
    return result


async def submit(api: TestClient[Any, Any], tenant: Tenant, queue: str) -> Any:
    return await api.post(f"/v1/namespaces/{tenant.namespace}/tasks",
                          json={"queue": queue, "handler": "h"}, headers=tenant.auth)


# --- reading -------------------------------------------------------------------------------------


async def test_a_new_application_is_unlimited_and_counts_its_work(
    api: TestClient[Any, Any], tenant: Tenant,
) -> None:
    body = await read(api, tenant)
    assert body["application"] == tenant.application
    assert body["application_id"] == tenant.application_id.hex()
    assert body["revision"] == 1
    assert {k: body[k] for k in LIMITS} == dict.fromkeys(LIMITS)
    assert {k: v for k, v in body["usage"].items() if k != "measured_at"} == {
        "unfinished_tasks": 0, "active_attempts": 0, "reserved_attempts": 0,
        "starts_in_window": 0, "start_window_until": None}
    queue = unique("q")
    await create(api, tenant, queue)
    for _ in range(2):
        assert (await submit(api, tenant, queue)).status == 201
    assert (await read(api, tenant))["usage"]["unfinished_tasks"] == 2


# --- changing ------------------------------------------------------------------------------------


async def test_patch_is_a_compare_and_set_with_event_and_audit(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    watch = WriteWatch(sync_conn, tables=TABLES)
    watch.reset()
    after = await patch(api, tenant, {"revision": 1, "max_unfinished_tasks": 100,
                                      "max_active_attempts": 10, "reason": "INC-7 capacity"})
    assert after["revision"] == 2
    assert (after["max_unfinished_tasks"], after["max_active_attempts"]) == (100, 10)
    assert (after["max_reserved_attempts"], after["max_starts_per_second"]) == (None, None)
    assert watch.delta() == {"orbit_events": 1, "orbit_audit_events": 1}
    (audit,) = rows(sync_conn, "SELECT * FROM orbit_audit_events WHERE resource_id = %s"
                               " AND action = 'application.resources.update'",
                    tenant.application_id)
    (credential,) = rows(sync_conn, "SELECT id FROM orbit_credentials WHERE application_id = %s",
                         tenant.application_id)
    assert (audit["actor_kind"], audit["actor_id"]) == ("credential", credential["id"].hex())
    assert audit["reason"] == "INC-7 capacity"
    assert audit["resource_type"] == "application_resources"
    assert audit["resource_revision"] == 2
    assert audit["application_id"] == tenant.application_id
    before_doc, after_doc = json.loads(audit["before_doc"]), json.loads(audit["after_doc"])
    assert before_doc == {"application": tenant.application, "revision": 1,
                          **dict.fromkeys(LIMITS)}
    assert after_doc["max_unfinished_tasks"] == 100
    assert after_doc["revision"] == 2
    (event,) = rows(sync_conn, "SELECT * FROM orbit_events WHERE aggregate_id = %s"
                               " AND aggregate_type = 'application_resources'",
                    tenant.application_id)
    assert (event["event_type"], event["aggregate_revision"]) == (
        "application.resources_updated", 2)

    # Null removes a limit; a limit left out stays.
    after = await patch(api, tenant, {"revision": 2, "max_active_attempts": None,
                                      "max_starts_per_second": 5})
    assert (after["max_unfinished_tasks"], after["max_active_attempts"],
            after["max_starts_per_second"], after["revision"]) == (100, None, 5, 3)
    # The same values again, or none at all: nothing is written.
    watch.reset()
    same = await patch(api, tenant, {"revision": 3, "max_unfinished_tasks": 100})
    assert {k: same[k] for k in (*LIMITS, "revision")} == {k: after[k] for k in
                                                           (*LIMITS, "revision")}
    await patch(api, tenant, {"revision": 3})
    watch.assert_unchanged()
    # A stale revision is refused and writes nothing, even for a no-op.
    for body in ({"revision": 2, "max_unfinished_tasks": 1}, {"revision": 2}):
        response = await api.patch(path(tenant.application), json=body, headers=tenant.auth)
        await assert_problem(response, 409, "stale_revision")
    watch.assert_unchanged()
    assert (await read(api, tenant))["revision"] == 3


async def test_limits_never_touch_the_counters_and_lowering_refuses_only_new_work(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    queue = unique("q")
    await create(api, tenant, queue)
    for _ in range(3):
        assert (await submit(api, tenant, queue)).status == 201
    (q,) = rows(sync_conn, "SELECT id, gate_id FROM pulse_queues WHERE namespace_id = %s"
                           " AND name = %s", tenant.namespace_id, queue)
    ref = QueueRef(id=q["id"], name=queue, gate_id=q["gate_id"])
    session = await open_session(db, tenant, [ref], handlers=("h",))
    grants = await db.transaction("test.claim", lambda cur: leases.claim(cur, session, ref, 2))
    assert len(grants) == 2
    usage = ("unfinished_tasks", "active_attempts", "reserved_attempts")
    # Without a count limit the row keeps no counters; the view recounts the usage.
    untracked = resource_row(sync_conn, tenant)
    assert {k: untracked[k] for k in usage} == dict.fromkeys(usage, 0)
    assert {k: (await read(api, tenant))["usage"][k] for k in usage} == {
        "unfinished_tasks": 3, "active_attempts": 2, "reserved_attempts": 2}

    # The first count limit starts the counters from an exact recount, in its transaction.
    after = await patch(api, tenant, {"revision": 1, "max_unfinished_tasks": 5})
    assert {k: after["usage"][k] for k in usage} == {
        "unfinished_tasks": 3, "active_attempts": 2, "reserved_attempts": 2}
    before = resource_row(sync_conn, tenant)
    assert (before["unfinished_tasks"], before["active_attempts"],
            before["reserved_attempts"]) == (3, 2, 2)

    # Further limit changes never write a counter.
    after = await patch(api, tenant, {"revision": 2, "max_unfinished_tasks": 1,
                                      "max_active_attempts": 1, "max_reserved_attempts": 1,
                                      "max_starts_per_second": 1})
    assert {k: after["usage"][k] for k in usage} == {
        "unfinished_tasks": 3, "active_attempts": 2, "reserved_attempts": 2}
    row = resource_row(sync_conn, tenant)
    assert {k: row[k] for k in COUNTERS} == {k: before[k] for k in COUNTERS}
    attempts = rows(sync_conn, "SELECT state FROM pulse_attempts WHERE namespace_id = %s",
                    tenant.namespace_id)
    assert [a["state"] for a in attempts] == ["OFFERED", "OFFERED"]  # no grant revoked

    # New work is refused whole, with Retry-After, and nothing is written.
    counts = pulse.submit_counts(sync_conn)
    counted = refusals("application_quota_exceeded")
    response = await submit(api, tenant, queue)
    problem = await assert_problem(response, 429, "application_quota_exceeded")
    assert int(response.headers["Retry-After"]) >= 1
    assert problem["limit"] == 1
    assert problem["unfinished"] == 3
    assert pulse.submit_counts(sync_conn) == counts
    assert refusals("application_quota_exceeded") == counted + 1
    assert resource_row(sync_conn, tenant)["unfinished_tasks"] == 3


# --- bad input -----------------------------------------------------------------------------------

BAD_BODIES: list[tuple[str, bytes, str, str | None]] = [
    ("malformed", b'{"revision": 1', "malformed_json", None),
    ("empty", b"", "malformed_json", None),
    ("not-an-object", b"[1]", "validation_failed", "$"),
    ("duplicate-key", b'{"revision": 1, "revision": 1}', "duplicate_json_key", None),
    ("no-revision", b'{"max_unfinished_tasks": 5}', "validation_failed", "$.revision"),
    ("revision-zero", b'{"revision": 0}', "validation_failed", "$.revision"),
    ("revision-string", b'{"revision": "1"}', "validation_failed", "$.revision"),
    ("unknown-field", b'{"revision": 1, "unfinished_tasks": 0}', "validation_failed", "$"),
    ("reason-int", b'{"revision": 1, "reason": 5}', "validation_failed", "$.reason"),
    ("reason-too-long", json.dumps({"revision": 1, "reason": "r" * 1025}).encode(),
     "validation_failed", "$.reason"),
]
for _field in LIMITS:
    for _name, _value in (("zero", "0"), ("negative", "-1"), ("too-big", "2147483648"),
                          ("string", '"5"'), ("fraction", "1.5"), ("bool", "true")):
        BAD_BODIES.append((f"{_field}-{_name}",
                           f'{{"revision": 1, "{_field}": {_value}}}'.encode(),
                           "validation_failed", f"$.{_field}"))


@pytest.mark.parametrize(("body", "code", "where"), [c[1:] for c in BAD_BODIES],
                         ids=[c[0] for c in BAD_BODIES])
async def test_bad_bodies_are_problem_documents_and_write_nothing(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
    body: bytes, code: str, where: str | None,
) -> None:
    watch = WriteWatch(sync_conn, tables=TABLES)
    watch.reset()
    before = resource_row(sync_conn, tenant)
    response = await api.patch(path(tenant.application), data=body,
                               headers={**tenant.auth, "Content-Type": "application/json"})
    problem = await assert_problem(response, 400, code)
    if where is not None:
        assert problem["errors"][0]["path"] == where, problem
    watch.assert_unchanged()
    assert resource_row(sync_conn, tenant) == before


async def test_media_type_query_and_method_are_checked(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    before = resource_row(sync_conn, tenant)
    response = await api.patch(path(tenant.application), data=b'{"revision": 1}',
                               headers={**tenant.auth, "Content-Type": "text/plain"})
    await assert_problem(response, 415, "unsupported_media_type")
    response = await api.get(path(tenant.application) + "?verbose=1", headers=tenant.auth)
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"][0]["path"] == "?verbose"
    response = await api.post(path(tenant.application), json={}, headers=tenant.auth)
    await assert_problem(response, 405, "method_not_allowed")
    response = await api.get(path(tenant.application))
    await assert_problem(response, 401, "unauthenticated")
    assert resource_row(sync_conn, tenant) == before


# --- authorization -------------------------------------------------------------------------------


async def test_another_application_is_not_found_like_a_missing_one(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    other = await make_tenant(db)
    before = resource_row(sync_conn, other)
    for name in (other.application, unique("missing"), "Not-A-Name"):
        response = await api.get(path(name), headers=tenant.auth)
        await assert_problem(response, 404, "application_not_found")
        response = await api.patch(path(name), json={"revision": 1,
                                                     "max_unfinished_tasks": 1},
                                   headers=tenant.auth)
        await assert_problem(response, 404, "application_not_found")
    assert resource_row(sync_conn, other) == before


GRANTS: list[tuple[str, list[dict[str, Any]], int, int]] = [
    # (id, grants, GET status, PATCH status)
    ("all", [{"namespaces": ["*"], "actions": ["*"]}], 200, 200),
    ("family", [{"namespaces": ["*"], "actions": ["applications.*"]}], 200, 200),
    ("manage-reads-too", [{"namespaces": ["*"], "actions": ["applications.manage"]}], 200, 200),
    ("read-only", [{"namespaces": ["*"], "actions": ["applications.read"]}], 200, 403),
    ("one-namespace", [{"namespaces": ["team-a"], "actions": ["*"]}], 403, 403),
    ("some-queues", [{"namespaces": ["*"], "actions": ["*"], "queues": ["pay-*"]}], 403, 403),
    ("queue-actions", [{"namespaces": ["*"], "actions": ["queues.*", "tasks.*"]}], 403, 403),
    ("split", [{"namespaces": ["*"], "actions": ["queues.read"]},
               {"namespaces": ["team-*"], "actions": ["applications.manage"]}], 403, 403),
]


@pytest.mark.parametrize(("grants", "get_status", "patch_status"), [g[1:] for g in GRANTS],
                         ids=[g[0] for g in GRANTS])
async def test_only_a_grant_covering_the_whole_application_may_see_or_change_it(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
    grants: list[dict[str, Any]], get_status: int, patch_status: int,
) -> None:
    key = bearer(await make_key(db, tenant, grants))
    response = await api.get(path(tenant.application), headers=key)
    if get_status == 200:
        assert response.status == 200, await response.text()
    else:
        await assert_problem(response, get_status, "forbidden")
    before = resource_row(sync_conn, tenant)
    response = await api.patch(path(tenant.application), headers=key,
                               json={"revision": before["revision"], "max_unfinished_tasks": 7})
    if patch_status == 200:
        assert response.status == 200, await response.text()
        assert (await response.json())["max_unfinished_tasks"] == 7
    else:
        await assert_problem(response, patch_status, "forbidden")
        assert resource_row(sync_conn, tenant) == before


async def test_a_revoked_credential_stops_at_once(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
) -> None:
    key = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"]}])
    assert (await api.get(path(tenant.application), headers=bearer(key))).status == 200
    prefix = key.split("_")[1]
    await db.transaction("test.revoke", lambda cur: credentials.revoke_credential(
        cur, prefix=prefix, actor=Actor.operator("pytest"), reason="test"))
    response = await api.get(path(tenant.application), headers=bearer(key))
    await assert_problem(response, 401, "invalid_credential")

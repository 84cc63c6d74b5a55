"""/v1/namespaces/{namespace}/workflow-definitions…, …/workflow-validations and …/workflows…
against the real database: the API contract of issue 14 part 5.

Definitions (create, list with cursors, get, publish with compare-and-set, one version with its
document, validate without publishing), instances (start with idempotency, get with steps,
activations and what each task's result has become, list by definition / state / business key /
created range with bound cursors), every refusal (a stable problem code, nothing written), 404
for another tenant through every route and 403 without the action. The authorization matrix
(test_authorization_matrix.py) sends every attacker key to these routes as well.
"""

from __future__ import annotations

import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, IdempotencyConflict, NotFound, RawJson, StaleRevision, ValidationError

from orbit_common.db.pool import Database
from orbit_common.model import ids
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.integration.test_interventions import cancel
from tests.integration.weave.test_inbox import workflow_task
from tests.support import pulse

WEAVE_TABLES = (
    "weave_definitions", "weave_definition_versions", "weave_version_scopes", "weave_instances",
    "weave_steps", "weave_activations", "weave_pending_advances", "pulse_execution_gates",
    "orbit_events", "orbit_audit_events", "orbit_idempotency_keys",
)
QUEUE = "work"


def doc(queue: str = QUEUE, *, handler: str = "work.do") -> dict[str, Any]:
    return {"format": "orbit.weave/1",
            "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                             "required": ["n"]},
            "start": "a",
            "steps": {"a": {"kind": "TASK", "queue": queue, "handler": handler,
                            "next": "done"},
                      "done": {"kind": "SUCCEED"}}}


def ns(tenant: Tenant, suffix: str) -> str:
    return f"/v1/namespaces/{tenant.namespace}{suffix}"


async def call(api: TestClient[Any, Any], method: str, path: str, tenant: Tenant,
               body: bytes | dict[str, Any] | None = None, *, key: str | None = None,
               api_key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {api_key or tenant.api_key}",
               "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    response = await api.request(method, path, data=data, headers=headers)
    return response.status, await response.json()


async def ok(api: TestClient[Any, Any], method: str, path: str, tenant: Tenant,
             body: dict[str, Any] | None = None, **kw: Any) -> Any:
    status, answer = await call(api, method, path, tenant, body, **kw)
    assert 200 <= status < 300, answer
    return answer


async def published(api: TestClient[Any, Any], tenant: Tenant, name: str = "orders",
                    document: dict[str, Any] | None = None) -> dict[str, Any]:
    await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": name})
    return dict(await ok(api, "POST", ns(tenant, f"/workflow-definitions/{name}/versions"),
                         tenant, {"revision": 1, "document": document or doc()}))


async def start(api: TestClient[Any, Any], tenant: Tenant, name: str = "orders",
                **extra: Any) -> dict[str, Any]:
    body = {"definition": name, "input": {"n": 1}, **extra}
    return dict(await ok(api, "POST", ns(tenant, "/workflows"), tenant, body))


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    return QUEUE


@pytest.fixture
def watch(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, WEAVE_TABLES)


# --- definitions --------------------------------------------------------------------------------


async def test_create_publish_get_and_read_a_version(api: TestClient[Any, Any], tenant: Tenant,
                                                     queue: str) -> None:
    status, created = await call(api, "POST", ns(tenant, "/workflow-definitions"), tenant,
                                 {"name": "orders", "description": "Order flow"}, key="c1")
    assert status == 201, created
    assert (created["name"], created["description"], created["revision"],
            created["latest_version"], created["versions"]) == (
        "orders", "Order flow", 1, None, [])
    # A replay answers the original; another request under the key is a conflict.
    assert await call(api, "POST", ns(tenant, "/workflow-definitions"), tenant,
                      {"name": "orders", "description": "Order flow"}, key="c1") == (201, created)
    await assert_problem(await api.post(
        ns(tenant, "/workflow-definitions"), json={"name": "orders", "description": "x"},
        headers={**tenant.auth, "Idempotency-Key": "c1"}), 409, "idempotency_conflict")
    await assert_problem(await api.post(ns(tenant, "/workflow-definitions"),
                                        json={"name": "orders"}, headers=tenant.auth),
                         409, "already_exists")

    status, out = await call(api, "POST", ns(tenant, "/workflow-definitions/orders/versions"),
                             tenant, {"revision": 1, "document": doc()}, key="p1")
    assert status == 201, out
    assert (out["published_version"], out["revision"], out["latest_version"]) == (1, 2, 1)
    (listed,) = out["versions"]
    assert listed["document"] is None
    assert await call(api, "POST", ns(tenant, "/workflow-definitions/orders/versions"), tenant,
                      {"revision": 1, "document": doc()}, key="p1") == (201, out)

    got = await ok(api, "GET", ns(tenant, "/workflow-definitions/orders"), tenant)
    assert got["versions"] == out["versions"]
    assert got["revision"] == 2
    version = await ok(api, "GET", ns(tenant, "/workflow-definitions/orders/versions/1"), tenant)
    assert version["definition"] == "orders"
    assert version["version"] == 1
    assert version["digest"] == listed["digest"]
    assert version["document"]["steps"]["a"]["queue"] == QUEUE
    await assert_problem(await api.get(ns(tenant, "/workflow-definitions/orders/versions/2"),
                                       headers=tenant.auth), 404, "definition_version_not_found")
    await assert_problem(await api.get(ns(tenant, "/workflow-definitions/nope"),
                                       headers=tenant.auth), 404, "definition_not_found")


async def test_publish_is_compare_and_set(api: TestClient[Any, Any], tenant: Tenant,
                                          queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    watch.reset()
    body = await assert_problem(await api.post(
        ns(tenant, "/workflow-definitions/orders/versions"),
        json={"revision": 1, "document": doc(handler="other")}, headers=tenant.auth),
        409, "stale_revision")
    assert "revision 2" in body["detail"]
    watch.assert_unchanged()
    out = await ok(api, "POST", ns(tenant, "/workflow-definitions/orders/versions"), tenant,
                   {"revision": 2, "document": doc(handler="other")})
    assert out["published_version"] == 2


async def test_a_publisher_without_the_queues_gets_no_replay(
        api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str,
        watch: WriteWatch) -> None:
    """The queue check of a publish comes before its idempotent replay: a credential that may
    manage workflows but not submit to the document's queue, sending the owner's key and body,
    gets the refusal, not the owner's receipt."""
    await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": "orders"})
    body = {"revision": 1, "document": doc()}
    await ok(api, "POST", ns(tenant, "/workflow-definitions/orders/versions"), tenant, body,
             key="pub-1")
    manager = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                           "actions": ["workflows.manage", "workflows.read"]}])
    watch.reset()
    problem = await assert_problem(await api.post(
        ns(tenant, "/workflow-definitions/orders/versions"), json=body,
        headers={"Authorization": f"Bearer {manager}", "Idempotency-Key": "pub-1"}),
        400, "definition_invalid")
    assert [(e["path"], e["code"]) for e in problem["errors"]] == [
        ("$.document.steps.a.queue", "queue_not_found")]
    watch.assert_unchanged()


@pytest.mark.parametrize(("body", "path"), [
    ({"document": doc()}, "$.revision"),
    ({"revision": 1}, "$.document"),
    ({"revision": 0, "document": doc()}, "$.revision"),
    ({"revision": "1", "document": doc()}, "$.revision"),
    ({"revision": True, "document": doc()}, "$.revision"),
    ({"revision": 1, "document": doc(), "extra": 1}, "$.extra"),
])
async def test_bad_publish_bodies(api: TestClient[Any, Any], tenant: Tenant, queue: str,
                                  watch: WriteWatch, body: dict[str, Any], path: str) -> None:
    await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": "orders"})
    watch.reset()
    problem = await assert_problem(await api.post(
        ns(tenant, "/workflow-definitions/orders/versions"), json=body, headers=tenant.auth),
        400, "validation_failed")
    assert path in [e["path"] for e in problem["errors"]]
    watch.assert_unchanged()


async def test_an_invalid_document_points_into_the_body(api: TestClient[Any, Any],
                                                        tenant: Tenant, queue: str,
                                                        watch: WriteWatch) -> None:
    await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": "orders"})
    watch.reset()
    bad = doc()
    bad["steps"]["a"]["next"] = "nowhere"
    for route, body in ((ns(tenant, "/workflow-definitions/orders/versions"),
                         {"revision": 1, "document": bad}),
                        (ns(tenant, "/workflow-validations"), {"document": bad})):
        problem = await assert_problem(await api.post(route, json=body, headers=tenant.auth),
                                       400, "definition_invalid")
        assert {"path": "$.document.steps.a.next", "code": "missing_target"}.items() <= (
            problem["errors"][0].items()), problem
        # A queue that does not exist is found with the database, at the step that names it.
        problem = await assert_problem(await api.post(
            route, json={**body, "document": doc("missing")}, headers=tenant.auth),
            400, "definition_invalid")
        assert [(e["path"], e["code"]) for e in problem["errors"]] == [
            ("$.document.steps.a.queue", "queue_not_found")]
    await assert_problem(await api.post(
        ns(tenant, "/workflow-definitions/orders/versions"), data=b'{"revision": 1,',
        headers={**tenant.auth, "Content-Type": "application/json"}), 400, "malformed_json")
    watch.assert_unchanged()


async def test_validate_answers_the_digest_a_publish_stores(
        api: TestClient[Any, Any], tenant: Tenant, queue: str, watch: WriteWatch) -> None:
    watch.reset()
    checked = await ok(api, "POST", ns(tenant, "/workflow-validations"), tenant,
                       {"document": doc()})
    assert checked["valid"] is True
    assert checked["queues"] == [QUEUE]
    watch.assert_unchanged()
    problem = await assert_problem(await api.post(
        ns(tenant, "/workflow-validations"), json={"document": doc(), "revision": 1},
        headers=tenant.auth), 400, "validation_failed")
    assert problem["errors"][0]["path"] == "$.revision"
    # A definition may be named "validate": validation has a path of its own.
    out = await published(api, tenant, "validate")
    assert out["versions"][0]["digest"] == checked["digest"]
    got = await ok(api, "GET", ns(tenant, "/workflow-definitions/validate"), tenant)
    assert got["name"] == "validate"


async def test_list_definitions_by_name_with_cursors(api: TestClient[Any, Any],
                                                     tenant: Tenant) -> None:
    for name in ("c", "a", "b"):
        await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": name})
    first = await ok(api, "GET", ns(tenant, "/workflow-definitions?limit=2"), tenant)
    assert [d["name"] for d in first["items"]] == ["a", "b"]
    second = await ok(api, "GET", ns(tenant, "/workflow-definitions?limit=2&cursor="
                                  + first["next_cursor"]), tenant)
    assert [d["name"] for d in second["items"]] == ["c"]
    assert second["next_cursor"] is None
    for query, code in (("limit=0", "validation_failed"), ("limit=101", "validation_failed"),
                        ("limit=x", "validation_failed"), ("cursor=nonsense", "invalid_cursor"),
                        ("after=a", "validation_failed")):
        await assert_problem(await api.get(ns(tenant, f"/workflow-definitions?{query}"),
                                           headers=tenant.auth), 400, code)
    # A version number is an integer from 1.
    await assert_problem(await api.get(
        ns(tenant, "/workflow-definitions/a/versions/0"), headers=tenant.auth),
        400, "validation_failed")
    await assert_problem(await api.get(
        ns(tenant, "/workflow-definitions/a/versions/x1"), headers=tenant.auth),
        400, "validation_failed")


# --- instances ----------------------------------------------------------------------------------


async def test_start_replays_and_conflicts(api: TestClient[Any, Any], tenant: Tenant,
                                           queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    body = {"definition": "orders", "input": {"n": 1.50e1}, "business_key": "order-7"}
    status, receipt = await call(api, "POST", ns(tenant, "/workflows"), tenant, body, key="s1")
    assert status == 201, receipt
    assert (receipt["definition"], receipt["version"], receipt["state"],
            receipt["business_key"]) == ("orders", 1, "RUNNING", "order-7")
    assert await call(api, "POST", ns(tenant, "/workflows"), tenant, body, key="s1") == (
        201, receipt)
    watch.reset()
    await assert_problem(await api.post(
        ns(tenant, "/workflows"), json={**body, "business_key": "order-8"},
        headers={**tenant.auth, "Idempotency-Key": "s1"}), 409, "idempotency_conflict")
    watch.assert_unchanged()


async def test_start_refusals_write_nothing(api: TestClient[Any, Any], tenant: Tenant,
                                            queue: str, watch: WriteWatch) -> None:
    await published(api, tenant)
    await ok(api, "POST", ns(tenant, "/workflow-definitions"), tenant, {"name": "empty"})
    watch.reset()
    cases: list[tuple[Any, int, str, str | None]] = [
        ({"input": {"n": 1}}, 400, "validation_failed", "$.definition"),
        ({"definition": "Not A Name", "input": {"n": 1}}, 400, "validation_failed",
         "$.definition"),
        ({"definition": "orders", "input": {"n": 1}, "extra": 1}, 400, "validation_failed",
         "$.extra"),
        ({"definition": "orders", "version": 0, "input": {"n": 1}}, 400, "validation_failed",
         "$.version"),
        ({"definition": "orders", "version": "1", "input": {"n": 1}}, 400, "validation_failed",
         "$.version"),
        ({"definition": "orders", "input": {"n": 1}, "business_key": ""}, 400,
         "validation_failed", "$.business_key"),
        ({"definition": "orders", "input": {"n": 1}, "business_key": "k" * 513}, 400,
         "validation_failed", "$.business_key"),
        ({"definition": "orders", "input": {"n": 1}, "business_key": 7}, 400,
         "validation_failed", "$.business_key"),
        ({"definition": "orders", "input": {"n": "one"}}, 400, "validation_failed", None),
        ({"definition": "orders", "version": 9, "input": {"n": 1}}, 404,
         "definition_version_not_found", None),
        ({"definition": "nope", "input": {"n": 1}}, 404, "definition_not_found", None),
        ({"definition": "empty", "input": {"n": 1}}, 409, "definition_not_published", None),
        (b'{"definition": "orders"', 400, "malformed_json", None),
        (b'[]', 400, "validation_failed", "$"),
    ]
    for body, status, code, path in cases:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        problem = await assert_problem(await api.post(
            ns(tenant, "/workflows"), data=data,
            headers={**tenant.auth, "Content-Type": "application/json"}), status, code)
        if path is not None:
            assert path in [e["path"] for e in problem["errors"]], problem
    watch.assert_unchanged()


async def test_get_tells_a_recorded_result_from_an_advanced_one(
        api: TestClient[Any, Any], db: Database, tenant: Tenant,
        sync_conn: pymysql.connections.Connection[Any]) -> None:
    task_id, instance, activation_id = await workflow_task(db, tenant)
    assert activation_id is not None
    path = ns(tenant, f"/workflows/{instance['id'].hex()}")

    async def activation() -> dict[str, Any]:
        got = await ok(api, "GET", path, tenant)
        (step,) = [s for s in got["steps"] if s["name"] == "a"]
        (found,) = step["activations"]
        assert found["id"] == activation_id.hex()
        assert found["task_id"] == task_id.hex()
        return dict(found)

    got = await ok(api, "GET", path, tenant)
    (root,) = [s for s in got["steps"] if s["name"] == "$root"]
    assert (root["activations"][0]["task_state"], root["activations"][0]["result"]) == (
        None, "none")
    assert ((await activation())["task_state"], (await activation())["result"]) == (
        "WAITING", "none")
    await cancel(db, tenant, task_id, reason="stop")
    now = await activation()
    assert (now["task_state"], now["result"]) == ("CANCELLED", "recorded")
    for state, result in (("CONSUMED", "advanced"), ("QUARANTINED", "quarantined")):
        with sync_conn.cursor() as cur:
            cur.execute("UPDATE weave_inbox SET state = %s, consumed_at = IF(%s = 'CONSUMED',"
                        " UTC_TIMESTAMP(6), NULL), quarantine_reason = IF(%s = 'QUARANTINED',"
                        " 'missing_activation', NULL) WHERE namespace_id = %s AND task_id = %s",
                        (state, state, state, tenant.namespace_id, task_id))
        assert (await activation())["result"] == result


async def test_list_filters_pages_and_bound_cursors(api: TestClient[Any, Any], tenant: Tenant,
                                                    queue: str) -> None:
    await published(api, tenant)
    await published(api, tenant, "refunds")
    made = [await start(api, tenant, business_key=f"k{i}") for i in range(3)]
    other = await start(api, tenant, "refunds", business_key="k0")
    url = ns(tenant, "/workflows")
    everything = await ok(api, "GET", url, tenant)
    assert [w["id"] for w in everything["items"]] == [
        other["id"], *[m["id"] for m in reversed(made)]]
    assert "steps" not in everything["items"][0]
    by_def = await ok(api, "GET", url + "?definition=orders&limit=2", tenant)
    assert [w["id"] for w in by_def["items"]] == [made[2]["id"], made[1]["id"]]
    rest = await ok(api, "GET", url + "?definition=orders&limit=2&cursor="
                    + by_def["next_cursor"], tenant)
    assert [w["id"] for w in rest["items"]] == [made[0]["id"]]
    assert rest["next_cursor"] is None
    keyed = await ok(api, "GET", url + "?business_key=k0", tenant)
    assert {w["id"] for w in keyed["items"]} == {made[0]["id"], other["id"]}
    assert (await ok(api, "GET", url + "?state=SUCCEEDED", tenant))["items"] == []
    assert len((await ok(api, "GET", url + "?state=RUNNING", tenant))["items"]) == 4
    assert (await ok(api, "GET", url + "?definition=nope", tenant))["items"] == []
    since = made[1]["created_at"].replace("+00:00", "Z")
    ranged = await ok(api, "GET", url + f"?definition=orders&created_from={since}"
                      f"&created_to={made[2]['created_at'].replace('+00:00', 'Z')}", tenant)
    assert [w["id"] for w in ranged["items"]] == [made[1]["id"]]
    # A cursor belongs to its filter.
    await assert_problem(await api.get(url + "?definition=refunds&limit=2&cursor="
                                       + by_def["next_cursor"], headers=tenant.auth),
                         400, "invalid_cursor")
    for query, code in (("limit=0", "validation_failed"), ("limit=101", "validation_failed"),
                        ("cursor=x", "invalid_cursor"), ("state=DONE", "validation_failed"),
                        ("state=PAUSED", "validation_failed"),  # a flag, never a state
                        ("created_from=yesterday", "validation_failed"),
                        ("business_key=" + "k" * 513, "validation_failed"),
                        ("definition=Bad%20Name", "validation_failed"),
                        ("page=2", "validation_failed")):
        await assert_problem(await api.get(f"{url}?{query}", headers=tenant.auth), 400, code)


# --- tenants and actions ------------------------------------------------------------------------


def every_route(tenant: Tenant, definition: str, workflow_id: str
                ) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", ns(tenant, "/workflow-definitions"), None),
        ("POST", ns(tenant, "/workflow-definitions"), {"name": "fresh"}),
        ("GET", ns(tenant, f"/workflow-definitions/{definition}"), None),
        ("POST", ns(tenant, f"/workflow-definitions/{definition}/versions"),
         {"revision": 2, "document": doc()}),
        ("GET", ns(tenant, f"/workflow-definitions/{definition}/versions/1"), None),
        ("POST", ns(tenant, "/workflow-validations"), {"document": doc()}),
        ("POST", ns(tenant, "/workflows"), {"definition": definition, "input": {"n": 1}}),
        ("GET", ns(tenant, "/workflows"), None),
        ("GET", ns(tenant, f"/workflows/{workflow_id}"), None),
        ("GET", ns(tenant, f"/workflows/{workflow_id}/waits"), None),
        ("GET", ns(tenant, f"/workflows/{workflow_id}?activations=all"), None),
        ("GET", ns(tenant, f"/workflows/{workflow_id}/timeline?order=desc"), None),
        ("GET", ns(tenant, f"/workflows/{workflow_id}/tasks?limit=5"), None),
        ("GET", ns(tenant, "/workflows?definition=orders&version=1"), None),
    ]


async def test_another_tenant_sees_nothing_through_every_route(
        api: TestClient[Any, Any], db: Database, tenant: Tenant, queue: str,
        watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    other = await make_tenant(db)
    await pulse.create_queue(db, other.namespace_id, QUEUE)
    watch.reset()
    # Their key on our namespace: no such namespace, for every route.
    for method, path, body in every_route(tenant, "orders", mine["id"]):
        await assert_problem(await api.request(method, path, json=body, headers=other.auth),
                             404, "namespace_not_found")
    # Our definition's name and our instance's id in their namespace: not found, like any
    # name or id that exists nowhere.
    for method, path, body in every_route(other, "orders", mine["id"]):
        response = await api.request(method, path, json=body, headers=other.auth)
        if method == "GET" and (path.endswith(("/workflow-definitions", "/workflows"))
                                or "/workflows?" in path):
            assert (await response.json())["items"] == []
        elif path.endswith(("/workflow-definitions", "/workflow-validations")):
            assert response.status in {200, 201}, await response.text()
        else:
            code = ("workflow_instance_not_found" if mine["id"] in path
                    else "definition_not_found")
            await assert_problem(response, 404, code)
    # Nothing of ours changed (their own definition "fresh" is theirs).
    with watch.conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM weave_definitions WHERE namespace_id = %s",
                    (tenant.namespace_id,))
        assert cur.fetchone() == (1,)
    await assert_problem(await api.get(ns(tenant, f"/workflows/{ids.new_id().hex()}"),
                                       headers=tenant.auth), 404, "workflow_instance_not_found")
    await assert_problem(await api.get(ns(tenant, "/workflows/not-hex"), headers=tenant.auth),
                         404, "workflow_instance_not_found")


async def test_each_route_needs_its_action(api: TestClient[Any, Any], db: Database,
                                           tenant: Tenant, queue: str,
                                           watch: WriteWatch) -> None:
    await published(api, tenant)
    mine = await start(api, tenant)
    routes = every_route(tenant, "orders", mine["id"])
    needs = ["workflows.read", "workflows.manage", "workflows.read", "workflows.manage",
             "workflows.read", "workflows.manage", "workflows.start", "workflows.read",
             "workflows.read", "workflows.read", "workflows.read", "workflows.read",
             "workflows.read", "workflows.read"]
    everything = ["workflows.read", "workflows.manage", "workflows.start", "tasks.submit"]
    keys = {action: await make_key(db, tenant, [{
        "namespaces": ["*"], "queues": ["*"], "actions": [a for a in everything if a != action]}])
        for action in everything}
    # The owner's keyed start, which a credential that may not start it must not replay.
    await ok(api, "POST", routes[6][1], tenant, routes[6][2], key="start-1")
    watch.reset()
    for (method, path, body), action in zip(routes, needs, strict=True):
        await assert_problem(await api.request(
            method, path, json=body, headers={"Authorization": f"Bearer {keys[action]}"}),
            403, "forbidden")
    # Starting also needs tasks.submit on the version's queues, replayed or not.
    no_submit = keys["tasks.submit"]
    method, path, body = routes[6]
    await assert_problem(await api.request(method, path, json=body, headers={
        "Authorization": f"Bearer {no_submit}", "Idempotency-Key": "start-1"}), 403, "forbidden")
    await assert_problem(await api.request(method, path, json=body,
                                           headers={"Authorization": f"Bearer {no_submit}"}),
                         403, "forbidden")
    watch.assert_unchanged()


# --- the SDK ------------------------------------------------------------------------------------


async def test_the_sdk_end_to_end(api: TestClient[Any, Any], db: Database, tenant: Tenant,
                                  queue: str) -> None:
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        created = await orbit.create_workflow_definition("orders", description="Orders",
                                                         idempotency_key="d1")
        assert (created.name, created.description, created.revision, created.latest_version,
                created.versions) == ("orders", "Orders", 1, None, ())
        assert await orbit.create_workflow_definition(
            "orders", description="Orders", idempotency_key="d1") == created
        checked = await orbit.validate_workflow_definition(doc())
        assert checked.queues == (QUEUE,)
        with pytest.raises(ValidationError) as invalid:
            await orbit.validate_workflow_definition(doc("missing"))
        assert invalid.value.code == "definition_invalid"
        assert invalid.value.errors[0]["path"] == "$.document.steps.a.queue"
        out = await orbit.publish_workflow_version("orders", doc(), revision=1)
        assert (out.published_version, out.revision, out.latest_version) == (1, 2, 1)
        assert out.versions[0].digest == checked.digest
        with pytest.raises(StaleRevision):
            await orbit.publish_workflow_version("orders", doc(), revision=1)
        got = await orbit.get_workflow_definition("orders")
        assert [v.version for v in got.versions] == [1]
        version = await orbit.get_workflow_version("orders", 1)
        assert version.document is not None
        assert version.document["start"] == "a"
        assert [d.name async for d in orbit.list_workflow_definitions(page_size=1)] == [
            "orders"]
        with pytest.raises(NotFound):
            await orbit.get_workflow_version("orders", 2)

        first = await orbit.start_workflow("orders", RawJson('{"n": 1.0e0}'),
                                           business_key="o-1", idempotency_key="w1")
        again = await orbit.start_workflow("orders", RawJson('{"n": 1.0e0}'),
                                           business_key="o-1", idempotency_key="w1")
        assert again == first
        assert (first.definition, first.version, first.state, first.business_key,
                first.finished) == ("orders", 1, "RUNNING", "o-1", False)
        with pytest.raises(IdempotencyConflict):
            await orbit.start_workflow("orders", {"n": 2}, idempotency_key="w1")
        second = await orbit.start_workflow("orders", {"n": 2}, version=1)
        detail = await orbit.get_workflow(first.id)
        (root,) = detail.steps
        assert (root.name, root.kind, root.activations[0].result) == ("$root", "ROOT", "none")
        listed = [w.id async for w in orbit.list_workflows(definition="orders", page_size=1)]
        assert listed == [second.id, first.id]
        assert [w.id async for w in orbit.list_workflows(business_key="o-1")] == [first.id]
        assert [w.id async for w in orbit.list_workflows(
            state="RUNNING", created_from=first.created_at or "",
            created_to=second.created_at or "")] == [first.id]

    # The task source of a workflow's task, through the SDK.
    task_id, instance, activation_id = await workflow_task(db, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        source = await orbit.task_source(task_id.hex())
        assert (source.kind, source.workflow_id, source.version, source.step, source.activation,
                source.sequence) == ("workflow", instance["id"].hex(), 1, "a",
                                     activation_id.hex() if activation_id else None, 1)
        assert source.definition

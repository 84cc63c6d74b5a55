"""``/v1/namespaces/{namespace}/subscriptions`` over HTTP (orbit_api/routes/subscriptions.py):
management, delivery history and detail, budget, pull consumption, bad input and tenant
isolation. Every successful answer is validated against the served OpenAPI schema."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import prometheus_client
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_api.routes import subscriptions as routes
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.model.sealing import new_key_text
from orbit_common.relay import deliveries
from orbit_common.service.config import DeliveryConfig
from orbit_common.service.health import ReadinessGate
from tests.conftest import Tenant, api_config, make_key, make_tenant
from tests.integration.api.conftest import WriteWatch, assert_problem
from tests.support import relay
from tests.support.contract import assert_documented
from tests.support.lease_fixtures import make_queue
from tests.support.servers import ServiceTestServer
from tests.support.waiting import until

COLLECTION = routes.COLLECTION
ITEM = routes.ITEM
DELIVERY = routes.DELIVERY
HOOK = "https://hooks.example.com/orbit"
RELAY_TABLES = ("orbit_subscriptions", "orbit_deliveries", "orbit_delivery_attempts",
                "orbit_audit_events", "orbit_idempotency_keys", "orbit_events")


@pytest.fixture
async def hooks(db: Database, db_url: DatabaseUrl) -> AsyncIterator[TestClient[Any, Any]]:
    """The API with a [delivery] secret_key: WEBHOOK subscriptions can be created."""
    config = api_config(db_url)
    config = type(config)(database=config.database, api=config.api,
                          delivery=DeliveryConfig(secret_key=new_key_text()))
    client = TestClient(ServiceTestServer(create_app(config, db, ReadinessGate(
        SchemaChecker(db)))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def relay_writes(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn, RELAY_TABLES)


def _url(tenant: Tenant, path: str = "", sub: str = "sub") -> str:
    return f"/v1/namespaces/{tenant.namespace}/subscriptions" + (f"/{sub}" if sub else "") + path


async def _ok(response: Any, template: str, method: str, status: int = 200) -> Any:
    text = await response.text()
    assert response.status == status, text
    body = await response.json() if text else None
    assert_documented(template, method, status, body)
    return body


async def _create(api: TestClient[Any, Any], tenant: Tenant, name: str = "sub",
                  **fields: Any) -> dict[str, Any]:
    response = await api.post(_url(tenant, sub=""), headers=tenant.auth,
                              json={"name": name, "kind": "PULL", **fields})
    return dict(await _ok(response, COLLECTION, "post", 201))


async def _results(db: Database, tenant: Tenant, count: int = 3) -> list[bytes]:
    queue = await make_queue(db, tenant, name="q1")
    tasks = await relay.cancelled_results(db, tenant, queue, count)
    await relay.fan_out_all(db, tenant)
    return tasks


async def _lease(api: TestClient[Any, Any], tenant: Tenant, max_: int = 10,
                 sub: str = "sub", **extra: Any) -> list[dict[str, Any]]:
    response = await api.post(_url(tenant, "/lease", sub), headers=tenant.auth,
                              json={"max": max_, **extra})
    body = await _ok(response, ITEM + "/lease", "post")
    return list(body["items"])


# --- management ---------------------------------------------------------------------------------


async def test_create_get_list_update_and_states(api: TestClient[Any, Any], db: Database,
                                                 tenant: Tenant) -> None:
    await make_queue(db, tenant, name="q1")
    created = await _create(api, tenant, filters={"queues": ["q1"], "states": ["FAILED"]},
                            max_attempts=5, lease_ms=5000)
    assert "secret" not in created
    assert created["kind"] == "PULL"
    assert created["state"] == "ACTIVE"
    assert created["filters"] == {"queues": ["q1"], "states": ["FAILED"], "handlers": []}
    got = await _ok(await api.get(_url(tenant), headers=tenant.auth), ITEM, "get")
    assert got == created
    for name in ("sub-b", "sub-c"):
        await _create(api, tenant, name)
    first = await _ok(await api.get(_url(tenant, sub="") + "?limit=2", headers=tenant.auth),
                      COLLECTION, "get")
    assert [s["name"] for s in first["items"]] == ["sub", "sub-b"]
    second = await _ok(await api.get(_url(tenant, sub=""), headers=tenant.auth,
                                     params={"limit": "2", "cursor": first["next_cursor"]}),
                       COLLECTION, "get")
    assert [s["name"] for s in second["items"]] == ["sub-c"]
    assert second["next_cursor"] is None

    updated = await _ok(await api.patch(_url(tenant), headers=tenant.auth, json={
        "revision": created["revision"], "max_attempts": 7, "filters": None}), ITEM, "patch")
    assert (updated["max_attempts"], updated["revision"]) == (7, created["revision"] + 1)
    assert updated["filters"]["queues"] == []
    stale = await api.patch(_url(tenant), headers=tenant.auth,
                            json={"revision": created["revision"], "max_attempts": 8})
    await assert_problem(stale, 409, "stale_revision")

    paused = await _ok(await api.post(_url(tenant, "/pause"), headers=tenant.auth,
                                      json={"reason": "maintenance"}), ITEM + "/pause", "post")
    assert paused["state"] == "PAUSED"
    await assert_problem(await api.post(_url(tenant, "/lease"), headers=tenant.auth),
                         409, "subscription_not_active")
    resumed = await _ok(await api.post(_url(tenant, "/resume"), headers=tenant.auth),
                        ITEM + "/resume", "post")
    assert resumed["state"] == "ACTIVE"
    disabled = await _ok(await api.post(_url(tenant, "/disable"), headers=tenant.auth,
                                        json={"reason": "done"}), ITEM + "/disable", "post")
    assert disabled["state"] == "DISABLED"
    again = await _ok(await api.post(_url(tenant, "/disable"), headers=tenant.auth),
                      ITEM + "/disable", "post")
    assert again["revision"] == disabled["revision"]  # a no-op
    for path in ("/pause", "/resume"):
        await assert_problem(await api.post(_url(tenant, path), headers=tenant.auth),
                             409, "subscription_disabled")
    await assert_problem(await api.patch(_url(tenant), headers=tenant.auth, json={
        "revision": disabled["revision"]}), 409, "subscription_disabled")
    actions = [r["action"] for r in await relay.rows(
        db, "SELECT action FROM orbit_audit_events WHERE namespace_id = %s"
        " AND resource_type = 'subscription' AND resource_id = %s",
        tenant.namespace_id, bytes.fromhex(created["id"]))]
    assert sorted(actions) == sorted([
        "subscription.created", "subscription.updated", "subscription.paused",
        "subscription.resumed", "subscription.disabled"])


async def test_create_is_idempotent_with_a_key(api: TestClient[Any, Any],
                                               tenant: Tenant) -> None:
    headers = {**tenant.auth, "Idempotency-Key": "create-1"}
    body = {"name": "sub", "kind": "PULL"}
    first = await api.post(_url(tenant, sub=""), headers=headers, json=body)
    created = await _ok(first, COLLECTION, "post", 201)
    replay = await _ok(await api.post(_url(tenant, sub=""), headers=headers, json=body),
                       COLLECTION, "post", 201)
    assert replay == created
    other = await api.post(_url(tenant, sub=""), headers=headers,
                           json={**body, "max_attempts": 3})
    await assert_problem(other, 409, "idempotency_conflict")
    await assert_problem(await api.post(_url(tenant, sub=""), headers=tenant.auth, json=body),
                         409, "already_exists")


async def test_a_webhook_secret_is_shown_on_create_and_rotate_only(
        hooks: TestClient[Any, Any], tenant: Tenant) -> None:
    headers = {**tenant.auth, "Idempotency-Key": "hook-1"}
    body = {"name": "hook", "kind": "WEBHOOK", "endpoint_url": HOOK}
    created = await _ok(await hooks.post(_url(tenant, sub=""), headers=headers, json=body),
                        COLLECTION, "post", 201)
    assert created["secret"].startswith("whsec_")
    replay = await _ok(await hooks.post(_url(tenant, sub=""), headers=headers, json=body),
                       COLLECTION, "post", 201)
    assert "secret" not in replay
    assert replay["id"] == created["id"]
    got = await _ok(await hooks.get(_url(tenant, sub="hook"), headers=tenant.auth), ITEM, "get")
    assert "secret" not in got
    assert created["secret"] not in str(got)
    rotated = await _ok(await hooks.post(_url(tenant, "/rotate-secret", "hook"),
                                         headers=tenant.auth, json={"window_s": 60}),
                        ITEM + "/rotate-secret", "post")
    assert rotated["secret"].startswith("whsec_")
    assert rotated["secret"] != created["secret"]
    assert rotated["previous_secret_valid_until"] is not None
    assert rotated["subscription"]["revision"] == created["revision"] + 1
    # A webhook subscription is the pump's: a consumer cannot lease it.
    await assert_problem(await hooks.post(_url(tenant, "/lease", "hook"), headers=tenant.auth),
                         409, "subscription_not_pull")
    await _create(hooks, tenant, "pull")
    await assert_problem(await hooks.post(_url(tenant, "/rotate-secret", "pull"),
                                          headers=tenant.auth), 400, "validation_failed")


async def test_webhooks_need_the_operators_key(api: TestClient[Any, Any], tenant: Tenant,
                                               relay_writes: WriteWatch) -> None:
    relay_writes.reset()
    response = await api.post(_url(tenant, sub=""), headers=tenant.auth, json={
        "name": "hook", "kind": "WEBHOOK", "endpoint_url": HOOK})
    await assert_problem(response, 503, "webhooks_unavailable")
    relay_writes.assert_unchanged()


@pytest.mark.parametrize(("body", "status", "code", "path"), [
    ({"name": "sub", "kind": "PULL", "colour": 1}, 400, "validation_failed", "$.colour"),
    ({"name": "Bad Name", "kind": "PULL"}, 400, "validation_failed", "$.name"),
    ({"name": "sub", "kind": "PUSH"}, 400, "validation_failed", "$.kind"),
    ({"name": "sub", "kind": "PULL", "endpoint_url": HOOK}, 400, "validation_failed",
     "$.endpoint_url"),
    ({"name": "sub", "kind": "WEBHOOK"}, 400, "validation_failed", "$.endpoint_url"),
    ({"name": "sub", "kind": "WEBHOOK", "endpoint_url": "https://10.0.0.1/x"}, 400,
     "endpoint_refused", None),
    ({"name": "sub", "kind": "WEBHOOK", "endpoint_url": "not a url"}, 400,
     "endpoint_refused", None),
    ({"name": "sub", "kind": "PULL", "max_attempts": 0}, 400, "validation_failed",
     "$.max_attempts"),
    ({"name": "sub", "kind": "PULL", "filters": {"queues": "q1"}}, 400, "validation_failed",
     "$.filters.queues"),
    ({"name": "sub", "kind": "PULL", "filters": {"states": ["DONE"]}}, 400,
     "validation_failed", "$.filters.states[0]"),
    ({"name": "sub", "kind": "WEBHOOK", "endpoint_url": HOOK, "secret": "whsec_" + "A" * 190},
     400, "validation_failed", "$.secret"),
    ({"name": "sub", "kind": "PULL", "filters": {"queues": ["nope"]}}, 404, "queue_not_found",
     None),
    ({"name": "sub", "kind": "PULL", "start_after_sequence": 10**9}, 400, "validation_failed",
     "$.start_after_sequence"),
])
async def test_bad_create_input_writes_nothing(hooks: TestClient[Any, Any], tenant: Tenant,
                                               relay_writes: WriteWatch, body: dict[str, Any],
                                               status: int, code: str,
                                               path: str | None) -> None:
    relay_writes.reset()
    response = await hooks.post(_url(tenant, sub=""), headers=tenant.auth, json=body)
    problem = await assert_problem(response, status, code)
    if path is not None:
        assert path in [e["path"] for e in problem["errors"]], problem
    relay_writes.assert_unchanged()


@pytest.mark.parametrize(("method", "path", "body", "query"), [
    ("patch", "", {"max_attempts": 3}, ""),  # no revision
    ("patch", "", {"revision": 1, "lease_ms": 10}, ""),
    ("patch", "", {"revision": 1, "backoff_initial_ms": 5000, "backoff_max_ms": 10}, ""),
    ("post", "/pause", {"reason": ""}, ""),
    ("post", "/pause", {"why": "x"}, ""),
    ("post", "/rotate-secret", {"window_s": -1}, ""),
    ("post", "/lease", {"max": 0}, ""),
    ("post", "/lease", {"wait_ms": routes.WAIT_MAX_MS + 1}, ""),
    ("post", "/settle", {"items": []}, ""),
    ("post", "/settle", {"items": [{"delivery_id": "0" * 32, "token": "t",
                                    "outcome": "maybe"}]}, ""),
    ("post", "/settle", {"items": [{"delivery_id": "0" * 32, "token": "t",
                                    "outcome": "acknowledged", "error": "x"}]}, ""),
    ("post", "/settle", {"items": [{"delivery_id": "0" * 32, "token": "t",
                                    "outcome": "failed"}] * 2}, ""),
    ("post", "/deliveries/xyz/ack", {"token": "t"}, ""),
    ("post", f"/deliveries/{'0' * 32}/ack", {}, ""),
    ("post", f"/deliveries/{'0' * 32}/ack", {"token": "t", "error": "x"}, ""),
    ("post", f"/deliveries/{'0' * 32}/fail", {"token": "t", "error": "x" * 1025}, ""),
    ("post", f"/deliveries/{'0' * 32}/budget", {"attempts": 0, "reason": "r"}, ""),
    ("post", f"/deliveries/{'0' * 32}/budget", {"attempts": 1}, ""),
    ("get", "/deliveries", None, "?state=DONE"),
    ("get", "/deliveries", None, "?limit=0"),
    ("get", "", None, "?x=1"),
])
async def test_bad_input_is_a_problem_and_writes_nothing(
        api: TestClient[Any, Any], tenant: Tenant, relay_writes: WriteWatch, method: str,
        path: str, body: Any, query: str) -> None:
    await _create(api, tenant)
    relay_writes.reset()
    response = await api.request(method, _url(tenant, path) + query, headers=tenant.auth,
                                 json=body)
    await assert_problem(response, 400, "validation_failed")
    relay_writes.assert_unchanged()


async def test_a_cursor_that_is_not_the_servers_is_refused(api: TestClient[Any, Any],
                                                           tenant: Tenant) -> None:
    await _create(api, tenant)
    for path in ("/deliveries", ""):
        sub = "sub" if path else ""
        response = await api.get(_url(tenant, path, sub) + "?cursor=bm9wZQ", headers=tenant.auth)
        await assert_problem(response, 400, "invalid_cursor")


# --- deliveries ---------------------------------------------------------------------------------


async def test_history_detail_and_budget(api: TestClient[Any, Any], db: Database,
                                         tenant: Tenant) -> None:
    await _create(api, tenant, max_attempts=1)
    tasks = await _results(db, tenant, 3)
    first = await _ok(await api.get(_url(tenant, "/deliveries") + "?limit=2",
                                    headers=tenant.auth), ITEM + "/deliveries", "get")
    second = await _ok(await api.get(_url(tenant, "/deliveries"), headers=tenant.auth,
                                     params={"limit": "2", "cursor": first["next_cursor"]}),
                       ITEM + "/deliveries", "get")
    listed = first["items"] + second["items"]
    assert sorted(d["task_id"] for d in listed) == sorted(t.hex() for t in tasks)
    keys = [(d["created_at"], d["id"]) for d in listed]
    assert keys == sorted(keys, reverse=True)  # newest first
    # A cursor is bound to the state filter.
    await assert_problem(await api.get(_url(tenant, "/deliveries"), headers=tenant.auth, params={
        "state": "PENDING", "cursor": first["next_cursor"]}), 400, "invalid_cursor")

    (leased,) = await _lease(api, tenant, 1)
    delivery_id = leased["delivery"]["id"]
    failed = await _ok(await api.post(_url(tenant, f"/deliveries/{delivery_id}/fail"),
                                      headers=tenant.auth,
                                      json={"token": leased["lease_token"], "error": "boom"}),
                       DELIVERY + "/fail", "post")
    assert (failed["state"], failed["attempts_used"]) == ("EXHAUSTED", 1)
    exhausted = await _ok(await api.get(_url(tenant, "/deliveries") + "?state=EXHAUSTED",
                                        headers=tenant.auth), ITEM + "/deliveries", "get")
    assert [d["id"] for d in exhausted["items"]] == [delivery_id]
    detail = await _ok(await api.get(_url(tenant, f"/deliveries/{delivery_id}"),
                                     headers=tenant.auth), DELIVERY, "get")
    assert detail["snapshot"]["task_id"] == leased["delivery"]["task_id"]
    assert [(a["attempt"], a["outcome"], a["error"]) for a in detail["attempts"]] == [
        (1, "FAILED", "boom")]
    assert leased["lease_token"] not in await (await api.get(
        _url(tenant, f"/deliveries/{delivery_id}"), headers=tenant.auth)).text()

    budget_url = _url(tenant, f"/deliveries/{delivery_id}/budget")
    await assert_problem(await api.post(budget_url, headers=tenant.auth, json={"attempts": 2}),
                         400, "validation_failed")
    given = await _ok(await api.post(budget_url, headers=tenant.auth,
                                     json={"attempts": 2, "reason": "endpoint fixed"}),
                      DELIVERY + "/budget", "post")
    assert (given["state"], given["attempts_used"], given["max_attempts"]) == ("PENDING", 1, 3)
    await assert_problem(await api.post(budget_url, headers=tenant.auth,
                                        json={"attempts": 1, "reason": "again"}),
                         409, "delivery_not_exhausted")
    (audit,) = await relay.rows(db, "SELECT reason FROM orbit_audit_events WHERE"
                                " action = 'delivery.budget_added' AND resource_id = %s",
                                bytes.fromhex(delivery_id))
    assert audit["reason"] == "endpoint fixed"
    await assert_problem(await api.get(_url(tenant, f"/deliveries/{'0' * 32}"),
                                       headers=tenant.auth), 404, "delivery_not_found")


# --- pull consumption ---------------------------------------------------------------------------


async def test_lease_acknowledge_fail_and_settle(api: TestClient[Any, Any], db: Database,
                                                 tenant: Tenant) -> None:
    await _create(api, tenant)
    tasks = await _results(db, tenant, 4)
    leased = await _lease(api, tenant, 3)
    assert [item["delivery"]["task_id"] for item in leased] == [t.hex() for t in tasks[:3]]
    assert all(item["delivery"]["attempt"] == 1 for item in leased)
    one, two, three = leased

    def ack_url(item: dict[str, Any], verb: str = "ack") -> str:
        return _url(tenant, f"/deliveries/{item['delivery']['id']}/{verb}")

    acked = await _ok(await api.post(ack_url(one), headers=tenant.auth,
                                     json={"token": one["lease_token"]}), DELIVERY + "/ack", "post")
    assert (acked["settled"], acked["state"], acked["repeated"]) == (True, "ACKNOWLEDGED", False)
    again = await _ok(await api.post(ack_url(one), headers=tenant.auth,
                                     json={"token": one["lease_token"]}), DELIVERY + "/ack", "post")
    assert again["repeated"] is True
    await assert_problem(await api.post(ack_url(two), headers=tenant.auth,
                                        json={"token": one["lease_token"]}),
                         409, "delivery_lease_lost")
    nacked = await _ok(await api.post(ack_url(two, "fail"), headers=tenant.auth,
                                      json={"token": two["lease_token"]}),
                       DELIVERY + "/fail", "post")
    assert nacked["state"] == "PENDING"

    settled = await _ok(await api.post(_url(tenant, "/settle"), headers=tenant.auth, json={
        "items": [
            {"delivery_id": three["delivery"]["id"], "token": three["lease_token"],
             "outcome": "acknowledged"},
            {"delivery_id": "0" * 32, "token": "x", "outcome": "failed", "error": "no"},
            {"delivery_id": two["delivery"]["id"], "token": two["lease_token"],
             "outcome": "acknowledged"},
        ]}), ITEM + "/settle", "post")
    assert [(i["settled"], i.get("state"), i.get("code")) for i in settled["items"]] == [
        (True, "ACKNOWLEDGED", None), (False, None, "delivery_not_found"),
        (False, None, "delivery_lease_lost")]
    sub = await relay.subscription_row(db, tenant)
    assert sub["backlog"] == 2  # four created, two acknowledged


def _poll_reads() -> float:
    """How many of the long poll's cheap reads (``relay.poll`` transactions) ran so far."""
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_db_transaction_seconds_count", {"transaction": "relay.poll"}) or 0.0


async def test_a_long_poll_waits_for_a_delivery(api: TestClient[Any, Any], db: Database,
                                                tenant: Tenant) -> None:
    await _create(api, tenant)
    queue = await make_queue(db, tenant, name="q1")
    assert await _lease(api, tenant, 5, wait_ms=100) == []  # waited, found nothing

    async def later() -> None:
        await relay.cancelled_results(db, tenant, queue, 1)
        await relay.fan_out_all(db, tenant)

    # The request is waiting once it has made a cheap read after its empty lease (the API runs
    # in this process: its transaction metric counts those reads).
    polls = _poll_reads()
    waiting = asyncio.create_task(_lease(api, tenant, 5, wait_ms=10_000))
    await until(lambda: _poll_reads() > polls, message="the long poll is waiting")
    assert not waiting.done()
    await later()
    found = await asyncio.wait_for(waiting, 10)
    assert len(found) == 1


# --- authorization and tenant isolation ---------------------------------------------------------


async def test_another_tenants_ids_tokens_and_cursors_are_not_found(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    other = await make_tenant(db)
    for who in (tenant, other):
        await _create(api, who)
        await _results(db, who, 2)
    (mine,) = await _lease(api, tenant, 1)
    (theirs,) = await _lease(api, other, 1)
    their_id = theirs["delivery"]["id"]
    for method, path, body in [
        ("get", f"/deliveries/{their_id}", None),
        ("post", f"/deliveries/{their_id}/ack", {"token": theirs["lease_token"]}),
        ("post", f"/deliveries/{their_id}/fail", {"token": theirs["lease_token"]}),
        ("post", f"/deliveries/{their_id}/budget", {"attempts": 1, "reason": "r"}),
    ]:
        response = await api.request(method, _url(tenant, path), headers=tenant.auth, json=body)
        await assert_problem(response, 404, "delivery_not_found")
    settled = await _ok(await api.post(_url(tenant, "/settle"), headers=tenant.auth, json={
        "items": [{"delivery_id": their_id, "token": theirs["lease_token"],
                   "outcome": "acknowledged"}]}), ITEM + "/settle", "post")
    assert settled["items"][0]["code"] == "delivery_not_found"
    # Their token on my delivery is no lease of mine.
    await assert_problem(await api.post(
        _url(tenant, f"/deliveries/{mine['delivery']['id']}/ack"), headers=tenant.auth,
        json={"token": theirs["lease_token"]}), 409, "delivery_lease_lost")
    # Their cursor is bound to their subscription.
    page = await _ok(await api.get(_url(other, "/deliveries") + "?limit=1", headers=other.auth),
                     ITEM + "/deliveries", "get")
    await assert_problem(await api.get(_url(tenant, "/deliveries"), headers=tenant.auth,
                                       params={"limit": "1", "cursor": page["next_cursor"]}),
                         400, "invalid_cursor")
    # Their namespace is not mine.
    await assert_problem(await api.get(_url(other), headers=tenant.auth), 404,
                         "namespace_not_found")
    # Their delivery is untouched.
    (row,) = await relay.rows(db, "SELECT state FROM orbit_deliveries WHERE id = %s",
                              bytes.fromhex(their_id))
    assert row["state"] == "LEASED"


async def test_consume_needs_the_consume_action(api: TestClient[Any, Any], db: Database,
                                                tenant: Tenant) -> None:
    await _create(api, tenant)
    await _results(db, tenant, 1)
    reader = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["subscriptions.read"],
                                          "queues": ["*"]}])
    auth = {"Authorization": f"Bearer {reader}"}
    await _ok(await api.get(_url(tenant), headers=auth), ITEM, "get")
    await assert_problem(await api.post(_url(tenant, "/lease"), headers=auth), 403, "forbidden")
    (leased,) = await _lease(api, tenant, 1)
    ack = _url(tenant, f"/deliveries/{leased['delivery']['id']}/ack")
    await assert_problem(await api.post(ack, headers=auth, json={"token": leased["lease_token"]}),
                         403, "forbidden")
    await assert_problem(await api.post(_url(tenant, "/pause"), headers=auth), 403, "forbidden")
    stranger = await make_key(db, tenant, [{"namespaces": ["*"],
                                            "actions": ["subscriptions.read"],
                                            "queues": ["elsewhere"]}])
    await assert_problem(await api.get(_url(tenant), headers={
        "Authorization": f"Bearer {stranger}"}), 404, "subscription_not_found")


async def test_a_subscription_cannot_filter_a_queue_its_owner_may_not_read(
        api: TestClient[Any, Any], db: Database, tenant: Tenant,
        relay_writes: WriteWatch) -> None:
    await make_queue(db, tenant, name="mine")
    await make_queue(db, tenant, name="secret-q")
    key = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["subscriptions.*", "tasks.read"], "queues": ["mine"]},
        {"namespaces": ["*"], "actions": ["subscriptions.manage"], "queues": ["secret-q"]}])
    auth = {"Authorization": f"Bearer {key}"}
    relay_writes.reset()
    response = await api.post(_url(tenant, sub=""), headers=auth, json={
        "name": "peek", "kind": "PULL", "filters": {"queues": ["secret-q"]}})
    await assert_problem(response, 403, "forbidden")
    relay_writes.assert_unchanged()
    created = await _create(api, tenant, "ok", filters={"queues": ["mine"]})
    response = await api.patch(_url(tenant, sub="ok"), headers=auth, json={
        "revision": created["revision"], "filters": {"queues": ["secret-q"]}})
    await assert_problem(response, 403, "forbidden")


async def test_unauthenticated_requests_are_refused(api: TestClient[Any, Any],
                                                    tenant: Tenant) -> None:
    await assert_problem(await api.get(_url(tenant)), 401, "unauthenticated")


def test_every_route_is_in_the_document() -> None:
    paths = set(routes.OPENAPI_PATHS)
    assert paths == {COLLECTION, ITEM, ITEM + "/pause", ITEM + "/resume", ITEM + "/disable",
                     ITEM + "/rotate-secret", ITEM + "/deliveries", DELIVERY,
                     DELIVERY + "/budget", ITEM + "/lease", DELIVERY + "/ack",
                     DELIVERY + "/fail", ITEM + "/settle"}
    assert deliveries.LEASE_BATCH_MAX == routes.LEASE_MAX


async def test_a_subscription_name_is_compared_exactly(api: TestClient[Any, Any],
                                                       tenant: Tenant,
                                                       relay_writes: WriteWatch) -> None:
    await _create(api, tenant)
    relay_writes.reset()
    for variant in ("sub%20", "SUB", "sub "):
        response = await api.get(_url(tenant, sub=variant), headers=tenant.auth)
        await assert_problem(response, 404, "subscription_not_found")
        response = await api.post(_url(tenant, "/pause", variant), headers=tenant.auth)
        await assert_problem(response, 404, "subscription_not_found")
    relay_writes.assert_unchanged()

"""Queues over the API: create, get, list, idempotent create, PATCH with revision CAS, pause and
resume through the execution gate -- against the real database (docs/api/queues.md)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pymysql
from aiohttp.test_utils import TestClient

from orbit_api.routes.queues import COLLECTION
from orbit_common.db.pool import Database
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_queues_support import (
    DEFAULTS,
    QueueWrites,
    create,
    get,
    list_all,
    qwrites,
    rows,
    set_active_attempts,
    url,
)
from tests.support.contract import assert_documented

__all__ = ["qwrites"]  # the fixture, imported for the tests below

CONCURRENCY = 8
ALL_SET = {
    "description": "payments, EU",
    "offer_lease_ms": 1500,
    "execution_lease_ms": 120000,
    "retry": {"max_attempts": 7, "initial_ms": 250, "max_ms": 900000, "multiplier": 1.5,
              "jitter": 0},
    "max_concurrent_attempts": 4,
}


def _config(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k not in {"id", "name", "created_at", "updated_at"}}


# --- create and get ------------------------------------------------------------------------------


async def test_create_fills_the_defaults_and_commits_gate_event_and_audit(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("orders")
    qwrites.reset()
    created = await create(api, tenant, name)
    assert qwrites.delta() == {"pulse_queues": 1, "pulse_execution_gates": 1,
                               "orbit_events": 1, "orbit_audit_events": 1}
    assert created["name"] == name
    assert _config(created) == DEFAULTS
    assert len(created["id"]) == 32
    assert created["created_at"] == created["updated_at"]
    assert created["created_at"].endswith("+00:00")
    assert await get(api, tenant, name) == created

    queue_id = bytes.fromhex(created["id"])
    (queue,) = rows(sync_conn, "SELECT * FROM pulse_queues WHERE namespace_id = %s AND id = %s",
                    tenant.namespace_id, queue_id)
    (gate,) = rows(sync_conn, "SELECT * FROM pulse_execution_gates"
                              " WHERE namespace_id = %s AND id = %s",
                   tenant.namespace_id, queue["gate_id"])
    assert (gate["owner_kind"], gate["owner_id"], gate["state"], gate["control_revision"]) == (
        "QUEUE", queue_id, "OPEN", 1)
    (event,) = rows(sync_conn, "SELECT * FROM orbit_events WHERE aggregate_id = %s", queue_id)
    assert event["namespace_id"] == tenant.namespace_id
    assert (event["aggregate_type"], event["event_type"], event["aggregate_revision"]) == (
        "queue", "queue.created", 1)
    assert json.loads(event["payload"]) == created
    (audit,) = rows(sync_conn, "SELECT * FROM orbit_audit_events WHERE resource_id = %s",
                    queue_id)
    assert (audit["action"], audit["resource_type"], audit["actor_kind"]) == (
        "queue.create", "queue", "credential")
    assert audit["namespace_id"] == tenant.namespace_id
    assert audit["application_id"] == tenant.application_id
    assert json.loads(audit["after_doc"]) == created


async def test_create_with_every_field_set(api: TestClient[Any, Any], tenant: Tenant) -> None:
    name = unique("all")
    created = await create(api, tenant, name, **ALL_SET)
    assert {k: created[k] for k in ALL_SET} == ALL_SET
    assert created["revision"] == 1
    assert await get(api, tenant, name) == created


async def test_decimals_come_back_as_numbers_in_their_shortest_spelling(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    """docs/api/README.md "数值": decimals are JSON numbers, written in their shortest form;
    a request may send numbers in any spelling (or, for compatibility, decimal strings)."""
    for retry in ('{"multiplier": 2.500, "jitter": 1.0}',
                  '{"multiplier": "2.500", "jitter": "1.0"}',
                  '{"multiplier": 25e-1, "jitter": 1}'):
        name = unique("dec")
        body = f'{{"name": "{name}", "retry": {retry}}}'
        response = await api.post(url(tenant.namespace), data=body.encode(),
                                  headers={**tenant.auth, "Content-Type": "application/json"})
        assert response.status == 201, await response.text()
        text = await response.text()
        assert '"multiplier":2.5,"jitter":1}' in text, text
        assert_documented(COLLECTION, "post", 201, json.loads(text))
        got = await api.get(url(tenant.namespace, name), headers=tenant.auth)
        assert '"multiplier":2.5,"jitter":1}' in await got.text()
        assert_documented(COLLECTION + "/{queue}", "get", 200, await got.json())
        listed = await api.get(url(tenant.namespace), headers=tenant.auth)
        assert '"multiplier":2.5,"jitter":1}' in await listed.text()
    response = await api.post(url(tenant.namespace), json={"name": unique("dec"), "retry": {
        "multiplier": 1.0005}}, headers=tenant.auth)
    assert response.status == 400
    assert (await response.json())["errors"][0]["path"] == "$.retry.multiplier"


async def test_a_name_is_unique_per_namespace(
    api: TestClient[Any, Any], db: Any, tenant: Tenant, qwrites: QueueWrites
) -> None:
    name = unique("dup")
    await create(api, tenant, name)
    qwrites.reset()
    response = await api.post(url(tenant.namespace), json={"name": name}, headers=tenant.auth)
    await assert_problem(response, 409, "already_exists")
    qwrites.assert_unchanged()
    # The same name in another namespace is another queue.
    other = await make_tenant(db)
    assert (await create(api, other, name))["name"] == name


async def test_get_of_a_missing_queue_is_queue_not_found(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    response = await api.get(url(tenant.namespace, unique("missing")), headers=tenant.auth)
    body = await assert_problem(response, 404, "queue_not_found")
    assert body["instance"].startswith(url(tenant.namespace))


# --- list ----------------------------------------------------------------------------------------


async def test_list_pages_through_every_queue_by_name(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    names = sorted(unique(f"q{i}") for i in range(7))
    for name in reversed(names):
        await create(api, tenant, name)
    for limit, pages in ((3, 3), (7, 1), (1, 7), (100, 1)):
        assert await list_all(api, tenant.namespace, tenant.auth, limit) == (names, pages)
    response = await api.get(url(tenant.namespace), headers=tenant.auth)
    page = await response.json()
    assert [item["name"] for item in page["items"]] == names
    assert page["items"][0] == await get(api, tenant, names[0])
    assert page["next_cursor"] is None


async def test_a_page_that_ends_exactly_at_the_last_queue_has_no_next_cursor(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    for i in range(4):
        await create(api, tenant, f"exact-{i}")
    response = await api.get(url(tenant.namespace) + "?limit=2", headers=tenant.auth)
    first = await response.json()
    assert first["next_cursor"] is not None
    response = await api.get(
        url(tenant.namespace) + f"?limit=2&cursor={first['next_cursor']}", headers=tenant.auth
    )
    second = await response.json()
    assert [q["name"] for q in second["items"]] == ["exact-2", "exact-3"]
    assert second["next_cursor"] is None


async def test_an_empty_namespace_lists_nothing(api: TestClient[Any, Any], tenant: Tenant) -> None:
    response = await api.get(url(tenant.namespace), headers=tenant.auth)
    assert await response.json() == {"items": [], "next_cursor": None}


async def test_a_cursor_is_bound_to_its_namespace(
    api: TestClient[Any, Any], db: Any, tenant: Tenant
) -> None:
    for i in range(3):
        await create(api, tenant, f"bound-{i}")
    response = await api.get(url(tenant.namespace) + "?limit=1", headers=tenant.auth)
    cursor = (await response.json())["next_cursor"]
    # A second namespace of the same application, readable with the same key.
    other = unique("ns")
    created = await api.post("/v1/namespaces", json={"name": other}, headers=tenant.auth)
    assert created.status == 201
    response = await api.get(f"{url(other)}?cursor={cursor}", headers=tenant.auth)
    await assert_problem(response, 400, "invalid_cursor")


async def test_a_queue_created_between_pages_appears_in_a_later_page(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    for name in ("kb", "kd"):
        await create(api, tenant, name)
    response = await api.get(url(tenant.namespace) + "?limit=1", headers=tenant.auth)
    first = await response.json()
    assert [q["name"] for q in first["items"]] == ["kb"]
    await create(api, tenant, "ka")  # before the position: not seen
    await create(api, tenant, "kc")  # after it: seen
    response = await api.get(
        url(tenant.namespace) + f"?limit=10&cursor={first['next_cursor']}", headers=tenant.auth
    )
    assert [q["name"] for q in (await response.json())["items"]] == ["kc", "kd"]


# --- idempotent create ---------------------------------------------------------------------------


async def _post(
    api: TestClient[Any, Any], tenant: Tenant, body: bytes, key: str | None
) -> tuple[int, bytes]:
    extra = {"Idempotency-Key": key} if key is not None else {}
    response = await api.post(url(tenant.namespace), data=body,
                              headers={**tenant.auth, "Content-Type": "application/json", **extra})
    return response.status, await response.read()


async def test_same_key_and_body_replays_the_original_response(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    key, name = unique("key"), unique("idem")
    body = json.dumps({"name": name, "description": "first"}).encode()
    qwrites.reset()
    first = await _post(api, tenant, body, key)
    assert first[0] == 201
    after_first = qwrites.delta()
    assert after_first == {"pulse_queues": 1, "pulse_execution_gates": 1, "orbit_events": 1,
                           "orbit_audit_events": 1, "orbit_idempotency_keys": 1}
    for _ in range(3):
        assert await _post(api, tenant, body, key) == first
    # Spelled differently, the same request: explicit defaults, another decimal spelling.
    same = {"name": name, "description": "first", "offer_lease_ms": 30000,
            "retry": {"multiplier": "2.0", "jitter": "0.200"}, "max_concurrent_attempts": None}
    assert await _post(api, tenant, json.dumps(same).encode(), key) == first
    assert qwrites.delta() == after_first
    (idem,) = rows(sync_conn, "SELECT * FROM orbit_idempotency_keys WHERE idem_key = %s",
                   key.encode())
    assert idem["namespace_id"] == tenant.namespace_id
    assert (idem["operation"], idem["scope"]) == ("queues.create", name.encode())
    assert idem["resource_id"] == bytes.fromhex(json.loads(first[1])["id"])


async def test_the_replay_is_the_original_snapshot(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    key, name = unique("key"), unique("snap")
    body = json.dumps({"name": name}).encode()
    first = await _post(api, tenant, body, key)
    pause = await api.post(url(tenant.namespace, name, "pause"), json={"reason": "test"},
                           headers=tenant.auth)
    assert pause.status == 200
    assert await _post(api, tenant, body, key) == first
    assert json.loads(first[1])["paused"] is False


async def test_same_key_with_another_body_is_a_conflict_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    key, name = unique("key"), unique("conf")
    first = await _post(api, tenant, json.dumps({"name": name}).encode(), key)
    assert first[0] == 201
    qwrites.reset()
    for other in ({"name": name, "offer_lease_ms": 1000},
                  {"name": name, "retry": {"jitter": "0.3"}}):
        response = await api.post(url(tenant.namespace), json=other,
                                  headers={**tenant.auth, "Idempotency-Key": key})
        await assert_problem(response, 409, "idempotency_conflict")
    qwrites.assert_unchanged()


async def test_a_key_is_scoped_to_the_queue_name(
    api: TestClient[Any, Any], db: Database, tenant: Tenant
) -> None:
    """The scope is the unit of authorization: a key limited to another queue that reuses the
    owner's Idempotency-Key creates its own queue and learns nothing of the first request."""
    key = unique("key")
    first = await _post(api, tenant, json.dumps({"name": "qa2"}).encode(), key)
    assert first[0] == 201
    scoped = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["queues.*"],
                                          "queues": ["qa1"]}])
    response = await api.post(url(tenant.namespace), json={"name": "qa1"},
                              headers={"Authorization": f"Bearer {scoped}",
                                       "Idempotency-Key": key})
    assert response.status == 201, await response.text()
    assert (await response.json())["name"] == "qa1"


async def test_a_key_is_scoped_to_the_namespace(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    key, name = unique("key"), unique("scoped")
    other = unique("ns")
    assert (await api.post("/v1/namespaces", json={"name": other}, headers=tenant.auth)).status \
        == 201
    body = json.dumps({"name": name}).encode()
    first = await _post(api, tenant, body, key)
    response = await api.post(f"/v1/namespaces/{other}/queues", data=body,
                              headers={**tenant.auth, "Content-Type": "application/json",
                                       "Idempotency-Key": key})
    assert response.status == 201
    assert (await response.json())["id"] != json.loads(first[1])["id"]


async def test_concurrent_identical_creates_make_one_queue(
    big_api: TestClient[Any, Any], tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    key, name = unique("key"), unique("race")
    body = json.dumps({"name": name, **ALL_SET}).encode()
    answers = await asyncio.gather(*(_post(big_api, tenant, body, key)
                                     for _ in range(CONCURRENCY)))
    assert len(set(answers)) == 1, answers
    assert answers[0][0] == 201
    (count,) = rows(sync_conn, "SELECT COUNT(*) AS n FROM pulse_queues WHERE namespace_id = %s"
                               " AND name = %s", tenant.namespace_id, name)
    assert count["n"] == 1
    (gates,) = rows(sync_conn, "SELECT COUNT(*) AS n FROM pulse_execution_gates"
                               " WHERE namespace_id = %s", tenant.namespace_id)
    assert gates["n"] == 1


async def test_concurrent_creates_without_a_key_give_one_queue_and_conflicts(
    big_api: TestClient[Any, Any], tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("race")
    body = json.dumps({"name": name}).encode()
    answers = await asyncio.gather(*(_post(big_api, tenant, body, None)
                                     for _ in range(CONCURRENCY)))
    assert Counter(status for status, _ in answers) == {201: 1, 409: CONCURRENCY - 1}
    assert {json.loads(b)["code"] for s, b in answers if s == 409} == {"already_exists"}
    (gates,) = rows(sync_conn, "SELECT COUNT(*) AS n FROM pulse_execution_gates"
                               " WHERE namespace_id = %s", tenant.namespace_id)
    assert gates["n"] == 1  # the losers' gate rows rolled back with them


# --- PATCH: compare-and-set on revision ----------------------------------------------------------


async def _patch(
    api: TestClient[Any, Any], tenant: Tenant, name: str, body: dict[str, Any]
) -> Any:
    return await api.patch(url(tenant.namespace, name), json=body, headers=tenant.auth)


async def test_patch_bumps_the_revision_and_never_touches_active_attempts(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("cas")
    created = await create(api, tenant, name)
    set_active_attempts(sync_conn, tenant, name, 3)
    qwrites.reset()
    response = await _patch(api, tenant, name, {"revision": 1, **ALL_SET})
    assert response.status == 200, await response.text()
    updated = await response.json()
    assert qwrites.delta() == {"orbit_events": 1, "orbit_audit_events": 1}
    assert updated["revision"] == 2
    assert updated["active_attempts"] == 3
    assert {k: updated[k] for k in ALL_SET} == ALL_SET
    assert updated["gate"] == created["gate"]
    assert updated["created_at"] == created["created_at"]
    assert updated["updated_at"] > created["updated_at"]
    assert await get(api, tenant, name) == updated

    queue_id = bytes.fromhex(created["id"])
    (event,) = rows(sync_conn, "SELECT * FROM orbit_events WHERE aggregate_id = %s"
                               " AND event_type = 'queue.updated'", queue_id)
    assert event["aggregate_revision"] == 2
    payload = json.loads(event["payload"])
    # The event keeps the internal form of the settings (decimals as strings, as in the
    # request digest); the API's representation writes them as numbers.
    assert payload["before"]["retry"] == {**DEFAULTS["retry"], "multiplier": "2", "jitter": "0.2"}
    assert payload["after"]["retry"] == {**ALL_SET["retry"], "multiplier": "1.5", "jitter": "0"}
    (audit,) = rows(sync_conn, "SELECT * FROM orbit_audit_events WHERE resource_id = %s"
                               " AND action = 'queue.update'", queue_id)
    assert audit["resource_revision"] == 2
    assert json.loads(audit["before_doc"])["revision"] == 1
    assert json.loads(audit["after_doc"]) == updated

    # A second change needs the new revision; the counter still survives.
    set_active_attempts(sync_conn, tenant, name, 5)
    response = await _patch(api, tenant, name, {"revision": 2, "description": "again"})
    assert response.status == 200
    again = await response.json()
    assert (again["revision"], again["active_attempts"]) == (3, 5)


async def test_a_stale_revision_is_409_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    name = unique("stale")
    await create(api, tenant, name)
    response = await _patch(api, tenant, name, {"revision": 1, "description": "first wins"})
    assert response.status == 200
    current = await get(api, tenant, name)
    qwrites.reset()
    for revision in (1, 3, 99):
        response = await _patch(api, tenant, name,
                                {"revision": revision, "description": "second loses"})
        body = await assert_problem(response, 409, "stale_revision")
        assert "revision" in body["detail"]
    # Even a patch that would change nothing is refused at a stale revision.
    response = await _patch(api, tenant, name, {"revision": 1, "description": "first wins"})
    await assert_problem(response, 409, "stale_revision")
    qwrites.assert_unchanged()
    assert await get(api, tenant, name) == current


async def test_a_patch_that_changes_nothing_keeps_the_revision(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    name = unique("noop")
    created = await create(api, tenant, name, **ALL_SET)
    qwrites.reset()
    for body in ({"revision": 1}, {"revision": 1, **ALL_SET},
                 {"revision": 1, "retry": {"multiplier": "1.50"}}):
        response = await _patch(api, tenant, name, body)
        assert response.status == 200
        assert await response.json() == created
    qwrites.assert_unchanged()


async def test_patch_merges_partial_retry_and_handles_null_concurrency(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    name = unique("merge")
    await create(api, tenant, name, max_concurrent_attempts=2)
    response = await _patch(api, tenant, name, {"revision": 1, "retry": {"max_attempts": 9}})
    updated = await response.json()
    assert updated["retry"] == {**DEFAULTS["retry"], "max_attempts": 9}
    assert updated["max_concurrent_attempts"] == 2  # omitted: unchanged
    response = await _patch(api, tenant, name, {"revision": 2, "max_concurrent_attempts": None})
    updated = await response.json()
    assert updated["max_concurrent_attempts"] is None  # null: unlimited
    assert updated["revision"] == 3


async def test_patch_checks_max_ms_against_the_merged_initial_ms(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    name = unique("merge")
    await create(api, tenant, name)  # initial 1000, max 60000
    qwrites.reset()
    response = await _patch(api, tenant, name, {"revision": 1, "retry": {"max_ms": 999}})
    body = await assert_problem(response, 400, "validation_failed")
    assert [e["path"] for e in body["errors"]] == ["$.retry.max_ms"]
    response = await _patch(api, tenant, name, {"revision": 1, "retry": {"initial_ms": 60001}})
    body = await assert_problem(response, 400, "validation_failed")
    assert [e["path"] for e in body["errors"]] == ["$.retry.max_ms"]
    qwrites.assert_unchanged()
    response = await _patch(api, tenant, name,
                            {"revision": 1, "retry": {"initial_ms": 0, "max_ms": 0}})
    assert response.status == 200


async def test_two_concurrent_patches_at_one_revision_one_wins(
    big_api: TestClient[Any, Any], tenant: Tenant
) -> None:
    name = unique("race")
    await create(big_api, tenant, name)
    responses = await asyncio.gather(*(
        big_api.patch(url(tenant.namespace, name),
                      json={"revision": 1, "description": f"writer {i}"}, headers=tenant.auth)
        for i in range(CONCURRENCY)
    ))
    assert Counter(r.status for r in responses) == {200: 1, 409: CONCURRENCY - 1}
    (winner,) = [await r.json() for r in responses if r.status == 200]
    assert await get(big_api, tenant, name) == winner
    assert winner["revision"] == 2


# --- pause and resume ----------------------------------------------------------------------------


async def test_pause_and_resume_move_the_gate_and_are_audited(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("gate")
    created = await create(api, tenant, name)
    set_active_attempts(sync_conn, tenant, name, 2)
    qwrites.reset()
    response = await api.post(url(tenant.namespace, name, "pause"),
                              json={"reason": "incident 42"}, headers=tenant.auth)
    assert response.status == 200, await response.text()
    paused = await response.json()
    assert qwrites.delta() == {"orbit_events": 1, "orbit_audit_events": 1}
    assert paused["paused"] is True
    assert paused["gate"] == {"state": "PAUSED", "control_revision": 2, "reason": "incident 42"}
    # The configuration and the runtime counter are not the gate's business.
    assert (paused["revision"], paused["active_attempts"]) == (1, 2)
    assert paused["updated_at"] == created["updated_at"]
    assert await get(api, tenant, name) == paused

    response = await api.post(url(tenant.namespace, name, "resume"),
                              json={"reason": "incident 42 over"}, headers=tenant.auth)
    assert response.status == 200
    resumed = await response.json()
    assert resumed["paused"] is False
    assert resumed["gate"] == {"state": "OPEN", "control_revision": 3,
                               "reason": "incident 42 over"}

    queue_id = bytes.fromhex(created["id"])
    audits = rows(sync_conn, "SELECT * FROM orbit_audit_events WHERE resource_id = %s"
                             " AND action IN ('queue.pause', 'queue.resume')"
                             " ORDER BY occurred_at, action", queue_id)
    assert [(a["action"], a["reason"]) for a in audits] == [
        ("queue.pause", "incident 42"), ("queue.resume", "incident 42 over")]
    credential = rows(sync_conn, "SELECT id FROM orbit_credentials WHERE application_id = %s",
                      tenant.application_id)[0]["id"]
    for audit in audits:
        assert (audit["actor_kind"], audit["actor_id"]) == ("credential", credential.hex())
        assert audit["namespace_id"] == tenant.namespace_id
        assert audit["request_id"]
    assert json.loads(audits[0]["before_doc"])["gate"]["state"] == "OPEN"
    assert json.loads(audits[0]["after_doc"])["gate"]["state"] == "PAUSED"
    gate_id = rows(sync_conn, "SELECT gate_id FROM pulse_queues WHERE id = %s",
                   queue_id)[0]["gate_id"]
    events = rows(sync_conn, "SELECT * FROM orbit_events WHERE aggregate_id = %s"
                             " ORDER BY aggregate_revision", gate_id)
    assert [(e["aggregate_type"], e["event_type"], e["aggregate_revision"], e["from_state"],
             e["to_state"]) for e in events] == [
        ("execution_gate", "queue.paused", 2, "OPEN", "PAUSED"),
        ("execution_gate", "queue.resumed", 3, "PAUSED", "OPEN"),
    ]
    assert all(e["namespace_id"] == tenant.namespace_id for e in events)


async def test_pausing_a_paused_queue_changes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, qwrites: QueueWrites
) -> None:
    name = unique("twice")
    await create(api, tenant, name)
    response = await api.post(url(tenant.namespace, name, "pause"), json={"reason": "first"},
                              headers=tenant.auth)
    paused = await response.json()
    qwrites.reset()
    response = await api.post(url(tenant.namespace, name, "pause"), json={"reason": "second"},
                              headers=tenant.auth)
    assert response.status == 200
    assert await response.json() == paused  # the first reason stays
    for body in ({}, None, {"reason": ""}):  # a repeat needs its reason too
        response = await api.post(url(tenant.namespace, name, "pause"), json=body,
                                  headers=tenant.auth)
        assert response.status == 400
        assert (await response.json())["errors"][0]["path"] == "$.reason"
    qwrites.assert_unchanged()
    await api.post(url(tenant.namespace, name, "resume"), json={"reason": "done"},
                   headers=tenant.auth)
    qwrites.reset()
    response = await api.post(url(tenant.namespace, name, "resume"), json={"reason": "done"},
                              headers=tenant.auth)
    assert (await response.json())["gate"]["control_revision"] == 3
    qwrites.assert_unchanged()


async def test_a_pause_survives_a_patch_and_a_patch_survives_a_pause(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    name = unique("both")
    await create(api, tenant, name)
    await api.post(url(tenant.namespace, name, "pause"), json={"reason": "test"},
                   headers=tenant.auth)
    # Pausing does not move the configuration revision, so revision 1 is still current.
    response = await _patch(api, tenant, name, {"revision": 1, "offer_lease_ms": 5000})
    assert response.status == 200
    updated = await response.json()
    assert updated["paused"] is True
    assert (updated["revision"], updated["gate"]["control_revision"]) == (2, 2)


async def test_concurrent_pauses_take_one_control_revision(
    big_api: TestClient[Any, Any], tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    name = unique("race")
    created = await create(big_api, tenant, name)
    responses = await asyncio.gather(*(
        big_api.post(url(tenant.namespace, name, "pause"), json={"reason": f"r{i}"},
                     headers=tenant.auth)
        for i in range(CONCURRENCY)
    ))
    views = [await r.json() for r in responses]
    assert {r.status for r in responses} == {200}
    assert {v["gate"]["control_revision"] for v in views} == {2}
    assert len({v["gate"]["reason"] for v in views}) == 1
    (count,) = rows(sync_conn, "SELECT COUNT(*) AS n FROM orbit_audit_events"
                               " WHERE resource_id = %s AND action = 'queue.pause'",
                    bytes.fromhex(created["id"]))
    assert count["n"] == 1

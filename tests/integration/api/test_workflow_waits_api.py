"""GET /v1/namespaces/{namespace}/workflows/{workflow_id}/waits and the waits of the instance
detail's steps (docs/api/workflows.md § 等待), through HTTP and the SDK, against the real
database: a TIMER's wait while it waits and after it fired, a SIGNAL wait's correlation key as
UTF-8 text or base64, 404 for another tenant's instance and an unknown id, 403 without
``workflows.read`` (the authorization matrix sends every attacker key here too)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, NotFound

from orbit_common.db.clock import to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.weave.engine import Engine
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_workflows_api import ns, ok, published, start
from tests.support.lease_fixtures import db_time

TIMERS = {"format": "orbit.weave/1",
          "input_schema": {"type": "object", "properties": {"at": {"type": "string"}},
                           "required": ["at"]},
          "start": "pause",
          "steps": {"pause": {"kind": "TIMER", "until": "input.at", "next": "done"},
                    "done": {"kind": "SUCCEED"}}}


async def advance_alone(db: Database, tenant: Tenant, instance_id: bytes) -> None:
    """Advance this instance's due pending advances only (the worker's database is shared
    with other tests, so no lease scan): lease them by hand, then one advance."""
    engine = Engine(db, owner="waits-api")

    async def lease(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("UPDATE weave_pending_advances SET state = 'LEASED', lease_owner = %s,"
                          " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,"
                          " attempts = attempts + 1 WHERE namespace_id = %s AND instance_id = %s"
                          " AND state = 'PENDING' AND due_at <= UTC_TIMESTAMP(6)",
                          (engine.owner, tenant.namespace_id, instance_id))
        await cur.execute("SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                          " AND instance_id = %s AND state = 'LEASED' AND lease_owner = %s",
                          (tenant.namespace_id, instance_id, engine.owner))
        return [dict(r) for r in await cur.fetchall()]

    rows = await db.transaction("test.lease_alone", lease)
    assert rows
    await engine.advance(tenant.namespace_id, instance_id, [], rows)


async def test_a_timer_wait_is_read_while_it_waits_and_after_it_fired(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await published(api, tenant, "timers", TIMERS)
    now = (await db_time(db)).replace(tzinfo=dt.UTC)
    later, earlier = now + dt.timedelta(hours=1), now - dt.timedelta(seconds=3)
    waiting = await start(api, tenant, "timers", input={"at": later.isoformat()})
    fired = await start(api, tenant, "timers", input={"at": earlier.isoformat()})
    for instance in (waiting, fired):
        await advance_alone(db, tenant, bytes.fromhex(instance["id"]))
    await advance_alone(db, tenant, bytes.fromhex(fired["id"]))  # the due timer

    (wait,) = (await ok(api, "GET", ns(tenant, f"/workflows/{waiting['id']}/waits"),
                        tenant))["items"]
    detail = await ok(api, "GET", ns(tenant, f"/workflows/{waiting['id']}"), tenant)
    steps = {s["name"]: s for s in detail["steps"]}
    assert steps["pause"]["state"] == "WAITING"
    assert steps["pause"]["waits"] == [wait]
    assert steps["$root"]["waits"] == []
    assert wait == {
        "id": wait["id"], "step": "pause", "step_id": steps["pause"]["id"],
        "activation_id": steps["pause"]["activations"][0]["id"], "activation_sequence": 1,
        "kind": "TIMER", "state": "WAITING", "generation": 1,
        "first_deadline_at": later.isoformat(timespec="microseconds"),
        "deadline_at": later.isoformat(timespec="microseconds"), "signal_name": None,
        "correlation_key": None, "correlation_key_encoding": None, "payload_versions": None,
        "winner_signal_id": None, "fired_at": None, "late_ms": None,
        "created_at": wait["created_at"], "updated_at": wait["updated_at"]}

    (done,) = (await ok(api, "GET", ns(tenant, f"/workflows/{fired['id']}/waits"),
                        tenant))["items"]
    assert (done["state"], done["first_deadline_at"]) == (
        "FIRED", earlier.isoformat(timespec="microseconds"))
    assert done["late_ms"] >= 3000
    fired_at = dt.datetime.fromisoformat(done["fired_at"])
    assert done["late_ms"] == (fired_at - earlier) // dt.timedelta(milliseconds=1)

    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        (seen,) = await orbit.list_workflow_waits(fired["id"])
        assert (seen.kind, seen.state, seen.step, seen.late_ms, seen.fired_at,
                seen.first_deadline_at) == ("TIMER", "FIRED", "pause", done["late_ms"],
                                            fired_at, earlier)
        instance = await orbit.get_workflow(waiting["id"])
        (pause,) = [s for s in instance.steps if s.name == "pause"]
        assert [(w.id, w.state, w.deadline_at) for w in pause.waits] == [
            (wait["id"], "WAITING", later)]
        with pytest.raises(NotFound):
            await orbit.list_workflow_waits(ids.new_id().hex())


async def insert_signal_wait(db: Database, tenant: Tenant, instance_id: bytes,
                             key: bytes) -> None:
    """A SIGNAL wait row as the signal support writes it (the view reads both kinds)."""
    async def body(cur: Any) -> None:
        now = to_db((await db_time(db)).replace(tzinfo=dt.UTC))
        await cur.execute(
            "INSERT INTO weave_waits (namespace_id, id, instance_id, step_id, activation_id,"
            " kind, generation, signal_name, correlation_key, payload_versions, state,"
            " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, 'SIGNAL', 1, 'paid', %s,"
            " '[1, 2]', 'WAITING', %s, %s)",
            (tenant.namespace_id, ids.new_id(), instance_id, ids.new_id(), ids.new_id(), key,
             now, now))
    await db.transaction("test.signal_wait", body)


async def test_a_correlation_key_is_utf8_text_or_base64(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await published(api, tenant, "timers", TIMERS)
    instance = await start(api, tenant, "timers", input={"at": "2030-01-01T00:00:00Z"})
    raw_id = bytes.fromhex(instance["id"])
    await insert_signal_wait(db, tenant, raw_id, "订单 o-1 ".encode())
    await insert_signal_wait(db, tenant, raw_id, b"\xff\x00o")
    items = (await ok(api, "GET", ns(tenant, f"/workflows/{instance['id']}/waits"),
                      tenant))["items"]
    found = sorted((w["correlation_key"], w["correlation_key_encoding"]) for w in items)
    assert found == [("/wBv", "base64"), ("订单 o-1 ", "utf8")]
    assert {(w["kind"], w["signal_name"], json.dumps(w["payload_versions"]), w["step"],
             w["deadline_at"]) for w in items} == {("SIGNAL", "paid", "[1, 2]", None, None)}


async def test_waits_of_another_tenant_or_an_unknown_instance_are_not_found(
        api: TestClient[Any, Any], db: Database, tenant: Tenant) -> None:
    await published(api, tenant, "timers", TIMERS)
    mine = await start(api, tenant, "timers", input={"at": "2030-01-01T00:00:00Z"})
    other = await make_tenant(db)
    await assert_problem(await api.get(ns(other, f"/workflows/{mine['id']}/waits"),
                                       headers=other.auth), 404, "workflow_instance_not_found")
    await assert_problem(await api.get(ns(tenant, f"/workflows/{mine['id']}/waits"),
                                       headers=other.auth), 404, "namespace_not_found")
    for bad in (ids.new_id().hex(), "not-hex"):
        await assert_problem(await api.get(ns(tenant, f"/workflows/{bad}/waits"),
                                           headers=tenant.auth), 404,
                             "workflow_instance_not_found")
    await assert_problem(await api.get(ns(tenant, f"/workflows/{mine['id']}/waits?x=1"),
                                       headers=tenant.auth), 400, "validation_failed")
    blind = await make_key(db, tenant, [{"namespaces": ["*"], "queues": ["*"],
                                         "actions": ["workflows.start", "workflows.manage"]}])
    await assert_problem(await api.get(ns(tenant, f"/workflows/{mine['id']}/waits"),
                                       headers={"Authorization": f"Bearer {blind}"}),
                         403, "forbidden")

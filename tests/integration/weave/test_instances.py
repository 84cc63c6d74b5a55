"""Workflow instances: start in one transaction (gate, $root step and activation, ROOT
advance, event), idempotent start, pinned versions, input validation, get, list with cursors,
tenant isolation."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc
from orbit_common.weave import definitions, instances
from tests.conftest import Tenant, make_key, make_tenant
from tests.integration.weave.support import counts, document, principal, published
from tests.support.lease_fixtures import make_queue, scalar


def plain(body: object) -> object:
    """A body as a client reads it (the recorded receipt is stored as JSON)."""
    return json.loads(jsondoc.dumps(body))


async def test_start_writes_the_instance_its_gate_root_step_and_advance(
        db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    who = await principal(db, tenant.api_key)
    out = await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                         input_json=b'{"n": 1}', business_key="order-7")
    assert out.status == 201
    body = out.body
    assert body["state"] == "RUNNING"
    assert body["version"] == 1
    assert body["business_key"] == "order-7"
    assert json.loads(str(body["input"])) == {"n": 1}
    instance_id = bytes.fromhex(body["id"])
    gate = await scalar(db, "SELECT CONCAT(g.owner_kind, ':', g.state) AS g FROM weave_instances i"
                            " JOIN pulse_execution_gates g ON g.namespace_id = i.namespace_id"
                            " AND g.id = i.gate_id AND g.owner_id = i.id WHERE i.id = %s",
                        instance_id)
    assert gate == "WORKFLOW:OPEN"
    assert await scalar(db, "SELECT CONCAT(kind, ':', state) AS a FROM weave_pending_advances"
                            " WHERE instance_id = %s", instance_id) == "ROOT:PENDING"
    assert await scalar(db, "SELECT COUNT(*) AS n FROM orbit_events WHERE aggregate_id = %s"
                            " AND event_type = 'workflow.started'", instance_id) == 1
    got = await instances.get_instance(db, who, namespace=tenant.namespace,
                                       instance_id=body["id"])
    # The receipt is the instance as it was stored (built from what the start wrote).
    assert plain({k: v for k, v in got.items() if k != "steps"}) == plain(body)
    (root,) = got["steps"]
    assert (root["name"], root["kind"], root["state"]) == ("$root", "ROOT", "RUNNING")
    (activation,) = root["activations"]
    assert (activation["sequence"], activation["state"]) == (1, "LIVE")


async def test_start_with_a_key_replays_the_receipt_and_conflicts(db: Database,
                                                                   tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    who = await principal(db, tenant.api_key)
    first = await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                           input_json=b'{"n": 1}', idempotency_key="s1")
    again = await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                           input_json=b'{"n":1}', idempotency_key="s1")
    assert plain(again.body) == plain(first.body)
    with pytest.raises(errors.IdempotencyConflict):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": 2}', idempotency_key="s1")
    assert (await counts(db, tenant.namespace_id))["weave_instances"] == 1


async def test_bad_start_input_writes_nothing(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    who = await principal(db, tenant.api_key)
    before = await counts(db, tenant.namespace_id)
    gates = await scalar(db, "SELECT COUNT(*) AS n FROM pulse_execution_gates"
                             " WHERE namespace_id = %s", tenant.namespace_id)
    with pytest.raises(errors.ValidationFailed) as wrong_type:
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": "one"}')
    assert [p["path"] for p in wrong_type.value.errors] == ["$.input.n"]
    with pytest.raises(errors.ValidationFailed) as missing:
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b"{}")
    assert missing.value.errors[0]["path"].startswith("$.input")
    with pytest.raises(errors.ValidationFailed) as key:
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": 1}', business_key="")
    assert [p["path"] for p in key.value.errors] == ["$.business_key"]
    with pytest.raises(errors.ValidationFailed) as version:
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": 1}', version=0)
    assert [p["path"] for p in version.value.errors] == ["$.version"]
    with pytest.raises(errors.MalformedJson):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": ')
    with pytest.raises(definitions.VersionNotFound):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": 1}', version=9)
    with pytest.raises(definitions.DefinitionNotFound):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition="nope",
                                       input_json=b'{"n": 1}')
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="empty")
    with pytest.raises(instances.DefinitionNotPublished):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition="empty",
                                       input_json=b'{"n": 1}')
    after = await counts(db, tenant.namespace_id)
    assert after == {**before, "weave_definitions": before["weave_definitions"] + 1}
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_execution_gates"
                            " WHERE namespace_id = %s", tenant.namespace_id) == gates


async def test_start_needs_tasks_submit_on_the_version_queues(db: Database,
                                                               tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    key = await make_key(db, tenant, [{"namespaces": [tenant.namespace], "queues": ["*"],
                                       "actions": ["workflows.start", "workflows.read"]}])
    with pytest.raises(errors.Forbidden):
        await instances.start_instance(db, await principal(db, key),
                                       namespace=tenant.namespace, definition=name,
                                       input_json=b'{"n": 1}')
    assert (await counts(db, tenant.namespace_id))["weave_instances"] == 0


async def test_an_instance_keeps_the_version_it_started_on(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    who = await principal(db, tenant.api_key)
    v1 = await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                        input_json=b'{"n": 1}')
    await definitions.publish_version(db, who, namespace=tenant.namespace, name=name,
                                      revision=2, document=document(queue.name, handler="v2"))
    v2 = await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                        input_json=b'{"n": 1}')
    pinned = await instances.start_instance(db, who, namespace=tenant.namespace,
                                            definition=name, input_json=b'{"n": 1}', version=1)
    assert (v1.body["version"], v2.body["version"], pinned.body["version"]) == (1, 2, 1)
    again = await instances.get_instance(db, who, namespace=tenant.namespace,
                                         instance_id=v1.body["id"])
    assert again["version"] == 1
    assert again["version_digest"] == v1.body["version_digest"] != v2.body["version_digest"]


async def test_list_filters_pages_and_tenants(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    first, second = (await published(db, tenant, queue.name),
                     await published(db, tenant, queue.name))
    who = await principal(db, tenant.api_key)
    started = []
    for i in range(5):
        out = await instances.start_instance(
            db, who, namespace=tenant.namespace, definition=first if i < 4 else second,
            input_json=b'{"n": 1}', business_key=f"k{i % 2}")
        started.append(out.body["id"])
    seen, cursor = [], None
    while True:
        page = await instances.list_instances(db, who, namespace=tenant.namespace,
                                              definition=first, limit=3, cursor=cursor)
        seen += [i["id"] for i in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(started[:4])
    assert len(set(seen)) == 4
    keyed = await instances.list_instances(db, who, namespace=tenant.namespace,
                                           business_key="k1")
    assert sorted(i["id"] for i in keyed.items) == sorted([started[1], started[3]])
    running = await instances.list_instances(db, who, namespace=tenant.namespace,
                                             state="RUNNING")
    assert len(running.items) == 5
    assert (await instances.list_instances(db, who, namespace=tenant.namespace,
                                           state="SUCCEEDED")).items == []
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    assert (await instances.list_instances(db, who, namespace=tenant.namespace,
                                           created_from=future)).items == []
    assert len((await instances.list_instances(db, who, namespace=tenant.namespace,
                                               created_to=future)).items) == 5
    page = await instances.list_instances(db, who, namespace=tenant.namespace, limit=2)
    assert page.next_cursor is not None
    with pytest.raises(errors.InvalidCursor):
        await instances.list_instances(db, who, namespace=tenant.namespace, limit=2,
                                       state="RUNNING", cursor=page.next_cursor)
    with pytest.raises(errors.ValidationFailed) as bad:
        await instances.list_instances(db, who, namespace=tenant.namespace, state="DONE",
                                       limit=0)
    assert sorted(p["path"] for p in bad.value.errors) == ["limit", "state"]
    other = await make_tenant(db)
    stranger = await principal(db, other.api_key)
    assert (await instances.list_instances(db, stranger, namespace=other.namespace)).items == []
    with pytest.raises(instances.InstanceNotFound):
        await instances.get_instance(db, stranger, namespace=other.namespace,
                                     instance_id=started[0])
    with pytest.raises(definitions.DefinitionNotFound):
        await instances.start_instance(db, stranger, namespace=other.namespace,
                                       definition=first, input_json=b'{"n": 1}')

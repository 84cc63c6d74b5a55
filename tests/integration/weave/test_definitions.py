"""Workflow definitions: create, publish (CAS, scope, audit, idempotency), get, list, validate;
bad input changes nothing; another tenant sees nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import digests
from orbit_common.weave import definitions, instances
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.weave.support import counts, document, principal
from tests.support.lease_fixtures import make_queue, scalar


async def test_create_and_publish_writes_the_version_its_scope_and_an_audit(
        db: Database, tenant: Tenant) -> None:
    q1, q2 = await make_queue(db, tenant), await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    created = await definitions.create_definition(db, who, namespace=tenant.namespace,
                                                  name="orders", description="Orders")
    assert created.status == 201
    assert created.body["revision"] == 1
    assert created.body["latest_version"] is None
    doc = document(q1.name, extra_queue=q2.name)
    out = await definitions.publish_version(db, who, namespace=tenant.namespace, name="orders",
                                            revision=1, document=doc)
    assert out.status == 201
    assert out.body["published_version"] == 1
    assert out.body["revision"] == 2
    got = await definitions.get_definition(db, who, namespace=tenant.namespace, name="orders")
    (version,) = got["versions"]
    assert version["version"] == 1
    stored = str(version["document"]).encode()
    assert version["digest"] == digests.sha256(stored).hex()
    scope = await scalar(db, "SELECT queue_ids FROM weave_version_scopes WHERE namespace_id = %s"
                             " AND definition_id = %s", tenant.namespace_id,
                         bytes.fromhex(got["id"]))
    assert json.loads(scope) == sorted([q1.id.hex(), q2.id.hex()])
    assert await scalar(db, "SELECT COUNT(*) AS n FROM orbit_audit_events WHERE resource_id = %s"
                            " AND action = 'workflow_definition.version_published'",
                        bytes.fromhex(got["id"])) == 1
    pinned = await db.read("t", lambda cur: definitions.load_version(
        cur, tenant.namespace_id, bytes.fromhex(got["id"]), 1))
    assert pinned.scope.queue_ids == tuple(sorted([q1.id, q2.id]))
    assert pinned.definition.queues == tuple(sorted([q1.name, q2.name]))


async def test_bad_input_is_refused_with_paths_and_writes_nothing(db: Database,
                                                                   tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    with pytest.raises(errors.ValidationFailed) as bad_name:
        await definitions.create_definition(db, who, namespace=tenant.namespace, name="Bad Name")
    assert [p["path"] for p in bad_name.value.errors] == ["$.name"]
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    before = await counts(db, tenant.namespace_id)
    with pytest.raises(errors.AlreadyExists):
        await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    broken = json.loads(document(queue.name))
    broken["steps"]["a"]["next"] = "nowhere"
    with pytest.raises(errors.DefinitionInvalid) as invalid:
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                          revision=1, document=json.dumps(broken).encode())
    assert invalid.value.errors[0]["path"] == "$.steps.a.next"
    with pytest.raises(errors.DefinitionInvalid) as missing:
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                          revision=1, document=document("no-such-queue"))
    assert [(p["path"], p["code"]) for p in missing.value.errors] == [
        ("$.steps.a.queue", "queue_not_found")]
    with pytest.raises(errors.ValidationFailed) as bad_revision:
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                          revision=0, document=document(queue.name))
    assert [p["path"] for p in bad_revision.value.errors] == ["$.revision"]
    with pytest.raises(definitions.DefinitionNotFound):
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="nope",
                                          revision=1, document=document(queue.name))
    assert await counts(db, tenant.namespace_id) == before


async def test_publish_is_a_cas_on_the_revision(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                      revision=1, document=document(queue.name))
    with pytest.raises(errors.StaleRevision):
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                          revision=1, document=document(queue.name, handler="x"))
    out = await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                            revision=2, document=document(queue.name, handler="x"))
    assert out.body["published_version"] == 2
    got = await definitions.get_definition(db, who, namespace=tenant.namespace, name="wf")
    first, second = got["versions"]
    assert first["digest"] != second["digest"]
    assert json.loads(str(first["document"]))["steps"]["a"]["handler"] == "work.do"


async def test_publish_with_a_key_replays_and_conflicts(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    first = await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                              revision=1, document=document(queue.name),
                                              idempotency_key="k1")
    again = await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                              revision=1, document=document(queue.name),
                                              idempotency_key="k1")
    assert again.body == first.body
    with pytest.raises(errors.IdempotencyConflict):
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                          revision=1, idempotency_key="k1",
                                          document=document(queue.name, handler="other"))
    assert (await counts(db, tenant.namespace_id))["weave_definition_versions"] == 1


async def test_publish_needs_tasks_submit_on_every_queue(db: Database, tenant: Tenant) -> None:
    allowed, other = await make_queue(db, tenant), await make_queue(db, tenant)
    key = await make_key(db, tenant, [
        {"namespaces": [tenant.namespace], "queues": ["*"],
         "actions": ["workflows.manage", "workflows.read"]},
        {"namespaces": [tenant.namespace], "queues": [allowed.name], "actions": ["tasks.submit"]},
    ])
    who = await principal(db, key)
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    with pytest.raises(errors.DefinitionInvalid) as refused:
        await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                          revision=1,
                                          document=document(allowed.name, extra_queue=other.name))
    assert [p["path"] for p in refused.value.errors] == ["$.steps.b.queue"]
    out = await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                            revision=1, document=document(allowed.name))
    assert out.body["published_version"] == 1


async def test_published_versions_are_immutable(db: Database, tenant: Tenant,
                                                sync_conn: pymysql.connections.Connection[Any]
                                                ) -> None:
    queue = await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    await definitions.publish_version(db, who, namespace=tenant.namespace, name="wf",
                                      revision=1, document=document(queue.name))
    with sync_conn.cursor() as cur:
        for sql in ("UPDATE weave_definition_versions SET document = '{}' WHERE namespace_id = %s",
                    "DELETE FROM weave_definition_versions WHERE namespace_id = %s",
                    "UPDATE weave_version_scopes SET queue_ids = '[]' WHERE namespace_id = %s"):
            with pytest.raises(pymysql.err.OperationalError):
                cur.execute(sql, (tenant.namespace_id,))


async def test_a_version_without_its_scope_is_not_used(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    name = unique("wf")
    who = await principal(db, tenant.api_key)
    created = await definitions.create_definition(db, who, namespace=tenant.namespace, name=name)
    definition_id = bytes.fromhex(created.body["id"])
    text = document(queue.name)

    async def body(cur: Any) -> None:
        await cur.execute(
            "INSERT INTO weave_definition_versions (namespace_id, definition_id, version,"
            " document, digest, created_by_credential_id, created_at)"
            " VALUES (%s, %s, 1, %s, %s, %s, UTC_TIMESTAMP(6))",
            (tenant.namespace_id, definition_id, text.decode(), digests.sha256(text),
             who.credential_id))

    await db.transaction("test.version", body)
    with pytest.raises(definitions.VersionScopeMismatch):
        await db.read("t", lambda cur: definitions.load_version(
            cur, tenant.namespace_id, definition_id, 1))
    # The start's one-statement read verifies the same way, so no instance starts on it.
    with pytest.raises(definitions.VersionScopeMismatch):
        await db.read("t", lambda cur: definitions.pin_by_name(
            cur, tenant.namespace_id, name, 1))
    with pytest.raises(definitions.VersionScopeMismatch):
        await instances.start_instance(db, who, namespace=tenant.namespace, definition=name,
                                       version=1, input_json=b"{}")
    # Nor with a scope whose digest is not the version's.
    await db.transaction("test.scope", lambda cur: cur.execute(
        "INSERT INTO weave_version_scopes (namespace_id, definition_id, version, digest,"
        " queue_ids, created_at) VALUES (%s, %s, 1, %s, '[]', UTC_TIMESTAMP(6))",
        (tenant.namespace_id, definition_id, digests.sha256(text + b" "))))
    with pytest.raises(definitions.VersionScopeMismatch):
        await db.read("t", lambda cur: definitions.pin_by_name(
            cur, tenant.namespace_id, name, 1))


async def test_validate_list_and_tenant_isolation(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    checked = definitions.validate(document(queue.name))
    assert checked["queues"] == [queue.name]
    with pytest.raises(errors.DefinitionInvalid):
        definitions.validate(b'{"format": "orbit.weave/1"}')
    assert await counts(db, tenant.namespace_id) == dict.fromkeys(
        await counts(db, tenant.namespace_id), 0)
    for name in ("b-wf", "a-wf", "c-wf"):
        await definitions.create_definition(db, who, namespace=tenant.namespace, name=name)
    page = await definitions.list_definitions(db, who, namespace=tenant.namespace, limit=2)
    assert [d["name"] for d in page] == ["a-wf", "b-wf"]
    rest = await definitions.list_definitions(db, who, namespace=tenant.namespace, after="b-wf")
    assert [d["name"] for d in rest] == ["c-wf"]
    other = await make_tenant(db)
    stranger = await principal(db, other.api_key)
    assert await definitions.list_definitions(db, stranger, namespace=other.namespace) == []
    with pytest.raises(definitions.DefinitionNotFound):
        await definitions.get_definition(db, stranger, namespace=other.namespace, name="a-wf")
    with pytest.raises(errors.NamespaceNotFound):
        await definitions.get_definition(db, stranger, namespace=tenant.namespace, name="a-wf")


async def test_two_racing_publishes_of_one_revision_make_one_version(db: Database,
                                                                       tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    who = await principal(db, tenant.api_key)
    await definitions.create_definition(db, who, namespace=tenant.namespace, name="wf")
    outcomes = await asyncio.gather(*(
        definitions.publish_version(db, who, namespace=tenant.namespace, name="wf", revision=1,
                                    document=document(queue.name, handler=f"h{i}"))
        for i in range(2)), return_exceptions=True)
    assert sorted(type(o).__name__ for o in outcomes) == ["Replay", "StaleRevision"]
    got = await definitions.get_definition(db, who, namespace=tenant.namespace, name="wf")
    assert [v["version"] for v in got["versions"]] == [1]
    assert got["revision"] == 2


async def test_reading_and_managing_workflows_need_a_grant_on_every_queue(
        db: Database, tenant: Tenant) -> None:
    """Definitions and instances span queues: a key scoped to some queues may not read or
    manage them (authz.NAMESPACE_WIDE), even with tasks.submit on every queue they use."""
    queue = await make_queue(db, tenant)
    scoped = await principal(db, await make_key(db, tenant, [
        {"namespaces": [tenant.namespace], "queues": [queue.name],
         "actions": ["workflows.manage", "workflows.read", "tasks.submit"]},
    ]))
    with pytest.raises(errors.Forbidden):
        await definitions.create_definition(db, scoped, namespace=tenant.namespace, name="wf")
    with pytest.raises(errors.Forbidden):
        await definitions.list_definitions(db, scoped, namespace=tenant.namespace)

"""``orbit admin workflows``: the real CLI as a subprocess reads definitions, versions and
instances of a namespace by name (the API's views; the operator needs no API credential)."""

from __future__ import annotations

import json
from typing import Any

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.weave import definitions, instances, signals
from tests.conftest import Tenant
from tests.integration.test_admin_cli import ACTOR, ok, orbit_admin
from tests.integration.weave.support import document, principal, published
from tests.integration.weave.test_inbox import workflow_task
from tests.support.lease_fixtures import make_queue


async def test_definitions_list_get_and_version(db: Database, db_url: DatabaseUrl,
                                                tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    first = await published(db, tenant, queue.name, name="a-flow")
    await published(db, tenant, queue.name, name="b-flow")
    listed = await ok(db_url, "workflows", "definitions", "list", "--namespace",
                      tenant.namespace)
    lines = [json.loads(line) for line in listed.out.splitlines()]
    assert [(d["name"], d["revision"], d["latest_version"]) for d in lines] == [
        ("a-flow", 2, 1), ("b-flow", 2, 1)]
    after = await ok(db_url, "workflows", "definitions", "list", "--namespace",
                     tenant.namespace, "--after", "a-flow", "--limit", "1")
    assert [json.loads(line)["name"] for line in after.out.splitlines()] == ["b-flow"]
    got = (await ok(db_url, "workflows", "definitions", "get", first, "--namespace",
                    tenant.namespace)).json()
    (version,) = got["versions"]
    assert (got["name"], version["version"], version["document"]) == (first, 1, None)
    shown = (await ok(db_url, "workflows", "definitions", "version", first, "1",
                      "--namespace", tenant.namespace)).json()
    assert shown["document"] == json.loads(document(queue.name))
    assert shown["digest"] == version["digest"]
    missing = await orbit_admin(db_url, "workflows", "definitions", "version", first, "2",
                                "--namespace", tenant.namespace)
    assert missing.code != 0
    assert "definition_version_not_found" in missing.err
    gone = await orbit_admin(db_url, "workflows", "definitions", "get", "nope",
                             "--namespace", tenant.namespace)
    assert "definition_not_found" in gone.err
    no_ns = await orbit_admin(db_url, "workflows", "definitions", "list", "--namespace",
                              "no-such-namespace")
    assert "namespace_not_found" in no_ns.err


async def test_instances_list_and_get(db: Database, db_url: DatabaseUrl,
                                      tenant: Tenant) -> None:
    task_id, instance, activation_id = await workflow_task(db, tenant)
    assert activation_id is not None
    who = await principal(db, tenant.api_key)
    (name,) = [d["name"] for d in await definitions.list_definitions(
        db, who, namespace=tenant.namespace)]
    other = await instances.start_instance(db, who, namespace=tenant.namespace,
                                           definition=name, input_json=b'{"n": 2}',
                                           business_key="k-2")
    listed = await ok(db_url, "workflows", "instances", "list", "--namespace", tenant.namespace)
    lines = [json.loads(line) for line in listed.out.splitlines()]
    assert [i["id"] for i in lines] == [other.body["id"], instance["id"].hex()]
    keyed = await ok(db_url, "workflows", "instances", "list", "--namespace", tenant.namespace,
                     "--business-key", "k-2", "--state", "RUNNING", "--definition", name)
    assert [json.loads(line)["id"] for line in keyed.out.splitlines()] == [other.body["id"]]
    got = (await ok(db_url, "workflows", "instances", "get", instance["id"].hex(),
                    "--namespace", tenant.namespace)).json()
    assert got["input"] == {"n": 1}
    (step,) = [s for s in got["steps"] if s["name"] == "a"]
    (activation,) = step["activations"]
    assert (activation["id"], activation["task_id"], activation["task_state"],
            activation["result"]) == (activation_id.hex(), task_id.hex(), "WAITING", "none")
    bad = await orbit_admin(db_url, "workflows", "instances", "get", "nothex",
                            "--namespace", tenant.namespace)
    assert "workflow_instance_not_found" in bad.err


async def test_signals_list_and_get(db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    _, instance, _ = await workflow_task(db, tenant)
    who = await principal(db, tenant.api_key)
    sent = []
    for n in range(2):
        request = signals.SignalRequest.check(
            name="paid", correlation_key=f"o-{n}", payload_text=f'{{"n": {n}}}',
            payload_version=1, evidence_ref=None, expires_in_ms=None)
        sent.append((await signals.send_signal(
            db, who, namespace=tenant.namespace,
            target=signals.Target(instance_id=instance["id"]), signal=request)).body)
    listed = await ok(db_url, "workflows", "signals", "list", instance["id"].hex(),
                      "--namespace", tenant.namespace)
    lines = [json.loads(line) for line in listed.out.splitlines()]
    assert [(s["id"], s["correlation_key"], s["state"]) for s in lines] == [
        (sent[1]["id"], "o-1", "PENDING"), (sent[0]["id"], "o-0", "PENDING")]
    one = await ok(db_url, "workflows", "signals", "list", instance["id"].hex(),
                   "--namespace", tenant.namespace, "--limit", "1")
    assert [json.loads(line)["id"] for line in one.out.splitlines()] == [sent[1]["id"]]
    got = (await ok(db_url, "workflows", "signals", "get", instance["id"].hex(), sent[0]["id"],
                    "--namespace", tenant.namespace)).json()
    assert (got["payload"], got["disposition"]) == ({"n": 0}, None)
    missing = await orbit_admin(db_url, "workflows", "signals", "get", instance["id"].hex(),
                                "ab" * 16, "--namespace", tenant.namespace)
    assert missing.code != 0
    assert "workflow_signal_not_found" in missing.err


async def test_instances_by_version_and_the_timeline(db: Database, db_url: DatabaseUrl,
                                                     tenant: Tenant) -> None:
    _, instance, _ = await workflow_task(db, tenant)
    who = await principal(db, tenant.api_key)
    (name,) = [d["name"] for d in await definitions.list_definitions(
        db, who, namespace=tenant.namespace)]
    request = signals.SignalRequest.check(
        name="paid", correlation_key="o-1", payload_text="1", payload_version=1,
        evidence_ref=None, expires_in_ms=None)
    sent = await signals.send_signal(db, who, namespace=tenant.namespace,
                                     target=signals.Target(instance_id=instance["id"]),
                                     signal=request)
    mine = instance["id"].hex()
    by_version = await ok(db_url, "workflows", "instances", "list", "--namespace",
                          tenant.namespace, "--definition", name, "--version", "1")
    assert [json.loads(line)["id"] for line in by_version.out.splitlines()] == [mine]
    assert (await ok(db_url, "workflows", "instances", "list", "--namespace", tenant.namespace,
                     "--definition", name, "--version", "2")).out == ""
    lone = await orbit_admin(db_url, "workflows", "instances", "list", "--namespace",
                             tenant.namespace, "--version", "1")
    assert lone.code != 0
    assert "validation_failed" in lone.err
    shown = await ok(db_url, "workflows", "instances", "timeline", mine, "--namespace",
                     tenant.namespace)
    events = [json.loads(line) for line in shown.out.splitlines()]
    assert [(e["type"], e["aggregate_id"]) for e in events][-1] == (
        "workflow.signal.accepted", sent.body["id"])
    assert events[0]["type"] == "workflow.started"
    newest = await ok(db_url, "workflows", "instances", "timeline", mine, "--namespace",
                      tenant.namespace, "--newest-first", "--limit", "1")
    assert [json.loads(line)["aggregate_id"] for line in newest.out.splitlines()] == [
        sent.body["id"]]
    missing = await orbit_admin(db_url, "workflows", "instances", "timeline", "nothex",
                                "--namespace", tenant.namespace)
    assert "workflow_instance_not_found" in missing.err


async def _control_rows(db: Database, tenant: Tenant, instance_id: bytes) -> dict[str, Any]:
    """The instance's flag, its gate, and its pause/resume audit records and events."""
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT i.paused, i.control_revision, g.state AS gate"
                          " FROM weave_instances i JOIN pulse_execution_gates g"
                          " ON g.namespace_id = i.namespace_id AND g.id = i.gate_id"
                          " WHERE i.namespace_id = %s AND i.id = %s",
                          (tenant.namespace_id, instance_id))
        found = dict(await cur.fetchone())
        await cur.execute("SELECT action, actor_kind, actor_id, reason FROM orbit_audit_events"
                          " WHERE resource_id = %s ORDER BY occurred_at, id", (instance_id,))
        found["audit"] = [tuple(r.values()) for r in await cur.fetchall()]
        await cur.execute("SELECT e.event_type FROM orbit_events e JOIN weave_instances i"
                          " ON i.namespace_id = e.namespace_id AND i.gate_id = e.aggregate_id"
                          " WHERE e.namespace_id = %s AND i.id = %s"
                          " AND e.aggregate_type = 'execution_gate'"
                          " ORDER BY e.occurred_at, e.id", (tenant.namespace_id, instance_id))
        found["events"] = [r["event_type"] for r in await cur.fetchall()]
        return found
    return await db.read("test.control_rows", body)


async def test_pause_and_resume(db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    _, instance, _ = await workflow_task(db, tenant)
    workflow_id = instance["id"].hex()
    ns = ("--namespace", tenant.namespace)
    paused = (await ok(db_url, "workflows", "pause", workflow_id, *ns, "--reason",
                       "supplier outage")).json()
    assert (paused["id"], paused["paused"], paused["control_revision"], paused["state"]) == (
        workflow_id, True, 2, "RUNNING")
    rows = await _control_rows(db, tenant, instance["id"])
    assert (rows["paused"], rows["control_revision"], rows["gate"]) == (1, 2, "PAUSED")
    assert rows["audit"][-1] == ("workflow.paused", "operator", ACTOR, "supplier outage")
    assert rows["events"] == ["workflow.paused"]
    # A repeat changes nothing: no revision, no audit, no event.
    again = (await ok(db_url, "workflows", "pause", workflow_id, *ns, "--reason", "again")).json()
    assert (again["paused"], again["control_revision"]) == (True, 2)
    assert await _control_rows(db, tenant, instance["id"]) == rows
    # The control revision is a compare-and-set.
    stale = await orbit_admin(db_url, "workflows", "resume", workflow_id, *ns, "--reason",
                              "back", "--control-revision", "1")
    assert stale.code == 1
    assert "stale_revision" in stale.err
    resumed = (await ok(db_url, "workflows", "resume", workflow_id, *ns, "--reason", "back",
                        "--control-revision", "2")).json()
    assert (resumed["paused"], resumed["control_revision"]) == (False, 3)
    rows = await _control_rows(db, tenant, instance["id"])
    assert (rows["paused"], rows["gate"]) == (0, "OPEN")
    assert rows["audit"][-1] == ("workflow.resumed", "operator", ACTOR, "back")
    assert rows["events"] == ["workflow.paused", "workflow.resumed"]


async def test_pause_refusals(db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    _, instance, _ = await workflow_task(db, tenant)
    workflow_id = instance["id"].hex()
    ns = ("--namespace", tenant.namespace)
    before = await _control_rows(db, tenant, instance["id"])
    no_reason = await orbit_admin(db_url, "workflows", "pause", workflow_id, *ns)
    assert no_reason.code == 2  # click: --reason is required
    empty = await orbit_admin(db_url, "workflows", "pause", workflow_id, *ns, "--reason", "")
    assert "validation_failed" in empty.err
    for unknown in ("0" * 32, "not-hex"):
        gone = await orbit_admin(db_url, "workflows", "pause", unknown, *ns, "--reason", "x")
        assert "workflow_instance_not_found" in gone.err
    no_ns = await orbit_admin(db_url, "workflows", "pause", workflow_id, "--namespace",
                              "no-such-namespace", "--reason", "x")
    assert "namespace_not_found" in no_ns.err
    assert await _control_rows(db, tenant, instance["id"]) == before

    async def finish(cur: Any) -> None:
        await cur.execute("UPDATE weave_instances SET state = 'SUCCEEDED',"
                          " completed_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, instance["id"]))
    await db.transaction("test.finish", finish)
    ended = await orbit_admin(db_url, "workflows", "pause", workflow_id, *ns, "--reason", "x")
    assert ended.code == 1
    assert "workflow_instance_finished" in ended.err
    assert (await _control_rows(db, tenant, instance["id"]))["audit"] == before["audit"]


async def test_cancel_an_instance(db: Database, db_url: DatabaseUrl, tenant: Tenant) -> None:
    """``orbit admin workflows cancel``: the stop intent CANCEL with the operator's identity in
    the audit record, the instance's WAITING task cancelled at once; a repeat changes nothing;
    an unknown instance and a stale control revision are refused."""
    task_id, instance, _ = await workflow_task(db, tenant)
    instance_id = instance["id"].hex()
    stale = await orbit_admin(db_url, "workflows", "cancel", instance_id, "--namespace",
                              tenant.namespace, "--reason", "r", "--control-revision", "3")
    assert stale.code != 0
    assert "stale_revision" in stale.err
    done = (await ok(db_url, "workflows", "cancel", instance_id, "--namespace",
                     tenant.namespace, "--reason", "withdrawn", "--control-revision",
                     "1")).json()
    assert (done["state"], done["stop_kind"], done["control_revision"]) == (
        "STOPPING", "CANCEL", 2)
    again = (await ok(db_url, "workflows", "cancel", instance_id, "--namespace",
                      tenant.namespace, "--reason", "again")).json()
    assert again["control_revision"] == 2

    async def body(cur: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        await cur.execute("SELECT state, cancel_reason FROM pulse_tasks WHERE namespace_id = %s"
                          " AND id = %s", (tenant.namespace_id, task_id))
        task = dict(await cur.fetchone())
        await cur.execute("SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                          " WHERE namespace_id = %s AND action = 'workflow.cancel'",
                          (tenant.namespace_id,))
        return task, [dict(r) for r in await cur.fetchall()]

    task, audit = await db.read("test.admin.cancel", body)
    assert (task["state"], task["cancel_reason"]) == ("CANCELLED", "withdrawn")
    assert audit == [{"actor_kind": "operator", "actor_id": ACTOR, "reason": "withdrawn"}]
    missing = await orbit_admin(db_url, "workflows", "cancel", "00" * 16, "--namespace",
                                tenant.namespace, "--reason", "r")
    assert "workflow_instance_not_found" in missing.err

"""Pulse → Weave: the single ending writer adds a weave_inbox row, with the result's frozen
snapshot, when a task a workflow owns ends; a task whose workflow links are incomplete gets a
QUARANTINED row; a task no workflow owns costs no inbox statement."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.pulse.leases import workflow_inbox as inbox
from orbit_common.pulse.workers import QueueRef
from orbit_common.weave import instances
from tests.conftest import Tenant
from tests.integration.test_interventions import cancel
from tests.integration.test_leases import claim, finish, report, start
from tests.integration.weave.support import principal, published
from tests.support import invariants
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, task_row


async def rows(db: Database, tenant: Tenant, task_id: bytes) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute("SELECT * FROM weave_inbox WHERE namespace_id = %s AND task_id = %s",
                          (tenant.namespace_id, task_id))
        return [dict(r) for r in await cur.fetchall()]
    return await db.read("test.inbox", body)


async def workflow_task(db: Database, tenant: Tenant, *, activation: bool = True,
                        gate: bool = True, queue: QueueRef | None = None
                        ) -> tuple[bytes, dict[str, Any], bytes | None]:
    """A WAITING task owned by a started instance (as the engine would make it: owner, gate and
    a LIVE activation of step ``a`` naming the task); the task, the instance row and the
    activation id. ``activation``/``gate`` False leave that link out."""
    queue = queue or await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    started = await instances.start_instance(db, await principal(db, tenant.api_key),
                                             namespace=tenant.namespace, definition=name,
                                             input_json=b'{"n": 1}')
    instance_id = bytes.fromhex(started.body["id"])
    (task_id,) = await add_tasks(db, tenant, queue)
    activation_id = ids.new_id() if activation else None

    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM weave_instances WHERE namespace_id = %s AND id = %s",
                          (tenant.namespace_id, instance_id))
        instance = dict(await cur.fetchone())
        await cur.execute(
            "UPDATE pulse_tasks SET owner_kind = 'WORKFLOW', owner_id = %s, workflow_gate_id = %s"
            " WHERE namespace_id = %s AND id = %s",
            (instance_id, instance["gate_id"] if gate else None, tenant.namespace_id, task_id))
        if activation_id is not None:
            step_id = ids.new_id()
            await cur.execute(
                "INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state,"
                " activation_count, live_activation_id, created_at, updated_at)"
                " VALUES (%s, %s, %s, 'a', 'TASK', 'RUNNING', 1, %s, UTC_TIMESTAMP(6),"
                " UTC_TIMESTAMP(6))", (tenant.namespace_id, instance_id, step_id, activation_id))
            await cur.execute(
                "INSERT INTO weave_activations (namespace_id, instance_id, step_id, id, sequence,"
                " state, live_step_id, task_id, created_at)"
                " VALUES (%s, %s, %s, %s, 1, 'LIVE', %s, %s, UTC_TIMESTAMP(6))",
                (tenant.namespace_id, instance_id, step_id, activation_id, step_id, task_id))
        return instance

    return task_id, await db.transaction("test.link", body), activation_id


async def test_a_workflow_task_that_ends_leaves_one_pending_inbox_row(
        db: Database, tenant: Tenant) -> None:
    task_id, instance, activation_id = await workflow_task(db, tenant)
    await cancel(db, tenant, task_id, reason="stop")
    (row,) = await rows(db, tenant, task_id)
    assert row["state"] == "PENDING"
    assert row["consumer"] == "ENGINE"
    assert (row["instance_id"], row["activation_id"]) == (instance["id"], activation_id)
    assert (row["task_state"], row["task_revision"]) == ("CANCELLED", 2)
    assert row["quarantine_reason"] is None

    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT e.id, e.aggregate_revision, r.snapshot FROM orbit_events e"
                          " JOIN orbit_result_events r ON r.namespace_id = e.namespace_id"
                          " AND r.id = e.id WHERE e.namespace_id = %s"
                          " AND e.aggregate_id = %s AND e.to_state = 'CANCELLED'",
                          (tenant.namespace_id, task_id))
        return dict(await cur.fetchone())

    event = await db.read("test.event", body)
    assert row["source_event_id"] == event["id"]
    snapshot = json.loads(row["snapshot"])
    assert snapshot == json.loads(event["snapshot"])
    assert (snapshot["state"], snapshot["task_id"]) == ("CANCELLED", task_id.hex())
    assert await invariants.check_db(db, [tenant.namespace_id]) == []


@pytest.mark.parametrize(("activation", "gate", "reason"), [
    (False, True, "missing_activation"),
    (True, False, "missing_gate_link"),
])
async def test_incomplete_links_are_quarantined_never_guessed(
        db: Database, tenant: Tenant, activation: bool, gate: bool, reason: str) -> None:
    task_id, instance, _ = await workflow_task(db, tenant, activation=activation, gate=gate)
    await cancel(db, tenant, task_id, reason="stop")
    (row,) = await rows(db, tenant, task_id)
    assert (row["state"], row["quarantine_reason"]) == ("QUARANTINED", reason)
    assert row["activation_id"] is None
    assert row["instance_id"] == instance["id"]


def test_quarantine_reasons_cover_every_broken_link() -> None:
    def source(instance: bytes | None, gate: bytes | None) -> inbox.Source:
        return inbox.Source(event_id=b"e" * 16, task_id=b"t" * 16, task_revision=2,
                            task_state="FAILED", instance_id=instance, gate_id=gate,
                            snapshot={})

    good = {"instance_id": b"i" * 16, "gate_id": b"g" * 16, "activation_id": b"a" * 16}
    assert inbox.quarantine_reason(source(None, b"g" * 16), good) == "missing_instance_link"
    assert inbox.quarantine_reason(source(b"i" * 16, None), good) == "missing_gate_link"
    assert inbox.quarantine_reason(source(b"i" * 16, b"g" * 16), None) == "missing_activation"
    assert inbox.quarantine_reason(source(b"x" * 16, b"g" * 16), good) == (
        "activation_of_other_instance")
    assert inbox.quarantine_reason(source(b"i" * 16, b"g" * 16),
                                   {**good, "gate_id": None}) == "missing_instance"
    assert inbox.quarantine_reason(source(b"i" * 16, b"x" * 16), good) == "gate_mismatch"
    assert inbox.quarantine_reason(source(b"i" * 16, b"g" * 16), good) is None


async def test_a_task_no_workflow_owns_costs_no_inbox_statement(
        db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]) -> None:
    """Another session holds write locks on the workflow tables the inbox writer reads and
    writes: ending a task no workflow owns does not wait for them, so it sends them nothing."""
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    with sync_conn.cursor() as cur:
        cur.execute("LOCK TABLES weave_inbox WRITE, weave_activations WRITE,"
                    " weave_instances WRITE")
        try:
            await asyncio.wait_for(cancel(db, tenant, task_id), timeout=20)
        finally:
            cur.execute("UNLOCK TABLES")
    assert (await task_row(db, tenant, task_id))["state"] == "CANCELLED"
    assert await rows(db, tenant, task_id) == []


@pytest.mark.parametrize(("outcome", "state", "kw"), [
    ("succeeded", "SUCCEEDED", {"result": '{"total": 12.50}'}),
    ("failed", "FAILED", {"error": {"type": "boom", "message": "no"}}),
    ("unknown", "NEEDS_REVIEW", {"error": {"type": "lost", "message": "?"}}),
])
async def test_a_worker_report_ends_the_task_and_writes_its_inbox_row(
        db: Database, tenant: Tenant, outcome: str, state: str, kw: dict[str, Any]) -> None:
    queue = await make_queue(db, tenant, max_attempts=1)
    task_id, _, activation_id = await workflow_task(db, tenant, queue=queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    await finish(db, tenant, [report(grant, outcome, **kw)])
    (row,) = await rows(db, tenant, task_id)
    assert (row["state"], row["task_state"], row["activation_id"]) == (
        "PENDING", state, activation_id)
    snapshot = json.loads(row["snapshot"])
    assert snapshot["state"] == state
    if "result" in kw:
        assert row["snapshot"].count('"result":{"total": 12.50}') == 1  # the exact text, frozen
    assert await invariants.check_db(db, [tenant.namespace_id]) == []


async def test_the_inbox_row_is_part_of_the_ending_transaction(
        db: Database, tenant: Tenant) -> None:
    """When the inbox write fails in the database (a trigger refuses it here), the ending rolls
    back whole: the task is still WAITING. The trigger lives in this worker's own database only
    for the test."""
    task_id, _, _ = await workflow_task(db, tenant)

    async def ddl(sql: str) -> None:
        await db.transaction("test.ddl", lambda cur: cur.execute(sql))

    await ddl("CREATE TRIGGER trg_test_refuse_inbox BEFORE INSERT ON weave_inbox FOR EACH ROW"
              " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'inbox write refused'")
    try:
        with pytest.raises(errors.IntegrityViolation):
            await cancel(db, tenant, task_id)
    finally:
        await ddl("DROP TRIGGER trg_test_refuse_inbox")
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"
    assert await rows(db, tenant, task_id) == []

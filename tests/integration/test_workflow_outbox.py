"""Workflow starts and signals in the outbox on a real database, without Orbit: an action and
its pending request commit and roll back together; the recording transaction writes the
instance's or the signal's receipt on the request and its ids on the action (never a task id),
only under the current lease; a give-up moves the action with it; ``init-db`` widens an earlier
``sender_outbox`` whose check allowed task submissions only.

With a real Orbit (replays, a sender killed after acceptance):
tests/e2e/test_workflow_outbox_e2e.py.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pymysql
import pytest
from orbit_sdk import RawJson, WorkflowInstance, WorkflowSignal
from orbit_sdk.outbox import SENDER_OUTBOX_DDL, SignalRequest, WorkflowStartRequest, enqueue
from task_outbox import schema
from task_outbox.database import DatabaseUrl as AppUrl
from task_outbox.database import close_pool, open_pool, transaction
from task_outbox.sender import LeaseLost, give_up, lease, record_sent
from task_outbox.workflows import ActionLink, create_signal, create_start

from orbit_common.db.pool import DatabaseUrl, connect_sync
from tests.support import database
from tests.support.outbox import AppDatabase, app_database

NS = "team-a"
LINKS = {ActionLink.table: ActionLink()}
WF_ID = "ab" * 16


@pytest.fixture(scope="module")
def app(server_url: DatabaseUrl) -> Iterator[AppDatabase]:
    with app_database(server_url) as db:
        yield db


@pytest.fixture
async def pool(app: AppDatabase) -> AsyncIterator[Any]:
    p = await open_pool(app.app_url, maxsize=4)
    try:
        yield p
    finally:
        await close_pool(p)


def lane() -> str:
    """A definition name no other test of the module used (the tests share the tables)."""
    return f"orders_{secrets.token_hex(5)}"


async def new_start(pool: Any, definition: str) -> Any:
    request = WorkflowStartRequest(definition=definition, input=RawJson('{"n": 1.50}'),
                                   business_key="order-7")

    async def body(cur: Any) -> Any:
        return await create_start(cur, request, namespace=NS)

    return await transaction(pool, body)


async def new_signal(pool: Any, definition: str) -> Any:
    request = SignalRequest(definition=definition, name="paid", payload=RawJson("[1.0]"),
                            workflow_id=WF_ID)

    async def body(cur: Any) -> Any:
        return await create_signal(cur, request, namespace=NS)

    return await transaction(pool, body)


def action(app: AppDatabase, action_id: str) -> dict[str, Any]:
    return app.one("SELECT a.kind, a.definition, a.business_key, a.signal_name, a.input,"
                   " a.state AS action_state, a.workflow_id, a.signal_id, a.last_error,"
                   " o.operation, o.queue, o.handler, o.input AS request_input, o.state,"
                   " o.task_id, o.receipt FROM sender_workflow_actions a"
                   " JOIN sender_outbox o ON o.id = a.outbox_id WHERE a.id = %s",
                   (bytes.fromhex(action_id),))


async def test_an_action_and_its_request_commit_together(app: AppDatabase, pool: Any) -> None:
    definition = lane()
    start = await new_start(pool, definition)
    signal = await new_signal(pool, definition)
    assert action(app, start.id) == {
        "kind": "workflow.start", "definition": definition, "business_key": "order-7",
        "signal_name": None, "input": '{"n": 1.50}', "action_state": "REQUESTED",
        "workflow_id": None, "signal_id": None, "last_error": None,
        "operation": "workflows.start", "queue": definition, "handler": "",
        "request_input": '{"n": 1.50}', "state": "PENDING", "task_id": None, "receipt": None}
    row = action(app, signal.id)
    assert (row["kind"], row["signal_name"], row["workflow_id"], row["operation"],
            row["handler"], row["input"]) == (
        "signal", "paid", WF_ID, "workflows.signal", "paid", "[1.0]")


async def test_an_action_and_its_request_roll_back_together(app: AppDatabase,
                                                            pool: Any) -> None:
    definition = lane()

    class BusinessRuleBroken(Exception):
        pass

    async def body(cur: Any) -> None:
        await create_start(cur, WorkflowStartRequest(definition=definition), namespace=NS)
        await create_signal(cur, SignalRequest(definition=definition, name="paid",
                                               business_key="order-7"), namespace=NS)
        raise BusinessRuleBroken

    with pytest.raises(BusinessRuleBroken):
        await transaction(pool, body)
    assert app.value("SELECT COUNT(*) AS n FROM sender_outbox WHERE queue = %s",
                     (definition,)) == 0
    assert app.value("SELECT COUNT(*) AS n FROM sender_workflow_actions"
                     " WHERE definition = %s", (definition,)) == 0


async def test_receipts_are_recorded_with_the_action_under_the_lease(
        app: AppDatabase, pool: Any) -> None:
    definition = lane()
    start = await new_start(pool, definition)
    signal = await new_signal(pool, definition)
    held = await lease(pool, namespace=NS, queue=definition, limit=5, lease_ms=60_000,
                       links=LINKS)
    by_action = {h.entry.business_id: h for h in held}
    instance = WorkflowInstance.from_json({"id": WF_ID, "definition": definition,
                                           "state": "RUNNING", "business_key": "order-7"})
    sent = WorkflowSignal.from_json({"id": "cd" * 16, "workflow_id": WF_ID, "name": "paid",
                                     "state": "PENDING"})
    stale = by_action[start.id]
    with pytest.raises(LeaseLost):  # another token: not this lease
        await record_sent(pool, type(stale)(entry=stale.entry, token=b"x" * 16,
                                            generation=stale.generation,
                                            attempts=stale.attempts,
                                            max_attempts=stale.max_attempts), instance, LINKS)
    assert action(app, start.id)["action_state"] == "REQUESTED"
    await record_sent(pool, by_action[start.id], instance, LINKS)
    await record_sent(pool, by_action[signal.id], sent, LINKS)
    row = action(app, start.id)
    assert (row["state"], row["task_id"], row["action_state"], row["workflow_id"],
            row["signal_id"]) == ("SENT", None, "ACCEPTED", WF_ID, None)
    assert f'"id":"{WF_ID}"' in row["receipt"]
    row = action(app, signal.id)
    assert (row["state"], row["task_id"], row["action_state"], row["workflow_id"],
            row["signal_id"]) == ("SENT", None, "ACCEPTED", WF_ID, "cd" * 16)


async def test_a_give_up_moves_the_action_with_its_request(app: AppDatabase,
                                                           pool: Any) -> None:
    definition = lane()
    start = await new_start(pool, definition)
    (held,) = await lease(pool, namespace=NS, queue=definition, limit=5, lease_ms=60_000,
                          links=LINKS)
    assert await give_up(pool, held, reason="refused: validation_failed", links=LINKS)
    row = action(app, start.id)
    assert (row["state"], row["action_state"], row["last_error"]) == (
        "FAILED", "FAILED", "refused: validation_failed")


def test_the_action_checks_hold_for_any_writer(app: AppDatabase) -> None:
    with app.sql() as conn, conn.cursor() as cur:
        for column, value in (("kind", "'workflow.stop'"), ("state", "'DONE'"),
                              ("input", "'not json'")):
            with pytest.raises(pymysql.err.MySQLError):
                cur.execute(
                    "INSERT INTO sender_workflow_actions (id, kind, definition, input, state,"
                    " outbox_id, created_at, updated_at) VALUES (%s, 'signal', 'd', '{}',"
                    " 'REQUESTED', %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))".replace(
                        {"kind": "'signal'", "state": "'REQUESTED'", "input": "'{}'"}[column],
                        value, 1),
                    (secrets.token_bytes(16), secrets.token_bytes(16)))


async def test_init_db_widens_an_earlier_outbox_to_workflow_operations(
        server_url: DatabaseUrl) -> None:
    name = database.scratch_name("sender_old")
    url = database.create_database(server_url, name, migrate=False)
    earlier = SENDER_OUTBOX_DDL.replace(
        "CHECK (operation IN ('tasks.submit', 'workflows.start', 'workflows.signal'))",
        "CHECK (operation IN ('tasks.submit'))")
    assert earlier != SENDER_OUTBOX_DDL
    request = WorkflowStartRequest(definition="orders")
    try:
        conn = connect_sync(url, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(earlier)
                with pytest.raises(pymysql.err.MySQLError):
                    enqueue(cur, request, namespace=NS, business_table="t", business_id="1")
            p = await open_pool(AppUrl.parse(url.render(hide_password=False)), maxsize=1)
            try:
                for _ in range(2):  # the second run finds nothing to widen
                    async with p.acquire() as c, c.cursor() as acur:
                        with warnings.catch_warnings():  # "Table ... already exists"
                            warnings.simplefilter("ignore", pymysql.err.Warning)
                            await schema.init_db(acur)
            finally:
                await close_pool(p)
            with conn.cursor() as cur:
                enqueue(cur, request, namespace=NS, business_table="t", business_id="1")
                cur.execute("SELECT operation FROM sender_outbox")
                assert cur.fetchall() == (("workflows.start",),)
                with pytest.raises(pymysql.err.MySQLError):
                    cur.execute("UPDATE sender_outbox SET operation = 'tasks.cancel'")
        finally:
            conn.close()
    finally:
        database.drop_database(server_url, name)


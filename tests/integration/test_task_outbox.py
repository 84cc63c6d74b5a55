"""The outbox on a real database, without Orbit: the SDK helper writes into the caller's
transaction (blocking and async cursors) and never commits; a job and its request commit and
roll back together; the lease guard (database time) keeps a sender whose lease lapsed from
recording; the budget and the send deadline end in FAILED rows that are kept; a request changed
after it was written is never sent.

Sends here go to a port where nothing listens (Orbit is down): what the sender does with a real
Orbit is in tests/e2e/test_task_outbox_e2e.py.
"""

from __future__ import annotations

import decimal
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiomysql
import pymysql
import pytest
from orbit_sdk import Client, RawJson, TaskRequest
from orbit_sdk.models import Task
from orbit_sdk.outbox import OutboxEntry, enqueue, enqueue_async
from task_outbox.database import close_pool, open_pool, transaction
from task_outbox.jobs import JobLink, create_job
from task_outbox.sender import (
    _SELECT_DUE,
    LeaseLost,
    Sender,
    Settings,
    give_up,
    lease,
    record_sent,
    retry_later,
)

from orbit_common.db.pool import DatabaseUrl, connect_sync
from tests.support.outbox import AppDatabase, app_database
from tests.support.processes import free_port
from tests.support.waiting import until

NS = "team-a"
LINKS = {JobLink.table: JobLink()}


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


def unique_queue(app: AppDatabase) -> str:
    """A queue name no other test of the module used (the tests share the tables)."""
    return f"q-{secrets.token_hex(5)}"


async def new_job(pool: Any, queue: str, **kwargs: Any) -> Any:
    request = TaskRequest(queue=queue, handler="report.build",
                          input=RawJson('{"amount": 12345678901234567890.123456789}'))

    async def body(cur: Any) -> Any:
        return await create_job(cur, name="nightly report", namespace=NS, request=request,
                                **kwargs)

    return await transaction(pool, body)


def receipt(queue: str, task_id: str = "a" * 32) -> Task:
    return Task.from_json({"id": task_id, "queue": queue, "handler": "report.build",
                           "state": "WAITING", "revision": 1})


async def lapsed(app: AppDatabase, request_id: bytes) -> bool:
    return bool(app.value("SELECT wake_at <= UTC_TIMESTAMP(6) AS due FROM sender_outbox"
                          " WHERE id = %s", (request_id,)))


def dead_client() -> Client:
    """A client of an Orbit that is down: nothing listens on the port."""
    return Client(f"http://127.0.0.1:{free_port()}", "key", NS, timeout=2, max_retries=0)


# --- the SDK helper ---------------------------------------------------------------------------


def test_enqueue_writes_into_the_callers_transaction_and_never_commits(
        app: AppDatabase) -> None:
    queue = unique_queue(app)
    conn = connect_sync(app.url, autocommit=False)
    try:
        with conn.cursor() as cur:
            enqueue(cur, TaskRequest(queue=queue, handler="h", input={"b": 1, "a": [2]}),
                    namespace=NS, business_table="orders", business_id="42")
            # Not visible to anyone else: the helper did not commit.
            assert app.value("SELECT COUNT(*) AS n FROM sender_outbox WHERE queue = %s",
                             (queue,)) == 0
        conn.rollback()
        assert app.value("SELECT COUNT(*) AS n FROM sender_outbox WHERE queue = %s",
                         (queue,)) == 0
        with conn.cursor() as cur:
            entry = enqueue(cur, TaskRequest(queue=queue, handler="h",
                                             input=RawJson('{"b": 1.10, "a": [2]}'), priority=5,
                                             retry={"multiplier": decimal.Decimal("1.50"),
                                                    "max_attempts": 3}),
                            namespace=NS, business_table="orders", business_id="42",
                            max_attempts=4, send_within_ms=3_600_000)
        conn.commit()
    finally:
        conn.close()
    row = app.one("SELECT *, TIMESTAMPDIFF(SECOND, created_at, expires_at) AS window_s"
                  " FROM sender_outbox WHERE queue = %s", (queue,))
    assert row["id"] == entry.id
    assert row["state"] == "PENDING"
    assert (row["attempts"], row["max_attempts"], row["generation"]) == (0, 4, 0)
    assert row["wake_at"] == row["created_at"]
    assert row["window_s"] == 3600
    assert row["idempotency_key"] == entry.idempotency_key
    assert entry.idempotency_key.startswith("outbox-")
    assert (row["business_table"], row["business_id"]) == ("orders", "42")
    # The input byte for byte as given; the options sorted, numbers exact.
    assert row["input"] == '{"b": 1.10, "a": [2]}'
    assert row["options"] == '{"priority":5,"retry":{"max_attempts":3,"multiplier":1.50}}'
    assert row["task_id"] is None
    assert OutboxEntry.from_row(row) == entry
    assert entry.digest_matches()


async def test_enqueue_async_with_an_aiomysql_cursor(app: AppDatabase) -> None:
    queue = unique_queue(app)
    conn = await aiomysql.connect(**app.app_url.connect_kwargs())
    try:
        async with conn.cursor() as cur:
            first = await enqueue_async(cur, TaskRequest(queue=queue, handler="h", input=[1]),
                                        namespace=NS, business_table="orders", business_id="1")
        await conn.rollback()
        async with conn.cursor() as cur:
            second = await enqueue_async(cur, TaskRequest(queue=queue, handler="h", input=[1]),
                                         namespace=NS, business_table="orders",
                                         business_id="1")
        await conn.commit()
    finally:
        conn.close()
    rows = [app.one("SELECT COUNT(*) AS n FROM sender_outbox WHERE id = %s", (e.id,))["n"]
            for e in (first, second)]
    assert rows == [0, 1]
    # Each call draws a fresh key: the same business request written twice is two requests.
    assert first.idempotency_key != second.idempotency_key


def test_enqueue_refuses_what_it_cannot_send() -> None:
    request = TaskRequest(queue="q", handler="h")
    for bad in ({"namespace": ""}, {"business_id": ""}, {"max_attempts": 0},
                {"send_within_ms": 7 * 24 * 3600 * 1000}):
        kwargs: dict[str, Any] = {"namespace": NS, "business_table": "t", "business_id": "1",
                                  **bad}
        with pytest.raises(ValueError):
            enqueue(None, request, **kwargs)  # type: ignore[arg-type]  # refused before I/O


# --- the business transaction -----------------------------------------------------------------


async def test_a_job_and_its_request_commit_together(app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue)
    row = app.one("SELECT j.state AS job_state, j.input AS job_input, o.state, o.business_table,"
                  " o.business_id, o.input FROM sender_jobs j"
                  " JOIN sender_outbox o ON o.id = j.outbox_id WHERE j.id = %s",
                  (bytes.fromhex(job.id),))
    assert row == {"job_state": "REQUESTED", "state": "PENDING",
                   "job_input": '{"amount": 12345678901234567890.123456789}',
                   "input": '{"amount": 12345678901234567890.123456789}',
                   "business_table": "sender_jobs", "business_id": job.id}


async def test_a_job_and_its_request_roll_back_together(app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)

    class BusinessRuleBroken(Exception):
        pass

    async def body(cur: Any) -> None:
        await create_job(cur, name="doomed", namespace=NS,
                         request=TaskRequest(queue=queue, handler="h"))
        raise BusinessRuleBroken  # a later step of the business transaction fails

    with pytest.raises(BusinessRuleBroken):
        await transaction(pool, body)
    assert app.value("SELECT COUNT(*) AS n FROM sender_outbox WHERE queue = %s",
                     (queue,)) == 0
    assert app.value("SELECT COUNT(*) AS n FROM sender_jobs WHERE name = 'doomed'") == 0


# --- leases -----------------------------------------------------------------------------------


async def test_a_sender_whose_lease_lapsed_cannot_record(app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue)
    (first,) = await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=100, links=LINKS)
    assert (first.generation, first.attempts) == (1, 1)
    # While the lease lasts, nobody else leases the row.
    assert await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=100,
                       links=LINKS) == []
    await until(lambda: lapsed(app, first.entry.id), message="the lease to lapse")

    # Lapsed, and nobody took it over yet: still no record, no backoff, no give-up.
    with pytest.raises(LeaseLost):
        await record_sent(pool, first, receipt(queue), LINKS)
    assert await retry_later(pool, first, delay_ms=10, reason="x", links=LINKS) == "lost"
    assert not await give_up(pool, first, reason="x", links=LINKS)
    row = app.one("SELECT state, task_id, generation FROM sender_outbox WHERE id = %s",
                  (first.entry.id,))
    assert row == {"state": "LEASED", "task_id": None, "generation": 1}

    (second,) = await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=60_000,
                            links=LINKS)
    assert second.entry.idempotency_key == first.entry.idempotency_key  # the original key
    assert (second.generation, second.attempts) == (2, 2)
    with pytest.raises(LeaseLost):
        await record_sent(pool, first, receipt(queue, "b" * 32), LINKS)
    await record_sent(pool, second, receipt(queue), LINKS)
    row = app.one("SELECT o.state, o.task_id, o.wake_at, o.lease_token, o.receipt,"
                  " j.state AS job_state, j.task_id AS job_task FROM sender_outbox o"
                  " JOIN sender_jobs j ON j.outbox_id = o.id WHERE j.id = %s",
                  (bytes.fromhex(job.id),))
    assert row["state"] == "SENT"
    assert row["task_id"] == row["job_task"] == "a" * 32
    assert row["job_state"] == "SUBMITTED"
    assert (row["wake_at"], row["lease_token"]) == (None, None)
    assert '"id":"' + "a" * 32 in row["receipt"]
    # A terminal row is never leased again.
    assert await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=100,
                       links=LINKS) == []


async def test_a_lapsed_last_lease_fails_and_says_the_outcome_is_unknown(
        app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue, max_attempts=1)
    (held,) = await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=50, links=LINKS)
    await until(lambda: lapsed(app, held.entry.id), message="the lease to lapse")
    assert await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=50,
                       links=LINKS) == []
    row = app.one("SELECT o.state, o.attempts, o.wake_at, o.last_error, j.state AS job_state"
                  " FROM sender_outbox o JOIN sender_jobs j ON j.outbox_id = o.id"
                  " WHERE j.id = %s", (bytes.fromhex(job.id),))
    assert (row["state"], row["attempts"], row["wake_at"]) == ("FAILED", 1, None)
    assert "outcome is unknown" in row["last_error"]
    assert held.entry.idempotency_key in row["last_error"]
    assert row["job_state"] == "SUBMIT_FAILED"


def test_the_lease_query_reads_the_wake_index(app: AppDatabase) -> None:
    with app.sql() as conn, conn.cursor() as cur:
        cur.execute("EXPLAIN " + _SELECT_DUE, (NS, "q", 16))
        (plan,) = cur.fetchall()
    assert plan["key"] == "ix_sender_outbox_wake", plan


# --- failures: budget, deadline, tampering ----------------------------------------------------


async def test_the_budget_ends_in_a_failed_row_that_is_kept(app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue, max_attempts=2)
    settings = Settings(queues=(queue,), lease_ms=10_000, backoff_initial_ms=1,
                        backoff_max_ms=1)
    async with dead_client() as client:
        sender = Sender(pool, client, settings, links=LINKS)
        first = await sender.run_once()
        assert (first.leased, first.retried) == (1, 1)
        row = app.one("SELECT state, attempts, last_error FROM sender_outbox WHERE business_id"
                      " = %s", (job.id,))
        assert (row["state"], row["attempts"]) == ("PENDING", 1)
        assert "send 1 failed" in row["last_error"]

        async def second_pass_failed() -> bool:
            return (await sender.run_once()).failed == 1

        await until(second_pass_failed, message="the second send to spend the budget")
    row = app.one("SELECT o.state, o.attempts, o.wake_at, o.lease_token, o.last_error,"
                  " j.state AS job_state, j.last_error AS job_error FROM sender_outbox o"
                  " JOIN sender_jobs j ON j.outbox_id = o.id WHERE j.id = %s",
                  (bytes.fromhex(job.id),))
    assert (row["state"], row["attempts"], row["wake_at"], row["lease_token"]) == (
        "FAILED", 2, None, None)
    assert "send budget of 2 spent" in row["last_error"]
    assert row["job_state"] == "SUBMIT_FAILED"
    assert row["job_error"] == row["last_error"]
    assert await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=100,
                       links=LINKS) == []


async def test_nothing_is_sent_after_the_send_deadline(app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue, send_within_ms=1)
    await until(lambda: app.value("SELECT expires_at < UTC_TIMESTAMP(6) AS gone"
                                  " FROM sender_outbox WHERE business_id = %s", (job.id,)),
                message="the send deadline to pass")
    assert await lease(pool, namespace=NS, queue=queue, limit=5, lease_ms=1000,
                       links=LINKS) == []
    row = app.one("SELECT state, attempts, last_error FROM sender_outbox WHERE business_id = %s",
                  (job.id,))
    assert (row["state"], row["attempts"]) == ("FAILED", 0)
    assert row["last_error"].startswith("send deadline passed")


async def test_a_request_changed_after_it_was_written_is_never_sent(
        app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue)
    with app.sql() as conn, conn.cursor() as cur:
        cur.execute("UPDATE sender_outbox SET input = '{\"amount\": 1}' WHERE business_id = %s",
                    (job.id,))
    async with dead_client() as client:
        result = await Sender(pool, client, Settings(queues=(queue,)), links=LINKS).run_once()
    assert (result.leased, result.failed) == (1, 1)
    row = app.one("SELECT state, last_error FROM sender_outbox WHERE business_id = %s",
                  (job.id,))
    assert row["state"] == "FAILED"
    assert "no longer matches its digest" in row["last_error"]


async def test_a_sender_sends_only_its_own_namespace(app: AppDatabase, pool: Any) -> None:
    queue = unique_queue(app)
    job = await new_job(pool, queue)
    other = Client("http://127.0.0.1:9", "key", "team-b", max_retries=0)
    async with other:
        result = await Sender(pool, other, Settings(queues=(queue,)), links=LINKS).run_once()
    assert result.leased == 0
    assert app.value("SELECT state FROM sender_outbox WHERE business_id = %s",
                     (job.id,)) == "PENDING"


def test_the_tables_carry_chinese_comments_and_no_foreign_keys(app: AppDatabase) -> None:
    with app.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME, COLUMN_NAME, COLUMN_COMMENT FROM"
                    " information_schema.COLUMNS WHERE TABLE_SCHEMA = %s", (app.name,))
        columns = cur.fetchall()
        cur.execute("SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES"
                    " WHERE TABLE_SCHEMA = %s", (app.name,))
        tables = cur.fetchall()
        cur.execute("SELECT COUNT(*) AS n FROM information_schema.REFERENTIAL_CONSTRAINTS"
                    " WHERE CONSTRAINT_SCHEMA = %s", (app.name,))
        foreign_keys = cur.fetchone()["n"]
    assert {t["TABLE_NAME"] for t in tables} == {"sender_outbox", "sender_jobs",
                                                 "sender_workflow_actions"}
    assert len(columns) >= 30
    chinese = [c for c in [*columns, *tables]
               if any("\u4e00" <= ch <= "\u9fff"
                      for ch in c.get("COLUMN_COMMENT", c.get("TABLE_COMMENT", "")))]
    assert len(chinese) == len(columns) + len(tables)
    assert foreign_keys == 0


async def test_the_checks_hold_for_any_writer(app: AppDatabase, pool: Any) -> None:
    job = await new_job(pool, unique_queue(app))
    with app.sql() as conn, conn.cursor() as cur:
        for change in ("state = 'DONE'", "input = 'not json'", "max_attempts = 0"):
            with pytest.raises(pymysql.err.MySQLError):
                cur.execute(f"UPDATE sender_outbox SET {change} WHERE business_id = %s",
                            (job.id,))

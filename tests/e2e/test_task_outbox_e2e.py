"""The task-outbox example against a real Orbit API process (and the application's own
database on the same test server): the sender records the receipt with the business link; a
sender killed (SIGKILL) between Orbit's acceptance and its recording transaction leaves the row
leased, and the next holder re-sends it with the same key, gets the original receipt and Orbit
holds one task; Orbit down means backoff (database clock) and a later success; a refused
request fails at once and is kept; the command line does it all end to end.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from orbit_sdk import Client, RawJson, TaskRequest
from task_outbox.database import close_pool, open_pool, transaction
from task_outbox.jobs import JobLink, create_job
from task_outbox.sender import Sender, Settings

from orbit_common.db.pool import DatabaseUrl
from tests.support import database
from tests.support.outbox import AppDatabase, app_database
from tests.support.processes import ApiDaemon, free_port, wait_until
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

LINKS = {JobLink.table: JobLink()}
AMOUNT = '{"amount": 12345678901234567890.123456789}'


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("outbox-stack"), dispatchers=0)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def app(stack: Stack) -> Iterator[AppDatabase]:
    with app_database(stack.server) as db:
        yield db


@pytest.fixture
async def pool(app: AppDatabase) -> AsyncIterator[Any]:
    p = await open_pool(app.app_url, maxsize=4)
    try:
        yield p
    finally:
        await close_pool(p)


@pytest.fixture
def queue(stack: Stack) -> str:
    name = f"outbox-{secrets.token_hex(4)}"
    stack.create_queue(name)
    return name


async def new_job(pool: Any, stack: Stack, queue: str, handler: str = "report.build",
                  **kwargs: Any) -> Any:
    request = TaskRequest(queue=queue, handler=handler, input=RawJson(AMOUNT),
                          business_key="report-2026-12")

    async def body(cur: Any) -> Any:
        return await create_job(cur, name="nightly report", namespace=stack.namespace,
                                request=request, **kwargs)

    return await transaction(pool, body)


def job_row(app: AppDatabase, job_id: str) -> dict[str, Any]:
    return app.one("SELECT o.state, o.attempts, o.generation, o.task_id, o.receipt,"
                   " o.last_error, o.wake_at, j.state AS job_state, j.task_id AS job_task"
                   " FROM sender_jobs j JOIN sender_outbox o ON o.id = j.outbox_id"
                   " WHERE j.id = %s", (bytes.fromhex(job_id),))


async def orbit_tasks(stack: Stack, queue: str) -> list[str]:
    async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
        return [t.id async for t in orbit.list_tasks(queue=queue)]


def sender(pool: Any, client: Client, queue: str, **settings: Any) -> Sender:
    return Sender(pool, client, Settings(queues=(queue,), **settings), links=LINKS)


async def test_the_sender_records_the_receipt_with_the_business_link(
        stack: Stack, app: AppDatabase, pool: Any, queue: str) -> None:
    job = await new_job(pool, stack, queue)
    async with Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0) as client:
        result = await sender(pool, client, queue).run_once()
        assert (result.leased, result.sent) == (1, 1)
        row = job_row(app, job.id)
        assert (row["state"], row["attempts"], row["wake_at"]) == ("SENT", 1, None)
        assert row["job_state"] == "SUBMITTED"
        assert row["task_id"] == row["job_task"] == json.loads(row["receipt"])["id"]
        task = await client.get_task(row["task_id"])
        assert (task.queue, task.handler, task.business_key) == (
            queue, "report.build", "report-2026-12")
    # Orbit stored the input byte for byte as the business transaction wrote it.
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT input FROM pulse_tasks WHERE LOWER(HEX(id)) = %s",
                    (row["task_id"],))
        assert cur.fetchone()[0] == '{"amount":12345678901234567890.123456789}'


async def test_two_senders_share_the_work_without_sending_a_request_twice(
        stack: Stack, app: AppDatabase, pool: Any, queue: str) -> None:
    jobs = [await new_job(pool, stack, queue) for _ in range(12)]
    async with Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0) as client:
        first, second = (sender(pool, client, queue, batch_size=4) for _ in range(2))
        totals = {"leased": 0, "sent": 0}
        while totals["sent"] < len(jobs):
            passes = await asyncio.gather(first.run_once(), second.run_once())
            for result in passes:
                totals["leased"] += result.leased
                totals["sent"] += result.sent
            assert sum(p.leased for p in passes) > 0  # nothing lapses: every pass finds work
    assert totals == {"leased": 12, "sent": 12}  # no row was leased twice
    rows = [job_row(app, job.id) for job in jobs]
    assert {(r["state"], r["attempts"], r["job_state"]) for r in rows} == {
        ("SENT", 1, "SUBMITTED")}
    assert sorted(await orbit_tasks(stack, queue)) == sorted(r["task_id"] for r in rows)


class BrokenLink(JobLink):
    """A business update that fails inside the recording transaction."""

    async def on_sent(self, cur: Any, entry: Any, task: Any) -> None:
        await super().on_sent(cur, entry, task)
        raise RuntimeError("the business update failed")


async def test_the_receipt_and_the_business_link_commit_together(
        stack: Stack, app: AppDatabase, pool: Any, queue: str) -> None:
    job = await new_job(pool, stack, queue)
    async with Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0) as client:
        broken = Sender(pool, client, Settings(queues=(queue,), lease_ms=500),
                        links={JobLink.table: BrokenLink()})
        result = await broken.run_once()
        assert (result.leased, result.lost) == (1, 1)
        # Neither the receipt nor the job's link was written: the whole transaction rolled back.
        row = job_row(app, job.id)
        assert (row["state"], row["task_id"], row["job_state"], row["job_task"]) == (
            "LEASED", None, "REQUESTED", None)
        accepted = await orbit_tasks(stack, queue)
        healthy = sender(pool, client, queue)

        async def recorded() -> bool:
            return (await healthy.run_once()).sent == 1

        await until(recorded, timeout=20, interval=0.05, message="the re-send after the lapse")
    row = job_row(app, job.id)
    assert row["task_id"] == row["job_task"] == accepted[0]
    assert await orbit_tasks(stack, queue) == accepted


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


async def test_a_sender_killed_after_acceptance_is_answered_with_the_original_receipt(
        stack: Stack, app: AppDatabase, pool: Any, queue: str, tmp_path: Path) -> None:
    job = await new_job(pool, stack, queue)
    key = app.value("SELECT idempotency_key FROM sender_outbox WHERE business_id = %s",
                    (job.id,))
    # A real sender process that freezes itself right after Orbit accepted the request and
    # before its recording transaction; then it is killed.
    with (tmp_path / "sender.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "task_outbox", "run-sender", "--queue", queue,
             "--lease-ms", "1000", "--poll-interval-s", "0.05", "--fault-stop-after-send"],
            env={**os.environ, "TASK_OUTBOX_DATABASE_URL": app.rendered,
                 "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
                 "ORBIT_NAMESPACE": stack.namespace},
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        def frozen() -> bool:
            assert proc.poll() is None, (tmp_path / "sender.log").read_text()
            return _stopped(proc.pid)

        wait_until(frozen, timeout=30, message="the sender to stop after the send")
        accepted = await orbit_tasks(stack, queue)
        assert len(accepted) == 1  # Orbit accepted ...
        row = job_row(app, job.id)
        assert (row["state"], row["task_id"], row["job_state"]) == ("LEASED", None, "REQUESTED")
    finally:
        proc.kill()  # SIGKILL: ... and the sender never recorded it
        proc.wait(timeout=10)

    async with Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0) as client:
        survivor = sender(pool, client, queue)

        async def resent() -> bool:
            return (await survivor.run_once()).sent == 1

        await until(resent, timeout=20, interval=0.05,
                    message="the lapsed lease to be taken over and the request re-sent")
    row = job_row(app, job.id)
    assert (row["state"], row["attempts"], row["generation"]) == ("SENT", 2, 2)
    # The same key, answered with the original receipt: the task Orbit accepted the first time.
    assert row["task_id"] == row["job_task"] == accepted[0]
    assert json.loads(row["receipt"])["id"] == accepted[0]
    assert await orbit_tasks(stack, queue) == accepted
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM orbit_idempotency_keys"
                    " WHERE idem_key = %s", (key.encode(),))
        assert cur.fetchone()[0] == 1


async def test_orbit_down_means_backoff_and_a_later_success(
        stack: Stack, app: AppDatabase, pool: Any, queue: str, tmp_path: Path) -> None:
    job = await new_job(pool, stack, queue)
    port = free_port()  # Orbit's address, with nothing listening yet
    async with Client(f"http://127.0.0.1:{port}", stack.api_key, stack.namespace, timeout=5,
                      max_retries=0) as client:
        down = sender(pool, client, queue, backoff_initial_ms=2_000, backoff_max_ms=2_000)
        first = await down.run_once()
        assert (first.leased, first.retried) == (1, 1)
        row = app.one("SELECT state, attempts, last_error, wake_at > UTC_TIMESTAMP(6) AS later,"
                      " TIMESTAMPDIFF(MICROSECOND, updated_at, wake_at) AS backoff_us"
                      " FROM sender_outbox WHERE business_id = %s", (job.id,))
        assert (row["state"], row["attempts"], row["later"]) == ("PENDING", 1, 1)
        assert 1_000_000 <= row["backoff_us"] <= 2_000_000  # half to full, jittered
        assert "send 1 failed" in row["last_error"]
        assert (await down.run_once()).leased == 0  # not before its time

        api = ApiDaemon(db_url=stack.daemon_url, log=tmp_path / "api-late.log", port=port)
        try:
            api.wait_listening()

            async def sent() -> bool:
                return (await down.run_once()).sent == 1

            await until(sent, timeout=20, interval=0.05, message="the send after Orbit is up")
        finally:
            api.stop()
    row = job_row(app, job.id)
    assert (row["state"], row["attempts"], row["job_state"]) == ("SENT", 2, "SUBMITTED")
    assert await orbit_tasks(stack, queue) == [row["task_id"]]


async def test_a_full_queue_is_backpressure_not_failure(
        stack: Stack, app: AppDatabase, pool: Any) -> None:
    queue = f"outbox-full-{secrets.token_hex(4)}"
    stack.create_queue(queue, max_unfinished_tasks=1)
    first, second = [await new_job(pool, stack, queue) for _ in range(2)]
    async with Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0) as client:
        result = await sender(pool, client, queue, backoff_initial_ms=1,
                              backoff_max_ms=1).run_once()
    assert (result.leased, result.sent, result.retried) == (2, 1, 1)
    rows = {job.id: app.one("SELECT state, attempts, last_error,"
                            " TIMESTAMPDIFF(MICROSECOND, updated_at, wake_at) AS backoff_us"
                            " FROM sender_outbox WHERE business_id = %s", (job.id,))
            for job in (first, second)}
    full = next(r for r in rows.values() if r["state"] == "PENDING")
    assert "queue_full" in full["last_error"]
    assert full["backoff_us"] >= 1_000_000  # Orbit's Retry-After (1 s), not the 1 ms backoff
    assert len(await orbit_tasks(stack, queue)) == 1


async def test_a_refused_request_fails_at_once_and_is_kept(
        stack: Stack, app: AppDatabase, pool: Any, queue: str) -> None:
    job = await new_job(pool, stack, queue, handler="not a handler!")
    async with Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0) as client:
        result = await sender(pool, client, queue).run_once()
    assert (result.leased, result.failed) == (1, 1)
    row = job_row(app, job.id)
    assert (row["state"], row["attempts"], row["job_state"]) == ("FAILED", 1, "SUBMIT_FAILED")
    assert "validation_failed" in row["last_error"]
    assert await orbit_tasks(stack, queue) == []


def test_the_command_line_end_to_end(stack: Stack, queue: str, tmp_path: Path) -> None:
    name = database.scratch_name("sender_cli")
    url: DatabaseUrl = database.create_database(stack.server, name, migrate=False)
    env = {**os.environ, "TASK_OUTBOX_DATABASE_URL": url.render(hide_password=False),
           "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
           "ORBIT_NAMESPACE": stack.namespace}

    def cli(*args: str) -> Any:
        done = subprocess.run([sys.executable, "-m", "task_outbox", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        assert "ready" in cli("init-db")
        assert "ready" in cli("init-db")  # again: nothing to do
        created = json.loads(cli("create-job", "月度报表", "--queue", queue, "--handler",
                                 "report.build", "--input", '{"month": "2026-11"}'))
        status = json.loads(cli("status", "--job", created["job"]))["job"]
        assert (status["state"], status["job_state"]) == ("PENDING", "REQUESTED")
        assert status["idempotency_key"] == created["idempotency_key"]
        passed = json.loads(cli("run-sender", "--queue", queue, "--once"))
        assert passed == {"leased": 1, "sent": 1, "retried": 0, "failed": 0, "lost": 0}
        status = json.loads(cli("status", "--job", created["job"]))["job"]
        assert (status["state"], status["job_state"], status["name"]) == (
            "SENT", "SUBMITTED", "月度报表")
        assert status["task_id"] is not None
        overview = json.loads(cli("status"))
        assert overview["requests"] == {"SENT": 1}
        assert overview["jobs"] == {"SUBMITTED": 1}

        # The long-running sender: sends what comes in, stops cleanly on SIGTERM.
        later = json.loads(cli("create-job", "周报", "--queue", queue, "--handler",
                               "report.build"))
        with (tmp_path / "sender.log").open("wb") as log:
            running = subprocess.Popen(
                [sys.executable, "-m", "task_outbox", "run-sender", "--queue", queue,
                 "--poll-interval-s", "0.05"], env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(lambda: json.loads(cli("status", "--job", later["job"]))["job"]["state"]
                       == "SENT", timeout=30, interval=0.1, message="the sender to send")
            running.send_signal(signal.SIGTERM)
            assert running.wait(timeout=20) == 0, (tmp_path / "sender.log").read_text()
        finally:
            if running.poll() is None:
                running.kill()
                running.wait(timeout=10)
        assert json.loads(cli("status"))["jobs"] == {"SUBMITTED": 2}
        bad = subprocess.run([sys.executable, "-m", "task_outbox", "create-job", "x",
                              "--queue", queue, "--handler", "h", "--input", "{nope"],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
        assert bad.returncode == 2
        assert "--input" in bad.stderr
    finally:
        database.drop_database(stack.server, name)

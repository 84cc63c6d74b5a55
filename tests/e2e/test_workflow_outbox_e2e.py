"""The task-outbox example's workflow starts and signals against a real Orbit API process (and
the application's own database on the same test server): each action and its pending request
are written in one local transaction; the sender starts the instance / sends the signal with
the key fixed at write time and records the receipt with the action in one transaction; a
replayed send answers the original receipt; a sender killed (SIGKILL) between Orbit's
acceptance and its recording transaction is followed by a re-send that gets the same instance
and the same signal, and Orbit holds one of each; the command line does it end to end.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from orbit_sdk import Client, RawJson, WorkflowInstance, WorkflowSignal
from orbit_sdk.outbox import OutboxEntry, SignalRequest, WorkflowStartRequest, send
from task_outbox.database import close_pool, open_pool, transaction
from task_outbox.jobs import JobLink
from task_outbox.sender import Sender, Settings
from task_outbox.workflows import ActionLink, create_signal, create_start

from orbit_common.db.pool import DatabaseUrl
from tests.support import database
from tests.support.outbox import AppDatabase, app_database
from tests.support.processes import wait_until
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

LINKS = {JobLink.table: JobLink(), ActionLink.table: ActionLink()}
ORDER = '{"order_id": "o-7", "amount": 12345678901234567890.123456789}'


def document() -> dict[str, Any]:
    """Start, wait for ``paid`` (correlated by the order id), succeed."""
    return {"format": "orbit.weave/1", "start": "wait_paid",
            "steps": {"wait_paid": {"kind": "SIGNAL", "signal": "paid",
                                    "correlation": "input.order_id", "next": "done"},
                      "done": {"kind": "SUCCEED"}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("wf-outbox-stack"), dispatchers=0)
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
async def definition(stack: Stack) -> str:
    """A fresh published definition: also the lane of its starts and signals."""
    name = f"orders_{secrets.token_hex(4)}"
    async with Client(stack.api.url, stack.api_key, stack.namespace) as orbit:
        await orbit.create_workflow_definition(name)
        await orbit.publish_workflow_version(name, document(), revision=1)
    return name


def client(stack: Stack) -> Client:
    return Client(stack.api.url, stack.api_key, stack.namespace, max_retries=0)


def sender(pool: Any, orbit: Client, lane: str, **settings: Any) -> Sender:
    return Sender(pool, orbit, Settings(queues=(lane,), **settings), links=LINKS)


async def new_start(pool: Any, stack: Stack, definition: str, business_key: str) -> Any:
    request = WorkflowStartRequest(definition=definition, input=RawJson(ORDER),
                                   business_key=business_key)

    async def body(cur: Any) -> Any:
        return await create_start(cur, request, namespace=stack.namespace)

    return await transaction(pool, body)


async def new_signal(pool: Any, stack: Stack, definition: str, **target: Any) -> Any:
    request = SignalRequest(definition=definition, name="paid",
                            payload=RawJson('{"paid": 12.30}'), correlation_key="o-7", **target)

    async def body(cur: Any) -> Any:
        return await create_signal(cur, request, namespace=stack.namespace)

    return await transaction(pool, body)


def action_row(app: AppDatabase, action_id: str) -> dict[str, Any]:
    return app.one("SELECT o.state, o.attempts, o.generation, o.task_id, o.receipt,"
                   " o.idempotency_key, o.operation, o.queue, o.handler, a.kind,"
                   " a.state AS action_state, a.workflow_id, a.signal_id"
                   " FROM sender_workflow_actions a JOIN sender_outbox o ON o.id = a.outbox_id"
                   " WHERE a.id = %s", (bytes.fromhex(action_id),))


def stored_entry(app: AppDatabase, action_id: str) -> OutboxEntry:
    return OutboxEntry.from_row(app.one(
        "SELECT o.* FROM sender_outbox o JOIN sender_workflow_actions a ON a.outbox_id = o.id"
        " WHERE a.id = %s", (bytes.fromhex(action_id),)))


async def instances(stack: Stack, definition: str) -> list[str]:
    async with client(stack) as orbit:
        return [w.id async for w in orbit.list_workflows(definition=definition)]


async def signals(stack: Stack, workflow_id: str) -> list[str]:
    async with client(stack) as orbit:
        return [s.id async for s in orbit.list_signals(workflow_id)]


def idempotency_records(stack: Stack, key: str) -> int:
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM orbit_idempotency_keys WHERE idem_key = %s",
                    (key.encode(),))
        return int(cur.fetchone()[0])


async def test_start_and_signal_are_recorded_with_the_action_and_a_replay_is_the_receipt(
        stack: Stack, app: AppDatabase, pool: Any, definition: str) -> None:
    start = await new_start(pool, stack, definition, "order-o-7")
    row = action_row(app, start.id)
    assert (row["operation"], row["queue"], row["handler"], row["state"]) == (
        "workflows.start", definition, "", "PENDING")
    async with client(stack) as orbit:
        result = await sender(pool, orbit, definition).run_once()
        assert (result.leased, result.sent) == (1, 1)
        row = action_row(app, start.id)
        assert (row["state"], row["attempts"], row["action_state"], row["task_id"]) == (
            "SENT", 1, "ACCEPTED", None)
        workflow_id = row["workflow_id"]
        assert json.loads(row["receipt"])["id"] == workflow_id
        instance = await orbit.get_workflow(workflow_id)
        assert (instance.definition, instance.business_key, instance.state) == (
            definition, "order-o-7", "RUNNING")
        # A replayed send of the stored start: the original receipt, no second instance.
        replay = await send(orbit, stored_entry(app, start.id))
        assert isinstance(replay, WorkflowInstance)
        assert replay.id == workflow_id

        by_key = await new_signal(pool, stack, definition, business_key="order-o-7")
        by_id = await new_signal(pool, stack, definition, workflow_id=workflow_id)
        result = await sender(pool, orbit, definition).run_once()
        assert (result.leased, result.sent) == (2, 2)
        sent = {a.id: action_row(app, a.id) for a in (by_key, by_id)}
        assert {(r["operation"], r["handler"], r["state"], r["action_state"], r["workflow_id"])
                for r in sent.values()} == {
            ("workflows.signal", "paid", "SENT", "ACCEPTED", workflow_id)}
        signal_ids = {r["signal_id"] for r in sent.values()}
        assert len(signal_ids) == 2
        replay_signal = await send(orbit, stored_entry(app, by_key.id))
        assert isinstance(replay_signal, WorkflowSignal)
        assert replay_signal.id == sent[by_key.id]["signal_id"]
    assert await instances(stack, definition) == [workflow_id]
    assert set(await signals(stack, workflow_id)) == signal_ids
    # Orbit stored the start's input byte for byte as the business transaction wrote it.
    assert instance.raw["input"]["amount"] == 12345678901234567890.123456789


def run_sender_process(stack: Stack, app: AppDatabase, lane: str,
                       log: Path) -> subprocess.Popen[bytes]:
    """A real sender that freezes itself right after Orbit accepted a request and before its
    recording transaction."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "task_outbox", "run-sender", "--workflow", lane,
             "--lease-ms", "1000", "--poll-interval-s", "0.05", "--fault-stop-after-send"],
            env={**os.environ, "TASK_OUTBOX_DATABASE_URL": app.rendered,
                 "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
                 "ORBIT_NAMESPACE": stack.namespace},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


async def kill_after_acceptance(stack: Stack, app: AppDatabase, pool: Any, lane: str,
                                action_id: str, log: Path) -> None:
    """Run a sender process until it froze after Orbit's acceptance, SIGKILL it, check nothing
    was recorded, then let a healthy sender take the lapsed lease over and re-send."""
    proc = run_sender_process(stack, app, lane, log)
    try:
        def frozen() -> bool:
            assert proc.poll() is None, log.read_text()
            return _stopped(proc.pid)

        wait_until(frozen, timeout=30, message="the sender to stop after the send")
        row = action_row(app, action_id)
        assert (row["state"], row["action_state"], row["receipt"]) == (
            "LEASED", "REQUESTED", None)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    async with client(stack) as orbit:
        survivor = sender(pool, orbit, lane)

        async def resent() -> bool:
            return (await survivor.run_once()).sent == 1

        await until(resent, timeout=20, interval=0.05,
                    message="the lapsed lease to be taken over and the request re-sent")
    row = action_row(app, action_id)
    assert (row["state"], row["attempts"], row["generation"], row["action_state"]) == (
        "SENT", 2, 2, "ACCEPTED")


async def test_a_sender_killed_after_acceptance_gets_the_same_instance_and_signal(
        stack: Stack, app: AppDatabase, pool: Any, definition: str, tmp_path: Path) -> None:
    start = await new_start(pool, stack, definition, "order-kill")
    await kill_after_acceptance(stack, app, pool, definition, start.id, tmp_path / "start.log")
    accepted = await instances(stack, definition)
    assert len(accepted) == 1  # accepted once, before the kill; the re-send got it back
    row = action_row(app, start.id)
    assert row["workflow_id"] == json.loads(row["receipt"])["id"] == accepted[0]
    assert idempotency_records(stack, row["idempotency_key"]) == 1

    signal = await new_signal(pool, stack, definition, business_key="order-kill")
    await kill_after_acceptance(stack, app, pool, definition, signal.id,
                                tmp_path / "signal.log")
    row = action_row(app, signal.id)
    assert row["workflow_id"] == accepted[0]
    assert await signals(stack, accepted[0]) == [row["signal_id"]]
    assert json.loads(row["receipt"])["id"] == row["signal_id"]
    assert idempotency_records(stack, row["idempotency_key"]) == 1


async def test_a_signal_ahead_of_its_start_backs_off_and_is_delivered_after_it(
        stack: Stack, app: AppDatabase, pool: Any, definition: str) -> None:
    signal = await new_signal(pool, stack, definition, business_key="order-early")
    async with client(stack) as orbit:
        early = sender(pool, orbit, definition, backoff_initial_ms=1, backoff_max_ms=1)
        result = await early.run_once()
        assert (result.leased, result.retried) == (1, 1)  # no such instance yet: 404, backoff
        row = app.one("SELECT state, attempts, last_error FROM sender_outbox"
                      " WHERE business_id = %s", (signal.id,))
        assert (row["state"], row["attempts"]) == ("PENDING", 1)
        assert "send 1 failed" in row["last_error"]
        start = await new_start(pool, stack, definition, "order-early")

        async def both_sent() -> bool:
            await early.run_once()
            return {action_row(app, a.id)["state"] for a in (start, signal)} == {"SENT"}

        await until(both_sent, timeout=20, interval=0.05, message="start, then the signal")
    workflow_id = action_row(app, start.id)["workflow_id"]
    row = action_row(app, signal.id)
    assert (row["action_state"], row["workflow_id"]) == ("ACCEPTED", workflow_id)
    assert await signals(stack, workflow_id) == [row["signal_id"]]


async def test_a_refused_start_fails_at_once_and_is_kept(
        stack: Stack, app: AppDatabase, pool: Any, definition: str) -> None:
    request = WorkflowStartRequest(definition=definition, input=RawJson("[1, 2]"))

    async def body(cur: Any) -> Any:
        return await create_start(cur, request, namespace=stack.namespace)

    start = await transaction(pool, body)
    async with client(stack) as orbit:
        result = await sender(pool, orbit, definition).run_once()
    assert (result.leased, result.failed) == (1, 1)
    row = action_row(app, start.id)
    assert (row["state"], row["attempts"], row["action_state"]) == ("FAILED", 1, "FAILED")
    assert await instances(stack, definition) == []


def test_the_command_line_starts_and_signals(stack: Stack, definition: str) -> None:
    name = database.scratch_name("sender_wf_cli")
    url: DatabaseUrl = database.create_database(stack.server, name, migrate=False)
    env = {**os.environ, "TASK_OUTBOX_DATABASE_URL": url.render(hide_password=False),
           "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
           "ORBIT_NAMESPACE": stack.namespace}

    def cli(*args: str, code: int = 0) -> Any:
        done = subprocess.run([sys.executable, "-m", "task_outbox", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == code, done.stderr
        return done.stdout if code == 0 else done.stderr

    try:
        cli("init-db")
        started = json.loads(cli("workflow-start", definition, "--input",
                                 '{"order_id": "o-9"}', "--business-key", "order-o-9"))
        shown = json.loads(cli("status", "--action", started["action"]))["action"]
        assert (shown["kind"], shown["state"], shown["action_state"]) == (
            "workflow.start", "PENDING", "REQUESTED")
        assert shown["idempotency_key"] == started["idempotency_key"]
        once = ("run-sender", "--workflow", definition, "--once")
        assert json.loads(cli(*once)) == {"leased": 1, "sent": 1, "retried": 0, "failed": 0,
                                          "lost": 0}
        # The signal goes to the instance by its business key: written after the start was
        # accepted (sends of one pass are concurrent, so a signal racing its start would get
        # a 404 and back off).
        signalled = json.loads(cli("signal", "paid", "--definition", definition,
                                   "--business-key", "order-o-9", "--payload", '{"paid": 1}',
                                   "--correlation-key", "o-9"))
        assert json.loads(cli(*once)) == {"leased": 1, "sent": 1, "retried": 0, "failed": 0,
                                          "lost": 0}
        shown = json.loads(cli("status", "--action", started["action"]))["action"]
        sig = json.loads(cli("status", "--action", signalled["action"]))["action"]
        assert (shown["state"], shown["action_state"]) == ("SENT", "ACCEPTED")
        assert (sig["kind"], sig["action_state"], sig["workflow_id"]) == (
            "signal", "ACCEPTED", shown["workflow_id"])
        assert sig["signal_id"] is not None
        overview = json.loads(cli("status"))
        assert overview["actions"] == {"workflow.start": {"ACCEPTED": 1},
                                       "signal": {"ACCEPTED": 1}}
        assert "exactly one of --workflow and --business-key" in cli(
            "signal", "paid", "--definition", definition, code=2)
        assert "--payload" in cli("signal", "paid", "--definition", definition,
                                  "--workflow", "ab" * 16, "--payload", "{nope", code=2)
        assert "--queue or --workflow" in cli("run-sender", "--once", code=2)
    finally:
        database.drop_database(stack.server, name)

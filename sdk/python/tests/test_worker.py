"""The Worker against the fake dispatcher: batching, leases, cancellation, reports, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from conftest import Running
from fake_dispatcher import FakeDispatcher

from orbit_sdk import Context, OutcomeUnknown, RawJson, RetryableError, Unauthorized, Worker

MakeWorker = Callable[..., Worker]
RunWorker = Callable[[Worker], Running]


def by_attempt(fake: FakeDispatcher) -> dict[str, dict[str, Any]]:
    """The last finish item sent for each attempt."""
    return {item["attempt_id"]: item for item in fake.finish_items()}


def outcome_of(fake: FakeDispatcher, task_id: str) -> dict[str, Any]:
    return by_attempt(fake)[fake.attempt_for(task_id).attempt_id]


async def test_grants_are_started_in_one_batch_and_results_reported(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    tasks = [fake.add_task("double", {"n": n}) for n in range(5)]
    worker = make_worker(concurrency=8)

    @worker.handler("double")
    async def double(ctx: Context, data: Any) -> Any:
        return {"n": data["n"] * 2, "attempt": ctx.attempt, "task": ctx.task_id}

    run_worker(worker)
    await fake.until(lambda: sum(a.state == "FINISHED" for a in fake.attempts.values()) == 5)

    starts = fake.of_type("start")
    assert len(starts) == 1, "the five grants of one push are started in one request"
    assert len(starts[0].body["items"]) == 5
    assert set(starts[0].body["items"][0]) == {"attempt_id", "token", "generation"}
    for n, task_id in enumerate(tasks):
        item = outcome_of(fake, task_id)
        assert item["outcome"] == "succeeded"
        assert item["result"] == {"n": n * 2, "attempt": 1, "task": task_id}
        assert "retryable" not in item
        assert "error" not in item
    assert sum(len(m.body["items"]) for m in fake.of_type("finish")) == 5
    first_ready = fake.of_type("ready")[0]
    assert first_ready.body["slots"] == 8


async def test_concurrency_is_bounded_and_slots_offered_again(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    release = asyncio.Event()
    running = 0
    peak = 0
    worker = make_worker(concurrency=2)

    @worker.handler("block")
    async def block(ctx: Context, data: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    for _ in range(5):
        fake.add_task("block")
    run_worker(worker)
    await fake.until(lambda: running == 2)
    await asyncio.sleep(0.1)
    assert peak == 2
    assert len(fake.pending) == 3, "no grant beyond the free slots"
    release.set()
    await fake.until(lambda: sum(a.state == "FINISHED" for a in fake.attempts.values()) == 5)
    assert peak == 2
    assert all(m.body["slots"] <= 2 for m in fake.of_type("ready"))


async def test_renewals_are_batched_and_cancellation_reaches_the_handler(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.lease_ms = 300
    seen: dict[str, dict[str, bool]] = {}
    worker = make_worker()

    @worker.handler("long")
    async def long(ctx: Context, data: Any) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen[ctx.task_id] = {"cancel_requested": ctx.cancel_requested,
                                 "lease_lost": ctx.lease_lost}
            raise
        return "never"

    pushed, renewed, lost = (fake.add_task("long") for _ in range(3))
    run_worker(worker)
    await fake.until(lambda: sum(a.state == "RUNNING" for a in fake.attempts.values()) == 3)
    await fake.until(lambda: any(len(m.body["items"]) == 3 for m in fake.of_type("renew")))
    assert all(len(m.body["items"]) == 3 for m in fake.of_type("renew")), \
        "every renewal carries all three running attempts"

    await fake.cancel(fake.attempt_for(pushed).attempt_id, push=True)
    await fake.until(lambda: fake.state(pushed) == "FINISHED")
    assert outcome_of(fake, pushed)["outcome"] == "cancelled"
    assert seen[pushed] == {"cancel_requested": True, "lease_lost": False}

    await fake.cancel(fake.attempt_for(renewed).attempt_id, push=False)  # only renew says so
    await fake.until(lambda: fake.state(renewed) == "FINISHED")
    assert outcome_of(fake, renewed)["outcome"] == "cancelled"

    fake.attempt_for(lost).lease_lost = True
    await fake.until(lambda: lost in seen)
    assert seen[lost] == {"cancel_requested": False, "lease_lost": True}
    await asyncio.sleep(0.2)
    assert fake.attempt_for(lost).attempt_id not in by_attempt(fake), \
        "a lost lease reports nothing"
    assert worker.in_flight == 0


async def test_finish_is_resent_with_the_same_report_id_across_a_reconnect(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.lose_finish_replies = 1
    worker = make_worker()

    @worker.handler("once")
    async def once(ctx: Context, data: Any) -> int:
        return 42

    task_id = fake.add_task("once")
    run_worker(worker)
    await fake.until(lambda: len(fake.finish_items()) >= 2)
    await fake.until(lambda: worker.pending_reports == 0)

    first, second = fake.finish_items()[:2]
    assert first == second, "the same report (same report_id) is sent again"
    assert fake.attempt_for(task_id).outcome == "succeeded"
    sessions = [m.session_id for m in fake.of_type("finish")]
    assert sessions[0] != sessions[1], "re-sent through the new session"
    assert [r["instance_key"] for r in fake.registrations[:2]] == ["test-host:1"] * 2
    assert fake.sessions[sessions[0]].fenced


async def test_in_flight_attempts_keep_renewing_after_a_reconnect(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.lease_ms = 600
    release = asyncio.Event()
    worker = make_worker()

    @worker.handler("wait")
    async def wait(ctx: Context, data: Any) -> str:
        await release.wait()
        return "done"

    task_id = fake.add_task("wait")
    run_worker(worker)
    await fake.until(lambda: fake.state(task_id) == "RUNNING")
    await fake.drop_connections()
    await fake.until(lambda: len(fake.registrations) == 2)
    new_session = list(fake.sessions)[-1]
    await fake.until(lambda: any(m.session_id == new_session for m in fake.of_type("renew")))
    renew = next(m for m in fake.of_type("renew") if m.session_id == new_session)
    attempt = fake.attempt_for(task_id)
    assert renew.body["items"] == [{"attempt_id": attempt.attempt_id, "token": attempt.token,
                                    "generation": attempt.generation}]
    release.set()
    await fake.until(lambda: attempt.state == "FINISHED")
    assert attempt.outcome == "succeeded"


async def test_outcomes_follow_the_handler_contract(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    class Flaky(Exception):
        retryable = True

    worker = make_worker()

    @worker.handler("ok")
    async def ok(ctx: Context, data: Any) -> Any:
        return RawJson('{"amount": 12345678901234567890.123456789}')

    @worker.handler("retry")
    async def retry(ctx: Context, data: Any) -> None:
        raise RetryableError("the downstream said 503")

    @worker.handler("flaky")
    async def flaky(ctx: Context, data: Any) -> None:
        raise Flaky("retryable by attribute")

    @worker.handler("broken")
    async def broken(ctx: Context, data: Any) -> None:
        raise ValueError("bad input")

    @worker.handler("unsure")
    async def unsure(ctx: Context, data: Any) -> None:
        raise OutcomeUnknown("the payment gateway timed out")

    @worker.handler("opaque")
    async def opaque(ctx: Context, data: Any) -> object:
        return object()

    names = ["ok", "retry", "flaky", "broken", "unsure", "opaque"]
    tasks = {name: fake.add_task(name) for name in names}
    run_worker(worker)
    await fake.until(lambda: len(by_attempt(fake)) == len(names))
    got = {name: outcome_of(fake, task_id) for name, task_id in tasks.items()}
    assert got["ok"]["outcome"] == "succeeded"
    assert got["ok"]["result"] == {"amount": Decimal("12345678901234567890.123456789")} or \
        got["ok"]["result"] == {"amount": 12345678901234567890.123456789}
    finish = next(m for m in fake.of_type("finish")
                  if any(i["outcome"] == "succeeded" for i in m.body["items"]))
    assert finish is not None
    assert (got["retry"]["outcome"], got["retry"]["retryable"]) == ("failed", True)
    assert got["retry"]["error"] == {"type": "RetryableError",
                                     "message": "the downstream said 503"}
    assert (got["flaky"]["outcome"], got["flaky"]["retryable"]) == ("failed", True)
    assert (got["broken"]["outcome"], got["broken"]["retryable"]) == ("failed", False)
    assert got["broken"]["error"]["type"] == "ValueError"
    assert got["unsure"]["outcome"] == "unknown"
    assert "retryable" not in got["unsure"]
    assert (got["opaque"]["outcome"], got["opaque"]["retryable"]) == ("failed", False)
    assert got["opaque"]["error"]["type"] == "ResultNotJson"


async def test_numbers_stay_byte_exact_both_ways(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    seen: list[Any] = []
    worker = make_worker(exact_numbers=True)

    @worker.handler("exact")
    async def exact(ctx: Context, data: Any) -> Any:
        seen.append(data)
        return {"total": data["price"] * 2,
                "raw": RawJson("12345678901234567890.123456789")}

    fake.add_task("exact", RawJson('{"price": 0.10000000000000000001}'))
    run_worker(worker)
    await fake.until(lambda: len(fake.finish_items()) == 1)
    assert seen == [{"price": Decimal("0.10000000000000000001")}]
    text = next(t for t in fake.raw_frames if '"finish"' in t)
    assert '"total":0.20000000000000000002' in text
    assert '"raw":12345678901234567890.123456789' in text


async def test_drain_on_stop_waits_for_running_handlers(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    started = asyncio.Event()
    worker = make_worker()

    @worker.handler("slow")
    async def slow(ctx: Context, data: Any) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished in time"

    task_id = fake.add_task("slow")
    handle = run_worker(worker)
    await asyncio.wait_for(started.wait(), 5)
    worker.stop()
    later = fake.add_task("slow")
    await asyncio.wait_for(handle.task, 5)

    assert outcome_of(fake, task_id)["result"] == "finished in time"
    assert fake.of_type("ready")[-1].body["slots"] == 0, "no new work offered while draining"
    assert later not in {a.task_id for a in fake.attempts.values() if a.state != "OFFERED"}
    assert fake.deleted, "the session is closed at the end"


async def test_drain_timeout_interrupts_handlers_by_their_declared_safety(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    worker = make_worker(drain_timeout=0.2)

    @worker.handler("stuck")
    async def stuck(ctx: Context, data: Any) -> None:
        await asyncio.sleep(30)

    unsafe = fake.add_task("stuck", rerun_safe=False)
    safe = fake.add_task("stuck", rerun_safe=True)
    handle = run_worker(worker)
    await fake.until(lambda: sum(a.state == "RUNNING" for a in fake.attempts.values()) == 2)
    await handle.stop()
    assert outcome_of(fake, unsafe)["outcome"] == "unknown"
    assert (outcome_of(fake, safe)["outcome"], outcome_of(fake, safe)["retryable"]) == \
        ("failed", True)
    assert outcome_of(fake, safe)["error"]["type"] == "interrupted"


async def test_long_poll_fallback_when_the_websocket_upgrade_fails(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.websocket = False
    fake.lease_ms = 400
    worker = make_worker()

    @worker.handler("echo")
    async def echo(ctx: Context, data: Any) -> Any:
        await asyncio.sleep(0.3)  # long enough for one renewal
        return data

    tasks = [fake.add_task("echo", {"i": i}) for i in range(3)]
    run_worker(worker)
    await fake.until(lambda: all(fake.state(t) == "FINISHED" for t in tasks))
    assert worker.channel_kind == "long-poll"
    assert fake.of_type("poll")
    assert all(m.transport == "http" for m in fake.messages)
    assert [outcome_of(fake, t)["result"] for t in tasks] == [{"i": i} for i in range(3)]
    assert fake.of_type("renew"), "renewals go over HTTP too"
    assert len(fake.registrations) == 1, "the same session falls back; no re-registration"


async def test_a_refused_credential_stops_the_worker_with_its_error(
        fake: FakeDispatcher) -> None:
    worker = Worker(fake.url, "wrong-key", "default", queues=["q"])

    @worker.handler("any")
    async def any_handler(ctx: Context, data: Any) -> None:
        return None

    with pytest.raises(Unauthorized):
        await asyncio.wait_for(worker.run(install_signal_handlers=False), 5)
    assert fake.registrations == []


async def test_a_grant_for_an_unknown_handler_is_reported_failed(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    worker = make_worker()

    @worker.handler("known")
    async def known(ctx: Context, data: Any) -> None:
        return None

    task_id = fake.add_task("unknown")
    run_worker(worker)
    await fake.until(lambda: fake.state(task_id) == "FINISHED")
    item = outcome_of(fake, task_id)
    assert (item["outcome"], item["retryable"], item["error"]["type"]) == \
        ("failed", False, "LookupError")
    assert fake.registrations[0]["handlers"] == ["known"]
    # Handlers plus the reports still on their way (the dispatcher counts an attempt until its
    # finish commits; the slot is free once the report is filed).
    assert fake.registrations[0]["max_in_flight"] == 16


async def test_a_result_the_dispatcher_refuses_as_too_large_is_reported_failed(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    """The dispatcher stores less than the worker allowed: ``result_too_large`` leaves the lease
    running, and the worker reports the attempt failed (ResultTooLarge) instead."""
    fake.max_result_bytes = 1000
    worker = make_worker()

    @worker.handler("big")
    async def big(ctx: Context, data: Any) -> str:
        return "x" * 2000

    task_id = fake.add_task("big")
    run_worker(worker)
    await fake.until(lambda: fake.state(task_id) == "FINISHED")
    item = outcome_of(fake, task_id)
    assert (item["outcome"], item["retryable"], item["error"]["type"]) == \
        ("failed", False, "ResultTooLarge")
    assert any(m.body["items"][0].get("result") for m in fake.of_type("finish")), \
        "the result was offered first"


# --- flow control ----------------------------------------------------------------------------


async def test_a_rate_limited_start_is_sent_again_after_retry_after(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.rate_limit_starts = 2
    fake.rate_limit_ms = 80
    seen: dict[str, Any] = {}
    worker = make_worker(concurrency=1)

    @worker.handler("keyed")
    async def keyed(ctx: Context, data: Any) -> str:
        seen.update(key=ctx.concurrency_key, token=ctx.concurrency_token,
                    fencing=ctx.fencing_token)
        return "done"

    task_id = fake.add_task("keyed", concurrency_key="account:42", concurrency_token=17)
    run_worker(worker)
    await fake.until(lambda: fake.state(task_id) == "FINISHED")
    assert outcome_of(fake, task_id)["outcome"] == "succeeded"
    starts = fake.of_type("start")
    assert len(starts) == 3, "two refusals, then the approved start"
    assert all(m.body["items"][0]["attempt_id"] == fake.attempt_for(task_id).attempt_id
               for m in starts)
    assert worker.starts_deferred == 2
    assert seen == {"key": "account:42", "token": 17, "fencing": 17}
    # The waiting attempt kept its slot: nothing else was granted meanwhile.
    assert len(fake.attempts) == 1


async def test_a_rate_limited_start_past_its_offer_is_given_up(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.rate_limit_starts = 100
    fake.rate_limit_ms = 5000
    fake.offer_s = 1.0  # the offer expires before the window would have room
    worker = make_worker(concurrency=1)
    ran: list[str] = []

    @worker.handler("h")
    async def handler(ctx: Context, data: Any) -> None:
        ran.append(ctx.task_id)

    task_id = fake.add_task("h")
    run_worker(worker)
    await fake.until(lambda: len(fake.of_type("start")) == 1)
    await fake.until(lambda: worker.in_flight == 0)
    assert worker.starts_deferred == 0
    assert ran == []
    assert fake.state(task_id) == "OFFERED"  # left to expire at the dispatcher


@pytest.mark.parametrize("reason", ["queue_paused", "offer_expired", "cancel_requested"])
async def test_other_refusals_still_end_the_attempt_at_once(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker,
        reason: str) -> None:
    fake.refuse_starts = reason
    worker = make_worker(concurrency=1)
    ran: list[str] = []

    @worker.handler("h")
    async def handler(ctx: Context, data: Any) -> None:
        ran.append(ctx.task_id)

    task_id = fake.add_task("h")
    run_worker(worker)
    await fake.until(lambda: len(fake.of_type("start")) == 1)
    await fake.until(lambda: worker.in_flight == 0)
    await asyncio.sleep(0.1)
    assert len(fake.of_type("start")) == 1, "not sent again"
    assert worker.starts_deferred == 0
    assert ran == []
    assert fake.state(task_id) == "OFFERED"


async def test_draining_drops_a_start_waiting_for_its_window(
        fake: FakeDispatcher, make_worker: MakeWorker, run_worker: RunWorker) -> None:
    fake.rate_limit_starts = 100
    fake.rate_limit_ms = 10_000
    worker = make_worker(concurrency=1)

    @worker.handler("h")
    async def handler(ctx: Context, data: Any) -> None:
        return None

    fake.add_task("h")
    handle = run_worker(worker)
    await fake.until(lambda: worker.starts_deferred == 1)
    await asyncio.wait_for(handle.stop(), 3)
    assert worker.in_flight == 0
    assert len(fake.of_type("start")) == 1

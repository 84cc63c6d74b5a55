"""The client's subscription calls against a scripted fake API: request shapes, keys, retries,
models and problem codes. (The Subscriber is tested against the real API: tests/e2e.)"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from test_client import NS, FakeApi, api, drop, ok, problem

from orbit_sdk import (
    UNSET,
    Client,
    Conflict,
    ConnectionFailed,
    DeliveryReport,
    LeasedDelivery,
    ServiceUnavailable,
    SubscriptionFilters,
    jsonvalue,
)
from orbit_sdk.client import _Unset
from orbit_sdk.subscriber import error_text

__all__ = ["api"]  # the fixture, shared with test_client

SUB = {
    "id": "5b" * 16, "name": "billing", "kind": "WEBHOOK",
    "endpoint_url": "https://billing.example.com/hook",
    "filters": {"queues": ["invoices"], "states": ["SUCCEEDED"], "handlers": []},
    "max_attempts": 20, "backoff_initial_ms": 1000, "backoff_max_ms": 3600000,
    "lease_ms": 30000, "start_after_sequence": 41, "scan_after_sequence": 97, "backlog": 3,
    "state": "ACTIVE", "revision": 2, "owner_application_id": "0f" * 16,
    "previous_secret_valid_until": None,
    "circuit": {"state": "OPEN", "open_until": "2026-12-01T09:00:00.000000+00:00",
                "consecutive_failures": 4},
    "created_at": "2026-12-01T08:00:00.000000+00:00",
    "updated_at": "2026-12-01T09:15:00.123456+00:00", "disabled_at": None,
}
PAYLOAD = {"type": "task.result", "id": "de" * 16, "subscription_id": "5b" * 16,
           "subscription": "billing", "namespace": "team-a", "sequence": 42,
           "event_id": "ee" * 16, "task_id": "ab" * 16, "queue": "invoices",
           "task_revision": 5, "state": "SUCCEEDED",
           "committed_at": "2026-12-01T08:00:01.000000+00:00", "attempt": 3,
           "snapshot": {"state": "SUCCEEDED", "result": {"amount": 0.1}}}
SETTLED = {"delivery_id": "de" * 16, "settled": True, "state": "ACKNOWLEDGED",
           "attempts_used": 3, "repeated": False}


async def test_create_sends_the_options_and_reads_the_secret_once(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/subscriptions", drop(),
            ok({**SUB, "secret": "whsec_c2VjcmV0"}, 201))
    sub = await client.create_subscription(
        "billing", "WEBHOOK", endpoint_url="https://billing.example.com/hook",
        filters=SubscriptionFilters(queues=("invoices",), states=("SUCCEEDED",)),
        max_attempts=20)
    assert json.loads(fake.seen[0].body) == {
        "name": "billing", "kind": "WEBHOOK", "endpoint_url": "https://billing.example.com/hook",
        "filters": {"queues": ["invoices"], "states": ["SUCCEEDED"], "handlers": []},
        "max_attempts": 20}
    keys = {s.headers.get("Idempotency-Key") for s in fake.seen}
    assert len(fake.seen) == 2
    assert len(keys) == 1
    assert None not in keys  # a generated key, re-sent on the retry
    assert sub.secret == "whsec_c2VjcmV0"
    assert "secret" not in sub.raw
    assert "whsec_" not in repr(sub)
    assert (sub.circuit_state, sub.consecutive_failures) == ("OPEN", 4)
    assert sub.circuit_open_until is not None
    assert sub.filters.queues == ("invoices",)
    assert (sub.revision, sub.backlog, sub.scan_after_sequence) == (2, 3, 97)


async def test_update_sends_only_what_is_given_and_filters_may_be_cleared(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("PATCH", f"{NS}/subscriptions/billing", ok(SUB))
    await client.update_subscription("billing", revision=2, max_attempts=30)
    await client.update_subscription("billing", revision=2, filters=None)
    await client.update_subscription("billing", revision=2, filters={"queues": ["a"]})
    bodies = [json.loads(s.body) for s in fake.seen]
    assert bodies == [{"revision": 2, "max_attempts": 30}, {"revision": 2, "filters": None},
                      {"revision": 2, "filters": {"queues": ["a"]}}]
    assert all(s.headers.get("Idempotency-Key") for s in fake.seen)
    assert isinstance(UNSET, _Unset)


async def test_state_changes_rotation_and_budget(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    for action in ("pause", "resume", "disable"):
        fake.on("POST", f"{NS}/subscriptions/billing/{action}", ok({**SUB, "state": "PAUSED"}))
    fake.on("POST", f"{NS}/subscriptions/billing/rotate-secret", ok({
        "subscription": {**SUB, "previous_secret_valid_until":
                         "2026-12-02T09:00:00.000000+00:00"},
        "rotation_id": "77" * 16,
        "previous_secret_valid_until": "2026-12-02T09:00:00.000000+00:00",
        "secret": "whsec_bmV3"}))
    fake.on("POST", f"{NS}/subscriptions/billing/deliveries/{'de' * 16}/budget", ok({
        "id": "de" * 16, "state": "PENDING", "attempts_used": 20, "max_attempts": 25,
        "last_error": {"status_code": 503, "body": "down", "duration_ms": 12}}))
    assert (await client.pause_subscription("billing", "maintenance")).state == "PAUSED"
    await client.resume_subscription("billing")
    await client.disable_subscription("billing", idempotency_key="off-1")
    rotation = await client.rotate_subscription_secret("billing", window_s=60)
    budget = await client.add_delivery_budget("billing", "de" * 16, 5, "receiver fixed")
    bodies = [s.body and json.loads(s.body) for s in fake.seen]
    assert bodies == [{"reason": "maintenance"}, b"", b"", {"window_s": 60},
                      {"attempts": 5, "reason": "receiver fixed"}]
    assert fake.seen[2].headers["Idempotency-Key"] == "off-1"
    assert all(s.headers.get("Idempotency-Key") for s in fake.seen)
    assert rotation.secret == "whsec_bmV3"
    assert rotation.previous_secret_valid_until is not None
    assert rotation.subscription.previous_secret_valid_until is not None
    assert (budget.state, budget.max_attempts) == ("PENDING", 25)
    assert budget.last_error == {"status_code": 503, "body": "down", "duration_ms": 12}


async def test_lists_follow_their_cursors(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("GET", f"{NS}/subscriptions",
            ok({"items": [SUB], "next_cursor": "c1"}),
            ok({"items": [{**SUB, "name": "other"}], "next_cursor": None}))
    fake.on("GET", f"{NS}/subscriptions/billing/deliveries",
            ok({"items": [{"id": "01" * 16, "state": "EXHAUSTED"}], "next_cursor": "d1"}),
            ok({"items": [], "next_cursor": "d2"}),
            ok({"items": [{"id": "02" * 16, "state": "EXHAUSTED"}], "next_cursor": None}))
    names = [s.name async for s in client.list_subscriptions(page_size=1)]
    assert names == ["billing", "other"]
    found = [d.id async for d in client.list_deliveries("billing", state="EXHAUSTED")]
    assert found == ["01" * 16, "02" * 16]
    queries = [s.query for s in fake.seen]
    assert queries == [{"limit": "1"}, {"limit": "1", "cursor": "c1"}, {"state": "EXHAUSTED"},
                       {"state": "EXHAUSTED", "cursor": "d1"},
                       {"state": "EXHAUSTED", "cursor": "d2"}]


async def test_delivery_detail_has_its_snapshot_and_attempts(
        api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("GET", f"{NS}/subscriptions/billing/deliveries/{'de' * 16}", ok({
        "id": "de" * 16, "subscription": "billing", "queue": "invoices",
        "result_state": "FAILED", "snapshot": {"error": {"type": "x"}}, "state": "PENDING",
        "attempts": [{"attempt": 1, "outcome": "LAPSED", "status_code": None, "error": "lapsed",
                      "duration_ms": None, "ended_at": "2026-12-01T08:00:00.000000+00:00"}]}))
    detail = await client.get_delivery("billing", "de" * 16)
    assert (detail.queue, detail.result_state) == ("invoices", "FAILED")
    assert detail.snapshot == {"error": {"type": "x"}}
    (attempt,) = detail.attempts
    assert (attempt.attempt, attempt.outcome, attempt.error) == (1, "LAPSED", "lapsed")


async def test_pull_calls(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/subscriptions/billing/lease", ok({"items": [
        {"delivery": PAYLOAD, "lease_token": "tok-1",
         "lease_expires_at": "2026-12-01T08:00:31.000000+00:00"}]}))
    fake.on("POST", f"{NS}/subscriptions/billing/deliveries/{'de' * 16}/ack",
            drop(), ok({**SETTLED, "repeated": True}))
    fake.on("POST", f"{NS}/subscriptions/billing/deliveries/{'de' * 16}/fail", drop())
    fake.on("POST", f"{NS}/subscriptions/billing/settle", ok({"items": [
        SETTLED, {"delivery_id": "df" * 16, "settled": False, "code": "delivery_lease_lost",
                  "detail": "gone"}]}))
    (leased,) = await client.lease_deliveries("billing", max=5, wait_ms=100)
    assert json.loads(fake.seen[0].body) == {"max": 5, "wait_ms": 100}
    assert leased.lease_token == "tok-1"
    assert "tok-1" not in repr(leased)
    d = leased.delivery
    assert (d.id, d.task_id, d.task_revision, d.attempt, d.state) == (
        "de" * 16, "ab" * 16, 5, 3, "SUCCEEDED")
    assert d.committed_at is not None
    assert d.raw["type"] == "task.result"
    # An acknowledgement is idempotent per token: retried after a lost answer.
    settled = await client.ack_delivery("billing", "de" * 16, "tok-1")
    assert (settled.settled, settled.state, settled.repeated) == (True, "ACKNOWLEDGED", True)
    # A failure report is not retried (a repeat would be refused as a lost lease).
    seen = len(fake.seen)
    with pytest.raises(ConnectionFailed):
        await client.fail_delivery("billing", "de" * 16, "tok-1", "boom")
    assert len(fake.seen) == seen + 1
    assert json.loads(fake.seen[-1].body) == {"token": "tok-1", "error": "boom"}
    answers = await client.settle_deliveries("billing", [
        DeliveryReport(delivery_id="de" * 16, token="tok-1"),
        DeliveryReport(delivery_id="df" * 16, token="tok-2", acknowledged=False,
                       error="nope")])
    assert json.loads(fake.seen[-1].body) == {"items": [
        {"delivery_id": "de" * 16, "token": "tok-1", "outcome": "acknowledged"},
        {"delivery_id": "df" * 16, "token": "tok-2", "outcome": "failed", "error": "nope"}]}
    assert [(a.settled, a.code) for a in answers] == [(True, None),
                                                     (False, "delivery_lease_lost")]


async def test_refusals_carry_the_stable_code(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/subscriptions/billing/deliveries/{'de' * 16}/ack",
            problem(409, "delivery_lease_lost", "the lease lapsed"))
    with pytest.raises(Conflict) as caught:
        await client.ack_delivery("billing", "de" * 16, "old")
    assert caught.value.code == "delivery_lease_lost"
    assert len(fake.seen) == 1


def test_exact_numbers_reach_the_delivery() -> None:
    raw = jsonvalue.loads(json.dumps({"delivery": PAYLOAD, "lease_token": "t"}),
                          exact_numbers=True)
    leased = LeasedDelivery.from_json(raw)
    assert leased.delivery.snapshot["result"]["amount"] == Decimal("0.1")


def test_a_failed_handler_reports_its_type_and_message_bounded() -> None:
    assert error_text(ValueError("bad input")) == "ValueError: bad input"
    assert error_text(KeyError()) == "KeyError"
    assert len(error_text(RuntimeError("x" * 5000))) == 1024


async def test_a_missing_webhook_key_is_not_retried(api: tuple[FakeApi, Client]) -> None:
    fake, client = api
    fake.on("POST", f"{NS}/subscriptions",
            problem(503, "webhooks_unavailable", "no [delivery] secret_key"))
    with pytest.raises(ServiceUnavailable) as caught:
        await client.create_subscription("hook", "WEBHOOK", endpoint_url="https://x.example")
    assert caught.value.code == "webhooks_unavailable"
    assert len(fake.seen) == 1  # a configuration gap, not a transient failure

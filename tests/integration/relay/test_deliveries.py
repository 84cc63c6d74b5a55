"""Deliveries (orbit_common/relay/deliveries.py): lease, acknowledge, fail, lapse, budget,
history, detail and retention protection against the real database."""

from __future__ import annotations

from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc
from orbit_common.relay import deliveries, model
from orbit_common.relay.deliveries import AttemptError
from orbit_common.relay.model import DeliveryState
from tests.conftest import Tenant, make_key, make_tenant
from tests.support import relay
from tests.support.lease_fixtures import make_queue


async def _setup(db: Database, tenant: Tenant, count: int = 3, **fields: Any) -> list[bytes]:
    queue = await make_queue(db, tenant, name="q1")
    await relay.subscribe(db, tenant, **fields)
    tasks = await relay.cancelled_results(db, tenant, queue, count)
    await relay.fan_out_all(db, tenant)
    return tasks


async def _who(db: Database, tenant: Tenant) -> Any:
    return await relay.principal_of(db, tenant.api_key)


async def _ack(db: Database, tenant: Tenant, leased: deliveries.Leased,
               token: str | None = None) -> deliveries.Settled:
    return await deliveries.acknowledge_delivery(
        db, await _who(db, tenant), namespace=tenant.namespace, name="sub",
        delivery_id=leased.delivery_id, token=token or leased.token)


async def _fail(db: Database, tenant: Tenant, leased: deliveries.Leased,
                **error: Any) -> deliveries.Settled:
    return await deliveries.fail_delivery(
        db, await _who(db, tenant), namespace=tenant.namespace, name="sub",
        delivery_id=leased.delivery_id, token=leased.token, error=AttemptError(**error))


async def _backlog(db: Database, tenant: Tenant) -> int:
    return int((await relay.subscription_row(db, tenant))["backlog"])


async def test_lease_hands_out_payloads_in_sequence_order(db: Database, tenant: Tenant) -> None:
    tasks = await _setup(db, tenant)
    leased = await relay.lease(db, tenant, limit=2)
    assert [lease.payload["task_id"] for lease in leased] == [t.hex() for t in tasks[:2]]
    first = leased[0]
    body = jsondoc.loads_strict(jsondoc.dumps(first.payload))
    sub = await relay.subscription_row(db, tenant)
    (event,) = await relay.rows(db, "SELECT * FROM orbit_result_events WHERE namespace_id = %s"
                                " AND task_id = %s", tenant.namespace_id, tasks[0])
    assert body == {
        "type": "task.result", "id": first.delivery_id.hex(),
        "subscription_id": sub["id"].hex(), "subscription": "sub",
        "namespace": tenant.namespace, "sequence": event["sequence"],
        "event_id": event["id"].hex(), "task_id": tasks[0].hex(), "queue": "q1",
        "task_revision": event["task_revision"], "state": "CANCELLED",
        "committed_at": model.iso(event["committed_at"]), "attempt": 1,
        "snapshot": jsondoc.loads_strict(event["snapshot"]),
    }
    rows = await relay.delivery_rows(db, tenant)
    assert [r["state"] for r in rows] == ["LEASED", "LEASED", "PENDING"]
    # Only the digest of the token is stored.
    assert rows[0]["lease_token_digest"] == deliveries.token_digest(first.token)
    assert first.token.encode() not in rows[0]["lease_token_digest"]
    # The leased ones are not handed out again; the third one is.
    again = await relay.lease(db, tenant, limit=10)
    assert [lease.payload["task_id"] for lease in again] == [tasks[2].hex()]
    assert await relay.lease(db, tenant) == []


async def test_acknowledge_once_and_idempotently(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 2)
    assert await _backlog(db, tenant) == 2
    first, second = await relay.lease(db, tenant)
    settled = await _ack(db, tenant, first)
    assert settled.state is DeliveryState.ACKNOWLEDGED
    assert not settled.repeated
    assert await _backlog(db, tenant) == 1
    again = await _ack(db, tenant, first)
    assert again.repeated
    assert await _backlog(db, tenant) == 1  # a repeated acknowledgement never decrements twice
    with pytest.raises(model.DeliveryLeaseLost):  # another delivery's token
        await _ack(db, tenant, second, token=first.token)
    with pytest.raises(model.DeliveryLeaseLost):
        await _ack(db, tenant, second, token="forged")
    assert await _backlog(db, tenant) == 1
    (row,) = [r for r in await relay.delivery_rows(db, tenant) if r["id"] == first.delivery_id]
    assert row["acknowledged_at"] is not None
    assert row["lease_expires_at"] is None
    log = await relay.rows(db, "SELECT * FROM orbit_delivery_attempts WHERE namespace_id = %s"
                           " AND delivery_id = %s", tenant.namespace_id, first.delivery_id)
    assert [(a["attempt"], a["outcome"]) for a in log] == [(1, "ACKNOWLEDGED")]


async def test_acknowledging_a_lapsed_lease_is_refused(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    (leased,) = await relay.lease(db, tenant)
    await relay.expire_delivery_leases(db, tenant)
    with pytest.raises(model.DeliveryLeaseLost):
        await _ack(db, tenant, leased)
    with pytest.raises(model.DeliveryLeaseLost):
        await _fail(db, tenant, leased, body="late")
    assert await _backlog(db, tenant) == 1


async def test_fail_backs_off_then_exhausts_and_keeps_the_row(db: Database,
                                                              tenant: Tenant) -> None:
    await _setup(db, tenant, 1, max_attempts=2, backoff_initial_ms=60_000,
                 backoff_max_ms=60_000)
    (leased,) = await relay.lease(db, tenant)
    settled = await _fail(db, tenant, leased, status_code=503, body="x" * 5000, duration_ms=7)
    assert settled.state is DeliveryState.PENDING
    (row,) = await relay.delivery_rows(db, tenant)
    assert row["last_status_code"] == 503
    assert len(row["last_error"]) == model.ERROR_MAX
    assert row["lease_token_digest"] is None
    assert row["attempts_used"] == 1
    assert await relay.lease(db, tenant) == []  # backing off for a minute
    await relay.make_due(db, tenant)
    (second,) = await relay.lease(db, tenant)
    assert second.attempt == 2
    assert second.payload["attempt"] == 2
    settled = await _fail(db, tenant, second, body="still failing")
    assert settled.state is DeliveryState.EXHAUSTED
    assert await _backlog(db, tenant) == 0
    (row,) = await relay.delivery_rows(db, tenant)
    assert row["state"] == "EXHAUSTED"
    assert row["exhausted_at"] is not None
    log = await relay.rows(db, "SELECT attempt, outcome, status_code FROM"
                           " orbit_delivery_attempts WHERE namespace_id = %s ORDER BY attempt",
                           tenant.namespace_id)
    assert [(a["attempt"], a["outcome"], a["status_code"]) for a in log] == [
        (1, "FAILED", 503), (2, "FAILED", None)]


async def test_lapse_recovery_counts_the_attempt(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 2, max_attempts=1)
    await relay.lease(db, tenant)
    await relay.expire_delivery_leases(db, tenant)
    recovered = 0
    for _ in range(20):  # other tests' lapsed leases share the scan
        recovered += await db.transaction("test.lapse",
                                          lambda cur: deliveries.recover_lapsed(cur, 1000))
        if all(r["state"] != "LEASED" for r in await relay.delivery_rows(db, tenant)):
            break
    rows = await relay.delivery_rows(db, tenant)
    assert [r["state"] for r in rows] == ["EXHAUSTED", "EXHAUSTED"]  # a budget of one
    assert await _backlog(db, tenant) == 0
    log = await relay.rows(db, "SELECT outcome FROM orbit_delivery_attempts"
                           " WHERE namespace_id = %s", tenant.namespace_id)
    assert [a["outcome"] for a in log] == ["LAPSED", "LAPSED"]


async def test_lapse_with_budget_left_redelivers(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1, backoff_initial_ms=0)
    (first,) = await relay.lease(db, tenant)
    await relay.expire_delivery_leases(db, tenant)
    await db.transaction("test.lapse", lambda cur: deliveries.recover_lapsed(cur, 1000))
    (second,) = await relay.lease(db, tenant)
    assert second.delivery_id == first.delivery_id
    assert second.attempt == 2
    with pytest.raises(model.DeliveryLeaseLost):
        await _ack(db, tenant, first)  # the old holder is fenced
    assert (await _ack(db, tenant, second)).state is DeliveryState.ACKNOWLEDGED
    assert await _backlog(db, tenant) == 0


async def test_operator_adds_budget_to_an_exhausted_delivery(db: Database,
                                                             tenant: Tenant) -> None:
    await _setup(db, tenant, 1, max_attempts=1)
    (leased,) = await relay.lease(db, tenant)
    await _fail(db, tenant, leased, body="nope")
    who = await _who(db, tenant)
    with pytest.raises(errors.ValidationFailed):
        await deliveries.add_budget(db, who, namespace=tenant.namespace, name="sub",
                                    delivery_id=leased.delivery_id, attempts=0, reason="r")
    with pytest.raises(errors.ValidationFailed):
        await deliveries.add_budget(db, who, namespace=tenant.namespace, name="sub",
                                    delivery_id=leased.delivery_id, attempts=1, reason="")
    answer = await deliveries.add_budget(db, who, namespace=tenant.namespace, name="sub",
                                         delivery_id=leased.delivery_id, attempts=2,
                                         reason="endpoint fixed", idempotency_key="k1")
    assert answer.body["state"] == "PENDING"
    assert answer.body["attempts_used"] == 1
    assert answer.body["max_attempts"] == 3
    assert await _backlog(db, tenant) == 1
    replay = await deliveries.add_budget(db, who, namespace=tenant.namespace, name="sub",
                                         delivery_id=leased.delivery_id, attempts=2,
                                         reason="endpoint fixed", idempotency_key="k1")
    assert replay.body == answer.body
    assert await _backlog(db, tenant) == 1
    with pytest.raises(model.DeliveryNotExhausted):
        await deliveries.add_budget(db, who, namespace=tenant.namespace, name="sub",
                                    delivery_id=leased.delivery_id, attempts=2, reason="again")
    (again,) = await relay.lease(db, tenant)
    assert again.attempt == 2  # the history is not reset
    audit = await relay.rows(db, "SELECT reason, after_doc FROM orbit_audit_events"
                             " WHERE namespace_id = %s AND action = 'delivery.budget_added'",
                             tenant.namespace_id)
    assert [a["reason"] for a in audit] == ["endpoint fixed"]
    log = await relay.rows(db, "SELECT attempt FROM orbit_delivery_attempts"
                           " WHERE namespace_id = %s", tenant.namespace_id)
    assert [a["attempt"] for a in log] == [1]


async def test_history_newest_first_with_a_bound_cursor(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 5)
    who = await _who(db, tenant)
    leased = await relay.lease(db, tenant, limit=2)
    await _ack(db, tenant, leased[0])
    rows = sorted(await relay.delivery_rows(db, tenant),
                  key=lambda r: (r["created_at"], r["id"]), reverse=True)
    seen: list[str] = []
    cursor = None
    while True:
        page = await deliveries.list_deliveries(db, who, namespace=tenant.namespace,
                                                name="sub", limit=2, cursor=cursor)
        seen += [item["id"] for item in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [r["id"].hex() for r in rows]
    pending_rows = [r["id"].hex() for r in rows if r["state"] == "PENDING"]
    assert len(pending_rows) == 3
    pending = await deliveries.list_deliveries(db, who, namespace=tenant.namespace,
                                               name="sub", state="PENDING", limit=2)
    assert [i["id"] for i in pending.items] == pending_rows[:2]
    assert pending.next_cursor is not None
    more = await deliveries.list_deliveries(db, who, namespace=tenant.namespace, name="sub",
                                            state="PENDING", limit=2,
                                            cursor=pending.next_cursor)
    assert [i["id"] for i in more.items] == pending_rows[2:]
    # Leasing and acknowledging do not move a delivery in the history (the key never changes).
    await relay.lease(db, tenant, limit=10)
    after: list[str] = []
    cursor = None
    while True:
        page = await deliveries.list_deliveries(db, who, namespace=tenant.namespace,
                                                name="sub", limit=3, cursor=cursor)
        after += [item["id"] for item in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert after == seen
    with pytest.raises(errors.InvalidCursor):  # bound to the filter
        await deliveries.list_deliveries(db, who, namespace=tenant.namespace, name="sub",
                                         state="LEASED", cursor=pending.next_cursor)
    with pytest.raises(errors.InvalidCursor):
        await deliveries.list_deliveries(db, who, namespace=tenant.namespace, name="sub",
                                         cursor="garbage!")
    with pytest.raises(errors.ValidationFailed):
        await deliveries.list_deliveries(db, who, namespace=tenant.namespace, name="sub",
                                         state="DONE")


async def test_detail_has_the_snapshot_and_attempts_but_no_secret(db: Database,
                                                                  tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    created = await relay.subscribe(db, tenant, kind="WEBHOOK",
                                    endpoint_url="https://hooks.example.com/orbit")
    assert created.secret is not None
    (task,) = await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    sub = await relay.subscription_row(db, tenant)
    leased = await db.transaction("test.lease", lambda cur: deliveries.lease(
        cur, tenant.namespace_id, sub["id"], 5))
    await db.transaction("test.record", lambda cur: deliveries.record_webhook_result(
        cur, tenant.namespace_id, sub["id"], leased[0].delivery_id, token=leased[0].token,
        status_code=500, body="oops", duration_ms=12))
    who = await _who(db, tenant)
    detail = await deliveries.get_delivery(db, who, namespace=tenant.namespace, name="sub",
                                           delivery_id=leased[0].delivery_id)
    text = jsondoc.dumps(detail)
    assert created.secret not in text
    assert leased[0].token not in text
    body = jsondoc.loads_strict(text)
    assert body["snapshot"]["task_id"] == task.hex()
    assert body["snapshot"]["state"] == "CANCELLED"
    assert body["attempts"][0]["outcome"] == "FAILED"
    assert body["attempts"][0]["status_code"] == 500
    assert body["attempts"][0]["duration_ms"] == 12
    assert body["last_error"] == {"status_code": 500, "body": "oops", "duration_ms": 12}


async def test_webhook_2xx_acknowledges(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    sub = await relay.subscription_row(db, tenant)
    (leased,) = await db.transaction("test.lease", lambda cur: deliveries.lease(
        cur, tenant.namespace_id, sub["id"], 5))
    settled = await db.transaction("test.record", lambda cur: deliveries.record_webhook_result(
        cur, tenant.namespace_id, sub["id"], leased.delivery_id, token=leased.token,
        status_code=204, body=None, duration_ms=3))
    assert settled.state is DeliveryState.ACKNOWLEDGED
    log = await relay.rows(db, "SELECT status_code, duration_ms FROM orbit_delivery_attempts"
                           " WHERE namespace_id = %s", tenant.namespace_id)
    assert log == [{"status_code": 204, "duration_ms": 3}]


async def test_pull_consumers_only_lease_pull_subscriptions(db: Database,
                                                            tenant: Tenant) -> None:
    await relay.subscribe(db, tenant, kind="WEBHOOK",
                          endpoint_url="https://hooks.example.com/orbit")
    with pytest.raises(model.NotPullSubscription):
        await relay.lease(db, tenant)


async def test_leasing_a_paused_subscription_is_refused(db: Database, tenant: Tenant) -> None:
    from orbit_common.relay import subscriptions
    from orbit_common.relay.model import SubscriptionState

    await _setup(db, tenant, 1)
    await subscriptions.set_state(db, await _who(db, tenant), namespace=tenant.namespace,
                                  name="sub", target=SubscriptionState.PAUSED)
    with pytest.raises(model.SubscriptionNotActive):
        await relay.lease(db, tenant)


async def test_other_tenants_and_missing_actions(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 1)
    (leased,) = await relay.lease(db, tenant)
    stranger = await make_tenant(db)
    await relay.subscribe(db, stranger)  # a subscription of the same name elsewhere
    who = await _who(db, stranger)
    with pytest.raises(model.DeliveryNotFound):  # another tenant's delivery id and token
        await deliveries.acknowledge_delivery(db, who, namespace=stranger.namespace, name="sub",
                                              delivery_id=leased.delivery_id,
                                              token=leased.token)
    with pytest.raises(model.DeliveryNotFound):
        await deliveries.get_delivery(db, who, namespace=stranger.namespace, name="sub",
                                      delivery_id=leased.delivery_id)
    with pytest.raises(errors.NamespaceNotFound):
        await deliveries.lease_deliveries(db, who, namespace=tenant.namespace, name="sub")
    reader = await relay.principal_of(db, await make_key(db, tenant, [{
        "namespaces": ["*"], "actions": ["subscriptions.read"], "queues": ["*"]}]))
    with pytest.raises(errors.Forbidden):  # no consume action
        await deliveries.lease_deliveries(db, reader, namespace=tenant.namespace, name="sub")
    with pytest.raises(errors.Forbidden):
        await deliveries.acknowledge_delivery(db, reader, namespace=tenant.namespace,
                                              name="sub", delivery_id=leased.delivery_id,
                                              token=leased.token)
    # A cursor of another subscription is refused.
    page = await deliveries.list_deliveries(db, await _who(db, tenant),
                                            namespace=tenant.namespace, name="sub", limit=1)
    await relay.cancelled_results(db, stranger, await make_queue(db, stranger), 2)
    await relay.fan_out_all(db, stranger)
    stranger_page = await deliveries.list_deliveries(db, who, namespace=stranger.namespace,
                                                     name="sub", limit=1)
    assert stranger_page.next_cursor is not None
    with pytest.raises(errors.InvalidCursor):
        await deliveries.list_deliveries(db, await _who(db, tenant),
                                         namespace=tenant.namespace, name="sub",
                                         cursor=stranger_page.next_cursor)
    assert page.items


async def test_retention_protects_unacknowledged_events(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 3, max_attempts=1)
    events = [r["event_id"] for r in await relay.delivery_rows(db, tenant)]
    first, second, _third = await relay.lease(db, tenant, limit=2) + [None]
    assert first is not None
    assert second is not None
    await _ack(db, tenant, first)
    await _fail(db, tenant, second, body="gone")  # budget of one: EXHAUSTED
    protected = await db.read("test.retention", lambda cur: deliveries.unacknowledged_events(
        cur, tenant.namespace_id, events))
    assert protected == {events[2]}  # PENDING; the acknowledged and exhausted ones are not
    await relay.lease(db, tenant)
    protected = await db.read("test.retention", lambda cur: deliveries.unacknowledged_events(
        cur, tenant.namespace_id, events))
    assert protected == {events[2]}  # LEASED is protected too
    other = await make_tenant(db)
    assert await db.read("test.retention", lambda cur: deliveries.unacknowledged_events(
        cur, other.namespace_id, events)) == set()
    assert await db.read("test.retention", lambda cur: deliveries.unacknowledged_events(
        cur, tenant.namespace_id, [])) == set()


async def test_a_batch_of_reports_is_answered_per_report(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 4, max_attempts=1)
    sub = await relay.subscription_row(db, tenant)
    leased = await relay.lease(db, tenant, limit=4)
    await _ack(db, tenant, leased[3])
    stranger = await make_tenant(db)
    await relay.subscribe(db, stranger)
    reports = [
        deliveries.webhook_report(leased[0].delivery_id, leased[0].token, 200, None, 5),
        deliveries.webhook_report(leased[1].delivery_id, leased[1].token, 502, "bad gw", 9),
        deliveries.webhook_report(leased[2].delivery_id, "not-the-token", 200, None, 1),
        deliveries.webhook_report(leased[3].delivery_id, leased[3].token, 204, None, 2),
        deliveries.Report(delivery_id=bytes(16), token="x", acknowledged=True),
    ]
    answers = await db.transaction("test.settle", lambda cur: deliveries.settle(
        cur, tenant.namespace_id, sub["id"], reports))
    assert isinstance(answers[0], deliveries.Settled)
    assert answers[0].state is DeliveryState.ACKNOWLEDGED
    assert isinstance(answers[1], deliveries.Settled)
    assert answers[1].state is DeliveryState.EXHAUSTED  # a budget of one
    assert isinstance(answers[2], model.DeliveryLeaseLost)
    assert isinstance(answers[3], deliveries.Settled)
    assert answers[3].repeated
    assert isinstance(answers[4], model.DeliveryNotFound)
    assert await _backlog(db, tenant) == 1  # only leased[2] is still open
    states = {r["id"]: r["state"] for r in await relay.delivery_rows(db, tenant)}
    assert [states[x.delivery_id] for x in leased] == [
        "ACKNOWLEDGED", "EXHAUSTED", "LEASED", "ACKNOWLEDGED"]
    (row,) = [r for r in await relay.delivery_rows(db, tenant)
              if r["id"] == leased[0].delivery_id]
    assert row["last_duration_ms"] == 5
    with pytest.raises(errors.ValidationFailed):
        await db.transaction("test.settle", lambda cur: deliveries.settle(
            cur, tenant.namespace_id, sub["id"], [reports[2], reports[2]]))
    assert await db.transaction("test.settle", lambda cur: deliveries.settle(
        cur, tenant.namespace_id, sub["id"], [])) == []
    # Another subscription's reports do not reach these deliveries.
    other = await relay.subscription_row(db, stranger)
    (answer,) = await db.transaction("test.settle", lambda cur: deliveries.settle(
        cur, stranger.namespace_id, other["id"], [reports[2]]))
    assert isinstance(answer, model.DeliveryNotFound)
    from tests.support.invariants import check_db

    assert await check_db(db, [tenant.namespace_id]) == []


async def test_released_leases_go_back_uncounted(db: Database, tenant: Tenant) -> None:
    await _setup(db, tenant, 3, max_attempts=1)
    sub = await relay.subscription_row(db, tenant)
    first, second, third = await relay.lease(db, tenant, limit=3)
    await _ack(db, tenant, third)
    answers = await db.transaction("test.release", lambda cur: deliveries.release(
        cur, tenant.namespace_id, sub["id"],
        [(first.delivery_id, first.token), (second.delivery_id, "stale"),
         (third.delivery_id, third.token)], 60_000))
    assert isinstance(answers[0], deliveries.Settled)
    assert answers[0].state is DeliveryState.PENDING
    assert answers[0].attempts_used == 0
    assert isinstance(answers[1], model.DeliveryLeaseLost)
    assert isinstance(answers[2], model.DeliveryLeaseLost)  # acknowledged: nothing to release
    rows = {r["id"]: r for r in await relay.delivery_rows(db, tenant)}
    released = rows[first.delivery_id]
    assert released["state"] == "PENDING"
    assert released["attempts_used"] == 0  # nothing was sent: no attempt spent
    assert released["lease_token_digest"] is None
    assert await relay.lease(db, tenant) == []  # not due for a minute
    assert await _backlog(db, tenant) == 2
    with pytest.raises(model.DeliveryLeaseLost):
        await _ack(db, tenant, first)  # the released token no longer acknowledges
    await relay.make_due(db, tenant)
    (again,) = await relay.lease(db, tenant)
    assert again.delivery_id == first.delivery_id
    assert again.attempt == 1  # the budget of one is still whole
    with pytest.raises(errors.ValidationFailed):
        await db.transaction("test.release", lambda cur: deliveries.release(
            cur, tenant.namespace_id, sub["id"], [(first.delivery_id, "x")], -1))
    from tests.support.invariants import check_db

    assert await check_db(db, [tenant.namespace_id]) == []

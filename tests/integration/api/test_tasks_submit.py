"""POST /v1/namespaces/{namespace}/tasks and …/tasks/batch against the real database.

Byte-exact input, delay and not_before from one database time, priorities, exact business keys,
queue defaults frozen into the task, the accepted event, idempotency (single, batch, concurrent,
conflicting) and authorization.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.pulse.model import RetryPolicy
from orbit_common.pulse.queues import QueueSettings
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.api.conftest import assert_problem
from tests.support import pulse

CONCURRENCY = 8


def tasks_url(tenant: Tenant, suffix: str = "") -> str:
    return f"/v1/namespaces/{tenant.namespace}/tasks{suffix}"


def headers(tenant: Tenant, key: str | None = None, api_key: str | None = None
            ) -> dict[str, str]:
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else tenant.auth
    extra = {"Idempotency-Key": key} if key is not None else {}
    return {**auth, "Content-Type": "application/json", **extra}


async def post(api: TestClient[Any, Any], tenant: Tenant, body: bytes | dict[str, Any], *,
               key: str | None = None, batch: bool = False, api_key: str | None = None
               ) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await api.post(tasks_url(tenant, "/batch" if batch else ""), data=data,
                              headers=headers(tenant, key, api_key))
    return response.status, await response.json()


def row(conn: pymysql.connections.Connection[Any], task_id: str, columns: str = "*"
        ) -> dict[str, Any]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(f"SELECT {columns} FROM pulse_tasks WHERE id = %s",  # columns: test literals
                    (bytes.fromhex(task_id),))
        found = cur.fetchone()
    assert found is not None
    return dict(found)


def count(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return int(cur.fetchone()[0])


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    """A queue named ``work`` in the tenant's namespace, with the test defaults."""
    await pulse.create_queue(db, tenant.namespace_id, "work")
    return "work"


# --- input, byte for byte -----------------------------------------------------------------------

EXACT_INPUT = (
    b'{"big":12345678901234567890.123456789,"e":1e5,"E":1E+5,"neg0":-0,"tiny":0.0000001,'
    b'"trail":1.000,"s":"caf\xc3\xa9 \\u4e2d \\"q\\"","nested":[1.10,{"x":-0.0}],"n":null}'
)


async def test_input_comes_back_byte_exact(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    body = b'{"queue": "work", "handler": "h", "input": ' + EXACT_INPUT + b"}"
    status, receipt = await post(api, tenant, body)
    assert status == 201, receipt
    # Escapes are decoded ("\u4e2d" is stored as the character), everything else is verbatim.
    stored = EXACT_INPUT.decode().replace("\\u4e2d", "中")
    assert row(sync_conn, receipt["id"], "input")["input"] == stored
    response = await api.get(tasks_url(tenant, f"/{receipt['id']}"), headers=tenant.auth)
    assert response.status == 200
    text = await response.text()
    assert '"input":' + stored + ',"result":null' in text
    for token in ("12345678901234567890.123456789", "1e5", "1E+5", "-0", "0.0000001", "1.000",
                  "-0.0", "1.10"):
        assert token in text


@pytest.mark.parametrize("value", ["[]", "null", '"text"', "0", "-1.5E-3", "true"])
async def test_input_may_be_any_json_value(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], value: str,
) -> None:
    status, receipt = await post(
        api, tenant, b'{"queue":"work","handler":"h","input":' + value.encode() + b"}")
    assert status == 201, receipt
    assert row(sync_conn, receipt["id"], "input")["input"] == value


async def test_input_defaults_to_an_empty_object(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    status, receipt = await post(api, tenant, {"queue": "work", "handler": "h"})
    assert status == 201
    assert row(sync_conn, receipt["id"], "input")["input"] == "{}"


# --- the row, the receipt and the event ---------------------------------------------------------


async def test_a_task_starts_waiting_with_the_queue_defaults_frozen_in(
    api: TestClient[Any, Any], tenant: Tenant, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "tuned", QueueSettings(
        offer_lease_ms=1234, execution_lease_ms=5678, retry=RetryPolicy(
            max_attempts=7, initial_ms=10, max_ms=900, multiplier=decimal.Decimal("1.5"),
            jitter=decimal.Decimal("0.125"))))
    status, receipt = await post(api, tenant, {"queue": "tuned", "handler": "mail.send:v2"})
    assert status == 201
    assert set(receipt) == {"id", "queue", "handler", "state", "priority", "business_key",
                            "concurrency_key", "created_at", "available_at", "deadline_at",
                            "start_deadline_at", "rerun_safe", "revision"}
    assert receipt["state"] == "WAITING"
    assert receipt["revision"] == 1
    assert receipt["priority"] == 0
    assert receipt["rerun_safe"] is False
    assert receipt["business_key"] is None
    assert receipt["available_at"] == receipt["created_at"]
    stored = row(sync_conn, receipt["id"])
    assert stored["state"] == "WAITING"
    assert stored["revision"] == 1
    assert stored["handler"] == "mail.send:v2"
    assert (stored["offer_lease_ms"], stored["execution_lease_ms"], stored["max_attempts"],
            stored["retry_initial_ms"], stored["retry_max_ms"]) == (1234, 5678, 7, 10, 900)
    assert stored["retry_multiplier"] == decimal.Decimal("1.5")
    assert stored["retry_jitter"] == decimal.Decimal("0.125")
    assert stored["rerun_safe"] == 0
    assert stored["attempts_used"] == 0
    assert stored["created_at"] == stored["updated_at"]
    with sync_conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SELECT * FROM orbit_events WHERE aggregate_id = %s", (stored["id"],))
        (event,) = cur.fetchall()
    assert event["namespace_id"] == tenant.namespace_id
    assert (event["aggregate_type"], event["aggregate_revision"], event["event_type"],
            event["from_state"], event["to_state"]) == ("task", 1, "task.accepted", None,
                                                        "WAITING")
    assert event["occurred_at"] == stored["created_at"]
    assert json.loads(event["payload"]) == receipt


async def test_overrides_replace_the_queue_defaults(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    status, receipt = await post(api, tenant, {
        "queue": "work", "handler": "h", "rerun_safe": True, "offer_lease_ms": 100,
        "execution_lease_ms": 86_400_000, "attempt_timeout_ms": 5000,
        "retry": {"max_attempts": 1000, "multiplier": 3.25, "jitter": 0},
    })
    assert status == 201, receipt
    assert receipt["rerun_safe"] is True
    stored = row(sync_conn, receipt["id"])
    assert (stored["offer_lease_ms"], stored["execution_lease_ms"],
            stored["attempt_timeout_ms"], stored["max_attempts"]) == (100, 86_400_000, 5000, 1000)
    # Fields not overridden keep the queue's default.
    assert (stored["retry_initial_ms"], stored["retry_max_ms"]) == (1000, 60000)
    assert stored["retry_multiplier"] == decimal.Decimal("3.25")
    assert stored["retry_jitter"] == 0
    assert stored["rerun_safe"] == 1


async def test_a_retry_cap_below_the_queues_initial_backoff_is_refused(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    before = pulse.submit_counts(sync_conn)
    status, problem = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "retry": {"max_ms": 999}})
    assert status == 400
    assert problem["errors"][0]["path"] == "$.retry.max_ms"
    assert pulse.submit_counts(sync_conn) == before


# --- time: one database read, delay and not_before ----------------------------------------------


def micros(value: dt.timedelta) -> int:
    return value // dt.timedelta(microseconds=1)


@pytest.mark.parametrize("delay_ms", [0, 1, 1500, 31 * 24 * 3600 * 1000])
async def test_delay_is_exact_from_one_database_time(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], delay_ms: int,
) -> None:
    status, receipt = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "delay_ms": delay_ms})
    assert status == 201
    created = dt.datetime.fromisoformat(receipt["created_at"])
    available = dt.datetime.fromisoformat(receipt["available_at"])
    assert micros(available - created) == delay_ms * 1000
    stored = row(sync_conn, receipt["id"])
    assert micros(stored["available_at"] - stored["created_at"]) == delay_ms * 1000
    assert stored["dispatch_at"] == stored["available_at"]  # priority 0: no aging


async def test_a_replay_keeps_the_original_times(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    body = {"queue": "work", "handler": "h", "delay_ms": 60_000}
    first = await post(api, tenant, body, key="delay-1")
    stored = row(sync_conn, first[1]["id"])
    # Wait until database time has moved on, so a re-timed replay would show.
    while count(sync_conn, "SELECT UTC_TIMESTAMP(6) > %s", stored["created_at"]) == 0:
        await asyncio.sleep(0.001)
    again = await post(api, tenant, body, key="delay-1")
    assert again == first
    assert row(sync_conn, first[1]["id"]) == stored
    batch = await post(api, tenant, {"tasks": [{**body, "idempotency_key": "delay-1"}]},
                       batch=True)
    assert batch[1]["tasks"] == [{**first[1], "replayed": True}]


async def test_not_before_is_stored_exactly_in_utc(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=123456)
    local = when.astimezone(dt.timezone(dt.timedelta(hours=8))).isoformat()
    status, receipt = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "not_before": local})
    assert status == 201, receipt
    assert dt.datetime.fromisoformat(receipt["available_at"]) == when
    assert receipt["available_at"].endswith("+00:00")
    assert row(sync_conn, receipt["id"])["available_at"] == when.replace(tzinfo=None)


async def test_a_past_not_before_means_now(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
) -> None:
    status, receipt = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "not_before": "2001-02-03T04:05:06Z"})
    assert status == 201
    assert receipt["available_at"] == receipt["created_at"]


async def test_deadlines_are_relative_to_acceptance_and_availability(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
) -> None:
    status, receipt = await post(api, tenant, {
        "queue": "work", "handler": "h", "delay_ms": 1000, "deadline_ms": 10_000,
        "start_deadline_ms": 2000})
    assert status == 201, receipt
    created = dt.datetime.fromisoformat(receipt["created_at"])
    assert dt.datetime.fromisoformat(receipt["deadline_at"]) - created == dt.timedelta(seconds=10)
    assert (dt.datetime.fromisoformat(receipt["start_deadline_at"]) - created
            == dt.timedelta(seconds=3))


# --- priority and business keys -----------------------------------------------------------------


@pytest.mark.parametrize("priority", [0, 9])
async def test_priority_bounds_are_accepted_and_age_the_dispatch_time(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], priority: int,
) -> None:
    status, receipt = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "priority": priority})
    assert status == 201
    assert receipt["priority"] == priority
    stored = row(sync_conn, receipt["id"])
    assert stored["available_at"] - stored["dispatch_at"] == dt.timedelta(seconds=30 * priority)


@pytest.mark.parametrize("priority", [-1, 10, 1000, True, "1", 1.0, None])
async def test_priority_outside_0_to_9_is_refused(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], priority: Any,
) -> None:
    before = pulse.submit_counts(sync_conn)
    status, problem = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "priority": priority})
    assert status == 400
    assert problem["code"] == "validation_failed"
    assert problem["errors"][0]["path"] == "$.priority"
    assert pulse.submit_counts(sync_conn) == before


@pytest.mark.parametrize("key", ["Order-1", "order-1", "order-1 ", "order-1  ", " order-1",
                                 "订单-1", "a" * 512, "\t\n"])
async def test_business_keys_are_stored_as_their_exact_bytes(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], key: str,
) -> None:
    status, receipt = await post(api, tenant, {"queue": "work", "handler": "h",
                                               "business_key": key})
    assert status == 201, receipt
    assert receipt["business_key"] == key
    assert row(sync_conn, receipt["id"], "business_key")["business_key"] == key.encode()


# --- idempotency --------------------------------------------------------------------------------


async def test_the_same_key_and_request_replays_the_original_receipt(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    body = b'{"queue": "work", "handler": "h", "input": {"a": 1.50}, "priority": 3}'
    first = await post(api, tenant, body, key="k-1")
    assert first[0] == 201
    after = pulse.submit_counts(sync_conn)
    # Spelled differently but the same request: key order, whitespace, explicit defaults.
    same = (b'{ "priority": 3, "input": {"a": 1.50}, "handler": "h", "queue": "work",'
            b' "rerun_safe": false, "business_key": null }')
    assert await post(api, tenant, same, key="k-1") == first
    assert pulse.submit_counts(sync_conn) == after
    record = count(sync_conn, "SELECT COUNT(*) FROM orbit_idempotency_keys WHERE namespace_id = %s"
                   " AND operation = 'tasks.submit' AND scope = %s AND idem_key = %s",
                   tenant.namespace_id, b"work", b"k-1")
    assert record == 1


@pytest.mark.parametrize("change", [
    {"priority": 4}, {"input": {"a": 1.5}}, {"input": {"a": "1.50"}}, {"delay_ms": 0},
    {"handler": "other"}, {"business_key": "x"}, {"retry": {"max_attempts": 3}},
])
async def test_the_same_key_with_another_request_is_a_conflict(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any], change: dict[str, Any],
) -> None:
    body = b'{"queue":"work","handler":"h","input":{"a":1.50},"priority":3}'
    key = unique("k")
    first = await post(api, tenant, body, key=key)
    assert first[0] == 201
    before = pulse.submit_counts(sync_conn)
    other = {**json.loads(body, parse_float=decimal.Decimal), **change}
    status, problem = await post(api, tenant, json.dumps(other, default=str).encode(), key=key)
    assert status == 409
    assert problem["code"] == "idempotency_conflict"
    batch = await post(api, tenant, {"tasks": [{"queue": "work", "handler": "fresh"},
                                               {**change, "queue": "work", "handler": "h",
                                                "idempotency_key": key}]}, batch=True)
    assert batch[0] == 409
    assert "$.tasks[1]" in batch[1]["detail"]
    assert pulse.submit_counts(sync_conn) == before
    assert await post(api, tenant, body, key=key) == first


async def test_keys_are_scoped_to_the_queue(
    api: TestClient[Any, Any], tenant: Tenant, db: Database, queue: str,
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "other")
    a = await post(api, tenant, {"queue": "work", "handler": "h"}, key="shared")
    b = await post(api, tenant, {"queue": "other", "handler": "h"}, key="shared")
    assert a[0] == b[0] == 201
    assert a[1]["id"] != b[1]["id"]


async def test_without_a_key_every_submit_is_a_new_task(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
) -> None:
    body = {"queue": "work", "handler": "h"}
    first, second = await post(api, tenant, body), await post(api, tenant, body)
    assert first[1]["id"] != second[1]["id"]


async def test_concurrent_identical_submits_make_one_task(
    big_api: TestClient[Any, Any], big_db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = await make_tenant(big_db)
    await pulse.create_queue(big_db, tenant.namespace_id, "work")
    body = json.dumps({"queue": "work", "handler": "h", "input": {"n": 1}}).encode()
    answers = await asyncio.gather(*[post(big_api, tenant, body, key="same")
                                     for _ in range(CONCURRENCY)])
    assert {status for status, _ in answers} == {201}
    assert len({json.dumps(receipt) for _, receipt in answers}) == 1
    assert count(sync_conn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                 tenant.namespace_id) == 1
    assert count(sync_conn, "SELECT COUNT(*) FROM orbit_events WHERE namespace_id = %s"
                 " AND aggregate_type = 'task'", tenant.namespace_id) == 1


async def test_concurrent_identical_batches_make_each_task_once(
    big_api: TestClient[Any, Any], big_db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = await make_tenant(big_db)
    await pulse.create_queue(big_db, tenant.namespace_id, "work")
    items = [{"queue": "work", "handler": "h", "idempotency_key": f"k-{n}"} for n in range(20)]
    # Each batch sees the keys in another order, and one unkeyed item of its own.
    batches = [{"tasks": [*items[shift:], *items[:shift], {"queue": "work", "handler": "own"}]}
               for shift in range(CONCURRENCY)]
    answers = await asyncio.gather(*[post(big_api, tenant, b, batch=True) for b in batches])
    assert {status for status, _ in answers} == {201}, answers
    ids_by_key: dict[str, set[str]] = {}
    for (_, answer), batch in zip(answers, batches, strict=True):
        for item, sent in zip(answer["tasks"], batch["tasks"], strict=True):
            ids_by_key.setdefault(sent.get("idempotency_key", item["id"]), set()).add(item["id"])
    assert all(len(found) == 1 for found in ids_by_key.values())
    assert count(sync_conn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s",
                 tenant.namespace_id) == 20 + CONCURRENCY
    replayed = sum(item["replayed"] for _, a in answers for item in a["tasks"])
    assert replayed == 20 * (CONCURRENCY - 1)


# --- batches ------------------------------------------------------------------------------------


async def test_a_batch_accepts_every_item_in_one_time(
    api: TestClient[Any, Any], tenant: Tenant, db: Database, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "second")
    items = [{"queue": "work" if n % 2 else "second", "handler": f"h{n}", "priority": n % 10,
              "input": {"n": n}} for n in range(500)]
    before = pulse.submit_counts(sync_conn)
    status, answer = await post(api, tenant, {"tasks": items}, batch=True)
    assert status == 201, answer
    assert len(answer["tasks"]) == 500
    assert [t["handler"] for t in answer["tasks"]] == [f"h{n}" for n in range(500)]
    assert [t["queue"] for t in answer["tasks"]] == [i["queue"] for i in items]
    assert {t["created_at"] for t in answer["tasks"]} == {answer["tasks"][0]["created_at"]}
    assert not any(t["replayed"] for t in answer["tasks"])
    after = pulse.submit_counts(sync_conn)
    assert after["pulse_tasks"] - before["pulse_tasks"] == 500
    assert after["orbit_events"] - before["orbit_events"] == 500


async def test_a_mixed_batch_replays_some_items_and_creates_the_rest(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
) -> None:
    single = await post(api, tenant, {"queue": "work", "handler": "h"}, key="known")
    status, answer = await post(api, tenant, {"tasks": [
        {"queue": "work", "handler": "h", "idempotency_key": "new"},
        {"queue": "work", "handler": "h", "idempotency_key": "known"},
        {"queue": "work", "handler": "h"},
    ]}, batch=True)
    assert status == 201
    assert [t["replayed"] for t in answer["tasks"]] == [False, True, False]
    assert answer["tasks"][1] == {**single[1], "replayed": True}
    again = await post(api, tenant, {"tasks": [
        {"queue": "work", "handler": "h", "idempotency_key": "new"}]}, batch=True)
    assert again[1]["tasks"] == [{**answer["tasks"][0], "replayed": True}]


async def test_batch_errors_point_at_the_item_and_write_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    items: list[dict[str, Any]] = [{"queue": "work", "handler": "h"} for _ in range(6)]
    items[3]["priority"] = 10
    items[5]["retry"] = {"jitter": 1.5}
    before = pulse.submit_counts(sync_conn)
    status, problem = await post(api, tenant, {"tasks": items}, batch=True)
    assert status == 400
    assert problem["code"] == "validation_failed"
    assert [e["path"] for e in problem["errors"]] == ["$.tasks[3].priority",
                                                      "$.tasks[5].retry.jitter"]
    items[3]["priority"] = "9"
    status, problem = await post(api, tenant, {"tasks": items}, batch=True)
    assert status == 400
    assert problem["errors"][0]["path"] == "$.tasks[3].priority"
    assert pulse.submit_counts(sync_conn) == before


async def test_one_unknown_queue_refuses_the_whole_batch(
    api: TestClient[Any, Any], tenant: Tenant, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    before = pulse.submit_counts(sync_conn)
    status, problem = await post(api, tenant, {"tasks": [
        {"queue": "work", "handler": "h", "idempotency_key": "a"},
        {"queue": "missing", "handler": "h"}]}, batch=True)
    assert status == 404
    assert problem["code"] == "queue_not_found"
    assert pulse.submit_counts(sync_conn) == before


async def test_a_batch_is_a_handful_of_statements(
    api: TestClient[Any, Any], tenant: Tenant, queue: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aiomysql.cursors

    executed: list[str] = []
    original = aiomysql.cursors.Cursor.execute

    async def counting(self: Any, query: str, args: Any = None) -> Any:
        text = query if isinstance(query, str) else bytes(query[:32]).decode("ascii", "replace")
        executed.append(text.split(None, 1)[0].upper())
        return await original(self, query, args)

    items = [{"queue": "work", "handler": "h", "idempotency_key": f"s-{n}", "input": {"n": n}}
             for n in range(500)]
    monkeypatch.setattr(aiomysql.cursors.Cursor, "execute", counting)
    status, _ = await post(api, tenant, {"tasks": items}, batch=True)
    monkeypatch.undo()
    assert status == 201
    # Authentication (START, SELECT); the path's authorization before the body is read
    # (START, credential, namespace); then START, credential, namespace, grants, queues,
    # identities, time: one statement each; one multi-row INSERT each for the idempotency
    # records, the tasks and the events; then the queue's counters (an UPDATE) and the
    # application's row, only share-locked (it keeps no counters without a count limit; the
    # namespace's application is read once per process). Nothing per item.
    assert executed.count("INSERT") == 3, executed
    assert executed.count("UPDATE") == 1, executed
    assert len(executed) <= 18, executed


# --- authorization ------------------------------------------------------------------------------


async def test_an_unknown_queue_is_not_found(
    api: TestClient[Any, Any], tenant: Tenant, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    before = pulse.submit_counts(sync_conn)
    status, problem = await post(api, tenant, {"queue": "nowhere", "handler": "h"}, key="x")
    assert status == 404
    assert problem["code"] == "queue_not_found"
    assert pulse.submit_counts(sync_conn) == before


async def test_a_queue_outside_the_grants_is_not_found_and_no_grant_is_forbidden(
    api: TestClient[Any, Any], tenant: Tenant, db: Database, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await pulse.create_queue(db, tenant.namespace_id, "secret")
    limited = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                           "actions": ["tasks.submit"], "queues": ["work"]}])
    reader = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                          "actions": ["tasks.read"]}])
    before = pulse.submit_counts(sync_conn)
    status, problem = await post(api, tenant, {"queue": "secret", "handler": "h"},
                                 api_key=limited)
    assert (status, problem["code"]) == (404, "queue_not_found")
    status, problem = await post(api, tenant, {"tasks": [{"queue": "work", "handler": "h"},
                                                         {"queue": "secret", "handler": "h"}]},
                                 batch=True, api_key=limited)
    assert (status, problem["code"]) == (404, "queue_not_found")
    status, problem = await post(api, tenant, {"queue": "work", "handler": "h"}, api_key=reader)
    assert (status, problem["code"]) == (403, "forbidden")
    assert pulse.submit_counts(sync_conn) == before
    status, _ = await post(api, tenant, {"queue": "work", "handler": "h"}, api_key=limited)
    assert status == 201


async def test_another_tenants_namespace_and_queues_are_invisible(
    api: TestClient[Any, Any], tenant: Tenant, db: Database, queue: str,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    other = await make_tenant(db)
    await pulse.create_queue(db, other.namespace_id, "theirs")
    before = pulse.submit_counts(sync_conn)
    # Their namespace, with our key.
    response = await api.post(tasks_url(other), json={"queue": "theirs", "handler": "h"},
                              headers=tenant.auth)
    await assert_problem(response, 404, "namespace_not_found")
    response = await api.post(tasks_url(other, "/batch"),
                              json={"tasks": [{"queue": "theirs", "handler": "h"}]},
                              headers=tenant.auth)
    await assert_problem(response, 404, "namespace_not_found")
    # Their queue's name, in our namespace.
    status, problem = await post(api, tenant, {"queue": "theirs", "handler": "h"})
    assert (status, problem["code"]) == (404, "queue_not_found")
    assert pulse.submit_counts(sync_conn) == before

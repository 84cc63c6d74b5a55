"""``concurrency_key`` over the API: accepted at submit (1-255 UTF-8 bytes, exact bytes), shown
on task views; attempts show their ``concurrency_token``, and grants to workers carry both.
A bad key is a problem document that writes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.pulse import leases, resources
from orbit_common.pulse.workers import QueueRef
from orbit_dispatcher import protocol
from tests.conftest import Tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_queues_support import rows
from tests.support import pulse
from tests.support.lease_fixtures import open_session

QUEUE = "work"


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> QueueRef:
    queue_id = await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    (row,) = await db.read("test.gate", lambda cur: _gate(cur, tenant, queue_id))
    return QueueRef(id=queue_id, name=QUEUE, gate_id=row["gate_id"])


async def _gate(cur: Any, tenant: Tenant, queue_id: bytes) -> list[dict[str, Any]]:
    await cur.execute("SELECT gate_id FROM pulse_queues WHERE namespace_id = %s AND id = %s",
                      (tenant.namespace_id, queue_id))
    return list(await cur.fetchall())


def tasks_url(tenant: Tenant, suffix: str = "") -> str:
    return f"/v1/namespaces/{tenant.namespace}/tasks{suffix}"


async def submit(api: TestClient[Any, Any], tenant: Tenant, body: dict[str, Any] | bytes,
                 suffix: str = "") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await api.post(tasks_url(tenant, suffix), data=data,
                          headers={**tenant.auth, "Content-Type": "application/json"})


async def test_the_key_is_stored_byte_exact_and_shown_on_every_task_view(
    api: TestClient[Any, Any], tenant: Tenant, queue: QueueRef,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    keys = ["account:42", "Account:42", "account:42 ", "账户:42", "é" * 127]  # 254 bytes
    receipts = []
    for key in keys:
        response = await submit(api, tenant, {"queue": QUEUE, "handler": "h",
                                              "concurrency_key": key})
        assert response.status == 201, await response.text()
        receipts.append(await response.json())
    assert [r["concurrency_key"] for r in receipts] == keys
    for key, receipt in zip(keys, receipts, strict=True):
        (row,) = rows(sync_conn, "SELECT concurrency_key, concurrency_key_digest FROM"
                                 " pulse_tasks WHERE id = %s", bytes.fromhex(receipt["id"]))
        assert row["concurrency_key"] == key.encode()
        assert row["concurrency_key_digest"] == resources.key_digest(key.encode())
        detail = await (await api.get(tasks_url(tenant, f"/{receipt['id']}"),
                                      headers=tenant.auth)).json()
        assert detail["concurrency_key"] == key
    # Exact bytes: case and trailing space make different keys, one row each.
    limits = rows(sync_conn, "SELECT scope_key FROM pulse_concurrency_limits"
                             " WHERE namespace_id = %s", tenant.namespace_id)
    assert sorted(r["scope_key"] for r in limits) == sorted(k.encode() for k in keys)
    listed = await (await api.get(tasks_url(tenant), headers=tenant.auth)).json()
    assert {t["concurrency_key"] for t in listed["items"]} == set(keys)
    plain = await submit(api, tenant, {"queue": QUEUE, "handler": "h"})
    assert (await plain.json())["concurrency_key"] is None


BAD_KEYS: list[tuple[str, Any]] = [
    ("empty", ""),
    ("256-bytes", "k" * 256),
    ("256-utf8-bytes", "é" * 128),
    ("int", 42),
    ("null-is-not-a-key", [None]),
    ("object", {"id": 1}),
]


@pytest.mark.parametrize("value", [v for _, v in BAD_KEYS], ids=[n for n, _ in BAD_KEYS])
async def test_a_bad_key_is_a_problem_document_and_writes_nothing(
    api: TestClient[Any, Any], tenant: Tenant, queue: QueueRef,
    sync_conn: pymysql.connections.Connection[Any], value: Any,
) -> None:
    counts = pulse.submit_counts(sync_conn)
    keys = len(rows(sync_conn, "SELECT id FROM pulse_concurrency_limits"))
    response = await submit(api, tenant, {"queue": QUEUE, "handler": "h",
                                          "concurrency_key": value})
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"][0]["path"] == "$.concurrency_key", problem
    response = await submit(api, tenant, {"tasks": [
        {"queue": QUEUE, "handler": "h", "concurrency_key": "fine"},
        {"queue": QUEUE, "handler": "h", "concurrency_key": value}]}, "/batch")
    problem = await assert_problem(response, 400, "validation_failed")
    assert problem["errors"][0]["path"] == "$.tasks[1].concurrency_key", problem
    assert pulse.submit_counts(sync_conn) == counts
    assert len(rows(sync_conn, "SELECT id FROM pulse_concurrency_limits")) == keys


async def test_attempts_and_grants_carry_the_fencing_token(
    api: TestClient[Any, Any], tenant: Tenant, queue: QueueRef, db: Database,
) -> None:
    keyed = await (await submit(api, tenant, {"queue": QUEUE, "handler": "h",
                                              "concurrency_key": "账户:7"})).json()
    plain = await (await submit(api, tenant, {"queue": QUEUE, "handler": "h"})).json()
    session = await open_session(db, tenant, [queue], handlers=("h",))
    grants = await db.transaction("test.claim",
                                  lambda cur: leases.claim(cur, session, queue, 10))
    by_task = {g.task_id.hex(): g for g in grants}
    assert set(by_task) == {keyed["id"], plain["id"]}
    token = by_task[keyed["id"]].concurrency_token
    assert isinstance(token, int)
    assert token >= 1
    assert by_task[plain["id"]].concurrency_token is None

    wire = json.loads(protocol.grant_json(by_task[keyed["id"]]))
    assert (wire["concurrency_key"], wire["concurrency_token"]) == ("账户:7", token)
    wire = json.loads(protocol.grant_json(by_task[plain["id"]]))
    assert (wire["concurrency_key"], wire["concurrency_token"]) == (None, None)

    for task, expected in ((keyed, token), (plain, None)):
        page = await (await api.get(tasks_url(tenant, f"/{task['id']}/attempts"),
                                    headers=tenant.auth)).json()
        (attempt,) = page["items"]
        assert attempt["concurrency_token"] == expected

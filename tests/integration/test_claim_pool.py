"""The claim pool against the real database: fair turns, shared empty probes, long polls, errors.

Every claim here is the real ``leases.claim`` transaction; the tests only wrap it to record
which application each turn served. The pool's clock (probe cache and long-poll deadlines only)
is a fake where a test needs to step through probe TTLs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import attrs
import prometheus_client
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.db.schema import SchemaChecker
from orbit_common.pulse import leases
from orbit_common.pulse.leases import Grant
from orbit_common.pulse.workers import QueueRef, Session
from orbit_common.service.config import DispatcherConfig
from orbit_common.service.health import ReadinessGate
from orbit_dispatcher.pool import ClaimPool, ProbeCache
from orbit_dispatcher.service import DispatcherService
from tests.conftest import Tenant, api_config, make_tenant
from tests.support.invariants import check_db
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, scalar
from tests.support.servers import ServiceTestServer

SETTLE_TIMEOUT_S = 20


async def add_waiting(db: Database, tenant: Tenant, queue: QueueRef,
                      count: int = 1) -> list[bytes]:
    """Tasks whose offers (never started here) outlive the test run: recovery scans in other
    tests on this database count expired leases, and ours must not show up there."""
    return await add_tasks(db, tenant, queue, count, offer_lease_ms=3_600_000)


class FakeClock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


@attrs.define
class Recorder:
    """The real claim transaction, recording each turn: (application, session, queue, granted)."""

    db: Database
    turns: list[tuple[bytes, bytes, bytes, int]] = attrs.Factory(list)
    in_flight: int = 0
    most_in_flight: int = 0

    async def __call__(self, session: Session, queue: QueueRef, limit: int) -> list[Grant]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            grants = await self.db.transaction(
                "test.claim", lambda cur: leases.claim(cur, session, queue, limit))
        finally:
            self.in_flight -= 1
        self.turns.append((session.application_id, session.id, queue.id, len(grants)))
        return grants


@asynccontextmanager
async def running(pool: ClaimPool) -> AsyncIterator[ClaimPool]:
    pool.start()
    try:
        yield pool
    finally:
        await pool.close()


async def settled(pool: ClaimPool) -> None:
    async with asyncio.timeout(SETTLE_TIMEOUT_S):
        await pool.settled()


def collect(into: list[Grant]) -> Callable[[list[Grant]], Awaitable[None]]:
    async def deliver(grants: list[Grant]) -> None:
        into.extend(grants)

    return deliver


async def no_failure(exc: BaseException) -> None:
    raise AssertionError(f"unexpected claim failure: {exc!r}")


def metric(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_turns_alternate_between_applications_whatever_their_session_count(
    db: Database
) -> None:
    a, b = await make_tenant(db), await make_tenant(db)
    qa, qb = await make_queue(db, a), await make_queue(db, b)
    await add_waiting(db, a, qa, 40)
    await add_waiting(db, b, qb, 10)
    sessions_a = [await open_session(db, a, [qa]) for _ in range(5)]
    session_b = await open_session(db, b, [qb])
    recorder = Recorder(db)
    # A long first TTL: each queue is probed empty once, so the whole turn list is deterministic.
    pool = ClaimPool(recorder, batch=2, concurrency=1,
                     probes=ProbeCache(first_ms=60_000, max_ms=60_000))
    granted: dict[bytes, list[Grant]] = {}
    for session in [*sessions_a, session_b]:
        demand = pool.open_stream(session, deliver=collect(granted.setdefault(session.id, [])),
                                  fail=no_failure)
        pool.set_slots(demand, 1000)
    async with running(pool):
        await settled(pool)

    apps = [t[0] for t in recorder.turns]
    # While both have work: strictly A, B, A, B … (B's five full turns, then its empty probe).
    assert apps[:12] == [a.application_id, b.application_id] * 6
    assert [t[3] for t in recorder.turns if t[0] == b.application_id] == [2, 2, 2, 2, 2, 0]
    # Then A alone, its own sessions in turn, until its queue is empty too.
    assert set(apps[12:]) == {a.application_id}
    a_sessions = [t[1] for t in recorder.turns if t[0] == a.application_id]
    assert a_sessions[:10] == [s.id for s in sessions_a] * 2
    assert recorder.most_in_flight == 1
    assert sum(len(g) for g in granted.values()) == 50
    assert len(granted[session_b.id]) == 10
    assert await check_db(db, [a.namespace_id, b.namespace_id]) == []


async def test_an_empty_queue_is_probed_once_per_ttl_by_many_sessions(db: Database) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    clock = FakeClock()
    recorder = Recorder(db)
    pool = ClaimPool(recorder, batch=8, concurrency=2,
                     probes=ProbeCache(first_ms=20, max_ms=40, clock=clock, jitter=lambda: 1.0))
    for _ in range(20):
        session = await open_session(db, tenant, [queue])
        pool.set_slots(pool.open_stream(session, deliver=collect([]), fail=no_failure), 8)
    empty_before = metric("orbit_dispatch_claim_turns_total", outcome="empty")
    skips_before = metric("orbit_dispatch_empty_probe_skips_total")
    async with running(pool):
        await settled(pool)
        assert len(recorder.turns) == 1  # 20 hungry sessions, one transaction
        clock.advance_ms(15)
        await settled(pool)
        assert len(recorder.turns) == 1  # inside the first TTL (20 ms)
        clock.advance_ms(10)
        await settled(pool)
        assert len(recorder.turns) == 2  # expired: one probe, now for 40 ms
        clock.advance_ms(35)
        await settled(pool)
        assert len(recorder.turns) == 2
        clock.advance_ms(10)
        await settled(pool)
        assert len(recorder.turns) == 3  # capped at 40 ms

        # Work arrives: the next probe finds it, and the streak starts over.
        await add_waiting(db, tenant, queue, 3)
        clock.advance_ms(45)
        await settled(pool)
    assert [t[3] for t in recorder.turns[:3]] == [0, 0, 0]
    assert sum(t[3] for t in recorder.turns) == 3
    assert pool.probes.ttl_ms((tenant.namespace_id, queue.id, frozenset({"noop"}), True)) == 20
    assert metric("orbit_dispatch_claim_turns_total", outcome="empty") - empty_before == \
        sum(1 for t in recorder.turns if t[3] == 0)
    assert metric("orbit_dispatch_empty_probe_skips_total") > skips_before


async def test_claim_concurrency_bounds_the_transactions_in_flight(db: Database) -> None:
    tenants = [await make_tenant(db) for _ in range(3)]
    recorder = Recorder(db)
    pool = ClaimPool(recorder, batch=1, concurrency=2,
                     probes=ProbeCache(first_ms=60_000, max_ms=60_000))
    for tenant in tenants:
        queue = await make_queue(db, tenant)
        await add_waiting(db, tenant, queue, 12)
        for _ in range(4):
            session = await open_session(db, tenant, [queue])
            pool.set_slots(pool.open_stream(session, deliver=collect([]), fail=no_failure), 50)
    async with running(pool):
        await settled(pool)
    assert recorder.most_in_flight == 2
    assert sum(t[3] for t in recorder.turns) == 36
    for tenant in tenants:  # every application's 12 tasks, none claimed twice
        assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempts WHERE namespace_id = %s",
                            tenant.namespace_id) == 12


async def test_long_polls_share_the_probe_and_get_one_pass_before_the_deadline(
    db: Database
) -> None:
    tenant = await make_tenant(db)
    q1, q2 = await make_queue(db, tenant), await make_queue(db, tenant)
    clock = FakeClock()
    recorder = Recorder(db)
    pool = ClaimPool(recorder, batch=8, concurrency=1,
                     probes=ProbeCache(first_ms=20, max_ms=500, clock=clock, jitter=lambda: 1.0))
    sessions = [await open_session(db, tenant, [q1, q2]) for _ in range(10)]
    async with running(pool):
        # wait_ms = 0 on empty queues: each poll answers after a pass over both queues; the ten
        # polls share two probe transactions.
        answers = await asyncio.gather(*(pool.poll(s, 4, 0) for s in sessions))
        assert answers == [[]] * 10
        assert sorted(t[2] for t in recorder.turns) == sorted([q1.id, q2.id])

        # A long wait is answered by the first grants, from whichever queue has them.
        waiting = asyncio.ensure_future(pool.poll(sessions[0], 4, 3600))
        await settled(pool)
        assert not waiting.done()
        (task_id,) = await add_waiting(db, tenant, q2)
        clock.advance_ms(25)
        pool.wake()
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            grants = await waiting
        assert [g.task_id for g in grants] == [task_id]
        assert len(pool.order) == 0


async def test_draining_answers_waiting_long_polls_with_nothing(db: Database) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    session = await open_session(db, tenant, [queue])
    pool = ClaimPool(Recorder(db), batch=8, concurrency=1,
                     probes=ProbeCache(first_ms=20, max_ms=500))
    async with running(pool):
        waiting = asyncio.ensure_future(pool.poll(session, 4, 3600))
        await settled(pool)
        pool.stop_claiming()
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            assert await waiting == []
        assert await pool.poll(session, 4, 3600) == []  # no new waits while draining


async def test_no_turns_while_the_readiness_gate_is_closed(db: Database) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    await add_waiting(db, tenant, queue, 2)
    session = await open_session(db, tenant, [queue])
    gate_open = False
    recorder = Recorder(db)
    pool = ClaimPool(recorder, batch=8, concurrency=1, ready=lambda: gate_open,
                     probes=ProbeCache(first_ms=20, max_ms=500))
    got: list[Grant] = []
    async with running(pool):
        assert await pool.poll(session, 4, 0) == []  # the deadline still answers a long poll
        pool.set_slots(pool.open_stream(session, deliver=collect(got), fail=no_failure), 8)
        assert recorder.turns == []
        gate_open = True
        pool.wake()
        await settled(pool)
    assert len(got) == 2


async def test_a_lost_session_fails_its_demand_and_others_keep_claiming(db: Database) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    await add_waiting(db, tenant, queue, 4)
    fenced = await open_session(db, tenant, [queue], instance_key="same-instance")
    await open_session(db, tenant, [queue], instance_key="same-instance")  # fences the first
    healthy = await open_session(db, tenant, [queue])
    pool = ClaimPool(Recorder(db), batch=8, concurrency=1,
                     probes=ProbeCache(first_ms=60_000, max_ms=60_000))
    failures: list[BaseException] = []

    async def fail(exc: BaseException) -> None:
        failures.append(exc)

    lost = pool.open_stream(fenced, deliver=collect([]), fail=fail)
    pool.set_slots(lost, 8)
    got: list[Grant] = []
    pool.set_slots(pool.open_stream(healthy, deliver=collect(got), fail=no_failure), 8)
    async with running(pool):
        await settled(pool)
        assert [type(e).__name__ for e in failures] == ["SessionLost"]
        assert lost not in pool.order
        assert len(got) == 4


# --- through the dispatcher's HTTP and WebSocket endpoints -------------------------------------


Served = tuple[DispatcherService, TestClient[Any, Any]]


@asynccontextmanager
async def dispatcher(db: Database, db_url: DatabaseUrl, **settings: Any) -> AsyncIterator[Served]:
    gate = ReadinessGate(SchemaChecker(db))
    await gate.refresh()
    config = attrs.evolve(api_config(db_url), dispatcher=DispatcherConfig(**settings))
    service = DispatcherService(config, db, gate)
    client = TestClient(ServiceTestServer(service.app))
    await client.start_server()
    try:
        yield service, client
    finally:
        service.draining = True
        await client.close()


def base(tenant: Tenant) -> str:
    return f"/v1/namespaces/{tenant.namespace}/worker/sessions"


async def register(client: TestClient[Any, Any], tenant: Tenant, queue: str,
                   instance_key: str) -> str:
    response = await client.post(base(tenant), headers=tenant.auth, json={
        "instance_key": instance_key, "queues": [queue], "handlers": ["noop"],
        "max_in_flight": 8})
    assert response.status == 201, await response.text()
    return str((await response.json())["session_id"])


async def test_a_fenced_websocket_session_gets_session_lost_from_its_claim(
    db: Database, db_url: DatabaseUrl
) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    async with dispatcher(db, db_url) as (_service, client):
        old = await register(client, tenant, queue.name, "w-fenced")
        async with client.ws_connect(f"{base(tenant)}/{old}/ws", headers=tenant.auth) as ws:
            await register(client, tenant, queue.name, "w-fenced")  # a newer session fences it
            await ws.send_json({"type": "ready", "slots": 4})
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                message = await ws.receive()
                assert message.type == aiohttp.WSMsgType.TEXT, message
                frame = json.loads(message.data)
                assert (frame["type"], frame["code"]) == ("error", "session_lost")
                closing = await ws.receive()
            assert closing.type in {aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                    aiohttp.WSMsgType.CLOSING}


async def test_websocket_credit_drives_the_pool_and_draining_stops_it(
    db: Database, db_url: DatabaseUrl
) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    await add_waiting(db, tenant, queue, 5)
    async with dispatcher(db, db_url, claim_batch=2, claim_concurrency=1) as (service, client):
        session_id = await register(client, tenant, queue.name, "w-credit")
        async with client.ws_connect(f"{base(tenant)}/{session_id}/ws",
                                     headers=tenant.auth) as ws:
            await ws.send_json({"type": "ready", "slots": 3})
            seen = 0
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                while seen < 3:
                    frame = json.loads((await ws.receive()).data)
                    assert frame["type"] == "grants"
                    seen += len(frame["grants"])
            assert seen == 3  # two turns (2 + 1): the credit, not the batch, bounds them
            (conn,) = service.connections
            await service.pool.settled()
            assert conn.slots == 0
            service.draining = True  # the pool stops: more credit claims nothing
            await ws.send_json({"type": "ready", "slots": 3})
    assert await scalar(db, "SELECT COUNT(*) AS n FROM pulse_attempts WHERE namespace_id = %s",
                        tenant.namespace_id) == 3



def _counter(name: str, found: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, {"found": found}) or 0.0


async def test_a_queue_found_empty_is_read_without_locks_before_the_next_claim(
    db: Database, db_url: DatabaseUrl
) -> None:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    session = await open_session(db, tenant, [queue])
    key = (session.namespace_id, queue.id, frozenset(session.handlers), session.concurrency_keys)
    async with dispatcher(db, db_url) as (service, _client):
        claims, probes = (lambda f: _counter("orbit_dispatch_claims_total", f),
                          lambda f: _counter("orbit_dispatch_due_probes_total", f))
        before = (claims("no"), claims("yes"), probes("no"), probes("yes"))
        # The first claim of a key is a claim transaction (it also checks the session).
        assert await service._claim_turn(session, queue, 8) == []
        service.pool.probes.record(key, found=False)  # what the pool does with an empty turn
        # While the queue stays empty, the next turns are one lock-free read each.
        assert await service._claim_turn(session, queue, 8) == []
        assert await service._claim_turn(session, queue, 8) == []
        assert (claims("no"), probes("no")) == (before[0] + 1, before[2] + 2)
        # A task due now: the read finds it and the claim grants it.
        (task_id,) = await add_waiting(db, tenant, queue)
        grants = await service._claim_turn(session, queue, 8)
        assert [g.task_id for g in grants] == [task_id]
        assert (claims("yes"), probes("yes")) == (before[1] + 1, before[3] + 1)
        # A key whose last claim granted something is claimed at once, without the read.
        service.pool.probes.record(key, found=True)
        assert await service._claim_turn(session, queue, 8) == []
        assert (claims("no"), probes("no"), probes("yes")) == (
            before[0] + 2, before[2] + 2, before[3] + 1)

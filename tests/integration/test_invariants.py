"""The invariant checker (tests/support/invariants.py): green on real traffic, red on every
corruption.

(a) Real traffic through the lease functions and the interventions — concurrent claims from
    several sessions, starts, renewals, finishes of every outcome, duplicated and stale reports,
    lapsed offers and lapsed execution leases (moved into the past in SQL), recovery, deadlines,
    cancels, reviews and manual retries — with the checker running concurrently in its own
    snapshot, and at quiescence.
(b) For each invariant, a scratch tenant in a scratch database (so no other test's check ever
    sees the damage) is built clean through the real functions, corrupted with SQL, and the
    checker must name that invariant; a clean tenant next to it stays clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import attrs
import pymysql
import pytest

from orbit_common.db.batch import placeholders
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.model import ids
from orbit_common.platform import credentials
from orbit_common.pulse import interventions, leases
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant, make_tenant
from tests.support import database, held
from tests.support.invariants import check, check_db, codes
from tests.support.lease_fixtures import (
    add_tasks,
    make_queue,
    open_session,
    set_application_limits,
    task_row,
)

# --- helpers ---------------------------------------------------------------------------------


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


async def claim(db: Database, session: Session, queue: QueueRef, n: int) -> list[Grant]:
    return await db.transaction("test.claim", lambda cur: leases.claim(cur, session, queue, n))


async def start(db: Database, tenant: Tenant, grants: Sequence[Grant]) -> list[Any]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.start",
                                lambda cur: held.start(cur, tenant.namespace_id, refs))


async def renew(db: Database, tenant: Tenant, grants: Sequence[Grant]) -> list[Any]:
    refs = [ref(g) for g in grants]
    return await db.transaction("test.renew",
                                lambda cur: held.renew(cur, tenant.namespace_id, refs))


async def finish(db: Database, tenant: Tenant, reports: Sequence[FinishReport]) -> list[Any]:
    return await db.transaction("test.finish",
                                lambda cur: held.finish(cur, tenant.namespace_id, reports))


async def recover(db: Database) -> int:
    return await db.transaction("test.recover", lambda cur: leases.recover_expired(cur, 1000))


async def expire_waiting(db: Database) -> int:
    return await db.transaction("test.deadlines", lambda cur: leases.expire_waiting(cur, 1000))


def report(grant: Grant, outcome: str, report_id: bytes = b"r1", **kw: Any) -> FinishReport:
    if outcome == "succeeded":
        kw.setdefault("result", '{"ok": true}')
    elif outcome != "failed" or "error" not in kw:
        kw.setdefault("error", {"type": outcome})
    return FinishReport(ref=ref(grant), report_id=report_id, outcome=outcome, **kw)


async def expire_leases(db: Database, tenant: Tenant, task_ids: Sequence[bytes]) -> None:
    """Move the live leases of ``task_ids`` into the past (as if their holders went silent)."""
    if not task_ids:
        return
    marks = placeholders(len(task_ids))

    async def body(cur: Any) -> None:
        # One instant for both rows: a task's lease and its attempt's always agree.
        await cur.execute("SELECT UTC_TIMESTAMP(6) - INTERVAL 1 SECOND AS past")
        past = (await cur.fetchone())["past"]
        await cur.execute(
            "UPDATE pulse_tasks SET lease_expires_at = %s"
            f" WHERE namespace_id = %s AND state IN ('LEASED', 'RUNNING') AND id IN ({marks})",
            (past, tenant.namespace_id, *task_ids))
        await cur.execute(
            "UPDATE pulse_attempts SET lease_expires_at = %s"
            f" WHERE namespace_id = %s AND state IN ('OFFERED', 'RUNNING')"
            f" AND task_id IN ({marks})", (past, tenant.namespace_id, *task_ids))

    await db.transaction("test.expire", body)


async def principal(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async def body(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(sql, params)
        return [dict(r) for r in await cur.fetchall()]

    return await db.read("test.rows", body)


async def tasks_in(db: Database, tenant: Tenant, state: str) -> list[bytes]:
    found = await rows(db, "SELECT id FROM pulse_tasks WHERE namespace_id = %s AND state = %s"
                           " ORDER BY id", tenant.namespace_id, state)
    return [r["id"] for r in found]


# --- (a) real traffic ------------------------------------------------------------------------


async def _cancel(db: Database, tenant: Tenant, who: credentials.Principal,
                  task_id: bytes) -> None:
    with contextlib.suppress(interventions.CancelNeedsReview):
        await interventions.cancel_task(db, who, namespace=tenant.namespace, task_id=task_id,
                                        reason="traffic")


@attrs.define
class Traffic:
    """One tenant's workload; ``run_round`` exercises every path once more."""

    db: Database
    tenant: Tenant
    who: credentials.Principal
    queues: list[QueueRef]
    sessions: list[Session]
    sync: pymysql.connections.Connection[Any]
    finished: list[Grant] = attrs.Factory(list)   # grants whose attempt ended: stale holders
    sent: list[FinishReport] = attrs.Factory(list)  # reports to re-send verbatim
    checks: int = 0

    def check_now(self) -> list[str]:
        self.checks += 1
        return check(self.sync, [self.tenant.namespace_id])

    async def run_round(self, number: int) -> None:
        db, tenant = self.db, self.tenant
        batches = await asyncio.gather(*(claim(db, s, q, 6)
                                         for s in self.sessions for q in self.queues))
        grants = [g for batch in batches for g in batch]
        assert len({g.task_id for g in grants}) == len(grants), "a task was granted twice"
        lapsed_offers = grants[::7]
        to_start = [g for g in grants if g not in lapsed_offers]
        await expire_leases(db, tenant, [g.task_id for g in lapsed_offers])
        refused = await start(db, tenant, lapsed_offers)
        assert all(not o.approved and o.reason == "offer_expired" for o in refused)
        half = len(to_start) // 2
        started = await asyncio.gather(start(db, tenant, to_start[:half]),
                                       start(db, tenant, to_start[half:]))
        assert all(o.approved for batch in started for o in batch)
        # Repeated starts are approved again and change nothing.
        assert all(o.approved for o in await start(db, tenant, to_start[:3]))

        lost = to_start[1::6]
        cancelled = to_start[2::6]
        running = [g for g in to_start if g not in lost]
        await expire_leases(db, tenant, [g.task_id for g in lost])
        for grant in cancelled:
            await _cancel(db, tenant, self.who, grant.task_id)
        renewed = await renew(db, tenant, running)
        assert all(o.renewed for o in renewed)
        assert all(not o.renewed for o in await renew(db, tenant, lost))

        reports = []
        for i, grant in enumerate(running):
            if grant in cancelled:
                outcome = "cancelled" if i % 3 else "succeeded"  # a success that commits first
                reports.append(report(grant, outcome))
                continue
            kind = (i + number) % 5
            reports.append(
                report(grant, "succeeded") if kind == 0 else
                report(grant, "failed", retryable=True, error={"type": "Flaky"}) if kind == 1 else
                report(grant, "failed", retryable=False, error={"type": "Bad"}) if kind == 2 else
                report(grant, "unknown") if kind == 3 else
                report(grant, "succeeded", result=f'{{"n": {i}}}'))
        stale = [report(g, "succeeded", b"late-%d" % number) for g in self.finished[-5:]]
        replays = self.sent[-4:]
        # Two concurrent finish batches, a third with stale and re-sent reports, while the
        # checker reads its own snapshot in a thread: every committed state must be consistent.
        third = len(reports) // 3
        outcomes, snapshot_check = await asyncio.gather(
            asyncio.gather(finish(db, tenant, reports[:third]),
                           finish(db, tenant, reports[third:]),
                           finish(db, tenant, stale + replays)),
            asyncio.to_thread(self.check_now),
        )
        assert snapshot_check == []
        late = outcomes[2][:len(stale)]
        assert all(not o.accepted and o.reason == "attempt_finished" for o in late)
        assert all(o.replayed for o in outcomes[2][len(stale):])
        # A duplicate of one report in the next batch returns the original receipt.
        if reports:
            (again,) = await finish(db, tenant, reports[:1])
            assert again.replayed
        self.sent += reports
        self.finished += running + lapsed_offers + lost

        assert await recover(db) >= len(lapsed_offers) + len(lost)

        waiting = await rows(db, "SELECT id FROM pulse_tasks WHERE namespace_id = %s"
                                 " AND state = 'WAITING' AND handler = 'noop' ORDER BY id LIMIT 2",
                             tenant.namespace_id)
        for task_id in [r["id"] for r in waiting]:
            await _cancel(db, tenant, self.who, task_id)
        leased = await claim(db, self.sessions[0], self.queues[0], 2)
        for grant in leased:
            await _cancel(db, tenant, self.who, grant.task_id)  # withdraws the offer
        assert all(not o.approved for o in await start(db, tenant, leased))
        self.finished += leased

        for i, task_id in enumerate((await tasks_in(db, tenant, "NEEDS_REVIEW"))[:4]):
            await interventions.review_task(
                db, self.who, namespace=tenant.namespace, task_id=task_id,
                decision="succeeded" if i % 2 else "failed", reason="checked",
                evidence_ref=f"TICKET-{number}-{i}", execution_ended=True,
                revision=(await task_row(db, tenant, task_id))["revision"])
        for state in ("FAILED", "CANCELLED"):
            for task_id in (await tasks_in(db, tenant, state))[:2]:
                with contextlib.suppress(interventions.AlreadyRetried):
                    await interventions.retry_task(db, self.who, namespace=tenant.namespace,
                                                   task_id=task_id, reason="again",
                                                   rerun_confirmed=True)
        assert self.check_now() == []


async def test_real_traffic_keeps_every_invariant(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    plain = await make_queue(db, tenant, max_attempts=3)
    capped = await make_queue(db, tenant, max_concurrent=5, max_attempts=2)
    await add_tasks(db, tenant, plain, 30, rerun_safe=True, max_attempts=3)
    await add_tasks(db, tenant, plain, 30, rerun_safe=False, max_attempts=2)
    await add_tasks(db, tenant, capped, 20, rerun_safe=True, max_attempts=1)
    for key in (b"acct-1", b"acct-2", b"acct-3"):  # keyed permits under the same traffic
        await add_tasks(db, tenant, plain, 6, rerun_safe=True, max_attempts=3,
                        concurrency_key=key)
    late = await add_tasks(db, tenant, plain, 4, handler="never", deadline_s=600)
    sessions = [await open_session(db, tenant, [plain, capped]) for _ in range(3)]
    traffic = Traffic(db=db, tenant=tenant, who=await principal(db, tenant),
                      queues=[plain, capped], sessions=sessions, sync=sync_conn)
    assert traffic.check_now() == []
    for number in range(5):
        await traffic.run_round(number)

    # Deadlines pass (moved in SQL) for tasks nobody can run; one carries an uncertain effect.
    async def past_deadline(cur: Any) -> None:
        await cur.execute(
            "UPDATE pulse_tasks SET deadline_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND,"
            " effect_uncertain = (id = %s) WHERE namespace_id = %s AND id IN (%s, %s, %s)",
            (late[0], tenant.namespace_id, *late[:3]))

    await db.transaction("test.deadline", past_deadline)
    assert await expire_waiting(db) >= 3

    # Quiesce: finish whatever runs, let the rest lapse and recover.
    live = await rows(db, "SELECT id FROM pulse_tasks WHERE namespace_id = %s"
                          " AND state IN ('LEASED', 'RUNNING')", tenant.namespace_id)
    await expire_leases(db, tenant, [r["id"] for r in live])
    await recover(db)
    assert traffic.check_now() == []
    assert check(sync_conn, [tenant.namespace_id], quiescent=True,
                 grace=dt.timedelta(0)) == []
    assert await check_db(db, [tenant.namespace_id], quiescent=True) == []

    # The traffic really covered every path the invariants speak about.
    task_states = {r["state"] for r in await rows(
        db, "SELECT DISTINCT state FROM pulse_tasks WHERE namespace_id = %s",
        tenant.namespace_id)}
    assert {"WAITING", "SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW"} <= task_states
    attempt_states = {r["state"] for r in await rows(
        db, "SELECT DISTINCT state FROM pulse_attempts WHERE namespace_id = %s",
        tenant.namespace_id)}
    assert {"SUCCEEDED", "FAILED", "UNKNOWN", "CANCELLED", "OFFER_EXPIRED", "LEASE_EXPIRED",
            "WITHDRAWN"} <= attempt_states
    event_types = {r["event_type"] for r in await rows(
        db, "SELECT DISTINCT event_type FROM orbit_events WHERE namespace_id = %s",
        tenant.namespace_id)}
    assert {f"task.{t}" for t in (
        "accepted", "leased", "started", "succeeded", "retry_scheduled", "non_retryable",
        "outcome_unknown", "cancel_requested", "cancelled", "offer_expired", "lease_lost",
        "lease_lost_retry", "reviewed_succeeded", "reviewed_failed", "deadline_exceeded",
        "deadline_exceeded_with_uncertain_effect")} <= event_types
    permits = await rows(db, "SELECT COUNT(*) AS n, COUNT(DISTINCT release_reason) AS reasons"
                             " FROM pulse_permits WHERE namespace_id = %s", tenant.namespace_id)
    assert permits[0]["n"] >= 6
    assert permits[0]["reasons"] >= 3
    successors = await rows(db, "SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
                                " AND retry_of IS NOT NULL", tenant.namespace_id)
    assert successors[0]["n"] > 0
    evidence = await rows(db, "SELECT COUNT(*) AS n FROM pulse_attempt_evidence"
                              " WHERE namespace_id = %s", tenant.namespace_id)
    assert evidence[0]["n"] > 0
    assert traffic.checks >= 12


# --- (b) every invariant catches its corruption ----------------------------------------------


@pytest.fixture(scope="module")
def scratch_url(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A migrated database of its own: corrupted rows never reach another test's check."""
    name = database.scratch_name("orbit_invariants")
    yield database.create_database(server_url, name)
    database.drop_database(server_url, name)


@pytest.fixture
async def scratch_db(scratch_url: DatabaseUrl) -> AsyncIterator[Database]:
    db = await open_database(scratch_url, minsize=1, maxsize=4)
    try:
        yield db
    finally:
        await db.close()


@pytest.fixture
def scratch_conn(scratch_url: DatabaseUrl) -> Iterator[pymysql.connections.Connection[Any]]:
    conn = connect_sync(scratch_url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


@attrs.frozen(kw_only=True)
class Scenario:
    """A clean tenant with one task in every state, built through the real functions."""

    tenant: Tenant
    queue: QueueRef
    task: dict[str, bytes]  # state name (and "successor") → task id
    grant: dict[str, Grant]  # state name → its (last) grant


async def build_scenario(db: Database) -> Scenario:
    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    session = await open_session(db, tenant, [queue])
    who = await principal(db, tenant)
    task: dict[str, bytes] = {}
    grant: dict[str, Grant] = {}
    for name, outcome in (("SUCCEEDED", "succeeded"), ("FAILED", "failed"),
                          ("NEEDS_REVIEW", "unknown"), ("RUNNING", None), ("LEASED", None)):
        (task[name],) = await add_tasks(db, tenant, queue)
        (grant[name],) = await claim(db, session, queue, 1)
        assert grant[name].task_id == task[name]
        if name != "LEASED":
            await start(db, tenant, [grant[name]])
        if outcome is not None:
            (done,) = await finish(db, tenant, [report(grant[name], outcome)])
            assert done.task_state == name
    (task["WAITING"], task["CANCELLED"]) = await add_tasks(db, tenant, queue, 2)
    await interventions.cancel_task(db, who, namespace=tenant.namespace,
                                    task_id=task["CANCELLED"], reason="scenario")
    retried = await interventions.retry_task(db, who, namespace=tenant.namespace,
                                             task_id=task["FAILED"], reason="scenario",
                                             rerun_confirmed=True)
    task["successor"] = bytes.fromhex(retried.body["id"])
    return Scenario(tenant=tenant, queue=queue, task=task, grant=grant)


def sql(conn: pymysql.connections.Connection[Any], statement: str, *params: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall()


@contextlib.contextmanager
def unchecked(conn: pymysql.connections.Connection[Any], table: str,
              constraint: str) -> Iterator[None]:
    """Let a corruption past a CHECK constraint (MariaDB: per session; MySQL: the scratch
    database's table stops enforcing it)."""
    ((version,),) = sql(conn, "SELECT VERSION()")
    if "mariadb" in version.lower():
        sql(conn, "SET SESSION check_constraint_checks = 0")
        try:
            yield
        finally:
            sql(conn, "SET SESSION check_constraint_checks = 1")
    else:
        sql(conn, f"ALTER TABLE {table} ALTER CHECK {constraint} NOT ENFORCED")
        yield


def _attempt(conn: Any, sc: Scenario, name: str) -> bytes:
    return sc.grant[name].attempt_id


def _insert_attempt(conn: Any, sc: Scenario, task_id: bytes, generation: int, state: str,
                    *, finished: bool) -> bytes:
    attempt_id = ids.new_id()
    sql(conn,
        "INSERT INTO pulse_attempts (namespace_id, id, task_id, queue_id, generation,"
        " token_digest, worker_instance_id, worker_session_id, state, offered_at, started_at,"
        " lease_expires_at, finished_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
        " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR,"
        " IF(%s, UTC_TIMESTAMP(6), NULL))",
        sc.tenant.namespace_id, attempt_id, task_id, sc.queue.id, generation,
        secrets.token_bytes(32), ids.new_id(), ids.new_id(), state, finished)
    return attempt_id


def _insert_event(conn: Any, sc: Scenario, task_id: bytes, revision: int, event_type: str,
                  from_state: str | None, to_state: str | None, *,
                  at: str = "UTC_TIMESTAMP(6)") -> bytes:
    event_id = ids.new_id()
    sql(conn,
        "INSERT INTO orbit_events (namespace_id, id, aggregate_type, aggregate_id,"
        " aggregate_revision, event_type, from_state, to_state, payload, occurred_at)"
        f" VALUES (%s, %s, 'task', %s, %s, %s, %s, %s, '{{}}', {at})",
        sc.tenant.namespace_id, event_id, task_id, revision, event_type, from_state, to_state)
    return event_id


def _revision(conn: Any, sc: Scenario, name: str) -> int:
    ((revision,),) = sql(conn, "SELECT revision FROM pulse_tasks WHERE namespace_id = %s"
                               " AND id = %s", sc.tenant.namespace_id, sc.task[name])
    return int(revision)


def _set_task(conn: Any, sc: Scenario, name: str, assignment: str, *params: Any) -> None:
    sql(conn, f"UPDATE pulse_tasks SET {assignment} WHERE namespace_id = %s AND id = %s",
        *params, sc.tenant.namespace_id, sc.task[name])


def c_second_live_attempt(conn: Any, sc: Scenario) -> None:
    _insert_attempt(conn, sc, sc.task["RUNNING"], 7, "OFFERED", finished=False)


def c_generation_gap(conn: Any, sc: Scenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET generation = 3 WHERE namespace_id = %s AND id = %s",
        sc.tenant.namespace_id, sc.grant["SUCCEEDED"].attempt_id)


def c_attempts_used(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "WAITING", "attempts_used = 1")


def c_orphan_attempt(conn: Any, sc: Scenario) -> None:
    _insert_attempt(conn, sc, ids.new_id(), 1, "LEASE_EXPIRED", finished=True)


def c_state_disagrees(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "LEASED", "state = 'RUNNING'")


def c_lease_disagrees(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "RUNNING", "lease_expires_at = lease_expires_at + INTERVAL 1 SECOND")


def c_foreign_attempt(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "LEASED", "current_attempt_id = %s", sc.grant["RUNNING"].attempt_id)


def c_live_attempt_of_finished_task(conn: Any, sc: Scenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET state = 'RUNNING', finished_at = NULL"
              " WHERE namespace_id = %s AND id = %s",
        sc.tenant.namespace_id, sc.grant["FAILED"].attempt_id)


def c_idle_task_names_attempt(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "SUCCEEDED", "current_attempt_id = %s", sc.grant["SUCCEEDED"].attempt_id)


def c_no_completed_at(conn: Any, sc: Scenario) -> None:
    with unchecked(conn, "pulse_tasks", "ck_tasks_terminal_completed"):
        _set_task(conn, sc, "SUCCEEDED", "completed_at = NULL")


def c_second_outcome_event(conn: Any, sc: Scenario) -> None:
    _insert_event(conn, sc, sc.task["CANCELLED"], _revision(conn, sc, "CANCELLED"),
                  "task.cancelled_again", "WAITING", "CANCELLED")


def c_missing_outcome_event(conn: Any, sc: Scenario) -> None:
    # The task claims an outcome it never reached through an event (events cannot be deleted).
    with unchecked(conn, "pulse_tasks", "ck_tasks_terminal_completed"):
        _set_task(conn, sc, "WAITING", "state = 'FAILED', completed_at = UTC_TIMESTAMP(6)")


def _deletable_result_events(conn: Any) -> None:
    """The append-only trigger makes deleting a result event impossible on a sound schema
    (migration 0012): this scratch database's table stops refusing DELETE (as
    f_two_valid_permits drops a unique index), so the checker can be shown the damage."""
    sql(conn, "DROP TRIGGER IF EXISTS trg_orbit_result_events_no_delete")


def c_missing_result_event(conn: Any, sc: Scenario) -> None:
    _deletable_result_events(conn)
    sql(conn, "DELETE FROM orbit_result_events WHERE namespace_id = %s AND task_id = %s",
        sc.tenant.namespace_id, sc.task["SUCCEEDED"])


def c_result_without_state_event(conn: Any, sc: Scenario) -> None:
    ((n,),) = sql(conn, "SELECT MAX(sequence) FROM orbit_result_events WHERE namespace_id = %s",
                  sc.tenant.namespace_id)
    sql(conn, "INSERT INTO orbit_result_events (namespace_id, id, sequence, task_id, queue_id,"
              " task_revision, state, snapshot, committed_at) VALUES (%s, %s, %s, %s, %s, %s,"
              " 'FAILED', '{}', UTC_TIMESTAMP(6))",
        sc.tenant.namespace_id, ids.new_id(), n + 1, sc.task["RUNNING"], sc.queue.id,
        _revision(conn, sc, "RUNNING"))
    sql(conn, "UPDATE orbit_event_streams SET next_sequence = next_sequence + 1"
              " WHERE namespace_id = %s", sc.tenant.namespace_id)


def c_sequence_gap(conn: Any, sc: Scenario) -> None:
    _deletable_result_events(conn)
    sql(conn, "DELETE FROM orbit_result_events WHERE namespace_id = %s AND sequence = 1",
        sc.tenant.namespace_id)


def c_stream_counter(conn: Any, sc: Scenario) -> None:
    sql(conn, "UPDATE orbit_event_streams SET next_sequence = next_sequence + 1"
              " WHERE namespace_id = %s", sc.tenant.namespace_id)


def c_queue_counter(conn: Any, sc: Scenario) -> None:
    sql(conn, "UPDATE pulse_queues SET active_attempts = active_attempts + 1"
              " WHERE namespace_id = %s AND id = %s", sc.tenant.namespace_id, sc.queue.id)


def c_uncertain_final(conn: Any, sc: Scenario) -> None:
    with unchecked(conn, "pulse_tasks", "ck_tasks_uncertain_not_final"):
        _set_task(conn, sc, "SUCCEEDED", "effect_uncertain = 1")


def c_uncertainty_dropped(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "NEEDS_REVIEW", "effect_uncertain = 0")


def c_success_overwritten(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "SUCCEEDED", "state = 'FAILED'")


def c_bad_transition(conn: Any, sc: Scenario) -> None:
    revision = _revision(conn, sc, "WAITING") + 1
    _insert_event(conn, sc, sc.task["WAITING"], revision, "task.teleported", "WAITING",
                  "SUCCEEDED")
    _set_task(conn, sc, "WAITING", "revision = %s", revision)


def c_terminal_same_state(conn: Any, sc: Scenario) -> None:
    revision = _revision(conn, sc, "SUCCEEDED") + 1
    _insert_event(conn, sc, sc.task["SUCCEEDED"], revision, "task.touched", "SUCCEEDED",
                  "SUCCEEDED")
    _set_task(conn, sc, "SUCCEEDED", "revision = %s", revision)


def c_unevented_change(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "RUNNING", "revision = revision + 1")


def c_duplicate_revision(conn: Any, sc: Scenario) -> None:
    _insert_event(conn, sc, sc.task["RUNNING"], _revision(conn, sc, "RUNNING"),
                  "task.echo", "RUNNING", "RUNNING")


def c_events_out_of_order(conn: Any, sc: Scenario) -> None:
    revision = _revision(conn, sc, "RUNNING") + 1
    _insert_event(conn, sc, sc.task["RUNNING"], revision, "task.cancel_requested", "RUNNING",
                  "RUNNING", at="UTC_TIMESTAMP(6) - INTERVAL 1 DAY")
    _set_task(conn, sc, "RUNNING", "revision = %s", revision)


def c_second_creation_event(conn: Any, sc: Scenario) -> None:
    revision = _revision(conn, sc, "successor") + 1
    _insert_event(conn, sc, sc.task["successor"], revision, "task.accepted", None, "WAITING")
    _set_task(conn, sc, "successor", "revision = %s", revision)


def c_start_budget(conn: Any, sc: Scenario) -> None:
    _set_task(conn, sc, "RUNNING", "starts_used = starts_used - 1")


def c_foreign_session(conn: Any, sc: Scenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET worker_session_id = %s WHERE namespace_id = %s"
              " AND task_id = %s AND state = 'RUNNING'",
        ids.new_id(), sc.tenant.namespace_id, sc.task["RUNNING"])


CORRUPTIONS: list[tuple[str, Callable[[Any, Scenario], None]]] = [
    ("start_budget", c_start_budget),
    ("session_binding", c_foreign_session),
    ("live_attempts", c_second_live_attempt),
    ("generations", c_generation_gap),
    ("generations", c_attempts_used),
    ("orphan_attempt", c_orphan_attempt),
    ("current_attempt", c_state_disagrees),
    ("current_attempt", c_lease_disagrees),
    ("current_attempt", c_foreign_attempt),
    ("stray_live_attempt", c_live_attempt_of_finished_task),
    ("stray_live_attempt", c_second_live_attempt),
    ("idle_task_lease", c_idle_task_names_attempt),
    ("completed_at", c_no_completed_at),
    ("outcome_event", c_second_outcome_event),
    ("outcome_event", c_missing_outcome_event),
    ("result_event", c_missing_result_event),
    ("result_event", c_missing_outcome_event),
    ("result_event_mismatch", c_result_without_state_event),
    ("result_sequence", c_sequence_gap),
    ("result_sequence", c_stream_counter),
    ("queue_counter", c_queue_counter),
    ("queue_counter", c_live_attempt_of_finished_task),
    ("uncertain_final", c_uncertain_final),
    ("uncertainty_dropped", c_uncertainty_dropped),
    ("success_overwritten", c_success_overwritten),
    ("transition", c_bad_transition),
    ("transition", c_terminal_same_state),
    ("event_revisions", c_unevented_change),
    ("event_revisions", c_duplicate_revision),
    ("event_revisions", c_events_out_of_order),
    ("event_revisions", c_second_creation_event),
]


@pytest.mark.parametrize(("code", "corrupt"), CORRUPTIONS,
                         ids=[f"{code}-{fn.__name__[2:]}" for code, fn in CORRUPTIONS])
async def test_the_checker_reports_each_corruption(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any], code: str,
    corrupt: Callable[[Any, Scenario], None],
) -> None:
    damaged = await build_scenario(scratch_db)
    bystander = await build_scenario(scratch_db)
    assert check(scratch_conn, [damaged.tenant.namespace_id]) == []
    corrupt(scratch_conn, damaged)
    found = check(scratch_conn, [damaged.tenant.namespace_id])
    assert code in codes(found), found
    assert all(v.startswith("[") and "] " in v for v in found)
    assert check(scratch_conn, [bystander.tenant.namespace_id]) == []
    assert code in codes(check(scratch_conn))  # unscoped sees it too
    assert code in codes(await check_db(scratch_db, [damaged.tenant.namespace_id]))


async def test_stuck_leases_and_deadlines_count_only_at_quiescence(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    sc = await build_scenario(scratch_db)
    ns = [sc.tenant.namespace_id]
    assert check(scratch_conn, ns, quiescent=True, grace=dt.timedelta(0)) == []
    await expire_leases(scratch_db, sc.tenant, [sc.task["RUNNING"]])
    assert check(scratch_conn, ns) == []
    assert check(scratch_conn, ns, quiescent=True, grace=dt.timedelta(minutes=5)) == []
    found = check(scratch_conn, ns, quiescent=True, grace=dt.timedelta(0))
    assert codes(found) == {"stuck"}
    assert sc.task["RUNNING"].hex() in found[0]
    _set_task(scratch_conn, sc, "WAITING", "deadline_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR")
    assert len(check(scratch_conn, ns, quiescent=True, grace=dt.timedelta(minutes=5))) == 1


async def test_acknowledged_tasks_must_exist_and_creation_events_can_be_required(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    sc = await build_scenario(scratch_db)
    ns = sc.tenant.namespace_id
    present = [(ns, t) for t in sc.task.values()]
    assert check(scratch_conn, [ns], expected_tasks=present) == []
    missing = ids.new_id()
    found = check(scratch_conn, [ns], expected_tasks=[*present, (ns, missing)])
    assert codes(found) == {"missing_task"}
    assert missing.hex() in found[0]
    # Scenario tasks are inserted in SQL without their creation event; the manual retry's
    # successor has one. Requiring creation events flags exactly the former.
    required = check(scratch_conn, [ns], require_creation_events=True)
    assert codes(required) == {"event_revisions"}
    assert not any(sc.task["successor"].hex() in v for v in required)
    assert len(required) == len(sc.task) - 1


# --- (c) flow control: counters, start windows, concurrency keys and permits --------------------


@attrs.frozen(kw_only=True)
class FlowScenario:
    """:class:`Scenario` plus a queue of keyed tasks with permits in every condition, and a
    start window in use, built through the real functions."""

    base: Scenario
    queue: QueueRef  # the keyed tasks' queue (max_starts_per_second 100)
    task: dict[str, bytes]
    grant: dict[str, Grant]

    @property
    def tenant(self) -> Tenant:
        return self.base.tenant


async def build_flow_scenario(db: Database) -> FlowScenario:
    base = await build_scenario(db)
    tenant = base.tenant
    queue = await make_queue(db, tenant)
    await sql_async(db, "UPDATE pulse_queues SET max_starts_per_second = 100"
                        " WHERE namespace_id = %s AND id = %s", tenant.namespace_id, queue.id)
    # A count limit, so the application keeps the counters the checker recounts.
    await set_application_limits(db, tenant, max_unfinished_tasks=1_000_000)
    session = await open_session(db, tenant, [queue])
    task: dict[str, bytes] = {}
    grant: dict[str, Grant] = {}

    async def add_and_claim(name: str, key: bytes, *, started: bool) -> None:
        # One at a time: each claim must pick exactly the task just added.
        (task[name],) = await add_tasks(db, tenant, queue, concurrency_key=key)
        (grant[name],) = await claim(db, session, queue, 1)
        assert grant[name].task_id == task[name]
        if started:
            (approved,) = await start(db, tenant, [grant[name]])
            assert approved.approved

    await add_and_claim("done", b"k-two", started=True)  # token 1, released on success
    (finished,) = await finish(db, tenant, [report(grant["done"], "succeeded")])
    assert finished.task_state == "SUCCEEDED"
    await add_and_claim("next", b"k-two", started=True)  # token 3, valid
    await add_and_claim("running", b"k-held", started=True)
    (task["behind"],) = await add_tasks(db, tenant, queue, concurrency_key=b"k-held")
    await add_and_claim("offered", b"k-offered", started=False)
    assert [grant[n].concurrency_token for n in ("done", "next", "running", "offered")] == [
        1, 3, 1, 1]
    return FlowScenario(base=base, queue=queue, task=task, grant=grant)


async def sql_async(db: Database, statement: str, *params: Any) -> None:
    async def body(cur: Any) -> None:
        await cur.execute(statement, params)

    await db.transaction("test.sql", body)


def _key_row(conn: Any, fs: FlowScenario, key: bytes, assignment: str, *params: Any) -> None:
    sql(conn, f"UPDATE pulse_concurrency_limits SET {assignment}"
              " WHERE namespace_id = %s AND scope_key = %s",
        *params, fs.tenant.namespace_id, key)


def _permit(conn: Any, fs: FlowScenario, name: str, assignment: str, *params: Any) -> None:
    sql(conn, f"UPDATE pulse_permits SET {assignment} WHERE namespace_id = %s AND attempt_id = %s",
        *params, fs.tenant.namespace_id, fs.grant[name].attempt_id)


def f_queue_unfinished_drift(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_queues SET unfinished_tasks = unfinished_tasks + 1"
              " WHERE namespace_id = %s AND id = %s", fs.tenant.namespace_id, fs.queue.id)


def f_task_ended_without_counter(conn: Any, fs: FlowScenario) -> None:
    _set_task(conn, fs.base, "WAITING", "state = 'CANCELLED', completed_at = UTC_TIMESTAMP(6)")


def f_application_unfinished(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE orbit_application_resources SET unfinished_tasks = unfinished_tasks + 1"
              " WHERE application_id = %s", fs.tenant.application_id)


def f_application_reserved(conn: Any, fs: FlowScenario) -> None:
    # An offer started without giving back its reservation.
    sql(conn, "UPDATE orbit_application_resources SET reserved_attempts = reserved_attempts + 1"
              " WHERE application_id = %s", fs.tenant.application_id)


def f_application_active(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE orbit_application_resources SET active_attempts = active_attempts - 1"
              " WHERE application_id = %s", fs.tenant.application_id)


def f_application_row_missing(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "DELETE FROM orbit_application_resources WHERE application_id = %s",
        fs.tenant.application_id)


def f_window_over_limit(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_queues SET max_starts_per_second = 2, starts_in_window = 3,"
              " start_window_until = UTC_TIMESTAMP(6) + INTERVAL 900000 MICROSECOND"
              " WHERE namespace_id = %s AND id = %s", fs.tenant.namespace_id, fs.queue.id)


def f_window_too_long(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE orbit_application_resources SET max_starts_per_second = 5,"
              " starts_in_window = 1, start_window_until = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
              " WHERE application_id = %s", fs.tenant.application_id)


def f_key_bytes_differ(conn: Any, fs: FlowScenario) -> None:
    _key_row(conn, fs, b"k-held", "scope_key = %s", b"k-HELD")


def f_key_row_missing(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_tasks SET concurrency_key = %s, concurrency_key_digest = %s"
              " WHERE namespace_id = %s AND id = %s",
        b"k-new", secrets.token_bytes(32), fs.tenant.namespace_id, fs.task["behind"])


def f_keyed_attempt_without_token(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET concurrency_token = NULL"
              " WHERE namespace_id = %s AND id = %s",
        fs.tenant.namespace_id, fs.grant["done"].attempt_id)


def f_token_without_key(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET concurrency_token = 7"
              " WHERE namespace_id = %s AND id = %s",
        fs.tenant.namespace_id, fs.base.grant["SUCCEEDED"].attempt_id)


def f_held_count(conn: Any, fs: FlowScenario) -> None:
    _key_row(conn, fs, b"k-held", "held_permits = 0")


def f_two_valid_permits(conn: Any, fs: FlowScenario) -> None:
    # uq_permits_held makes this impossible on a sound schema: this scratch database's permit
    # table stops enforcing it (as `unchecked` does for a CHECK on MySQL).
    ((present,),) = sql(conn, "SELECT COUNT(*) FROM information_schema.statistics"
                              " WHERE table_schema = DATABASE() AND table_name = 'pulse_permits'"
                              " AND index_name = 'uq_permits_held'")
    if present:
        sql(conn, "ALTER TABLE pulse_permits DROP INDEX uq_permits_held")
    _permit(conn, fs, "done", "released_at = NULL, release_reason = NULL")


def f_wrong_release_reason(conn: Any, fs: FlowScenario) -> None:
    _permit(conn, fs, "done", "release_reason = 'FAILED'")


def f_valid_permit_of_finished_attempt(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET state = 'SUCCEEDED', finished_at = UTC_TIMESTAMP(6)"
              " WHERE namespace_id = %s AND id = %s",
        fs.tenant.namespace_id, fs.grant["running"].attempt_id)


def f_permit_token_differs(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "UPDATE pulse_attempts SET concurrency_token = 2"
              " WHERE namespace_id = %s AND id = %s",
        fs.tenant.namespace_id, fs.grant["offered"].attempt_id)


def f_released_early(conn: Any, fs: FlowScenario) -> None:
    _permit(conn, fs, "running",
            "released_at = UTC_TIMESTAMP(6), release_reason = 'SUCCEEDED'")


def f_permit_missing(conn: Any, fs: FlowScenario) -> None:
    sql(conn, "DELETE FROM pulse_permits WHERE namespace_id = %s AND attempt_id = %s",
        fs.tenant.namespace_id, fs.grant["offered"].attempt_id)


def f_tokens_out_of_order(conn: Any, fs: FlowScenario) -> None:
    _permit(conn, fs, "next", "acquired_at = acquired_at - INTERVAL 1 DAY")


def f_overlapping_holders(conn: Any, fs: FlowScenario) -> None:
    _permit(conn, fs, "done", "released_at = released_at + INTERVAL 1 DAY")


def f_token_above_revision(conn: Any, fs: FlowScenario) -> None:
    _permit(conn, fs, "next", "token = 30")
    sql(conn, "UPDATE pulse_attempts SET concurrency_token = 30"
              " WHERE namespace_id = %s AND id = %s",
        fs.tenant.namespace_id, fs.grant["next"].attempt_id)


def f_revision_drift(conn: Any, fs: FlowScenario) -> None:
    _key_row(conn, fs, b"k-offered", "revision = revision + 1")


FLOW_CORRUPTIONS: list[tuple[str, Callable[[Any, FlowScenario], None]]] = [
    ("queue_unfinished", f_queue_unfinished_drift),
    ("queue_unfinished", f_task_ended_without_counter),
    ("application_counter", f_application_unfinished),
    ("application_counter", f_application_reserved),
    ("application_counter", f_application_active),
    ("application_counter", f_application_row_missing),
    ("application_counter", f_task_ended_without_counter),
    ("start_window", f_window_over_limit),
    ("start_window", f_window_too_long),
    ("key_row", f_key_bytes_differ),
    ("key_row", f_key_row_missing),
    ("attempt_token", f_keyed_attempt_without_token),
    ("attempt_token", f_token_without_key),
    ("permit_count", f_held_count),
    ("permit_count", f_released_early),
    ("permit_held", f_two_valid_permits),
    ("permit_holder", f_wrong_release_reason),
    ("permit_holder", f_valid_permit_of_finished_attempt),
    ("permit_holder", f_permit_token_differs),
    ("permit_holder", f_released_early),
    ("permit_missing", f_released_early),
    ("permit_missing", f_permit_missing),
    ("permit_missing", f_permit_token_differs),
    ("permit_tokens", f_tokens_out_of_order),
    ("permit_tokens", f_overlapping_holders),
    ("permit_tokens", f_token_above_revision),
    ("permit_tokens", f_two_valid_permits),
    ("permit_revision", f_revision_drift),
]


@pytest.mark.parametrize(("code", "corrupt"), FLOW_CORRUPTIONS,
                         ids=[f"{code}-{fn.__name__[2:]}" for code, fn in FLOW_CORRUPTIONS])
async def test_the_checker_reports_each_flow_control_corruption(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any], code: str,
    corrupt: Callable[[Any, FlowScenario], None],
) -> None:
    damaged = await build_flow_scenario(scratch_db)
    bystander = await build_flow_scenario(scratch_db)
    assert check(scratch_conn, [damaged.tenant.namespace_id]) == []
    corrupt(scratch_conn, damaged)
    found = check(scratch_conn, [damaged.tenant.namespace_id])
    assert code in codes(found), found
    assert all(v.startswith("[") and "] " in v for v in found)
    assert check(scratch_conn, [bystander.tenant.namespace_id]) == []
    assert code in codes(check(scratch_conn))  # unscoped sees it too
    assert code in codes(await check_db(scratch_db, [damaged.tenant.namespace_id]))


async def test_application_counters_are_checked_over_all_its_namespaces(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    """A check scoped to one namespace recounts the application over all of its namespaces: work
    in a sibling namespace is neither a false alarm nor hidden."""
    from orbit_common.platform import commands

    sc = await build_scenario(scratch_db)
    who = await principal(scratch_db, sc.tenant)
    sibling = await commands.create_namespace(scratch_db, who, name=f"ns-{secrets.token_hex(4)}",
                                              description="", idempotency_key=None)
    other = attrs.evolve(sc.tenant, namespace=sibling.body["name"],
                         namespace_id=sibling.resource_id)
    queue = await make_queue(scratch_db, other)
    await add_tasks(scratch_db, other, queue, 3)
    session = await open_session(scratch_db, other, [queue])
    await claim(scratch_db, session, queue, 2)
    await set_application_limits(scratch_db, sc.tenant, max_unfinished_tasks=1_000_000)
    for scope in ([sc.tenant.namespace_id], [other.namespace_id]):
        assert check(scratch_conn, scope) == []
    sql(scratch_conn, "UPDATE pulse_queues SET unfinished_tasks = unfinished_tasks - 1,"
                      " active_attempts = active_attempts - 1 WHERE namespace_id = %s",
        other.namespace_id)
    sql(scratch_conn, "UPDATE orbit_application_resources SET active_attempts = active_attempts - 1"
                      " WHERE application_id = %s", sc.tenant.application_id)
    assert codes(check(scratch_conn, [sc.tenant.namespace_id])) == {"application_counter"}
    assert codes(check(scratch_conn, [other.namespace_id])) == {
        "application_counter", "queue_counter", "queue_unfinished"}


async def test_two_runs_of_one_schedule_instant_are_reported(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    """A schedule fired by the real scheduler is clean; a second run of one of its instants
    (another source) is ``one_run_per_instant``. uq_occurrences_run makes that row impossible on
    a sound schema, so this scratch database's ledger stops enforcing it first (as
    f_two_valid_permits does for uq_permits_held); a SKIPPED row of the instant stays clean."""
    from orbit_common.pulse import schedules
    from tests.integration.test_schedule_firing import fire_until_idle, make_schedule

    tenants = []
    for _ in range(2):
        sc = await build_scenario(scratch_db)
        schedule_id = await make_schedule(
            scratch_db, sc.tenant, sc.queue.id, rule={"cron": "*/10 * * * *", "timezone": "UTC"},
            since=dt.timedelta(minutes=25), misfire="EACH")
        tenants.append((sc.tenant, schedule_id))
    await fire_until_idle(scratch_db)
    (damaged, schedule_id), (bystander, _) = tenants
    ((fire_at,),) = sql(scratch_conn, "SELECT MIN(fire_at) FROM pulse_schedule_occurrences"
                                      " WHERE namespace_id = %s AND outcome = 'FIRED'",
                        damaged.namespace_id)
    assert fire_at is not None
    assert check(scratch_conn, [damaged.namespace_id]) == []
    insert = schedules.INSERT_OCCURRENCES + " VALUES " + schedules.OCCURRENCE_ROW

    def occurrence(source: str, outcome: str) -> tuple[Any, ...]:
        return (damaged.namespace_id, ids.new_id(), schedule_id, fire_at, 1, source, outcome,
                None, None, 1, None if outcome == "SKIPPED" else ids.new_id(), fire_at, 0)

    sql(scratch_conn, insert, *occurrence("TRIGGER", "SKIPPED"))
    assert check(scratch_conn, [damaged.namespace_id]) == []
    ((present,),) = sql(scratch_conn, "SELECT COUNT(*) FROM information_schema.statistics"
                                      " WHERE table_schema = DATABASE()"
                                      " AND table_name = 'pulse_schedule_occurrences'"
                                      " AND index_name = 'uq_occurrences_run'")
    if present:
        sql(scratch_conn, "ALTER TABLE pulse_schedule_occurrences DROP INDEX uq_occurrences_run")
    sql(scratch_conn, insert, *occurrence("BACKFILL", "FIRED"))
    found = check(scratch_conn, [damaged.namespace_id])
    assert codes(found) == {"one_run_per_instant"}, found
    assert "ran 2 times" in found[0]
    assert check(scratch_conn, [bystander.namespace_id]) == []
    assert "one_run_per_instant" in codes(await check_db(scratch_db, [damaged.namespace_id]))


async def test_a_schedule_task_and_its_owner_must_agree(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    """Tasks fired by the real scheduler are owned by their schedule (clean); a task that lost
    its owner, or names another schedule than the ledger row that made it, is ``task_owner``."""
    from tests.integration.test_schedule_firing import fire_until_idle, make_schedule

    tenants = []
    for _ in range(2):
        sc = await build_scenario(scratch_db)
        await make_schedule(
            scratch_db, sc.tenant, sc.queue.id, rule={"cron": "*/10 * * * *", "timezone": "UTC"},
            since=dt.timedelta(minutes=25), misfire="EACH")
        tenants.append(sc.tenant)
    await fire_until_idle(scratch_db)
    damaged, bystander = tenants
    fired = [task_id for (task_id,) in sql(
        scratch_conn, "SELECT task_id FROM pulse_schedule_occurrences WHERE namespace_id = %s"
                      " AND outcome = 'FIRED' ORDER BY fire_at", damaged.namespace_id)]
    assert len(fired) >= 2
    assert check(scratch_conn, [damaged.namespace_id]) == []
    sql(scratch_conn, "UPDATE pulse_tasks SET owner_kind = NULL, owner_id = NULL"
                      " WHERE namespace_id = %s AND id = %s", damaged.namespace_id, fired[0])
    found = check(scratch_conn, [damaged.namespace_id])
    assert codes(found) == {"task_owner"}, found
    assert "owned by nobody" in found[0]
    sql(scratch_conn, "UPDATE pulse_tasks SET owner_id = %s WHERE namespace_id = %s AND id = %s",
        ids.new_id(), damaged.namespace_id, fired[1])
    assert len(check(scratch_conn, [damaged.namespace_id])) == 3  # both ends of the second
    assert check(scratch_conn, [bystander.namespace_id]) == []
    assert "task_owner" in codes(await check_db(scratch_db, [damaged.namespace_id]))


# --- workflows (orbit_common/weave) ------------------------------------------------------------


async def test_workflow_corruptions(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    """A started instance whose owned task ended through the real ending writer is clean; a
    step naming another live activation is ``live_activation``, a lost inbox row is
    ``workflow_inbox``, a finished instance with a LIVE activation and a pending advance is
    ``instance_state``; another tenant stays clean."""
    from tests.integration.weave.test_inbox import workflow_task

    damaged, bystander = await make_tenant(scratch_db), await make_tenant(scratch_db)
    task_id, instance, _ = await workflow_task(scratch_db, damaged)
    await workflow_task(scratch_db, bystander)
    await interventions.cancel_task(scratch_db, await principal(scratch_db, damaged),
                                    namespace=damaged.namespace, task_id=task_id, reason="x")
    ns = [damaged.namespace_id]
    assert check(scratch_conn, ns) == []
    sql(scratch_conn, "UPDATE weave_steps SET live_activation_id = %s WHERE namespace_id = %s"
                      " AND name = 'a'", ids.new_id(), damaged.namespace_id)
    found = check(scratch_conn, ns)
    assert codes(found) == {"live_activation"}, found
    sql(scratch_conn, "DELETE FROM weave_inbox WHERE namespace_id = %s AND task_id = %s",
        damaged.namespace_id, task_id)
    found = check(scratch_conn, ns)
    assert codes(found) == {"live_activation", "workflow_inbox"}, found
    assert "no inbox row" in next(f for f in found if f.startswith("[workflow_inbox]"))
    sql(scratch_conn, "UPDATE weave_instances SET state = 'SUCCEEDED',"
                      " completed_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND id = %s",
        damaged.namespace_id, instance["id"])
    found = [f for f in check(scratch_conn, ns) if f.startswith("[instance_state]")]
    # the LIVE $root activation, the ROOT advance, the RUNNING $root and a steps
    assert len(found) == 3, found
    assert check(scratch_conn, [bystander.namespace_id]) == []
    assert {"live_activation", "workflow_inbox", "instance_state"} <= codes(
        await check_db(scratch_db, ns))


async def test_inbox_outcome_corruptions(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    """An inbox row consumed as ``advanced`` whose activation does not carry its event, and an
    outcome on a row not consumed, are ``inbox_outcome``."""
    from tests.integration.weave.test_inbox import workflow_task

    damaged = await make_tenant(scratch_db)
    task_id, _, _ = await workflow_task(scratch_db, damaged)
    await interventions.cancel_task(scratch_db, await principal(scratch_db, damaged),
                                    namespace=damaged.namespace, task_id=task_id, reason="x")
    ns = [damaged.namespace_id]
    assert check(scratch_conn, ns) == []
    sql(scratch_conn, "UPDATE weave_inbox SET outcome = 'stale' WHERE namespace_id = %s",
        damaged.namespace_id)
    found = check(scratch_conn, ns)
    assert codes(found) == {"inbox_outcome"}, found
    assert "does not match" in found[0]
    sql(scratch_conn, "UPDATE weave_inbox SET state = 'CONSUMED', outcome = 'advanced',"
                      " consumed_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s",
        damaged.namespace_id)
    found = check(scratch_conn, ns)
    assert codes(found) == {"inbox_outcome"}, found
    assert "no activation with this result event" in found[0]


async def test_step_hold_corruptions(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    """A held step (WAITING, LIVE activation, held_at and held_error) is clean; the CHECK
    refuses half a hold; a held step whose activation was superseded without a successor is
    ``step_hold`` twice (held without a LIVE activation; a SUPERSEDED activation without a
    successor)."""
    from tests.integration.weave.test_inbox import workflow_task

    damaged = await make_tenant(scratch_db)
    await workflow_task(scratch_db, damaged)
    ns = [damaged.namespace_id]
    sql(scratch_conn, "UPDATE weave_steps SET state = 'WAITING', held_at = UTC_TIMESTAMP(6),"
                      " held_error = '{\"error\": \"task_failed\"}' WHERE namespace_id = %s"
                      " AND name = 'a'", damaged.namespace_id)
    assert check(scratch_conn, ns) == []
    with pytest.raises(pymysql.err.OperationalError):  # 4025 (MariaDB) / 3819 (MySQL)
        sql(scratch_conn, "UPDATE weave_steps SET held_error = NULL WHERE namespace_id = %s"
                          " AND name = 'a'", damaged.namespace_id)
    sql(scratch_conn, "UPDATE weave_activations SET state = 'SUPERSEDED', live_step_id = NULL,"
                      " ended_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND step_id IN"
                      " (SELECT id FROM weave_steps WHERE namespace_id = %s AND name = 'a')",
        damaged.namespace_id, damaged.namespace_id)
    sql(scratch_conn, "UPDATE weave_steps SET live_activation_id = NULL WHERE namespace_id = %s"
                      " AND name = 'a'", damaged.namespace_id)
    found = check(scratch_conn, ns)
    assert codes(found) == {"step_hold"}, found
    assert len(found) == 2, found
    assert any("held but not WAITING with a LIVE activation" in f for f in found)
    assert any("a SUPERSEDED activation without a successor" in f for f in found)
    assert "step_hold" in codes(await check_db(scratch_db, ns))


# --- subscriptions and deliveries (orbit_common/relay) ---------------------------------------


@attrs.frozen(kw_only=True)
class RelayScenario:
    """A clean tenant with one delivery in each state: ``acked``, ``retrying`` (PENDING after a
    failed attempt), ``leased``, ``fresh`` (PENDING, never leased)."""

    tenant: Tenant
    subscription_id: bytes
    delivery: dict[str, bytes]


async def build_relay_scenario(db: Database) -> RelayScenario:
    from orbit_common.relay import deliveries
    from tests.support import relay

    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 4)
    await relay.subscribe(db, tenant, start_after_sequence=0, backoff_initial_ms=0)
    await relay.fan_out_all(db, tenant)
    who = await principal(db, tenant)
    first, second = await relay.lease(db, tenant, limit=2)
    await deliveries.acknowledge_delivery(db, who, namespace=tenant.namespace, name="sub",
                                          delivery_id=first.delivery_id, token=first.token)
    await deliveries.fail_delivery(db, who, namespace=tenant.namespace, name="sub",
                                   delivery_id=second.delivery_id, token=second.token,
                                   error=deliveries.AttemptError(body="no"))
    leased = list(await relay.lease(db, tenant, limit=1))
    (third,) = [d for d in leased if d.delivery_id != second.delivery_id] or [None]
    if third is None:  # the retried one came first: lease the never-leased one as well
        (third,) = await relay.lease(db, tenant, limit=1)
    rows = await relay.delivery_rows(db, tenant)
    fresh = [r["id"] for r in rows if r["state"] == "PENDING" and r["attempts_used"] == 0]
    retrying = [r["id"] for r in rows if r["state"] == "PENDING" and r["attempts_used"] == 1]
    leased_ids = [r["id"] for r in rows if r["state"] == "LEASED"]
    sub = await relay.subscription_row(db, tenant)
    delivery = {"acked": first.delivery_id, "leased": leased_ids[0]}
    if fresh:
        delivery["fresh"] = fresh[0]
    if retrying:
        delivery["retrying"] = retrying[0]
    return RelayScenario(tenant=tenant, subscription_id=sub["id"], delivery=delivery)


def _set_delivery(conn: Any, sc: RelayScenario, which: str, assignment: str) -> None:
    sql(conn, f"UPDATE orbit_deliveries SET {assignment} WHERE namespace_id = %s AND id = %s",
        sc.tenant.namespace_id, sc.delivery[which])


def r_backlog(conn: Any, sc: RelayScenario) -> None:
    sql(conn, "UPDATE orbit_subscriptions SET backlog = backlog + 1 WHERE namespace_id = %s",
        sc.tenant.namespace_id)


def r_backlog_missed_ack(conn: Any, sc: RelayScenario) -> None:
    _set_delivery(conn, sc, "leased", "state = 'ACKNOWLEDGED', lease_expires_at = NULL,"
                  " acknowledged_at = UTC_TIMESTAMP(6), attempts_used = attempts_used - 1")


def r_duplicate(conn: Any, sc: RelayScenario) -> None:
    """The unique key forbids it: drop the key for the corruption, restore it after the check
    (see test_the_checker_reports_each_relay_corruption)."""
    sql(conn, "ALTER TABLE orbit_deliveries DROP INDEX uq_deliveries_event")
    sql(conn, "INSERT INTO orbit_deliveries (namespace_id, id, subscription_id, event_id,"
              " sequence, task_id, task_revision, state, attempts_used, max_attempts,"
              " available_at, created_at, updated_at, acknowledged_at)"
              " SELECT namespace_id, %s, subscription_id, event_id, sequence, task_id,"
              " task_revision, 'ACKNOWLEDGED', 0, max_attempts, available_at, created_at,"
              " updated_at, acknowledged_at FROM orbit_deliveries"
              " WHERE namespace_id = %s AND id = %s",
        ids.new_id(), sc.tenant.namespace_id, sc.delivery["acked"])


def r_source(conn: Any, sc: RelayScenario) -> None:
    _set_delivery(conn, sc, "acked", "sequence = sequence + 100")


def r_orphan(conn: Any, sc: RelayScenario) -> None:
    _set_delivery(conn, sc, "acked", "subscription_id = UNHEX(REPEAT('ab', 16))")


def r_lease_fields(conn: Any, sc: RelayScenario) -> None:
    with unchecked(conn, "orbit_deliveries", "ck_deliveries_lease"):
        _set_delivery(conn, sc, "leased", "lease_token_digest = NULL")


def r_pending_with_lease(conn: Any, sc: RelayScenario) -> None:
    with unchecked(conn, "orbit_deliveries", "ck_deliveries_lease"):
        _set_delivery(conn, sc, "fresh", "lease_expires_at = UTC_TIMESTAMP(6)")


def r_attempts(conn: Any, sc: RelayScenario) -> None:
    _set_delivery(conn, sc, "acked", "attempts_used = attempts_used + 1")


def r_scan_position(conn: Any, sc: RelayScenario) -> None:
    sql(conn, "UPDATE orbit_subscriptions SET scan_after_sequence = scan_after_sequence + 5"
              " WHERE namespace_id = %s", sc.tenant.namespace_id)


RELAY_CORRUPTIONS: list[tuple[str, Callable[[Any, RelayScenario], None]]] = [
    ("subscription_backlog", r_backlog),
    ("subscription_backlog", r_backlog_missed_ack),
    ("delivery_unique", r_duplicate),
    ("delivery_source", r_source),
    ("delivery_source", r_orphan),
    ("delivery_lease", r_lease_fields),
    ("delivery_lease", r_pending_with_lease),
    ("delivery_attempts", r_attempts),
    ("scan_position", r_scan_position),
]


@pytest.mark.parametrize(("code", "corrupt"), RELAY_CORRUPTIONS,
                         ids=[f"{code}-{fn.__name__[2:]}" for code, fn in RELAY_CORRUPTIONS])
async def test_the_checker_reports_each_relay_corruption(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any], code: str,
    corrupt: Callable[[Any, RelayScenario], None],
) -> None:
    damaged = await build_relay_scenario(scratch_db)
    bystander = await build_relay_scenario(scratch_db)
    assert set(damaged.delivery) == {"acked", "leased", "fresh", "retrying"}
    assert check(scratch_conn, [damaged.tenant.namespace_id]) == []
    try:
        corrupt(scratch_conn, damaged)
        found = check(scratch_conn, [damaged.tenant.namespace_id])
        assert code in codes(found), found
        assert check(scratch_conn, [bystander.tenant.namespace_id]) == []
        assert code in codes(await check_db(scratch_db, [damaged.tenant.namespace_id]))
    finally:
        if corrupt is r_duplicate:
            sql(scratch_conn, "DELETE FROM orbit_deliveries WHERE namespace_id = %s"
                              " AND attempts_used = 0 AND state = 'ACKNOWLEDGED'",
                damaged.tenant.namespace_id)
            sql(scratch_conn, "ALTER TABLE orbit_deliveries ADD UNIQUE KEY uq_deliveries_event"
                              " (namespace_id, subscription_id, event_id)")


async def test_stuck_delivery_leases_count_only_at_quiescence(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any]
) -> None:
    sc = await build_relay_scenario(scratch_db)
    ns = [sc.tenant.namespace_id]
    _set_delivery(scratch_conn, sc, "leased",
                  "lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR")
    assert check(scratch_conn, ns) == []
    found = check(scratch_conn, ns, quiescent=True, grace=dt.timedelta(seconds=1))
    assert codes(found) == {"delivery_stuck"}, found


async def _stopping_instance(db: Database) -> tuple[Tenant, bytes]:
    """A tenant with an instance a user cancelled (STOPPING, its gate STOPPED) before any
    engine advanced it: what the stop_intent corruptions start from."""
    from orbit_common.weave import instances, stops
    from tests.integration.weave.support import published

    tenant = await make_tenant(db)
    queue = await make_queue(db, tenant)
    name = await published(db, tenant, queue.name)
    who = await principal(db, tenant)
    started = await instances.start_instance(db, who, namespace=tenant.namespace,
                                             definition=name, input_json=b'{"n": 1}')
    instance_id = bytes.fromhex(started.body["id"])
    cancelled = await stops.cancel(db, who, namespace=tenant.namespace,
                                   instance_id=instance_id.hex(), reason="corruption test")
    assert cancelled.body["state"] == "STOPPING"
    return tenant, instance_id


def s_gate_reopened(conn: Any, ns: bytes, instance_id: bytes) -> None:
    sql(conn, "UPDATE pulse_execution_gates g JOIN weave_instances i ON i.namespace_id ="
              " g.namespace_id AND i.gate_id = g.id SET g.state = 'OPEN'"
              " WHERE i.namespace_id = %s AND i.id = %s", ns, instance_id)


def s_step_after_the_intent(conn: Any, ns: bytes, instance_id: bytes) -> None:
    sql(conn, "UPDATE weave_steps st JOIN weave_instances i ON i.namespace_id ="
              " st.namespace_id AND i.id = st.instance_id SET st.created_at ="
              " i.stop_requested_at + INTERVAL 1 SECOND WHERE i.namespace_id = %s"
              " AND i.id = %s", ns, instance_id)


def s_ended_against_the_intent(conn: Any, ns: bytes, instance_id: bytes) -> None:
    sql(conn, "UPDATE weave_instances SET state = 'FAILED', completed_at = UTC_TIMESTAMP(6)"
              " WHERE namespace_id = %s AND id = %s", ns, instance_id)


STOP_CORRUPTIONS: list[Callable[[Any, bytes, bytes], None]] = [
    s_gate_reopened, s_step_after_the_intent, s_ended_against_the_intent]


@pytest.mark.parametrize("corrupt", STOP_CORRUPTIONS, ids=lambda fn: fn.__name__[2:])
async def test_the_checker_reports_each_stop_corruption(
    scratch_db: Database, scratch_conn: pymysql.connections.Connection[Any],
    corrupt: Callable[[Any, bytes, bytes], None],
) -> None:
    """``stop_intent`` on a cancelled instance: its gate reopened, a step created after the
    intent, an end its intent does not allow (CANCEL ending FAILED). The engine's part (a
    stopped instance keeping a LIVE activation, a FAILURE ending CANCELLED) is
    tests/integration/weave/test_stop.py's."""
    damaged, instance_id = await _stopping_instance(scratch_db)
    bystander, _ = await _stopping_instance(scratch_db)
    ns = damaged.namespace_id
    assert check(scratch_conn, [ns]) == []
    corrupt(scratch_conn, ns, instance_id)
    found = check(scratch_conn, [ns])
    assert "stop_intent" in codes(found), found
    assert check(scratch_conn, [bystander.namespace_id]) == []
    assert "stop_intent" in codes(check(scratch_conn))  # unscoped sees it too


def test_every_code_has_a_corruption_test() -> None:
    from tests.support.invariants import CODES

    covered = ({code for code, _ in CORRUPTIONS} | {code for code, _ in FLOW_CORRUPTIONS}
               | {code for code, _ in RELAY_CORRUPTIONS}
               | {"stuck", "missing_task", "one_run_per_instant", "task_owner",
                  "delivery_stuck", "live_activation", "workflow_inbox", "instance_state",
                  "inbox_outcome", "wait_pending_advance",
                  # tests/integration/weave/test_signals.py (real signals through the engine)
                  "wait_winner",
                  # tests/integration/weave/test_polls.py
                  "poll_rounds",
                  # tests/integration/weave/test_pause.py
                  "pause_control", "step_hold",
                  # test_the_checker_reports_each_stop_corruption and
                  # tests/integration/weave/test_stop.py
                  "stop_intent"})
    assert covered == set(CODES)

"""A Hypothesis stateful model of keyed concurrency permits, run against the real database.

The machine drives the real lease kernel (orbit_common.pulse.leases, and interventions for a
withdrawn offer) on one tenant with two queues and three worker sessions, on tasks spread over
three concurrency keys (shared by both queues) and unkeyed ones, in a random order: add tasks,
claim (a small batch, or everything claimable), start, finish (succeeded, failed retryable,
failed for good), lapse a live offer or execution lease (SQL moves it into the past: database
time decides), run recovery, withdraw an offer by cancelling its task.

The model tracks each key's holder and the tokens granted to it, in order. After every step:
no key has two valid permits, and the valid permit of each key is the model's holder's (a
lapsed lease keeps the key until recovery ends it); the tokens of each key, in grant order
(acquired_at, then token), are exactly the ones the claims returned and strictly increase; the
task states agree with the model; the invariant checker is green. Each claim must also grant
something when anything is claimable (a held key never blocks the others), and a claim of
everything must grant one task of every free key and every unkeyed task.

Each example gets its own event loop, pool and tenant; the run is derandomized, with modest
example and step counts (about 20-30 s), and must cover every release reason (MUST_COVER).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import pymysql
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.platform import credentials
from orbit_common.pulse import interventions, leases
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant
from orbit_common.pulse.workers import QueueRef, Session
from tests.conftest import Tenant, make_tenant
from tests.support import held
from tests.support.invariants import check
from tests.support.lease_fixtures import add_tasks, make_queue, open_session

T = TypeVar("T")

KEYS: tuple[bytes | None, ...] = (b"acct-1", b"acct-2", b"acct-3", None)
LIVE = frozenset({"LEASED", "RUNNING"})
# Release reasons seen over the whole run: every way a permit ends must be exercised.
RELEASES: Counter[str] = Counter()
MUST_COVER = frozenset({"SUCCEEDED", "FAILED", "OFFER_EXPIRED", "LEASE_EXPIRED", "WITHDRAWN"})
OUTCOMES = ("succeeded", "failed-retryable", "failed-final")


def ref(grant: Grant) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token, generation=grant.generation)


@attrs.define
class TaskModel:
    number: int
    id: bytes = attrs.field(repr=lambda b: b.hex())
    queue: int
    key: bytes | None
    rerun_safe: bool
    max_attempts: int
    state: str = "WAITING"
    attempts_used: int = 0
    starts_used: int = 0  # the retry budget counts approved starts
    offer_lapses: int = 0
    current: Grant | None = attrs.field(default=None, repr=lambda g: g and f"gen{g.generation}")
    lapsed: bool = False
    # A lost execution lease re-run (re-run-safe, budget left) carries an uncertain effect until
    # an attempt succeeds; a final failure, a capped lapse or a cancel then ends in NEEDS_REVIEW
    # (decisions._unsettled: uncertainty may not sit on a final state).
    uncertain: bool = False

    def unsettled(self, state: str) -> str:
        return "NEEDS_REVIEW" if self.uncertain else state


class KeyedPermits(RuleBasedStateMachine):
    """The model; see the module docstring."""

    def __init__(self, url: DatabaseUrl) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.conn: pymysql.connections.Connection[Any] = connect_sync(url, autocommit=True)
        self.db: Database = self.run(open_database(url, minsize=1, maxsize=2))
        self.tenant: Tenant = self.run(make_tenant(self.db))
        self.who: credentials.Principal = self.run(self.db.read(
            "test.auth", lambda cur: credentials.authenticate(cur, self.tenant.api_key)))
        self.queues: list[QueueRef] = [self.run(make_queue(self.db, self.tenant))
                                       for _ in range(2)]
        self.sessions: list[Session] = [self.run(open_session(
            self.db, self.tenant, self.queues, instance_key=f"worker-{i}")) for i in range(3)]
        self.tasks: dict[bytes, TaskModel] = {}
        self.holder: dict[bytes, bytes] = {}  # key -> the task whose live attempt holds it
        self.tokens: dict[bytes, list[int]] = {k: [] for k in KEYS if k is not None}

    def run(self, step: Awaitable[T]) -> T:
        return self.loop.run_until_complete(step)

    def teardown(self) -> None:
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT release_reason, COUNT(*) FROM pulse_permits"
                            " WHERE namespace_id = %s AND released_at IS NOT NULL"
                            " GROUP BY release_reason", (self.tenant.namespace_id,))
                for reason, count in cur.fetchall():
                    RELEASES[reason] += count
            self.run(self.db.close())
            self.run(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
            self.conn.close()

    # --- helpers -------------------------------------------------------------------------

    def pick(self, data: st.DataObject, tasks: list[TaskModel], label: str) -> TaskModel:
        numbers = [t.number for t in tasks]
        number = data.draw(st.sampled_from(numbers), label=label)
        return tasks[numbers.index(number)]

    def claimable(self, queue: int) -> list[TaskModel]:
        return [t for t in self.tasks.values() if t.queue == queue and t.state == "WAITING"
                and t.starts_used < t.max_attempts]

    def eligible(self, queue: int) -> list[TaskModel]:
        """Claimable now: unkeyed, or on a key nobody holds."""
        return [t for t in self.claimable(queue) if t.key is None or t.key not in self.holder]

    def in_state(self, *states: str, lapsed: bool = False) -> list[TaskModel]:
        return [t for t in self.tasks.values()
                if t.state in states and t.current is not None and t.lapsed == lapsed]

    def end(self, task: TaskModel, state: str) -> None:
        """The task's live attempt ended (its permit, if any, was released with it)."""
        if task.key is not None:
            assert self.holder.pop(task.key) == task.id
        task.state, task.current, task.lapsed = state, None, False

    # --- actions -------------------------------------------------------------------------

    def add(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(KEYS), label="key")
        queue = data.draw(st.integers(0, 1), label="queue")
        count = data.draw(st.integers(1, 3), label="count")
        rerun_safe = data.draw(st.booleans(), label="rerun_safe")
        max_attempts = data.draw(st.integers(1, 3), label="max_attempts")
        for task_id in self.run(add_tasks(self.db, self.tenant, self.queues[queue], count,
                                          concurrency_key=key, rerun_safe=rerun_safe,
                                          max_attempts=max_attempts)):
            self.tasks[task_id] = TaskModel(number=len(self.tasks), id=task_id, queue=queue,
                                            key=key, rerun_safe=rerun_safe,
                                            max_attempts=max_attempts)

    def claim(self, data: st.DataObject, *, everything: bool = False) -> None:
        queue = data.draw(st.integers(0, 1), label="queue")
        worker = data.draw(st.integers(0, 2), label="worker")
        limit = 64 if everything else data.draw(st.integers(1, 4), label="limit")
        eligible = self.eligible(queue)
        grants = self.run(self.db.transaction("test.claim", lambda cur: leases.claim(
            cur, self.sessions[worker], self.queues[queue], limit)))
        assert len(grants) <= limit
        if eligible:
            assert grants, "something was claimable, nothing was granted (head-of-line?)"
        keys = [g.concurrency_key for g in grants if g.concurrency_key is not None]
        assert len(keys) == len(set(keys)), "two grants of one key in one claim"
        if everything:
            free = {t.key for t in eligible if t.key is not None}
            assert set(keys) == free
            assert (sum(1 for g in grants if g.concurrency_key is None)
                    == sum(1 for t in eligible if t.key is None))
        for grant in grants:
            task = self.tasks[grant.task_id]
            assert task in eligible
            assert grant.concurrency_key == task.key
            if task.key is None:
                assert grant.concurrency_token is None
            else:
                assert grant.concurrency_token is not None
                assert all(grant.concurrency_token > t for t in self.tokens[task.key])
                self.tokens[task.key].append(grant.concurrency_token)
                self.holder[task.key] = task.id
            task.state, task.current, task.lapsed = "LEASED", grant, False
            task.attempts_used = grant.generation

    def claim_everything(self, data: st.DataObject) -> None:
        self.claim(data, everything=True)

    def start(self, data: st.DataObject) -> None:
        task = self.pick(data, self.in_state("LEASED"), "task")
        assert task.current is not None
        grant = task.current
        (outcome,) = self.run(self.db.transaction("test.start", lambda cur: held.start(
            cur, self.tenant.namespace_id, [ref(grant)])))
        assert outcome.approved, outcome
        task.state, task.offer_lapses = "RUNNING", 0
        task.starts_used += 1

    def finish(self, data: st.DataObject) -> None:
        task = self.pick(data, self.in_state("RUNNING"), "task")
        kind = data.draw(st.sampled_from(OUTCOMES), label="outcome")
        assert task.current is not None
        report = FinishReport(
            ref=ref(task.current), report_id=b"r1",
            outcome="succeeded" if kind == "succeeded" else "failed",
            result="{}" if kind == "succeeded" else None,
            error=None if kind == "succeeded" else {"type": kind},
            retryable=kind == "failed-retryable")
        (done,) = self.run(self.db.transaction("test.finish", lambda cur: held.finish(
            cur, self.tenant.namespace_id, [report])))
        expected = ("SUCCEEDED" if kind == "succeeded"
                    else "WAITING" if (kind == "failed-retryable"
                                       and task.starts_used < task.max_attempts)
                    else task.unsettled("FAILED"))
        assert (done.accepted, done.task_state) == (True, expected), done
        if kind == "succeeded":
            task.uncertain = False
        self.end(task, expected)

    def lapse(self, data: st.DataObject) -> None:
        """The holder goes silent: its offer or lease is moved into the past. It keeps the key
        until recovery ends the attempt."""
        task = self.pick(data, self.in_state("LEASED", "RUNNING"), "task")

        async def body(cur: Any) -> None:
            await cur.execute("SELECT UTC_TIMESTAMP(6) - INTERVAL 1 SECOND AS past")
            past = (await cur.fetchone())["past"]
            await cur.execute("UPDATE pulse_tasks SET lease_expires_at = %s"
                              " WHERE namespace_id = %s AND id = %s",
                              (past, self.tenant.namespace_id, task.id))
            await cur.execute("UPDATE pulse_attempts SET lease_expires_at = %s"
                              " WHERE namespace_id = %s AND id = %s",
                              (past, self.tenant.namespace_id, task.current.attempt_id))

        assert task.current is not None
        self.run(self.db.transaction("test.lapse", body))
        task.lapsed = True

    def recover(self, data: st.DataObject) -> None:
        lapsed = [t for t in self.tasks.values() if t.lapsed]
        handled = self.run(self.db.transaction(
            "test.recover", lambda cur: leases.recover_expired(cur, 1000)))
        assert handled >= len(lapsed)
        for task in lapsed:
            budget = task.starts_used < task.max_attempts
            if task.state == "LEASED":  # a lapsed offer spends no budget; lapses are capped
                task.offer_lapses += 1
                self.end(task, "WAITING" if task.offer_lapses < leases.DEFAULT_MAX_OFFER_LAPSES
                         else task.unsettled("FAILED"))
            else:
                task.uncertain = True
                self.end(task, "WAITING" if task.rerun_safe and budget else "NEEDS_REVIEW")

    def withdraw(self, data: st.DataObject) -> None:
        """Cancelling a LEASED task withdraws its offer and releases its key at once."""
        task = self.pick(data, self.in_state("LEASED"), "task")
        answer = self.run(interventions.cancel_task(
            self.db, self.who, namespace=self.tenant.namespace, task_id=task.id,
            reason="model"))
        assert answer.body["state"] == task.unsettled("CANCELLED")
        self.end(task, task.unsettled("CANCELLED"))

    # --- the one rule: a weighted choice among the actions possible now --------------------

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        possible = [name for name, weight, can in ACTIONS if can(self) for _ in range(weight)]
        getattr(self, data.draw(st.sampled_from(possible), label="action"))(data)

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def one_valid_permit_per_key_held_by_the_models_holder(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT l.scope_key, p.task_id, p.token FROM pulse_permits p"
                        " JOIN pulse_concurrency_limits l ON l.namespace_id = p.namespace_id"
                        " AND l.id = p.limit_id WHERE p.namespace_id = %s"
                        " AND p.released_at IS NULL", (self.tenant.namespace_id,))
            valid = cur.fetchall()
        keys = [row[0] for row in valid]
        assert len(keys) == len(set(keys)), f"a key with two valid permits: {valid}"
        assert {row[0]: row[1] for row in valid} == self.holder
        assert all(self.tokens[row[0]][-1] == row[2] for row in valid)

    @invariant()
    def tokens_rise_in_grant_order(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT l.scope_key, p.token FROM pulse_permits p"
                        " JOIN pulse_concurrency_limits l ON l.namespace_id = p.namespace_id"
                        " AND l.id = p.limit_id WHERE p.namespace_id = %s"
                        " ORDER BY l.scope_key, p.acquired_at, p.token",
                        (self.tenant.namespace_id,))
            found: dict[bytes, list[int]] = {k: [] for k in self.tokens}
            for key, token in cur.fetchall():
                found[key].append(token)
        assert found == self.tokens
        for tokens in found.values():
            assert all(b > a for a, b in itertools.pairwise(tokens))

    @invariant()
    def task_states_agree(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT id, state, effect_uncertain FROM pulse_tasks"
                        " WHERE namespace_id = %s", (self.tenant.namespace_id,))
            states = {task_id: (state, bool(uncertain))
                      for task_id, state, uncertain in cur.fetchall()}
        assert states == {t.id: (t.state, t.uncertain) for t in self.tasks.values()}

    @invariant()
    def the_checker_is_green(self) -> None:
        assert check(self.conn, [self.tenant.namespace_id]) == []


# (action, weight, possible in this state?)
ACTIONS: tuple[tuple[str, int, Callable[[KeyedPermits], bool]], ...] = (
    ("add", 3, lambda m: len(m.tasks) < 16),
    ("claim", 4, lambda m: any(t.state == "WAITING" for t in m.tasks.values())),
    ("claim_everything", 1, lambda m: any(t.state == "WAITING" for t in m.tasks.values())),
    ("start", 4, lambda m: bool(m.in_state("LEASED"))),
    ("finish", 5, lambda m: bool(m.in_state("RUNNING"))),
    ("lapse", 2, lambda m: bool(m.in_state("LEASED", "RUNNING"))),
    ("recover", 3, lambda m: any(t.lapsed for t in m.tasks.values())),
    ("withdraw", 1, lambda m: bool(m.in_state("LEASED"))),
)


def test_keyed_permits_match_their_model(db_url: DatabaseUrl) -> None:
    RELEASES.clear()
    run_state_machine_as_test(
        lambda: KeyedPermits(db_url),
        # No shrink phase, as in test_lease_model: each step is several real transactions.
        settings=settings(max_examples=15, stateful_step_count=30, deadline=None,
                          derandomize=True, database=None, print_blob=False,
                          phases=(Phase.explicit, Phase.generate),
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much]),
    )
    assert set(RELEASES) >= MUST_COVER, sorted(MUST_COVER - set(RELEASES))

"""A Hypothesis stateful model of the lease protocol, run against the real database.

The machine drives the real functions (orbit_common.pulse.leases and .interventions) on one
tenant with two queues (one capped at two concurrent attempts) and two worker instances, in a
random order: add tasks, claim, start, renew, finish with each outcome, lapse a live lease (SQL
moves it into the past, as if the holder went silent), recover, cancel, review, manual retry,
reconnect a worker (fencing its old session), and late, duplicated, reordered and forged
reports. A plain Python model says what every task must be after each step; after every step
the invariant checker must be empty, the database must agree with the model (state, attempts,
current grant, uncertainty, cancel intent), late evidence must be exactly what authentic stale
reports left, and a confirmed success must still stand.

One rule draws an action with fixed weights among those possible in the current state (see
ACTIONS), so the protocol's main path is not starved; drawn tasks, grants and reports carry short
names (task3/gen2) in a failing run's printout. Each example gets its own event loop (created
and closed here), its own pool and its own tenant. The run is derandomized and deterministic: the
actions never re-queue two tasks at one instant, whose claim order would follow their random
ids. The run must also cover every outcome path (MUST_COVER), so re-weighting cannot quietly
hollow it out.

Two example-based tests cover the same report twice in one finish batch.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import pymysql
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.platform import credentials
from orbit_common.pulse import interventions, leases
from orbit_common.pulse.leases import AttemptRef, FinishOutcome, FinishReport, Grant
from orbit_common.pulse.workers import QueueRef, Session, SessionLost
from tests.conftest import Tenant, make_tenant
from tests.support import held
from tests.support.invariants import check
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, task_row
from tests.support.waiting import statements_waiting, until

T = TypeVar("T")

# Task event types seen over a whole run (every example adds its own): the run must keep
# covering each path of the protocol, whatever the action weights become.
COVERED: Counter[str] = Counter()
MUST_COVER = frozenset(f"task.{name}" for name in (
    "accepted", "leased", "started", "succeeded", "retry_scheduled", "non_retryable",
    "attempts_exhausted", "outcome_unknown", "cancel_requested", "cancelled", "offer_expired",
    "outcome_unknown_retry", "lease_lost", "lease_lost_retry", "reviewed_succeeded",
    "reviewed_failed"))

LIVE = frozenset({"LEASED", "RUNNING"})
CAPPED_QUEUE_LIMIT = 2

# What a worker may report: (outcome, retryable, result, error). Two successes with different
# results make "same report id, other content" a real conflict.
REPORTS: dict[str, tuple[str, bool, str | None, dict[str, Any] | None]] = {
    "succeeded": ("succeeded", False, '{"ok": true}', None),
    "succeeded-other": ("succeeded", False, '{"ok": 2}', None),
    "failed-retryable": ("failed", True, None, {"type": "Flaky"}),
    "failed-final": ("failed", False, None, {"type": "Bad"}),
    "unknown": ("unknown", False, None, {"type": "Timeout"}),
    "cancelled": ("cancelled", False, None, {"type": "stopped"}),
}
REPORT_IDS = (b"r1", b"r2")


def ref(grant: Grant, *, token: str | None = None, generation: int | None = None) -> AttemptRef:
    return AttemptRef(attempt_id=grant.attempt_id, token=grant.token if token is None else token,
                      generation=grant.generation if generation is None else generation)


def make_report(grant: Grant, kind: str, report_id: bytes, **ref_changes: Any) -> FinishReport:
    outcome, retryable, result, error = REPORTS[kind]
    return FinishReport(ref=ref(grant, **ref_changes), report_id=report_id, outcome=outcome,
                        result=result, error=error, retryable=retryable)


@attrs.define
class TaskModel:
    number: int  # the model's own name for it: task<number>, in order of creation
    id: bytes = attrs.field(repr=lambda b: b.hex())
    queue: int
    rerun_safe: bool
    max_attempts: int
    state: str = "WAITING"
    attempts_used: int = 0  # grants (generations)
    starts_used: int = 0  # approved starts: the retry budget
    offer_lapses: int = 0  # consecutive lapsed offers
    current: Grant | None = attrs.field(  # the live grant (LEASED/RUNNING)
        default=None, repr=lambda g: f"gen{g.generation}" if g else "None")
    lapsed: bool = False  # the live lease was moved into the past and not yet recovered
    uncertain: bool = False
    cancel_requested: bool = False
    retried: bool = False
    confirmed_success: bool = False
    grants: list[Grant] = attrs.field(factory=list, repr=False)


@attrs.frozen
class Answer:
    """What a finish report must be answered with (the receipt's content)."""

    accepted: bool
    reason: str | None
    task_state: str | None

    @classmethod
    def of(cls, outcome: FinishOutcome) -> Answer:
        return cls(accepted=outcome.accepted, reason=outcome.reason,
                   task_state=outcome.task_state)


class LeaseProtocol(RuleBasedStateMachine):
    """The model; see the module docstring."""

    def __init__(self, url: DatabaseUrl) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.conn: pymysql.connections.Connection[Any] = connect_sync(url, autocommit=True)
        self.db: Database = self.run(open_database(url, minsize=1, maxsize=2))
        self.tenant: Tenant = self.run(make_tenant(self.db))
        self.who: credentials.Principal = self.run(self.db.read(
            "test.auth", lambda cur: credentials.authenticate(cur, self.tenant.api_key)))
        self.queues: list[QueueRef] = [
            self.run(make_queue(self.db, self.tenant, max_attempts=3)),
            self.run(make_queue(self.db, self.tenant, max_concurrent=CAPPED_QUEUE_LIMIT)),
        ]
        self.sessions: list[Session] = [self.run(open_session(
            self.db, self.tenant, self.queues, instance_key=f"worker-{i}")) for i in range(2)]
        self.fenced: list[Session] = []
        self.tasks: dict[bytes, TaskModel] = {}
        self.grants: list[Grant] = []
        # Receipts: (attempt, report id) → (digest, answer); accepted ones also by content.
        self.receipts: dict[tuple[bytes, bytes], tuple[bytes, Answer]] = {}
        self.accepted: dict[tuple[bytes, bytes], Answer] = {}
        self.sent: list[FinishReport] = []
        self.evidence: Counter[tuple[bytes, str]] = Counter()
        self.fresh = itertools.count()

    def run(self, step: Awaitable[T]) -> T:
        return self.loop.run_until_complete(step)

    def teardown(self) -> None:
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT event_type, COUNT(*) FROM orbit_events WHERE namespace_id = %s"
                            " AND aggregate_type = 'task' GROUP BY event_type",
                            (self.tenant.namespace_id,))
                for event_type, count in cur.fetchall():
                    COVERED[event_type] += count
            self.run(self.db.close())
            self.run(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
            self.conn.close()

    # --- helpers -------------------------------------------------------------------------

    def name(self, item: TaskModel | Grant | FinishReport) -> str:
        """Short, run-independent names for the drawn items (printed in a failing run)."""
        if isinstance(item, TaskModel):
            return f"task{item.number}"
        if isinstance(item, Grant):
            return f"task{self.tasks[item.task_id].number}/gen{item.generation}"
        grant = next(g for g in self.grants if g.attempt_id == item.ref.attempt_id)
        return f"{self.name(grant)} {item.outcome} {item.report_id.decode()}"

    def pick(self, data: st.DataObject, items: list[Any], label: str) -> Any:
        names = [self.name(i) for i in items]
        return items[names.index(data.draw(st.sampled_from(names), label=label))]

    def task_of(self, grant: Grant) -> TaskModel:
        return self.tasks[grant.task_id]

    def live_on(self, queue: int) -> int:
        return sum(1 for t in self.tasks.values() if t.queue == queue and t.state in LIVE)

    def holds(self, grant: Grant) -> bool:
        task = self.task_of(grant)
        return task.current is not None and task.current.attempt_id == grant.attempt_id

    def running_grants(self) -> list[Grant]:
        return [t.current for t in self.tasks.values()
                if t.state == "RUNNING" and t.current is not None and not t.lapsed]

    def live_grants(self) -> list[Grant]:
        return [t.current for t in self.tasks.values()
                if t.current is not None and not t.lapsed]

    def end_attempt(self, task: TaskModel, state: str, *, uncertain: bool) -> None:
        task.state = state
        task.uncertain = uncertain
        task.current = None
        task.lapsed = False
        if state == "SUCCEEDED":
            task.confirmed_success = True

    def predict_finish(self, report: FinishReport,
                       pending: set[bytes]) -> tuple[Answer | None, bool, str | None]:
        """(answer, is a replay, evidence kind to expect) for one report, applying the model.

        ``pending``: attempts already finished earlier in the same batch. A replay is looked
        up in the receipts as they were before the batch (as the implementation does)."""
        grant = next(g for g in self.grants if g.attempt_id == report.ref.attempt_id)
        task = self.task_of(grant)
        key = (report.ref.attempt_id, report.report_id)
        if key in self.receipts:
            digest, answer = self.receipts[key]
            if digest != report.digest():
                return None, False, None  # ReportConflict
            return answer, True, None
        if (report.ref.attempt_id, report.digest()) in self.accepted:
            return self.accepted[(report.ref.attempt_id, report.digest())], True, None
        if report.ref.token != grant.token or report.ref.generation != grant.generation:
            return Answer(False, "invalid_attempt", None), False, None
        kind = report.outcome.upper()
        if grant.attempt_id in pending or not self.holds(grant) or task.state != "RUNNING":
            return Answer(False, "attempt_finished", None), False, kind
        if task.lapsed:
            return Answer(False, "lease_expired", None), False, kind
        if report.outcome == "cancelled" and not task.cancel_requested:
            return Answer(False, "cancel_not_requested", None), False, kind
        pending.add(grant.attempt_id)
        if report.outcome == "succeeded":
            self.end_attempt(task, "SUCCEEDED", uncertain=False)
        elif report.outcome == "unknown":
            # The safe-retry rule, as for a lost lease.
            again = (task.rerun_safe and not task.cancel_requested
                     and task.starts_used < task.max_attempts)
            self.end_attempt(task, "WAITING" if again else "NEEDS_REVIEW", uncertain=True)
        elif report.outcome == "cancelled":
            self.end_attempt(task, "NEEDS_REVIEW" if task.uncertain else "CANCELLED",
                             uncertain=task.uncertain)
        elif (report.retryable and not task.cancel_requested
              and task.starts_used < task.max_attempts):
            self.end_attempt(task, "WAITING", uncertain=task.uncertain)
        else:
            self.end_attempt(task, "NEEDS_REVIEW" if task.uncertain else "FAILED",
                             uncertain=task.uncertain)
        return Answer(True, None, task.state), False, None

    def send(self, reports: list[FinishReport]) -> None:
        """Send one finish batch and check every answer against the model."""
        pending: set[bytes] = set()
        # Receipts are looked up as they were before the batch; task states change in order.
        predicted = [self.predict_finish(report, pending) for report in reports]
        assert all(answer is not None for answer, _, _ in predicted), "conflicts are not sent"
        outcomes = self.run(self.finish(reports))
        assert len(outcomes) == len(reports)
        for report, outcome, (answer, replayed, evidence) in zip(
                reports, outcomes, predicted, strict=True):
            assert answer is not None
            assert Answer.of(outcome) == answer, (report.outcome, report.report_id)
            assert outcome.replayed == replayed
            if evidence is not None:
                self.evidence[(report.ref.attempt_id, evidence)] += 1
            if answer.reason != "invalid_attempt" and not replayed:
                self.receipts[(report.ref.attempt_id, report.report_id)] = (report.digest(),
                                                                           answer)
                if answer.accepted:
                    self.accepted[(report.ref.attempt_id, report.digest())] = answer
                self.sent.append(report)

    async def finish(self, reports: list[FinishReport]) -> list[FinishOutcome]:
        return await self.db.transaction("test.finish", lambda cur: held.finish(
            cur, self.tenant.namespace_id, reports))

    async def lapse(self, task_id: bytes) -> None:
        async def body(cur: Any) -> None:
            await cur.execute("SELECT UTC_TIMESTAMP(6) - INTERVAL 1 SECOND AS past")
            past = (await cur.fetchone())["past"]
            await cur.execute("UPDATE pulse_tasks SET lease_expires_at = %s"
                              " WHERE namespace_id = %s AND id = %s",
                              (past, self.tenant.namespace_id, task_id))
            await cur.execute("UPDATE pulse_attempts SET lease_expires_at = %s"
                              " WHERE namespace_id = %s AND task_id = %s"
                              " AND state IN ('OFFERED', 'RUNNING')",
                              (past, self.tenant.namespace_id, task_id))

        await self.db.transaction("test.lapse", body)

    # --- rules: tasks and claims ---------------------------------------------------------

    @initialize(count=st.integers(2, 4), rerun_safe=st.booleans(),
                max_attempts=st.integers(1, 3))
    def first_tasks(self, count: int, rerun_safe: bool, max_attempts: int) -> None:
        for queue in (0, 1):
            self.add_tasks(count, queue, rerun_safe if queue else not rerun_safe, max_attempts)

    def add(self, data: st.DataObject) -> None:
        self.add_tasks(data.draw(st.integers(1, 3), label="count"),
                       data.draw(st.integers(0, 1), label="queue"),
                       data.draw(st.booleans(), label="rerun_safe"),
                       data.draw(st.integers(1, 3), label="max_attempts"))

    def add_tasks(self, count: int, queue: int, rerun_safe: bool, max_attempts: int) -> None:
        for task_id in self.run(add_tasks(self.db, self.tenant, self.queues[queue], count,
                                          rerun_safe=rerun_safe, max_attempts=max_attempts)):
            self.tasks[task_id] = TaskModel(number=len(self.tasks), id=task_id, queue=queue,
                                            rerun_safe=rerun_safe, max_attempts=max_attempts)

    def claim(self, data: st.DataObject) -> None:
        worker = data.draw(st.integers(0, 1), label="worker")
        queue = data.draw(st.integers(0, 1), label="queue")
        limit = data.draw(st.integers(1, 3), label="limit")
        session = self.sessions[worker]
        grants = self.run(self.db.transaction("test.claim", lambda cur: leases.claim(
            cur, session, self.queues[queue], limit)))
        claimable = {t.id for t in self.tasks.values() if t.queue == queue
                     and t.state == "WAITING" and t.starts_used < t.max_attempts}
        room = (CAPPED_QUEUE_LIMIT - self.live_on(queue)) if queue == 1 else limit
        assert len(grants) == min(limit, len(claimable), room)
        assert len({g.task_id for g in grants}) == len(grants)
        for grant in grants:
            assert grant.task_id in claimable
            task = self.tasks[grant.task_id]
            # Generations strictly increase: one more than every earlier grant of the task.
            assert grant.generation == task.attempts_used + 1
            assert all(grant.generation > g.generation for g in task.grants)
            assert task.current is None, "a second live grant"
            task.state, task.current, task.lapsed = "LEASED", grant, False
            task.attempts_used = grant.generation
            task.grants.append(grant)
            self.grants.append(grant)

    def reconnect(self, data: st.DataObject) -> None:
        """A new session of the same instance fences the old one; grants survive it."""
        worker = data.draw(st.integers(0, 1), label="worker")
        self.fenced.append(self.sessions[worker])
        self.sessions[worker] = self.run(open_session(
            self.db, self.tenant, self.queues, instance_key=f"worker-{worker}"))
        assert self.sessions[worker].generation == self.fenced[-1].generation + 1
        old = self.fenced[-1]
        with pytest.raises(SessionLost):
            self.run(self.db.transaction("test.claim", lambda cur: leases.claim(
                cur, old, self.queues[0], 3)))


    # --- rules: start and renew ----------------------------------------------------------

    def start_expecting(self, grant: Grant) -> None:
        task = self.task_of(grant)
        (outcome,) = self.run(self.db.transaction("test.start", lambda cur: held.start(
            cur, self.tenant.namespace_id, [ref(grant)])))
        if self.holds(grant) and task.state == "RUNNING" and task.lapsed:
            pass  # approved today, though the lease lapsed: see test_a_repeated_start_after_...
        elif self.holds(grant) and task.state == "RUNNING":
            assert outcome.approved  # a repeated start is approved again
        elif self.holds(grant) and task.lapsed:
            assert (outcome.approved, outcome.reason) == (False, "offer_expired")
        elif self.holds(grant):
            assert outcome.approved, outcome.reason
            task.state = "RUNNING"
            task.starts_used += 1
            task.offer_lapses = 0
        else:
            assert (outcome.approved, outcome.reason) == (False, "attempt_finished")

    def start_offer(self, data: st.DataObject) -> None:
        self.start_expecting(self.pick(data, [t.current for t in self.tasks.values()
                                              if t.state == "LEASED" and t.current], "grant"))

    def start_any(self, data: st.DataObject) -> None:
        """Starts arriving late, twice, or after the grant was withdrawn or expired."""
        self.start_expecting(self.pick(data, self.grants, "grant"))

    def renew_expecting(self, grant: Grant) -> None:
        task = self.task_of(grant)
        (outcome,) = self.run(self.db.transaction("test.renew", lambda cur: held.renew(
            cur, self.tenant.namespace_id, [ref(grant)])))
        assert outcome.cancel_requested == task.cancel_requested
        if self.holds(grant) and task.state == "RUNNING" and not task.lapsed:
            assert outcome.renewed
            return
        expected = ("lease_expired" if self.holds(grant) and task.state == "RUNNING"
                    else "attempt_finished")
        assert (outcome.renewed, outcome.reason) == (False, expected)
        self.evidence[(grant.attempt_id, "RENEW")] += 1

    def renew_running(self, data: st.DataObject) -> None:
        self.renew_expecting(self.pick(data, self.running_grants(), "grant"))

    def renew_any(self, data: st.DataObject) -> None:
        self.renew_expecting(self.pick(data, self.grants, "grant"))

    # --- rules: finish -------------------------------------------------------------------

    def finish_running(self, data: st.DataObject) -> None:
        # A retryable failure twice as often: retries, exhausted budgets and second grants.
        kind = data.draw(st.sampled_from([*sorted(REPORTS), "failed-retryable"]), label="kind")
        grant = self.pick(data, self.running_grants(), "grant")
        self.send([make_report(grant, kind, self.free_report_id(grant, kind, data))])

    def finish_any(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(sorted(REPORTS)), label="kind")
        """A report from any grant ever made: current, withdrawn, lapsed or long replaced."""
        grant = self.pick(data, self.grants, "grant")
        self.send([make_report(grant, kind, self.free_report_id(grant, kind, data))])

    def report_with_an_old_generation(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(sorted(REPORTS)), label="kind")
        """An authentic report of generation G after G' > G was granted: rejected, evidence."""
        task = self.pick(data, [t for t in self.tasks.values() if len(t.grants) > 1], "task")
        grant = self.pick(data, task.grants[:-1], "grant")
        self.send([make_report(grant, kind, self.free_report_id(grant, kind, data))])

    def resend_a_report(self, data: st.DataObject) -> None:
        """A duplicated or reordered report: the original receipt, nothing else."""
        report = self.pick(data, self.sent, "report")
        expected = self.receipts[(report.ref.attempt_id, report.report_id)][1]
        outcomes = self.run(self.finish([report]))
        assert Answer.of(outcomes[0]) == expected
        assert outcomes[0].replayed

    def resend_under_another_id(self, data: st.DataObject) -> None:
        report = self.pick(data, self.sent, "report")
        other = next((rid for rid in (*REPORT_IDS, b"r3")
                      if (report.ref.attempt_id, rid) not in self.receipts), None)
        if other is not None:
            self.send([attrs.evolve(report, report_id=other)])

    def reuse_a_report_id_for_other_content(self, data: st.DataObject) -> None:
        report = self.pick(data, self.sent, "report")
        other = "succeeded-other" if report.result != REPORTS["succeeded-other"][2] else "unknown"
        grant = next(g for g in self.grants if g.attempt_id == report.ref.attempt_id)
        conflicting = make_report(grant, other, report.report_id)
        with pytest.raises(leases.ReportConflict):
            self.run(self.finish([conflicting]))

    def forged_report(self, data: st.DataObject) -> None:
        """A wrong token or generation is not even evidence."""
        kind = data.draw(st.sampled_from(sorted(REPORTS)), label="kind")
        forgery = data.draw(st.sampled_from(["token", "newer", "older"]), label="forgery")
        grant = self.pick(data, self.grants, "grant")
        change: dict[str, Any] = (
            {"token": "x" * 43} if forgery == "token" else
            {"generation": grant.generation + 1} if forgery == "newer" else
            {"generation": grant.generation - 1})
        self.send([make_report(grant, kind, b"forged-%d" % next(self.fresh), **change)])
        (renewed,) = self.run(self.db.transaction("test.renew", lambda cur: held.renew(
            cur, self.tenant.namespace_id, [ref(grant, **change)])))
        assert (renewed.renewed, renewed.reason) == (False, "invalid_attempt")
        (started,) = self.run(self.db.transaction("test.start", lambda cur: held.start(
            cur, self.tenant.namespace_id, [ref(grant, **change)])))
        assert (started.approved, started.reason) == (False, "invalid_attempt")

    def finish_a_mixed_batch(self, data: st.DataObject) -> None:
        """Several attempts' reports in one batch, answered per item."""
        names = [self.name(g) for g in self.grants]
        chosen = data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=4,
                                    unique=True), label="grants")
        grants = [self.grants[names.index(n)] for n in chosen]
        reports = []
        for i, grant in enumerate(grants):
            # At most one retry per batch: two tasks re-queued at one instant would be claimed
            # in the order of their random ids (see lapse_a_lease).
            kinds = sorted(REPORTS) if i == 0 else sorted(set(REPORTS) - {"failed-retryable"})
            kind = data.draw(st.sampled_from(kinds), label="kind")
            reports.append(make_report(grant, kind, self.free_report_id(grant, kind, data)))
        self.send(reports)

    def free_report_id(self, grant: Grant, kind: str, data: st.DataObject) -> bytes:
        """A report id that does not conflict: unused for this attempt, or used for the same
        content (then the report is a re-send)."""
        digest = make_report(grant, kind, b"").digest()
        usable = [rid for rid in REPORT_IDS
                  if (grant.attempt_id, rid) not in self.receipts
                  or self.receipts[(grant.attempt_id, rid)][0] == digest]
        if not usable:
            return b"r-%d" % next(self.fresh)
        return data.draw(st.sampled_from(usable), label="report id")

    # --- rules: expiry and recovery ------------------------------------------------------

    def lapse_a_lease(self, data: st.DataObject) -> None:
        """One lapsed lease at a time: recovering two at once would re-queue them at the same
        instant, and the claim order between them (by random id) would make the run
        non-deterministic."""
        grant = self.pick(data, self.live_grants(), "grant")
        self.run(self.lapse(grant.task_id))
        self.task_of(grant).lapsed = True

    def lapse_an_offer(self, data: st.DataObject) -> None:
        grant = self.pick(data, [t.current for t in self.tasks.values()
                                 if t.state == "LEASED" and t.current], "grant")
        self.run(self.lapse(grant.task_id))
        self.task_of(grant).lapsed = True

    def lose_a_running_lease(self, data: st.DataObject) -> None:
        """A worker goes silent mid-task and the recovery scan runs (two steps in one, so
        histories with an uncertain effect are common enough to matter)."""
        grant = self.pick(data, self.running_grants(), "grant")
        self.run(self.lapse(grant.task_id))
        self.task_of(grant).lapsed = True
        self.recover(data)

    def claim_and_start(self, data: st.DataObject) -> None:
        """A worker's ordinary cycle: claim, then start every new offer at once."""
        before = set(self.grants_ids())
        self.claim(data)
        new = [g for g in self.grants if g.attempt_id not in before]
        if new:
            outcomes = self.run(self.db.transaction("test.start", lambda cur: held.start(
                cur, self.tenant.namespace_id, [ref(g) for g in new])))
            assert all(o.approved for o in outcomes)
            for grant in new:
                task = self.task_of(grant)
                task.state, task.offer_lapses = "RUNNING", 0
                task.starts_used += 1

    def grants_ids(self) -> list[bytes]:
        return [g.attempt_id for g in self.grants]

    def recover(self, data: st.DataObject) -> None:
        handled = self.run(self.db.transaction("test.recover",
                                               lambda cur: leases.recover_expired(cur, 1000)))
        lapsed = [t for t in self.tasks.values() if t.current is not None and t.lapsed]
        assert handled >= len(lapsed)
        for task in lapsed:
            budget = task.starts_used < task.max_attempts
            if task.state == "LEASED":
                # An offer that lapsed spent no budget; lapses are capped.
                task.offer_lapses += 1
                if task.cancel_requested:
                    self.end_attempt(task, "NEEDS_REVIEW" if task.uncertain else "CANCELLED",
                                     uncertain=task.uncertain)
                elif task.offer_lapses < leases.DEFAULT_MAX_OFFER_LAPSES:
                    self.end_attempt(task, "WAITING", uncertain=task.uncertain)
                else:
                    self.end_attempt(task, "NEEDS_REVIEW" if task.uncertain else "FAILED",
                                     uncertain=task.uncertain)
            elif task.rerun_safe and budget and not task.cancel_requested:
                self.end_attempt(task, "WAITING", uncertain=True)
            else:
                self.end_attempt(task, "NEEDS_REVIEW", uncertain=True)

    # --- rules: interventions ------------------------------------------------------------

    def cancel_expecting(self, task: TaskModel) -> None:
        def call() -> Any:
            return self.run(interventions.cancel_task(
                self.db, self.who, namespace=self.tenant.namespace, task_id=task.id,
                reason="model"))

        if task.state == "NEEDS_REVIEW":
            with pytest.raises(interventions.CancelNeedsReview):
                call()
            return
        answer = call()
        if task.state == "RUNNING":
            task.cancel_requested = True  # an intent: the worker must confirm it stopped
        elif task.state in ("WAITING", "LEASED"):
            task.cancel_requested = True
            self.end_attempt(task, "NEEDS_REVIEW" if task.uncertain else "CANCELLED",
                             uncertain=task.uncertain)
        assert answer.body["state"] == task.state  # a finished task is returned unchanged

    def cancel_running(self, data: st.DataObject) -> None:
        """A durable intent: the worker sees it in renewals and must confirm it stopped."""
        self.cancel_expecting(self.pick(
            data, [t for t in self.tasks.values() if t.state == "RUNNING"], "task"))

    def cancel_leased(self, data: st.DataObject) -> None:
        """Before the start: the offer is withdrawn at once."""
        self.cancel_expecting(self.pick(
            data, [t for t in self.tasks.values() if t.state == "LEASED"], "task"))

    def review(self, data: st.DataObject) -> None:
        decision = data.draw(st.sampled_from(["succeeded", "failed"]), label="decision")
        task = self.pick(data, [t for t in self.tasks.values() if t.state == "NEEDS_REVIEW"],
                         "task")
        revision = self.run(task_row(self.db, self.tenant, task.id))["revision"]
        self.run(interventions.review_task(
            self.db, self.who, namespace=self.tenant.namespace, task_id=task.id,
            decision=decision, reason="model", evidence_ref="MODEL-1", execution_ended=True,
            revision=revision))
        self.end_attempt(task, decision.upper(), uncertain=False)

    def manual_retry(self, data: st.DataObject) -> None:
        task = self.pick(data, [t for t in self.tasks.values()
                                if t.state in ("FAILED", "CANCELLED")], "task")

        def call() -> Any:
            return self.run(interventions.retry_task(
                self.db, self.who, namespace=self.tenant.namespace, task_id=task.id,
                reason="model", rerun_confirmed=True))

        if task.retried:
            with pytest.raises(interventions.AlreadyRetried):
                call()
            return
        answer = call()
        task.retried = True
        successor = bytes.fromhex(answer.body["id"])
        self.tasks[successor] = TaskModel(number=len(self.tasks), id=successor, queue=task.queue,
                                          rerun_safe=task.rerun_safe,
                                          max_attempts=task.max_attempts)

    def intervene_on_any_task(self, data: st.DataObject) -> None:
        """Cancel any task (WAITING ends at once; a finished one is returned unchanged; one
        awaiting review refuses); review and retry in a wrong state are refused."""
        task = self.pick(data, list(self.tasks.values()), "task")
        if task.state != "NEEDS_REVIEW":
            with pytest.raises(interventions.TaskNotReviewable):
                self.run(interventions.review_task(
                    self.db, self.who, namespace=self.tenant.namespace, task_id=task.id,
                    decision="failed", reason="model", evidence_ref="MODEL-0",
                    execution_ended=True, revision=1))
        if task.state not in ("FAILED", "CANCELLED"):
            with pytest.raises(interventions.TaskNotRetryable):
                self.run(interventions.retry_task(
                    self.db, self.who, namespace=self.tenant.namespace, task_id=task.id,
                    reason="model", rerun_confirmed=True))
        self.cancel_expecting(task)

    # --- the one rule: a weighted choice among the actions possible now --------------------

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One action, drawn with the weights of ACTIONS among those possible in this state.

        (One dispatching rule rather than a rule per action: Hypothesis spreads its draws
        unevenly over many preconditioned rules, and the protocol's main path — claim, start,
        renew, finish — would be starved by always-possible actions.)"""
        possible = [name for name, weight, can in ACTIONS if can(self) for _ in range(weight)]
        getattr(self, data.draw(st.sampled_from(possible), label="action"))(data)

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def the_checker_is_green(self) -> None:
        assert check(self.conn, [self.tenant.namespace_id]) == []

    @invariant()
    def the_database_agrees_with_the_model(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT id, state, attempts_used, effect_uncertain, current_attempt_id,"
                " cancel_requested_at IS NOT NULL AS cancel, starts_used, offer_lapses"
                " FROM pulse_tasks"
                " WHERE namespace_id = %s", (self.tenant.namespace_id,))
            rows = {row[0]: row[1:] for row in cur.fetchall()}
        assert set(rows) == set(self.tasks)
        for task in self.tasks.values():
            state, used, uncertain, current, cancel, starts, lapses = rows[task.id]
            assert (starts, lapses) == (task.starts_used, task.offer_lapses), task
            assert state == task.state, task
            assert used == task.attempts_used, task
            assert bool(uncertain) == task.uncertain, task
            assert current == (task.current.attempt_id if task.current else None), task
            assert bool(cancel) == task.cancel_requested, task
            # A confirmed success is never overwritten.
            assert state == "SUCCEEDED" or not task.confirmed_success
        live = [t for t in self.tasks.values() if t.current is not None]
        assert all(t.state in LIVE for t in live)
        assert all(t.current is None for t in self.tasks.values() if t.state not in LIVE)

    @invariant()
    def stale_authentic_reports_are_evidence(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT attempt_id, kind, COUNT(*) FROM pulse_attempt_evidence"
                        " WHERE namespace_id = %s GROUP BY attempt_id, kind",
                        (self.tenant.namespace_id,))
            found = Counter({(row[0], row[1]): row[2] for row in cur.fetchall()})
        assert found == self.evidence


# (action, weight, possible in this state?)
ACTIONS: tuple[tuple[str, int, Callable[[LeaseProtocol], bool]], ...] = (
    ("recover", 8, lambda m: any(t.lapsed for t in m.tasks.values())),
    ("finish_running", 5, lambda m: bool(m.running_grants())),
    ("start_offer", 5, lambda m: any(t.state == "LEASED" for t in m.tasks.values())),
    ("review", 3, lambda m: any(t.state == "NEEDS_REVIEW" for t in m.tasks.values())),
    ("lapse_a_lease", 2,
     lambda m: bool(m.live_grants()) and not any(t.lapsed for t in m.tasks.values())),
    ("lapse_an_offer", 2, lambda m: not any(t.lapsed for t in m.tasks.values())
     and any(t.state == "LEASED" for t in m.tasks.values())),
    ("renew_running", 2, lambda m: bool(m.running_grants())),
    ("report_with_an_old_generation", 2,
     lambda m: any(len(t.grants) > 1 for t in m.tasks.values())),
    ("lose_a_running_lease", 2,
     lambda m: bool(m.running_grants()) and not any(t.lapsed for t in m.tasks.values())),
    ("claim_and_start", 2, lambda m: any(t.state == "WAITING" for t in m.tasks.values())),
    ("claim", 3, lambda m: any(t.state == "WAITING" for t in m.tasks.values())),
    ("add", 2, lambda m: len(m.tasks) < 12),
    ("cancel_running", 2, lambda m: any(t.state == "RUNNING" for t in m.tasks.values())),
    ("cancel_leased", 1, lambda m: any(t.state == "LEASED" for t in m.tasks.values())),
    ("finish_any", 2, lambda m: bool(m.grants)),
    ("finish_a_mixed_batch", 2, lambda m: len(m.grants) >= 2),
    ("resend_a_report", 2, lambda m: bool(m.sent)),
    ("start_any", 1, lambda m: bool(m.grants)),
    ("renew_any", 1, lambda m: bool(m.grants)),
    ("resend_under_another_id", 1, lambda m: bool(m.sent)),
    ("reuse_a_report_id_for_other_content", 1, lambda m: bool(m.sent)),
    ("forged_report", 1, lambda m: bool(m.grants)),
    ("manual_retry", 1,
     lambda m: any(t.state in ("FAILED", "CANCELLED") for t in m.tasks.values())),
    ("intervene_on_any_task", 1, lambda m: bool(m.tasks)),
    ("reconnect", 1, lambda m: True),
)


# 2,000 steps of real transactions, each followed by the invariant checker (which grew with
# the relay's probes): about 100 s on a busy 2-core machine, so more than the default 120 s cap.
@pytest.mark.timeout(300)
def test_the_lease_protocol_matches_its_model(db_url: DatabaseUrl) -> None:
    COVERED.clear()
    run_state_machine_as_test(
        lambda: LeaseProtocol(db_url),
        # No shrink phase: each step costs real transactions, and shrinking a failure could
        # outlast the test timeout; the failing run's steps are printed as they are (at most
        # stateful_step_count). Add Phase.shrink locally to minimise a failure.
        settings=settings(max_examples=30, stateful_step_count=40, deadline=None,
                          derandomize=True, database=None, print_blob=False,
                          phases=(Phase.explicit, Phase.generate),
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much]),
    )
    assert set(COVERED) >= MUST_COVER, sorted(MUST_COVER - set(COVERED))


# --- duplicated reports inside one batch -----------------------------------------------------


async def _running_grant(db: Database, tenant: Tenant) -> Grant:
    queue = await make_queue(db, tenant)
    await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await db.transaction("t", lambda cur: leases.claim(cur, session, queue, 1))
    await db.transaction("t", lambda cur: held.start(cur, tenant.namespace_id, [ref(grant)]))
    return grant


async def _count(db: Database, table: str, attempt_id: bytes) -> int:
    async def body(cur: Any) -> int:
        await cur.execute(f"SELECT COUNT(*) AS n FROM {table} WHERE attempt_id = %s",
                          (attempt_id,))
        return int((await cur.fetchone())["n"])

    return await db.read("t", body)


async def test_the_same_report_twice_in_one_batch_gets_one_receipt(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    """A worker that re-sends a report before the first answer may put both copies in one
    batch: the batch must be answered per item (the copy gets the original receipt), not
    refused as a whole by the receipts' unique key."""
    grant = await _running_grant(db, tenant)
    report = make_report(grant, "succeeded", b"r1")
    first, copy = await db.transaction("t", lambda cur: held.finish(
        cur, tenant.namespace_id, [report, report]))
    assert Answer.of(first) == Answer(True, None, "SUCCEEDED")
    assert Answer.of(copy) == Answer.of(first)
    assert await _count(db, "pulse_attempt_receipts", grant.attempt_id) == 1
    assert await _count(db, "pulse_attempt_evidence", grant.attempt_id) == 0
    assert check(sync_conn, [tenant.namespace_id]) == []


async def test_one_report_id_with_two_contents_in_one_batch_is_a_report_conflict(
    db: Database, tenant: Tenant
) -> None:
    grant = await _running_grant(db, tenant)
    reports = [make_report(grant, "succeeded", b"r1"), make_report(grant, "unknown", b"r1")]
    with pytest.raises(leases.ReportConflict):
        await db.transaction("t", lambda cur: held.finish(cur, tenant.namespace_id, reports))


async def test_the_same_report_racing_itself_gets_one_receipt_and_two_answers(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    """A worker re-sends a finish on a new connection while the first is still running (or two
    frames of one socket run at once): both transactions find no receipt yet and queue on the
    attempt's task row. The second must answer from the first's receipt, not fail on it."""
    grant = await _running_grant(db, tenant)
    report = make_report(grant, "succeeded", b"r1")
    blocker = connect_sync(db_url, autocommit=False)
    try:
        with blocker.cursor() as cur:  # hold the task row so both finishes get past the lookup
            cur.execute("SELECT id FROM pulse_tasks WHERE namespace_id = %s AND id = %s"
                        " FOR UPDATE", (tenant.namespace_id, grant.task_id))
        runs = [asyncio.create_task(db.transaction(
            "t", lambda cur: held.finish(cur, tenant.namespace_id, [report])))
            for _ in range(2)]
        # Until both wait for the task row (the server's own process list, not the clock).
        await until(lambda: not any(r.done() for r in runs) and statements_waiting(
            sync_conn, "SELECT%FROM pulse_tasks%FOR UPDATE%") >= 2,
            message="both finishes to wait for the task row")
        assert not any(r.done() for r in runs)
        blocker.commit()
        first, second = [(await r)[0] for r in runs]
    finally:
        blocker.close()
    assert first.accepted
    assert second.accepted
    assert first.task_state == second.task_state == "SUCCEEDED"
    assert sorted([first.replayed, second.replayed]) == [False, True]
    assert await _count(db, "pulse_attempt_receipts", grant.attempt_id) == 1
    assert await _count(db, "pulse_attempt_evidence", grant.attempt_id) == 0
    assert check(sync_conn, [tenant.namespace_id]) == []


# --- a repeated start after the execution lease lapsed -----------------------------------------


async def test_a_repeated_start_after_the_lease_lapsed_is_not_approved(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    """A worker whose first start answer was lost re-sends it after its execution lease lapsed
    (no renewals: it never knew it had started). The recovery scan may already be handing the
    task to someone else, so the holder must not be told to run: a start is approved only while
    the lease is valid (DESIGN §5), for a repeated start too."""
    grant = await _running_grant(db, tenant)

    async def lapse(cur: Any) -> None:
        await cur.execute("SELECT UTC_TIMESTAMP(6) - INTERVAL 1 SECOND AS past")
        past = (await cur.fetchone())["past"]
        await cur.execute("UPDATE pulse_tasks SET lease_expires_at = %s WHERE id = %s",
                          (past, grant.task_id))
        await cur.execute("UPDATE pulse_attempts SET lease_expires_at = %s WHERE id = %s",
                          (past, grant.attempt_id))

    await db.transaction("t", lapse)
    (again,) = await db.transaction("t", lambda cur: held.start(
        cur, tenant.namespace_id, [ref(grant)]))
    assert (again.approved, again.reason) == (False, "lease_expired")
    assert check(sync_conn, [tenant.namespace_id]) == []

"""The one place where a task leaves its attempt or ends: the batch-native ending writer.

Every path that ends a task, or takes a task's live attempt away, writes through :func:`write`:
finish (a worker's report), lease recovery (a lapsed offer or execution lease), the WAITING
deadline scan, start refusals (a deadline passed, a gate closed), cancel and review. Each path
locks its rows, decides with a pure function of :mod:`decisions` and hands :class:`Ending`
values here; nothing else updates a task's state away from LEASED, RUNNING or NEEDS_REVIEW or
into a final state (starts, claims and submissions are the other transitions, written by their
own modules).

What one call commits (000 §5: "终态、尝试结果、额度释放、状态事件与结果事件同事务")
    the attempts' endings, the tasks' new states (guarded by revision, state and current attempt),
    one state event per task, the counter releases (queue and application counters, concurrency
    permits), and one result event per task that reaches a final state or NEEDS_REVIEW, in the
    namespace's gap-free result stream (last: the stream row is the hottest). Result subscriptions
    (their fan-out input is the result event) and the workflow inbox (a row per task a workflow
    owns) are written here and nowhere else.

Locks: the caller has locked the tasks and their attempts (FOR UPDATE); this writes them, then
the queue rows, concurrency keys and permits, the application row and the result stream, in the
lock order of ``docs/architecture.md``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from orbit_common.db.batch import values_table
from orbit_common.db.clock import to_db
from orbit_common.model import jsondoc
from orbit_common.platform.events import EventRecord, append_events
from orbit_common.platform.results import ResultEvent, append_results
from orbit_common.pulse import resources
from orbit_common.pulse.leases import workflow_inbox as inbox
from orbit_common.pulse.leases.common import expect_rows, task_event
from orbit_common.pulse.leases.decisions import Decision
from orbit_common.pulse.model import AttemptState, TaskState
from orbit_common.pulse.resources import Usage


@attrs.frozen(kw_only=True)
class Ending:
    """How one task ends (or leaves its live attempt), with what the writer records."""

    task: Mapping[str, Any]  # the locked task row (common.TASK_COLUMNS)
    attempt: Mapping[str, Any] | None  # its live attempt, locked; None when it has none
    decision: Decision
    payload: dict[str, Any] = attrs.field(factory=dict)  # the state event's payload
    result: str | None = None  # JSON text: the task's (and the attempt's) result
    error: dict[str, Any] | None = None  # the task's (and the attempt's) error document
    retryable: bool | None = None  # the attempt's retryable flag (failure reports)
    cancel_reason: str | None = None  # set with cancel=True: the ending records a cancel intent
    cancel: bool = False
    snapshot_extra: dict[str, Any] = attrs.field(factory=dict)  # e.g. the review

    @property
    def revision(self) -> int:
        """The task's revision after this ending."""
        return int(self.task["revision"]) + 1


END_ATTEMPTS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_attempts a"
    " ON a.namespace_id = %s AND a.id = v.attempt_id"
    " SET a.state = v.state, a.retryable = v.retryable, a.result = v.result,"
    "     a.error = v.error, a.finished_at = %s"
    " WHERE a.state IN ('OFFERED', 'RUNNING')"
)
# The guard re-checks revision, state and (null-safe) the live attempt: no finish, renewal or
# other ending slipped in between the caller's locks and this write.
END_TASKS = (
    "UPDATE {table} v STRAIGHT_JOIN pulse_tasks t"
    " ON t.namespace_id = %s AND t.id = v.task_id"
    " SET t.state = v.state, t.revision = t.revision + 1,"
    "     t.available_at = COALESCE(v.available_at, t.available_at),"
    "     t.current_attempt_id = NULL, t.lease_expires_at = NULL,"
    "     t.effect_uncertain = v.uncertain, t.outcome_reason = v.reason,"
    "     t.offer_lapses = t.offer_lapses + v.lapse,"
    "     t.result = COALESCE(v.result, t.result), t.error = COALESCE(v.error, t.error),"
    "     t.cancel_requested_at = IF(v.cancel = 1, COALESCE(t.cancel_requested_at, %s),"
    "                                t.cancel_requested_at),"
    "     t.cancel_reason = IF(v.cancel = 1, COALESCE(t.cancel_reason, v.cancel_reason),"
    "                          t.cancel_reason),"
    "     t.completed_at = IF(v.terminal = 1, %s, NULL), t.updated_at = UTC_TIMESTAMP(6)"
    " WHERE t.revision = v.revision AND t.state = v.from_state"
    "   AND t.current_attempt_id <=> v.attempt_id"
)


def _snapshot(ending: Ending) -> dict[str, Any]:
    task, decision = ending.task, ending.decision
    return {
        "task_id": task["id"].hex(), "handler": task["handler"],
        "state": decision.task_state.value, "revision": ending.revision,
        "outcome_reason": decision.outcome_reason, "attempts_used": task["attempts_used"],
        "effect_uncertain": decision.effect_uncertain,
        # Spliced in as written (the writer stored this text): no second parse of a result
        # that may be up to [dispatcher].max_result_bytes.
        "result": jsondoc.RawJson(ending.result) if ending.result is not None else None,
        "error": ending.error, **ending.snapshot_extra,
    }


def events_of(namespace_id: bytes, endings: Sequence[Ending]) -> list[EventRecord]:
    return [
        task_event(namespace_id, e.task["id"], e.revision, "task." + e.decision.outcome_reason,
                   TaskState(e.task["state"]), e.decision.task_state, e.payload)
        for e in endings
    ]


async def write(cur: Any, namespace_id: bytes, endings: Sequence[Ending], now: dt.datetime,
                *, before_results: Callable[[], Awaitable[None]] | None = None) -> None:
    """Write ``endings`` (tasks of one namespace, each at most once) in the caller's
    transaction. A guard that matches fewer rows than expected raises ``StaleRevision`` and the
    transaction rolls back whole. ``before_results`` runs after the counters, before the result
    stream (a start batch approves its other items there, see ``start``)."""
    if not endings:
        return
    when = to_db(now)
    attempt_rows: list[tuple[Any, ...]] = []
    task_rows: list[tuple[Any, ...]] = []
    usage = Usage()
    permits: dict[bytes, str] = {}
    for e in endings:
        task, attempt, decision = e.task, e.attempt, e.decision
        error = jsondoc.dumps(e.error) if e.error is not None else None
        terminal = decision.task_state.terminal
        if attempt is not None:
            assert decision.attempt_state is not None  # noqa: S101 - a decision bug, not input
            attempt_rows.append((
                attempt["id"], decision.attempt_state.value,
                None if e.retryable is None else int(e.retryable),
                e.result if decision.attempt_state is AttemptState.SUCCEEDED else None, error))
            usage.active[attempt["queue_id"]] -= 1
            if attempt["state"] == AttemptState.OFFERED:
                usage.reserved -= 1
            if attempt["concurrency_token"] is not None:
                permits[attempt["id"]] = decision.attempt_state.value
        if terminal and not TaskState(task["state"]).terminal:
            usage.unfinished[task["queue_id"]] -= 1
        task_rows.append((
            task["id"], task["revision"], task["state"],
            attempt["id"] if attempt is not None else None, decision.task_state.value,
            to_db(decision.available_at) if decision.available_at else None,
            1 if decision.effect_uncertain else 0, decision.outcome_reason,
            1 if decision.lapse else 0,
            e.result if decision.task_state is TaskState.SUCCEEDED else None, error,
            1 if e.cancel else 0, e.cancel_reason, 1 if terminal else 0,
        ))
    if attempt_rows:
        table, values = values_table(["attempt_id", "state", "retryable", "result", "error"],
                                     attempt_rows)
        await cur.execute(END_ATTEMPTS.format(table=table), (*values, namespace_id, when))
        expect_rows(cur, len(attempt_rows), "end attempts")
    table, values = values_table(
        ["task_id", "revision", "from_state", "attempt_id", "state", "available_at",
         "uncertain", "reason", "lapse", "result", "error", "cancel", "cancel_reason",
         "terminal"], task_rows)
    await cur.execute(END_TASKS.format(table=table), (*values, namespace_id, when, when))
    expect_rows(cur, len(task_rows), "end tasks")
    events = events_of(namespace_id, endings)
    await append_events(cur, events)
    # The shared rows last: queue and application counters, concurrency keys and permits, then
    # the result stream.
    await resources.apply(cur, namespace_id, usage, between=lambda: resources.release(
        cur, namespace_id, permits, now))
    if before_results is not None:
        await before_results()
    ended = [(e, event) for e, event in zip(endings, events, strict=True)
             if e.decision.task_state.terminal
             or e.decision.task_state is TaskState.NEEDS_REVIEW]
    snapshots = {e.task["id"]: _snapshot(e) for e, _ in ended}
    # Pulse → Weave (000 §6.3): a workflow-owned task's end is an inbox row in this same
    # transaction; no statement at all when no ended task has a workflow owner.
    owned = [inbox.Source(event_id=event.id, task_id=e.task["id"], task_revision=e.revision,
                          task_state=e.decision.task_state.value,
                          instance_id=e.task.get("owner_id"),
                          gate_id=e.task.get("workflow_gate_id"),
                          snapshot=snapshots[e.task["id"]])
             for e, event in ended if e.task.get("owner_kind") == "WORKFLOW"]
    if owned:
        await inbox.record(cur, namespace_id, owned)
    await append_results(cur, namespace_id, [
        ResultEvent(event_id=event.id, task_id=e.task["id"], queue_id=e.task["queue_id"],
                    task_revision=e.revision, state=e.decision.task_state.value,
                    snapshot=snapshots[e.task["id"]])
        for e, event in ended
    ])

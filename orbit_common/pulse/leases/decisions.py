"""How a task leaves its attempt or ends: the specification's rules as pure functions.

Every function here reads a locked task row (``common.TASK_COLUMNS``) and database time and
returns a :class:`Decision`; none touches the database. :mod:`endings` writes decisions.

Rules (000 §1 invariants 7 and 12, §2; the rulings of ``docs/api/tasks-lifecycle.md``)
    * The retry budget (``max_attempts``) counts **approved starts** (``starts_used``). An offer
      that lapses, or whose start is refused, never ran a handler and spends no budget; the
      generation still advanced (fencing). Consecutive lapsed offers are capped
      (``max_offer_lapses``, then FAILED ``offer_lapses_exhausted``) so a poison task cannot loop.
    * Communication failure is never business failure: a lost execution lease, and an ``unknown``
      report, send the task back to WAITING (uncertainty carried) only when it declared re-running
      safe, budget is left and no cancel is requested; otherwise NEEDS_REVIEW.
    * A retry needs explicit retryable evidence (``retryable=true`` on a failure report).
    * Uncertainty is never dropped automatically: a task carrying it that would end FAILED or
      CANCELLED goes to NEEDS_REVIEW instead; a confirmed success (a report or a review) clears it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common.db.clock import as_utc
from orbit_common.pulse.leases.common import ms, policy
from orbit_common.pulse.model import AttemptState, TaskState

DEFAULT_MAX_OFFER_LAPSES = 10


@attrs.frozen(kw_only=True)
class Decision:
    """What happens to one task (and its live attempt, if it has one)."""

    task_state: TaskState
    attempt_state: AttemptState | None
    outcome_reason: str
    available_at: dt.datetime | None = None
    effect_uncertain: bool = False
    lapse: bool = False  # one more consecutive lapsed offer (task.offer_lapses + 1)


def retry_at(task: dict[str, Any], now: dt.datetime) -> dt.datetime | None:
    """When the next attempt may start after a started one ended, or None when the budget (approved
    starts) or the deadline is spent."""
    if task["starts_used"] >= task["max_attempts"]:
        return None
    at = now + ms(policy(task).backoff_ms(max(task["starts_used"], 1)))
    if task["deadline_at"] is not None and at >= as_utc(task["deadline_at"]):
        return None
    return at


def _unsettled(task_state: TaskState, attempt_state: AttemptState | None, reason: str,
               uncertain: bool, **kw: Any) -> Decision:
    """A FAILED or CANCELLED end, or NEEDS_REVIEW when the task carries an uncertain effect."""
    if uncertain:
        return Decision(task_state=TaskState.NEEDS_REVIEW, attempt_state=attempt_state,
                        outcome_reason=f"{reason}_with_uncertain_effect", effect_uncertain=True,
                        **kw)
    return Decision(task_state=task_state, attempt_state=attempt_state, outcome_reason=reason,
                    **kw)


def decide_finish(outcome: str, retryable: bool, task: dict[str, Any],
                  now: dt.datetime) -> Decision:
    """A live RUNNING attempt's report (``succeeded``, ``failed``, ``unknown``, ``cancelled``)."""
    uncertain = bool(task["effect_uncertain"])
    cancel = task["cancel_requested_at"] is not None
    if outcome == "succeeded":
        return Decision(task_state=TaskState.SUCCEEDED, attempt_state=AttemptState.SUCCEEDED,
                        outcome_reason="succeeded")
    if outcome == "unknown":
        # The safe-retry rule, as for a lost lease (000 §2).
        again = retry_at(task, now) if task["rerun_safe"] and not cancel else None
        if again is not None:
            return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.UNKNOWN,
                            outcome_reason="outcome_unknown_retry", available_at=again,
                            effect_uncertain=True)
        return Decision(task_state=TaskState.NEEDS_REVIEW, attempt_state=AttemptState.UNKNOWN,
                        outcome_reason="outcome_unknown", effect_uncertain=True)
    if outcome == "cancelled":
        return _unsettled(TaskState.CANCELLED, AttemptState.CANCELLED, "cancelled", uncertain)
    again = retry_at(task, now) if retryable and not cancel else None
    if again is not None:
        return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.FAILED,
                        outcome_reason="retry_scheduled", available_at=again,
                        effect_uncertain=uncertain)
    reason = ("cancel_requested" if cancel and retryable
              else "attempts_exhausted" if retryable else "non_retryable")
    return _unsettled(TaskState.FAILED, AttemptState.FAILED, reason, uncertain)


def past_deadline(task: dict[str, Any], now: dt.datetime) -> str | None:
    """``deadline_exceeded`` / ``start_deadline_exceeded`` when a start now would be too late."""
    if task["deadline_at"] is not None and now >= as_utc(task["deadline_at"]):
        return "deadline_exceeded"
    if (task["start_deadline_at"] is not None and task["first_started_at"] is None
            and now >= as_utc(task["start_deadline_at"])):
        return "start_deadline_exceeded"
    return None


def decide_expiry(task: dict[str, Any], attempt_state: AttemptState, now: dt.datetime,
                  max_offer_lapses: int = DEFAULT_MAX_OFFER_LAPSES) -> Decision:
    """What a lapsed lease means (database time)."""
    uncertain = bool(task["effect_uncertain"])
    cancel = task["cancel_requested_at"] is not None
    if attempt_state is AttemptState.OFFERED:
        # Nothing ran: the offer lapsed. No budget is spent; the lapse is counted.
        if cancel:
            return _unsettled(TaskState.CANCELLED, AttemptState.OFFER_EXPIRED, "cancelled",
                              uncertain, lapse=True)
        late = past_deadline(task, now)
        if late is not None:
            return _unsettled(TaskState.FAILED, AttemptState.OFFER_EXPIRED, late, uncertain,
                              lapse=True)
        if task["offer_lapses"] + 1 >= max_offer_lapses:
            return _unsettled(TaskState.FAILED, AttemptState.OFFER_EXPIRED,
                              "offer_lapses_exhausted", uncertain, lapse=True)
        return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.OFFER_EXPIRED,
                        outcome_reason="offer_expired", available_at=now,
                        effect_uncertain=uncertain, lapse=True)
    # RUNNING: the holder went silent. Its effect is unknown from here on.
    again = retry_at(task, now) if task["rerun_safe"] and not cancel else None
    if again is not None:
        return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.LEASE_EXPIRED,
                        outcome_reason="lease_lost_retry", available_at=again,
                        effect_uncertain=True)
    return Decision(task_state=TaskState.NEEDS_REVIEW, attempt_state=AttemptState.LEASE_EXPIRED,
                    outcome_reason="lease_lost", effect_uncertain=True)


def decide_start_too_late(task: dict[str, Any], reason: str) -> Decision:
    """A start refused because a deadline passed: the offer is withdrawn and the task ends."""
    return _unsettled(TaskState.FAILED, AttemptState.WITHDRAWN, reason,
                      bool(task["effect_uncertain"]))


def decide_withdrawal(task: dict[str, Any]) -> Decision:
    """A start refused because a gate is closed: the offer is withdrawn at once, the task waits
    again; no budget spent, no lapse counted (the claim refuses work while the gate is closed)."""
    return Decision(task_state=TaskState.WAITING, attempt_state=AttemptState.WITHDRAWN,
                    outcome_reason="offer_withdrawn",
                    effect_uncertain=bool(task["effect_uncertain"]))


def decide_waiting_deadline(task: dict[str, Any], reason: str) -> Decision:
    """A WAITING task past its total or schedule-to-start deadline."""
    return _unsettled(TaskState.FAILED, None, reason, bool(task["effect_uncertain"]))


def decide_cancel_now(task: dict[str, Any]) -> Decision:
    """A cancel of a WAITING or LEASED task (a live offer is withdrawn)."""
    attempt = AttemptState.WITHDRAWN if task["state"] == TaskState.LEASED else None
    return _unsettled(TaskState.CANCELLED, attempt, "cancelled", bool(task["effect_uncertain"]))


def decide_review(decision: str) -> Decision:
    """A human review of a NEEDS_REVIEW task: the human decision resolves the uncertainty."""
    target = TaskState.SUCCEEDED if decision == "succeeded" else TaskState.FAILED
    return Decision(task_state=target, attempt_state=None, outcome_reason=f"reviewed_{decision}")

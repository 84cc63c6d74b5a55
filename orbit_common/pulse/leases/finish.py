"""Finish: a worker reports how an attempt ended (specification 000 §2, §3, §5 "结果上报").

    RUNNING --finish--> SUCCEEDED | WAITING (retry) | FAILED | NEEDS_REVIEW | CANCELLED

Outcomes: ``succeeded`` (with a result), ``failed`` (``retryable`` is explicit evidence that a
retry is safe), ``unknown`` (the safe-retry rule: back to WAITING with uncertainty carried when
the task is re-run-safe, budget is left and no cancel is requested; else NEEDS_REVIEW),
``cancelled`` (only after a cancel was requested). The decision is
:func:`decisions.decide_finish`; the write is the ending writer's.

Dedup scope (000 §5): report ids per attempt. A re-sent report (same id, same content) returns
the original receipt; the same content under another report id returns it too; one report id
with another content is ``report_conflict``. Receipts are read under the attempts' locks, so a
report racing itself (a re-send on a new connection, two frames of one socket) is answered from
the first one's receipt.

Stale reports (finished attempt, expired lease, a session that is not the attempt's instance or
was fenced, an unrequested cancel) change nothing and are kept as late evidence with a receipt.

Locks: the session (shared), tasks, attempts (then the receipts are read); then the ending
writer's queue rows, keys, application row and result stream.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert
from orbit_common.db.clock import as_utc, db_now
from orbit_common.model import digests, ids, jsondoc
from orbit_common.pulse.leases import decisions, endings
from orbit_common.pulse.leases.common import (
    AttemptRef,
    Locked,
    SessionIdentity,
    check_batch,
    evidence_row,
    identity_refusal,
    insert_evidence,
    lock_for,
)
from orbit_common.pulse.model import AttemptState

OUTCOMES = ("succeeded", "failed", "unknown", "cancelled")


@attrs.frozen(kw_only=True)
class FinishReport:
    """A worker's report that an attempt ended."""

    ref: AttemptRef
    report_id: bytes
    outcome: str  # one of OUTCOMES
    result: str | None = None  # JSON text, for succeeded
    error: dict[str, Any] | None = None  # for failed / unknown / cancelled
    retryable: bool = False  # failed only: explicit evidence that a retry is safe

    def digest(self) -> bytes:
        """The report's content digest (its receipts' ``request_digest``), computed once: a
        finish consults it up to four times per report, and a result may be 960 KiB."""
        return self._digest

    @functools.cached_property
    def _digest(self) -> bytes:
        body = {"outcome": self.outcome, "result": self.result, "error": self.error,
                "retryable": self.retryable, "generation": self.ref.generation}
        return digests.domain_digest("orbit.finish.v1", self.ref.attempt_id,
                                     jsondoc.canonical(body))


@attrs.frozen(kw_only=True)
class FinishOutcome:
    attempt_id: bytes
    accepted: bool
    reason: str | None
    task_state: str | None
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"attempt_id": self.attempt_id.hex(), "accepted": self.accepted,
                "reason": self.reason, "task_state": self.task_state}


class ReportConflict(errors.Conflict):
    code = "report_conflict"
    title = "The report id was already used with a different report"


# Earlier receipts of a finish batch in one round trip: by report id (uq_receipts_report), and
# accepted ones by identical content under any report id (ix_receipts_operation); with the
# database's clock (a plain read after the attempts' locks), so one row comes back even when no
# receipt does.
EARLIER_RECEIPTS = """
SELECT clock.now, r.found_by, r.attempt_id, r.report_id, r.request_digest, r.response
FROM (SELECT UTC_TIMESTAMP(6) AS now) clock LEFT JOIN (
  SELECT 'report' AS found_by, attempt_id, report_id, request_digest, response
  FROM pulse_attempt_receipts
  WHERE namespace_id = %s AND (attempt_id, report_id) IN ({pairs})
  UNION ALL
  SELECT 'content', attempt_id, report_id, request_digest, response
  FROM pulse_attempt_receipts
  WHERE namespace_id = %s AND operation = 'finish' AND (attempt_id, request_digest) IN ({pairs})
    AND JSON_EXTRACT(response, '$.accepted') = true
) r ON 1 = 1
"""
INSERT_RECEIPTS = (
    "INSERT INTO pulse_attempt_receipts (namespace_id, id, attempt_id, report_id, operation,"
    " request_digest, response, created_at)"
)


async def _replays(cur: Any, namespace_id: bytes, reports: Sequence[FinishReport]
                   ) -> tuple[dict[int, FinishOutcome], dt.datetime]:
    """Earlier receipts: by report id (a conflicting re-use raises), then by identical content
    under another report id (an already applied report returns its original receipt); and the
    database's clock."""
    found: dict[int, FinishOutcome] = {}
    marks = ", ".join(["(%s, %s)"] * len(reports))
    await cur.execute(EARLIER_RECEIPTS.format(pairs=marks), (
        namespace_id, *[v for r in reports for v in (r.ref.attempt_id, r.report_id)],
        namespace_id, *[v for r in reports for v in (r.ref.attempt_id, r.digest())]))
    by_report: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    by_digest: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    rows = list(await cur.fetchall())
    now = as_utc(rows[0]["now"])
    for row in rows:
        if row["found_by"] == "report":
            by_report[(row["attempt_id"], row["report_id"])] = row
        elif row["found_by"] is not None:
            by_digest[(row["attempt_id"], row["request_digest"])] = row
    for index, report in enumerate(reports):
        row = by_report.get((report.ref.attempt_id, report.report_id))
        if row is None:
            continue
        if row["request_digest"] != report.digest():
            raise ReportConflict(f"report {report.report_id!r} of attempt "
                                 f"{report.ref.attempt_id.hex()} was used for another report")
        found[index] = _replayed(report, row["response"])
    for index, report in enumerate(reports):
        if index in found:
            continue
        row = by_digest.get((report.ref.attempt_id, report.digest()))
        if row is not None:
            found[index] = _replayed(report, row["response"])
    return found, now


def _replayed(report: FinishReport, response: str) -> FinishOutcome:
    doc = jsondoc.loads_strict(response)
    return FinishOutcome(attempt_id=report.ref.attempt_id, accepted=bool(doc["accepted"]),
                         reason=doc["reason"], task_state=doc["task_state"], replayed=True)


def _dedupe_batch(
    pending: list[tuple[int, FinishReport]],
) -> tuple[list[tuple[int, FinishReport]], dict[int, int]]:
    """Copies of a report inside one batch (a worker re-sent it before the first answer).

    A copy -- the same report id and content, or the same content under another report id --
    is answered like its first occurrence and gets no receipt of its own; one report id with
    two contents is a ReportConflict, as it is across batches.
    """
    unique: list[tuple[int, FinishReport]] = []
    copies: dict[int, int] = {}
    by_id: dict[tuple[bytes, bytes], tuple[int, bytes]] = {}
    by_content: dict[tuple[bytes, bytes], int] = {}
    for index, report in pending:
        digest = report.digest()
        id_key = (report.ref.attempt_id, report.report_id)
        if id_key in by_id:
            first, first_digest = by_id[id_key]
            if first_digest != digest:
                raise ReportConflict(f"report {report.report_id!r} appears twice in one batch "
                                     "with different contents")
            copies[index] = first
            continue
        content_key = (report.ref.attempt_id, digest)
        if content_key in by_content:
            copies[index] = by_content[content_key]
            continue
        by_id[id_key] = (index, digest)
        by_content[content_key] = index
        unique.append((index, report))
    return unique, copies


def _receipt(namespace_id: bytes, report: FinishReport,
             outcome: FinishOutcome) -> tuple[Any, ...]:
    return (namespace_id, ids.new_id(), report.ref.attempt_id, report.report_id, "finish",
            report.digest(), jsondoc.dumps(outcome.to_json()))


def _stale(report: FinishReport, lk: Locked, now: dt.datetime, done: set[bytes]) -> str | None:
    """Why an authentic report of the session's own attempt can no longer be applied."""
    if (report.ref.attempt_id in done or lk.attempt["state"] != AttemptState.RUNNING
            or not lk.is_live()):
        return "attempt_finished"
    if as_utc(lk.attempt["lease_expires_at"]) <= now:
        return "lease_expired"
    if report.outcome == "cancelled" and lk.task["cancel_requested_at"] is None:
        return "cancel_not_requested"
    return None


def validate(reports: Sequence[FinishReport]) -> None:
    check_batch(reports)
    for report in reports:
        if report.outcome not in OUTCOMES:
            raise errors.ValidationFailed([{"path": "$.outcome",
                                            "message": f"one of {', '.join(OUTCOMES)}"}])


async def finish(cur: Any, session: SessionIdentity,
                 reports: Sequence[FinishReport]) -> list[FinishOutcome]:
    """Record finish reports (the module docstring), answered per item, in one transaction."""
    validate(reports)
    if not reports:
        return []
    namespace_id = session.namespace_id
    locked, live = await lock_for(cur, session, [r.ref.attempt_id for r in reports])
    # The token is verified before any receipt is looked up: a report with a wrong token or
    # generation learns nothing from earlier receipts (not even that its content matched one).
    forged = {i for i, r in enumerate(reports)
              if (lk := locked.get(r.ref.attempt_id)) is None or not lk.matches(r.ref)}
    authentic = [(i, r) for i, r in enumerate(reports) if i not in forged]
    if authentic:
        found, now = await _replays(cur, namespace_id, [r for _, r in authentic])
    else:  # every report forged: nothing is decided, the clock only stamps the answer
        found, now = {}, await db_now(cur)
    replays = {authentic[j][0]: outcome for j, outcome in found.items()}
    pending, copies = _dedupe_batch([(i, r) for i, r in authentic if i not in replays])
    outcomes: dict[int, FinishOutcome] = dict(replays)
    for index in forged:
        outcomes[index] = FinishOutcome(attempt_id=reports[index].ref.attempt_id,
                                        accepted=False, reason="invalid_attempt",
                                        task_state=None)
    ends: list[endings.Ending] = []
    evidence: list[tuple[Any, ...]] = []
    receipts: list[tuple[Any, ...]] = []
    done: set[bytes] = set()

    for index, report in pending:  # authentic reports only (the forged are answered above)
        lk = locked[report.ref.attempt_id]
        reason = identity_refusal(lk, session, live) or _stale(report, lk, now, done)
        if reason is not None:
            outcome = FinishOutcome(attempt_id=report.ref.attempt_id, accepted=False,
                                    reason=reason, task_state=None)
            # An authentic but stale report: keep it as evidence for a human review.
            evidence.append(evidence_row(
                namespace_id, lk, report.outcome.upper(),
                report.retryable if report.outcome == "failed" else None,
                {"result": jsondoc.RawJson(report.result) if report.result else None,
                 "error": report.error}, reason))
            receipts.append(_receipt(namespace_id, report, outcome))
            outcomes[index] = outcome
            continue
        done.add(report.ref.attempt_id)
        decision = decisions.decide_finish(report.outcome, report.retryable, lk.task, now)
        ends.append(endings.Ending(
            task=lk.task, attempt=lk.attempt, decision=decision,
            payload={"attempt_id": lk.attempt["id"].hex(),
                     "generation": lk.attempt["generation"], "outcome": report.outcome},
            result=report.result if report.outcome == "succeeded" else None,
            error=report.error if report.outcome != "succeeded" else None,
            retryable=report.retryable if report.outcome == "failed" else None))
        outcome = FinishOutcome(attempt_id=report.ref.attempt_id, accepted=True, reason=None,
                                task_state=decision.task_state.value)
        receipts.append(_receipt(namespace_id, report, outcome))
        outcomes[index] = outcome

    # New rows first (they take no locks others wait for), then the ending writer: attempts,
    # tasks, events, the shared counter rows and the result stream last.
    await insert_evidence(cur, evidence)
    if receipts:
        sql, params = multi_insert(INSERT_RECEIPTS,
                                   "(%s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))", receipts)
        await cur.execute(sql, params)
    await endings.write(cur, namespace_id, ends, now)
    for index, original in copies.items():
        outcomes[index] = attrs.evolve(outcomes[original], replayed=True)
    return [outcomes[i] for i in range(len(reports))]

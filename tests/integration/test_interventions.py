"""Cancel, review and manual retry against the real database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orbit_common.db.clock import db_now
from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.pulse import interventions
from orbit_common.pulse.leases import AttemptRef, FinishReport, Grant
from tests.conftest import Tenant, make_key
from tests.integration.test_leases import claim, expire_now, finish, recover, report, start
from tests.support import held
from tests.support.lease_fixtures import add_tasks, make_queue, open_session, scalar, task_row


async def principal(db: Database, tenant: Tenant) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key))


async def cancel(db: Database, tenant: Tenant, task_id: bytes, **kw: Any) -> Any:
    return await interventions.cancel_task(db, await principal(db, tenant),
                                           namespace=tenant.namespace, task_id=task_id,
                                           reason=kw.pop("reason", "no longer needed"), **kw)


async def running_task(db: Database, tenant: Tenant, **kw: Any) -> tuple[bytes, Grant]:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue, **kw)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    return task_id, grant


async def test_cancel_waiting_is_immediate_and_audited(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    outcome = await cancel(db, tenant, task_id)
    assert outcome.status == 200
    assert outcome.body["state"] == "CANCELLED"
    row = await task_row(db, tenant, task_id)
    assert row["state"] == "CANCELLED"
    assert row["completed_at"] is not None
    audit = await scalar(db, "SELECT CONCAT(actor_kind, ':', reason) AS a FROM orbit_audit_events"
                             " WHERE resource_id = %s AND action = 'task.cancel'", task_id)
    assert audit == "credential:no longer needed"
    assert await scalar(db, "SELECT COUNT(*) AS n FROM orbit_result_events WHERE task_id = %s"
                            " AND state = 'CANCELLED'", task_id) == 1


async def test_cancel_leased_withdraws_the_offer(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await cancel(db, tenant, task_id)
    assert (await task_row(db, tenant, task_id))["state"] == "CANCELLED"
    assert await scalar(db, "SELECT state FROM pulse_attempts WHERE id = %s",
                        grant.attempt_id) == "WITHDRAWN"
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 0
    (outcome,) = await start(db, tenant, [grant])
    assert not outcome.approved


async def test_cancel_running_is_an_intent_confirmed_by_the_worker(
    db: Database, tenant: Tenant
) -> None:
    task_id, grant = await running_task(db, tenant)
    outcome = await cancel(db, tenant, task_id)
    assert outcome.body["state"] == "RUNNING"
    assert outcome.body["cancel_requested"] is True
    renewed = await db.transaction("t", lambda cur: held.renew(
        cur, tenant.namespace_id,
        [AttemptRef(attempt_id=grant.attempt_id, token=grant.token,
                    generation=grant.generation)]))
    assert renewed[0].cancel_requested
    (done,) = await finish(db, tenant, [report(grant, "cancelled", error={"type": "stopped"})])
    assert done.task_state == "CANCELLED"


async def test_a_success_that_commits_first_wins_over_a_cancel(
    db: Database, tenant: Tenant
) -> None:
    task_id, grant = await running_task(db, tenant)
    await cancel(db, tenant, task_id)
    (done,) = await finish(db, tenant, [report(grant, "succeeded", result="{}")])
    assert done.task_state == "SUCCEEDED"
    again = await cancel(db, tenant, task_id)
    assert again.body["state"] == "SUCCEEDED"


async def test_cancelled_report_without_a_cancel_request_is_refused(
    db: Database, tenant: Tenant
) -> None:
    task_id, grant = await running_task(db, tenant)
    (done,) = await finish(db, tenant, [report(grant, "cancelled", error={"type": "x"})])
    assert not done.accepted
    assert done.reason == "cancel_not_requested"
    assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"


async def test_cancel_of_a_task_carrying_uncertainty_goes_to_review(
    db: Database, tenant: Tenant
) -> None:
    task_id, _grant = await running_task(db, tenant, rerun_safe=True)
    await expire_now(db, tenant, task_id)
    await recover(db)
    assert (await task_row(db, tenant, task_id))["effect_uncertain"] == 1
    outcome = await cancel(db, tenant, task_id)
    assert outcome.body["state"] == "NEEDS_REVIEW"


async def test_cancel_is_idempotent_with_a_key(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    first = await cancel(db, tenant, task_id, idempotency_key="c1")
    second = await cancel(db, tenant, task_id, idempotency_key="c1")
    assert first.body == second.body
    assert await scalar(db, "SELECT COUNT(*) AS n FROM orbit_audit_events WHERE resource_id = %s",
                        task_id) == 1


async def review(db: Database, who: credentials.Principal, tenant: Tenant, task_id: bytes,
                 **kw: Any) -> Any:
    """A complete review (decision failed) at the task's current revision; ``kw`` overrides."""
    fields: dict[str, Any] = {
        "decision": "failed", "reason": "checked the ledger", "evidence_ref": "TICKET-7",
        "execution_ended": True, "revision": (await task_row(db, tenant, task_id))["revision"]}
    fields.update(kw)
    return await interventions.review_task(db, who, namespace=tenant.namespace,
                                           task_id=task_id, **fields)


async def audit_count(db: Database, tenant: Tenant) -> Any:
    return await scalar(db, "SELECT COUNT(*) AS n FROM orbit_audit_events"
                            " WHERE namespace_id = %s", tenant.namespace_id)


async def test_review_resolves_needs_review(db: Database, tenant: Tenant) -> None:
    task_id, grant = await running_task(db, tenant)
    await finish(db, tenant, [report(grant, "unknown", error={"type": "Timeout"})])
    who = await principal(db, tenant)
    with pytest.raises(interventions.errors.ValidationFailed):
        await review(db, who, tenant, task_id, decision="maybe")
    judged = (await task_row(db, tenant, task_id))["revision"]
    outcome = await review(db, who, tenant, task_id, decision="succeeded",
                           result='{"charged": true}')
    assert outcome.body["state"] == "SUCCEEDED"
    row = await task_row(db, tenant, task_id)
    assert row["effect_uncertain"] == 0
    assert row["result"] == '{"charged": true}'
    audit = await db.read("t", lambda cur: _audit_row(cur, task_id, "task.review"))
    assert audit["evidence_ref"] == "TICKET-7"
    assert audit["reason"] == "checked the ledger"
    assert audit["before"]["revision"] == judged
    assert audit["after"]["execution_ended"] is True
    with pytest.raises(interventions.TaskNotReviewable):
        await review(db, who, tenant, task_id)


async def _audit_row(cur: Any, resource_id: bytes, action: str) -> dict[str, Any]:
    await cur.execute("SELECT reason, evidence_ref, before_doc, after_doc FROM orbit_audit_events"
                      " WHERE resource_id = %s AND action = %s", (resource_id, action))
    row = await cur.fetchone()
    return {"reason": row["reason"], "evidence_ref": row["evidence_ref"],
            "before": json.loads(row["before_doc"]), "after": json.loads(row["after_doc"])}


@pytest.mark.parametrize(("change", "error"), [
    ({"evidence_ref": ""}, interventions.errors.ValidationFailed),
    ({"reason": ""}, interventions.errors.ValidationFailed),
    ({"revision": 0}, interventions.errors.ValidationFailed),
    ({"execution_ended": False}, interventions.ConfirmationRequired),
    ({"revision": "current - 1"}, interventions.errors.StaleRevision),
    ({"revision": "current + 1"}, interventions.errors.StaleRevision),
])
async def test_a_review_without_its_contract_is_refused_and_writes_nothing(
    db: Database, tenant: Tenant, change: dict[str, Any], error: type[Exception],
) -> None:
    """Specification 000 §2: evidence, an explicit end-of-execution declaration and the
    revision judged (a task that changed since is a stale revision)."""
    task_id, grant = await running_task(db, tenant)
    await finish(db, tenant, [report(grant, "unknown", error={"type": "Timeout"})])
    who = await principal(db, tenant)
    current = (await task_row(db, tenant, task_id))["revision"]
    if isinstance(change.get("revision"), str):
        change = {"revision": current + (1 if change["revision"].endswith("+ 1") else -1)}
    before = await audit_count(db, tenant)
    with pytest.raises(error):
        await review(db, who, tenant, task_id, **change)
    row = await task_row(db, tenant, task_id)
    assert (row["state"], row["revision"]) == ("NEEDS_REVIEW", current)
    assert await audit_count(db, tenant) == before


async def test_an_operator_cancel_needs_a_reason_and_a_client_cancel_does_not(
    db: Database, tenant: Tenant
) -> None:
    """Operator = a credential that may also manage the task's queue (queues.manage)."""
    queue = await make_queue(db, tenant)
    operator_task, client_task = await add_tasks(db, tenant, queue, 2)
    before = await audit_count(db, tenant)
    with pytest.raises(interventions.errors.ValidationFailed) as refused:
        await cancel(db, tenant, operator_task, reason=None)
    assert refused.value.errors[0]["path"] == "$.reason"
    assert (await task_row(db, tenant, operator_task))["state"] == "WAITING"
    assert await audit_count(db, tenant) == before

    client_key = await make_key(db, tenant, [{"namespaces": [tenant.namespace],
                                              "actions": ["tasks.read", "tasks.cancel"]}])
    client = await db.read("test.auth", lambda cur: credentials.authenticate(cur, client_key))
    outcome = await interventions.cancel_task(db, client, namespace=tenant.namespace,
                                              task_id=client_task, reason=None)
    assert outcome.body["state"] == "CANCELLED"
    audit = await db.read("t", lambda cur: _audit_row(cur, client_task, "task.cancel"))
    assert (audit["reason"], audit["after"]["by"]) == (None, "client")

    await cancel(db, tenant, operator_task, reason="duplicate order")
    audit = await db.read("t", lambda cur: _audit_row(cur, operator_task, "task.cancel"))
    assert (audit["reason"], audit["after"]["by"]) == ("duplicate order", "operator")


async def test_manual_retry_creates_exactly_one_successor(db: Database, tenant: Tenant) -> None:
    task_id, grant = await running_task(db, tenant)
    await finish(db, tenant, [report(grant, "failed", error={"type": "Boom"})])
    who = await principal(db, tenant)
    with pytest.raises(interventions.ConfirmationRequired):
        await interventions.retry_task(db, who, namespace=tenant.namespace, task_id=task_id,
                                       reason="fixed upstream", rerun_confirmed=False)
    outcome = await interventions.retry_task(db, who, namespace=tenant.namespace,
                                             task_id=task_id, reason="fixed upstream",
                                             rerun_confirmed=True)
    assert outcome.status == 201
    successor = bytes.fromhex(outcome.body["id"])
    row = await task_row(db, tenant, successor)
    assert row["retry_of"] == task_id
    assert row["state"] == "WAITING"
    assert row["attempts_used"] == 0
    assert (await task_row(db, tenant, task_id))["state"] == "FAILED"
    with pytest.raises(interventions.AlreadyRetried):
        await interventions.retry_task(db, who, namespace=tenant.namespace, task_id=task_id,
                                       reason="again", rerun_confirmed=True)


async def test_interventions_see_only_their_tenant(db: Database, tenant: Tenant) -> None:
    from tests.conftest import make_tenant

    other = await make_tenant(db)
    queue = await make_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    with pytest.raises(interventions.TaskNotFound):
        await interventions.cancel_task(db, await principal(db, other),
                                        namespace=other.namespace, task_id=task_id, reason=None)
    assert (await task_row(db, tenant, task_id))["state"] == "WAITING"


async def test_forged_finish_reports_cannot_end_a_task(db: Database, tenant: Tenant) -> None:
    task_id, grant = await running_task(db, tenant)
    wrong_generation = FinishReport(
        ref=AttemptRef(attempt_id=grant.attempt_id, token=grant.token,
                       generation=grant.generation + 1),
        report_id=b"x", outcome="succeeded", result="{}")
    (done,) = await finish(db, tenant, [wrong_generation])
    assert done.reason == "invalid_attempt"
    assert (await task_row(db, tenant, task_id))["state"] == "RUNNING"


# --- the in-transaction cancel the workflow engine shares with the API -------------------------


async def _task_events(db: Database, task_id: bytes) -> list[tuple[str, Any]]:
    async def body(cur: Any) -> list[tuple[str, Any]]:
        await cur.execute("SELECT event_type, payload FROM orbit_events WHERE aggregate_type ="
                          " 'task' AND aggregate_id = %s ORDER BY aggregate_revision", (task_id,))
        return [(r["event_type"], json.loads(r["payload"])) for r in await cur.fetchall()]

    return await db.read("test.events", body)


async def test_request_cancel_applies_the_cancel_semantics_to_a_batch(
    db: Database, tenant: Tenant
) -> None:
    """One call, every state: WAITING and LEASED end now, RUNNING gets one intent, a repeat or
    a finished task changes nothing, NEEDS_REVIEW is reported and left to a person; the events
    say who asked, and no audit row is written (the caller is Orbit itself)."""
    queue = await make_queue(db, tenant)
    leased, running, requested, done, review_ = await add_tasks(db, tenant, queue, 5)
    session = await open_session(db, tenant, [queue])
    grants = {g.task_id: g for g in await claim(db, session, queue)}
    (waiting,) = await add_tasks(db, tenant, queue)
    await start(db, tenant, [grants[t] for t in (running, requested, done, review_)])
    await finish(db, tenant, [report(grants[done], "succeeded", result="{}"),
                              report(grants[review_], "unknown", error={"type": "lost"})])
    await cancel(db, tenant, requested)
    audits = await audit_count(db, tenant)
    missing = b"\x00" * 16

    async def body(cur: Any) -> dict[bytes, str]:
        now = await db_now(cur)
        return await interventions.request_cancel(
            cur, tenant.namespace_id, [review_, done, requested, running, leased, waiting,
                                       missing], reason="workflow block closed", now=now,
            by="workflow")

    outcome = await db.transaction("test.request_cancel", body)
    assert outcome == {waiting: "cancelled", leased: "cancelled", running: "cancel_requested",
                       requested: "already_requested", done: "already_ended",
                       review_: "awaits_review", missing: "not_found"}
    states = {t: (await task_row(db, tenant, t))["state"]
              for t in (waiting, leased, running, requested, done, review_)}
    assert states == {waiting: "CANCELLED", leased: "CANCELLED", running: "RUNNING",
                      requested: "RUNNING", done: "SUCCEEDED", review_: "NEEDS_REVIEW"}
    assert (await task_row(db, tenant, running))["cancel_reason"] == "workflow block closed"
    ours = {"reason": "workflow block closed", "by": "workflow"}
    assert (await _task_events(db, running))[-1] == ("task.cancel_requested", ours)
    assert (await _task_events(db, leased))[-1] == ("task.cancelled", ours)
    # The API's intent keeps its payload and is not repeated.
    assert [e for e in await _task_events(db, requested) if e[0] == "task.cancel_requested"] \
        == [("task.cancel_requested", {"reason": "no longer needed"})]
    assert await audit_count(db, tenant) == audits
    assert await scalar(db, "SELECT state FROM pulse_attempts WHERE id = %s",
                        grants[leased].attempt_id) == "WITHDRAWN"
    assert await scalar(db, "SELECT active_attempts FROM pulse_queues WHERE id = %s",
                        queue.id) == 2  # the two RUNNING ones


async def test_the_api_cancel_keeps_its_event_payloads(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    (waiting,) = await add_tasks(db, tenant, queue)
    await cancel(db, tenant, waiting)
    assert (await _task_events(db, waiting))[-1] == ("task.cancelled",
                                                     {"reason": "no longer needed"})
    running, _grant = await running_task(db, tenant)
    await cancel(db, tenant, running, reason="stop")
    assert (await _task_events(db, running))[-1] == ("task.cancel_requested", {"reason": "stop"})

"""The authorization matrix: every route of the API × every caller that must be refused.

A victim namespace (queues, tasks in several states, an attempt, schedules, keys, idempotency
receipts) is built once per module. For every route the router serves, a valid request against
the victim's objects is sent with each attacker key — another tenant's, the victim's own
application's key without the route's action, one for another namespace of that application, one
scoped to another queue, a revoked one — and
the answer must be a refusal (401/403/404 as docs/authentication.md says: never 2xx, no 409 that
confirms an object, no 5xx) that leaves every row of the victim byte-identical. The victim's own
full key is the control: the same request against an identical twin succeeds, so each refusal
is the authorization's and not the body's. Idempotency replays: the victim first commands with
an ``Idempotency-Key``; the attacker's same key (same and different body) gets no replay and no
conflict. A route the router serves that is neither in :data:`ROUTES` nor in
:data:`NOT_EXERCISED` fails :func:`test_every_route_is_in_the_matrix`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import attrs
import pymysql
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient

from orbit_api.app import create_app
from orbit_common.db.pool import Database, DatabaseUrl, connect_sync, open_database
from orbit_common.db.schema import SchemaChecker
from orbit_common.model.sealing import new_key_text
from orbit_common.platform import PLATFORM_NAMESPACE_ID, authz, credentials
from orbit_common.platform.audit import Actor
from orbit_common.pulse.workers import QueueRef
from orbit_common.service.config import DeliveryConfig
from orbit_common.service.health import ReadinessGate
from tests.conftest import Tenant, api_config, make_key, make_tenant
from tests.integration.test_leases import claim, finish, report, start
from tests.support import database, relay
from tests.support.lease_fixtures import open_session, wait_db_time_past
from tests.support.openapi_routes import served_routes
from tests.support.servers import ServiceTestServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

ALL = frozenset(a.value for a in authz.Action)
QUEUE = "victim-qa"  # every victim object lives here
OTHER_QUEUE = "victim-qb"  # the queue-scoped attacker's queue (real, in the victim's namespace)
SCHEDULE = "victim-sched-a"
REPLAY_SCHEDULE = "victim-sched-r"
TEMPLATE = {"handler": "reports.build", "input": {"day": "today"}}
DAILY = {"cron": "0 9 * * *", "timezone": "UTC"}


# --- the victim's objects -----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Objects:
    """One set of objects a request can address (path parameters and body values)."""

    application: str
    namespace: str
    schedule: str
    waiting: str  # task ids, hex
    review: str  # NEEDS_REVIEW, with one attempt
    failed: str
    attempt: str  # the review task's attempt
    review_revision: int
    schedule_revision: int
    resources_revision: int
    queue_revision: int
    pull: str  # a PULL subscription of the victim's queue
    hook: str  # a WEBHOOK subscription of the victim's queue
    subscription_revision: int  # the pull subscription's
    leased: str  # a LEASED delivery of the pull subscription, with its token
    token: str = attrs.field(repr=False)
    exhausted: str  # an EXHAUSTED delivery of the pull subscription
    definition: str  # a workflow definition with version 1 (a TASK step on the victim's queue)
    definition_revision: int
    workflow: str  # an instance of it, hex, with the definition's name as its business key
    signal: str  # a signal sent to it, hex
    poll_revision: int = 0  # its POLL step a, held after its round's task was cancelled
    wait_revision: int = 0  # its SIGNAL step s, held after its wait timed out


@attrs.frozen(kw_only=True)
class Victim:
    tenant: Tenant
    plain: Objects  # addressed by the plain matrix requests
    replay: Objects  # addressed by the victim's own idempotent commands, replayed by attackers
    receipts: dict[tuple[str, str], tuple[int, Any]]  # route → the victim's original answer


# --- the routes ---------------------------------------------------------------------------------

Body = Callable[[Objects], Any]
Route = tuple[str, str]  # (method, path template) as the router has it


@attrs.frozen(kw_only=True)
class Case:
    """How to send a valid request to a route, and what it needs.

    ``needs``: for each element, at least one of its actions must be granted (a key without all
    of an element's actions is an attacker). ``task``: which task ``{task_id}`` names.
    ``listing``: a namespace-wide list, which a key that sees the namespace but not the victim's
    queue may read (200) as long as nothing of the victim's queue is in it. ``body2``: a
    different valid body for the idempotency conflict case (None: the route takes no
    ``Idempotency-Key``).
    """

    needs: tuple[frozenset[str], ...]
    body: Body | None = None
    body2: Body | None = None
    task: str = "review"
    subscription: str = "pull"  # which subscription {subscription} names
    delivery: str = "leased"  # which delivery {delivery_id} names
    listing: bool = False
    global_: bool = False  # not addressed to a namespace: see _check_global
    control_body: Body | None = None  # when the control cannot repeat the attack's body
    step: str = "a"  # which step {step} names
    # The control's answer when the twin's object is never in the state the command needs (a
    # step recovery: its step waits for no person): this 409 code, the command's own refusal
    # after the authorization passed, instead of a 2xx.
    control_code: str | None = None
    replay_body: Body | None = None  # the victim's idempotent command, when not ``body``

    def replayed(self, o: Objects) -> Any:
        make = self.replay_body or self.body
        assert make is not None
        return make(o)


def one(*actions: authz.Action) -> frozenset[str]:
    return frozenset(a.value for a in actions)


A = authz.Action
TASKS = "/v1/namespaces/{namespace}/tasks"
TASK = TASKS + "/{task_id}"
QUEUES = "/v1/namespaces/{namespace}/queues"
SCHEDULES = "/v1/namespaces/{namespace}/schedules"
SCHED = SCHEDULES + "/{schedule}"
SUBSCRIPTIONS = "/v1/namespaces/{namespace}/subscriptions"
SUB = SUBSCRIPTIONS + "/{subscription}"
DELIVERY = SUB + "/deliveries/{delivery_id}"
WF_DEFS = "/v1/namespaces/{namespace}/workflow-definitions"
WF_DEF = WF_DEFS + "/{definition}"
WORKFLOWS = "/v1/namespaces/{namespace}/workflows"
# A document without TASK steps: publishing and validating it need workflows.manage only (a
# queue a credential may not submit to is a definition_invalid problem, not a refusal).
NO_TASKS = {"format": "orbit.weave/1", "start": "done", "steps": {"done": {"kind": "SUCCEED"}}}


def _flow_document(queue: str) -> dict[str, Any]:
    """A POLL step a (its rounds are a route of their own) on ``queue`` and a SIGNAL step s,
    each held for a person when it fails or times out (re-arm, continue), and a TASK step t
    that waits for no person (retry and resolve refuse it), in parallel."""
    return {"format": "orbit.weave/1", "start": "p", "steps": {
        "p": {"kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "done",
              "branches": [
                  {"name": "x", "start": "a", "steps": {
                      "a": {"kind": "POLL", "queue": queue, "handler": "noop",
                            "until": "round.result == 1", "interval_ms": 1000,
                            "max_rounds": 2, "on_failure": "$hold", "next": "ax"},
                      "ax": {"kind": "SUCCEED"}}},
                  {"name": "y", "start": "s", "steps": {
                      "s": {"kind": "SIGNAL", "signal": "approval", "timeout_ms": 1,
                            "on_timeout": "$hold", "next": "sy"},
                      "sy": {"kind": "SUCCEED"}}},
                  {"name": "z", "start": "t", "steps": {
                      "t": {"kind": "TASK", "queue": queue, "handler": "noop", "next": "tz"},
                      "tz": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED"}}}


async def _enter(db: Database, tenant: Tenant, instance_id: str) -> None:
    """Advance this one instance's start (its POLL step's first round) with the engine, without
    an engine scan over the shared database: its ROOT row leased here, then advanced."""
    from orbit_common.weave.engine import Engine

    owner, raw_id = "matrix-engine", bytes.fromhex(instance_id)

    async def lease(cur: Any) -> list[dict[str, Any]]:
        await cur.execute(
            "UPDATE weave_pending_advances SET state = 'LEASED', lease_owner = %s,"
            " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, attempts = attempts + 1"
            " WHERE namespace_id = %s AND instance_id = %s AND kind = 'ROOT'",
            (owner, tenant.namespace_id, raw_id))
        await cur.execute("SELECT * FROM weave_pending_advances WHERE namespace_id = %s"
                          " AND instance_id = %s AND kind = 'ROOT'",
                          (tenant.namespace_id, raw_id))
        return [dict(r) for r in await cur.fetchall()]

    rows = await db.transaction("test.lease_root", lease)
    done = await Engine(db, owner=owner).advance(tenant.namespace_id, raw_id, [], rows)
    assert done.outcomes == {"advanced": 1}, done
    await _hold(db, tenant, raw_id, Engine(db, owner=owner))


async def _hold(db: Database, tenant: Tenant, raw_id: bytes, engine: Any) -> None:
    """Hold both steps, advancing only this instance: the POLL round's task cancelled (its
    inbox row advanced: task_failed, held), the SIGNAL wait's timeout (held)."""
    from orbit_common.db.clock import db_now
    from orbit_common.pulse import interventions

    ns, owner = tenant.namespace_id, engine.owner

    async def cancel(cur: Any) -> None:
        await cur.execute("SELECT a.task_id FROM weave_activations a JOIN weave_steps s"
                          " ON s.namespace_id = a.namespace_id AND s.instance_id = a.instance_id"
                          " AND s.id = a.step_id WHERE a.namespace_id = %s"
                          " AND a.instance_id = %s AND s.name = 'a'", (ns, raw_id))
        (row,) = await cur.fetchall()
        await interventions.request_cancel(cur, ns, [row["task_id"]], reason="matrix",
                                           now=await db_now(cur), by="workflow")

    await db.transaction("test.cancel_round", cancel)

    async def lease(cur: Any, table: str, where: str) -> list[dict[str, Any]]:
        await cur.execute(f"UPDATE {table} SET state = 'LEASED', lease_owner = %s,"
                          " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR,"
                          f" attempts = attempts + 1 WHERE namespace_id = %s AND instance_id = %s"
                          f" AND {where}", (owner, ns, raw_id))
        await cur.execute(f"SELECT * FROM {table} WHERE namespace_id = %s AND instance_id = %s"
                          " AND state = 'LEASED' AND lease_owner = %s", (ns, raw_id, owner))
        return [dict(r) for r in await cur.fetchall()]

    inbox = await db.transaction("test.lease_inbox", lambda cur: lease(
        cur, "weave_inbox", "state = 'PENDING'"))
    done = await engine.advance(ns, raw_id, inbox, [])
    assert done.outcomes == {"advanced": 1}, done

    async def deadline(cur: Any) -> Any:
        await cur.execute("SELECT deadline_at FROM weave_waits WHERE namespace_id = %s"
                          " AND instance_id = %s", (ns, raw_id))
        return (await cur.fetchone())["deadline_at"]

    await wait_db_time_past(db, await db.read("test.deadline", deadline))
    due = await db.transaction("test.lease_timeout", lambda cur: lease(
        cur, "weave_pending_advances", "kind = 'SIGNAL'"))
    done = await engine.advance(ns, raw_id, [], due)
    assert done.outcomes == {"advanced": 1}, done


async def _held_revisions(db: Database, tenant: Tenant, instance_id: str) -> dict[str, int]:
    async def body(cur: Any) -> dict[str, int]:
        await cur.execute("SELECT name, revision FROM weave_steps WHERE namespace_id = %s"
                          " AND instance_id = %s AND held_at IS NOT NULL",
                          (tenant.namespace_id, bytes.fromhex(instance_id)))
        return {r["name"]: r["revision"] for r in await cur.fetchall()}

    return await db.read("test.held", body)


def _submit(o: Objects) -> dict[str, Any]:
    return {"queue": QUEUE, "handler": "noop", "input": {"n": 1}}


def _subscription_body(o: Objects) -> dict[str, Any]:
    return {"name": o.pull + "-new", "kind": "PULL", "filters": {"queues": [QUEUE]}}


def _schedule_body(o: Objects) -> dict[str, Any]:
    return {"name": o.schedule + "-new", "queue": QUEUE, "rule": DAILY, "template": TEMPLATE}


ROUTES: dict[Route, Case] = {
    ("GET", "/v1/whoami"): Case(needs=(), global_=True),
    ("GET", "/v1/namespaces"): Case(needs=(one(A.NAMESPACES_READ),), global_=True),
    # The name is the victim's: namespace names are global, so any caller allowed to create
    # one learns that the name is taken (409 already_exists, docs/authentication.md) — the
    # one documented 409 of the matrix; the control creates a fresh name.
    ("POST", "/v1/namespaces"): Case(
        needs=(one(A.NAMESPACES_CREATE),), global_=True,
        body=lambda o: {"name": o.namespace},
        control_body=lambda o: {"name": o.namespace + "-2"},
        replay_body=lambda o: {"name": o.namespace + "-made"},
        body2=lambda o: {"name": o.namespace + "-made", "description": "other"}),
    ("POST", "/v1/namespaces/{namespace}/disable"): Case(
        needs=(one(A.NAMESPACES_MANAGE),), body=lambda o: {"reason": "matrix"}),
    ("POST", "/v1/namespaces/{namespace}/enable"): Case(
        needs=(one(A.NAMESPACES_MANAGE),), body=lambda o: {"reason": "matrix"}),
    ("GET", "/v1/applications/{application}/resources"): Case(
        needs=(one(A.APPLICATIONS_READ, A.APPLICATIONS_MANAGE),)),
    ("PATCH", "/v1/applications/{application}/resources"): Case(
        needs=(one(A.APPLICATIONS_MANAGE),),
        body=lambda o: {"revision": o.resources_revision, "max_unfinished_tasks": 1234,
                        "reason": "matrix"}),
    ("GET", QUEUES): Case(needs=(one(A.QUEUES_READ),), listing=True),
    ("POST", QUEUES): Case(
        needs=(one(A.QUEUES_MANAGE),), body=lambda o: {"name": QUEUE + "-new"},
        body2=lambda o: {"name": QUEUE + "-new", "description": "other"}),
    ("GET", QUEUES + "/{queue}"): Case(needs=(one(A.QUEUES_READ),)),
    ("PATCH", QUEUES + "/{queue}"): Case(
        needs=(one(A.QUEUES_MANAGE),),
        body=lambda o: {"revision": o.queue_revision, "description": "changed"}),
    ("POST", QUEUES + "/{queue}/pause"): Case(
        needs=(one(A.QUEUES_MANAGE),), body=lambda o: {"reason": "matrix"}),
    ("POST", QUEUES + "/{queue}/resume"): Case(
        needs=(one(A.QUEUES_MANAGE),), body=lambda o: {"reason": "matrix"}),
    ("GET", TASKS): Case(needs=(one(A.TASKS_READ),), listing=True),
    ("POST", TASKS): Case(
        needs=(one(A.TASKS_SUBMIT),), body=_submit,
        body2=lambda o: {**_submit(o), "input": {"n": 2}}),
    ("POST", TASKS + "/batch"): Case(
        needs=(one(A.TASKS_SUBMIT),), body=lambda o: {"tasks": [_submit(o)]}),
    ("GET", TASK): Case(needs=(one(A.TASKS_READ),)),
    ("GET", TASK + "/source"): Case(needs=(one(A.TASKS_READ),)),
    ("GET", TASK + "/attempts"): Case(needs=(one(A.TASKS_READ),)),
    ("GET", TASK + "/events"): Case(needs=(one(A.TASKS_READ),)),
    ("GET", TASK + "/attempts/{attempt_id}/evidence"): Case(needs=(one(A.TASKS_READ),)),
    ("POST", TASK + "/cancel"): Case(
        needs=(one(A.TASKS_CANCEL),), task="waiting", body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    ("POST", TASK + "/review"): Case(
        needs=(one(A.TASKS_REVIEW),),
        body=lambda o: {"decision": "failed", "reason": "matrix", "evidence_ref": "M-1",
                        "execution_ended": True, "revision": o.review_revision},
        body2=lambda o: {"decision": "failed", "reason": "other", "evidence_ref": "M-2",
                         "execution_ended": True, "revision": o.review_revision}),
    ("POST", TASK + "/retry"): Case(
        needs=(one(A.TASKS_RETRY),), task="failed",
        body=lambda o: {"reason": "matrix", "rerun_confirmed": True},
        body2=lambda o: {"reason": "other", "rerun_confirmed": True}),
    ("GET", SCHEDULES): Case(needs=(one(A.SCHEDULES_READ),), listing=True),
    ("POST", SCHEDULES): Case(
        needs=(one(A.SCHEDULES_MANAGE), one(A.TASKS_SUBMIT)), body=_schedule_body,
        body2=lambda o: {**_schedule_body(o), "rule": {"cron": "0 10 * * *", "timezone": "UTC"}}),
    ("GET", SCHED): Case(needs=(one(A.SCHEDULES_READ),)),
    ("DELETE", SCHED): Case(
        needs=(one(A.SCHEDULES_MANAGE),), body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    ("POST", SCHED + "/versions"): Case(
        needs=(one(A.SCHEDULES_MANAGE), one(A.TASKS_SUBMIT)),
        body=lambda o: {"revision": o.schedule_revision, "rule": DAILY, "template": TEMPLATE},
        body2=lambda o: {"revision": o.schedule_revision,
                         "rule": {"cron": "0 11 * * *", "timezone": "UTC"},
                         "template": TEMPLATE}),
    ("POST", SCHED + "/pause"): Case(
        needs=(one(A.SCHEDULES_MANAGE),), body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    ("POST", SCHED + "/resume"): Case(
        needs=(one(A.SCHEDULES_MANAGE),), body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    # Trigger takes no fields, so there is no "different body" to conflict with.
    ("POST", SCHED + "/trigger"): Case(
        needs=(one(A.SCHEDULES_MANAGE), one(A.TASKS_SUBMIT)), body=lambda o: {}),
    ("POST", SCHED + "/backfill"): Case(
        needs=(one(A.SCHEDULES_MANAGE), one(A.TASKS_SUBMIT)),
        body=lambda o: {"start": "2024-01-01T00:00:00Z", "end": "2024-01-02T00:00:00Z",
                        "reason": "matrix"},
        body2=lambda o: {"start": "2024-01-01T00:00:00Z", "end": "2024-01-03T00:00:00Z",
                         "reason": "matrix"}),
    ("GET", SCHED + "/occurrences"): Case(needs=(one(A.SCHEDULES_READ),)),
    ("GET", SUBSCRIPTIONS): Case(needs=(one(A.SUBSCRIPTIONS_READ),), listing=True),
    ("POST", SUBSCRIPTIONS): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE), one(A.TASKS_READ)), body=_subscription_body,
        body2=lambda o: {**_subscription_body(o), "max_attempts": 3}),
    ("GET", SUB): Case(needs=(one(A.SUBSCRIPTIONS_READ),)),
    ("PATCH", SUB): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE),),
        body=lambda o: {"revision": o.subscription_revision, "max_attempts": 5},
        body2=lambda o: {"revision": o.subscription_revision, "max_attempts": 6}),
    ("POST", SUB + "/pause"): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE),), body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    ("POST", SUB + "/resume"): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE),), body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    ("POST", SUB + "/disable"): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE),), body=lambda o: {"reason": "matrix"},
        body2=lambda o: {"reason": "other"}),
    ("POST", SUB + "/rotate-secret"): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE),), subscription="hook",
        body=lambda o: {"window_s": 60}, body2=lambda o: {"window_s": 120}),
    ("GET", SUB + "/deliveries"): Case(needs=(one(A.SUBSCRIPTIONS_READ),)),
    ("GET", DELIVERY): Case(needs=(one(A.SUBSCRIPTIONS_READ),)),
    ("POST", DELIVERY + "/budget"): Case(
        needs=(one(A.SUBSCRIPTIONS_MANAGE),), delivery="exhausted",
        body=lambda o: {"attempts": 1, "reason": "matrix"},
        body2=lambda o: {"attempts": 2, "reason": "matrix"}),
    ("POST", SUB + "/lease"): Case(needs=(one(A.SUBSCRIPTIONS_CONSUME),),
                                   body=lambda o: {"max": 5}),
    ("POST", DELIVERY + "/ack"): Case(needs=(one(A.SUBSCRIPTIONS_CONSUME),),
                                      body=lambda o: {"token": o.token}),
    ("POST", DELIVERY + "/fail"): Case(needs=(one(A.SUBSCRIPTIONS_CONSUME),),
                                       body=lambda o: {"token": o.token, "error": "matrix"}),
    ("POST", SUB + "/settle"): Case(
        needs=(one(A.SUBSCRIPTIONS_CONSUME),),
        body=lambda o: {"items": [{"delivery_id": o.leased, "token": o.token,
                                   "outcome": "acknowledged"}]}),
    ("GET", WF_DEFS): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("POST", WF_DEFS): Case(
        needs=(one(A.WORKFLOWS_MANAGE),), body=lambda o: {"name": o.definition + "-new"},
        body2=lambda o: {"name": o.definition + "-new", "description": "other"}),
    ("GET", WF_DEF): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("POST", WF_DEF + "/versions"): Case(
        needs=(one(A.WORKFLOWS_MANAGE),),
        body=lambda o: {"revision": o.definition_revision, "document": NO_TASKS},
        body2=lambda o: {"revision": o.definition_revision,
                         "document": {**NO_TASKS, "description": "other"}}),
    ("GET", WF_DEF + "/versions/{version}"): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("POST", "/v1/namespaces/{namespace}/workflow-validations"): Case(
        needs=(one(A.WORKFLOWS_MANAGE),), body=lambda o: {"document": NO_TASKS}),
    ("GET", WORKFLOWS): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("POST", WORKFLOWS): Case(
        needs=(one(A.WORKFLOWS_START), one(A.TASKS_SUBMIT)),
        # Version 1 (its TASK step on the victim's queue): the replays publish a version 2
        # without TASK steps first, which a queue-scoped key with workflows.start may start.
        body=lambda o: {"definition": o.definition, "version": 1, "input": {"n": 1}},
        body2=lambda o: {"definition": o.definition, "version": 1, "input": {"n": 2}}),
    ("POST", WORKFLOWS + "/batch"): Case(
        needs=(one(A.WORKFLOWS_START), one(A.TASKS_SUBMIT)),
        body=lambda o: {"instances": [{"definition": o.definition, "version": 1,
                                       "input": {"n": 1}}]}),
    ("GET", WORKFLOWS + "/{workflow_id}"): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("POST", WORKFLOWS + "/{workflow_id}/signals"): Case(
        needs=(one(A.WORKFLOWS_SIGNAL),),
        body=lambda o: {"name": "go", "payload": 1, "payload_version": 1},
        body2=lambda o: {"name": "go", "payload": 2, "payload_version": 1}),
    ("GET", WORKFLOWS + "/{workflow_id}/signals"): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("GET", WORKFLOWS + "/{workflow_id}/signals/{signal_id}"): Case(
        needs=(one(A.WORKFLOWS_READ),)),
    ("POST", "/v1/namespaces/{namespace}/workflow-signals"): Case(
        needs=(one(A.WORKFLOWS_SIGNAL),),
        body=lambda o: {"definition": o.definition, "business_key": o.definition,
                        "name": "go", "payload": 1, "payload_version": 1},
        body2=lambda o: {"definition": o.definition, "business_key": o.definition,
                         "name": "go", "payload": 2, "payload_version": 1}),
    ("GET", WORKFLOWS + "/{workflow_id}/steps/{step}/rounds"): Case(
        needs=(one(A.WORKFLOWS_READ),)),
    ("GET", WORKFLOWS + "/{workflow_id}/waits"): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("GET", WORKFLOWS + "/{workflow_id}/timeline"): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("GET", WORKFLOWS + "/{workflow_id}/tasks"): Case(needs=(one(A.WORKFLOWS_READ),)),
    ("POST", WORKFLOWS + "/{workflow_id}/pause"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),), body=lambda o: {"reason": "ops"},
        body2=lambda o: {"reason": "other"}),
    ("POST", WORKFLOWS + "/{workflow_id}/resume"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),), body=lambda o: {"reason": "ops"},
        body2=lambda o: {"reason": "other"}),
    # Step recovery: the victim's TASK step t is not waiting for a person, so no victim receipt
    # to replay (their replays are tests/integration/weave/test_recovery.py's); its POLL step a
    # and SIGNAL step s are held, so re-arm and continue succeed (and are replayed).
    ("POST", WORKFLOWS + "/{workflow_id}/steps/{step}/retry"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),), step="t",
        body=lambda o: {"reason": "ops", "step_revision": 1},
        control_code="step_not_retryable"),
    ("POST", WORKFLOWS + "/{workflow_id}/steps/{step}/resolve"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),), step="t",
        body=lambda o: {"reason": "ops", "evidence_ref": "e", "step_revision": 1,
                        "conclusion": "failed", "error": "given_up"},
        control_code="step_not_resolvable"),
    ("POST", WORKFLOWS + "/{workflow_id}/steps/{step}/rearm"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),), step="s",
        body=lambda o: {"reason": "ops", "step_revision": o.wait_revision,
                        "timeout_ms": 60_000},
        body2=lambda o: {"reason": "other", "step_revision": o.wait_revision,
                         "timeout_ms": 60_000}),
    ("POST", WORKFLOWS + "/{workflow_id}/steps/{step}/continue"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),),
        body=lambda o: {"reason": "ops", "step_revision": o.poll_revision, "rounds": 1},
        body2=lambda o: {"reason": "other", "step_revision": o.poll_revision, "rounds": 1}),
    ("POST", WORKFLOWS + "/{workflow_id}/cancel"): Case(
        needs=(one(A.WORKFLOWS_CONTROL),), body=lambda o: {"reason": "ops"},
        body2=lambda o: {"reason": "other"}),
}

# Routes the router serves that the matrix does not send attacker keys to, with the reason.
NOT_EXERCISED: dict[Route, str] = {
    ("GET", "/healthz"): "operational, no credential and no tenant data (test_health.py)",
    ("GET", "/readyz"): "operational, no credential and no tenant data (test_health.py)",
    ("GET", "/metrics"): "operational, no credential; process-wide series only (test_metrics.py)",
    ("GET", "/v1/openapi.json"): "the static document, no credential (test_openapi.py)",
    ("GET", SUB + "/stream"): "a WebSocket upgrade, which a plain request cannot make: its "
    "refusals before the upgrade (401, 403, 404) are test_subscription_stream.py's",
}

# Idempotent commands whose receipt an attacker tries to replay (Case.body2 is set), in the
# order the victim sends them: a new version before pause and resume change the schedule's
# revision, and the disabling DELETE and the workflow's cancel (after it a signal, a pause or a
# resume of the instance is refused) last.
REPLAYED = sorted((r for r, c in ROUTES.items() if c.body2 is not None),
                  key=lambda r: (r[0] == "DELETE" or r == ("POST", SUB + "/disable")
                                 or r == ("POST", WORKFLOWS + "/{workflow_id}/cancel"),
                                 r[1].endswith(("/pause", "/resume")), r))


def without_keys() -> list[frozenset[str]]:
    """The action sets that make a "without" attacker: one per element of some route's needs."""
    return sorted({n for case in ROUTES.values() for n in case.needs}, key=sorted)


def without_name(actions: frozenset[str]) -> str:
    return "without-" + "+".join(sorted(actions))


ATTACKERS_FIXED = ("other-tenant", "other-namespace", "other-queue", "revoked")


def attackers(case: Case) -> list[str]:
    return [*ATTACKERS_FIXED, *(without_name(n) for n in case.needs)]


def route_id(route: Route) -> str:
    return f"{route[0]} {route[1]}"


MATRIX = [pytest.param(route, who, id=f"{route_id(route)} as {who}")
          for route, case in ROUTES.items() for who in attackers(case)]
REPLAYS = [pytest.param(route, who, variant, id=f"{route_id(route)} replayed by {who} ({variant})")
           for route in REPLAYED for who in attackers(ROUTES[route])
           for variant in ("same body", "other body")]


# --- requests -----------------------------------------------------------------------------------


def path_of(route: Route, o: Objects) -> str:
    case = ROUTES[route]
    return route[1].format(
        namespace=o.namespace, application=o.application, queue=QUEUE, schedule=o.schedule,
        task_id=getattr(o, case.task), attempt_id=o.attempt,
        subscription=getattr(o, case.subscription), delivery_id=getattr(o, case.delivery),
        definition=o.definition, version=1, workflow_id=o.workflow, signal_id=o.signal,
        step=case.step)


async def send(client: TestClient[Any, Any], route: Route, o: Objects, key: str, *,
               body: Any = None, idempotency_key: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body)
    response = await client.request(route[0], path_of(route, o), data=data, headers=headers)
    return response.status, await response.text()


# --- the world ----------------------------------------------------------------------------------


async def _queue_ref(db: Database, tenant: Tenant, name: str) -> QueueRef:
    async def body(cur: Any) -> QueueRef:
        await cur.execute("SELECT id, gate_id FROM pulse_queues WHERE namespace_id = %s"
                          " AND name = %s", (tenant.namespace_id, name))
        row = await cur.fetchone()
        return QueueRef(id=row["id"], name=name, gate_id=row["gate_id"])

    return await db.read("test.queue_ref", body)


async def _ok(client: TestClient[Any, Any], method: str, path: str, tenant: Tenant,
              body: Any = None) -> Any:
    response = await client.request(method, path, json=body, headers=tenant.auth)
    text = await response.text()
    assert 200 <= response.status < 300, (method, path, text)
    return json.loads(text)


async def _objects(db: Database, client: TestClient[Any, Any], tenant: Tenant,
                   schedules: list[str]) -> list[Objects]:
    """Per schedule name, a set of objects: a task in NEEDS_REVIEW (with its attempt), a FAILED
    one, a WAITING one (submitted after the claim), the schedule."""
    ns = f"/v1/namespaces/{tenant.namespace}"
    qa = await _queue_ref(db, tenant, QUEUE)
    ended = [(await _ok(client, "POST", ns + "/tasks", tenant, _submit_for()))["id"]
             for _ in range(2 * len(schedules))]
    session = await open_session(db, tenant, [qa])
    grants = {g.task_id.hex(): g for g in await claim(db, session, qa)}
    assert set(grants) == set(ended)
    await start(db, tenant, list(grants.values()))
    reviews, failures = ended[::2], ended[1::2]
    await finish(db, tenant, [report(grants[t], "unknown", error={"type": "Timeout"})
                              for t in reviews]
                 + [report(grants[t], "failed", error={"type": "Bad"}) for t in failures])
    resources = await _ok(client, "GET", f"/v1/applications/{tenant.application}/resources",
                          tenant)
    queue = await _ok(client, "GET", f"{ns}/queues/{QUEUE}", tenant)
    found = []
    for schedule, review, failed in zip(schedules, reviews, failures, strict=True):
        waiting = (await _ok(client, "POST", ns + "/tasks", tenant, _submit_for()))["id"]
        task = await _ok(client, "GET", f"{ns}/tasks/{review}", tenant)
        assert task["state"] == "NEEDS_REVIEW", task
        made = await _ok(client, "POST", ns + "/schedules", tenant,
                         {"name": schedule, "queue": QUEUE, "rule": DAILY, "template": TEMPLATE})
        pull, hook = schedule + "-pull", schedule + "-hook"
        # From sequence 0: the ended tasks' results are delivered; one fails for good
        # (max_attempts 1), one stays leased for the module (lease_ms 1 h).
        sub = await _ok(client, "POST", ns + "/subscriptions", tenant, {
            "name": pull, "kind": "PULL", "filters": {"queues": [QUEUE]}, "max_attempts": 1,
            "lease_ms": 3_600_000, "start_after_sequence": 0})
        await _ok(client, "POST", ns + "/subscriptions", tenant, {
            "name": hook, "kind": "WEBHOOK", "endpoint_url": "https://hooks.example.com/m",
            "filters": {"queues": [QUEUE]}})
        await relay.fan_out_all(db, tenant)
        gone, kept = (await _ok(client, "POST", f"{ns}/subscriptions/{pull}/lease", tenant,
                                {"max": 2}))["items"]
        await _ok(client, "POST",
                  f"{ns}/subscriptions/{pull}/deliveries/{gone['delivery']['id']}/fail", tenant,
                  {"token": gone["lease_token"]})
        flow = schedule + "-flow"
        await _ok(client, "POST", ns + "/workflow-definitions", tenant, {"name": flow})
        published = await _ok(client, "POST", f"{ns}/workflow-definitions/{flow}/versions",
                              tenant, {"revision": 1, "document": _flow_document(QUEUE)})
        instance = await _ok(client, "POST", ns + "/workflows", tenant,
                             {"definition": flow, "input": {}, "business_key": flow})
        await _enter(db, tenant, instance["id"])
        held = await _held_revisions(db, tenant, instance["id"])
        sent = await _ok(client, "POST", f"{ns}/workflows/{instance['id']}/signals", tenant,
                         {"name": "go", "payload_version": 1})
        found.append(Objects(
            application=tenant.application, namespace=tenant.namespace, schedule=schedule,
            waiting=waiting, review=review, failed=failed,
            attempt=grants[review].attempt_id.hex(), review_revision=task["revision"],
            schedule_revision=made["revision"], resources_revision=resources["revision"],
            queue_revision=queue["revision"], pull=pull, hook=hook,
            subscription_revision=sub["revision"], leased=kept["delivery"]["id"],
            token=kept["lease_token"], exhausted=gone["delivery"]["id"], definition=flow,
            definition_revision=published["revision"], workflow=instance["id"],
            signal=sent["id"], poll_revision=held["a"], wait_revision=held["s"]))
    return found


def _submit_for() -> dict[str, Any]:
    return {"queue": QUEUE, "handler": "noop", "input": {"n": 0}}


async def build_victim(db: Database, client: TestClient[Any, Any], *,
                       replays: bool) -> Victim:
    tenant = await make_tenant(db)
    ns = f"/v1/namespaces/{tenant.namespace}"
    for name in (QUEUE, OTHER_QUEUE):
        await _ok(client, "POST", ns + "/queues", tenant, {"name": name})
    if not replays:
        (plain,) = await _objects(db, client, tenant, [SCHEDULE])
        return Victim(tenant=tenant, plain=plain, replay=plain, receipts={})
    plain, replay = await _objects(db, client, tenant, [SCHEDULE, REPLAY_SCHEDULE])
    receipts = {}
    for route in REPLAYED:
        status, text = await send(client, route, replay, tenant.api_key,
                                  body=ROUTES[route].replayed(replay),
                                  idempotency_key=replay_key(route))
        assert 200 <= status < 300, (route, status, text)
        receipt = json.loads(text)
        receipt.pop("secret", None)  # a webhook secret is in the first answer only, never replayed
        receipts[route] = (status, receipt)
    return Victim(tenant=tenant, plain=plain, replay=replay, receipts=receipts)


def replay_key(route: Route) -> str:
    return f"victim-{route[0]}-{route[1]}"[:128]


@attrs.frozen(kw_only=True)
class World:
    db: Database
    client: TestClient[Any, Any]
    conn: pymysql.connections.Connection[Any]
    victim: Victim
    twin: Victim  # built like the victim, for the controls of the routes that only read
    keys: dict[str, str]  # attacker name → API key
    snapshot_sql: tuple[str, tuple[str, ...]]  # the SELECT and its parameters' names
    served: frozenset[Route]


@pytest.fixture(scope="module")
def scratch_url(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A migrated database of the module's own, so that every table can be read whole."""
    name = database.scratch_name("orbit_authz")
    yield database.create_database(server_url, name)
    database.drop_database(server_url, name)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(scratch_url: DatabaseUrl) -> AsyncIterator[World]:
    db = await open_database(scratch_url, minsize=1, maxsize=10)
    config = attrs.evolve(api_config(scratch_url),
                          delivery=DeliveryConfig(secret_key=new_key_text()))  # webhooks
    app = create_app(config, db, ReadinessGate(SchemaChecker(db)))
    served = frozenset((m.upper(), p) for p, m in served_routes(app))
    client = TestClient(ServiceTestServer(app))
    await client.start_server()
    conn = connect_sync(scratch_url, autocommit=True)
    try:
        victim = await build_victim(db, client, replays=True)
        tenant = victim.tenant
        keys = {
            "own": tenant.api_key,
            "other-tenant": (await make_tenant(db)).api_key,
            "other-queue": await make_key(db, tenant, [
                {"namespaces": [tenant.namespace], "actions": ["*"], "queues": [OTHER_QUEUE]}]),
        }
        # Everything, in another namespace of the victim's own application.
        sibling = await _ok(client, "POST", "/v1/namespaces", tenant,
                            {"name": tenant.namespace + "-sibling"})
        keys["other-namespace"] = await make_key(db, tenant, [
            {"namespaces": [sibling["name"]], "actions": ["*"], "queues": ["*"]}])
        for actions in without_keys():
            keys[without_name(actions)] = await make_key(db, tenant, [
                {"namespaces": ["*"], "actions": sorted(ALL - actions), "queues": ["*"]}])
        revoked = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"]}])
        await db.transaction("test.revoke", lambda cur: credentials.revoke_credential(
            cur, prefix=revoked.split("_")[1], actor=Actor.operator("pytest"), reason="matrix"))
        keys["revoked"] = revoked
        twin = await build_victim(db, client, replays=False)
        yield World(db=db, client=client, conn=conn, victim=victim, twin=twin, keys=keys,
                    snapshot_sql=snapshot_statement(conn), served=served)
    finally:
        conn.close()
        await client.close()
        await db.close()


# --- the victim's rows --------------------------------------------------------------------------

# A plain read of information_schema (a GROUP_CONCAT with a correlated subquery over
# key_column_usage crashed MariaDB 10.11.19 with signal 11 here).
COLUMNS = """
SELECT c.table_name AS t, c.column_name AS c
FROM information_schema.columns c
JOIN information_schema.tables t
  ON t.table_schema = c.table_schema AND t.table_name = c.table_name
WHERE c.table_schema = DATABASE() AND t.table_type = 'BASE TABLE'
ORDER BY c.table_name, c.ordinal_position
"""
# The victim application's namespaces, and the platform's pseudo-namespace, under which
# application-wide rows live (the receipts of namespace creation, scoped by application).
VICTIM_NAMESPACES = ("SELECT id FROM orbit_namespaces WHERE application_id = %s"
                     " UNION ALL SELECT %s")


def snapshot_statement(conn: pymysql.connections.Connection[Any]
                       ) -> tuple[str, tuple[str, ...]]:
    """One SELECT per table of the schema (read from information_schema, so a new table is in
    the snapshot without a change here), sent as one UNION ALL: the rows of the victim's
    application and of its namespaces; a table keyed by neither (applications, platform
    controls, heartbeats, the migration ledger) is read whole. Each row comes back as the hex of
    every column's bytes (NULL apart), so equal means byte-identical. No column is left out:
    nothing writes to the scratch database between two snapshots but the request under test
    (no daemon runs here). Returns the statement and its parameters by name: "app" (the
    victim's application id) and "platform" (the platform's pseudo-namespace id)."""
    columns: dict[str, list[str]] = {}
    with conn.cursor() as cur:
        cur.execute(COLUMNS)
        for table, column in cur.fetchall():
            columns.setdefault(table, []).append(column)
    parts = []
    params: list[str] = []
    for table in sorted(columns):
        names = set(columns[table])
        # Identifiers come from information_schema, never from input; values are parameters.
        if {"namespace_id", "application_id"} <= names:
            where = f"namespace_id IN ({VICTIM_NAMESPACES}) OR application_id = %s"
            params += ["app", "platform", "app"]
        elif "namespace_id" in names:
            where = f"namespace_id IN ({VICTIM_NAMESPACES})"
            params += ["app", "platform"]
        elif "application_id" in names:
            where = "application_id = %s"
            params += ["app"]
        else:
            where = "TRUE"
        row = ", ".join(f"COALESCE(HEX(CAST(`{c}` AS BINARY)), 'NULL')" for c in columns[table])
        parts.append(f"SELECT '{table}' AS t, CONCAT_WS(' ', {row}) AS r"
                     f" FROM `{table}` WHERE {where}")
    assert len(parts) > 20, parts  # the whole schema, not an empty database
    return "\nUNION ALL\n".join(parts), tuple(params)


Snapshot = dict[str, list[str]]


def snapshot(world: World) -> Snapshot:
    sql, names = world.snapshot_sql
    values = {"app": world.victim.tenant.application_id, "platform": PLATFORM_NAMESPACE_ID}
    rows: Snapshot = {}
    with world.conn.cursor() as cur:
        cur.execute(sql, tuple(values[n] for n in names))
        for table, row in cur.fetchall():
            rows.setdefault(table, []).append(row)
    return {table: sorted(found) for table, found in rows.items()}


def _readable(row: str) -> list[Any]:
    return [None if v == "NULL" else bytes.fromhex(v) for v in row.split(" ")]


def assert_unchanged(before: Snapshot, after: Snapshot) -> None:
    changed = {t: {"gone": [_readable(r) for r in before.get(t, []) if r not in after.get(t, [])],
                   "new": [_readable(r) for r in after.get(t, []) if r not in before.get(t, [])]}
               for t in before.keys() | after.keys() if before.get(t) != after.get(t)}
    assert not changed, f"the victim's rows changed: {changed}"


# --- the tests ----------------------------------------------------------------------------------


async def test_every_route_is_in_the_matrix(world: World) -> None:
    assert not set(ROUTES) & set(NOT_EXERCISED)
    missing = world.served - set(ROUTES) - set(NOT_EXERCISED)
    assert not missing, f"routes neither in the authorization matrix nor listed: {missing}"
    # A case for a route that is gone is a mistake; an exemption for one is harmless (the
    # operational routes leave the public port for the operator listener).
    stale = set(ROUTES) - world.served
    assert not stale, f"the matrix has cases for routes the router does not serve: {stale}"


async def test_the_snapshot_holds_the_victims_rows_and_sees_a_change(world: World) -> None:
    rows = snapshot(world)
    for table in ("pulse_tasks", "pulse_attempts", "pulse_queues", "pulse_schedules",
                  "pulse_schedule_versions", "weave_definitions", "weave_instances",
                  "orbit_events", "orbit_audit_events",
                  "orbit_idempotency_keys", "orbit_namespaces", "orbit_application_resources"):
        assert rows.get(table), f"the victim has no {table} rows"
    assert len(rows["orbit_credentials"]) >= 4  # the victim's application has its keys
    # every receipt the replay cases aim at, namespace creation's (platform-wide) included
    assert len(rows["orbit_idempotency_keys"]) >= len(REPLAYED)
    with world.conn.cursor() as cur:
        cur.execute("UPDATE pulse_queues SET description = 'changed' WHERE namespace_id = %s"
                    " AND name = %s", (world.victim.tenant.namespace_id, QUEUE))
        try:
            with pytest.raises(AssertionError, match="pulse_queues"):
                assert_unchanged(rows, snapshot(world))
        finally:
            cur.execute("UPDATE pulse_queues SET description = '' WHERE namespace_id = %s"
                        " AND name = %s", (world.victim.tenant.namespace_id, QUEUE))
    assert_unchanged(rows, snapshot(world))


@pytest.mark.parametrize("route", list(ROUTES), ids=route_id)
async def test_the_victims_own_key_succeeds(world: World, route: Route) -> None:
    """The control: the matrix's request, against a twin built like the victim, with the
    twin's full key, is accepted — so an attacker's refusal is the authorization's. A command
    gets a twin of its own (it changes what it acts on); the reads share one."""
    twin = world.twin if route[0] == "GET" else await build_victim(world.db, world.client,
                                                                   replays=False)
    case = ROUTES[route]
    make_body = case.control_body or case.body
    status, text = await send(world.client, route, twin.plain, twin.tenant.api_key,
                              body=None if make_body is None else make_body(twin.plain))
    if case.control_code is not None:
        assert (status, json.loads(text)["code"]) == (409, case.control_code), text
        return
    assert 200 <= status < 300, (status, text)


def _names_of(o: Objects) -> list[str]:
    """Strings that only the victim's objects put in a response."""
    return [f'"{QUEUE}"', o.schedule, o.waiting, o.review, o.failed, o.attempt, o.pull,
            o.hook, o.leased, o.exhausted, o.definition, o.workflow]


def _check_refusal(route: Route, who: str, status: int, text: str, o: Objects,
                   namespace: str) -> None:
    case = ROUTES[route]
    assert status < 500, text
    if who == "revoked":
        assert status == 401, text
        assert json.loads(text)["code"] == "invalid_credential", text
        return
    if case.global_:
        _check_global(route, who, status, text, namespace)
        return
    if case.listing and who == "other-queue" and status == 200:
        # It sees the namespace and may list it, for its own queue only.
        assert not [n for n in _names_of(o) if n in text], text
        return
    # Another tenant's or another namespace's key does not even see the victim's namespace.
    # To the latter, the application routes answer 403 (its grant is not application-wide) and
    # so do disable and enable, which are authorized on the name whether it exists or not.
    sees_nothing = who == "other-tenant" or (
        who == "other-namespace" and "{namespace}" in route[1]
        and not route[1].endswith(("/disable", "/enable")))
    expected = {404} if sees_nothing else {403, 404}
    assert status in expected, text
    assert json.loads(text)["code"] in {
        "forbidden", "namespace_not_found", "application_not_found", "queue_not_found",
        "task_not_found", "schedule_not_found", "attempt_not_found", "subscription_not_found",
        "delivery_not_found", "definition_not_found", "definition_version_not_found",
        "workflow_instance_not_found"}, text


def _check_global(route: Route, who: str, status: int, text: str, namespace: str) -> None:
    if route == ("POST", "/v1/namespaces"):
        # Refused (403) or the documented global name conflict; never created.
        assert status in {403, 409}, text
        if status == 409:
            assert json.loads(text)["code"] == "already_exists", text
        return
    assert status in {200, 403}, text
    if who == "other-tenant":
        assert namespace not in text, text


@pytest.mark.parametrize(("route", "who"), MATRIX)
async def test_an_attacker_is_refused_and_changes_nothing(world: World, route: Route,
                                                          who: str) -> None:
    victim = world.victim
    body = ROUTES[route].body
    before = snapshot(world)
    status, text = await send(world.client, route, victim.plain, world.keys[who],
                              body=None if body is None else body(victim.plain))
    _check_refusal(route, who, status, text, victim.plain, victim.tenant.namespace)
    assert_unchanged(before, snapshot(world))


@pytest.mark.parametrize(("route", "who", "variant"), REPLAYS)
async def test_an_attacker_gets_no_replay_and_no_conflict(world: World, route: Route, who: str,
                                                          variant: str) -> None:
    victim = world.victim
    case = ROUTES[route]
    assert case.body2 is not None
    body = case.replayed(victim.replay) if variant == "same body" else case.body2(victim.replay)
    original = victim.receipts[route]
    before = snapshot(world)
    status, text = await send(world.client, route, victim.replay, world.keys[who], body=body,
                              idempotency_key=replay_key(route))
    _check_refusal(route, who, status, text, victim.replay, victim.tenant.namespace)
    if status == 409 and route == ("POST", "/v1/namespaces"):
        assert json.loads(text)["code"] == "already_exists", text  # not idempotency_conflict
    assert json.loads(text) != original[1]  # not the victim's receipt
    assert_unchanged(before, snapshot(world))


@pytest.mark.parametrize("route", REPLAYED, ids=route_id)
async def test_the_victim_replays_its_own_receipts(world: World, route: Route) -> None:
    """The receipts the attackers aim at exist: the victim's own key replays them, and a
    different body under the same key is the victim's conflict."""
    victim = world.victim
    case = ROUTES[route]
    assert case.body2 is not None
    status, text = await send(world.client, route, victim.replay, victim.tenant.api_key,
                              body=case.replayed(victim.replay),
                              idempotency_key=replay_key(route))
    assert (status, json.loads(text)) == victim.receipts[route]
    status, text = await send(world.client, route, victim.replay, victim.tenant.api_key,
                              body=case.body2(victim.replay), idempotency_key=replay_key(route))
    assert status == 409, text
    assert json.loads(text)["code"] == "idempotency_conflict", text


async def test_every_key_kind_is_used() -> None:
    kinds = {who for _, who in (p.values for p in MATRIX)}
    assert set(ATTACKERS_FIXED) <= kinds
    assert {without_name(n) for n in without_keys()} <= kinds

"""Forged and foreign input to the console's actions over HTTP (issue 17: "bad input — forged ids,
another namespace in the URL, missing CSRF, oversized forms: an error page with the problem's
message, nothing written").

Each action of the task, queue, schedule and workflow pages (the step recovery forms included)
is sent, with otherwise valid fields, a forged id, the URL of another application's namespace
holding the same objects, no CSRF token, and an oversized body. Each answer is the HTML error
page with the problem's status, code and message; afterwards the audit table, the idempotency
records and the revisions of every task, queue, gate, schedule, workflow instance and step of
both namespaces are as before. (The queue pause's CSRF, size and namespace refusals, and forged
schedule names for pause, trigger and backfill, are in test_console_http.py.)
"""

from __future__ import annotations

import html
import re
from typing import Any

import attrs
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.pulse import queues, schedule_commands
from tests.conftest import Tenant, make_tenant
from tests.console.conftest import Admin
from tests.console.test_console_http import log_in, page_csrf, rows
from tests.integration.api.test_workflows_api import QUEUE
from tests.integration.api.test_workflows_api import doc as workflow_doc

Client = TestClient[Any, Any]
FORGED_ID = "ab" * 16
DETAIL = re.compile(r'<span class="detail">([^<]*)</span>')


@attrs.frozen(kw_only=True)
class Targets:
    """Real objects of one namespace, by the names the console's URLs use."""

    ns: str
    task: str
    queue: str = QUEUE
    schedule: str = "nightly"
    workflow: str
    step: str = "a"


async def populate(api: Client, db: Database, tenant: Tenant) -> Targets:
    """A queue, a task, a schedule and a running workflow instance in ``tenant``'s namespace."""
    base = f"/v1/namespaces/{tenant.namespace}"

    async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await api.post(base + path, json=body, headers=tenant.auth)
        assert response.status in (200, 201), await response.text()
        return dict(await response.json())

    await post("/queues", {"name": QUEUE})
    task = await post("/tasks", {"queue": QUEUE, "handler": "reports.build"})
    principal = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    version = {"rule": {"cron": "0 2 * * *", "timezone": "UTC"},
               "template": {"handler": "reports.build"}}
    await schedule_commands.create_schedule(
        db, principal, namespace=tenant.namespace, name="nightly", queue=QUEUE,
        spec=schedule_commands.parse_version(version, version))
    await post("/workflow-definitions", {"name": "orders"})
    await post("/workflow-definitions/orders/versions", {"revision": 1, "document": workflow_doc()})
    workflow = await post("/workflows", {"definition": "orders", "input": {"n": 1}})
    return Targets(ns=tenant.namespace, task=task["id"], workflow=workflow["id"])


def snapshot(conn: pymysql.connections.Connection[Any], *namespace_ids: bytes) -> dict[str, Any]:
    """What an action could have written: audit rows, idempotency records, and the revision of
    every task, queue, gate, schedule, instance and step of the namespaces."""
    spaces = ", ".join(["%s"] * len(namespace_ids))
    found: dict[str, Any] = {}
    for table in ("orbit_audit_events", "orbit_idempotency_keys",
                  "pulse_schedule_occurrences"):  # fixed names
        found[table] = rows(conn, f"SELECT COUNT(*) AS n FROM {table}")[0]["n"]
    for table, columns in (("pulse_tasks", "id, state, revision, cancel_requested_at"),
                           ("pulse_queues", "id, revision"),
                           ("pulse_execution_gates", "id, state, control_revision"),
                           ("pulse_schedules", "id, state, revision"),
                           ("weave_instances", "id, state, revision, paused, control_revision"),
                           ("weave_steps", "id, state, revision")):  # fixed names
        found[table] = rows(conn, f"SELECT {columns} FROM {table}"
                            f" WHERE namespace_id IN ({spaces}) ORDER BY id", *namespace_ids)
    return found


STEP_FIELDS = {"reason": "forged", "step_revision": "1"}
# (action, path under /console/ns/{ns}/, the form's other fields, the forged-id variants of the
# path with the problem each gets). Paths are formatted with a Targets' fields.
ACTIONS: list[tuple[str, str, dict[str, str], list[tuple[str, str]]]] = [
    ("task.cancel", "tasks/{task}/cancel", {"reason": "forged"},
     [("tasks/" + FORGED_ID + "/cancel", "task_not_found")]),
    ("task.review", "tasks/{task}/review",
     {"revision": "1", "decision": "failed", "reason": "forged", "evidence_ref": "T-1",
      "execution_ended": "yes"},
     [("tasks/" + FORGED_ID + "/review", "task_not_found")]),
    ("task.retry", "tasks/{task}/retry", {"reason": "forged", "rerun_confirmed": "yes"},
     [("tasks/" + FORGED_ID + "/retry", "task_not_found")]),
    ("queue.resume", "queues/{queue}/resume", {"reason": "forged"},
     [("queues/no-such-queue/resume", "queue_not_found")]),
    ("queue.limits", "queues/{queue}/limits",
     {"revision": "1", "max_concurrent_attempts": "5", "max_unfinished_tasks": "",
      "max_starts_per_second": "", "offer_lease_ms": str(queues.DEFAULT_OFFER_LEASE_MS),
      "execution_lease_ms": str(queues.DEFAULT_EXECUTION_LEASE_MS)},
     [("queues/no-such-queue/limits", "queue_not_found")]),
    ("schedule.pause", "schedules/{schedule}/pause", {"reason": "forged"}, []),
    ("schedule.resume", "schedules/{schedule}/resume", {"reason": "forged"},
     [("schedules/no-such-schedule/resume", "schedule_not_found")]),
    ("schedule.trigger", "schedules/{schedule}/trigger", {}, []),
    ("schedule.backfill", "schedules/{schedule}/backfill",
     {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z", "reason": "forged",
      "idempotency_key": "ef" * 16}, []),
    ("workflow.pause", "workflows/{workflow}/pause",
     {"reason": "forged", "control_revision": "1"}, []),
    ("workflow.resume", "workflows/{workflow}/resume",
     {"reason": "forged", "control_revision": "1"},
     [("workflows/" + FORGED_ID + "/resume", "workflow_instance_not_found")]),
    ("workflow.cancel", "workflows/{workflow}/cancel",
     {"reason": "forged", "control_revision": "1"},
     [("workflows/" + FORGED_ID + "/cancel", "workflow_instance_not_found")]),
    ("step.retry", "workflows/{workflow}/steps/{step}/retry",
     {**STEP_FIELDS, "additional_attempts": "1"},
     [("workflows/" + FORGED_ID + "/steps/a/retry", "workflow_instance_not_found"),
      ("workflows/{workflow}/steps/no-such-step/retry", "workflow_step_not_found")]),
    ("step.resolve", "workflows/{workflow}/steps/{step}/resolve",
     {**STEP_FIELDS, "evidence_ref": "T-1", "conclusion": "succeeded",
      "output": '{"done": true}', "execution_ended": "yes"},
     [("workflows/" + FORGED_ID + "/steps/a/resolve", "workflow_instance_not_found"),
      ("workflows/{workflow}/steps/no-such-step/resolve", "workflow_step_not_found")]),
    ("step.rearm", "workflows/{workflow}/steps/{step}/rearm",
     {**STEP_FIELDS, "timeout_ms": "60000"},
     [("workflows/" + FORGED_ID + "/steps/a/rearm", "workflow_instance_not_found"),
      ("workflows/{workflow}/steps/no-such-step/rearm", "workflow_step_not_found")]),
    ("step.continue", "workflows/{workflow}/steps/{step}/continue",
     {**STEP_FIELDS, "rounds": "1"},
     [("workflows/" + FORGED_ID + "/steps/a/continue", "workflow_instance_not_found"),
      ("workflows/{workflow}/steps/no-such-step/continue", "workflow_step_not_found")]),
]
# The problem's message (its detail) each refusal shows, by code.
MESSAGES = {
    "task_not_found": "No such task for this credential",
    "queue_not_found": "no-such-queue",
    "schedule_not_found": "no schedule named 'no-such-schedule'",
    "workflow_instance_not_found": "no such workflow instance in this namespace",
    "workflow_step_not_found": "no step of this name",
    "csrf_token_invalid": "the form's CSRF token is missing",
    "payload_too_large": "a console form is at most 16384 bytes",
}


@pytest.mark.parametrize(("action", "path", "fields", "forged"), ACTIONS,
                         ids=[a[0] for a in ACTIONS])
async def test_forged_foreign_unsigned_and_oversized_actions_write_nothing(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any],
    action: str, path: str, fields: dict[str, str], forged: list[tuple[str, str]],
) -> None:
    mine = await populate(api, db, admin.tenant)
    other_tenant = await make_tenant(db)
    theirs = await populate(api, db, other_tenant)
    await log_in(api, admin)
    csrf = await page_csrf(api, f"/console/ns/{mine.ns}/queues")
    own = f"/console/ns/{mine.ns}/" + path.format(**attrs.asdict(mine))
    attempts: list[tuple[str, str, dict[str, str], int, str]] = [
        (f"forged {variant}", f"/console/ns/{mine.ns}/" + variant.format(**attrs.asdict(mine)),
         {"csrf": csrf, **fields}, 404, code) for variant, code in forged]
    attempts += [
        ("another namespace", f"/console/ns/{theirs.ns}/" + path.format(**attrs.asdict(theirs)),
         {"csrf": csrf, **fields}, 404, "namespace_not_found"),
        ("no csrf", own, fields, 403, "csrf_token_invalid"),
        ("oversized", own, {"csrf": csrf, **fields, "reason": "x" * 20_000}, 413,
         "payload_too_large"),
    ]
    before = snapshot(sync_conn, admin.tenant.namespace_id, other_tenant.namespace_id)
    for what, url, form, status, code in attempts:
        response = await api.post(url, data=form, allow_redirects=False)
        body = await response.text()
        assert response.status == status, (what, body)
        assert response.headers["Content-Type"].startswith("text/html"), what
        assert f'<code class="code">{code}</code>' in body, (what, body)
        detail = DETAIL.search(body)
        assert detail is not None, (what, body)
        # A foreign namespace's message names it; the others are fixed texts.
        expected = theirs.ns if code == "namespace_not_found" else MESSAGES[code]
        assert expected in html.unescape(detail.group(1)), (what, detail.group(1))
        assert "没有写入任何内容" in body, what
        assert snapshot(sync_conn, admin.tenant.namespace_id,
                        other_tenant.namespace_id) == before, (action, what)

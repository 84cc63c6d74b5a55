"""The console in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright)
against a real ``orbit api`` process and the real database.

Every page built so far is opened and photographed (``test-artifacts/console/``, or
``$ORBIT_TEST_ARTIFACTS/console/``; docs/console.md), and each action is done through the
page's own form, then checked in the database with its audit row.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from playwright.async_api import Dialog, Page, Route, async_playwright

from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.relay import deliveries
from orbit_common.relay.deliveries import AttemptError
from tests.conftest import Tenant
from tests.console.conftest import Admin
from tests.integration.api.test_workflows_api import QUEUE
from tests.integration.api.test_workflows_api import doc as workflow_doc
from tests.support import relay
from tests.support.lease_fixtures import make_queue as make_lease_queue
from tests.support.processes import ApiDaemon, http

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ORBIT_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"
MAX_FAILURES = 3


def rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


@pytest.fixture(scope="module")
def console_api(db_url: DatabaseUrl, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ApiDaemon]:
    log = tmp_path_factory.mktemp("console") / "api.log"
    daemon = ApiDaemon(db_url=db_url, log=log, env={
        "ORBIT_CONSOLE_LOGIN_MAX_FAILURES": str(MAX_FAILURES),
        "ORBIT_CONSOLE_LOGIN_LOCKOUT_S": "120",
        "ORBIT_SERVICE_LOG_LEVEL": "DEBUG",
    })
    try:
        daemon.wait_listening()
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    """A fresh headless Chromium (Debian's; Playwright never downloads one) and a tab."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: script/test installs Debian's chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 860},
                                                locale="zh-CN")
            tab = await context.new_page()
            tab.set_default_timeout(10_000)
            yield tab
        finally:
            await browser.close()


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def log_in(page: Page, api: ApiDaemon, admin: Admin, password: str | None = None) -> None:
    await page.goto(f"{api.url}/console/login")
    await page.fill("input[name=name]", admin.name)
    await page.fill("input[name=password]", admin.password if password is None else password)
    await submit(page, "button:has-text('登录')")


async def submit(page: Page, selector: str) -> None:
    """Click a form's button and wait for the page it leads to."""
    async with page.expect_navigation():
        await page.click(selector)


def make_queue(api: ApiDaemon, tenant: Tenant, name: str, tasks: int = 0) -> None:
    base = f"{api.url}/v1/namespaces/{tenant.namespace}"
    status, body = http("POST", f"{base}/queues", headers=tenant.auth, body={"name": name})
    assert status == 201, body
    for _ in range(tasks):
        status, body = http("POST", f"{base}/tasks", headers=tenant.auth,
                            body={"queue": name, "handler": "reports.build"})
        assert status in (200, 201), body


def make_schedule(api: ApiDaemon, tenant: Tenant, name: str, queue: str,
                  rule: dict[str, str], handler: str) -> dict[str, Any]:
    """A schedule on a new queue ``queue``, through the API; its document."""
    make_queue(api, tenant, queue)
    status, body = http("POST", f"{api.url}/v1/namespaces/{tenant.namespace}/schedules",
                        headers=tenant.auth, body={"name": name, "queue": queue, "rule": rule,
                                                   "template": {"handler": handler}})
    assert status == 201, body
    return body


async def test_login_overview_and_logout(console_api: ApiDaemon, admin: Admin, page: Page) -> None:
    tenant = admin.tenant
    make_queue(console_api, tenant, "orders", tasks=3)
    await log_in(page, console_api, admin, password="not the password")
    assert (await page.locator(".problem").inner_text()).startswith("用户名或密码错误")
    await shot(page, "login-failed")
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/[^/]+/$"))
    assert (await page.locator("h1").inner_text()).startswith("概览")
    row = page.locator("#overview-queues tr", has_text="orders")
    assert (await row.locator("td").nth(2).inner_text()) == "3"  # depth
    assert (await page.locator("svg[role=img]").count()) == 3
    await shot(page, "overview")
    cookies = {c["name"]: c for c in await page.context.cookies()}
    session = cookies["orbit_console_session"]
    assert session["httpOnly"]
    assert session["sameSite"] == "Strict"
    await submit(page, "button:has-text('退出登录')")
    await page.wait_for_url(re.compile(r".*/console/login$"))
    # The old cookie no longer opens anything, even when sent again by hand.
    await page.context.add_cookies([{**session, "expires": -1}])
    await page.goto(f"{console_api.url}/console/ns/{tenant.namespace}/")
    assert page.url.endswith("/console/login")


async def test_login_throttling(console_api: ApiDaemon, admin: Admin, page: Page,
                          sync_conn: pymysql.connections.Connection[Any]) -> None:
    for _ in range(MAX_FAILURES):
        await log_in(page, console_api, admin, password="wrong password again")
        assert "console_login_failed" in (await page.locator(".problem").inner_text())
    await log_in(page, console_api, admin)  # the right password, refused while throttled
    assert "console_login_throttled" in (await page.locator(".problem").inner_text())
    await shot(page, "login-throttled")
    assert rows(sync_conn, "SELECT id FROM orbit_console_sessions WHERE revoked_at IS NULL") == []


async def test_a_forged_form_from_another_page_is_refused(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    make_queue(console_api, tenant, "forged")
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    # Another page on the same site (same host, another port: SameSite does not stop it), whose
    # form posts to the console without the session's CSRF token.
    evil = "http://127.0.0.1:9/prize.html"
    target = f"{console_api.url}/console/ns/{tenant.namespace}/queues/forged/pause"
    async def attacker(route: Route) -> None:
        await route.fulfill(content_type="text/html", body=(
            f'<form method="post" action="{target}"><input name="reason" value="pwned">'
            '<button>claim your prize</button></form>'))

    await page.route(evil, attacker)
    await page.goto(evil)
    await submit(page, "button")
    await page.wait_for_url(target)
    assert "csrf_token_invalid" in (await page.locator(".problem").inner_text())
    await shot(page, "csrf-refused")
    assert rows(sync_conn, "SELECT id FROM orbit_audit_events WHERE action = 'queue.pause'"
                " AND namespace_id = %s", tenant.namespace_id) == []


async def test_session_expiry_sends_back_to_the_login(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    with sync_conn.cursor() as cur:  # the absolute limit passes (database time decides)
        cur.execute("UPDATE orbit_console_sessions SET created_at = created_at - INTERVAL 1 DAY,"
                    " absolute_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
                    " WHERE revoked_at IS NULL")
    await page.reload()
    assert page.url.endswith("/console/login")


async def test_queue_pages_pause_resume_and_limits(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    make_queue(console_api, tenant, "billing", tasks=2)
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    await page.click("nav.pages a:has-text('队列')")
    assert (await page.locator("#queue-list").inner_text()).count("billing") == 1
    await shot(page, "queues")
    await page.click("#queue-list a:has-text('billing')")
    assert (await page.locator("#usage").inner_text()).startswith("未终结任务")
    await shot(page, "queue-detail")
    questions: list[str] = []

    async def accept(dialog: Dialog) -> None:
        questions.append(dialog.message)
        await dialog.accept()

    page.on("dialog", accept)  # console.js asks before a pause or resume
    await page.fill("form.action input[name=reason]", "upstream outage INC-42")
    await submit(page, "form.action button")
    assert (await page.locator(".notice").inner_text()) == "队列已暂停。"
    assert questions
    assert "billing" in questions[0]
    await shot(page, "queue-paused")
    audit = rows(sync_conn, "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                 " WHERE action = 'queue.pause' AND namespace_id = %s", tenant.namespace_id)
    assert audit == [{"actor_kind": "console", "actor_id": admin.actor_id,
                      "reason": "upstream outage INC-42"}]
    await page.fill("form.action input[name=reason]", "outage over")
    await submit(page, "form.action button")
    assert (await page.locator(".notice").inner_text()) == "队列已恢复。"

    # Limits, with compare-and-set: a second tab still shows the old revision.
    other = await page.context.new_page()
    await other.goto(page.url)
    await page.fill("#limits input[name=max_concurrent_attempts]", "7")
    await submit(page, "#limits button")
    assert (await page.locator(".notice").inner_text()) == "限额已保存。"
    [update] = rows(sync_conn, "SELECT actor_kind, actor_id, after_doc FROM orbit_audit_events"
                    " WHERE action = 'queue.update' AND namespace_id = %s", tenant.namespace_id)
    assert (update["actor_kind"], update["actor_id"]) == ("console", admin.actor_id)
    assert '"max_concurrent_attempts":7' in update["after_doc"].replace(" ", "")
    await other.fill("#limits input[name=max_unfinished_tasks]", "100")
    await submit(other, "#limits button")
    assert "stale_revision" in (await other.locator(".problem").inner_text())
    await shot(other, "stale-revision")
    [queue] = rows(sync_conn, "SELECT max_unfinished_tasks FROM pulse_queues"
                   " WHERE namespace_id = %s AND name = 'billing'", tenant.namespace_id)
    assert queue["max_unfinished_tasks"] is None

    # The audit page shows the console's own actions, filtered by actor kind.
    await page.click("nav.pages a:has-text('审计')")
    await page.select_option("#audit-filters select[name=actor_kind]", "console")
    await submit(page, "#audit-filters button")
    listed = await page.locator("#audit-list").inner_text()
    for action in ("queue.pause", "queue.resume", "queue.update"):
        assert action in listed
    assert "upstream outage INC-42" in listed
    assert "queue.create" not in listed  # created with the API key: actor_kind credential
    await shot(page, "audit")


async def test_no_secret_in_the_api_log(console_api: ApiDaemon, admin: Admin, page: Page,
                                  sync_conn: pymysql.connections.Connection[Any]) -> None:
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    token = {c["name"]: c["value"] for c in await page.context.cookies()}["orbit_console_session"]
    [user] = rows(sync_conn, "SELECT password_hash FROM orbit_console_users")
    await page.goto(f"{console_api.url}/console/ns/no-such-namespace/")  # an error page, logged
    log = console_api.output()
    assert "api listening" in log
    for secret in (token, user["password_hash"], admin.password):
        assert secret not in log


async def test_task_pages_cancel_filter_and_retry(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    make_queue(console_api, tenant, "exports", tasks=3)
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    await page.click("nav.pages a:has-text('任务')")
    assert (await page.locator("#task-list tbody tr").count()) == 3
    await shot(page, "tasks")
    await page.locator("#task-list a").first.click()
    await page.wait_for_url(re.compile(r".*/tasks/[0-9a-f]{32}$"))
    task_id = page.url.rsplit("/", 1)[1]
    await shot(page, "task-detail")

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)
    await page.fill("#cancel input[name=reason]", "duplicate export")
    await submit(page, "#cancel button")
    assert (await page.locator(".notice").inner_text()) == "已提交取消。"
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                   " WHERE action = 'task.cancel' AND resource_id = %s", bytes.fromhex(task_id))
    assert audit == {"actor_kind": "console", "actor_id": admin.actor_id,
                     "reason": "duplicate export"}

    # The list filtered by state shows it, and only it.
    await page.goto(f"{console_api.url}/console/ns/{tenant.namespace}/tasks")
    await page.select_option("#task-filters select[name=state]", "CANCELLED")
    await submit(page, "#task-filters button")
    assert (await page.locator("#task-list tbody tr").count()) == 1
    assert task_id in (await page.locator("#task-list").inner_text())

    await page.goto(f"{console_api.url}/console/ns/{tenant.namespace}/tasks/{task_id}")
    await page.fill("#retry input[name=reason]", "export wanted after all")
    await page.check("#retry input[name=rerun_confirmed]")
    await submit(page, "#retry button")
    assert (await page.locator(".notice").inner_text()) == "已创建重试任务。"
    assert task_id in (await page.locator("#task-facts").inner_text())  # "重试自" the original
    [retry] = rows(sync_conn, "SELECT actor_kind, reason FROM orbit_audit_events"
                   " WHERE action = 'task.retry' AND resource_id = %s", bytes.fromhex(task_id))
    assert retry == {"actor_kind": "console", "reason": "export wanted after all"}


async def test_schedule_pages_pause_trigger_and_a_bad_backfill(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    make_schedule(console_api, tenant, "nightly-report", "nightly",
                  {"cron": "0 2 * * *", "timezone": "Asia/Shanghai"}, "reports.build")
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    await page.click("nav.pages a:has-text('计划')")
    await shot(page, "schedules")
    await page.click("#schedule-list a:has-text('nightly-report')")
    assert "Asia/Shanghai" in (await page.locator("#versions").inner_text())

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)
    await submit(page, "#trigger button")
    assert (await page.locator(".notice").inner_text()) == "已立即运行一次。"
    assert "TRIGGER" in (await page.locator("#ledger").inner_text())
    await page.fill("#pause input[name=reason]", "holiday freeze")
    await submit(page, "#pause button")
    assert (await page.locator(".notice").inner_text()) == "计划已暂停。"
    await shot(page, "schedule-detail")
    audit = rows(sync_conn, "SELECT action, actor_kind, actor_id FROM orbit_audit_events"
                 " WHERE namespace_id = %s AND resource_type = 'schedule'"
                 " AND actor_kind = 'console' ORDER BY occurred_at", tenant.namespace_id)
    assert [a["action"] for a in audit] == ["schedule.triggered", "schedule.paused"]
    assert {a["actor_id"] for a in audit} == {admin.actor_id}
    # A backfill whose end is not after its start: the problem is shown, nothing is written.
    await page.fill("#backfill input[name=start]", "2026-12-02T00:00:00Z")
    await page.fill("#backfill input[name=end]", "2026-12-01T00:00:00Z")
    await page.fill("#backfill input[name=reason]", "missed runs")
    await submit(page, "#backfill button")
    assert "validation_failed" in (await page.locator(".problem").inner_text())
    assert len(rows(sync_conn, "SELECT id FROM orbit_audit_events WHERE namespace_id = %s"
                    " AND resource_type = 'schedule' AND actor_kind = 'console'",
                    tenant.namespace_id)) == 2


async def test_schedule_backfill_preview_confirm_and_a_double_confirm(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    body = make_schedule(console_api, tenant, "hourly-sync", "hourly",
                         {"cron": "0 * * * *", "timezone": "UTC"}, "sync.run")
    # Three whole hours before the schedule existed: a backfill runs them (docs/schedules.md).
    hour = dt.datetime.fromisoformat(body["created_at"]).replace(minute=0, second=0,
                                                                 microsecond=0)
    start, end = hour - dt.timedelta(hours=6), hour - dt.timedelta(hours=3)

    def made() -> list[dict[str, Any]]:
        return rows(sync_conn, "SELECT o.fire_at, o.version, t.id FROM pulse_schedule_occurrences o"
                    " JOIN pulse_tasks t ON t.namespace_id = o.namespace_id AND t.id = o.task_id"
                    " WHERE o.namespace_id = %s AND o.source = 'BACKFILL' ORDER BY o.fire_at",
                    tenant.namespace_id)

    def audited() -> list[dict[str, Any]]:
        return rows(sync_conn, "SELECT actor_kind, actor_id, reason, after_doc"
                    " FROM orbit_audit_events WHERE namespace_id = %s"
                    " AND action = 'schedule.backfilled'", tenant.namespace_id)

    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    await page.goto(f"{console_api.url}/console/ns/{tenant.namespace}/schedules/hourly-sync")
    await page.fill("#backfill input[name=start]", start.strftime("%Y-%m-%dT%H:%M"))
    await page.fill("#backfill input[name=end]", end.isoformat())
    await page.fill("#backfill input[name=reason]", "sync was down INC-7")
    await submit(page, "#backfill button")
    assert (await page.locator("h1").inner_text()).startswith("补跑预览")
    assert (await page.locator("#backfill-count").inner_text()) == "3"
    assert (await page.locator("#backfill-versions").inner_text()) == "1"
    listed = await page.locator("#backfill-instants tbody tr td:first-child").all_inner_texts()
    assert listed == [(start + dt.timedelta(hours=n)).strftime("%Y-%m-%d %H:%M:%S.000000")
                      for n in range(3)]
    await shot(page, "schedule-backfill-preview")
    assert made() == []  # the preview wrote nothing
    assert audited() == []
    confirm = page.locator("#backfill-confirm input[type=hidden]")
    fields: dict[str, str | float | bool] = {
        await field.get_attribute("name") or "": await field.get_attribute("value") or ""
        for field in await confirm.all()}
    assert set(fields) == {"csrf", "start", "end", "reason", "idempotency_key"}

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)
    await submit(page, "#backfill-confirm button")
    assert (await page.locator(".notice").inner_text()) == "补跑已提交。"
    assert (await page.locator("#ledger").inner_text()).count("BACKFILL") == 3
    first = made()
    assert [(as_utc(r["fire_at"]), r["version"]) for r in first] == [
        (start + dt.timedelta(hours=n), 1) for n in range(3)]
    [audit] = audited()
    assert (audit["actor_kind"], audit["actor_id"], audit["reason"]) == (
        "console", admin.actor_id, "sync was down INC-7")
    assert '"created":3' in audit["after_doc"].replace(" ", "")
    await shot(page, "schedule-backfilled")

    # The same confirm sent again (a double click, a resent form): the recorded answer, no
    # second set of tasks and no second audit row.
    again = await page.context.request.post(
        f"{console_api.url}/console/ns/{tenant.namespace}/schedules/hourly-sync/backfill",
        form=fields, max_redirects=0)
    assert again.status == 303, await again.text()
    assert made() == first
    assert len(audited()) == 1


async def test_subscription_pages_add_budget_and_pause(
    console_api: ApiDaemon, admin: Admin, page: Page, db: Database,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    queue = await make_lease_queue(db, tenant, name="results")
    await relay.subscribe(db, tenant, "ledger-sync", max_attempts=1)
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    (leased,) = await relay.lease(db, tenant, "ledger-sync")
    await deliveries.fail_delivery(
        db, await relay.principal_of(db, tenant.api_key), namespace=tenant.namespace,
        name="ledger-sync", delivery_id=leased.delivery_id, token=leased.token,
        error=AttemptError(status_code=503, body="ledger down"))
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    assert (await page.locator("#exhausted").inner_text()) == "1"  # the overview counts it
    await page.click("nav.pages a:has-text('订阅')")
    await shot(page, "subscriptions")
    await page.click("#subscription-list a:has-text('ledger-sync')")
    assert "EXHAUSTED" in (await page.locator("#deliveries").inner_text())
    await page.locator("#deliveries a").first.click()
    await page.fill("#budget input[name=attempts]", "2")
    await page.fill("#budget input[name=reason]", "ledger is back")
    await submit(page, "#budget button")
    assert (await page.locator(".notice").inner_text()) == "已追加投递预算。"
    await shot(page, "delivery")
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                   " WHERE action = 'delivery.budget_added' AND resource_id = %s",
                   leased.delivery_id)
    assert audit == {"actor_kind": "console", "actor_id": admin.actor_id,
                     "reason": "ledger is back"}
    [delivery] = rows(sync_conn, "SELECT state FROM orbit_deliveries WHERE id = %s",
                      leased.delivery_id)
    assert delivery["state"] == "PENDING"

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)
    await page.click("a:has-text('← 订阅')")
    await page.fill("#pause input[name=reason]", "ledger migration")
    await submit(page, "#pause button")
    assert (await page.locator(".notice").inner_text()) == "订阅已暂停。"
    [sub] = rows(sync_conn, "SELECT state FROM orbit_subscriptions WHERE namespace_id = %s"
                 " AND name = 'ledger-sync'", tenant.namespace_id)
    assert sub["state"] == "PAUSED"


async def test_workflow_pages_pause_resume_and_a_stale_pause(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = admin.tenant
    make_queue(console_api, tenant, QUEUE)
    base = f"{console_api.url}/v1/namespaces/{tenant.namespace}"
    for path, body in (("/workflow-definitions", {"name": "orders"}),
                       ("/workflow-definitions/orders/versions",
                        {"revision": 1, "document": workflow_doc()}),
                       ("/workflows", {"definition": "orders", "input": {"n": 1}})):
        status, answer = http("POST", base + path, headers=tenant.auth, body=body)
        assert status in (200, 201), answer
    workflow_id = answer["id"]
    status, sent = http("POST", f"{base}/workflows/{workflow_id}/signals", headers=tenant.auth,
                        body={"name": "approved", "correlation_key": "order-7",
                              "payload": {"ok": 1}, "payload_version": 1,
                              "evidence_ref": "ticket-42"})
    assert status in (200, 201, 202), sent
    await log_in(page, console_api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    await page.click("nav.pages a:has-text('流程')")
    assert workflow_id in (await page.locator("#workflow-list").inner_text())
    assert "orders" in (await page.locator("#definitions").inner_text())
    await shot(page, "workflows")
    await page.click(f"#workflow-list a:has-text('{workflow_id}')")
    assert "$root" in (await page.locator("#steps").inner_text())
    states = {name: await page.get_attribute(f"#instance-graph g[data-step='{name}']",
                                             "data-state") for name in ("a", "done")}
    steps = {s["name"]: s["state"] for s in rows(
        sync_conn, "SELECT name, state FROM weave_steps WHERE instance_id = %s",
        bytes.fromhex(workflow_id))}
    assert states == {"a": steps.get("a", ""), "done": steps.get("done", "")}
    [signal] = rows(sync_conn, "SELECT id, state, disposition FROM weave_signals"
                    " WHERE instance_id = %s",
                    bytes.fromhex(workflow_id))
    row = page.locator(f"#signals tr[data-signal='{signal['id'].hex()}']")
    cells = await row.locator("td").all_inner_texts()
    assert cells[1:6] == ["approved", "order-7", signal["state"],
                          signal["disposition"] or "—", "1"]
    assert cells[7] == "ticket-42"
    assert '"ok":1' in cells[6]
    await page.click("#workflow-facts a:has-text('orders 版本 1')")
    assert await page.locator("#definition-graph line[data-from=a][data-to=done]").count() == 1
    assert await page.locator("#definition-graph g.node").count() == 2
    await shot(page, "workflow-version")
    await page.go_back()
    other = await page.context.new_page()
    await other.goto(page.url)  # a second tab, still at control revision 1

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)
    other.on("dialog", accept)
    await page.fill("#pause input[name=reason]", "provider outage")
    await submit(page, "#pause button")
    assert (await page.locator(".notice").inner_text()) == "实例已暂停。"
    await shot(page, "workflow-detail")
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                   " WHERE action = 'workflow.paused' AND resource_id = %s",
                   bytes.fromhex(workflow_id))
    assert audit == {"actor_kind": "console", "actor_id": admin.actor_id,
                     "reason": "provider outage"}
    await other.fill("#pause input[name=reason]", "me too")
    await submit(other, "#pause button")
    assert "stale_revision" in (await other.locator(".problem").inner_text())
    await page.fill("#resume input[name=reason]", "provider back")
    await submit(page, "#resume button")
    assert (await page.locator(".notice").inner_text()) == "实例已继续。"
    [instance] = rows(sync_conn, "SELECT paused, control_revision FROM weave_instances"
                      " WHERE id = %s", bytes.fromhex(workflow_id))
    assert (instance["paused"], instance["control_revision"]) == (0, 3)


def start_workflow(api: ApiDaemon, tenant: Tenant, definition: str,
                   document: dict[str, Any]) -> str:
    """Publish ``document`` as version 1 of a new ``definition`` and start an instance of it."""
    base = f"{api.url}/v1/namespaces/{tenant.namespace}"
    for path, body in (("/workflow-definitions", {"name": definition}),
                       (f"/workflow-definitions/{definition}/versions",
                        {"revision": 1, "document": document}),
                       ("/workflows", {"definition": definition, "input": {"n": 1}})):
        status, answer = http("POST", base + path, headers=tenant.auth, body=body)
        assert status in (200, 201), answer
    return str(answer["id"])


async def open_workflow(page: Page, api: ApiDaemon, admin: Admin, workflow_id: str) -> None:
    await log_in(page, api, admin)
    await page.wait_for_url(re.compile(r".*/console/ns/.*"))
    await page.goto(f"{api.url}/console/ns/{admin.tenant.namespace}/workflows/{workflow_id}")

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)


async def test_workflow_cancel_is_audited_as_the_console(
    console_api: ApiDaemon, admin: Admin, page: Page,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    make_queue(console_api, admin.tenant, QUEUE)
    workflow_id = start_workflow(console_api, admin.tenant, "refunds", workflow_doc())
    await open_workflow(page, console_api, admin, workflow_id)
    await page.fill("#cancel input[name=reason]", "customer withdrew")
    await submit(page, "#cancel button")
    assert (await page.locator(".notice").inner_text()).startswith("已提交取消")
    assert await page.locator("#cancel").count() == 0
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                   " WHERE action = 'workflow.cancel' AND resource_id = %s",
                   bytes.fromhex(workflow_id))
    assert audit == {"actor_kind": "console", "actor_id": admin.actor_id,
                     "reason": "customer withdrew"}
    [instance] = rows(sync_conn, "SELECT state, stop_kind FROM weave_instances WHERE id = %s",
                      bytes.fromhex(workflow_id))
    assert instance == {"state": "STOPPING", "stop_kind": "CANCEL"}
    await shot(page, "workflow-cancelled")

"""The workflow step recovery actions of the console (retry, resolve, re-arm, continue) in a real
headless Chromium against a real ``orbit api`` process: each brings a step held by the
in-process engine back through the page's own form, then the database shows the step moved and
its audit row written as the console. A database of its own: the engine's lease scans read
every namespace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from playwright.async_api import Page

from orbit_common.db.pool import Database, DatabaseUrl, connect_sync
from orbit_common.weave.engine import Engine
from tests.conftest import make_tenant
from tests.console.conftest import make_admin
from tests.console.test_console_browser import open_workflow, page, rows, shot, submit
from tests.integration.weave.engine_support import Flow, begin, doc, drain, task
from tests.integration.weave.test_polls import answer
from tests.integration.weave.test_wait_recovery import held_signal, poll_doc
from tests.support import database
from tests.support.processes import ApiDaemon

pytestmark = pytest.mark.slow

own_url, db = database.own_database("orbit_console_recovery")
__all__ = ["page"]  # the browser fixture, shared with the other browser tests

HELD = doc({"a": task("w.a", "done", on_failure="$hold"), "done": {"kind": "SUCCEED"}}, "a")


@pytest.fixture(scope="module")
def api(own_url: DatabaseUrl, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[ApiDaemon]:
    daemon = ApiDaemon(db_url=own_url, log=tmp_path_factory.mktemp("recovery") / "api.log")
    try:
        daemon.wait_listening()
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def conn(own_url: DatabaseUrl) -> Iterator[pymysql.connections.Connection[Any]]:
    found = connect_sync(own_url, autocommit=True)
    try:
        yield found
    finally:
        found.close()


@pytest.fixture
def engine(db: Database) -> Engine:
    return Engine(db, owner="engine-console", lease_ms=30_000, batch=8)


async def held_task(db: Database, engine: Engine) -> Flow:
    """An instance whose TASK step ``a`` is held after its task failed."""
    flow = await begin(db, await make_tenant(db), HELD)
    await drain(engine)
    [current] = await flow.tasks()
    await flow.end(current["id"], "fail", "broken")
    await drain(engine)
    assert (await flow.steps())["a"]["held_at"] is not None
    return flow


def step_of(conn: pymysql.connections.Connection[Any], flow: Flow, name: str
            ) -> dict[str, Any]:
    [found] = rows(conn, "SELECT state, revision, held_at, resolution FROM weave_steps"
                   " WHERE instance_id = %s AND name = %s", flow.instance_id, name)
    return found


def audit_of(conn: pymysql.connections.Connection[Any], flow: Flow, action: str
             ) -> list[dict[str, Any]]:
    return rows(conn, "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
                " WHERE namespace_id = %s AND action = %s", flow.tenant.namespace_id, action)


async def test_retry_of_a_held_task_step_its_refusals_and_a_stale_second_retry(
    api: ApiDaemon, db: Database, engine: Engine, page: Page,
    conn: pymysql.connections.Connection[Any],
) -> None:
    flow = await held_task(db, engine)
    admin = await make_admin(db, flow.tenant)
    await open_workflow(page, api, admin, flow.instance_id.hex())
    other = await page.context.new_page()
    await other.goto(page.url)  # a second tab, still at the held step's revision
    other.on("dialog", lambda dialog: dialog.accept())
    form = "form.retry[data-step=a]"
    await page.fill(f"{form} input[name=reason]", "provider fixed")
    await submit(page, f"{form} button")  # its one attempt is used: no attempt left to retry
    problem = await page.locator(".problem").inner_text()
    assert "step_not_retryable" in problem
    assert audit_of(conn, flow, "workflow.step.retry") == []
    await shot(page, "workflow-step-not-retryable")
    await page.go_back()
    await page.fill(f"{form} input[name=additional_attempts]", "1")
    await page.fill(f"{form} input[name=reason]", "provider fixed")
    await submit(page, f"{form} button")
    assert (await page.locator(".notice").inner_text()).startswith("已重试步骤")
    assert step_of(conn, flow, "a")["state"] == "RUNNING"
    assert len(await flow.tasks()) == 2
    assert audit_of(conn, flow, "workflow.step.retry") == [
        {"actor_kind": "console", "actor_id": admin.actor_id, "reason": "provider fixed"}]
    await shot(page, "workflow-step-retried")
    await other.fill("form.retry[data-step=a] input[name=reason]", "me too")
    await submit(other, "form.retry[data-step=a] button")
    assert "stale_revision" in (await other.locator(".problem").inner_text())
    assert len(await flow.tasks()) == 2
    assert len(audit_of(conn, flow, "workflow.step.retry")) == 1


async def test_resolve_of_a_held_task_step(
    api: ApiDaemon, db: Database, engine: Engine, page: Page,
    conn: pymysql.connections.Connection[Any],
) -> None:
    flow = await held_task(db, engine)
    admin = await make_admin(db, flow.tenant)
    await open_workflow(page, api, admin, flow.instance_id.hex())
    form = "form.resolve[data-step=a]"
    await page.select_option(f"{form} select[name=conclusion]", "succeeded")
    await page.fill(f"{form} textarea[name=output]", '{"done": "by hand"}')
    await page.fill(f"{form} input[name=reason]", "shipped manually")
    await page.fill(f"{form} input[name=evidence_ref]", "ticket-9")
    await submit(page, f"{form} button")
    assert (await page.locator(".notice").inner_text()).startswith("已记录步骤的结论")
    resolution = json.loads(step_of(conn, flow, "a")["resolution"])
    assert resolution["conclusion"] == "succeeded"
    assert resolution["output"] == {"done": "by hand"}
    assert audit_of(conn, flow, "workflow.step.resolve") == [
        {"actor_kind": "console", "actor_id": admin.actor_id, "reason": "shipped manually"}]
    await drain(engine)
    assert (await flow.instance())["state"] == "SUCCEEDED"


async def test_a_bad_resolve_shows_the_problem_and_writes_nothing(
    api: ApiDaemon, db: Database, engine: Engine, page: Page,
    conn: pymysql.connections.Connection[Any],
) -> None:
    flow = await held_task(db, engine)
    admin = await make_admin(db, flow.tenant)
    await open_workflow(page, api, admin, flow.instance_id.hex())
    form = "form.resolve[data-step=a]"
    await page.select_option(f"{form} select[name=conclusion]", "failed")
    await page.fill(f"{form} input[name=error]", "Not A Code")
    await page.fill(f"{form} input[name=reason]", "gave up")
    await page.fill(f"{form} input[name=evidence_ref]", "ticket-10")
    await submit(page, f"{form} button")
    problem = await page.locator(".problem").inner_text()
    assert "validation_failed" in problem
    assert step_of(conn, flow, "a")["resolution"] is None
    assert audit_of(conn, flow, "workflow.step.resolve") == []


async def test_rearm_of_a_held_signal_wait(
    api: ApiDaemon, db: Database, engine: Engine, page: Page,
    conn: pymysql.connections.Connection[Any],
) -> None:
    flow = await held_signal(db, engine)
    admin = await make_admin(db, flow.tenant)
    await open_workflow(page, api, admin, flow.instance_id.hex())
    form = "form.rearm[data-step=approve]"
    await page.fill(f"{form} input[name=timeout_ms]", "600000")
    await page.fill(f"{form} input[name=reason]", "customer called back")
    await submit(page, f"{form} button")
    assert (await page.locator(".notice").inner_text()).startswith("已重新等待")
    step = step_of(conn, flow, "approve")
    assert (step["state"], step["held_at"]) == ("WAITING", None)
    assert audit_of(conn, flow, "workflow.step.rearm") == [
        {"actor_kind": "console", "actor_id": admin.actor_id,
         "reason": "customer called back"}]


async def test_continue_of_an_exhausted_poll(
    api: ApiDaemon, db: Database, engine: Engine, page: Page,
    conn: pymysql.connections.Connection[Any],
) -> None:
    flow = await begin(db, await make_tenant(db), poll_doc(max_rounds=1, on_exhausted="$hold"))
    await drain(engine)
    await answer(flow, engine, "ok", {"done": False})
    assert step_of(conn, flow, "check")["held_at"] is not None
    admin = await make_admin(db, flow.tenant)
    await open_workflow(page, api, admin, flow.instance_id.hex())
    form = "form.continue[data-step=check]"
    await page.fill(f"{form} input[name=rounds]", "2")
    await page.fill(f"{form} input[name=reason]", "the bank's job was down")
    await submit(page, f"{form} button")
    assert (await page.locator(".notice").inner_text()).startswith("已继续轮询")
    step = step_of(conn, flow, "check")
    assert (step["state"], step["held_at"]) == ("WAITING", None)
    assert audit_of(conn, flow, "workflow.step.continue") == [
        {"actor_kind": "console", "actor_id": admin.actor_id,
         "reason": "the bank's job was down"}]

"""The console over HTTP (the API application on a real socket, the real database): cookie
flags, security headers, CSRF, bounded forms, error pages, and no secret in any answer."""

from __future__ import annotations

import re
from typing import Any

import pymysql
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.pulse import queues, schedule_commands
from tests.conftest import Tenant, make_tenant, unique
from tests.console.conftest import Admin
from tests.integration.api.conftest import row_counts
from tests.integration.test_leases import claim, expire_now, recover, start
from tests.support.lease_fixtures import add_tasks, open_session
from tests.support.lease_fixtures import make_queue as make_lease_queue

Client = TestClient[Any, Any]
CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


def rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


async def login_form(api: Client) -> str:
    response = await api.get("/console/login")
    assert response.status == 200
    match = CSRF.search(await response.text())
    assert match is not None
    return match.group(1)


async def log_in(api: Client, admin: Admin, *, password: str | None = None) -> ClientResponse:
    csrf = await login_form(api)
    return await api.post("/console/login", data={
        "csrf": csrf, "name": admin.name,
        "password": admin.password if password is None else password,
    }, allow_redirects=False)


async def page_csrf(api: Client, path: str) -> str:
    response = await api.get(path)
    assert response.status == 200, await response.text()
    match = CSRF.search(await response.text())
    assert match is not None
    return match.group(1)


async def make_queue(db: Database, tenant: Tenant) -> str:
    principal = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    name = unique("q")
    await queues.create_queue(db, principal, namespace=tenant.namespace, name=name,
                              settings=queues.QueueSettings(), idempotency_key=None)
    return name


def audit_count(conn: pymysql.connections.Connection[Any]) -> int:
    return int(rows(conn, "SELECT COUNT(*) AS n FROM orbit_audit_events")[0]["n"])


async def test_login_sets_a_strict_httponly_cookie_and_stores_only_its_digest(
    api: Client, admin: Admin, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    response = await log_in(api, admin)
    assert response.status == 303
    assert response.headers["Location"] == "/console/"
    cookies = [h for h in response.headers.getall("Set-Cookie")
               if h.startswith("orbit_console_session=")]
    assert len(cookies) == 1
    header = cookies[0]
    flags = {part.strip().split("=")[0].lower() for part in header.split(";")[1:]}
    assert {"httponly", "samesite", "path"} <= flags
    assert "SameSite=Strict" in header
    assert "Path=/console/" in header
    assert "secure" not in flags  # plain HTTP here; HTTPS (or cookie_secure) adds it
    token = header.split(";")[0].split("=", 1)[1]
    stored = rows(sync_conn, "SELECT token_digest FROM orbit_console_sessions"
                  " WHERE revoked_at IS NULL")
    assert len(stored) == 1
    assert stored[0]["token_digest"] != token.encode()
    assert len(stored[0]["token_digest"]) == 32
    # The start page sends the administrator to its first namespace's overview.
    start = await api.get("/console/", allow_redirects=False)
    assert start.status == 303
    assert start.headers["Location"].startswith("/console/ns/")


async def test_cookie_secure_setting_marks_the_cookie_secure(
    db: Database, db_url: Any, admin: Admin
) -> None:
    import attrs

    from orbit_api.app import create_app
    from orbit_common.db.schema import SchemaChecker
    from orbit_common.service.config import ConsoleConfig
    from orbit_common.service.health import ReadinessGate
    from tests.conftest import api_config
    from tests.support.servers import ServiceTestServer

    config = attrs.evolve(api_config(db_url), console=ConsoleConfig(cookie_secure=True))
    client: Client = TestClient(ServiceTestServer(create_app(config, db,
                                                             ReadinessGate(SchemaChecker(db)))))
    await client.start_server()
    try:
        response = await client.get("/console/login")
        assert "Secure" in response.headers["Set-Cookie"]
    finally:
        await client.close()


async def test_every_page_has_the_security_headers(api: Client, admin: Admin) -> None:
    await log_in(api, admin)
    ns = admin.tenant.namespace
    for path in ("/console/login", f"/console/ns/{ns}/", f"/console/ns/{ns}/queues",
                 "/console/ns/no-such-namespace/queues"):
        response = await api.get(path, allow_redirects=False)
        csp = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Cache-Control"] == "no-store"
        body = await response.text()
        assert "<script>" not in body
        assert " on" + "click=" not in body
        assert 'style="' not in body  # nothing the CSP would have to allow inline


async def test_static_files_are_cached_and_versioned(api: Client, admin: Admin) -> None:
    await log_in(api, admin)
    page = await (await api.get("/console/login")).text()
    [href] = re.findall(r'href="(/console/static/[0-9a-f]{16}/console\.css)"', page)
    response = await api.get(href)
    assert response.status == 200
    assert response.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert response.content_type == "text/css"
    stale = await api.get(href.replace(href.split("/")[3], "0" * 16))
    assert stale.status == 404


async def test_pages_without_a_session_send_to_the_login(api: Client, tenant: Tenant) -> None:
    response = await api.get(f"/console/ns/{tenant.namespace}/", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/console/login"


async def test_a_forged_form_without_or_with_a_wrong_csrf_token_writes_nothing(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    queue = await make_queue(db, admin.tenant)
    await log_in(api, admin)
    path = f"/console/ns/{admin.tenant.namespace}/queues/{queue}/pause"
    before = audit_count(sync_conn)
    for data in ({"reason": "forged"}, {"reason": "forged", "csrf": "0" * 64}):
        response = await api.post(path, data=data, allow_redirects=False)
        assert response.status == 403
        body = await response.text()
        assert "csrf_token_invalid" in body
        assert response.headers["Content-Type"].startswith("text/html")
    assert audit_count(sync_conn) == before
    [gate] = rows(sync_conn, "SELECT g.state FROM pulse_queues q JOIN pulse_execution_gates g"
                  " ON g.namespace_id = q.namespace_id AND g.id = q.gate_id"
                  " WHERE q.namespace_id = %s AND q.name = %s", admin.tenant.namespace_id, queue)
    assert gate["state"] == "OPEN"


async def test_the_login_form_needs_its_csrf_token(
    api: Client, admin: Admin, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await login_form(api)  # the login cookie is set, but the forged post does not know the token
    response = await api.post("/console/login", data={
        "name": admin.name, "password": admin.password, "csrf": "f" * 64},
        allow_redirects=False)
    assert response.status == 403
    assert "csrf_token_invalid" in await response.text()
    assert rows(sync_conn, "SELECT id FROM orbit_console_sessions WHERE revoked_at IS NULL") == []


async def test_oversized_and_malformed_forms_are_refused(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    queue = await make_queue(db, admin.tenant)
    await log_in(api, admin)
    base = f"/console/ns/{admin.tenant.namespace}/queues/{queue}"
    csrf = await page_csrf(api, base)
    before = audit_count(sync_conn)
    big = await api.post(base + "/pause", data={"csrf": csrf, "reason": "x" * 20_000})
    assert big.status == 413
    assert "payload_too_large" in await big.text()
    repeated = await api.post(base + "/pause", data=f"csrf={csrf}&reason=a&reason=b",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert repeated.status == 400
    as_json = await api.post(base + "/pause", json={"csrf": csrf, "reason": "json"})
    assert as_json.status == 415
    assert audit_count(sync_conn) == before


async def test_another_applications_namespace_is_an_error_page(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    other = await make_tenant(db)
    queue = await make_queue(db, other)
    await log_in(api, admin)
    response = await api.get(f"/console/ns/{other.namespace}/queues/{queue}")
    assert response.status == 404
    assert "namespace_not_found" in await response.text()
    csrf = await page_csrf(api, f"/console/ns/{admin.tenant.namespace}/queues")
    before = audit_count(sync_conn)
    forged = await api.post(f"/console/ns/{other.namespace}/queues/{queue}/pause",
                            data={"csrf": csrf, "reason": "not mine"})
    assert forged.status == 404
    assert "namespace_not_found" in await forged.text()
    assert audit_count(sync_conn) == before


async def test_a_stale_revision_shows_stale_revision(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    queue = await make_queue(db, admin.tenant)
    await log_in(api, admin)
    base = f"/console/ns/{admin.tenant.namespace}/queues/{queue}"
    csrf = await page_csrf(api, base)
    form = {"csrf": csrf, "revision": "1", "max_concurrent_attempts": "5",
            "max_unfinished_tasks": "", "max_starts_per_second": "",
            "offer_lease_ms": str(queues.DEFAULT_OFFER_LEASE_MS),
            "execution_lease_ms": str(queues.DEFAULT_EXECUTION_LEASE_MS)}
    first = await api.post(base + "/limits", data=form, allow_redirects=False)
    assert first.status == 303, await first.text()
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id FROM orbit_audit_events"
                   " WHERE action = 'queue.update' AND namespace_id = %s",
                   admin.tenant.namespace_id)
    assert (audit["actor_kind"], audit["actor_id"]) == ("console", admin.actor_id)
    second = await api.post(base + "/limits", data={**form, "max_concurrent_attempts": "9"})
    assert second.status == 409
    assert "stale_revision" in await second.text()
    bad = await api.post(base + "/limits", data={**form, "revision": "2",
                                                 "max_unfinished_tasks": "-3"})
    assert bad.status == 400
    assert "max_unfinished_tasks" in await bad.text()


async def test_no_session_token_or_password_hash_in_any_answer(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    queue = await make_queue(db, admin.tenant)
    response = await log_in(api, admin)
    token = response.cookies["orbit_console_session"].value
    [user] = rows(sync_conn, "SELECT password_hash FROM orbit_console_users")
    secrets_ = (token, user["password_hash"], admin.password)
    ns = admin.tenant.namespace
    for path in ("/console/", f"/console/ns/{ns}/", f"/console/ns/{ns}/queues",
                 f"/console/ns/{ns}/queues/{queue}", "/console/ns/nope/", "/console/login"):
        answer = await api.get(path)
        body = await answer.text()
        headers = "\n".join(f"{k}: {v}" for k, v in answer.headers.items())
        for secret in secrets_:
            assert secret not in body, path
            assert secret not in headers, path


@pytest.mark.parametrize("field", ["revision", "offer_lease_ms"])
async def test_a_blank_required_limit_is_a_field_problem(
    api: Client, admin: Admin, db: Database, field: str
) -> None:
    queue = await make_queue(db, admin.tenant)
    await log_in(api, admin)
    base = f"/console/ns/{admin.tenant.namespace}/queues/{queue}"
    csrf = await page_csrf(api, base)
    form = {"csrf": csrf, "revision": "1", "offer_lease_ms": "1000",
            "execution_lease_ms": "60000", field: ""}
    response = await api.post(base + "/limits", data=form)
    assert response.status == 400
    body = await response.text()
    assert "validation_failed" in body
    assert field in body


# --- tasks ---------------------------------------------------------------------------------------


async def test_task_list_filters_and_bad_filters(
    api: Client, admin: Admin, db: Database
) -> None:
    tenant = admin.tenant
    queue = await make_lease_queue(db, tenant, name="alpha")
    waiting = await add_tasks(db, tenant, queue, 2)
    await log_in(api, admin)
    base = f"/console/ns/{tenant.namespace}/tasks"
    answer = await api.get(base, params={"state": "WAITING", "queue": "alpha"})
    listed = await answer.text()
    assert answer.status == 200, listed
    assert all(t.hex() in listed for t in waiting)
    empty = await (await api.get(base, params={"state": "FAILED"})).text()
    assert not any(t.hex() in empty for t in waiting)
    for params, code in (({"state": "BOGUS"}, "validation_failed"),
                         ({"created_after": "yesterday"}, "validation_failed"),
                         ({"cursor": "not-a-cursor"}, "invalid_cursor"),
                         ({"queue": "no-such-queue"}, "queue_not_found"),
                         ({"colour": "red"}, "validation_failed")):
        response = await api.get(base, params=params)
        assert response.status in (400, 404), params
        assert code in await response.text(), params
    forged = await api.get(f"{base}/{'ab' * 16}")
    assert forged.status == 404
    assert "task_not_found" in await forged.text()
    malformed = await api.get(f"{base}/not-an-id")
    assert malformed.status in (400, 404)


async def test_review_needs_the_declaration_and_is_audited_as_the_console(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    tenant = admin.tenant
    queue = await make_lease_queue(db, tenant)
    (task_id,) = await add_tasks(db, tenant, queue)
    session = await open_session(db, tenant, [queue])
    (grant,) = await claim(db, session, queue)
    await start(db, tenant, [grant])
    await expire_now(db, tenant, task_id)  # not rerun-safe: NEEDS_REVIEW
    await recover(db)
    await log_in(api, admin)
    base = f"/console/ns/{tenant.namespace}/tasks/{task_id.hex()}"
    page = await (await api.get(base)).text()
    assert 'id="review"' in page
    csrf = CSRF.search(page).group(1)  # type: ignore[union-attr]
    [task] = rows(sync_conn, "SELECT revision FROM pulse_tasks WHERE id = %s", task_id)
    form = {"csrf": csrf, "revision": str(task["revision"]), "decision": "failed",
            "reason": "checked the ledger", "evidence_ref": "TICKET-9"}
    undeclared = await api.post(base + "/review", data=form)
    assert undeclared.status == 400
    assert rows(sync_conn, "SELECT id FROM orbit_audit_events WHERE resource_id = %s"
                " AND action = 'task.review'", task_id) == []
    stale = await api.post(base + "/review", data={**form, "execution_ended": "yes",
                                                   "revision": str(task["revision"] - 1)})
    assert stale.status == 409
    assert "stale_revision" in await stale.text()
    done = await api.post(base + "/review", data={**form, "execution_ended": "yes"},
                          allow_redirects=False)
    assert done.status == 303, await done.text()
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id, reason, evidence_ref"
                   " FROM orbit_audit_events WHERE resource_id = %s AND action = 'task.review'",
                   task_id)
    assert audit == {"actor_kind": "console", "actor_id": admin.actor_id,
                     "reason": "checked the ledger", "evidence_ref": "TICKET-9"}
    assert rows(sync_conn, "SELECT state FROM pulse_tasks WHERE id = %s",
                task_id) == [{"state": "FAILED"}]


async def test_a_forged_schedule_name_writes_nothing(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await log_in(api, admin)
    base = f"/console/ns/{admin.tenant.namespace}/schedules"
    listed = await api.get(base)
    assert listed.status == 200
    missing = await api.get(f"{base}/no-such-schedule")
    assert missing.status == 404
    assert "schedule_not_found" in await missing.text()
    csrf = await page_csrf(api, base)
    before = audit_count(sync_conn)
    for action, data in (("pause", {"reason": "x"}), ("trigger", {}),
                         ("backfill", {"start": "2026-01-01T00:00:00Z",
                                       "end": "2026-01-02T00:00:00Z", "reason": "x",
                                       "idempotency_key": "ab" * 16})):
        response = await api.post(f"{base}/no-such-schedule/{action}", data={"csrf": csrf, **data})
        assert response.status == 404, action
        assert "schedule_not_found" in await response.text()
    assert audit_count(sync_conn) == before


async def test_forged_subscription_and_delivery_ids_write_nothing(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    from tests.support import relay

    tenant = admin.tenant
    await relay.subscribe(db, tenant, "mine")
    other = await make_tenant(db)
    await relay.subscribe(db, other, "theirs")
    await log_in(api, admin)
    base = f"/console/ns/{tenant.namespace}/subscriptions"
    assert (await api.get(f"{base}/mine")).status == 200
    assert (await api.get(f"{base}/mine", params={"state": "BOGUS"})).status == 400
    missing = await api.get(f"{base}/theirs")
    assert missing.status == 404
    assert "subscription_not_found" in await missing.text()
    csrf = await page_csrf(api, base)
    before = audit_count(sync_conn)
    budget = await api.post(f"{base}/mine/deliveries/{'cd' * 16}/budget",
                            data={"csrf": csrf, "attempts": "1", "reason": "forged"})
    assert budget.status == 404
    assert "delivery_not_found" in await budget.text()
    bad = await api.post(f"{base}/mine/deliveries/{'cd' * 16}/budget",
                         data={"csrf": csrf, "attempts": "100000", "reason": "too many"})
    assert bad.status == 400
    other_ns = await api.post(f"/console/ns/{other.namespace}/subscriptions/theirs/pause",
                              data={"csrf": csrf, "reason": "not mine"})
    assert other_ns.status == 404
    assert audit_count(sync_conn) == before


async def test_logout_works_after_the_bound_credential_was_revoked(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    from orbit_common.platform.audit import Actor

    await log_in(api, admin)
    csrf = await page_csrf(api, f"/console/ns/{admin.tenant.namespace}/queues")
    principal = await db.read("t", lambda cur: credentials.authenticate(
        cur, admin.tenant.api_key))
    await db.transaction("t", lambda cur: credentials.revoke_credential(
        cur, prefix=principal.prefix, actor=Actor.operator("pytest"), reason="rotated"))
    page = await api.get(f"/console/ns/{admin.tenant.namespace}/queues")
    assert page.status == 401
    assert "invalid_credential" in await page.text()
    response = await api.post("/console/logout", data={"csrf": csrf}, allow_redirects=False)
    assert response.status == 303
    assert rows(sync_conn, "SELECT id FROM orbit_console_sessions WHERE revoked_at IS NULL") == []


async def test_forged_workflow_ids_and_bad_filters_write_nothing(
    api: Client, admin: Admin, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await log_in(api, admin)
    base = f"/console/ns/{admin.tenant.namespace}/workflows"
    assert (await api.get(base)).status == 200
    for params in ({"state": "BOGUS"}, {"colour": "red"}, {"cursor": "nonsense"}):
        response = await api.get(base, params=params)
        assert response.status == 400, params
    for forged in ("ab" * 16, "not-an-id"):
        response = await api.get(f"{base}/{forged}")
        assert response.status == 404
        assert "workflow_instance_not_found" in await response.text()
    csrf = await page_csrf(api, base)
    before = audit_count(sync_conn)
    response = await api.post(f"{base}/{'ab' * 16}/pause",
                              data={"csrf": csrf, "reason": "forged", "control_revision": "1"})
    assert response.status == 404
    assert audit_count(sync_conn) == before


# --- schedule backfill: preview and confirm ------------------------------------------------

BACKFILL_TABLES = ("pulse_tasks", "pulse_schedule_occurrences", "orbit_audit_events",
                   "orbit_idempotency_keys", "orbit_events")
HOUR = "2026-01-01T00:00:00Z"


async def make_schedule(db: Database, tenant: Tenant, rule: dict[str, Any]) -> str:
    principal = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    queue = await make_queue(db, tenant)
    doc = {"rule": rule, "template": {"handler": "reports.build"}}
    name = unique("s")
    await schedule_commands.create_schedule(
        db, principal, namespace=tenant.namespace, name=name, queue=queue,
        spec=schedule_commands.parse_version(doc, doc))
    return name


@pytest.mark.parametrize(("fields", "status", "code", "message"), [
    ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, 400,
     "validation_failed", "after start"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, 400,
     "validation_failed", "after start"),
    ({"start": "yesterday"}, 400, "validation_failed", "start"),
    ({"end": "2026-13-01T00:00:00Z"}, 400, "validation_failed", "end"),
    ({"reason": ""}, 400, "validation_failed", "1-1024 characters"),
    ({"start": "2020-01-01T00:00:00Z", "end": "2020-02-01T00:00:00Z"}, 400, "range_too_large",
     "more than 1000 planned instants"),
    ({"other_namespace": True}, 404, "namespace_not_found", "namespace"),
    ({"other_schedule": True}, 404, "schedule_not_found", "no schedule named"),
], ids=["end-before-start", "empty-range", "start-unparseable", "end-unparseable",
        "no-reason", "too-large", "another-namespace", "another-namespaces-schedule"])
async def test_bad_backfill_input_is_an_error_page_in_the_preview_and_the_confirm(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any],
    fields: dict[str, Any], status: int, code: str, message: str,
) -> None:
    tenant = admin.tenant
    name = await make_schedule(db, tenant, {"cron": "* * * * *", "timezone": "UTC"})
    other = await make_tenant(db)
    theirs = await make_schedule(db, other, {"cron": "0 * * * *", "timezone": "UTC"})
    await log_in(api, admin)
    namespace = other.namespace if fields.get("other_namespace") else tenant.namespace
    target = theirs if fields.get("other_namespace") or fields.get("other_schedule") else name
    form = {"start": "2025-12-31T22:00:00Z", "end": HOUR, "reason": "missed runs",
            **{k: v for k, v in fields.items() if k.startswith(("start", "end", "reason"))}}
    path = f"/console/ns/{namespace}/schedules/{target}/backfill"
    csrf = await page_csrf(api, f"/console/ns/{tenant.namespace}/schedules/{name}")
    before = row_counts(sync_conn, BACKFILL_TABLES)
    preview = await api.get(path, params=form)
    confirm = await api.post(path, data={**form, "csrf": csrf, "idempotency_key": "cd" * 16})
    for response in (preview, confirm):
        body = await response.text()
        assert response.status == status, body
        assert response.headers["Content-Type"].startswith("text/html")
        assert code in body
        assert message in body
        assert "没有写入任何内容" in body
    assert row_counts(sync_conn, BACKFILL_TABLES) == before


@pytest.mark.parametrize(("fields", "status", "code"), [
    ({"idempotency_key": ""}, 400, "validation_failed"),
    ({"idempotency_key": "not the preview's key"}, 400, "validation_failed"),
    ({"csrf": ""}, 403, "csrf_token_invalid"),
    ({"csrf": "0" * 64}, 403, "csrf_token_invalid"),
    ({"reason": "x" * 20_000}, 413, "payload_too_large"),
], ids=["no-key", "forged-key", "no-csrf", "wrong-csrf", "oversized"])
async def test_a_forged_backfill_confirm_writes_nothing(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any],
    fields: dict[str, str], status: int, code: str,
) -> None:
    tenant = admin.tenant
    name = await make_schedule(db, tenant, {"cron": "0 * * * *", "timezone": "UTC"})
    await log_in(api, admin)
    base = f"/console/ns/{tenant.namespace}/schedules/{name}/backfill"
    form = {"start": "2025-12-31T20:00:00Z", "end": HOUR, "reason": "missed runs"}
    page = await (await api.get(base, params=form)).text()
    assert 'id="backfill-count">4<' in page  # the preview would create four runs
    confirm = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', page))
    assert set(confirm) == {"csrf", "start", "end", "reason", "idempotency_key"}
    before = row_counts(sync_conn, BACKFILL_TABLES)
    response = await api.post(base, data={**confirm, **fields})
    assert response.status == status
    assert code in await response.text()
    assert row_counts(sync_conn, BACKFILL_TABLES) == before
    done = await api.post(base, data=confirm, allow_redirects=False)  # the real one works
    assert done.status == 303, await done.text()
    assert row_counts(sync_conn, ("pulse_tasks",))["pulse_tasks"] == before["pulse_tasks"] + 4

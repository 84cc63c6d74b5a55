"""The console's identity against the real server (orbit_common/platform/console.py): the one
administrator, bcrypt, sessions stored as digests, expiry by database time, throttling, and the
console's seat re-checked inside the domain transactions it acts through.

Tests share the worker's database and its one administrator seat: each test sets the password
(and binds its own tenant's credential) first, which revokes the sessions of the tests before.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pymysql
import pytest

from orbit_common import errors
from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.platform import console, credentials
from orbit_common.platform.audit import Actor
from orbit_common.pulse import queues
from tests.conftest import Tenant, unique

PASSWORD = "correct horse battery staple"
REPO = Path(__file__).resolve().parents[2]
POLICY = console.SessionPolicy(idle_timeout_s=600, absolute_timeout_s=3600,
                               login_max_failures=3, login_lockout_s=60)


def rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


async def prefix_of(db: Database, tenant: Tenant) -> str:
    principal = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    return principal.prefix


async def make_admin(db: Database, tenant: Tenant, *, name: str | None = "admin"
                     ) -> dict[str, Any]:
    return await console.set_password(db, name=name, password=PASSWORD,
                                      credential_prefix=await prefix_of(db, tenant),
                                      actor=Actor.operator("pytest"))


async def log_in(db: Database, password: str = PASSWORD, name: str = "admin",
                 policy: console.SessionPolicy = POLICY) -> console.IssuedSession:
    return await console.login(db, name=name, password=password, policy=policy,
                               client_address="127.0.0.1", user_agent="pytest")


async def test_set_password_stores_a_cost_12_bcrypt_hash_only(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    summary = await make_admin(db, tenant)
    [user] = rows(sync_conn, "SELECT * FROM orbit_console_users")
    assert user["password_hash"].startswith("$2b$12$")
    assert PASSWORD not in json.dumps(summary)
    assert user["credential_id"].hex() == summary["credential_id"]
    [audit] = rows(sync_conn, "SELECT * FROM orbit_audit_events WHERE resource_id = %s"
                   " ORDER BY occurred_at DESC LIMIT 1", user["id"])
    assert (audit["actor_kind"], audit["actor_id"]) == ("operator", "pytest")
    assert audit["action"] in ("console.user_create", "console.password_set")
    assert "$2b$" not in (audit["after_doc"] or "") + (audit["before_doc"] or "")


@pytest.mark.parametrize("password", ["é" * 37, "x" * 73])
async def test_a_password_over_72_bytes_is_refused_not_truncated(
    db: Database, tenant: Tenant, password: str
) -> None:
    with pytest.raises(errors.ValidationFailed, match="at most 72 bytes"):
        await console.set_password(db, name="admin", password=password,
                                   credential_prefix=await prefix_of(db, tenant),
                                   actor=Actor.operator("pytest"))


async def test_only_one_administrator_exists(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await make_admin(db, tenant, name="first")
    await make_admin(db, tenant, name="second")  # renames the one account
    users = rows(sync_conn, "SELECT name FROM orbit_console_users")
    assert [u["name"] for u in users] == ["second"]
    await console.set_password(db, name=None, password=PASSWORD, credential_prefix=None,
                               actor=Actor.operator("pytest"))  # a reset keeps name and binding
    users = rows(sync_conn, "SELECT name, credential_id FROM orbit_console_users")
    assert [u["name"] for u in users] == ["second"]
    assert users[0]["credential_id"].hex() == (await make_admin(db, tenant))["credential_id"]


async def test_login_stores_only_the_token_digest(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await make_admin(db, tenant)
    issued = await log_in(db)
    [session] = rows(sync_conn, "SELECT * FROM orbit_console_sessions WHERE id = %s",
                     issued.session_id)
    assert session["token_digest"] == console.token_digest(issued.token)
    assert issued.token.encode() not in repr(session).encode()
    principal = await console.authenticate(db, issued.token, POLICY)
    assert principal.console is not None
    assert principal.prefix == await prefix_of(db, tenant)
    assert principal.actor.kind.value == "console"
    assert principal.actor.id == f"admin/{principal.credential_id.hex()}"


async def test_wrong_password_and_wrong_name_fail_alike(db: Database, tenant: Tenant) -> None:
    await make_admin(db, tenant)
    with pytest.raises(errors.ConsoleLoginFailed):
        await log_in(db, password=PASSWORD + "!")
    with pytest.raises(errors.ConsoleLoginFailed):
        await log_in(db, name="root")
    await log_in(db)  # two failures, then a success: under the limit of three


async def test_throttled_after_repeated_failures_even_with_the_right_password(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await make_admin(db, tenant)
    # The account row is the worker database's one seat: earlier tests may have throttled it.
    throttles = "SELECT actor_kind FROM orbit_audit_events WHERE action = 'console.login_throttled'"
    before = len(rows(sync_conn, throttles))
    for _ in range(POLICY.login_max_failures):
        with pytest.raises(errors.ConsoleLoginFailed):
            await log_in(db, password="wrong password here")
    with pytest.raises(errors.ConsoleLoginThrottled) as caught:
        await log_in(db)
    assert 1 <= caught.value.extra["retry_after_s"] <= POLICY.login_lockout_s + 1
    [user] = rows(sync_conn, "SELECT id, throttled_until > UTC_TIMESTAMP(6) AS throttled"
                  " FROM orbit_console_users")
    assert user["throttled"] == 1
    audit = rows(sync_conn, throttles + " ORDER BY occurred_at")
    assert [a["actor_kind"] for a in audit[before:]] == ["console"]
    # The lockout ends by database time: move it into the past, as time would.
    with sync_conn.cursor() as cur:
        cur.execute("UPDATE orbit_console_users SET throttled_until ="
                    " UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")
    await log_in(db)


@pytest.mark.parametrize("column", ["idle_expires_at", "absolute_expires_at"])
async def test_an_expired_session_is_refused(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any], column: str
) -> None:
    await make_admin(db, tenant)
    issued = await log_in(db)
    await console.authenticate(db, issued.token, POLICY)
    with sync_conn.cursor() as cur:
        # As time passing would: the session began a day ago and its limit has just passed.
        cur.execute("UPDATE orbit_console_sessions SET created_at = created_at - INTERVAL 1 DAY,"
                    f" {column} = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"  # column: the params'
                    " WHERE id = %s", (issued.session_id,))
    with pytest.raises(errors.ConsoleSessionInvalid):
        await console.authenticate(db, issued.token, POLICY)


async def test_use_extends_the_idle_expiry_but_never_past_the_absolute_one(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await make_admin(db, tenant)
    issued = await log_in(db)
    with sync_conn.cursor() as cur:  # last used long ago (as far as the touch rule goes)
        cur.execute("UPDATE orbit_console_sessions SET last_seen_at = created_at - INTERVAL 1"
                    " HOUR, idle_expires_at = UTC_TIMESTAMP(6) + INTERVAL 5 SECOND,"
                    " absolute_expires_at = UTC_TIMESTAMP(6) + INTERVAL 100 SECOND WHERE id = %s",
                    (issued.session_id,))
    await console.authenticate(db, issued.token, POLICY)
    [row] = rows(sync_conn, "SELECT idle_expires_at = absolute_expires_at AS capped,"
                 " last_seen_at > created_at - INTERVAL 1 MINUTE AS touched"
                 " FROM orbit_console_sessions WHERE id = %s", issued.session_id)
    assert (row["capped"], row["touched"]) == (1, 1)


async def test_logout_revokes_and_the_next_action_is_refused_in_its_transaction(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    """A principal resolved before the logout is still refused: the domain transaction re-checks
    the session (console_seat.check_seat), not only the request's first read."""
    await make_admin(db, tenant)
    issued = await log_in(db)
    principal = await console.authenticate(db, issued.token, POLICY)
    name = unique("q")
    api = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    await queues.create_queue(db, api, namespace=tenant.namespace, name=name,
                              settings=queues.QueueSettings(), idempotency_key=None)
    await queues.set_paused(db, principal, namespace=tenant.namespace, name=name, paused=True,
                            reason="maintenance window")
    [audit] = rows(sync_conn, "SELECT * FROM orbit_audit_events WHERE action = 'queue.pause'"
                   " AND namespace_id = %s", tenant.namespace_id)
    assert (audit["actor_kind"], audit["actor_id"], audit["reason"]) == (
        "console", f"admin/{principal.credential_id.hex()}", "maintenance window")
    assert await console.logout(db, issued.token)
    with pytest.raises(errors.ConsoleSessionInvalid):
        await queues.set_paused(db, principal, namespace=tenant.namespace, name=name,
                                paused=False, reason="after logout")
    [gate] = rows(sync_conn, "SELECT g.state FROM pulse_queues q JOIN pulse_execution_gates g"
                  " ON g.namespace_id = q.namespace_id AND g.id = q.gate_id"
                  " WHERE q.namespace_id = %s AND q.name = %s", tenant.namespace_id, name)
    assert gate["state"] == "PAUSED"
    assert not await console.logout(db, issued.token)  # already revoked: nothing to do


async def test_a_password_change_revokes_every_session(
    db: Database, tenant: Tenant, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    await make_admin(db, tenant)
    first, second = await log_in(db), await log_in(db)
    summary = await make_admin(db, tenant)
    assert summary["sessions_revoked"] == 2
    for issued in (first, second):
        with pytest.raises(errors.ConsoleSessionInvalid):
            await console.authenticate(db, issued.token, POLICY)
    reasons = rows(sync_conn, "SELECT revoked_reason FROM orbit_console_sessions"
                   " WHERE id IN (%s, %s)", first.session_id, second.session_id)
    assert {r["revoked_reason"] for r in reasons} == {"password_changed"}


async def test_a_revoked_bound_credential_stops_the_console(
    db: Database, tenant: Tenant
) -> None:
    await make_admin(db, tenant)
    issued = await log_in(db)
    prefix = await prefix_of(db, tenant)
    await db.transaction("t", lambda cur: credentials.revoke_credential(
        cur, prefix=prefix, actor=Actor.operator("pytest"), reason="rotated"))
    with pytest.raises(errors.InvalidCredential):
        await console.authenticate(db, issued.token, POLICY)


async def test_cli_set_password_reads_stdin_and_refuses_long_passwords(
    db: Database, db_url: DatabaseUrl, tenant: Tenant,
    sync_conn: pymysql.connections.Connection[Any],
) -> None:
    prefix = await prefix_of(db, tenant)

    async def run(password: str) -> tuple[int, str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
        env["ORBIT_DATABASE_URL"] = db_url.render(hide_password=False)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "orbit_cli", "admin", "--actor", "ops@pytest", "console",
            "set-password", "--credential", prefix, "--password-stdin", env=env, cwd=REPO,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(password.encode() + b"\n"), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await run("y" * 73)
    assert code != 0
    assert "at most 72 bytes" in err
    assert out == ""
    code, out, err = await run(PASSWORD)
    assert code == 0, err
    assert json.loads(out)["credential_prefix"] == prefix
    assert PASSWORD not in out + err
    [audit] = rows(sync_conn, "SELECT actor_kind, actor_id FROM orbit_audit_events"
                   " WHERE resource_type = 'console_user' ORDER BY occurred_at DESC LIMIT 1")
    assert (audit["actor_kind"], audit["actor_id"]) == ("operator", "ops@pytest")
    await log_in(db)

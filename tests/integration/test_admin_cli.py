"""``orbit admin``: the real CLI as a subprocess against this worker's database.

Tests share the database, so each one works under its own unique names and never truncates.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

import attrs
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_common.db.pool import DatabaseUrl
from orbit_common.platform.credentials import KEY_PATTERN
from tests.integration.api.conftest import WriteWatch, assert_problem

ACTOR = "ops@pytest"
REPO = Path(__file__).resolve().parents[2]


@attrs.frozen
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def orbit_admin(db_url: DatabaseUrl, *args: str) -> Run:
    """``python -m orbit_cli admin --actor ops@pytest ARGS`` with only ORBIT_DATABASE_URL set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_DATABASE_URL"] = db_url.render(hide_password=False)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "orbit_cli",
        "admin",
        "--actor",
        ACTOR,
        *args,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return Run(code=proc.returncode, out=out.decode(), err=err.decode())


async def ok(db_url: DatabaseUrl, *args: str) -> Run:
    run = await orbit_admin(db_url, *args)
    assert run.code == 0, run
    return run


def name(prefix: str) -> str:
    # "0…" sorts before the "app-…" tenants of other tests, which keeps listings readable.
    return f"0{prefix}-{secrets.token_hex(5)}"


def rows(conn: pymysql.connections.Connection[Any], sql: str, *args: Any) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def writes(sync_conn: pymysql.connections.Connection[Any]) -> WriteWatch:
    return WriteWatch(sync_conn)


# --- bootstrap -----------------------------------------------------------------------------------


async def test_bootstrap_prints_the_key_once_and_writes_a_0600_file(
    db_url: DatabaseUrl,
    api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
    tmp_path: Path,
) -> None:
    app, ns, cred = name("boot"), name("boot-ns"), name("boot-cred")
    output = tmp_path / "secrets" / "bootstrap.json"
    run = await ok(
        db_url,
        "bootstrap",
        "--application",
        app,
        "--namespace",
        ns,
        "--credential",
        cred,
        "--output",
        str(output),
        "--api-url",
        "http://orbit.test:8080",
    )
    doc = run.json()
    key = doc["api_key"]
    assert KEY_PATTERN.match(key)
    assert run.out.count(key) == 1
    assert key not in run.err
    assert doc == {
        "api_url": "http://orbit.test:8080",
        "api_key": key,
        "application": app,
        "namespace": ns,
        "credential_prefix": key.split("_")[1],
    }
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    assert json.loads(output.read_text()) == doc

    # The key works, and only its digest is stored.
    response = await api.get("/v1/whoami", headers=bearer(key))
    assert response.status == 200
    who = await response.json()
    assert who["application"]["name"] == app
    assert who["namespaces"] == [ns]
    assert who["credential"]["name"] == cred
    assert who["grants"] == [{"namespaces": ["*"], "actions": ["*"], "queues": ["*"]}]
    [row] = rows(
        sync_conn,
        "SELECT secret_digest FROM orbit_credentials WHERE prefix = %s",
        doc["credential_prefix"],
    )
    assert row["secret_digest"] == hashlib.sha256(key.encode()).digest()
    secret = key.split("_", 2)[2]
    for table, column in (("orbit_events", "payload"), ("orbit_audit_events", "after_doc")):
        # table and column come from the fixed list above
        found = rows(
            sync_conn, f"SELECT COUNT(*) AS n FROM {table} WHERE {column} LIKE %s", f"%{secret}%"
        )
        assert found[0]["n"] == 0

    audit = rows(
        sync_conn,
        "SELECT action, actor_kind, actor_id FROM orbit_audit_events WHERE application_id = %s"
        " ORDER BY action",
        bytes.fromhex(who["application"]["id"]),
    )
    assert [(a["action"], a["actor_kind"], a["actor_id"]) for a in audit] == [
        ("application.create", "operator", ACTOR),
        ("credential.create", "operator", ACTOR),
        ("namespace.create", "operator", ACTOR),
    ]


async def test_bootstrap_output_never_stays_world_readable(
    db_url: DatabaseUrl, tmp_path: Path
) -> None:
    output = tmp_path / "bootstrap.json"
    output.write_text("old")
    output.chmod(0o644)
    await ok(
        db_url,
        "bootstrap",
        "--application",
        name("boot"),
        "--namespace",
        name("boot-ns"),
        "--output",
        str(output),
    )
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    assert "api_key" in json.loads(output.read_text())


async def test_bootstrap_is_one_transaction(db_url: DatabaseUrl, writes: WriteWatch) -> None:
    app = name("boot")
    await ok(db_url, "bootstrap", "--application", app, "--namespace", name("boot-ns"))
    writes.reset()
    # The application exists: the whole bootstrap fails, nothing of it is written.
    run = await orbit_admin(
        db_url, "bootstrap", "--application", app, "--namespace", name("boot-ns")
    )
    assert run.code == 1
    assert "already_exists" in run.err
    assert "api_key" not in run.out
    writes.assert_unchanged()


# --- applications --------------------------------------------------------------------------------


async def test_app_create_list_and_disable(
    db_url: DatabaseUrl,
    api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
    writes: WriteWatch,
) -> None:
    app = name("app")
    created = (await ok(db_url, "app", "create", app)).json()
    assert created["name"] == app
    assert created["state"] == "ACTIVE"
    assert created["revision"] == 1
    assert re.fullmatch(r"[0-9a-f]{32}", created["id"])

    listing = (await ok(db_url, "app", "list")).out.splitlines()
    assert re.fullmatch(rf"{created['id']}\s+ACTIVE\s+{app}", _line(listing, app))

    issued = (await ok(db_url, "credential", "create", name("cred"), "--application", app)).json()
    assert (await api.get("/v1/whoami", headers=bearer(issued["api_key"]))).status == 200

    # --reason is required: usage error, nothing written
    writes.reset()
    run = await orbit_admin(db_url, "app", "disable", app)
    assert run.code == 2
    assert "--reason" in run.err
    writes.assert_unchanged()

    disabled = (await ok(db_url, "app", "disable", app, "--reason", "contract ended")).json()
    assert disabled["state"] == "DISABLED"
    assert disabled["revision"] == 2
    assert writes.delta() == {"orbit_events": 1, "orbit_audit_events": 1}
    [audit] = rows(
        sync_conn,
        "SELECT * FROM orbit_audit_events WHERE action = 'application.disable'"
        " AND resource_id = %s",
        bytes.fromhex(created["id"]),
    )
    assert (audit["actor_kind"], audit["actor_id"], audit["reason"]) == (
        "operator",
        ACTOR,
        "contract ended",
    )
    assert json.loads(audit["before_doc"])["state"] == "ACTIVE"
    assert json.loads(audit["after_doc"])["state"] == "DISABLED"
    listing = (await ok(db_url, "app", "list")).out.splitlines()
    assert re.fullmatch(rf"{created['id']}\s+DISABLED\s+{app}", _line(listing, app))

    response = await api.get("/v1/whoami", headers=bearer(issued["api_key"]))
    await assert_problem(response, 401, "invalid_credential")

    # Disabling again changes nothing; a disabled application gets no new credential.
    writes.reset()
    again = (await ok(db_url, "app", "disable", app, "--reason", "again")).json()
    assert again == disabled
    run = await orbit_admin(db_url, "credential", "create", name("cred"), "--application", app)
    assert run.code == 1
    assert "conflict" in run.err
    writes.assert_unchanged()


def _line(lines: list[str], needle: str) -> str:
    [line] = [x for x in lines if x.split()[-1:] == [needle]]
    return line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["app", "create", "Bad_Name"], "validation_failed"),
        (["app", "create", "-x"], None),  # click reads it as an option: a usage error
        (["app", "disable", "0no-such-app", "--reason", "r"], "application_not_found"),
        (["namespace", "create", "0ns", "--application", "0no-such-app"], "application_not_found"),
        (["namespace", "list", "--application", "0no-such-app"], "application_not_found"),
        (["credential", "list", "--application", "0no-such-app"], "application_not_found"),
        (["credential", "revoke", "000000000000", "--reason", "r"], "credential_not_found"),
        (["credential", "revoke", "000000000000"], "--reason"),
    ],
)
async def test_errors_exit_non_zero_with_the_code_and_write_nothing(
    db_url: DatabaseUrl, writes: WriteWatch, args: list[str], message: str | None
) -> None:
    writes.reset()
    run = await orbit_admin(db_url, *args)
    assert run.code != 0, run
    if message is not None:
        assert message in run.err
    assert "Traceback" not in run.err
    writes.assert_unchanged()


async def test_app_create_refuses_a_taken_name(db_url: DatabaseUrl, writes: WriteWatch) -> None:
    app = name("app")
    await ok(db_url, "app", "create", app)
    writes.reset()
    run = await orbit_admin(db_url, "app", "create", app)
    assert run.code == 1
    assert "already_exists" in run.err
    writes.assert_unchanged()


# --- namespaces ----------------------------------------------------------------------------------


async def test_namespace_create_and_list(
    db_url: DatabaseUrl,
    sync_conn: pymysql.connections.Connection[Any],
    writes: WriteWatch,
) -> None:
    app = name("app")
    await ok(db_url, "app", "create", app)
    names = sorted([name("ns-b"), name("ns-a")])
    writes.reset()
    created = []
    for ns in reversed(names):
        created.append(
            (
                await ok(
                    db_url,
                    "namespace",
                    "create",
                    ns,
                    "--application",
                    app,
                    "--description",
                    "made by ops",
                )
            ).json()
        )
    assert writes.delta() == {"orbit_namespaces": 2, "orbit_events": 2, "orbit_audit_events": 2}
    for view in created:
        assert set(view) == {
            "id",
            "name",
            "description",
            "state",
            "revision",
            "created_at",
            "updated_at",
        }
        assert view["description"] == "made by ops"
        assert view["state"] == "ACTIVE"
    lines = (await ok(db_url, "namespace", "list", "--application", app)).out.splitlines()
    assert [line.split()[-1] for line in lines] == names
    by_name = {view["name"]: view["id"] for view in created}
    for line in lines:
        ns_id, state, ns = line.split()
        assert (ns_id, state) == (by_name[ns], "ACTIVE")

    audit = rows(
        sync_conn,
        "SELECT actor_kind, actor_id FROM orbit_audit_events WHERE action = 'namespace.create'"
        " AND resource_id = %s",
        bytes.fromhex(created[0]["id"]),
    )
    assert audit == [{"actor_kind": "operator", "actor_id": ACTOR}]

    writes.reset()
    run = await orbit_admin(db_url, "namespace", "create", names[0], "--application", app)
    assert run.code == 1
    assert "already_exists" in run.err
    run = await orbit_admin(db_url, "namespace", "create", "Bad", "--application", app)
    assert run.code == 1
    assert "validation_failed" in run.err
    writes.assert_unchanged()


async def test_namespace_disable_and_enable_are_audited_and_need_a_reason(
    db_url: DatabaseUrl,
    sync_conn: pymysql.connections.Connection[Any],
    writes: WriteWatch,
) -> None:
    app, ns = name("app"), name("ns")
    await ok(db_url, "app", "create", app)
    created = (await ok(db_url, "namespace", "create", ns, "--application", app)).json()

    writes.reset()
    run = await orbit_admin(db_url, "namespace", "disable", ns)
    assert run.code == 2  # click: --reason is a required option
    assert "--reason" in run.err
    run = await orbit_admin(db_url, "namespace", "disable", ns, "--reason", "")
    assert (run.code, "validation_failed" in run.err) == (1, True)
    run = await orbit_admin(db_url, "namespace", "disable", name("nowhere"), "--reason", "x")
    assert (run.code, "namespace_not_found" in run.err) == (1, True)
    writes.assert_unchanged()
    assert rows(sync_conn, "SELECT state, revision FROM orbit_namespaces WHERE name = %s",
                ns) == [{"state": "ACTIVE", "revision": 1}]

    disabled = (await ok(db_url, "namespace", "disable", ns, "--reason", "tenant left")).json()
    assert (disabled["state"], disabled["revision"]) == ("DISABLED", 2)
    assert writes.delta() == {"orbit_events": 1, "orbit_audit_events": 1}
    writes.reset()
    again = (await ok(db_url, "namespace", "disable", ns, "--reason", "again")).json()
    assert again == disabled  # idempotent: nothing written
    writes.assert_unchanged()
    line = (await ok(db_url, "namespace", "list", "--application", app)).out.split()
    assert line == [created["id"], "DISABLED", ns]

    enabled = (await ok(db_url, "namespace", "enable", ns, "--reason", "tenant is back")).json()
    assert (enabled["state"], enabled["revision"]) == ("ACTIVE", 3)
    audit = rows(sync_conn, "SELECT action, actor_id, reason, resource_revision"
                            " FROM orbit_audit_events WHERE resource_id = %s"
                            " AND action LIKE 'namespace.%%able' ORDER BY resource_revision",
                 bytes.fromhex(created["id"]))
    assert audit == [
        {"action": "namespace.disable", "actor_id": ACTOR, "reason": "tenant left",
         "resource_revision": 2},
        {"action": "namespace.enable", "actor_id": ACTOR, "reason": "tenant is back",
         "resource_revision": 3}]


# --- credentials ---------------------------------------------------------------------------------


async def test_credential_create_list_and_revoke(
    db_url: DatabaseUrl,
    api: TestClient[Any, Any],
    sync_conn: pymysql.connections.Connection[Any],
    writes: WriteWatch,
) -> None:
    app = name("app")
    ns = name("team")
    await ok(db_url, "app", "create", app)
    await ok(db_url, "namespace", "create", ns, "--application", app)
    grants = [{"namespaces": ["0team-*"], "actions": ["namespaces.read"]}]
    cred = name("reader")
    run = await ok(
        db_url, "credential", "create", cred, "--application", app, "--grants", json.dumps(grants)
    )
    issued = run.json()
    key = issued["api_key"]
    assert KEY_PATTERN.match(key)
    assert run.out.count(key) == 1
    assert issued["name"] == cred
    assert issued["state"] == "ACTIVE"
    assert issued["prefix"] == key.split("_")[1]
    assert issued["grants"] == [{**grants[0], "queues": ["*"]}]

    who = await (await api.get("/v1/whoami", headers=bearer(key))).json()
    assert who["grants"] == issued["grants"]
    assert who["namespaces"] == [ns]
    response = await api.post("/v1/namespaces", json={"name": name("team")}, headers=bearer(key))
    await assert_problem(response, 403, "forbidden")

    default = await ok(db_url, "credential", "create", name("admin"), "--application", app)
    assert default.json()["grants"] == [{"namespaces": ["*"], "actions": ["*"], "queues": ["*"]}]

    listing = await ok(db_url, "credential", "list", "--application", app)
    assert key not in listing.out
    assert default.json()["api_key"] not in listing.out
    assert re.fullmatch(
        rf"{issued['prefix']}\s+ACTIVE\s+{cred}", _line(listing.out.splitlines(), cred)
    )

    writes.reset()
    revoked = await ok(db_url, "credential", "revoke", issued["prefix"], "--reason", "leaked")
    assert revoked.json()["state"] == "REVOKED"
    assert writes.delta() == {"orbit_events": 1, "orbit_audit_events": 1}
    [audit] = rows(
        sync_conn,
        "SELECT actor_kind, actor_id, reason FROM orbit_audit_events"
        " WHERE action = 'credential.revoke' AND resource_id = %s",
        bytes.fromhex(issued["id"]),
    )
    assert audit == {"actor_kind": "operator", "actor_id": ACTOR, "reason": "leaked"}

    response = await api.get("/v1/whoami", headers=bearer(key))
    await assert_problem(response, 401, "invalid_credential")
    listing = await ok(db_url, "credential", "list", "--application", app)
    assert re.fullmatch(
        rf"{issued['prefix']}\s+REVOKED\s+{cred}", _line(listing.out.splitlines(), cred)
    )
    # the other credential of the application is untouched
    assert (await api.get("/v1/whoami", headers=bearer(default.json()["api_key"]))).status == 200


@pytest.mark.parametrize(
    ("grants", "message"),
    [
        ("[{", "malformed_json"),
        ("not json", "malformed_json"),
        ("", "malformed_json"),
        ("[]", "non-empty list"),
        ('{"namespaces": ["*"], "actions": ["*"]}', "non-empty list"),
        ('[{"namespaces": ["*"], "actions": ["tasks.launch"]}]', "invalid pattern"),
        ('[{"namespaces": ["Prod*"], "actions": ["*"]}]', "invalid pattern"),
        ('[{"namespaces": ["*"], "actions": ["*"], "tenants": ["x"]}]', "unknown fields"),
        # a repeated key must not silently widen the grant to its last value
        (
            '[{"namespaces": ["team-a"], "actions": ["namespaces.read"], "namespaces": ["*"]}]',
            "duplicate_json_key",
        ),
        ('[{"namespaces": ["*"], "actions": [NaN]}]', "malformed_json"),
    ],
)
async def test_credential_create_validates_grants_and_writes_nothing(
    db_url: DatabaseUrl, writes: WriteWatch, grants: str, message: str
) -> None:
    app = name("app")
    await ok(db_url, "app", "create", app)
    writes.reset()
    run = await orbit_admin(
        db_url, "credential", "create", name("cred"), "--application", app, "--grants", grants
    )
    assert run.code == 2, run  # a usage error, before any database work
    assert "--grants" in run.err
    assert message in run.err
    assert "orb_" not in run.out
    writes.assert_unchanged()


async def test_revoking_a_revoked_credential_changes_nothing(
    db_url: DatabaseUrl, writes: WriteWatch
) -> None:
    app = name("app")
    await ok(db_url, "app", "create", app)
    prefix = (await ok(db_url, "credential", "create", name("c"), "--application", app)).json()[
        "prefix"
    ]
    first = (await ok(db_url, "credential", "revoke", prefix, "--reason", "one")).json()
    writes.reset()
    second = (await ok(db_url, "credential", "revoke", prefix, "--reason", "two")).json()
    assert second == first
    writes.assert_unchanged()


async def test_app_list_pages_through_every_application(
    db_url: DatabaseUrl, sync_conn: pymysql.connections.Connection[Any]
) -> None:
    """More applications than one keyset page (500): every one is listed, once, in order."""
    prefix = f"zz{secrets.token_hex(3)}"
    names = [f"{prefix}-{i:04d}" for i in range(620)]
    with sync_conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO orbit_applications (id, name, state, revision, created_at, updated_at)"
            " VALUES (%s, %s, 'ACTIVE', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
            [(secrets.token_bytes(16), n) for n in names],
        )
    listing = (await ok(db_url, "app", "list")).out.splitlines()
    listed = [line.split()[-1] for line in listing]
    assert [n for n in listed if n.startswith(prefix)] == names
    assert listed == sorted(listed)

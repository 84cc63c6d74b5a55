"""``orbit admin app resources show|set``: the real CLI as a subprocess against this worker's
database (the shared quotas of orbit_common/pulse/quotas.py)."""

from __future__ import annotations

import json
from typing import Any

import pymysql

from orbit_common.db.pool import Database, DatabaseUrl
from tests.conftest import make_tenant, unique
from tests.integration.test_admin_cli import ACTOR, orbit_admin

LIMITS = ("max_unfinished_tasks", "max_active_attempts", "max_reserved_attempts",
          "max_starts_per_second")


def _audits(conn: pymysql.connections.Connection[Any], app_id: bytes) -> list[dict[str, Any]]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SELECT actor_kind, actor_id, reason, before_doc, after_doc,"
                    " resource_revision FROM orbit_audit_events WHERE resource_id = %s AND"
                    " action = 'application.resources.update' ORDER BY occurred_at",
                    (app_id,))
        return list(cur.fetchall())


async def test_show_and_set_with_audit(
    db_url: DatabaseUrl, db: Database, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = await make_tenant(db)
    shown = await orbit_admin(db_url, "app", "resources", "show", tenant.application)
    assert shown.code == 0, shown.err
    body = shown.json()
    assert body["revision"] == 1
    assert {k: body[k] for k in LIMITS} == dict.fromkeys(LIMITS)
    assert body["usage"]["unfinished_tasks"] == 0

    done = await orbit_admin(db_url, "app", "resources", "set", tenant.application,
                             "--max-unfinished-tasks", "500", "--max-starts-per-second", "20",
                             "--reason", "launch day")
    assert done.code == 0, done.err
    after = done.json()
    assert (after["revision"], after["max_unfinished_tasks"], after["max_starts_per_second"],
            after["max_active_attempts"]) == (2, 500, 20, None)
    (audit,) = _audits(sync_conn, tenant.application_id)
    assert (audit["actor_kind"], audit["actor_id"], audit["reason"]) == (
        "operator", ACTOR, "launch day")
    assert json.loads(audit["after_doc"])["max_unfinished_tasks"] == 500

    # 'none' removes a limit; a compare-and-set on a stale revision is refused.
    done = await orbit_admin(db_url, "app", "resources", "set", tenant.application,
                             "--max-unfinished-tasks", "none", "--revision", "2")
    assert done.code == 0, done.err
    assert (done.json()["max_unfinished_tasks"], done.json()["revision"]) == (None, 3)
    stale = await orbit_admin(db_url, "app", "resources", "set", tenant.application,
                              "--max-active-attempts", "3", "--revision", "2")
    assert stale.code != 0
    assert "stale_revision" in stale.err
    assert len(_audits(sync_conn, tenant.application_id)) == 2


async def test_bad_values_and_unknown_applications_change_nothing(
    db_url: DatabaseUrl, db: Database, sync_conn: pymysql.connections.Connection[Any],
) -> None:
    tenant = await make_tenant(db)
    for args, expected in (
        (["--max-unfinished-tasks", "0"], "validation_failed"),
        (["--max-active-attempts", "-3"], "N|none"),
        (["--max-reserved-attempts", "lots"], "N|none"),
        (["--max-starts-per-second", "99999999999"], "N|none"),
    ):
        run = await orbit_admin(db_url, "app", "resources", "set", tenant.application, *args)
        assert run.code != 0, run.out
        assert expected in run.err or "neither" in run.err, run.err
    missing = unique("missing")
    for command in (["show", missing], ["set", missing, "--max-active-attempts", "1"]):
        run = await orbit_admin(db_url, "app", "resources", *command)
        assert run.code != 0
        assert "application_not_found" in run.err
    assert _audits(sync_conn, tenant.application_id) == []
    shown = (await orbit_admin(db_url, "app", "resources", "show", tenant.application)).json()
    assert shown["revision"] == 1

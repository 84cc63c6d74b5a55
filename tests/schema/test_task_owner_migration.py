"""Migration 0015 backfills task ownership from the schedule ledger.

A database at 0014 holds a submitted task, two tasks made by schedule occurrences (a RULE fire
and a BACKFILL run) and a SKIPPED occurrence; after 0015 exactly the two scheduled tasks are
owned by their schedules, and ck_tasks_owner refuses half an owner.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pymysql
import pytest

from orbit_common.db.migrator import Migrator
from tests.support import migrations, pulse

OWNER_MIGRATION = "0015_task_owner.sql"
INSERT_TASK = """
INSERT INTO pulse_tasks (namespace_id, id, queue_id, handler, input, state, available_at,
  max_attempts, retry_initial_ms, retry_max_ms, retry_multiplier, retry_jitter, offer_lease_ms,
  execution_lease_ms, rerun_safe, created_at, updated_at)
VALUES (%s, %s, %s, 'h', '{}', 'WAITING', UTC_TIMESTAMP(6), 3, 1000, 60000, 2, 0.2, 30000,
  60000, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
INSERT_OCCURRENCE = """
INSERT INTO pulse_schedule_occurrences (namespace_id, id, schedule_id, fire_at, version, source,
  outcome, reason, covered_until, covered_count, task_id, fired_at, lateness_ms)
VALUES (%s, %s, %s, '2026-01-01 10:00:00', 1, %s, %s, NULL, NULL, 1, %s, UTC_TIMESTAMP(6), 0)
"""


def test_scheduled_tasks_are_owned_by_their_schedules_after_0015(
    tmp_path: Path, scratch: migrations.ScratchDatabases,
) -> None:
    before = migrations.copy_migrations(tmp_path / "migrations")
    (before / OWNER_MIGRATION).unlink()
    migrations.rewrite_manifest(before)
    url = scratch.create(migrate=True, directory=before)
    assert OWNER_MIGRATION.removesuffix(".sql") not in migrations.ledger(url)

    namespace_id, schedule_id = secrets.token_bytes(16), secrets.token_bytes(16)
    submitted, fired, backfilled = (secrets.token_bytes(16) for _ in range(3))
    conn = migrations.connect(url)
    try:
        with conn.cursor() as cur:
            queue_id, gate, queue = pulse.queue_rows(namespace_id, "work")
            cur.execute(pulse.INSERT_GATE, gate)
            cur.execute(pulse.INSERT_QUEUE, queue)
            for task_id in (submitted, fired, backfilled):
                cur.execute(INSERT_TASK, (namespace_id, task_id, queue_id))
            for source, outcome, task_id in (("RULE", "SKIPPED", None),
                                             ("BACKFILL", "FIRED", backfilled)):
                cur.execute(INSERT_OCCURRENCE, (namespace_id, secrets.token_bytes(16),
                                                schedule_id, source, outcome, task_id))
            cur.execute(INSERT_OCCURRENCE.replace("'2026-01-01 10:00:00'",
                                                  "'2026-01-01 10:10:00'"),
                        (namespace_id, secrets.token_bytes(16), schedule_id, "RULE", "FIRED",
                         fired))
    finally:
        conn.close()

    Migrator(url).up(log=lambda _msg: None)  # the shipped files: 0015 applies

    owners = {r["id"]: (r["owner_kind"], r["owner_id"]) for r in migrations.query(
        url, "SELECT id, owner_kind, owner_id FROM pulse_tasks WHERE namespace_id = %s",
        (namespace_id,))}
    assert owners == {submitted: (None, None), fired: ("SCHEDULE", schedule_id),
                      backfilled: ("SCHEDULE", schedule_id)}

    conn = migrations.connect(url)
    try:
        with conn.cursor() as cur:
            for kind, owner in (("SCHEDULE", None), (None, schedule_id), ("QUEUE", schedule_id)):
                with pytest.raises(pymysql.err.MySQLError) as raised:
                    cur.execute("UPDATE pulse_tasks SET owner_kind = %s, owner_id = %s"
                                " WHERE namespace_id = %s AND id = %s",
                                (kind, owner, namespace_id, submitted))
                assert raised.value.args[0] in {3819, 4025}  # MySQL, MariaDB: CHECK failed
                assert "ck_tasks_owner" in str(raised.value.args[1])
    finally:
        conn.close()

"""The migrator under faults, through the real CLI in real subprocesses (DESIGN §9: "migrator
killed midway; two migrators at once — lock freed on death; dirty blocks readiness; no
auto-clear").

Every scenario runs on its own scratch database. A private migrations directory adds
``0099_slow`` (``SELECT SLEEP(3)``) where a migrator has to be caught in the middle of a run;
tests wait for the ledger to show it, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit_common.db import migrator
from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.db.schema import SchemaChecker, SchemaReport
from tests.support import migrations
from tests.support.migrations import ledger, run_cli, start_cli, wait_for

pytestmark = pytest.mark.slow

SLOW_ID = "0099_slow"
SLOW_S = 3
BROKEN_ID = "0099_broken"
RUNBOOK = "runbooks/migrations.md"

WAITING_FOR_LOCK = """
SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST
WHERE ID <> CONNECTION_ID() AND STATE = 'User lock' AND INFO LIKE %s
"""


@pytest.fixture
def scratch() -> Iterator[migrations.ScratchDatabases]:
    with migrations.scratch_databases() as databases:
        yield databases


@pytest.fixture
def slow_dir(tmp_path: Path) -> Path:
    """The shipped migrations plus one that sleeps, with a matching CHECKSUMS."""
    return migrations.copy_migrations(
        tmp_path / "migrations",
        extra={f"{SLOW_ID}.sql": migrations.migration_text(f"SELECT SLEEP({SLOW_S})")},
    )


@pytest.fixture
def broken_dir(tmp_path: Path) -> Path:
    """The shipped migrations plus one whose second statement fails on the server."""
    return migrations.copy_migrations(
        tmp_path / "migrations",
        extra={
            f"{BROKEN_ID}.sql": migrations.migration_text(
                "CREATE TABLE orbit_t (id INT) COMMENT='测试'",
                "ALTER TABLE no_such_table ADD COLUMN x INT",
            )
        },
    )


def _ids(directory: Path | None = None) -> list[str]:
    return [f.id for f in migrator.discover(directory)]


def _state(url: DatabaseUrl, migration_id: str) -> str | None:
    row = ledger(url).get(migration_id)
    return None if row is None else row["state"]


def _readiness(url: DatabaseUrl, directory: Path | None = None) -> SchemaReport:
    async def check() -> SchemaReport:
        db = await open_database(url, minsize=1, maxsize=1)
        try:
            return await SchemaChecker(db, directory=directory).check()
        finally:
            await db.close()

    return asyncio.run(check())


def _status_lines(output: str) -> dict[str, str]:
    """``orbit migrate status`` output by migration id."""
    lines = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            lines[fields[1]] = line
    return lines


def _stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_two_migrators_at_once_apply_each_migration_exactly_once(
    scratch: migrations.ScratchDatabases, slow_dir: Path
) -> None:
    url = scratch.create()
    procs = [start_cli(["migrate", "up"], url, slow_dir) for _ in range(2)]
    try:
        wait_for(
            lambda: _state(url, SLOW_ID) == "APPLYING",
            timeout_s=20,
            what=f"{SLOW_ID} to start applying",
        )
        # The overlap is real: while one sleeps inside 0099_slow, the other waits on GET_LOCK.
        pattern = f"%GET_LOCK('{migrations.lock_name(url)}'%"
        wait_for(
            lambda: migrations.query(url, WAITING_FOR_LOCK, (pattern,))[0]["n"] == 1,
            timeout_s=SLOW_S,
            what="the second migrator to wait for the lock",
        )
        outputs = [proc.communicate(timeout=30)[0] for proc in procs]
    finally:
        _stop(*procs)

    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output
    appliers = [output for output in outputs if "applying" in output]
    assert len(appliers) == 1, outputs
    for migration_id in _ids(slow_dir):
        assert f"applying {migration_id} " in appliers[0]
    assert "schema is up to date" in next(o for o in outputs if "applying" not in o)

    rows = ledger(url)
    assert sorted(rows) == sorted(_ids(slow_dir))
    for row in rows.values():
        assert row["state"] == "APPLIED"
        assert row["steps_done"] == row["steps_total"]
        assert row["finished_at"] is not None
    assert migrations.lock_is_free(url)


def test_a_migrator_killed_midway_frees_the_lock_and_leaves_the_schema_dirty(
    scratch: migrations.ScratchDatabases, slow_dir: Path
) -> None:
    url = scratch.create()
    proc = start_cli(["migrate", "up"], url, slow_dir)
    try:
        wait_for(
            lambda: _state(url, SLOW_ID) == "APPLYING",
            timeout_s=20,
            what=f"{SLOW_ID} to start applying",
        )
        assert not migrations.lock_is_free(url), "the migrator should hold the lock"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGKILL

    # The server frees a named lock when its connection dies: no stale lock row to clean up.
    wait_for(
        lambda: migrations.lock_is_free(url),
        timeout_s=SLOW_S + 10,
        what="the server to free the dead migrator's lock",
    )
    conn = migrations.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (migrations.lock_name(url),))
            assert cur.fetchone() == (1,)
            cur.execute("SELECT RELEASE_LOCK(%s)", (migrations.lock_name(url),))
    finally:
        conn.close()

    before = ledger(url)
    dirty = before[SLOW_ID]
    assert (dirty["state"], dirty["steps_done"], dirty["steps_total"]) == ("APPLYING", 0, 1)
    assert dirty["finished_at"] is None
    for migration_id in _ids():
        assert before[migration_id]["state"] == "APPLIED"
    tables_before = migrations.tables(url)

    # No auto-clear: the next run refuses, says why and where to read, and changes nothing.
    again = run_cli(["migrate", "up", "--lock-timeout", "10"], url, slow_dir)
    assert again.returncode != 0, again.stdout
    assert "dirty" in again.stdout
    assert RUNBOOK in again.stdout
    assert "applying" not in again.stdout
    assert ledger(url) == before
    assert migrations.tables(url) == tables_before

    status = run_cli(["migrate", "status"], url, slow_dir)
    assert status.returncode == 1, status.stdout
    line = _status_lines(status.stdout)[SLOW_ID]
    assert line.startswith("dirty")
    assert "APPLYING after 0/1 statements" in line

    report = _readiness(url, slow_dir)
    assert not report.ready
    assert report.migrations[SLOW_ID] == "dirty"
    assert any(p.startswith(f"migration {SLOW_ID} is dirty") for p in report.problems)


def test_a_failing_migration_reports_the_server_error_and_stays_failed(
    scratch: migrations.ScratchDatabases, broken_dir: Path
) -> None:
    url = scratch.create()
    result = run_cli(["migrate", "up"], url, broken_dir)
    assert result.returncode != 0, result.stdout
    assert "doesn't exist" in result.stdout  # the server's own words, not a SAVEPOINT error
    assert "statement 2 of 2" in result.stdout
    assert RUNBOOK in result.stdout

    before = ledger(url)
    row = before[BROKEN_ID]
    assert (row["state"], row["steps_done"], row["steps_total"]) == ("FAILED", 1, 2)
    assert "no_such_table" in row["error_text"]
    assert "doesn't exist" in row["error_text"]
    assert row["finished_at"] is not None
    # DDL does not roll back: statement 1 took effect, exactly as the message says.
    assert "orbit_t" in migrations.tables(url)

    again = run_cli(["migrate", "up", "--lock-timeout", "10"], url, broken_dir)
    assert again.returncode != 0, again.stdout
    assert "refusing to migrate" in again.stdout
    assert f"{BROKEN_ID}: dirty (FAILED after 1/2 statements" in again.stdout
    assert ledger(url) == before

    report = _readiness(url, broken_dir)
    assert not report.ready
    assert report.migrations[BROKEN_ID] == "dirty"


def test_status_of_a_migrated_and_of_an_empty_database(
    scratch: migrations.ScratchDatabases,
) -> None:
    ids = _ids()
    migrated = scratch.create(migrate=True)
    empty = scratch.create()

    result = run_cli(["migrate", "status"], migrated)
    assert result.returncode == 0, result.stdout
    lines = _status_lines(result.stdout)
    assert sorted(lines) == sorted(ids)
    for migration_id in ids:
        assert lines[migration_id].startswith("applied"), lines[migration_id]

    as_json = run_cli(["migrate", "status", "--json"], migrated)
    assert as_json.returncode == 0, as_json.stdout
    assert {e["id"]: e["status"] for e in json.loads(as_json.stdout)} == dict.fromkeys(
        ids, "applied"
    )

    result = run_cli(["migrate", "status"], empty)
    assert result.returncode == 1, result.stdout
    lines = _status_lines(result.stdout)
    assert sorted(lines) == sorted(ids)
    for migration_id in ids:
        assert lines[migration_id].startswith("pending"), lines[migration_id]
    assert migrations.tables(empty) == [], "status must not create anything"


def test_the_orbit_migrate_alias(scratch: migrations.ScratchDatabases) -> None:
    assert migrations.ORBIT_MIGRATE.exists(), migrations.ORBIT_MIGRATE
    command = (str(migrations.ORBIT_MIGRATE),)
    url = scratch.create()

    up = run_cli(["up"], url, command=command)
    assert up.returncode == 0, up.stdout
    for migration_id in _ids():
        assert f"applying {migration_id} " in up.stdout
    assert f"applied {len(_ids())} migration(s)" in up.stdout

    status = run_cli(["status"], url, command=command)
    assert status.returncode == 0, status.stdout
    assert set(_status_lines(status.stdout)) == set(_ids())

    again = run_cli(["up"], url, command=command)
    assert again.returncode == 0, again.stdout
    assert "schema is up to date" in again.stdout

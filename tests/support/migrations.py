"""Helpers for the schema gate and migration fault tests.

Scratch databases, private copies of the migrations directory (with extra migrations and a
regenerated ``CHECKSUMS``), the ledger as plain rows, the ``orbit`` CLI as a real subprocess,
and a deadline-bound wait: tests wait on conditions, never on sleeps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pymysql

from orbit_common.db import migrator
from orbit_common.db.pool import DatabaseUrl, connect_sync
from tests.support import database

T = TypeVar("T")
S = TypeVar("S")

CLI = (sys.executable, "-m", "orbit_cli")
# The console script installed next to this interpreter (pyproject's [project.scripts]).
ORBIT_MIGRATE = Path(sys.executable).with_name("orbit-migrate")

LEDGER_COLUMNS = (
    "migration_id, checksum, state, steps_total, steps_done, error_text, applied_by,"
    " started_at, finished_at"
)


class ScratchDatabases:
    """Creates scratch databases on the test server and drops every one of them at the end."""

    def __init__(self, server: DatabaseUrl) -> None:
        self.server = server
        self.names: list[str] = []

    def create(self, *, migrate: bool = False, directory: Path | None = None) -> DatabaseUrl:
        name = database.scratch_name()
        self.names.append(name)
        url = database.create_database(self.server, name, migrate=False)
        if migrate:
            migrator.Migrator(url, directory=directory).up(log=lambda _msg: None)
        return url

    def drop_all(self) -> None:
        for name in self.names:
            database.drop_database(self.server, name)
        self.names.clear()


@contextmanager
def scratch_databases() -> Iterator[ScratchDatabases]:
    scratch = ScratchDatabases(database.server_url())
    try:
        yield scratch
    finally:
        scratch.drop_all()


@contextmanager
def seeded_database(seed: Callable[[Any], S]) -> Iterator[tuple[DatabaseUrl, S]]:
    """A migrated scratch database, seeded by ``seed(cursor)`` (autocommit), with what the seed
    returned; dropped afterwards. The EXPLAIN tests' module fixtures are built on it."""
    with scratch_databases() as scratch:
        url = scratch.create(migrate=True)
        conn = connect(url)
        try:
            with conn.cursor() as cur:
                values = seed(cur)
        finally:
            conn.close()
        yield url, values


def copy_migrations(target: Path, extra: dict[str, str] | None = None) -> Path:
    """Copy the shipped migrations (and CHECKSUMS) to ``target``, add ``extra`` files by name,
    and rewrite the manifest so it covers them. Returns ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    source = migrator.migrations_dir()
    for path in sorted(source.glob("*.sql")):
        shutil.copy2(path, target / path.name)
    shutil.copy2(source / migrator.MANIFEST, target / migrator.MANIFEST)
    for name, text in (extra or {}).items():
        (target / name).write_text(text, encoding="utf-8")
    if extra:
        rewrite_manifest(target)
    return target


def rewrite_manifest(directory: Path) -> None:
    """Make ``CHECKSUMS`` match the files, as ``orbit migrate manifest --write`` would."""
    manifest = migrator.render_manifest(migrator.discover(directory))
    (directory / migrator.MANIFEST).write_text(manifest, encoding="utf-8")


def migration_text(*statements: str, depends: str = "0003_events_and_audit") -> str:
    """The text of an Orbit migration file (non-transactional) with the given statements."""
    body = "\n\n".join(s.rstrip().rstrip(";") + ";" for s in statements)
    return (
        "-- A migration written by the test suite.\n"
        f"-- depends: {depends}\n"
        "-- transactional: false\n\n"
        f"{body}\n"
    )


def connect(url: DatabaseUrl) -> pymysql.connections.Connection[Any]:
    return connect_sync(url, autocommit=True)


def query(url: DatabaseUrl, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Rows as dicts, on a fresh autocommit connection (so every call sees committed data)."""
    conn = connect(url)
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(sql, tuple(params))
            return list(cur.fetchall())
    finally:
        conn.close()


def ledger(url: DatabaseUrl) -> dict[str, dict[str, Any]]:
    """``orbit_schema_migrations`` by migration id (empty when the table does not exist yet)."""
    exists = query(
        url,
        "SELECT COUNT(*) AS n FROM information_schema.TABLES"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orbit_schema_migrations'",
    )
    if not exists[0]["n"]:
        return {}
    rows = query(url, f"SELECT {LEDGER_COLUMNS} FROM orbit_schema_migrations")
    return {row["migration_id"]: row for row in rows}


def tables(url: DatabaseUrl) -> list[str]:
    rows = query(
        url,
        "SELECT TABLE_NAME AS name FROM information_schema.TABLES"
        " WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME",
    )
    return [row["name"] for row in rows]


def lock_name(url: DatabaseUrl) -> str:
    return f"orbit:migrate:{url.database}"


def lock_is_free(url: DatabaseUrl) -> bool:
    rows = query(url, "SELECT IS_FREE_LOCK(%s) AS free", (lock_name(url),))
    return bool(rows[0]["free"] == 1)


def wait_for(
    condition: Callable[[], T | None], *, timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def cli_env(url: DatabaseUrl, directory: Path | None = None) -> dict[str, str]:
    """The environment of a CLI subprocess: this one without Orbit settings, plus the
    scratch database and (optionally) a private migrations directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_DATABASE_URL"] = url.render(hide_password=False)
    if directory is not None:
        env["ORBIT_MIGRATIONS_DIR"] = str(directory)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_cli(
    args: Sequence[str],
    url: DatabaseUrl,
    directory: Path | None = None,
    *,
    command: Sequence[str] = CLI,
) -> subprocess.Popen[str]:
    """Start ``orbit <args>`` (stdout and stderr merged, text) against ``url``."""
    return subprocess.Popen(
        [*command, *args],
        env=cli_env(url, directory),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_cli(
    args: Sequence[str],
    url: DatabaseUrl,
    directory: Path | None = None,
    *,
    command: Sequence[str] = CLI,
    timeout_s: float = 30,
) -> subprocess.CompletedProcess[str]:
    """Run ``orbit <args>`` to completion; ``stdout`` holds stdout and stderr merged."""
    return subprocess.run(
        [*command, *args],
        env=cli_env(url, directory),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
        check=False,
    )

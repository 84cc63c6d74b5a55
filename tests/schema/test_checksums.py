"""Applied migrations are immutable: the committed manifest, the ledger checksums, readiness."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from orbit_common.db import migrator
from orbit_common.db.migrator import MigrationError, Migrator, Status
from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.db.schema import SchemaChecker
from tests.support import migrations

NON_TRANSACTIONAL = re.compile(r"^-- transactional: false$", re.MULTILINE)
EDITED_ID = "0001_platform_identity"
EDITED_FROM = "'说明文字，仅供展示'"
EDITED_TO = "'说明文字'"


def test_the_manifest_matches_the_migration_files() -> None:
    directory = migrator.migrations_dir()
    files = migrator.discover(directory)
    assert files, "no migrations found"
    assert migrator.check_manifest(files, directory) == []
    # Byte for byte what `orbit migrate manifest --write` produces.
    assert (directory / migrator.MANIFEST).read_text() == migrator.render_manifest(files)


def test_every_migration_is_declared_non_transactional() -> None:
    paths = sorted(migrator.migrations_dir().glob("*.sql"))
    assert paths
    offenders = [p.name for p in paths if not NON_TRANSACTIONAL.search(p.read_text())]
    assert not offenders, f"missing '-- transactional: false': {offenders}"


def test_a_transactional_migration_is_refused(tmp_path: Path) -> None:
    directory = migrations.copy_migrations(tmp_path / "migrations")
    (directory / "0099_transactional.sql").write_text(
        "-- depends: 0003_events_and_audit\n\nSELECT 1;\n"
    )
    with pytest.raises(MigrationError, match="transactional: false"):
        migrator.discover(directory)


def _statuses(url: DatabaseUrl, directory: Path) -> dict[str, Status]:
    return {e.id: e.status for e in Migrator(url, directory=directory).status()}


async def _readiness_problems(url: DatabaseUrl, directory: Path) -> tuple[str, ...]:
    db = await open_database(url, minsize=1, maxsize=1)
    try:
        report = await SchemaChecker(db, directory=directory).check()
    finally:
        await db.close()
    assert report.ready == (not report.problems)
    return report.problems


@pytest.fixture
def applied(tmp_path: Path, scratch: migrations.ScratchDatabases) -> tuple[DatabaseUrl, Path]:
    """A scratch database migrated from a private copy of the migrations."""
    directory = migrations.copy_migrations(tmp_path / "migrations")
    url = scratch.create(migrate=True, directory=directory)
    assert set(_statuses(url, directory).values()) == {Status.APPLIED}
    return url, directory


async def test_an_edited_applied_migration_is_detected(
    applied: tuple[DatabaseUrl, Path],
) -> None:
    url, directory = applied
    assert await _readiness_problems(url, directory) == ()
    path = directory / f"{EDITED_ID}.sql"
    text = path.read_text()
    assert EDITED_FROM in text
    path.write_text(text.replace(EDITED_FROM, EDITED_TO))
    ledger_before = migrations.ledger(url)

    statuses = _statuses(url, directory)
    assert statuses.pop(EDITED_ID) is Status.EDITED
    assert set(statuses.values()) == {Status.APPLIED}

    # Refused first by the committed manifest …
    with pytest.raises(MigrationError, match="checksum manifest") as by_manifest:
        Migrator(url, directory=directory).up(log=lambda _msg: None)
    assert f"{EDITED_ID}.sql differs" in str(by_manifest.value)

    # … and, once someone "fixes" the manifest, by the checksum recorded in the ledger.
    migrations.rewrite_manifest(directory)
    with pytest.raises(MigrationError, match="refusing to migrate") as by_ledger:
        Migrator(url, directory=directory).up(log=lambda _msg: None)
    assert f"{EDITED_ID}: edited" in str(by_ledger.value)
    assert "immutable" in str(by_ledger.value)
    assert migrations.ledger(url) == ledger_before

    problems = await _readiness_problems(url, directory)
    assert problems, "readiness must fail for an edited migration"
    assert any(p.startswith(f"migration {EDITED_ID} is edited") for p in problems), problems


async def test_a_missing_applied_migration_is_detected(
    applied: tuple[DatabaseUrl, Path],
) -> None:
    url, directory = applied
    removed = "0002_idempotency_keys"  # a hole in the sequence, not a newer version
    (directory / f"{removed}.sql").unlink()
    ledger_before = migrations.ledger(url)

    statuses = _statuses(url, directory)
    assert statuses.pop(removed) is Status.MISSING
    assert set(statuses.values()) == {Status.APPLIED}

    with pytest.raises(MigrationError, match="checksum manifest") as by_manifest:
        Migrator(url, directory=directory).up(log=lambda _msg: None)
    assert f"{removed}.sql is in {migrator.MANIFEST} but missing" in str(by_manifest.value)

    migrations.rewrite_manifest(directory)
    with pytest.raises(MigrationError, match=f"{removed}: missing"):
        Migrator(url, directory=directory).up(log=lambda _msg: None)
    assert migrations.ledger(url) == ledger_before

    problems = await _readiness_problems(url, directory)
    assert any(p.startswith(f"migration {removed} is missing") for p in problems), problems


async def test_migrations_of_a_newer_version_keep_an_older_process_ready(
    applied: tuple[DatabaseUrl, Path],
) -> None:
    """Rolling upgrade: a newer version applied 0099 (expand); this older code stays ready,
    `up` has nothing to do, and `status` reports it as ahead without failing."""
    url, directory = applied
    newer = directory.parent / "newer"
    shutil.copytree(directory, newer)
    (newer / "0099_newer_expand.sql").write_text(
        "-- depends: 0003_events_and_audit\n-- transactional: false\n\n"
        "CREATE TABLE orbit_newer (id BINARY(16) NOT NULL PRIMARY KEY COMMENT '新版本的表')"
        " COMMENT='新版本的表';\n"
    )
    migrations.rewrite_manifest(newer)
    Migrator(url, directory=newer).up(log=lambda _msg: None)

    statuses = _statuses(url, directory)
    assert statuses.pop("0099_newer_expand") is Status.AHEAD
    assert set(statuses.values()) == {Status.APPLIED}
    assert Migrator(url, directory=directory).up(log=lambda _msg: None) == []
    assert await _readiness_problems(url, directory) == ()

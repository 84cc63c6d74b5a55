"""Fixtures for the schema gate: a fresh install, and scratch databases to break on purpose."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orbit_common.db.pool import DatabaseUrl
from tests.support import migrations


@pytest.fixture(scope="session")
def fresh_install() -> Iterator[DatabaseUrl]:
    """A new database migrated with the Migrator from the shipped files. Read it, don't change
    its schema (tests that break the schema take a ``scratch`` database)."""
    with migrations.scratch_databases() as scratch:
        yield scratch.create(migrate=True)


@pytest.fixture
def scratch() -> Iterator[migrations.ScratchDatabases]:
    """Scratch databases for this test, dropped when it ends."""
    with migrations.scratch_databases() as databases:
        yield databases

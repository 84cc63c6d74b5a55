"""Fixtures the fault tests share: a private database server the test may kill."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import orbit_devdb as devdb


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[Path]:
    """A private MariaDB instance of the test's own (``orbit_devdb``), stopped afterwards."""
    root = tmp_path / "mysql"
    devdb.start(root)
    try:
        yield root
    finally:
        devdb.stop(root)

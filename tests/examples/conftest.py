"""Fixtures for examples/result-inbox: its own scratch database (its schema.sql, not Orbit's
migrations) on the test server, and the example importable as ``result_inbox``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from orbit_common.db.pool import DatabaseUrl
from tests.support import database

# The example is an independent module, not a package of this repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "result-inbox"))

from result_inbox import database as inbox_database


@pytest.fixture(scope="session")
def inbox_url(server_url: DatabaseUrl) -> Iterator[str]:
    """A database holding only the receiver's two tables, created by the example itself."""
    name = database.scratch_name("receiver")
    url = database.create_database(server_url, name, migrate=False)
    rendered = url.render(hide_password=False)
    asyncio.run(inbox_database.init_db(rendered))
    yield rendered
    database.drop_database(server_url, name)


@pytest.fixture
async def pool(inbox_url: str) -> AsyncIterator[Any]:
    pool = await inbox_database.open_pool(inbox_url)
    try:
        yield pool
    finally:
        pool.close()
        await pool.wait_closed()

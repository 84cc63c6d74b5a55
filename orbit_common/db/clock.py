"""The database clock: every due, lease and expiry decision reads time here, never locally."""

from __future__ import annotations

import datetime as dt
from typing import Any

UTC = dt.UTC


def as_utc(value: dt.datetime) -> dt.datetime:
    """Attach UTC to a naive DATETIME(6) read from a session whose time zone is +00:00."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def to_db(value: dt.datetime) -> dt.datetime:
    """Convert an aware datetime to the naive UTC value a DATETIME(6) column stores."""
    if value.tzinfo is None:
        raise ValueError("naive datetimes are not allowed; pass an aware UTC datetime")
    return value.astimezone(UTC).replace(tzinfo=None)


async def db_now(cur: Any) -> dt.datetime:
    """The database's current UTC time with microseconds (``UTC_TIMESTAMP(6)``)."""
    await cur.execute("SELECT UTC_TIMESTAMP(6) AS now")
    row = await cur.fetchone()
    return as_utc(row["now"])

"""The scheduler daemon's transactions, by name (``orbit_scheduler`` only loops and sleeps).

:func:`fire` runs one firing step (:func:`schedules.fire_due`: due schedules locked with SKIP
LOCKED, their ledger rows, tasks and progress) in one transaction; :func:`next_check` reads when
the earliest ACTIVE schedule is next due and how many are due now.
"""

from __future__ import annotations

from typing import Any

import attrs

from orbit_common.db.clock import as_utc, db_now
from orbit_common.db.pool import Database
from orbit_common.pulse import schedules

NEXT_CHECK = """
SELECT MIN(check_at) AS next_check, SUM(check_at <= UTC_TIMESTAMP(6)) AS due
FROM pulse_schedules FORCE INDEX (ix_schedules_check) WHERE state = 'ACTIVE'
"""


async def fire(db: Database, batch: int) -> schedules.FireStats:
    """One firing step over up to ``batch`` due schedules."""
    return await db.transaction("schedules.fire", lambda cur: schedules.fire_due(cur, batch))


@attrs.frozen
class NextCheck:
    """When the next ACTIVE schedule is due (seconds from now, database time; ``None``: no
    ACTIVE schedule) and how many are due already."""

    in_seconds: float | None
    due: int


async def next_check(db: Database) -> NextCheck:
    async def body(cur: Any) -> NextCheck:
        await cur.execute(NEXT_CHECK)
        row = await cur.fetchone()
        due = int(row["due"] or 0)
        if row["next_check"] is None:
            return NextCheck(in_seconds=None, due=due)
        now = await db_now(cur)
        return NextCheck(in_seconds=(as_utc(row["next_check"]) - now).total_seconds(), due=due)

    return await db.read("schedules.next_check", body)

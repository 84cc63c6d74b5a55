"""Batched statements with per-row values, portable to MySQL 8.4 and MariaDB 10.11.

Neither ``VALUES ROW(...)`` (MySQL) nor ``VALUES (...)`` as a table (MariaDB) is portable, so a
batch of per-row values is a derived table of ``SELECT … UNION ALL SELECT …``, joined to the
target table in one ``UPDATE``. Only placeholders are generated; every value is a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def values_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """``(SELECT %s AS c1, … UNION ALL SELECT %s, …)`` and its flattened parameters.

    ``columns`` are identifiers written by the caller (never user input).
    """
    if not rows:
        raise ValueError("values_table needs at least one row")
    width = len(columns)
    first = "SELECT " + ", ".join(f"%s AS {name}" for name in columns)
    rest = " UNION ALL SELECT " + ", ".join(["%s"] * width)
    params: list[Any] = []
    for row in rows:
        if len(row) != width:
            raise ValueError("every row needs one value per column")
        params.extend(row)
    return "(" + first + rest * (len(rows) - 1) + ")", params


def placeholders(count: int) -> str:
    """``%s, %s, …`` for an ``IN (…)`` list of ``count`` parameters."""
    if count < 1:
        raise ValueError("an IN list needs at least one value")
    return ", ".join(["%s"] * count)


def multi_insert(
    prefix: str, template: str, rows: Sequence[Sequence[Any]]
) -> tuple[str, list[Any]]:
    """``prefix VALUES template, template, …`` with its flattened parameters.

    ``template`` is one row, e.g. ``(%s, %s, UTC_TIMESTAMP(6))``: placeholders for values and
    fixed SQL expressions where every row shares them.
    """
    if not rows:
        raise ValueError("multi_insert needs at least one row")
    width = template.count("%s")
    params: list[Any] = []
    for row in rows:
        if len(row) != width:
            raise ValueError("every row needs one value per placeholder")
        params.extend(row)
    return prefix + " VALUES " + ", ".join([template] * len(rows)), params

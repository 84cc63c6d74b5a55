"""Opaque list cursors bound to the filter that produced them.

A cursor is base64url(JSON) holding a version, a short digest of the normalised filter and the
keyset position. Reusing a cursor with a different filter, or a cursor that does not decode,
is ``400 invalid_cursor``. A cursor is not an authorization fact: every page re-checks access.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.model import digests, ids, jsondoc

VERSION = 1
# The DATETIME range: a position outside it is clamped to it.
TIME_MIN = dt.datetime(1000, 1, 1, tzinfo=dt.UTC)
TIME_MAX = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)


@attrs.frozen(kw_only=True)
class Page:
    """One page of a keyset-paginated list; ``next_cursor`` is None after the last page."""

    items: list[dict[str, Any]]
    next_cursor: str | None


def clamp(value: dt.datetime) -> dt.datetime:
    return min(max(value, TIME_MIN), TIME_MAX)


def time_position(position: list[Any]) -> tuple[dt.datetime, bytes]:
    """A ``[time, id]`` keyset position (ISO 8601 with a zone, lower-case hex id), the time
    clamped to the DATETIME range; InvalidCursor when it is anything else."""
    if len(position) != 2 or not all(isinstance(p, str) for p in position):
        raise errors.InvalidCursor()
    try:
        at = dt.datetime.fromisoformat(position[0])
        row_id = ids.from_hex(position[1])
    except ValueError as exc:
        raise errors.InvalidCursor() from exc
    if at.tzinfo is None:
        raise errors.InvalidCursor()
    try:
        return clamp(at.astimezone(dt.UTC)), row_id
    except OverflowError as exc:
        raise errors.InvalidCursor() from exc


def filter_digest(kind: str, filters: dict[str, Any]) -> str:
    return digests.domain_digest("orbit.cursor.v1", kind.encode(), jsondoc.canonical(filters))[
        :12
    ].hex()


def encode(kind: str, filters: dict[str, Any], position: list[Any]) -> str:
    doc = {"v": VERSION, "f": filter_digest(kind, filters), "p": position}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str, kind: str, filters: dict[str, Any]) -> list[Any]:
    """The keyset position in ``cursor``; raises InvalidCursor when it does not fit."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        doc = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: a forged cursor of nested arrays fits in a request line.
        raise errors.InvalidCursor() from exc
    if (
        not isinstance(doc, dict)
        or doc.get("v") != VERSION
        or not isinstance(doc.get("p"), list)
    ):
        raise errors.InvalidCursor()
    if doc.get("f") != filter_digest(kind, filters):
        raise errors.InvalidCursor("the cursor belongs to a query with other filters")
    return list(doc["p"])

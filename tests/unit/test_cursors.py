"""orbit_common.model.cursors: opaque cursors bound to the query that produced them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.model import cursors


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_round_trip() -> None:
    cursor = cursors.encode("namespaces", {"state": "ACTIVE"}, ["team-a", 17])
    assert cursors.decode(cursor, "namespaces", {"state": "ACTIVE"}) == ["team-a", 17]


def test_a_cursor_is_url_safe_and_unpadded() -> None:
    cursor = cursors.encode("namespaces", {}, ["a/b+c?d=e&f"])
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_filter_key_order_does_not_matter() -> None:
    cursor = cursors.encode("tasks", {"a": 1, "b": [2, 3]}, ["x"])
    assert cursors.decode(cursor, "tasks", {"b": [2, 3], "a": 1}) == ["x"]


@pytest.mark.parametrize(
    ("kind", "filters"),
    [
        ("namespaces", {"state": "DISABLED"}),
        ("namespaces", {}),
        ("namespaces", {"state": "ACTIVE", "extra": None}),
        ("other", {"state": "ACTIVE"}),
    ],
)
def test_a_cursor_with_another_filter_or_kind_is_invalid(
    kind: str, filters: dict[str, Any]
) -> None:
    cursor = cursors.encode("namespaces", {"state": "ACTIVE"}, ["team-a"])
    with pytest.raises(errors.InvalidCursor, match="other filters"):
        cursors.decode(cursor, kind, filters)


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",
        "a",
        "====",
        "é",
        "abc\x00def",
        "\udcff",
        _b64(b"not json"),
        _b64(b"\xff\xfe\xfd"),
        _b64(b"[1, 2]"),
        _b64(b"null"),
        _b64(b'{"v": 1, "p": ["x"]}'),  # no filter digest
        _b64(b'{"v": 2, "f": "x", "p": ["x"]}'),
        _b64(b'{"v": 1, "f": "x", "p": "x"}'),
        _b64(b"[" * 5000 + b"]" * 5000),  # deeper than Python's recursion limit
    ],
)
def test_garbage_is_an_invalid_cursor(cursor: str) -> None:
    with pytest.raises(errors.InvalidCursor) as caught:
        cursors.decode(cursor, "namespaces", {})
    assert caught.value.status == 400
    assert caught.value.code == "invalid_cursor"


def test_a_forged_version_is_refused_even_with_the_right_digest() -> None:
    digest = cursors.filter_digest("namespaces", {})
    forged = _b64(json.dumps({"v": 99, "f": digest, "p": ["x"]}).encode())
    with pytest.raises(errors.InvalidCursor):
        cursors.decode(forged, "namespaces", {})
    genuine = _b64(json.dumps({"v": cursors.VERSION, "f": digest, "p": ["x"]}).encode())
    assert cursors.decode(genuine, "namespaces", {}) == ["x"]


_positions = st.lists(st.none() | st.booleans() | st.integers() | st.text(max_size=30), max_size=4)
_filters = st.dictionaries(st.text(max_size=8), st.text(max_size=8) | st.integers(), max_size=4)


@given(kind=st.text(min_size=1, max_size=12), filters=_filters, position=_positions)
def test_round_trip_property(kind: str, filters: dict[str, Any], position: list[Any]) -> None:
    assert cursors.decode(cursors.encode(kind, filters, position), kind, filters) == position

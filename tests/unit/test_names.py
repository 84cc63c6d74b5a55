"""orbit_common.model.names: names of applications, namespaces and credentials."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common.model import names


@pytest.mark.parametrize(
    "name", ["a", "0", "a1", "team-a", "a.b", "a_b", "a-b.c_d9", "a" * names.NAME_MAX, "1-2"]
)
def test_valid_names(name: str) -> None:
    assert names.is_valid_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "A",
        "Team",
        "-a",
        "a-",
        ".a",
        "a.",
        "_a",
        "a_",
        "a b",
        "a/b",
        "a*",
        "é",
        "a\n",
        "\na",
        "a" * (names.NAME_MAX + 1),
        "ａ",  # full-width
    ],
)
def test_invalid_names(name: str) -> None:
    assert not names.is_valid_name(name)


@pytest.mark.parametrize("value", [None, 1, b"a", ["a"]])
def test_non_strings_are_not_names(value: Any) -> None:
    assert not names.is_valid_name(value)


@given(st.from_regex(r"\A[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z"))
def test_every_name_of_the_documented_shape_is_valid(name: str) -> None:
    assert names.is_valid_name(name)
    assert 1 <= len(name) <= names.NAME_MAX

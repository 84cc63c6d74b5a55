"""orbit_common.model.ids: 128-bit identifiers, BINARY(16) inside and 32 hex characters outside."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common.model import ids


def test_new_ids_are_16_random_bytes() -> None:
    seen = {ids.new_id() for _ in range(1000)}
    assert len(seen) == 1000
    assert all(len(i) == ids.ID_BYTES == 16 for i in seen)


@given(st.binary(min_size=16, max_size=16))
def test_hex_round_trip(raw: bytes) -> None:
    text = ids.to_hex(raw)
    assert len(text) == 32
    assert text == text.lower()
    assert ids.from_hex(text) == raw


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0" * 31,
        "0" * 33,
        "0" * 64,
        "A" * 32,
        "0123456789ABCDEF0123456789abcdef",
        "g" * 32,
        " " + "0" * 31,
        "0" * 32 + "\n",
        "0" * 31 + "\n",
        "0x" + "0" * 30,
        "٠" * 32,  # Arabic-Indic zeros are digits to Python, not hex to us
        "０" * 32,  # full-width zeros
    ],
)
def test_from_hex_refuses_anything_but_32_lowercase_hex_characters(text: str) -> None:
    with pytest.raises(ValueError, match="32 lowercase"):
        ids.from_hex(text)


@pytest.mark.parametrize("value", [None, 123, b"0" * 32])
def test_from_hex_refuses_non_strings(value: Any) -> None:
    with pytest.raises(ValueError):
        ids.from_hex(value)


@pytest.mark.parametrize("value", [b"", bytes(15), bytes(17), bytes(32), "0" * 16, bytearray(16)])
def test_check_id_refuses_anything_but_16_bytes(value: Any) -> None:
    # MySQL pads a short BINARY(16) value with zero bytes: it must never reach a query.
    with pytest.raises(ValueError, match="exactly 16 bytes"):
        ids.check_id(value)
    with pytest.raises(ValueError):
        ids.to_hex(value)


def test_check_id_returns_its_argument() -> None:
    value = ids.new_id()
    assert ids.check_id(value) is value

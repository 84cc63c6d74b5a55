"""128-bit random identifiers: BINARY(16) inside, 32 lowercase hex characters outside."""

from __future__ import annotations

import re
import secrets

ID_BYTES = 16
_HEX_ID = re.compile(r"\A[0-9a-f]{32}\Z")


def new_id() -> bytes:
    """A fresh id from the operating system's CSPRNG."""
    return secrets.token_bytes(ID_BYTES)


def to_hex(value: bytes) -> str:
    check_id(value)
    return value.hex()


def from_hex(text: str) -> bytes:
    """Parse a public id; raises ValueError for anything but 32 lowercase hex characters."""
    if not isinstance(text, str) or not _HEX_ID.match(text):
        raise ValueError("an id is 32 lowercase hexadecimal characters")
    return bytes.fromhex(text)


def check_id(value: bytes) -> bytes:
    """Refuse a value that is not exactly 16 bytes: MySQL would silently pad a short one."""
    if not isinstance(value, bytes) or len(value) != ID_BYTES:
        raise ValueError(f"an id is exactly {ID_BYTES} bytes")
    return value

"""Names of applications, namespaces, credentials and (later) queues."""

from __future__ import annotations

import re
from typing import Any

NAME_MAX = 64
_NAME = re.compile(r"\A[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z")
NAME_RULE = (
    "1-64 characters: lowercase letters, digits, '.', '_' or '-', "
    "starting and ending with a letter or digit"
)


def is_valid_name(value: str) -> bool:
    return isinstance(value, str) and bool(_NAME.match(value))


def found(row: Any, column: str, name: str) -> bool:
    """Whether a row looked up by name really has that name. The name columns use a PAD SPACE
    collation (``utf8mb4_bin``: ``'a-ns '`` equals ``'a-ns'``), so every lookup of a name from
    a path or a body compares the stored name exactly, byte for byte, before using the row."""
    return row is not None and row[column] == name

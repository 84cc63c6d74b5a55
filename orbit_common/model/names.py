"""Names of applications, namespaces, credentials and (later) queues."""

from __future__ import annotations

import re

NAME_MAX = 64
_NAME = re.compile(r"\A[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z")
NAME_RULE = (
    "1-64 characters: lowercase letters, digits, '.', '_' or '-', "
    "starting and ending with a letter or digit"
)


def is_valid_name(value: str) -> bool:
    return isinstance(value, str) and bool(_NAME.match(value))

"""Reading one member of a JSON object the server answered, by the type it must have: a member
that is missing or of another type reads as the empty value (the DTOs never raise on a field a
newer server added or an older one left out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def string(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def integer(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def boolean(raw: Mapping[str, Any], key: str) -> bool:
    return raw.get(key) is True


def mapping(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def objects(raw: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = raw.get(key)
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []

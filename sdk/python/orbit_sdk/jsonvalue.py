"""JSON values that keep their numbers byte-exact.

Orbit stores a task's input and result as the JSON text it received, so a number such as
``12345678901234567890.123456789`` comes back unchanged. Python's ``float`` would round it; to
send such a value, either wrap JSON text in :class:`RawJson` (sent exactly as written) or use
:class:`decimal.Decimal` (sent as its ``str``). To read numbers exactly, construct the client or
worker with ``exact_numbers=True``: fractional numbers then arrive as ``Decimal``.
"""

from __future__ import annotations

import decimal
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["RawJson", "dumps", "loads"]


@attrs.frozen
class RawJson:
    """JSON text sent as it is: ``RawJson('{"amount": 12345678901234567890.123456789}')``.

    The text is checked once (it must be one valid JSON value); it is never re-encoded.
    """

    text: str

    def __attrs_post_init__(self) -> None:
        try:
            json.loads(self.text, parse_float=decimal.Decimal, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise ValueError(f"RawJson needs one valid JSON value: {exc}") from exc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def dumps(value: Any) -> str:
    """Compact JSON for ``value``; :class:`RawJson` and ``Decimal`` leaves keep their text.

    Raw fragments are substituted for unique placeholder strings after encoding, so they are
    never parsed or re-encoded (``json`` has no hook to emit raw text).
    """
    raws: dict[str, str] = {}
    prefix = f"\x00orbit-raw-{uuid.uuid4().hex}-"

    def substitute(item: Any) -> Any:
        if isinstance(item, RawJson):
            key = f"{prefix}{len(raws)}"
            raws[key] = item.text
            return key
        if isinstance(item, decimal.Decimal):
            if not item.is_finite():
                raise ValueError(f"{item} is not a JSON number")
            return substitute(RawJson(str(item)))
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{item} is not a JSON number")
        if isinstance(item, Mapping):
            out: dict[str, Any] = {}
            for key, val in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"JSON object keys are strings, not {type(key).__name__}")
                out[key] = substitute(val)
            return out
        if isinstance(item, list | tuple):
            return [substitute(v) for v in item]
        return item

    text = json.dumps(substitute(value), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    for key, raw in raws.items():
        text = text.replace(json.dumps(key, ensure_ascii=False), raw, 1)
    return text


def loads(data: str | bytes, *, exact_numbers: bool = False) -> Any:
    """Parse JSON; with ``exact_numbers`` fractional numbers become ``Decimal``."""
    if exact_numbers:
        return json.loads(data, parse_float=decimal.Decimal)
    return json.loads(data)

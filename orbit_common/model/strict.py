"""A strict cattrs converter for request bodies and documents.

Unlike cattrs' defaults it never coerces: ``1`` is not a string, ``"1"`` is not an int and
``1`` is not a bool. Unknown fields are refused. Validation errors carry the JSON path of every
offending field (``$.grants[0].actions``), ready for a problem document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    is_mutable_sequence,
    is_sequence,
    list_structure_factory,
)

from orbit_common import errors

T = TypeVar("T")


def _str(value: Any, _type: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _int(value: Any, _type: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("expected an integer")
    return value


def _bool(value: Any, _type: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


Hook = Callable[[Any, Any], Any]


def _only(
    json_type: type, make: Callable[[Any, cattrs.Converter], Hook]
) -> Callable[[Any, cattrs.Converter], Hook]:
    """Wrap a hook factory so the value must already be ``json_type``.

    cattrs structures any iterable into a list (``"abc"`` -> ``["a", "b", "c"]``, an object ->
    its keys) and tries any value as an attrs class; a JSON document has only lists and dicts.
    """

    def factory(type_: Any, converter: cattrs.Converter) -> Hook:
        inner = make(type_, converter)

        def hook(value: Any, type_: Any) -> Any:
            if not isinstance(value, json_type):
                raise TypeError(f"expected a JSON {'array' if json_type is list else 'object'}")
            return inner(value, type_)

        return hook

    return factory


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(str, _str)
    converter.register_structure_hook(int, _int)
    converter.register_structure_hook(bool, _bool)
    converter.register_structure_hook(Any, lambda value, _type: value)
    # Registered later = consulted first: lists before other sequences, as cattrs itself does.
    converter.register_structure_hook_factory(
        is_sequence, _only(list, homogenous_tuple_structure_factory)
    )
    converter.register_structure_hook_factory(
        is_mutable_sequence, _only(list, list_structure_factory)
    )
    converter.register_structure_hook_factory(
        attrs.has, _only(dict, lambda cls, conv: conv.gen_structure_attrs_fromdict(cls))
    )
    return converter


CONVERTER = make_converter()


def _split(message: str) -> dict[str, str]:
    text, _, path = message.rpartition(" @ ")
    return {"path": path or "$", "message": text or message}


def structure(data: Any, cls: type[T]) -> T:
    """Structure ``data`` into ``cls`` or raise :class:`errors.ValidationFailed`."""
    if not isinstance(data, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "expected a JSON object"}])
    try:
        return CONVERTER.structure(data, cls)
    except cattrs.BaseValidationError as exc:
        found = [_split(m) for m in cattrs.transform_error(exc, path="$")]
        raise errors.ValidationFailed(found) from exc

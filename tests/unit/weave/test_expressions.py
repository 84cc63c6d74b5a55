"""Evaluating workflow expressions: JSON in, JSON out, every failure an ExpressionError, numbers
converted by the declared schema."""

from __future__ import annotations

import decimal
from typing import Any

import pytest

from orbit_common.weave import expressions, types


def evaluate(source: str, value: Any = None) -> Any:
    return expressions.evaluate(source, {"input": value or {}, "steps": {}})


def test_a_map_expression_builds_a_json_object() -> None:
    assert evaluate("{'id': input.id, 'n': input.n * 2, 'tags': [input.id, 'x'], 'f': 1.5}",
                    {"id": "a", "n": 3}) == {"id": "a", "n": 6, "tags": ["a", "x"], "f": 1.5}
    assert evaluate("null") is None


@pytest.mark.parametrize(("source", "value", "fragment"), [
    ("input.missing", {}, "Key not found"),
    ("1 / 0", {}, "divide by zero"),
    ("9223372036854775807 + 1", {}, "overflow"),
    ("{1: 'a'}", {}, "map key is not a string"),
    ("b'x'", {}, "not JSON"),
    ("duration('1s')", {}, "not JSON"),
    ("input.x", {"x": 2**70}, "out of range"),
    ("input.x", {"x": object()}, "Non-CEL value"),
])
def test_every_failure_is_an_expression_error(source: str, value: Any, fragment: str) -> None:
    with pytest.raises(expressions.ExpressionError) as caught:
        evaluate(source, value)
    assert fragment in caught.value.message


def test_numbers_follow_the_declared_schema() -> None:
    schema = types.Schema(type="object", properties=(
        ("price", types.Schema(type="number")), ("qty", types.Schema(type="integer")),
        ("free", types.ANY)))
    value = types.cel_input(schema, {"price": 3, "qty": decimal.Decimal("2.0"),
                                     "free": [1, decimal.Decimal("1.5")]})
    assert value == {"price": 3.0, "qty": 2, "free": [1, 1.5]}
    assert type(value["price"]) is float
    assert type(value["qty"]) is int
    # A double times a double: the checked expression `input.price * 2.0` evaluates.
    assert evaluate("input.price * 2.0 + double(input.qty)", value) == 8.0


def test_a_syntax_error_names_its_line_and_column() -> None:
    with pytest.raises(expressions.ExpressionError) as caught:
        evaluate("input.a +")
    assert caught.value.message.startswith("expression:1:")

"""orbit_common.model.strict: a cattrs converter that never coerces and reports JSON paths."""

from __future__ import annotations

import decimal
from typing import Any

import attrs
import pytest

from orbit_common import errors
from orbit_common.model import jsondoc, strict


@attrs.frozen(kw_only=True)
class GrantDto:
    namespaces: list[str]
    actions: list[str]


@attrs.frozen(kw_only=True)
class Body:
    name: str
    count: int = 0
    enabled: bool = False
    grants: list[GrantDto] = attrs.field(factory=list)
    tags: tuple[str, ...] = ()
    meta: Any = None


def _errors(data: Any) -> list[dict[str, str]]:
    with pytest.raises(errors.ValidationFailed) as caught:
        strict.structure(data, Body)
    assert caught.value.code == "validation_failed"
    assert caught.value.status == 400
    assert caught.value.errors
    first = caught.value.errors[0]
    assert caught.value.detail == f"{first['path']}: {first['message']}"
    return caught.value.errors


def test_a_valid_document_is_structured() -> None:
    data = jsondoc.loads_strict(
        '{"name": "x", "count": 3, "enabled": true, "tags": ["a"],'
        ' "grants": [{"namespaces": ["n"], "actions": ["a"]}], "meta": {"k": 1.5}}'
    )
    assert strict.structure(data, Body) == Body(
        name="x",
        count=3,
        enabled=True,
        tags=("a",),
        grants=[GrantDto(namespaces=["n"], actions=["a"])],
        meta={"k": decimal.Decimal("1.5")},
    )


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"name": 1}, "$.name"),
        ({"name": None}, "$.name"),
        ({"name": True}, "$.name"),
        ({"name": ["x"]}, "$.name"),
        ({"name": "x", "count": "1"}, "$.count"),
        ({"name": "x", "count": True}, "$.count"),
        ({"name": "x", "count": False}, "$.count"),
        ({"name": "x", "count": 1.0}, "$.count"),
        ({"name": "x", "count": decimal.Decimal("1")}, "$.count"),
        ({"name": "x", "count": None}, "$.count"),
        ({"name": "x", "enabled": 1}, "$.enabled"),
        ({"name": "x", "enabled": 0}, "$.enabled"),
        ({"name": "x", "enabled": "true"}, "$.enabled"),
        ({"name": "x", "tags": [1]}, "$.tags[0]"),
        ({"name": "x", "tags": ["a", None]}, "$.tags[1]"),
    ],
)
def test_nothing_is_coerced(data: dict[str, Any], path: str) -> None:
    found = _errors(data)
    assert [e["path"] for e in found] == [path]
    assert found[0]["message"].startswith("invalid value for type, expected")


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"name": "x", "tags": "abc"}, "$.tags"),
        ({"name": "x", "tags": {"a": 1}}, "$.tags"),
        ({"name": "x", "grants": "abc"}, "$.grants"),
        ({"name": "x", "grants": {"namespaces": ["n"], "actions": ["a"]}}, "$.grants"),
        (
            {"name": "x", "grants": [{"namespaces": "n", "actions": ["a"]}]},
            "$.grants[0].namespaces",
        ),
        ({"name": "x", "grants": ["n"]}, "$.grants[0]"),
        ({"name": "x", "grants": [None]}, "$.grants[0]"),
    ],
)
def test_a_string_or_an_object_is_not_a_list(data: dict[str, Any], path: str) -> None:
    # cattrs would iterate "abc" into ["a", "b", "c"] or a dict into its keys.
    assert [e["path"] for e in _errors(data)] == [path]


def test_unknown_fields_are_refused_with_the_path_of_their_object() -> None:
    found = _errors({"name": "x", "bogus": 1})
    assert found == [{"path": "$", "message": "extra fields found (bogus)"}]


def test_nested_errors_carry_the_full_path() -> None:
    found = _errors(
        {
            "name": "x",
            "grants": [
                {"namespaces": ["n"], "actions": ["a"]},
                {"namespaces": ["n"], "actions": ["a", 7]},
                {"namespaces": ["n"], "actions": ["a"], "queues": ["q"]},
            ],
        }
    )
    expected = {"path": "$.grants[1].actions[1]", "message": "invalid value for type, expected str"}
    assert expected in found
    assert {"path": "$.grants[2]", "message": "extra fields found (queues)"} in found


def test_an_unknown_field_in_a_nested_object_names_that_object() -> None:
    found = _errors({"name": "x", "grants": [{"namespaces": ["n"], "actions": ["a"], "zz": 1}]})
    assert found == [{"path": "$.grants[0]", "message": "extra fields found (zz)"}]


def test_every_problem_is_reported_not_only_the_first() -> None:
    found = _errors({"name": 1, "count": "2", "enabled": None})
    assert sorted(e["path"] for e in found) == ["$.count", "$.enabled", "$.name"]


def test_a_missing_required_field_is_named() -> None:
    assert _errors({}) == [{"path": "$.name", "message": "required field missing"}]


@pytest.mark.parametrize("data", [[], [{"name": "x"}], "x", 1, None, True])
def test_the_top_level_must_be_an_object(data: Any) -> None:
    assert _errors(data) == [{"path": "$", "message": "expected a JSON object"}]


def test_any_fields_take_the_value_as_is() -> None:
    value = {"deep": [1, "two", None, {"three": decimal.Decimal("3.0")}]}
    assert strict.structure({"name": "x", "meta": value}, Body).meta == value

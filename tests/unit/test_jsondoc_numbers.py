"""orbit_common.model.jsondoc with ``keep_number_text``: every number token comes back verbatim."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.model import jsondoc
from orbit_common.model.jsondoc import JsonNumber

# The JSON number grammar (RFC 8259 §6), as a generator of tokens.
NUMBER_TOKEN = r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][-+]?[0-9]{1,6})?"
number_tokens = st.from_regex(NUMBER_TOKEN, fullmatch=True)


def keep(text: str | bytes) -> Any:
    return jsondoc.loads_strict(text, keep_number_text=True)


@pytest.mark.parametrize(
    "token",
    [
        "12345678901234567890.123456789",
        "1e5",
        "1E+5",
        "1e-5",
        "-0",
        "-0.0",
        "0.0000001",
        "1.000",
        "0",
        "-1",
        "1" * 5000,  # no conversion happens, so Python's digit limit does not apply
        "1.5e99999999999999999999999",
    ],
)
def test_each_spelling_comes_back_unchanged(token: str) -> None:
    value = keep(token)
    assert isinstance(value, JsonNumber)
    assert value == token
    assert jsondoc.dumps(value) == token
    assert jsondoc.dumps(keep(f'{{"n":[{token}]}}')) == f'{{"n":[{token}]}}'


def test_whitespace_is_normalised_and_strings_and_key_order_kept() -> None:
    text = '{ "b" : [ 1.10 , -0 ] ,\n "a" : "x\\u00e9\\n" , "c": {"z": 1E+2, "y": null} }'
    assert jsondoc.dumps(keep(text)) == '{"b":[1.10,-0],"a":"xé\\n","c":{"z":1E+2,"y":null}}'


def test_canonical_writes_the_tokens_too() -> None:
    assert jsondoc.canonical(keep('{"b": 1.0, "a": 1e0}')) == b'{"a":1e0,"b":1.0}'
    # So two spellings of one value are two different requests (their stored bytes differ).
    assert jsondoc.canonical(keep("1.0")) != jsondoc.canonical(keep("1"))


def test_without_the_flag_nothing_changes() -> None:
    assert jsondoc.dumps(jsondoc.loads_strict("[-0, 1e5]")) == "[0,1E+5]"
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict("1" * 5000)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"a": 1, "a": 1}', errors.DuplicateJsonKey),
        ("[NaN]", errors.MalformedJson),
        ("[-Infinity]", errors.MalformedJson),
        ("[01]", errors.MalformedJson),
        ("[1.]", errors.MalformedJson),
        ("[.5]", errors.MalformedJson),
        ("[+1]", errors.MalformedJson),
        ('"\\ud800"', errors.MalformedJson),
        ("[" * 40 + "]" * 40, errors.JsonTooDeep),
    ],
)
def test_the_mode_is_as_strict_as_the_normal_one(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        keep(text)


def test_a_kept_number_is_not_a_json_string() -> None:
    value = keep('[1, "1"]')
    assert type(value[0]) is JsonNumber
    assert type(value[1]) is str
    assert jsondoc.dumps(value) == '[1,"1"]'
    assert repr(value[0]) == "JsonNumber('1')"


@given(number_tokens)
def test_every_number_token_round_trips(token: str) -> None:
    assert jsondoc.dumps(keep(token)) == token
    assert jsondoc.dumps(keep(token.encode())) == token


class Token(str):
    """A number token in a generated tree (rendered bare, not as a string)."""


_keys = st.text(max_size=6)
trees = st.recursive(
    number_tokens.map(Token) | st.none() | st.booleans() | _keys,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


def render(tree: Any, space: str = "") -> str:
    """The tree as JSON text, with ``space`` around every structural character."""
    if isinstance(tree, Token):
        return str(tree)
    if isinstance(tree, list):
        return "[" + space + f"{space},{space}".join(render(v, space) for v in tree) + space + "]"
    if isinstance(tree, dict):
        items = (json.dumps(k, ensure_ascii=False) + space + ":" + space + render(v, space)
                 for k, v in tree.items())
        return "{" + space + f"{space},{space}".join(items) + space + "}"
    return json.dumps(tree, ensure_ascii=False)


@given(trees)
def test_every_compact_document_round_trips_byte_exact(tree: Any) -> None:
    text = render(tree)
    assert jsondoc.dumps(keep(text)) == text
    assert json.loads(jsondoc.dumps(keep(text))) == json.loads(text)


@given(trees, st.sampled_from([" ", "\n", "\t ", "\r\n  "]))
def test_insignificant_whitespace_does_not_change_the_bytes(tree: Any, space: str) -> None:
    assert jsondoc.dumps(keep(render(tree, space))) == render(tree)


@pytest.mark.parametrize("token", ["1" * 5000, "1.5e99999999999999999999999"])
def test_checked_numbers_refuse_what_the_normal_parse_refuses(token: str) -> None:
    # One number-preserving parse of a request body stands in for the normal parse too.
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(token)
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(f'{{"n": [{token}]}}', keep_number_text=True, check_numbers=True)


def test_plain_numbers_are_what_the_normal_parse_makes() -> None:
    text = '{"a": [1, -0, 1.50, 1e5, {"b": 2E-3}], "c": "1"}'
    exact = jsondoc.loads_strict(text, keep_number_text=True, check_numbers=True)
    assert jsondoc.plain_numbers(exact) == jsondoc.loads_strict(text)
    assert [type(v) for v in jsondoc.plain_numbers(exact)["a"][:4]] == [int, int, type(
        jsondoc.loads_strict("1.5")), type(jsondoc.loads_strict("1.5"))]

"""orbit_common.model.jsondoc: strict parsing, exact numbers, canonical bytes."""

from __future__ import annotations

import decimal
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.model import jsondoc

# --- strictness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        '{"a": 1, "b": {"c": 1, "c": 1}}',
        '[{"x": [{"y": 1, "y": 2}]}]',
        '{"a": {"b": {"c": {"d": {"e": 1, "e": null}}}}}',
        # equal after unescaping: still the same key
        '{"a": 1, "\\u0061": 2}',
    ],
)
def test_duplicate_keys_are_refused_at_any_depth(text: str) -> None:
    with pytest.raises(errors.DuplicateJsonKey) as caught:
        jsondoc.loads_strict(text)
    assert caught.value.code == "duplicate_json_key"
    assert caught.value.status == 400


def test_the_same_key_in_sibling_objects_is_fine() -> None:
    assert jsondoc.loads_strict('[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_up_to_the_limit_is_accepted() -> None:
    assert jsondoc.loads_strict(_nested(jsondoc.MAX_DEPTH)) is not None
    mixed = '{"a":' * (jsondoc.MAX_DEPTH - 1) + "[]" + "}" * (jsondoc.MAX_DEPTH - 1)
    assert jsondoc.loads_strict(mixed) is not None


@pytest.mark.parametrize(
    "text",
    [
        _nested(jsondoc.MAX_DEPTH + 1),
        '{"a":' * jsondoc.MAX_DEPTH + "[]" + "}" * jsondoc.MAX_DEPTH,
        # far beyond Python's recursion limit: refused before the parser recurses
        _nested(100_000),
    ],
)
def test_nesting_beyond_the_limit_is_refused(text: str) -> None:
    with pytest.raises(errors.JsonTooDeep):
        jsondoc.loads_strict(text)


def test_brackets_inside_strings_do_not_count_towards_depth() -> None:
    text = json.dumps({"a": "[" * 100 + '\\"{{{' + "{" * 100})
    assert jsondoc.loads_strict(text) == json.loads(text)


@pytest.mark.parametrize("text", [
    "[" * 1_000_000,  # was a RecursionError out of the parser: it recursed before failing
    '{"a":' * 100_000,
    "[" * 10 + '"]]]]]]]]]]',  # an unterminated string hides the closing brackets
    "[[}]",
    "[]]",
])
def test_unbalanced_brackets_are_malformed_json_without_recursing(text: str) -> None:
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(text)


def test_max_containers_bounds_arrays_and_objects_before_parsing() -> None:
    text = json.dumps([[], {}, {"a": [1, "[[{{"]}])  # 5 containers; brackets in strings aside
    assert jsondoc.loads_strict(text, max_containers=5) == json.loads(text)
    with pytest.raises(errors.JsonTooComplex):
        jsondoc.loads_strict(text, max_containers=4)


def test_raw_json_is_spliced_verbatim() -> None:
    raw = jsondoc.RawJson('{"n": 1E+5, "s": "x"}')
    assert jsondoc.dumps({"result": raw, "a": None}) == '{"result":{"n": 1E+5, "s": "x"},"a":null}'


def test_max_depth_can_be_lowered() -> None:
    assert jsondoc.loads_strict("[[1]]", max_depth=2) == [[1]]
    with pytest.raises(errors.JsonTooDeep):
        jsondoc.loads_strict("[[[1]]]", max_depth=2)


@pytest.mark.parametrize("text", ["NaN", "[NaN]", '{"a": Infinity}', "-Infinity", "[1, -Infinity]"])
def test_nan_and_infinity_are_refused(text: str) -> None:
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(text)


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": "\xff"}',
        b'"\xc0\xaf"',  # overlong encoding of "/"
        b'"\xed\xa0\x80"',  # an encoded surrogate
        b'"\xe2\x82"',  # truncated sequence
    ],
)
def test_invalid_utf8_is_refused(data: bytes) -> None:
    with pytest.raises(errors.MalformedJson, match="UTF-8"):
        jsondoc.loads_strict(data)


@pytest.mark.parametrize("text", ['"\\ud800"', '{"a": ["x\\udfffy"]}', '{"\\udc00": 1}',
                                  '["\\uDBFF"]', '"\ud800"'])
def test_lone_surrogate_escapes_are_refused(text: str) -> None:
    # They decode to strings that cannot be encoded as UTF-8 (nor stored, nor digested).
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(text)


def test_numbers_keep_their_text_in_long_lists() -> None:
    numbers = [f"{n}.{n % 7}0" for n in range(2000)] * 3 + ["-0", "1E+5"]
    document = jsondoc.loads_strict("[" + ",".join(numbers) + "]", keep_number_text=True)
    assert document == numbers
    assert all(type(n) is jsondoc.JsonNumber for n in document)
    assert jsondoc.dumps(document) == "[" + ",".join(numbers) + "]"
    assert jsondoc.dumps({"a": document[:2]}) == '{"a":[0.00,1.10]}'


def test_a_surrogate_pair_escape_is_one_character() -> None:
    assert jsondoc.loads_strict('"\\ud83d\\ude00"') == "\U0001f600"


@pytest.mark.parametrize(
    "text", ["", "   ", "{", '{"a" 1}', "[1,]", "{'a': 1}", "01", "1 2", '"\\x"', "tru"]
)
def test_malformed_documents_are_refused(text: str) -> None:
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(text)


@pytest.mark.parametrize(
    "text", ["1" * 5000, "[-" + "9" * 5000 + "]", "1.5e99999999999999999999999"]
)
def test_numbers_python_cannot_hold_are_malformed_not_a_crash(text: str) -> None:
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(text)


def test_a_byte_order_mark_is_refused() -> None:
    with pytest.raises(errors.MalformedJson):
        jsondoc.loads_strict(b"\xef\xbb\xbf{}")


# --- exact numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "12345678901234567890.123456789",
        "[12345678901234567890123456789012345678901234567890]",
        '{"n":-0.000001234567890123456789}',
        '{"price":19.90,"qty":3,"big":98765432109876543210987654321.00}',
        "[1.0,1.00,0.1]",
    ],
)
def test_numbers_survive_loads_then_dumps_byte_exact(text: str) -> None:
    assert jsondoc.dumps(jsondoc.loads_strict(text)) == text


@pytest.mark.parametrize(
    ("text", "written"),
    [("1e5", "1E+5"), ("[1E-7]", "[1E-7]"), ("-0.0000001", "-1E-7"), ("2.5e+3", "2.5E+3")],
)
def test_exponents_and_tiny_decimals_keep_their_value_but_not_their_spelling(
    text: str, written: str
) -> None:
    # Decimal keeps every digit but writes its own exponent notation: the value is exact, the
    # bytes are not. Pinned so a change of this behaviour is a conscious one.
    value = jsondoc.loads_strict(text)
    assert jsondoc.dumps(value) == written
    assert jsondoc.loads_strict(written) == value


def test_decimals_are_parsed_as_decimal_not_float() -> None:
    value = jsondoc.loads_strict("0.1")
    assert isinstance(value, decimal.Decimal)
    assert value == decimal.Decimal("0.1")


def test_dumps_refuses_non_finite_decimals_and_unknown_types() -> None:
    with pytest.raises(ValueError, match="NaN"):
        jsondoc.dumps(decimal.Decimal("NaN"))
    with pytest.raises(ValueError, match="NaN"):
        jsondoc.dumps([decimal.Decimal("-Infinity")])
    with pytest.raises(ValueError):
        jsondoc.dumps(float("inf"))
    with pytest.raises(TypeError):
        jsondoc.dumps({"a": object()})


def test_dumps_keeps_key_order_and_canonical_sorts() -> None:
    value = {"b": 1, "a": [{"z": None, "y": True}]}
    assert jsondoc.dumps(value) == '{"b":1,"a":[{"z":null,"y":true}]}'
    assert jsondoc.canonical(value) == b'{"a":[{"y":true,"z":null}],"b":1}'


def test_canonical_is_utf8_without_escapes() -> None:
    assert jsondoc.canonical({"名": "值"}) == '{"名":"值"}'.encode()


# --- properties ---------------------------------------------------------------------------------

_decimals = st.decimals(allow_nan=False, allow_infinity=False).filter(
    # "-0" is an integer in JSON: it reads back as 0, the same value with other bytes.
    lambda d: str(d) != "-0"
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | _decimals
    | st.text(max_size=20)
)
json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


@given(json_values)
def test_dumps_then_loads_round_trips_byte_exact(value: Any) -> None:
    text = jsondoc.dumps(value)
    assert jsondoc.dumps(jsondoc.loads_strict(text)) == text
    assert jsondoc.dumps(jsondoc.loads_strict(text.encode("utf-8"))) == text


@given(json_values)
def test_canonical_survives_a_round_trip(value: Any) -> None:
    canonical = jsondoc.canonical(value)
    assert jsondoc.canonical(jsondoc.loads_strict(canonical)) == canonical


def _reorder(value: Any, rnd: st.DataObject) -> Any:
    if isinstance(value, dict):
        keys = rnd.draw(st.permutations(list(value)))
        return {k: _reorder(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [_reorder(v, rnd) for v in value]
    return value


@given(json_values, st.data())
def test_canonical_does_not_depend_on_key_order(value: Any, data: st.DataObject) -> None:
    shuffled = _reorder(value, data)
    assert shuffled == value
    assert jsondoc.canonical(shuffled) == jsondoc.canonical(value)


_SCALARS = (st.none() | st.booleans() | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False) | st.text())
_DOCS = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=5)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=5), max_leaves=30)


@settings(max_examples=500)
@given(_DOCS)
def test_the_c_encoder_fast_path_writes_exactly_what_the_exact_encoder_writes(doc: Any) -> None:
    """dumps/canonical hand plain documents to the C encoder; its output must be the exact
    encoder's, byte for byte, sorted or not."""
    assert jsondoc._plain(doc)
    for sort_keys in (False, True):
        assert jsondoc._encode(doc, sort_keys=sort_keys) == \
            jsondoc._encode_exact(doc, sort_keys=sort_keys)


def test_documents_with_exact_numbers_take_the_exact_encoder() -> None:
    doc = jsondoc.loads_strict('{"b": 12345678901234567890.123456789, "a": [1E+5, -0]}')
    assert not jsondoc._plain(doc)
    assert jsondoc.canonical(doc) == jsondoc._encode_exact(doc, sort_keys=True).encode()
    assert b'"b":12345678901234567890.123456789' in jsondoc.canonical(doc)
    assert jsondoc.dumps({"x": decimal.Decimal("1.50")}) == '{"x":1.50}'


_ALPHABET = st.sampled_from(['"', "\\", "[", "]", "{", "}", "a", ",", " ", "é"])


@settings(max_examples=300)
@given(text=st.lists(_ALPHABET, max_size=200).map("".join),
       slice_chars=st.integers(min_value=1, max_value=40))
def test_strings_are_removed_slice_by_slice_exactly_as_in_one_pass(
    text: str, slice_chars: int,
) -> None:
    # A large document's passes run over slices (the parsing thread yields in between); the
    # result must be what one pass over the whole text gives, valid JSON or not.
    whole = jsondoc._STRING.sub("", text)
    quote = whole.find('"')
    expected = whole if quote < 0 else whole[:quote]
    saved = jsondoc.SLICE_CHARS
    jsondoc.SLICE_CHARS = slice_chars
    try:
        assert jsondoc._outside_strings(text) == expected
    finally:
        jsondoc.SLICE_CHARS = saved


def test_a_large_document_parses_as_a_small_one_does() -> None:
    # Over SLICE_CHARS the numbers go through Python-level hooks; the values are the same.
    items = [{"n": n, "x": n / 4, "s": f"[{n}]\\\"{{"} for n in range(20_000)]
    text = json.dumps({"items": items})
    assert len(text) > jsondoc.SLICE_CHARS
    parsed = jsondoc.loads_strict(text)
    assert parsed == json.loads(text, parse_float=decimal.Decimal)
    exact = jsondoc.loads_strict(text, keep_number_text=True)
    assert jsondoc.dumps(exact) == json.dumps({"items": items}, separators=(",", ":"))


def test_a_lone_surrogate_on_a_slice_boundary_is_refused() -> None:
    for shift in range(6):
        pad = "x" * (jsondoc.SLICE_CHARS - 3 - shift)
        text = '["' + pad + '\\ud800"]'
        with pytest.raises(errors.MalformedJson):
            jsondoc.loads_strict(text)


def test_a_string_longer_than_a_slice_hides_its_brackets() -> None:
    inner = "[" * (3 * jsondoc.SLICE_CHARS)
    assert jsondoc.loads_strict('["' + inner + '", [1]]') == [inner, [1]]
    with pytest.raises(errors.MalformedJson):  # unterminated: refused, not recursed into
        jsondoc.loads_strict('["' + inner)

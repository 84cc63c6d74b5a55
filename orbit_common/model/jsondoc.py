"""Strict JSON documents.

Request bodies are parsed strictly: duplicate keys in one object, nesting deeper than
``MAX_DEPTH``, NaN/Infinity, invalid UTF-8 and lone surrogate escapes (``"\\ud800"``, which no
UTF-8 text can hold) are refused. Numbers are parsed exactly (decimals as
:class:`decimal.Decimal`) so a canonical form -- used for request digests -- never loses digits.

Decimal keeps the value but not the spelling (``1e5`` is written back as ``1E+5``, ``-0`` as
``0``). Documents that must come back byte for byte (task inputs) are parsed with
``keep_number_text=True``: every number is then a :class:`JsonNumber`, the token exactly as it
was written, and :func:`dumps`/:func:`canonical` emit it verbatim.
"""

from __future__ import annotations

import decimal
import json
import re
from typing import Any

from orbit_common import errors

MAX_DEPTH = 32
# Arrays and objects per request body or worker message (counted before parsing): what the
# parser spends its time and memory on.
MAX_CONTAINERS = 50_000
# Every pass over a large document runs as C calls over slices of at most this many
# characters, with Python in between: a thread parsing a 1 MiB body hands the interpreter lock
# back every few milliseconds, so the event loop (health probes included) keeps running.
SLICE_CHARS = 64 * 1024


class JsonNumber(str):
    """A JSON number kept as its original token text (``-0``, ``1E+5``, ``1.000``).

    A ``str`` subclass so it costs nothing to create; only :func:`loads_strict` makes them, from
    tokens the JSON grammar accepted, so the text is always a valid JSON number. Being a string,
    it compares equal to the string of its text and the standard ``json`` module writes it as a
    string: serialise documents holding it with :func:`dumps`.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"JsonNumber({str.__repr__(self)})"


class RawJson(str):
    """A JSON document's text, already validated, that :func:`dumps` splices in verbatim.

    Lets a stored result be embedded in a larger document (a result event's snapshot, late
    evidence) without parsing and re-encoding it: a 1 MiB result costs a copy, not a parse.
    Only code that holds text produced by :func:`dumps` (or checked by :func:`loads_strict`)
    makes one.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"RawJson({str.__repr__(self)})"


class _Tokens(dict[str, JsonNumber]):
    """The :class:`JsonNumber` of each number token of one document, made once per token."""

    def __missing__(self, token: str) -> JsonNumber:
        number = self[token] = JsonNumber(token)
        return number


class _CheckedTokens(_Tokens):
    """:class:`_Tokens` that converts each distinct token once as the normal parse would
    (:func:`number_value`), so it refuses what that parse refuses (too many digits, an
    exponent out of range)."""

    def __missing__(self, token: str) -> JsonNumber:
        number_value(token)
        return super().__missing__(token)


def number_value(token: str) -> int | decimal.Decimal:
    """The value the normal parse makes of a JSON number token: ``int`` or ``Decimal``."""
    if "." in token or "e" in token or "E" in token:
        return decimal.Decimal(token)
    return int(token)


def plain_numbers(value: Any) -> Any:
    """A document from the number-preserving parse with its numbers as the normal parse makes
    them (``int`` / ``Decimal``): what a DTO is structured from."""
    if type(value) is JsonNumber:
        return number_value(value)
    if type(value) is dict:
        return {key: plain_numbers(item) for key, item in value.items()}
    if type(value) is list:
        return [plain_numbers(item) for item in value]
    return value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise errors.DuplicateJsonKey(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise errors.MalformedJson(f"{name} is not valid JSON")


# A string token, unrolled (a run of plain characters, then escape + run, ...): six times
# faster than an alternation tried at every character.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")
_WS = re.compile(r"[ \t\n\r]*")
_PLAIN = json.JSONDecoder()


def _depth(text: str, limit: int = MAX_DEPTH, max_containers: int | None = None) -> int:
    """Maximum nesting depth of arrays/objects, ignoring brackets inside strings; at most
    ``limit + 1`` (deeper is not measured). Every step is a regular-expression pass (C speed):
    strings are removed (an unterminated one hides the rest, as the parser will refuse it),
    then each pass removes the innermost ``[]``/``{}`` pairs, at most ``limit + 1`` passes.
    With ``max_containers``, more arrays and objects than that are refused first."""
    brackets = _outside_strings(text)
    brackets = "".join(_NOT_BRACKET.sub("", brackets[at:at + SLICE_CHARS])
                       for at in range(0, len(brackets), SLICE_CHARS))
    if max_containers is not None:
        containers = brackets.count("[") + brackets.count("{")
        if containers > max_containers:
            raise errors.JsonTooComplex(
                f"JSON holds {containers} arrays and objects; at most {max_containers}")
    depth = 0
    while brackets and depth <= limit:
        inner = _INNERMOST.sub("", brackets)
        if inner == brackets:
            # Unbalanced (every well-nested sequence holds an adjacent pair): not JSON. Refused
            # here, because the parser would recurse into ``[[[[…`` until a RecursionError.
            raise errors.MalformedJson("unbalanced brackets: not valid JSON")
        brackets, depth = inner, depth + 1
    return depth + (1 if brackets and depth > limit else 0)


def _outside_strings(text: str) -> str:
    """``text`` without its string tokens; an unterminated string hides the rest (the parser
    refuses it). Slice by slice: strings in a slice are removed with one regular-expression
    pass; one that runs past the slice's end stays unmatched -- and nothing after its opening
    quote can match, since every quote inside it is escaped -- so the next slice starts at that
    quote (a string longer than a slice gets a slice doubled until it ends)."""
    if len(text) <= SLICE_CHARS:
        kept = _STRING.sub("", text)
        quote = kept.find('"')
        return kept if quote < 0 else kept[:quote]
    parts = []
    at, size = 0, SLICE_CHARS
    while at < len(text):
        end = min(len(text), at + size)
        piece = text[at:end]
        kept = _STRING.sub("", piece)
        quote = kept.find('"')
        if quote < 0:
            parts.append(kept)
            at, size = end, SLICE_CHARS
        elif end == len(text):  # unterminated
            parts.append(kept[:quote])
            break
        elif quote == 0:  # a string longer than the slice begins here
            size *= 2
        else:
            parts.append(kept[:quote])
            # every string removed lies before the unmatched quote
            at, size = at + quote + len(piece) - len(kept), SLICE_CHARS
    return "".join(parts)


def _search_sliced(pattern: re.Pattern[str], text: str, overlap: int) -> bool:
    """Whether ``pattern`` (at most ``overlap + 1`` characters long) occurs in ``text``, in
    slices of :data:`SLICE_CHARS`."""
    return any(pattern.search(text, at, at + SLICE_CHARS + overlap) is not None
               for at in range(0, max(len(text), 1), SLICE_CHARS))


def _skip(text: str, at: int) -> int:
    """The index of the first non-whitespace character at or after ``at``."""
    match = _WS.match(text, at)
    return at if match is None else match.end()


def array_longer_than(data: bytes, member: str, limit: int) -> bool:
    """Whether the top-level object's ``member`` is an array of more than ``limit`` items.

    Reads the array one item at a time and stops at item ``limit + 1``, so an oversized batch
    is refused after materialising at most ``limit + 1`` items (not 350,000). A document that is
    not such an object, or is not valid JSON, answers False: the strict parse reports it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    try:
        at = _skip(text, 0)
        if text[at:at + 1] != "{":
            return False
        at = _skip(text, at + 1)
        while text[at:at + 1] == '"':
            name, at = _PLAIN.raw_decode(text, at)
            at = _skip(text, at)
            if text[at:at + 1] != ":":
                return False
            at = _skip(text, at + 1)
            if name == member:
                return _items_over(text, at, limit)
            _, at = _PLAIN.raw_decode(text, at)
            at = _skip(text, at)
            if text[at:at + 1] != ",":
                return False
            at = _skip(text, at + 1)
    except (ValueError, RecursionError):
        return False
    return False


def _items_over(text: str, at: int, limit: int) -> bool:
    if text[at:at + 1] != "[":
        return False
    at = _skip(text, at + 1)
    if text[at:at + 1] == "]":
        return False
    count = 0
    while True:
        _, at = _PLAIN.raw_decode(text, at)
        count += 1
        if count > limit:
            return True
        at = _skip(text, at)
        if text[at:at + 1] != ",":
            return False
        at = _skip(text, at + 1)


def loads_strict(
    data: bytes | str, *, max_depth: int = MAX_DEPTH, keep_number_text: bool = False,
    max_containers: int | None = None, check_numbers: bool = False,
) -> Any:
    """Parse a JSON document strictly (see the module docstring).

    With ``keep_number_text`` every number is a :class:`JsonNumber` holding its token; no
    numeric conversion happens, so no number is too long or out of range. ``max_containers``
    bounds the arrays and objects, counted before parsing: they are what the parser spends its
    time on (each is an object the garbage collector tracks), and it holds the GIL throughout.
    ``check_numbers`` (with ``keep_number_text``) refuses the numbers the normal parse cannot
    convert, so one number-preserving parse of a request body accepts exactly what the normal
    parse accepts.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise errors.MalformedJson("the body is not valid UTF-8") from exc
    else:
        text = data
    if _depth(text, max_depth, max_containers) > max_depth:
        raise errors.JsonTooDeep(f"JSON nests deeper than {max_depth} levels")
    if keep_number_text:
        # One JsonNumber per distinct token: a str subclass costs about 20 times a str to make,
        # and a body of 500,000 numbers repeats most of them.
        tokens = _CheckedTokens() if check_numbers else _Tokens()
        numbers: dict[str, Any] = {"parse_float": tokens.__getitem__,
                                   "parse_int": tokens.__getitem__}
    else:
        numbers = {"parse_float": decimal.Decimal}
    if len(text) > SLICE_CHARS:
        # The C parser holds the interpreter lock from start to end unless it calls Python:
        # objects call _pairs, and here numbers call Python functions too (a 1 MiB array of
        # numbers is otherwise 50-90 ms without a pause for any other thread).
        numbers = {name: _in_python(hook) for name, hook in numbers.items()}
        numbers.setdefault("parse_int", _in_python(int))
    try:
        value = json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_refuse_constant, **numbers
        )
    except json.JSONDecodeError as exc:
        raise errors.MalformedJson(f"invalid JSON at line {exc.lineno} column {exc.colno}") from exc
    except ValueError as exc:  # int() refuses integers longer than sys.get_int_max_str_digits()
        raise errors.MalformedJson("a number has too many digits") from exc
    except decimal.InvalidOperation as exc:  # an exponent beyond the decimal context's range
        raise errors.MalformedJson("a number is out of range") from exc
    except RecursionError as exc:  # unreachable after _depth; kept so no input can crash a caller
        raise errors.JsonTooDeep(f"JSON nests deeper than {max_depth} levels") from exc
    if _search_sliced(_MAYBE_SURROGATE, text, 3):
        _check_strings(value)
    return value


def _in_python(hook: Any) -> Any:
    """``hook`` called from a Python frame (where the interpreter may switch threads)."""

    def call(token: str) -> Any:
        return hook(token)

    return call


# A lone surrogate can only come from a \uD800-\uDFFF escape (UTF-8 cannot hold one) or from a
# str argument that holds one already; without either, the tree walk below has nothing to find.
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]|[\ud800-\udfff]")


def _check_strings(value: Any) -> None:
    """Refuse strings holding lone surrogates (from ``\\uXXXX`` escapes): not encodable."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise errors.MalformedJson("a string contains a lone surrogate escape") from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key)
            _check_strings(item)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item)


def dumps(value: Any) -> str:
    """Compact JSON that keeps key order; Decimals keep their exact digits and
    :class:`JsonNumber` its exact text."""
    return _encode(value, sort_keys=False)


def canonical(value: Any) -> bytes:
    """Canonical bytes for digests: sorted keys, no whitespace, exact numbers, UTF-8."""
    return _encode(value, sort_keys=True).encode("utf-8")


_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> bool:
    """Whether the C encoder of :mod:`json` writes ``value`` exactly as :func:`_encode` would:
    only exact ``str``/``int``/``float``/``bool``/``None`` scalars (a :class:`JsonNumber` is a
    ``str`` *subclass* and must stay a bare number), lists, and dicts with exact ``str`` keys."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind is list:
        return all(_plain(v) for v in value)
    return False


def _encode(value: Any, *, sort_keys: bool) -> str:
    if _plain(value):  # the common case: one call into the C encoder
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          sort_keys=sort_keys, allow_nan=False)
    return _encode_exact(value, sort_keys=sort_keys)


def _encode_exact(value: Any, *, sort_keys: bool) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, JsonNumber | RawJson):  # before str: they are strings
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError("NaN and Infinity are not JSON")
        return str(value)
    if isinstance(value, float):
        return json.dumps(value, allow_nan=False)
    if isinstance(value, dict):
        items = sorted(value.items()) if sort_keys else value.items()
        inner = ",".join(
            json.dumps(str(k), ensure_ascii=False) + ":" + _encode_exact(v, sort_keys=sort_keys)
            for k, v in items
        )
        return "{" + inner + "}"
    if isinstance(value, list | tuple):
        if all(type(v) is JsonNumber for v in value):  # a list of numbers: their own text
            return "[" + ",".join(value) + "]"
        return "[" + ",".join(_encode_exact(v, sort_keys=sort_keys) for v in value) + "]"
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

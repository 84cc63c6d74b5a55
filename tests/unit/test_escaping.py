"""The runner's cursor writes the literals PyMySQL's own escaping writes (orbit_common.db.tx),
except that a string with nothing that can end or bend a quoted literal is quoted as it is
(PyMySQL would also escape its double quotes, which need none inside single quotes;
tests/integration/test_db_kernel.py round-trips such strings through the server)."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import aiomysql
from hypothesis import given
from hypothesis import strategies as st
from pymysql.constants import SERVER_STATUS

from orbit_common.db.tx import Cursor
from orbit_common.model.jsondoc import JsonNumber


def _connection(server_status: int = 0) -> Any:
    """An aiomysql connection with nothing open: what ``Cursor._escape_args`` uses of one is
    its escaping, which reads only the server status and the character set."""
    conn = aiomysql.Connection.__new__(aiomysql.Connection)
    conn.server_status = server_status
    conn._charset = "utf8mb4"
    conn._writer = conn._reader = None  # never connected (its finaliser looks)
    return conn


def _escape(args: list[Any], status: int = 0) -> tuple[str, ...]:
    cursor = Cursor.__new__(Cursor)
    return tuple(cursor._escape_args(args, _connection(status)))


values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.text(), st.binary(max_size=40),
    st.datetimes(),  # naive: the wall-clock fields
    st.datetimes(timezones=st.just(dt.UTC)),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet="0123456789", min_size=1).map(JsonNumber),
)


BENDS_LITERAL = set("\0\n\r\x1a'\\")


def _pymysql(conn: Any, value: Any) -> str:
    if type(value) is bytes:
        return "X'" + value.hex() + "'"
    if type(value) is str and not BENDS_LITERAL & set(value):
        return "'" + value + "'"
    return str(conn.escape(value))


@given(st.lists(values, max_size=20))
def test_every_literal_is_what_pymysql_writes(args: list[Any]) -> None:
    conn = _connection()
    assert _escape(args) == tuple(_pymysql(conn, a) for a in args)


@given(st.text(alphabet=st.sampled_from("ab\"'\\\0\n\r\x1a%"), max_size=12))
def test_strings_of_special_characters(text: str) -> None:
    """The characters that matter, densely: quoted as is only when none bends the literal."""
    conn = _connection()
    (literal,) = _escape([text])
    assert literal == (conn.escape(text) if BENDS_LITERAL & set(text) else "'" + text + "'")


def test_quotes_backslashes_and_control_characters_are_escaped() -> None:
    assert _escape(["it's", "a\\b", "nul\0", "\n\r\x1a", '"', '"\'']) == (
        "'it\\'s'", "'a\\\\b'", "'nul\\0'", "'\\n\\r\\Z'", "'\"'", "'\\\"\\''")


def test_datetimes_drop_their_zone_and_keep_microseconds_only_when_set() -> None:
    moment = dt.datetime(2026, 12, 1, 22, 5, 9, tzinfo=dt.UTC)
    assert _escape([moment, moment.replace(microsecond=120)]) == (
        "'2026-12-01 22:05:09'", "'2026-12-01 22:05:09.000120'")


def test_without_backslash_escapes_the_connection_escapes_strings() -> None:
    status = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
    assert _escape(["a\\'b", b"\x01", 3], status) == ("'a\\''b'", "X'01'", "3")


def test_subclasses_and_other_types_take_the_connection_escaping() -> None:
    assert _escape([JsonNumber("1.50"), decimal.Decimal("1.50"), 1.5, True]) == (
        "'1.50'", "1.50", "1.5e0", "1")

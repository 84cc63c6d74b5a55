"""Queue settings against the real table, as properties (Hypothesis):

* the domain's validation accepts exactly what the table's CHECK constraints and column types
  accept, so a bad value is always a 400 with a field path, never a database error;
* every valid configuration survives the row round trip, and its decimals come back in a
  spelling that parses to the same value.

Each example runs in a transaction that is rolled back: nothing is left behind.
"""

from __future__ import annotations

import decimal
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pymysql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit_common.db import errors as dberrors
from orbit_common.db.pool import DatabaseUrl, connect_sync
from orbit_common.model import jsondoc
from orbit_common.pulse import queues

INT_MIN = -(2**31)
# CHECK violations, and in strict sql_mode 1264 (out of range) and 1406 (data too long).
REFUSED = {dberrors.ER_CHECK_CONSTRAINT_VIOLATED_MYSQL, dberrors.ER_CONSTRAINT_FAILED_MARIADB,
           1264, 1406}


@pytest.fixture(scope="module")
def conn(db_url: DatabaseUrl) -> Iterator[pymysql.connections.Connection[Any]]:
    connection = connect_sync(db_url, autocommit=False)
    try:
        yield connection
    finally:
        connection.close()


def _insert(cur: Any, s: queues.QueueSettings) -> tuple[bytes, bytes]:
    namespace_id, queue_id, gate_id = (secrets.token_bytes(16) for _ in range(3))
    cur.execute(queues.INSERT_GATE, (namespace_id, gate_id, queue_id))
    r = s.retry
    cur.execute(queues.INSERT_QUEUE, (
        namespace_id, queue_id, "q", gate_id, s.description, s.offer_lease_ms,
        s.execution_lease_ms, r.max_attempts, r.initial_ms, r.max_ms, r.multiplier, r.jitter,
        s.max_concurrent_attempts, s.max_unfinished_tasks, s.max_starts_per_second,
    ))
    return namespace_id, queue_id


def _accepted_by_the_table(
    conn: pymysql.connections.Connection[Any], s: queues.QueueSettings
) -> bool:
    refused: int | None = None
    try:
        with conn.cursor() as cur:
            _insert(cur, s)
    except pymysql.err.MySQLError as exc:
        refused = dberrors.errno_of(exc)
    finally:
        conn.rollback()
    assert refused is None or refused in REFUSED, refused
    return refused is None


def _decimals(places: int) -> st.SearchStrategy[decimal.Decimal]:
    return st.decimals(min_value=-2, max_value=1200, places=places, allow_nan=False,
                       allow_infinity=False)


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    # Around the bounds, and anywhere in the INT column's range.
    near = st.sampled_from([low - 1, low, low + 1, high - 1, high, high + 1])
    return st.one_of(near, st.integers(INT_MIN, queues.INT_MAX))


any_settings = st.builds(
    queues.QueueSettings,
    description=st.text(max_size=520),
    offer_lease_ms=_ints(*queues.OFFER_LEASE_MS),
    execution_lease_ms=_ints(*queues.EXECUTION_LEASE_MS),
    retry=st.builds(
        queues.RetryPolicy,
        max_attempts=_ints(*queues.MAX_ATTEMPTS),
        initial_ms=_ints(0, queues.INT_MAX),
        max_ms=_ints(0, queues.INT_MAX),
        multiplier=_decimals(3),
        jitter=st.one_of(_decimals(3), st.decimals(min_value=-1, max_value=2, places=3)),
    ),
    max_concurrent_attempts=st.one_of(st.none(), _ints(1, queues.INT_MAX)),
    max_unfinished_tasks=st.one_of(st.none(), _ints(1, queues.INT_MAX)),
    max_starts_per_second=st.one_of(st.none(), _ints(1, queues.INT_MAX)),
)


@st.composite
def valid_settings(draw: st.DrawFn) -> queues.QueueSettings:
    initial = draw(st.integers(0, queues.INT_MAX))
    return queues.QueueSettings(
        description=draw(st.text(max_size=queues.DESCRIPTION_MAX)),
        offer_lease_ms=draw(st.integers(*queues.OFFER_LEASE_MS)),
        execution_lease_ms=draw(st.integers(*queues.EXECUTION_LEASE_MS)),
        retry=queues.RetryPolicy(
            max_attempts=draw(st.integers(*queues.MAX_ATTEMPTS)),
            initial_ms=initial,
            max_ms=draw(st.integers(initial, queues.INT_MAX)),
            multiplier=draw(st.decimals(*queues.MULTIPLIER, places=3)),
            jitter=draw(st.decimals(*queues.JITTER, places=3)),
        ),
        max_concurrent_attempts=draw(st.one_of(st.none(), st.integers(1, queues.INT_MAX))),
        max_unfinished_tasks=draw(st.one_of(st.none(), st.integers(1, queues.INT_MAX))),
        max_starts_per_second=draw(st.one_of(st.none(), st.integers(1, queues.INT_MAX))),
    )


@st.composite
def one_field_off(draw: st.DrawFn) -> queues.QueueSettings:
    """A valid configuration with one field (or none) replaced by an arbitrary value, so that
    both sides of every bound are exercised; sometimes a fully arbitrary configuration."""
    if draw(st.integers(0, 9)) == 0:
        return draw(any_settings)
    base = draw(valid_settings())
    field = draw(st.sampled_from([None, "description", "offer_lease_ms", "execution_lease_ms",
                                  "max_attempts", "initial_ms", "max_ms", "multiplier", "jitter",
                                  *queues.LIMIT_FIELDS]))
    if field is None:
        return base
    retry = base.retry
    changes: dict[str, Any] = {}
    match field:
        case "description":
            changes["description"] = draw(st.text(min_size=500, max_size=520))
        case "offer_lease_ms":
            changes[field] = draw(_ints(*queues.OFFER_LEASE_MS))
        case "execution_lease_ms":
            changes[field] = draw(_ints(*queues.EXECUTION_LEASE_MS))
        case "max_concurrent_attempts" | "max_unfinished_tasks" | "max_starts_per_second":
            changes[field] = draw(_ints(1, queues.INT_MAX))
        case "max_attempts":
            changes["retry"] = attrs.evolve(retry, max_attempts=draw(_ints(*queues.MAX_ATTEMPTS)))
        case "initial_ms":
            changes["retry"] = attrs.evolve(retry, initial_ms=draw(_ints(0, retry.max_ms)))
        case "max_ms":
            changes["retry"] = attrs.evolve(retry, max_ms=draw(_ints(retry.initial_ms,
                                                                      queues.INT_MAX)))
        case "multiplier":
            changes["retry"] = attrs.evolve(retry, multiplier=draw(st.one_of(
                _decimals(3), st.sampled_from([decimal.Decimal("0.999"), decimal.Decimal(1),
                                               decimal.Decimal("999.999"),
                                               decimal.Decimal(1000)]))))
        case "jitter":
            changes["retry"] = attrs.evolve(retry, jitter=draw(st.decimals(
                min_value=-1, max_value=2, places=3)))
    return attrs.evolve(base, **changes)


@settings(max_examples=400, deadline=None)
@given(s=one_field_off())
def test_validation_accepts_exactly_what_the_table_accepts(
    conn: pymysql.connections.Connection[Any], s: queues.QueueSettings
) -> None:
    assert (s.problems() == []) == _accepted_by_the_table(conn, s), s.problems()


@settings(max_examples=100, deadline=None)
@given(s=valid_settings())
def test_a_valid_configuration_survives_the_round_trip(
    conn: pymysql.connections.Connection[Any], s: queues.QueueSettings
) -> None:
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            namespace_id, queue_id = _insert(cur, s)
            cur.execute(queues.SELECT_BY_ID, (namespace_id, queue_id))
            record = queues.QueueRecord.from_row(cur.fetchone())
    finally:
        conn.rollback()
    assert queues.QueueSettings.of(record) == s
    view = record.view()
    for field in ("multiplier", "jitter"):
        # Through JSON text, as a client reads and sends it back: the number is exact.
        number = jsondoc.loads_strict(jsondoc.dumps(view["retry"][field]))
        problems: queues.Problems = []
        assert queues.parse_decimal(number, field, problems) == getattr(s.retry, field)
        assert problems == []
    assert (view["active_attempts"], view["revision"], view["paused"]) == (0, 1, False)


@given(value=st.decimals(min_value=1, max_value=999, places=4).filter(
    lambda d: d != d.quantize(decimal.Decimal("0.001"))))
def test_more_than_three_decimal_places_are_refused_not_rounded(value: decimal.Decimal) -> None:
    # The table would round these silently (a note, not an error): the domain must refuse them.
    s = queues.QueueSettings(retry=queues.RetryPolicy(multiplier=value))
    assert [p["path"] for p in s.problems()] == ["$.retry.multiplier"]

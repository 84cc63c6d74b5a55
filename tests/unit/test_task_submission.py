"""orbit_common.pulse.tasks without a database: validation, times, digests, batch identities."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import aiomysql.cursors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.model import jsondoc, strict
from orbit_common.platform import authz
from orbit_common.platform.credentials import Principal
from orbit_common.pulse import queries, tasks
from orbit_common.pulse.model import RetryPolicy

UTC = dt.UTC
PRINCIPAL = Principal(credential_id=b"c" * 16, credential_name="c", prefix="0" * 12,
                      application_id=b"a" * 16, application_name="a", grants=authz.ALL_ACCESS)


def spec_of(raw: dict[str, Any], path: str = "$") -> tuple[tasks.TaskSpec | None,
                                                            list[dict[str, str]]]:
    text = jsondoc.dumps(raw)
    dto = strict.structure(jsondoc.loads_strict(text), tasks.SubmitRequest)
    exact = jsondoc.loads_strict(text, keep_number_text=True)
    return tasks.validate(dto, exact.get("input", {}), path)


def ok(**fields: Any) -> tasks.TaskSpec:
    spec, problems = spec_of({"queue": "work", "handler": "h", **fields})
    assert problems == []
    assert spec is not None
    return spec


def paths(**fields: Any) -> list[str]:
    spec, problems = spec_of({"queue": "work", "handler": "h", **fields})
    assert spec is None
    return [p["path"] for p in problems]


# --- RFC 3339 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2030-01-02T03:04:05Z", dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02t03:04:05z", dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02 03:04:05+00:00", dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02T11:04:05+08:00", dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02T02:34:05-00:30", dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02T03:04:05.1Z", dt.datetime(2030, 1, 2, 3, 4, 5, 100000, tzinfo=UTC)),
        ("2030-01-02T03:04:05.123456Z", dt.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        # Below a microsecond is truncated: DATETIME(6) holds microseconds.
        ("2030-01-02T03:04:05.123456789Z",
         dt.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        ("2030-01-01T01:00:00+23:59", dt.datetime(2029, 12, 31, 1, 1, tzinfo=UTC)),
    ],
)
def test_rfc3339_times_are_read_as_utc(text: str, expected: dt.datetime) -> None:
    parsed = tasks.parse_rfc3339(text)
    assert parsed == expected
    assert parsed.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize(
    "text",
    ["2030-01-02T03:04:05", "2030-01-02", "03:04:05Z", "2030-01-02T03:04Z",
     "2030-01-02T03:04:05.Z", "2030-01-02T03:04:05.1234567890Z", "2030-01-02T03:04:05+0800",
     "2030-01-02T03:04:05+24:00", "2030-01-02T03:04:05+05:60", "2030-13-02T03:04:05Z",
     "2030-02-30T03:04:05Z", "2030-01-02T24:00:00Z", "2030-01-02T03:04:60Z",
     "0000-01-02T03:04:05Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
     "２０３０-01-02T03:04:05Z", " 2030-01-02T03:04:05Z", "2030-01-02T03:04:05Z\n", ""],
)
def test_other_spellings_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="date-time"):
        tasks.parse_rfc3339(text)


# --- validation ---------------------------------------------------------------------------------


def test_defaults() -> None:
    spec = ok()
    assert spec.input == {}
    assert spec.priority == 0
    assert spec.rerun_safe is False
    assert spec.delay_ms is None
    assert spec.not_before is None
    assert spec.business_key is None
    assert spec.retry == tasks.RetryOverrides()


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    found = paths(queue="Bad", handler="x y", priority=10, delay_ms=-1,
                  not_before="soon", business_key="", retry={"max_attempts": 0, "jitter": 2},
                  input={"n": jsondoc.JsonNumber("1e999")})
    assert found == ["$.queue", "$.handler", "$.delay_ms", "$.priority", "$.not_before",
                     "$.not_before", "$.business_key", "$.retry.max_attempts",
                     "$.retry.jitter", "$.input"]


def test_item_paths_carry_the_index() -> None:
    _, problems = spec_of({"queue": "work", "handler": "h", "priority": -1}, "$.tasks[7]")
    assert problems == [{"path": "$.tasks[7].priority", "message": "an integer from 0 to 9"}]


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_priority_and_delay_bounds(value: int) -> None:
    assert (spec_of({"queue": "q", "handler": "h", "priority": value})[0] is not None) is (
        0 <= value <= 9)
    assert (spec_of({"queue": "q", "handler": "h", "delay_ms": value})[0] is not None) is (
        0 <= value <= 31 * 24 * 3600 * 1000)


@given(st.text(min_size=1, max_size=140))
def test_handler_names(name: str) -> None:
    valid = len(name) <= 128 and all(c.isascii() and (c.isalnum() or c in "._:-") for c in name)
    assert (spec_of({"queue": "q", "handler": name})[0] is not None) is valid


def test_business_keys_are_bytes_and_bounded_in_bytes() -> None:
    assert ok(business_key="Key ").business_key == b"Key "
    assert ok(business_key="é" * 256).business_key == "é".encode() * 256  # 512 bytes
    assert paths(business_key="é" * 256 + "x") == ["$.business_key"]
    assert paths(business_key="") == ["$.business_key"]


@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        ({"multiplier": decimal.Decimal("1.25")}, decimal.Decimal("1.250")),
        ({"multiplier": 3}, decimal.Decimal("3.000")),
        ({"multiplier": decimal.Decimal("999.999")}, decimal.Decimal("999.999")),
        ({"multiplier": decimal.Decimal("2.5000")}, decimal.Decimal("2.500")),
    ],
)
def test_multipliers_keep_three_places(retry: dict[str, Any], expected: decimal.Decimal) -> None:
    assert ok(retry=retry).retry.multiplier == expected


@pytest.mark.parametrize(
    "retry",
    [{"multiplier": decimal.Decimal("0.999")}, {"multiplier": decimal.Decimal("1000")},
     {"multiplier": decimal.Decimal("1.0001")}, {"jitter": decimal.Decimal("-0.001")},
     {"jitter": decimal.Decimal("1.001")}, {"jitter": decimal.Decimal("1E-7")},
     {"multiplier": "2"}, {"jitter": True}, {"multiplier": [2]}],
)
def test_bad_retry_numbers(retry: dict[str, Any]) -> None:
    assert paths(retry=retry) == [f"$.retry.{next(iter(retry))}"]


def test_overrides_merge_field_by_field() -> None:
    default = RetryPolicy(max_attempts=3, initial_ms=100, max_ms=1000,
                          multiplier=decimal.Decimal(2), jitter=decimal.Decimal("0.1"))
    merged = ok(retry={"max_attempts": 9, "jitter": 0}).retry.merged(default)
    assert merged == RetryPolicy(max_attempts=9, initial_ms=100, max_ms=1000,
                                 multiplier=decimal.Decimal(2), jitter=decimal.Decimal("0.000"))


def test_delay_and_not_before_are_exclusive_and_deadline_must_outlast_the_delay() -> None:
    assert paths(delay_ms=1, not_before="2030-01-01T00:00:00Z") == ["$.not_before"]
    assert paths(delay_ms=1000, deadline_ms=1000) == ["$.deadline_ms"]
    assert ok(delay_ms=1000, deadline_ms=1001).deadline_ms == 1001


def test_input_numbers_beyond_a_double_are_refused_anywhere() -> None:
    big = jsondoc.JsonNumber("-2e308")
    assert paths(input=[{"a": [big]}]) == ["$.input"]
    assert ok(input=[jsondoc.JsonNumber("1.7976931348623157e308"),
                     jsondoc.JsonNumber("1e-400")]).input is not None
    # Without an exponent only a number of more than 308 digits overflows; in a long list of
    # numbers, at the top level and as an object's value.
    huge = jsondoc.JsonNumber("9" * 309)
    assert paths(input=[jsondoc.JsonNumber("0")] * 1000 + [huge]) == ["$.input"]
    assert paths(input=huge) == ["$.input"]
    assert paths(input={"a": [jsondoc.JsonNumber("1")], "b": huge}) == ["$.input"]
    assert ok(input=[jsondoc.JsonNumber("9" * 308), jsondoc.JsonNumber("1E+308")] * 1000
              ).input is not None


# --- the idempotency digest ---------------------------------------------------------------------


def digest(**fields: Any) -> bytes:
    (item,) = tasks.make_items(PRINCIPAL, [(ok(**fields), "key", "$", "Idempotency-Key")])
    assert item.idem is not None
    return item.idem.request_digest


def test_the_digest_is_of_the_request_not_its_spelling() -> None:
    assert digest(input={"a": 1, "b": 2}) == digest(input={"b": 2, "a": 1})
    assert digest(priority=0) == digest()
    assert digest(not_before="2030-01-01T08:00:00+08:00") == digest(
        not_before="2030-01-01T00:00:00Z")
    assert digest(retry={"multiplier": 2}) == digest(retry={"multiplier": decimal.Decimal("2.0")})


@pytest.mark.parametrize("change", [
    {"input": {"a": jsondoc.JsonNumber("1.0")}}, {"delay_ms": 0}, {"priority": 1},
    {"business_key": "k"}, {"rerun_safe": True}, {"handler": "h2"}, {"deadline_ms": 5},
    {"retry": {"max_attempts": 3}}, {"offer_lease_ms": 30000},
])
def test_every_field_is_part_of_the_digest(change: dict[str, Any]) -> None:
    assert digest(**change) != digest(input={"a": jsondoc.JsonNumber("1")})


def test_the_queue_is_the_scope_of_a_key() -> None:
    (a, b) = tasks.make_items(PRINCIPAL, [(ok(), "k", "$.tasks[0]", "x"),
                                          (ok(queue="other"), "k", "$.tasks[1]", "y")])
    assert a.idem is not None
    assert b.idem is not None
    assert (a.idem.scope, b.idem.scope) == (b"work", b"other")


def test_a_key_repeated_within_one_queue_of_a_batch_is_refused() -> None:
    with pytest.raises(errors.ValidationFailed) as caught:
        tasks.make_items(PRINCIPAL, [(ok(), "k", "$.tasks[0]", "$.tasks[0].idempotency_key"),
                                     (ok(), "j", "$.tasks[1]", "$.tasks[1].idempotency_key"),
                                     (ok(), "k", "$.tasks[2]", "$.tasks[2].idempotency_key")])
    assert caught.value.errors == [{"path": "$.tasks[2].idempotency_key",
                                    "message": "repeats the key of $.tasks[0].idempotency_key"}]


def test_items_get_fresh_identities() -> None:
    items = tasks.make_items(PRINCIPAL, [(ok(), None, "$", "-")] * 3)
    assert len({i.task_id for i in items} | {i.event_id for i in items}) == 6
    assert all(i.idem is None for i in items)


# --- statements ---------------------------------------------------------------------------------


# The idempotency records are written by platform/idempotency.py with one explicit multi-row
# INSERT (db/batch.multi_insert).
@pytest.mark.parametrize("name", ["INSERT_TASKS", "INSERT_EVENTS"])
def test_inserts_are_sent_as_one_multi_row_statement(name: str) -> None:
    # aiomysql rewrites executemany into one INSERT … VALUES (…), (…) only for this shape.
    assert aiomysql.cursors.RE_INSERT_VALUES.match(getattr(tasks, name))


def test_each_list_filter_combination_forces_its_index() -> None:
    assert len(queries.LIST_SQL) == 8
    for (queue, state, key), sql in queries.LIST_SQL.items():
        index = ("ix_tasks_business_key" if key else
                 {(False, False): "ix_tasks_created", (True, False): "ix_tasks_queue_created",
                  (False, True): "ix_tasks_state_created",
                  (True, True): "ix_tasks_queue_state_created"}[(queue, state)])
        assert f"FORCE INDEX ({index})" in sql
        assert sql.count("%s") == 6 + queue + state + key

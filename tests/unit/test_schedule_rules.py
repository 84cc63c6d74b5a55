"""orbit_common.pulse.schedule_rules: cron and interval fire times, DST policies, JSON documents.

Every expected instant below was worked out by hand from the zone's offsets (the first test pins
the calendar facts they rely on), not copied from the implementation's output.
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import itertools
from typing import Any

import attrs
import pytest

from orbit_common import errors
from orbit_common.pulse import schedule_rules as sr
from orbit_common.pulse.schedule_rules import (
    AmbiguousPolicy,
    NonexistentPolicy,
    Rule,
    RuleKind,
    fires_after,
    jitter_for,
    next_fire,
    parse_rule,
    rule_to_json,
)

UTC = dt.UTC
MINUTE = dt.timedelta(minutes=1)
US = dt.timedelta(microseconds=1)


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type, misc]


def cron(expr: str, tz: str = "UTC", **extra: Any) -> Rule:
    return parse_rule({"cron": expr, "timezone": tz, **extra})


def fires(rule: Rule, after: dt.datetime, until: dt.datetime, limit: int = 10_000) -> list[str]:
    """Fire instants as compact UTC strings, for readable assertions."""
    return [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in fires_after(rule, after, until,
                                                                  limit=limit)]


def minutes_between(first: dt.datetime, last: dt.datetime) -> list[dt.datetime]:
    out, at = [], first
    while at <= last:
        out.append(at)
        at += MINUTE
    return out


# --- the calendar facts the DST cases rely on ------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "instant", "before_h", "after_h"),
    [
        ("America/New_York", utc(2026, 3, 8, 7), -5, -4),  # 02:00 EST -> 03:00 EDT
        ("America/New_York", utc(2026, 11, 1, 6), -4, -5),  # 02:00 EDT -> 01:00 EST
        ("Europe/London", utc(2026, 3, 29, 1), 0, 1),  # 01:00 GMT -> 02:00 BST
        ("Europe/London", utc(2026, 10, 25, 1), 1, 0),  # 02:00 BST -> 01:00 GMT
        ("Australia/Lord_Howe", utc(2026, 4, 4, 15), 11, 10.5),  # 04-05 02:00 -> 01:30
        ("Australia/Lord_Howe", utc(2026, 10, 3, 15, 30), 10.5, 11),  # 10-04 02:00 -> 02:30
    ],
)
def test_calendar_facts(zone: str, instant: dt.datetime, before_h: float, after_h: float) -> None:
    tz = sr.zone(zone)
    assert (instant - dt.timedelta(seconds=1)).astimezone(tz).utcoffset() == dt.timedelta(
        hours=before_h)
    assert instant.astimezone(tz).utcoffset() == dt.timedelta(hours=after_h)


def test_zones_come_from_the_tzdata_package() -> None:
    assert sr.zone("Europe/London").key == "Europe/London"
    assert sr.zone("UTC").utcoffset(dt.datetime(2026, 1, 1)) == dt.timedelta(0)  # noqa: DTZ001
    assert sr.is_known_timezone("America/St_Johns")
    assert not sr.is_known_timezone("europe/london")
    assert not sr.is_known_timezone("../etc/passwd")
    with pytest.raises(ValueError, match="unknown time zone"):
        sr.zone("Mars/Olympus_Mons")
    import tzdata  # type: ignore[import-untyped]

    assert sr.calendar_version() == tzdata.IANA_VERSION


# --- America/New_York ---------------------------------------------------------------------------


def test_new_york_spring_forward_shift_forward_fires_after_the_gap() -> None:
    rule = cron("30 2 * * *", "America/New_York")  # default nonexistent: shift_forward
    assert rule.nonexistent is NonexistentPolicy.SHIFT_FORWARD
    # 03-07 02:30 EST; 03-08 02:30 does not exist -> 02:30 + 1 h = 03:30 EDT; 03-09 02:30 EDT.
    assert fires(rule, utc(2026, 3, 7), utc(2026, 3, 10)) == [
        "2026-03-07T07:30:00Z", "2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"]


def test_new_york_spring_forward_skip_does_not_fire_that_day() -> None:
    rule = cron("30 2 * * *", "America/New_York", nonexistent="skip")
    assert fires(rule, utc(2026, 3, 7), utc(2026, 3, 10)) == [
        "2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("first", ["2026-11-01T05:30:00Z"]),  # 01:30 EDT
        ("last", ["2026-11-01T06:30:00Z"]),  # 01:30 EST
        ("both", ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]),
    ],
)
def test_new_york_fall_back(policy: str, expected: list[str]) -> None:
    rule = cron("30 1 * * *", "America/New_York", ambiguous=policy)
    around = ["2026-10-31T05:30:00Z", *expected, "2026-11-02T06:30:00Z"]
    assert fires(rule, utc(2026, 10, 31), utc(2026, 11, 3)) == around


def test_new_york_every_minute_spring_forward_has_no_gap_and_no_duplicate() -> None:
    for policy in ("shift_forward", "skip"):
        rule = cron("* * * * *", "America/New_York", nonexistent=policy)
        got = fires_after(rule, utc(2026, 3, 8, 6) - US, utc(2026, 3, 8, 8), limit=1000)
        assert got == minutes_between(utc(2026, 3, 8, 6), utc(2026, 3, 8, 8)), policy


def test_new_york_every_minute_fall_back_follows_the_policy() -> None:
    start, end = utc(2026, 11, 1, 4), utc(2026, 11, 1, 8)

    def run(policy: str) -> list[dt.datetime]:
        rule = cron("* * * * *", "America/New_York", ambiguous=policy)
        return fires_after(rule, start - US, end, limit=1000)

    # Wall 01:00-01:59 occurs at 05:00-05:59Z (EDT) and again at 06:00-06:59Z (EST).
    assert run("both") == minutes_between(start, end)
    assert run("first") == minutes_between(start, utc(2026, 11, 1, 5, 59)) + minutes_between(
        utc(2026, 11, 1, 7), end)
    assert run("last") == minutes_between(start, utc(2026, 11, 1, 4, 59)) + minutes_between(
        utc(2026, 11, 1, 6), end)


def test_new_york_hourly_across_both_transitions() -> None:
    spring = cron("0 * * * *", "America/New_York")
    # 01:00 EST, [02:00 shifted onto 03:00 EDT: one fire], 04:00 EDT: every UTC hour once.
    assert fires(spring, utc(2026, 3, 8, 5, 30), utc(2026, 3, 8, 9)) == [
        "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z",
        "2026-03-08T09:00:00Z"]
    skip = cron("0 * * * *", "America/New_York", nonexistent="skip")
    assert fires(skip, utc(2026, 3, 8, 5, 30), utc(2026, 3, 8, 9)) == fires(
        spring, utc(2026, 3, 8, 5, 30), utc(2026, 3, 8, 9))
    fall = cron("0 * * * *", "America/New_York")
    # 00:00 EDT, 01:00 EDT, (01:00 EST repeated: not with "first"), 02:00 EST.
    assert fires(fall, utc(2026, 11, 1, 3, 30), utc(2026, 11, 1, 7)) == [
        "2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z"]


# --- Europe/London ------------------------------------------------------------------------------


def test_london_spring_forward() -> None:
    window = (utc(2026, 3, 28), utc(2026, 3, 31))
    shifted = cron("30 1 * * *", "Europe/London")
    # 03-28 01:30 GMT; 03-29 01:30 missing -> 02:30 BST (01:30Z); 03-30 01:30 BST.
    assert fires(shifted, *window) == [
        "2026-03-28T01:30:00Z", "2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
    skipped = cron("30 1 * * *", "Europe/London", nonexistent="skip")
    assert fires(skipped, *window) == ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("first", ["2026-10-25T00:30:00Z"]),  # 01:30 BST
        ("last", ["2026-10-25T01:30:00Z"]),  # 01:30 GMT
        ("both", ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"]),
    ],
)
def test_london_fall_back(policy: str, expected: list[str]) -> None:
    rule = cron("30 1 * * *", "Europe/London", ambiguous=policy)
    assert fires(rule, utc(2026, 10, 24, 12), utc(2026, 10, 25, 12)) == expected


def test_london_weekday_rule_through_a_year_fires_once_per_weekday() -> None:
    rule = cron("0 9 * * 1-5", "Europe/London")
    got = fires_after(rule, utc(2026, 1, 1), utc(2027, 1, 1), limit=10_000)
    assert len(got) == 261  # weekdays in 2026
    for at in got:
        local = at.astimezone(sr.zone("Europe/London"))
        assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)


# --- Australia/Lord_Howe (30-minute shift) ------------------------------------------------------


def test_lord_howe_spring_forward_half_hour_gap() -> None:
    window = (utc(2026, 10, 2, 12), utc(2026, 10, 4, 12))
    # 10-03 02:15 LHST (+10:30) = 10-02 15:45Z; 10-04 02:15 does not exist (02:00 -> 02:30):
    # shifted by 30 min to 02:45 LHDT (+11) = 10-03 15:45Z.
    assert fires(cron("15 2 * * *", "Australia/Lord_Howe"), *window) == [
        "2026-10-02T15:45:00Z", "2026-10-03T15:45:00Z"]
    assert fires(cron("15 2 * * *", "Australia/Lord_Howe", nonexistent="skip"), *window) == [
        "2026-10-02T15:45:00Z"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("first", ["2026-04-04T14:45:00Z"]),  # 01:45 LHDT (+11)
        ("last", ["2026-04-04T15:15:00Z"]),  # 01:45 LHST (+10:30)
        ("both", ["2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"]),
    ],
)
def test_lord_howe_fall_back_half_hour_repeat(policy: str, expected: list[str]) -> None:
    rule = cron("45 1 * * *", "Australia/Lord_Howe", ambiguous=policy)
    assert fires(rule, utc(2026, 4, 4, 6), utc(2026, 4, 5, 6)) == expected


def test_lord_howe_every_ten_minutes_across_the_gap() -> None:
    rule = cron("*/10 * * * *", "Australia/Lord_Howe")
    # 01:50 LHST = 15:20Z; 02:00, 02:10, 02:20 missing -> 02:30, 02:40, 02:50 LHDT, which the
    # rule matches anyway: one fire each. From 15:30Z on every 10 minutes.
    assert fires(rule, utc(2026, 10, 3, 15), utc(2026, 10, 3, 16, 10)) == [
        "2026-10-03T15:10:00Z", "2026-10-03T15:20:00Z", "2026-10-03T15:30:00Z",
        "2026-10-03T15:40:00Z", "2026-10-03T15:50:00Z", "2026-10-03T16:00:00Z",
        "2026-10-03T16:10:00Z"]


def test_lord_howe_every_twenty_minutes_shifted_fires_interleave() -> None:
    rule = cron("*/20 * * * *", "Australia/Lord_Howe")
    # 02:00 -> 02:30 LHDT (15:30Z), 02:20 -> 02:50 LHDT (15:50Z), real 02:40 LHDT = 15:40Z.
    assert fires(rule, utc(2026, 10, 3, 15), utc(2026, 10, 3, 16)) == [
        "2026-10-03T15:10:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:40:00Z",
        "2026-10-03T15:50:00Z", "2026-10-03T16:00:00Z"]
    assert fires(rule, utc(2026, 10, 3, 15), utc(2026, 10, 3, 16), limit=3) == [
        "2026-10-03T15:10:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:40:00Z"]


def test_lord_howe_half_hourly_fall_back() -> None:
    window = (utc(2026, 4, 4, 13, 30), utc(2026, 4, 4, 16))
    # 01:00 LHDT 14:00Z, 01:30 LHDT 14:30Z, 01:30 LHST 15:00Z (repeat), 02:00 LHST 15:30Z.
    assert fires(cron("*/30 * * * *", "Australia/Lord_Howe", ambiguous="both"), *window) == [
        "2026-04-04T14:00:00Z", "2026-04-04T14:30:00Z", "2026-04-04T15:00:00Z",
        "2026-04-04T15:30:00Z", "2026-04-04T16:00:00Z"]
    assert fires(cron("*/30 * * * *", "Australia/Lord_Howe"), *window) == [
        "2026-04-04T14:00:00Z", "2026-04-04T14:30:00Z", "2026-04-04T15:30:00Z",
        "2026-04-04T16:00:00Z"]
    # Hourly: no wall time on the hour repeats, so 01:00 LHDT then 02:00 LHST, 90 min apart.
    assert fires(cron("0 * * * *", "Australia/Lord_Howe"), *window) == [
        "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z"]


def test_lord_howe_every_minute_spring_is_continuous_for_both_policies() -> None:
    start, end = utc(2026, 10, 3, 15), utc(2026, 10, 3, 16)
    for policy in ("shift_forward", "skip"):
        rule = cron("* * * * *", "Australia/Lord_Howe", nonexistent=policy)
        assert fires_after(rule, start - US, end, limit=1000) == minutes_between(start, end)


def test_lord_howe_every_minute_fall_back_first_skips_the_repeated_half_hour() -> None:
    start, end = utc(2026, 4, 4, 14), utc(2026, 4, 4, 16)
    rule = cron("* * * * *", "Australia/Lord_Howe")
    assert fires_after(rule, start - US, end, limit=1000) == minutes_between(
        start, utc(2026, 4, 4, 14, 59)) + minutes_between(utc(2026, 4, 4, 15, 30), end)
    both = cron("* * * * *", "Australia/Lord_Howe", ambiguous="both")
    assert fires_after(both, start - US, end, limit=1000) == minutes_between(start, end)


# --- other zones, seconds, day rules ------------------------------------------------------------


def test_fixed_offset_zones() -> None:
    assert fires(cron("0 9 * * *", "Asia/Kolkata"), utc(2026, 3, 1), utc(2026, 3, 3)) == [
        "2026-03-01T03:30:00Z", "2026-03-02T03:30:00Z"]
    # St. John's: -03:30 standard, -02:30 daylight; spring forward 2026-03-08 02:00 local.
    rule = cron("30 2 * * *", "America/St_Johns")
    assert fires(rule, utc(2026, 3, 7), utc(2026, 3, 10)) == [
        "2026-03-07T06:00:00Z", "2026-03-08T06:00:00Z", "2026-03-09T05:00:00Z"]


def test_six_field_rules_have_a_seconds_field() -> None:
    every15 = cron("*/15 * * * * *")
    assert fires(every15, utc(2026, 1, 1), utc(2026, 1, 1, 0, 1)) == [
        "2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z", "2026-01-01T00:00:45Z",
        "2026-01-01T00:01:00Z"]
    daily = cron("30 0 9 * * *", "Europe/London")
    assert fires(daily, utc(2026, 7, 1), utc(2026, 7, 2)) == ["2026-07-01T08:00:30Z"]
    # In the New York gap: 02:30:00/20/40 do not exist -> 03:30:00/20/40 EDT.
    gap = cron("*/20 30 2 * * *", "America/New_York")
    assert fires(gap, utc(2026, 3, 8), utc(2026, 3, 9)) == [
        "2026-03-08T07:30:00Z", "2026-03-08T07:30:20Z", "2026-03-08T07:30:40Z"]
    # In the repeated hour, "both" fires each second at both instants.
    rep = cron("0,30 15 1 * * *", "America/New_York", ambiguous="both")
    assert fires(rep, utc(2026, 11, 1), utc(2026, 11, 2)) == [
        "2026-11-01T05:15:00Z", "2026-11-01T05:15:30Z", "2026-11-01T06:15:00Z",
        "2026-11-01T06:15:30Z"]


def test_day_of_month_and_day_of_week_are_ored_unless_one_starts_with_a_star() -> None:
    ored = cron("0 0 13 * FRI")  # the 13th, and every Friday
    assert fires(ored, utc(2026, 2, 1), utc(2026, 2, 28)) == [
        "2026-02-06T00:00:00Z", "2026-02-13T00:00:00Z", "2026-02-20T00:00:00Z",
        "2026-02-27T00:00:00Z"]
    anded = cron("0 0 */10 * MON")  # days 1, 11, 21, 31 that are Mondays
    assert fires(anded, utc(2026, 1, 1), utc(2026, 12, 31)) == [
        "2026-05-11T00:00:00Z", "2026-06-01T00:00:00Z", "2026-08-31T00:00:00Z",
        "2026-09-21T00:00:00Z", "2026-12-21T00:00:00Z"]


def test_last_day_and_nth_weekday() -> None:
    assert fires(cron("0 12 L 2 *"), utc(2027, 1, 1), utc(2029, 1, 1)) == [
        "2027-02-28T12:00:00Z", "2028-02-29T12:00:00Z"]
    assert fires(cron("0 8 * * MON#2"), utc(2026, 1, 1), utc(2026, 3, 31)) == [
        "2026-01-12T08:00:00Z", "2026-02-09T08:00:00Z", "2026-03-09T08:00:00Z"]
    assert fires(cron("0 8 * * 5L"), utc(2026, 1, 1), utc(2026, 2, 28)) == [
        "2026-01-30T08:00:00Z", "2026-02-27T08:00:00Z"]


def test_a_one_value_range_with_a_step_is_that_value() -> None:
    # cronsim alone reads "2-2/1" as "2/1" (Tuesday to Saturday); every other cron reads {2}.
    assert fires(cron("0 0 * * 2-2/1"), utc(2026, 3, 1), utc(2026, 3, 15)) == [
        "2026-03-03T00:00:00Z", "2026-03-10T00:00:00Z"]
    assert fires(cron("05-5/2 0 * * tue-TUE/3"), utc(2026, 3, 1), utc(2026, 3, 8)) == [
        "2026-03-03T00:05:00Z"]
    assert cron("5-5/2 * * * *").cron == "5-5/2 * * * *"  # stored as written


def test_a_rare_rule_is_found_years_ahead() -> None:
    rule = cron("0 0 29 2 *", "Europe/London")
    assert next_fire(rule, utc(2026, 3, 1)) == utc(2028, 2, 29)


# --- interval rules -----------------------------------------------------------------------------


def test_interval_rules_are_anchored_at_start_at() -> None:
    rule = parse_rule({"interval_ms": 90_000, "start_at": "2026-01-01T00:00:10.250Z"})
    assert rule.kind is RuleKind.INTERVAL
    got = fires_after(rule, utc(2025, 1, 1), utc(2026, 1, 1, 0, 5), limit=10)
    start = utc(2026, 1, 1, 0, 0, 10) + dt.timedelta(milliseconds=250)
    assert got == [start + k * dt.timedelta(seconds=90) for k in range(4)]
    # after = a fire: strictly later ones only.
    assert fires_after(rule, start, utc(2026, 1, 1, 0, 5), limit=1) == [
        start + dt.timedelta(seconds=90)]
    assert next_fire(rule, start - US) == start


def test_interval_rules_ignore_the_time_zone() -> None:
    base = {"interval_ms": 3_600_000, "start_at": "2026-03-08T00:00:00Z"}
    ny = parse_rule({**base, "timezone": "America/New_York"})
    assert fires_after(ny, utc(2026, 3, 8), utc(2026, 3, 8, 10), limit=100) == [
        utc(2026, 3, 8, h) for h in range(1, 11)]


def test_interval_without_start_at_is_aligned_to_the_epoch() -> None:
    rule = parse_rule({"interval_ms": 60_000})
    assert fires_after(rule, utc(2026, 5, 5, 12, 0, 30), utc(2026, 5, 5, 12, 3), limit=10) == [
        utc(2026, 5, 5, 12, 1), utc(2026, 5, 5, 12, 2), utc(2026, 5, 5, 12, 3)]
    odd = parse_rule({"interval_ms": 7_000})
    got = fires_after(odd, utc(2026, 5, 5), utc(2026, 5, 5, 0, 0, 30), limit=10)
    assert all(int(t.timestamp()) % 7 == 0 for t in got)
    assert len(got) == 4


def test_interval_end_at_is_exclusive() -> None:
    rule = parse_rule({"interval_ms": 1000, "start_at": "2026-01-01T00:00:00Z",
                       "end_at": "2026-01-01T00:00:03Z"})
    assert fires_after(rule, utc(2025, 12, 31), utc(2026, 1, 2), limit=100) == [
        utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 1), utc(2026, 1, 1, 0, 0, 2)]
    assert next_fire(rule, utc(2026, 1, 1, 0, 0, 2)) is None


# --- bounds, limits, arguments ------------------------------------------------------------------


def test_cron_bounds_start_inclusive_end_exclusive() -> None:
    rule = cron("0 * * * *", "Europe/London", start_at="2026-06-01T10:00:00Z",
                end_at="2026-06-01T13:00:00Z")
    assert fires(rule, utc(2026, 6, 1), utc(2026, 6, 2)) == [
        "2026-06-01T10:00:00Z", "2026-06-01T11:00:00Z", "2026-06-01T12:00:00Z"]
    assert next_fire(rule, utc(2026, 6, 1, 12)) is None
    assert next_fire(rule, utc(2020, 1, 1)) == utc(2026, 6, 1, 10)


def test_sub_second_bounds() -> None:
    rule = cron("* * * * * *", start_at="2026-06-01T10:00:00.5Z", end_at="2026-06-01T10:00:03.5Z")
    assert fires(rule, utc(2026, 6, 1), utc(2026, 6, 2)) == [
        "2026-06-01T10:00:01Z", "2026-06-01T10:00:02Z", "2026-06-01T10:00:03Z"]
    plain = cron("* * * * * *")
    after = utc(2026, 6, 1, 10) + dt.timedelta(milliseconds=1)
    assert fires_after(plain, after, after + dt.timedelta(seconds=2), limit=10) == [
        utc(2026, 6, 1, 10, 0, 1), utc(2026, 6, 1, 10, 0, 2)]
    # after excluded, until included.
    assert fires_after(plain, utc(2026, 6, 1, 10), utc(2026, 6, 1, 10, 0, 1), limit=10) == [
        utc(2026, 6, 1, 10, 0, 1)]


def test_limit_and_empty_windows() -> None:
    rule = cron("*/5 * * * *", "America/New_York")
    assert len(fires_after(rule, utc(2026, 1, 1), utc(2026, 1, 2), limit=7)) == 7
    assert fires_after(rule, utc(2026, 1, 2), utc(2026, 1, 1), limit=7) == []
    with pytest.raises(ValueError, match="limit"):
        fires_after(rule, utc(2026, 1, 1), utc(2026, 1, 2), limit=0)


def test_naive_datetimes_are_refused() -> None:
    rule = cron("* * * * *")
    naive = dt.datetime(2026, 1, 1)  # noqa: DTZ001 -- the point of the test
    with pytest.raises(ValueError, match="aware"):
        fires_after(rule, naive, utc(2026, 1, 2), limit=1)
    with pytest.raises(ValueError, match="aware"):
        next_fire(rule, naive)
    with pytest.raises(ValueError, match="aware"):
        Rule(kind="cron", cron="* * * * *", start_at=naive)


def test_results_are_utc_and_other_offsets_are_accepted() -> None:
    rule = cron("0 9 * * *", "Asia/Kolkata")
    ist = dt.timezone(dt.timedelta(hours=5, minutes=30))
    got = fires_after(rule, dt.datetime(2026, 3, 1, tzinfo=ist),
                      dt.datetime(2026, 3, 2, 12, tzinfo=ist), limit=5)
    assert got == [utc(2026, 3, 1, 3, 30), utc(2026, 3, 2, 3, 30)]
    assert all(t.tzinfo is UTC for t in got)


def test_pagination_matches_one_call_across_transitions() -> None:
    rule = cron("*/7 0-3 * * *", "Australia/Lord_Howe", ambiguous="both")
    after, until = utc(2026, 4, 3), utc(2026, 4, 6)
    whole = fires_after(rule, after, until, limit=10_000)
    paged: list[dt.datetime] = []
    while batch := fires_after(rule, paged[-1] if paged else after, until, limit=4):
        paged += batch
    assert paged == whole
    assert len(whole) == len(set(whole)) == sorted(whole).__len__()


def test_next_fire_gives_up_after_the_horizon() -> None:
    rule = cron("0 0 * * *", end_at="2026-01-01T00:00:00Z")
    assert next_fire(rule, utc(2026, 1, 1)) is None
    assert next_fire(cron("0 0 1 1 *"), utc(8999, 6, 1)) is None


# --- jitter -------------------------------------------------------------------------------------


def test_jitter_is_deterministic_and_bounded() -> None:
    rule = cron("* * * * *", jitter_ms=30_000)
    sid = bytes(range(16))
    at = utc(2026, 1, 1, 9)
    first = jitter_for(rule, sid, at)
    assert first == jitter_for(rule, sid, at) == jitter_for(
        parse_rule(rule_to_json(rule)), sid, at)
    # Pinned so a refactor cannot silently move every schedule's due times.
    assert first == dt.timedelta(milliseconds=8_437)
    spread = {jitter_for(rule, sid, at + k * MINUTE) for k in range(200)}
    assert all(dt.timedelta(0) <= j <= dt.timedelta(seconds=30) for j in spread)
    assert len(spread) > 150
    assert jitter_for(rule, bytes(16), at) != first


def test_zero_jitter() -> None:
    assert jitter_for(cron("* * * * *"), bytes(16), utc(2026, 1, 1)) == dt.timedelta(0)


def test_jitter_can_reach_both_ends() -> None:
    rule = cron("* * * * *", jitter_ms=1)
    seen = {jitter_for(rule, bytes(16), utc(2026, 1, 1) + k * MINUTE) for k in range(64)}
    assert seen == {dt.timedelta(0), dt.timedelta(milliseconds=1)}


# --- JSON documents -----------------------------------------------------------------------------


def test_round_trip_with_every_field() -> None:
    doc = {"cron": "0 9 * * 1-5", "timezone": "Europe/London", "calendar_version": "2025b",
           "start_at": "2026-01-01T00:00:00Z", "end_at": "2027-01-01T00:00:00.250000Z",
           "nonexistent": "skip", "ambiguous": "both", "jitter_ms": 1500}
    rule = parse_rule(doc)
    assert rule_to_json(rule) == doc
    assert parse_rule(rule_to_json(rule)) == rule
    assert hash(parse_rule(rule_to_json(rule))) == hash(rule)


def test_defaults_are_written_out() -> None:
    rule = parse_rule({"cron": " 0   9 * *  1-5 ", "timezone": "UTC"})
    assert rule_to_json(rule) == {
        "cron": "0 9 * * 1-5", "timezone": "UTC", "calendar_version": sr.calendar_version(),
        "start_at": None, "end_at": None, "nonexistent": "shift_forward", "ambiguous": "first",
        "jitter_ms": 0}
    interval = parse_rule({"interval_ms": 60_000})
    assert rule_to_json(interval)["timezone"] == "UTC"
    assert "cron" not in rule_to_json(interval)


def test_offsets_in_bounds_are_normalised_to_utc() -> None:
    rule = parse_rule({"interval_ms": 60_000, "start_at": "2026-01-01T09:00:00+05:30"})
    assert rule.start_at == utc(2026, 1, 1, 3, 30)
    assert rule_to_json(rule)["start_at"] == "2026-01-01T03:30:00Z"


def test_evolve_keeps_the_rule_valid_and_compiled() -> None:
    rule = cron("30 2 * * *", "America/New_York")
    moved = attrs.evolve(rule, calendar_version="2030a", nonexistent="skip")
    assert moved.calendar_version == "2030a"
    assert fires(moved, utc(2026, 3, 8), utc(2026, 3, 9)) == []
    with pytest.raises(ValueError, match="unknown time zone"):
        attrs.evolve(rule, timezone="Nowhere/Land")


def problems(doc: Any, path: str = "$.rule") -> list[dict[str, str]]:
    with pytest.raises(errors.ValidationFailed) as caught:
        parse_rule(doc, path=path)
    assert caught.value.status == 400
    return caught.value.errors


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        (None, "$.rule", "a rule is required: an object with cron or interval_ms"),
        ([], "$.rule", "expected a JSON object (a rule)"),
        ({"cron": "* * * * *", "interval_ms": 1000}, "$.rule",
         "give either cron or interval_ms, not both"),
        ({"timezone": "UTC"}, "$.rule",
         "a rule needs cron (a cron expression) or interval_ms (a fixed interval)"),
        ({"cron": 5, "timezone": "UTC"}, "$.rule.cron", "expected a string (a cron expression)"),
        ({"cron": "* * * *", "timezone": "UTC"}, "$.rule.cron",
         "a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 "
         "(a leading seconds field); this one has 4"),
        ({"cron": "61 * * * *", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the minute field '61' is not valid"),
        ({"cron": "0 24 * * *", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the hour field '24' is not valid"),
        ({"cron": "60 0 0 * * *", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the second field '60' is not valid"),
        ({"cron": "0 0 31 2 *", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the day-of-month field '31' is not valid or never occurs "
         "in the chosen months"),
        ({"cron": "0 0 * 13 *", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the month field '13' is not valid"),
        ({"cron": "0 0 * * FUNDAY", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the day-of-week field 'FUNDAY' is not valid"),
        ({"cron": "*/0 * * * *", "timezone": "UTC"}, "$.rule.cron",
         "malformed cron expression: the minute field '*/0' is not valid"),
        ({"cron": "0 9 * * *"}, "$.rule.timezone",
         "a cron rule needs a timezone: an IANA name such as 'Europe/London', or 'UTC'"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus_Mons"}, "$.rule.timezone",
         "unknown time zone 'Mars/Olympus_Mons': expected an IANA name such as 'Europe/London' "
         "or 'UTC'"),
        ({"cron": "0 9 * * *", "timezone": "europe/london"}, "$.rule.timezone",
         "unknown time zone 'europe/london': expected an IANA name such as 'Europe/London' or "
         "'UTC' (did you mean 'Europe/London'?)"),
        ({"cron": "0 9 * * *", "timezone": 1}, "$.rule.timezone",
         "expected a string (an IANA time zone name)"),
        ({"interval_ms": 999}, "$.rule.interval_ms",
         "interval_ms must be between 1000 (one second) and 31622400000 (366 days); got 999"),
        ({"interval_ms": 1000.0}, "$.rule.interval_ms",
         "expected an integer number of milliseconds"),
        ({"interval_ms": True}, "$.rule.interval_ms",
         "expected an integer number of milliseconds"),
        ({"interval_ms": 1000, "start_at": "2026-01-01 00:00:00"}, "$.rule.start_at",
         "expected an RFC 3339 timestamp with an offset, such as '2026-01-01T09:00:00Z', or "
         "null"),
        ({"interval_ms": 1000, "end_at": "2026-01-01T00:00:00"}, "$.rule.end_at",
         "expected an RFC 3339 timestamp with an offset, such as '2026-01-01T09:00:00Z', or "
         "null"),
        ({"interval_ms": 1000, "start_at": "2026-02-30T00:00:00Z"}, "$.rule.start_at",
         "expected an RFC 3339 timestamp with an offset, such as '2026-01-01T09:00:00Z', or "
         "null"),
        ({"interval_ms": 1000, "start_at": "1800-01-01T00:00:00Z"}, "$.rule.start_at",
         "out of the supported range: years 1900 to 8999"),
        ({"interval_ms": 1000, "start_at": "2026-01-02T00:00:00Z",
          "end_at": "2026-01-02T00:00:00Z"}, "$.rule.end_at", "end_at must be later than start_at"),
        ({"interval_ms": 1000, "nonexistent": "later"}, "$.rule.nonexistent",
         "expected one of 'shift_forward', 'skip'"),
        ({"interval_ms": 1000, "ambiguous": "second"}, "$.rule.ambiguous",
         "expected one of 'first', 'last', 'both'"),
        ({"interval_ms": 1000, "jitter_ms": 3_600_001}, "$.rule.jitter_ms",
         "jitter_ms must be between 0 and 3600000 (one hour); got 3600001"),
        ({"interval_ms": 1000, "jitter_ms": -1}, "$.rule.jitter_ms",
         "jitter_ms must be between 0 and 3600000 (one hour); got -1"),
        ({"interval_ms": 1000, "jitter_ms": "5"}, "$.rule.jitter_ms",
         "expected an integer number of milliseconds"),
        ({"interval_ms": 1000, "calendar_version": ""}, "$.rule.calendar_version",
         "expected a tz database version such as '2026a'"),
        ({"interval_ms": 1000, "every": "day"}, "$.rule.every", "unknown field"),
    ],
)
def test_parse_errors(doc: Any, path: str, message: str) -> None:
    found = problems(doc)
    assert {"path": path, "message": message} in found, found


def test_every_problem_is_reported_at_once_under_the_callers_path() -> None:
    found = problems({"cron": "99 * * * *", "timezone": "Atlantis", "jitter_ms": -5,
                      "ambiguous": "never", "colour": "blue"}, path="$.versions[2].rule")
    assert [p["path"] for p in found] == [
        "$.versions[2].rule.colour", "$.versions[2].rule.cron", "$.versions[2].rule.timezone",
        "$.versions[2].rule.ambiguous", "$.versions[2].rule.jitter_ms"]


def test_rule_constructor_refuses_inconsistent_rules() -> None:
    with pytest.raises(ValueError, match="cron"):
        Rule(kind="cron", interval_ms=1000)
    with pytest.raises(ValueError, match="interval"):
        Rule(kind="interval", cron="* * * * *")
    with pytest.raises(ValueError, match="malformed"):
        Rule(kind="cron", cron="* * * * 8")
    with pytest.raises(ValueError, match="end_at"):
        Rule(kind="interval", interval_ms=1000, start_at=utc(2026, 1, 2), end_at=utc(2026, 1, 1))
    with pytest.raises(ValueError, match="jitter"):
        Rule(kind="interval", interval_ms=1000, jitter_ms=True)
    with pytest.raises(ValueError, match="'late'"):
        Rule(kind="cron", cron="* * * * *", ambiguous="late")
    assert Rule(kind="cron", cron="* * * * *").ambiguous is AmbiguousPolicy.FIRST


# --- the tz database facts the algorithm relies on ----------------------------------------------


def _explicit_transitions(name: str) -> list[int]:
    from zoneinfo._zoneinfo import (  # type: ignore[import-not-found]
        ZoneInfo as PyZoneInfo,  # the pure-Python twin, which exposes its transition list
    )

    resource = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
    with resource.open("rb") as fobj:
        return list(PyZoneInfo.from_file(fobj, key=name)._trans_utc)


def test_tz_database_transitions_are_far_apart_and_small() -> None:
    """Transitions listed in any zone since 1900 are > 12 h apart (the sampling step) and move
    the clock by at most 24 h (the look-back margin is 26 h)."""
    closest, largest = 10**12, 0
    for name in sorted(sr.timezones()):
        tz = sr.zone(name)
        real = []
        for at in _explicit_transitions(name):
            if at < -2_208_988_800:  # 1900
                continue
            before = dt.datetime.fromtimestamp(at - 1, tz).utcoffset()
            after = dt.datetime.fromtimestamp(at, tz).utcoffset()
            if before != after:
                assert before is not None
                assert after is not None
                real.append(at)
                largest = max(largest, abs(int((after - before).total_seconds())))
        closest = min([closest, *(b - a for a, b in itertools.pairwise(real))])
    assert closest > sr._SAMPLE_S
    assert largest <= 24 * 3600 < sr._MAX_SHIFT_S


@pytest.mark.parametrize(
    "name",
    ["America/New_York", "Europe/London", "Australia/Lord_Howe", "America/St_Johns",
     "Antarctica/Troll", "Africa/Casablanca", "Asia/Gaza", "Pacific/Apia", "Asia/Kolkata",
     "UTC"],
)
def test_sampled_transitions_match_an_hourly_scan(name: str) -> None:
    tz = sr.zone(name)
    years = (2011, 2024, 2026, 2027) if name == "Pacific/Apia" else (2024, 2026, 2027)
    for year in years:
        start = int(utc(year, 1, 1).timestamp())
        end = int(utc(year + 1, 1, 1).timestamp())
        expected = []
        previous = dt.datetime.fromtimestamp(start, tz).utcoffset()
        for hour in range(start + 3600, end + 1, 3600):
            offset = dt.datetime.fromtimestamp(hour, tz).utcoffset()
            if offset != previous:
                at = hour - 3600
                while dt.datetime.fromtimestamp(at, tz).utcoffset() == previous:
                    at += 60
                assert offset is not None
                expected.append((at, int(offset.total_seconds())))
                previous = offset
        assert list(sr._transitions(name, year)) == expected, (name, year)

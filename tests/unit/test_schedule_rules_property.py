"""Property tests of schedule_rules against an independent brute-force reference.

The reference never uses the implementation's segment walk, the zone's fold semantics or
cronsim: it walks UTC minutes through the window, converts each to the zone's wall clock, records
which wall times occur at which instants (and which are jumped over), matches wall times against
the cron fields by sets computed here from the generated field terms, and applies the documented
policies. Only the zone data is shared (``schedule_rules.zone``: the tzdata package).
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.pulse import schedule_rules as sr

UTC = dt.UTC
EPOCH_NAIVE = dt.datetime(1970, 1, 1)  # noqa: DTZ001 -- wall-clock arithmetic
ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "UTC", "Asia/Kolkata",
         "America/St_Johns"]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- cron fields: generated as terms, rendered as text, matched by sets computed here ----------

FIELD_RANGES = {"second": (0, 59), "minute": (0, 59), "hour": (0, 23), "dom": (1, 31),
                "month": (1, 12), "dow": (0, 7)}
DOW_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


@attrs.frozen
class Field:
    text: str
    values: frozenset[int]
    last_day: bool = False  # day-of-month "L"
    nth: frozenset[tuple[int, int]] = frozenset()  # day-of-week "d#n"
    last_weekday: frozenset[int] = frozenset()  # day-of-week "dL"


@st.composite
def numeric_term(draw: Any, kind: str) -> tuple[str, set[int]]:
    lo, hi = FIELD_RANGES[kind]
    shape = draw(st.sampled_from(["value", "range", "range_step", "start_step", "star_step"]))
    a = draw(st.integers(lo, hi))
    if shape == "value":
        return str(a), {a}
    if shape == "star_step":
        step = draw(st.integers(1, hi - lo + 1))
        return f"*/{step}", set(range(lo, hi + 1)[::step])
    if shape == "start_step":
        step = draw(st.integers(1, hi - lo + 1))
        return f"{a}/{step}", set(range(a, hi + 1)[::step])
    b = draw(st.integers(a, hi))
    if shape == "range":
        return f"{a}-{b}", set(range(a, b + 1))
    step = draw(st.integers(1, hi - lo + 1))
    return f"{a}-{b}/{step}", set(range(a, b + 1)[::step])


@st.composite
def numeric_field(draw: Any, kind: str, star_weight: int = 1) -> Field:
    lo, hi = FIELD_RANGES[kind]
    if draw(st.integers(0, star_weight)) > 0:
        return Field("*", frozenset(range(lo, hi + 1)))
    terms = draw(st.lists(numeric_term(kind), min_size=1, max_size=3))
    values: set[int] = set()
    for _, term_values in terms:
        values |= term_values
    return Field(",".join(text for text, _ in terms), frozenset(values))


@st.composite
def dom_field(draw: Any) -> Field:
    base: Field = draw(numeric_field("dom", star_weight=5))
    if base.text != "*" and draw(st.booleans()) and draw(st.booleans()):
        return Field(base.text + ",L", base.values, last_day=True)
    if draw(st.integers(0, 9)) == 0:
        return Field("L", frozenset(), last_day=True)
    return base


@st.composite
def dow_field(draw: Any) -> Field:
    choice = draw(st.integers(0, 11))
    if choice < 7:
        return Field("*", frozenset(range(8)))
    if choice == 7:
        a = draw(st.integers(0, 6))
        b = draw(st.integers(a, 6))
        return Field(f"{DOW_NAMES[a]}-{DOW_NAMES[b]}", frozenset(range(a, b + 1)))
    if choice == 8:
        day, n = draw(st.integers(0, 7)), draw(st.integers(1, 5))
        return Field(f"{day}#{n}", frozenset(), nth=frozenset({(day % 7, n)}))
    if choice == 9:
        day = draw(st.integers(0, 7))
        return Field(f"{day}L", frozenset(), last_weekday=frozenset({day % 7}))
    field: Field = draw(numeric_field("dow", star_weight=0))
    return field


@attrs.frozen
class Cron:
    second: Field | None  # None: a 5-field expression (second 0)
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field

    @property
    def text(self) -> str:
        fields = [self.minute, self.hour, self.dom, self.month, self.dow]
        return " ".join(f.text for f in ([self.second, *fields] if self.second else fields))

    @property
    def seconds(self) -> frozenset[int]:
        return self.second.values if self.second else frozenset({0})

    def day_matches(self, day: dt.date) -> bool:
        last = calendar.monthrange(day.year, day.month)[1]
        dom_ok = day.day in self.dom.values or (self.dom.last_day and day.day == last)
        cron_dow = (day.weekday() + 1) % 7  # Sunday 0
        dow_ok = (
            cron_dow in self.dow.values
            or (cron_dow == 0 and 7 in self.dow.values)
            or (cron_dow, (day.day + 6) // 7) in self.dow.nth
            or (cron_dow in self.dow.last_weekday and day.day + 7 > last)
        )
        if self.dom.text.startswith("*") or self.dow.text.startswith("*"):
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def minute_matches(self, wall: dt.datetime) -> bool:
        return (wall.minute in self.minute.values and wall.hour in self.hour.values
                and wall.month in self.month.values and self.day_matches(wall.date()))


def possible(cron: Cron) -> bool:
    """False for the rules cron refuses: an ANDed day-of-month no chosen month reaches."""
    if cron.dom.last_day or not (cron.dom.text.startswith("*") or cron.dow.text.startswith("*")):
        return True
    longest = max(calendar.monthrange(2024, month)[1] for month in cron.month.values)
    return min(cron.dom.values) <= longest


@st.composite
def crons(draw: Any, with_seconds: bool) -> Cron:
    cron: Cron = draw(_crons(with_seconds).filter(possible))
    return cron


@st.composite
def _crons(draw: Any, with_seconds: bool) -> Cron:
    return Cron(
        second=draw(numeric_field("second", star_weight=0)) if with_seconds else None,
        minute=draw(numeric_field("minute", star_weight=1)),
        hour=draw(numeric_field("hour", star_weight=3)),
        dom=draw(dom_field()),
        month=draw(numeric_field("month", star_weight=12)),
        dow=draw(dow_field()),
    )


# --- the reference -----------------------------------------------------------------------------


def wall_seconds(wall: dt.datetime) -> int:
    return int((wall - EPOCH_NAIVE).total_seconds())


def reference(cron: Cron, zone_name: str, nonexistent: str, ambiguous: str, after: dt.datetime,
              until: dt.datetime, start_at: dt.datetime | None, end_at: dt.datetime | None,
              limit: int) -> list[dt.datetime]:
    """Brute force over UTC minutes [after - 3 h, until + 3 h] (the zones here change offset
    by whole minutes, on minute boundaries, by at most an hour)."""
    tz = sr.zone(zone_name)
    lo, hi = int(after.timestamp()), int(until.timestamp())
    first = (lo - 3 * 3600) // 60 * 60
    occurrences: dict[dt.datetime, list[int]] = {}  # wall minute -> UTC instants, ascending
    jumped: dict[dt.datetime, int] = {}  # wall minute never shown -> offset before the jump
    previous: tuple[dt.datetime, int] | None = None
    for at in range(first, hi + 3 * 3600, 60):
        local = dt.datetime.fromtimestamp(at, tz)
        offset = local.utcoffset()
        assert offset is not None
        assert offset.total_seconds() % 60 == 0
        wall = local.replace(tzinfo=None)
        occurrences.setdefault(wall, []).append(at)
        if previous is not None:
            missing = previous[0] + dt.timedelta(minutes=1)
            while missing < wall:
                jumped[missing] = previous[1]
                missing += dt.timedelta(minutes=1)
        previous = (wall, int(offset.total_seconds()))

    def in_window(at: int) -> bool:
        return lo - 7200 <= at <= hi + 7200

    found: set[int] = set()
    for wall, instants in occurrences.items():
        if not any(in_window(at) for at in instants) or not cron.minute_matches(wall):
            continue
        chosen = {"first": instants[:1], "last": instants[-1:], "both": instants}[ambiguous]
        found.update(at + s for at in chosen for s in cron.seconds)
    if nonexistent == "shift_forward":
        for wall, before in jumped.items():
            shifted = wall_seconds(wall) - before
            if in_window(shifted) and cron.minute_matches(wall):
                found.update(shifted + s for s in cron.seconds)
    out = []
    for at in sorted(found):
        instant = dt.datetime.fromtimestamp(at, UTC)
        if not after < instant <= until:
            continue
        if start_at is not None and instant < start_at:
            continue
        if end_at is not None and instant >= end_at:
            continue
        out.append(instant)
    return out[:limit]


@functools.cache
def transitions_of(zone_name: str) -> tuple[dt.datetime, ...]:
    """Offset changes 2025-2027, found by an hourly scan (independent of the implementation)."""
    tz = sr.zone(zone_name)
    found = []
    at = dt.datetime(2025, 1, 1, tzinfo=UTC)
    previous = at.astimezone(tz).utcoffset()
    while at.year < 2028:
        at += dt.timedelta(hours=1)
        offset = at.astimezone(tz).utcoffset()
        if offset != previous:
            found.append(at)
            previous = offset
    return tuple(found)


@st.composite
def windows(draw: Any, zone_name: str, max_hours: int) -> tuple[dt.datetime, dt.datetime]:
    known = transitions_of(zone_name)
    if known and draw(st.integers(0, 4)) > 0:
        centre = draw(st.sampled_from(known))
    else:
        centre = dt.datetime(2025, 1, 1, tzinfo=UTC) + dt.timedelta(
            hours=draw(st.integers(0, 3 * 365 * 24)))
    reach = draw(st.sampled_from([600, 3600, 4 * 3600, 36 * 3600]))
    after = centre + dt.timedelta(seconds=draw(st.integers(-reach, reach // 4)))
    if draw(st.booleans()):
        after = after.replace(second=0, microsecond=0)  # lands exactly on candidates
    else:
        after += dt.timedelta(microseconds=draw(st.integers(0, 999_999)))
    # Hypothesis favours small integers; pick the window's scale explicitly.
    scale = draw(st.sampled_from([0.02, 0.25, 1, 3, 8, 24, 48]))
    span_s = int(min(scale, max_hours) * 3600) + draw(st.integers(1, 900))
    return after, after + dt.timedelta(seconds=span_s)


@st.composite
def cases(draw: Any, with_seconds: bool) -> dict[str, Any]:
    zone_name = draw(st.sampled_from(ZONES))
    after, until = draw(windows(zone_name, max_hours=4 if with_seconds else 48))
    start_at = end_at = None
    if draw(st.sampled_from([True, False, False, False])):
        start_at = after + dt.timedelta(seconds=draw(st.integers(-3600, 6 * 3600)))
    if draw(st.sampled_from([True, False, False, False])):
        end_at = until - dt.timedelta(seconds=draw(st.integers(-3600, 6 * 3600)))
        if start_at is not None and end_at <= start_at:
            end_at = None
    return {
        "cron": draw(crons(with_seconds)),
        "zone": zone_name,
        "nonexistent": draw(st.sampled_from(["shift_forward", "skip"])),
        "ambiguous": draw(st.sampled_from(["first", "last", "both"])),
        "after": after, "until": until, "start_at": start_at, "end_at": end_at,
        "limit": draw(st.sampled_from([1, 2, 3, 7, 50, 100_000])),
    }


def check_against_reference(case: dict[str, Any]) -> None:
    cron: Cron = case["cron"]
    rule = sr.Rule(kind="cron", cron=cron.text, timezone=case["zone"],
                   nonexistent=case["nonexistent"], ambiguous=case["ambiguous"],
                   start_at=case["start_at"], end_at=case["end_at"])
    got = sr.fires_after(rule, case["after"], case["until"], limit=case["limit"])
    expected = reference(cron, case["zone"], case["nonexistent"], case["ambiguous"],
                         case["after"], case["until"], case["start_at"], case["end_at"],
                         case["limit"])
    assert got == expected, (cron.text, case)
    if got:
        assert sr.next_fire(rule, case["after"]) == got[0]


@SETTINGS
@given(cases(with_seconds=False))
def test_five_field_rules_match_the_reference(case: dict[str, Any]) -> None:
    check_against_reference(case)


@settings(SETTINGS, max_examples=120)
@given(cases(with_seconds=True))
def test_six_field_rules_match_the_reference(case: dict[str, Any]) -> None:
    check_against_reference(case)


@pytest.mark.parametrize("zone_name", ["America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize("policies", [("shift_forward", "first"), ("skip", "both"),
                                      ("shift_forward", "last")])
def test_dense_rules_at_every_transition(zone_name: str, policies: tuple[str, str]) -> None:
    """A fixed sweep beside the random one: every-minute and */7 rules over each transition."""
    every = Field("*", frozenset(range(60)))
    sevens = Field("*/7", frozenset(range(0, 60, 7)))
    for minute in (every, sevens):
        cron = Cron(None, minute, Field("*", frozenset(range(24))),
                    Field("*", frozenset(range(1, 32))), Field("*", frozenset(range(1, 13))),
                    Field("*", frozenset(range(8))))
        for centre in transitions_of(zone_name):
            check_against_reference({
                "cron": cron, "zone": zone_name, "nonexistent": policies[0],
                "ambiguous": policies[1], "after": centre - dt.timedelta(hours=3),
                "until": centre + dt.timedelta(hours=3), "start_at": None, "end_at": None,
                "limit": 100_000})


# --- metamorphic properties ---------------------------------------------------------------------


@settings(SETTINGS, max_examples=60)
@given(cases(with_seconds=False), st.integers(1, 5))
def test_paging_with_the_last_fire_as_after_gives_the_same_sequence(
        case: dict[str, Any], page: int) -> None:
    rule = sr.Rule(kind="cron", cron=case["cron"].text, timezone=case["zone"],
                   nonexistent=case["nonexistent"], ambiguous=case["ambiguous"])
    whole = sr.fires_after(rule, case["after"], case["until"], limit=500)
    paged: list[dt.datetime] = []
    while len(paged) < len(whole):
        batch = sr.fires_after(rule, paged[-1] if paged else case["after"], case["until"],
                               limit=page)
        assert batch, "a page ended early"
        paged += batch
    assert paged[: len(whole)] == whole


@settings(SETTINGS, max_examples=200)
@given(
    interval_ms=st.integers(1000, 10 * 86_400_000),
    anchor=st.one_of(st.none(), st.datetimes(min_value=dt.datetime(2000, 1, 1),  # noqa: DTZ001
                                             max_value=dt.datetime(2040, 1, 1),  # noqa: DTZ001
                                             timezones=st.just(UTC))),
    after=st.datetimes(min_value=dt.datetime(2000, 1, 1),  # noqa: DTZ001
                       max_value=dt.datetime(2040, 1, 1),  # noqa: DTZ001
                       timezones=st.just(UTC)),
    span_s=st.integers(0, 40 * 86_400),
    limit=st.integers(1, 20),
)
def test_interval_rules_match_the_definition(interval_ms: int, anchor: dt.datetime | None,
                                             after: dt.datetime, span_s: int,
                                             limit: int) -> None:
    rule = sr.Rule(kind="interval", interval_ms=interval_ms, start_at=anchor)
    until = after + dt.timedelta(seconds=span_s)
    step = dt.timedelta(milliseconds=interval_ms)
    origin = anchor or dt.datetime(1970, 1, 1, tzinfo=UTC)
    k = (after - origin) // step - 1
    if anchor is not None:
        k = max(k, 0)
    expected: list[dt.datetime] = []
    while len(expected) < limit:
        at = origin + k * step
        if at > until:
            break
        if at > after:
            expected.append(at)
        k += 1
    assert sr.fires_after(rule, after, until, limit=limit) == expected


# --- documents ----------------------------------------------------------------------------------

instants = st.datetimes(min_value=dt.datetime(1900, 1, 1),  # noqa: DTZ001
                        max_value=dt.datetime(8999, 12, 31),  # noqa: DTZ001
                        timezones=st.just(UTC))


@st.composite
def rules(draw: Any) -> sr.Rule:
    bounds = sorted(draw(st.lists(instants, min_size=2, max_size=2, unique=True)))
    start_at = bounds[0] if draw(st.booleans()) else None
    end_at = bounds[1] if draw(st.booleans()) else None
    common = {
        "timezone": draw(st.sampled_from(sorted(sr.timezones()))),
        "calendar_version": draw(st.sampled_from(["2024a", "2026f", "2026.6"])),
        "start_at": start_at, "end_at": end_at,
        "nonexistent": draw(st.sampled_from(list(sr.NonexistentPolicy))),
        "ambiguous": draw(st.sampled_from(list(sr.AmbiguousPolicy))),
        "jitter_ms": draw(st.integers(0, sr.MAX_JITTER_MS)),
    }
    if draw(st.booleans()):
        return sr.Rule(kind="cron", cron=draw(crons(draw(st.booleans()))).text, **common)
    return sr.Rule(kind="interval", interval_ms=draw(st.integers(1000, sr.MAX_INTERVAL_MS)),
                   **common)


@settings(SETTINGS, max_examples=100)
@given(rules())
def test_json_round_trip(rule: sr.Rule) -> None:
    doc = sr.rule_to_json(rule)
    assert sr.parse_rule(doc) == rule
    assert sr.rule_to_json(sr.parse_rule(doc)) == doc


@settings(SETTINGS, max_examples=300)
@given(st.text(alphabet="0123456789*/,-#LW?ABCDEFHIJMNORSTUVY \t", max_size=40))
def test_any_cron_text_is_a_rule_or_a_validation_error(text: str) -> None:
    paths: list[str] = []
    try:
        rule = sr.parse_rule({"cron": text, "timezone": "UTC"})
    except errors.ValidationFailed as exc:
        paths = [p["path"] for p in exc.errors]
    if paths:
        assert paths == ["$.rule.cron"]
        return
    sr.fires_after(rule, dt.datetime(2026, 1, 1, tzinfo=UTC),
                   dt.datetime(2026, 1, 3, tzinfo=UTC), limit=5)


@settings(SETTINGS, max_examples=200)
@given(st.binary(min_size=16, max_size=16), instants, st.integers(0, sr.MAX_JITTER_MS))
def test_jitter_is_bounded_and_deterministic(schedule_id: bytes, at: dt.datetime,
                                             jitter_ms: int) -> None:
    rule = sr.Rule(kind="interval", interval_ms=1000, jitter_ms=jitter_ms)
    delay = sr.jitter_for(rule, schedule_id, at)
    assert dt.timedelta(0) <= delay <= dt.timedelta(milliseconds=jitter_ms)
    assert delay == sr.jitter_for(rule, bytes(schedule_id), at)
    assert delay % dt.timedelta(milliseconds=1) == dt.timedelta(0)

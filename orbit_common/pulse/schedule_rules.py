"""Schedule rules: when a recurring schedule fires. Pure time computation, no database.

A rule is frozen into each schedule version (``pulse_schedule_versions.rule``, JSON) by
:func:`rule_to_json` and read back by :func:`parse_rule`; docs/schedules-rules.md is the user
guide. All instants are aware UTC datetimes; naive ones are refused.

Kinds
    ``cron``: a cron expression of 5 fields (minute hour day-of-month month day-of-week,
    second 0) or 6 (a leading seconds field), read in an IANA time zone. cronsim supplies the
    grammar (ranges, steps, lists, names, ``L``, ``LW``, ``5L``, ``MON#2``; day-of-month and
    day-of-week are ANDed when either starts with ``*``, ORed otherwise, as in Vixie cron) and
    the day matching; the wall-clock-to-UTC mapping is done here, because cronsim's own DST
    handling is Debian cron's fixed behaviour, which cannot express per-schedule policies.
    ``interval``: ``anchor + k * interval_ms`` in absolute time (time zone irrelevant), where
    the anchor is ``start_at`` when set and the Unix epoch otherwise (so ``interval_ms: 60000``
    without ``start_at`` fires on every whole UTC minute, like Temporal's interval specs).

The wall clock (cron rules)
    The cron fields select wall-clock times ``w`` (naive, whole seconds). The zone's UTC offset
    is piecewise constant; each wall time occurs at zero, one or two UTC instants:

    * exactly once: fire at ``w - offset``;
    * twice (the repeated hour when clocks go back), ``ambiguous`` policy: ``first`` (default)
      fires at the first occurrence only, ``last`` at the second only, ``both`` at both;
    * never (the hour skipped when clocks go forward), ``nonexistent`` policy:
      ``shift_forward`` (default) fires at ``w - offset_before``, i.e. the wall time moved on
      by the length of the gap (New York 02:30 on a spring-forward day fires at 03:30 EDT; the
      same answer as PEP 495 ``fold=0``, java.time and Temporal's ``compatible``); ``skip``
      does not fire.

    The result is a *set* of instants: a shifted wall time that lands on an instant the rule
    fires at anyway (an hourly rule's 02:00 shifted onto 03:00) fires once. So with the
    defaults an every-minute rule fires every UTC minute through a spring-forward gap, and
    skips the repeated hour when clocks go back; ``ambiguous: both`` keeps firing through it.

Calendar
    Zones are read from the ``tzdata`` package (not the system's copy), so the data is the
    version that :func:`calendar_version` names and that publishing freezes into the rule as
    ``calendar_version``. Computations always use the installed data; the frozen value records
    which tz database a version was published under (compare it with
    :func:`calendar_version` to detect that an upgrade may have moved future fires).

Bounds
    ``start_at`` is inclusive, ``end_at`` exclusive; ``fires_after(after, until)`` returns
    instants ``after < t <= until``. Supported instants lie in years 1900 to 8999.

How the computation works
    The zone's offset transitions are found once per (zone, year) by sampling the offset every
    12 hours and bisecting each change to the second (cached). This relies on two facts of the
    tz database, checked for every zone by tests/unit/test_schedule_rules.py: consecutive
    transitions are more than 12 hours apart and no transition moves the clock by more than
    24 hours. Between transitions the offset is constant, so each such segment maps wall times
    to instants by one subtraction; the transition's neighbours decide whether a wall time is
    a repeat (ambiguous) or missing (nonexistent). A typical call costs tens of microseconds.

Jitter
    :func:`jitter_for` delays a fire by a deterministic ``[0, jitter_ms]`` milliseconds derived
    from SHA-256 of the schedule id and the planned instant: every replica computes the same
    due time. Jitter does not change the occurrence's identity (its planned instant).
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import enum
import functools
import importlib
import importlib.metadata
import importlib.resources
import re
import zoneinfo
from collections.abc import Iterator
from typing import Any, Final, TypeGuard

import attrs
import cronsim

from orbit_common import errors
from orbit_common.model import digests

MIN_INTERVAL_MS: Final = 1_000
MAX_INTERVAL_MS: Final = 366 * 86_400_000
MAX_JITTER_MS: Final = 3_600_000
MAX_CRON_LENGTH: Final = 256
NEXT_FIRE_HORIZON: Final = dt.timedelta(days=50 * 366)  # like cronsim: give up after ~50 years

_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_SECOND = dt.timedelta(seconds=1)
_MICROSECOND = dt.timedelta(microseconds=1)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_DAY_S = 86_400
_MIN_AT = dt.datetime(1900, 1, 1, tzinfo=_UTC)
_MAX_AT = dt.datetime(9000, 1, 1, tzinfo=_UTC)  # exclusive
_MIN_S = (_MIN_AT - _EPOCH) // _SECOND
_MAX_S = (_MAX_AT - _EPOCH) // _SECOND - 1
_FAR_S = 1 << 62
# Sampling step for offset transitions, and the largest clock change: both checked against
# every zone of the installed tz database by the unit tests.
_SAMPLE_S = 43_200
_MAX_SHIFT_S = 26 * 3_600
_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_RFC3339 = re.compile(
    r"\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})\Z"
)
_CALENDAR_VERSION = re.compile(r"\A[0-9A-Za-z][0-9A-Za-z.+-]{0,31}\Z")


class RuleKind(enum.StrEnum):
    CRON = "cron"
    INTERVAL = "interval"


class NonexistentPolicy(enum.StrEnum):
    """What a cron rule does with a wall time skipped when clocks go forward."""

    SHIFT_FORWARD = "shift_forward"  # fire at the wall time moved on by the gap's length
    SKIP = "skip"  # do not fire


class AmbiguousPolicy(enum.StrEnum):
    """What a cron rule does with a wall time repeated when clocks go back."""

    FIRST = "first"  # fire at the first occurrence only
    LAST = "last"  # fire at the second occurrence only
    BOTH = "both"  # fire at both occurrences


# --- the tz database ---------------------------------------------------------------------------


def calendar_version() -> str:
    """The installed tz database release (``tzdata.IANA_VERSION``, e.g. ``"2026f"``)."""
    return _calendar_version()


@functools.cache
def _calendar_version() -> str:
    version = getattr(importlib.import_module("tzdata"), "IANA_VERSION", None)
    return str(version) if version else importlib.metadata.version("tzdata")


@functools.cache
def timezones() -> frozenset[str]:
    """Every zone name the installed ``tzdata`` package provides (``"UTC"`` included)."""
    text = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(text.split())


@functools.cache
def _folded_timezones() -> dict[str, str]:
    return {name.lower(): name for name in timezones()}


def is_known_timezone(name: str) -> bool:
    return isinstance(name, str) and name in timezones()


@functools.cache
def zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone ``name`` from the ``tzdata`` package (never the system's copy, whose version
    is unknown); raises ValueError for a name the package does not hold."""
    if not is_known_timezone(name):
        raise ValueError(f"unknown time zone {name!r}")
    resource = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
    with resource.open("rb") as fobj:
        return zoneinfo.ZoneInfo.from_file(fobj, key=name)


def _offset_at(tz: zoneinfo.ZoneInfo, at_s: int) -> int:
    """UTC offset (seconds) in force at the instant ``at_s`` (Unix seconds)."""
    offset = dt.datetime.fromtimestamp(at_s, tz).utcoffset()
    assert offset is not None  # noqa: S101 -- a ZoneInfo always has an offset
    return offset // _SECOND


def _year_start(year: int) -> int:
    return (dt.date(year, 1, 1).toordinal() - _EPOCH_ORDINAL) * _DAY_S


def _year_of(at_s: int) -> int:
    return dt.date.fromordinal(_EPOCH_ORDINAL + at_s // _DAY_S).year


@functools.lru_cache(maxsize=8192)
def _transitions(name: str, year: int) -> tuple[tuple[int, int], ...]:
    """The offset changes of zone ``name`` at instants in (start of ``year``, start of
    ``year + 1``] UTC, as (instant, offset from then on), ascending."""
    tz = zone(name)
    start, end = _year_start(year), _year_start(year + 1)
    found: list[tuple[int, int]] = []

    def _bisect_change(a: int, off_a: int, b: int, off_b: int) -> None:
        """Append every change in (a, b], given the offsets at a and b."""
        if off_a == off_b:
            return
        if b - a == 1:
            found.append((b, off_b))
            return
        mid = (a + b) // 2
        off_mid = _offset_at(tz, mid)
        _bisect_change(a, off_a, mid, off_mid)
        _bisect_change(mid, off_mid, b, off_b)

    a, off_a = start, _offset_at(tz, start)
    for b in range(start + _SAMPLE_S, end + 1, _SAMPLE_S):
        off_b = _offset_at(tz, b)
        _bisect_change(a, off_a, b, off_b)
        a, off_a = b, off_b
    return tuple(found)


def _transitions_after(name: str, after_s: int, through_s: int) -> Iterator[tuple[int, int]]:
    """Offset changes at instants > ``after_s``, at least through ``through_s``; then a
    sentinel change at a far instant."""
    for year in range(_year_of(after_s), _year_of(through_s) + 1):
        for at_s, offset in _transitions(name, year):
            if at_s > after_s:
                yield at_s, offset
    yield _FAR_S, 0


# --- cron expressions --------------------------------------------------------------------------


_RANGE_STEP = re.compile(r"\A([0-9A-Za-z]+)-([0-9A-Za-z]+)/0*[1-9][0-9]*\Z")


def _for_cronsim(expr: str) -> str:
    """``expr`` with every ``a-a/step`` term written as ``a``: cronsim reads a one-value range
    with a step as ``a/step`` (a to the field's maximum), unlike every other cron."""
    def term(text: str) -> str:
        found = _RANGE_STEP.match(text)
        if found is None:
            return text
        first, last = found.group(1), found.group(2)
        same = (int(first) == int(last) if first.isdigit() and last.isdigit()
                else first.upper() == last.upper())
        return first if same else text

    return " ".join(",".join(term(t) for t in field.split(",")) for field in expr.split())


def _cron_problem(expr: str) -> str | None:
    """Why ``expr`` is not a valid cron expression, or None."""
    if len(expr) > MAX_CRON_LENGTH:
        return f"a cron expression is at most {MAX_CRON_LENGTH} characters"
    parts = expr.split()
    if len(parts) not in (5, 6):
        return ("a cron expression has 5 fields (minute hour day-of-month month day-of-week) "
                f"or 6 (a leading seconds field); this one has {len(parts)}")
    try:
        _CronTable.compile(" ".join(parts))
    except cronsim.CronSimError as exc:
        name = str(exc).removeprefix("Bad ").strip()
        if name in _FIELD_NAMES:
            index = _FIELD_NAMES.index(name) - (6 - len(parts))
            text = parts[index] if 0 <= index < len(parts) else "?"
            hint = (" or never occurs in the chosen months" if name == "day-of-month" else "")
            return f"malformed cron expression: the {name} field {text!r} is not valid{hint}"
        return f"malformed cron expression: {exc}"
    except (ValueError, IndexError, AssertionError) as exc:
        # cronsim raises these for a few malformed inputs instead of CronSimError.
        return f"malformed cron expression: {exc or type(exc).__name__}"
    return None


class _CronTable:
    """A compiled cron expression: the next matching wall time, by bisection over sorted field
    values and a per-month cache of matching days (day matching is cronsim's)."""

    __slots__ = ("_day_cache", "_first_time", "_sim", "hours", "minutes", "months", "seconds")
    _DAY_CACHE_MAX = 240

    def __init__(self, expr: str) -> None:
        self._sim = cronsim.CronSim(_for_cronsim(expr),
                                    dt.datetime(2000, 1, 1))  # noqa: DTZ001 -- wall clock
        self.seconds = tuple(sorted(self._sim.seconds))
        self.minutes = tuple(sorted(self._sim.minutes))
        self.hours = tuple(sorted(self._sim.hours))
        self.months = frozenset(self._sim.months)
        self._first_time = self.hours[0] * 3600 + self.minutes[0] * 60 + self.seconds[0]
        self._day_cache: dict[tuple[int, int], tuple[int, ...]] = {}

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def compile(expr: str) -> _CronTable:
        return _CronTable(expr)

    def _days(self, year: int, month: int) -> tuple[int, ...]:
        key = (year, month)
        days = self._day_cache.get(key)
        if days is None:
            if len(self._day_cache) >= self._DAY_CACHE_MAX:
                self._day_cache.clear()
            last = calendar.monthrange(year, month)[1]
            days = tuple(d for d in range(1, last + 1)
                         if self._sim.match_day(dt.date(year, month, d)))
            self._day_cache[key] = days
        return days

    def _time_at_or_after(self, sod: int) -> int | None:
        """The first matching second of the day at or after ``sod``, or None."""
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        hour, rest = divmod(sod, 3600)
        minute, second = divmod(rest, 60)
        i = bisect.bisect_left(hours, hour)
        if i == len(hours):
            return None
        if hours[i] == hour:
            j = bisect.bisect_left(minutes, minute)
            if j < len(minutes) and minutes[j] == minute:
                k = bisect.bisect_left(seconds, second)
                if k < len(seconds):
                    return hour * 3600 + minute * 60 + seconds[k]
                j += 1
            if j < len(minutes):
                return hour * 3600 + minutes[j] * 60 + seconds[0]
            i += 1
            if i == len(hours):
                return None
        return hours[i] * 3600 + minutes[0] * 60 + seconds[0]

    def next_match(self, wall: int, wall_max: int) -> int | None:
        """The first matching wall time in [wall, wall_max] (seconds since 1970-01-01 on the
        wall clock), or None."""
        day_no, sod = divmod(wall, _DAY_S)
        date = dt.date.fromordinal(_EPOCH_ORDINAL + day_no)
        year, month, day = date.year, date.month, date.day
        while True:
            if month in self.months:
                days = self._days(year, month)
                i = bisect.bisect_left(days, day)
                if i < len(days):
                    found = None
                    if days[i] == day:
                        found = self._time_at_or_after(sod)
                        if found is None:
                            i += 1
                    if found is None and i < len(days):
                        day, found = days[i], self._first_time
                    if found is not None:
                        at = (dt.date(year, month, day).toordinal() - _EPOCH_ORDINAL) * _DAY_S
                        return at + found if at + found <= wall_max else None
            month, day, sod = month + 1, 1, 0
            if month == 13:
                year, month = year + 1, 1
                if year > 9999:
                    return None
            if (dt.date(year, month, 1).toordinal() - _EPOCH_ORDINAL) * _DAY_S > wall_max:
                return None


# --- the rule ----------------------------------------------------------------------------------


def _utc_or_none(value: dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ValueError("bounds are aware datetimes")
    return value.astimezone(_UTC)


@attrs.frozen(kw_only=True)
class Rule:
    """A validated rule (see the module docstring). Build one with :func:`parse_rule` from a
    JSON document, or directly; the constructor raises ValueError for an inconsistent rule."""

    kind: RuleKind = attrs.field(converter=RuleKind)
    cron: str | None = None
    interval_ms: int | None = None
    timezone: str = "UTC"
    calendar_version: str = attrs.field(factory=calendar_version)
    start_at: dt.datetime | None = attrs.field(default=None, converter=_utc_or_none)
    end_at: dt.datetime | None = attrs.field(default=None, converter=_utc_or_none)
    nonexistent: NonexistentPolicy = attrs.field(default=NonexistentPolicy.SHIFT_FORWARD,
                                                 converter=NonexistentPolicy)
    ambiguous: AmbiguousPolicy = attrs.field(default=AmbiguousPolicy.FIRST,
                                             converter=AmbiguousPolicy)
    jitter_ms: int = 0
    _table: _CronTable | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.kind is RuleKind.CRON:
            if not isinstance(self.cron, str) or self.interval_ms is not None:
                raise ValueError("a cron rule has a cron expression and no interval_ms")
            problem = _cron_problem(self.cron)
            if problem:
                raise ValueError(problem)
            object.__setattr__(self, "cron", " ".join(self.cron.split()))
            object.__setattr__(self, "_table", _CronTable.compile(self.cron))
        else:
            if self.cron is not None or not _is_int(self.interval_ms):
                raise ValueError("an interval rule has interval_ms and no cron expression")
            if not MIN_INTERVAL_MS <= self.interval_ms <= MAX_INTERVAL_MS:
                raise ValueError(f"interval_ms is {MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}")
        if not is_known_timezone(self.timezone):
            raise ValueError(f"unknown time zone {self.timezone!r}")
        if not isinstance(self.calendar_version, str) or not _CALENDAR_VERSION.match(
                self.calendar_version):
            raise ValueError("calendar_version is a tz database version such as '2026a'")
        for bound in (self.start_at, self.end_at):
            if bound is not None and not _MIN_AT <= bound < _MAX_AT:
                raise ValueError("bounds lie in years 1900 to 8999")
        if self.start_at is not None and self.end_at is not None and (
                self.end_at <= self.start_at):
            raise ValueError("end_at must be later than start_at")
        if not _is_int(self.jitter_ms) or not 0 <= self.jitter_ms <= MAX_JITTER_MS:
            raise ValueError(f"jitter_ms is 0..{MAX_JITTER_MS}")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# --- JSON documents ----------------------------------------------------------------------------

_KEYS = ("cron", "interval_ms", "timezone", "calendar_version", "start_at", "end_at",
         "nonexistent", "ambiguous", "jitter_ms")


def _format_at(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(_UTC).isoformat().replace("+00:00", "Z")


def _parse_at(value: Any) -> dt.datetime | None:
    """An aware UTC datetime from an RFC 3339 string; None when it is not one."""
    if not isinstance(value, str) or not _RFC3339.match(value):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    try:
        return parsed.astimezone(_UTC)
    except OverflowError:
        return None


def rule_to_json(rule: Rule) -> dict[str, Any]:
    """The rule as the JSON document a schedule version stores; :func:`parse_rule` reads it
    back to an equal rule. Every field is written, defaults included."""
    doc: dict[str, Any] = {}
    if rule.kind is RuleKind.CRON:
        doc["cron"] = rule.cron
    else:
        doc["interval_ms"] = rule.interval_ms
    doc.update({
        "timezone": rule.timezone,
        "calendar_version": rule.calendar_version,
        "start_at": _format_at(rule.start_at),
        "end_at": _format_at(rule.end_at),
        "nonexistent": rule.nonexistent.value,
        "ambiguous": rule.ambiguous.value,
        "jitter_ms": rule.jitter_ms,
    })
    return doc


def parse_rule(doc: Any, *, path: str = "$.rule") -> Rule:  # noqa: PLR0912, PLR0915
    """Validate a rule document, e.g. ``{"cron": "0 9 * * 1-5", "timezone": "Europe/London"}``
    or ``{"interval_ms": 60000, "start_at": "2026-01-01T00:00:00Z"}``.

    Raises :class:`errors.ValidationFailed` listing every problem with its JSON path. Omitted
    fields take their defaults (``calendar_version``: the installed tz database; the
    publishing code overwrites it anyway)."""
    if not isinstance(doc, dict):
        message = ("a rule is required: an object with cron or interval_ms" if doc is None
                   else "expected a JSON object (a rule)")
        raise errors.ValidationFailed([{"path": path, "message": message}])
    problems: list[dict[str, str]] = []

    def problem(key: str | None, message: str) -> None:
        problems.append({"path": f"{path}.{key}" if key else path, "message": message})

    for key in doc:
        if key not in _KEYS:
            problem(str(key), "unknown field")

    cron, interval = doc.get("cron"), doc.get("interval_ms")
    kind: RuleKind | None = None
    if cron is not None and interval is not None:
        problem(None, "give either cron or interval_ms, not both")
    elif cron is None and interval is None:
        problem(None, "a rule needs cron (a cron expression) or interval_ms (a fixed interval)")
    elif cron is not None:
        kind = RuleKind.CRON
        if not isinstance(cron, str):
            problem("cron", "expected a string (a cron expression)")
        elif (found := _cron_problem(cron)) is not None:
            problem("cron", found)
    else:
        kind = RuleKind.INTERVAL
        if not _is_int(interval):
            problem("interval_ms", "expected an integer number of milliseconds")
        elif not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            problem("interval_ms", f"interval_ms must be between {MIN_INTERVAL_MS} (one second) "
                                   f"and {MAX_INTERVAL_MS} (366 days); got {interval}")

    timezone = doc.get("timezone")
    if timezone is None:
        if kind is RuleKind.CRON:
            problem("timezone", "a cron rule needs a timezone: an IANA name such as "
                                "'Europe/London', or 'UTC'")
        timezone = "UTC"
    elif not isinstance(timezone, str):
        problem("timezone", "expected a string (an IANA time zone name)")
    elif not is_known_timezone(timezone):
        hint = _folded_timezones().get(timezone.lower()) if len(timezone) < 64 else None
        problem("timezone", f"unknown time zone {timezone[:64]!r}: expected an IANA name such "
                            "as 'Europe/London' or 'UTC'"
                            + (f" (did you mean {hint!r}?)" if hint else ""))

    version = doc.get("calendar_version")
    if version is None:
        version = calendar_version()
    elif not isinstance(version, str) or not _CALENDAR_VERSION.match(version):
        problem("calendar_version", "expected a tz database version such as '2026a'")

    bounds: dict[str, dt.datetime | None] = {}
    for key in ("start_at", "end_at"):
        raw = doc.get(key)
        bounds[key] = None
        if raw is None:
            continue
        parsed = _parse_at(raw)
        if parsed is None:
            problem(key, "expected an RFC 3339 timestamp with an offset, such as "
                         "'2026-01-01T09:00:00Z', or null")
        elif not _MIN_AT <= parsed < _MAX_AT:
            problem(key, "out of the supported range: years 1900 to 8999")
        else:
            bounds[key] = parsed
    start_at, end_at = bounds["start_at"], bounds["end_at"]
    if start_at is not None and end_at is not None and end_at <= start_at:
        problem("end_at", "end_at must be later than start_at")

    nonexistent = doc.get("nonexistent", NonexistentPolicy.SHIFT_FORWARD.value)
    if nonexistent not in {p.value for p in NonexistentPolicy}:
        problem("nonexistent", "expected one of 'shift_forward', 'skip'")
    ambiguous = doc.get("ambiguous", AmbiguousPolicy.FIRST.value)
    if ambiguous not in {p.value for p in AmbiguousPolicy}:
        problem("ambiguous", "expected one of 'first', 'last', 'both'")

    jitter = doc.get("jitter_ms", 0)
    if not _is_int(jitter):
        problem("jitter_ms", "expected an integer number of milliseconds")
    elif not 0 <= jitter <= MAX_JITTER_MS:
        problem("jitter_ms", f"jitter_ms must be between 0 and {MAX_JITTER_MS} (one hour); "
                             f"got {jitter}")

    if problems or kind is None:
        raise errors.ValidationFailed(problems)
    return Rule(kind=kind, cron=cron, interval_ms=interval, timezone=timezone,
                calendar_version=version, start_at=start_at, end_at=end_at,
                nonexistent=nonexistent, ambiguous=ambiguous, jitter_ms=jitter)


# --- fire times --------------------------------------------------------------------------------


def _aware(value: dt.datetime, name: str) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime")
    return value


def _floor_s(value: dt.datetime) -> int:
    return (value - _EPOCH) // _SECOND


def _ceil_s(value: dt.datetime) -> int:
    return -((_EPOCH - value) // _SECOND)


def fires_after(rule: Rule, after: dt.datetime, until: dt.datetime, *,
                limit: int) -> list[dt.datetime]:
    """The rule's fire instants ``t`` with ``after < t <= until`` (and within the rule's
    bounds), ascending and distinct, at most ``limit`` of them, as aware UTC datetimes."""
    _aware(after, "after")
    _aware(until, "until")
    if limit < 1:
        raise ValueError("limit is at least 1")
    if rule.kind is RuleKind.INTERVAL:
        return _interval_fires(rule, after, until, limit)
    lo, hi = max(_floor_s(after), _MIN_S), min(_floor_s(until), _MAX_S)
    if rule.start_at is not None:
        lo = max(lo, _ceil_s(rule.start_at) - 1)
    if rule.end_at is not None:
        hi = min(hi, _ceil_s(rule.end_at) - 1)
    if hi <= lo:
        return []
    return [_EPOCH + dt.timedelta(seconds=at) for at in _cron_fires(rule, lo, hi, limit)]


def next_fire(rule: Rule, after: dt.datetime) -> dt.datetime | None:
    """The first fire instant after ``after``; None when there is none (the rule ended, or it
    does not fire within :data:`NEXT_FIRE_HORIZON`)."""
    if _aware(after, "after") >= _MAX_AT:
        return None
    until = min(after + NEXT_FIRE_HORIZON, _MAX_AT - _SECOND)
    fires = fires_after(rule, after, until, limit=1)
    return fires[0] if fires else None


def _interval_fires(rule: Rule, after: dt.datetime, until: dt.datetime,
                    limit: int) -> list[dt.datetime]:
    assert rule.interval_ms is not None  # noqa: S101 -- Rule guarantees it for this kind
    step = rule.interval_ms * 1000
    lo = (max(after, _MIN_AT) - _EPOCH) // _MICROSECOND  # t > lo
    hi = (min(until, _MAX_AT - _MICROSECOND) - _EPOCH) // _MICROSECOND  # t <= hi
    anchor = 0
    if rule.start_at is not None:
        anchor = (rule.start_at - _EPOCH) // _MICROSECOND
        lo = max(lo, anchor - 1)
    if rule.end_at is not None:
        hi = min(hi, (rule.end_at - _EPOCH) // _MICROSECOND - 1)
    first = anchor + ((lo - anchor) // step + 1) * step
    if first > hi:
        return []
    count = min(limit, (hi - first) // step + 1)
    return [_EPOCH + dt.timedelta(microseconds=first + i * step) for i in range(count)]


def _cron_fires(rule: Rule, lo: int, hi: int, limit: int) -> list[int]:
    """Cron fire instants (Unix seconds) ``lo < t <= hi``, ascending, at most ``limit``.

    Walks the zone's constant-offset segments in UTC order. A segment [start, end) with
    offset ``o`` holds the wall times [start + o, end + o); a wall time below
    ``start + o_previous`` repeats one of the previous segment (its second occurrence), one
    at or above ``end + o_next`` is repeated by the next segment (its first occurrence), and
    with ``shift_forward`` the wall times [end + o, end + o_next) of a gap are read with ``o``.
    Each segment yields ascending instants; only a gap's shifted tail can interleave with the
    next segment's first instants, so the union is sorted once at the end.
    """
    table = rule._table
    assert table is not None  # noqa: S101 -- Rule guarantees it for this kind
    name = rule.timezone
    shift = rule.nonexistent is NonexistentPolicy.SHIFT_FORWARD
    keep_repeats = rule.ambiguous is not AmbiguousPolicy.FIRST
    keep_repeated = rule.ambiguous is not AmbiguousPolicy.LAST
    # Any transition before seg_start moved the clock by at most a day, so neither its
    # repeated wall times nor its shifted gap can reach an instant after lo.
    seg_start = lo - _MAX_SHIFT_S
    offset = offset_prev = _offset_at(zone(name), seg_start)
    out: list[int] = []
    for seg_end, offset_next in _transitions_after(name, seg_start, hi + _MAX_SHIFT_S):
        wall_end = seg_end + offset
        tail_end = seg_end + offset_next if shift and offset_next > offset else wall_end
        repeats_below = seg_start + offset_prev  # wall times below it occurred last segment
        repeated_from = seg_end + offset_next if offset_next < offset else _FAR_S
        wall, wall_max = max(seg_start + offset, lo + offset + 1), min(tail_end - 1, hi + offset)
        produced = 0
        while wall <= wall_max:
            match = table.next_match(wall, wall_max)
            if match is None:
                break
            keep = keep_repeats if match < repeats_below else True
            if match >= repeated_from and not keep_repeated:
                keep = False
            if keep:
                out.append(match - offset)
                produced += 1
                if produced >= limit:
                    break
            wall = match + 1
        if seg_end > hi:
            break
        if len(out) >= limit:
            out = sorted(set(out))
            if out[limit - 1] <= seg_end:  # every later instant is >= seg_end
                break
        seg_start, offset_prev, offset = seg_end, offset, offset_next
    return sorted(set(out))[:limit]


# --- jitter ------------------------------------------------------------------------------------


def jitter_for(rule: Rule, schedule_id: bytes, fire_at: dt.datetime) -> dt.timedelta:
    """The deterministic delay of the fire at ``fire_at``: whole milliseconds in
    ``[0, jitter_ms]`` from SHA-256 of the schedule id and the instant (same on every
    replica)."""
    if rule.jitter_ms == 0:
        return dt.timedelta(0)
    micros = (_aware(fire_at, "fire_at") - _EPOCH) // _MICROSECOND
    digest = digests.domain_digest("orbit.schedule.jitter.v1", bytes(schedule_id),
                                   micros.to_bytes(8, "big", signed=True))
    return dt.timedelta(milliseconds=int.from_bytes(digest[:8], "big") % (rule.jitter_ms + 1))

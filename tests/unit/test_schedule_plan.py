"""schedules.plan, the pure firing step: the catch-up window judges only missed instants."""

from __future__ import annotations

import datetime as dt

from orbit_common.pulse import schedule_rules, schedules

NOW = dt.datetime(2026, 11, 29, 9, 0, 0, 50_000, tzinfo=dt.UTC)


def version(*, catchup_ms: int, grace_ms: int, misfire: str = "SKIP") -> schedules.Version:
    return schedules.Version(
        version=1, rule=schedule_rules.parse_rule({"cron": "* * * * *", "timezone": "UTC"}),
        template='{"handler": "h"}', misfire_policy=misfire, overlap_policy="ALLOW",
        catchup_window=dt.timedelta(milliseconds=catchup_ms),
        grace=dt.timedelta(milliseconds=grace_ms),
        effective_from=NOW - dt.timedelta(hours=2))


def step(v: schedules.Version, covered: dt.datetime) -> schedules.Plan:
    return schedules.plan(b"s" * 16, {1: v}, schedules.Progress(
        covered_until=covered, processing_version=1, buffered_fire_at=None,
        previous_unfinished=False), NOW)


def test_an_instant_within_grace_runs_even_with_a_zero_window() -> None:
    plan = step(version(catchup_ms=0, grace_ms=60_000), NOW - dt.timedelta(seconds=1))
    assert [(o.outcome, o.fire_at) for o in plan.occurrences] == [
        ("FIRED", NOW.replace(microsecond=0))]
    assert plan.progress.covered_until > NOW


def test_missed_instants_older_than_the_window_are_one_skipped_range() -> None:
    plan = step(version(catchup_ms=600_000, grace_ms=60_000, misfire="EACH"),
                NOW - dt.timedelta(minutes=30))
    outside = [o for o in plan.occurrences if o.reason == "outside_catchup_window"]
    assert len(outside) == 1
    # Covered from 08:30:00.05, so 08:31 .. 08:50 (08:50:00 is just older than now − 10 min).
    assert outside[0].covered_count == 20
    fired = [o for o in plan.occurrences if o.outcome == "FIRED"]
    assert [o.fire_at.minute for o in fired] == [*range(51, 60), 0]


def test_the_next_check_is_the_next_instant_when_nothing_is_left() -> None:
    plan = step(version(catchup_ms=600_000, grace_ms=60_000), NOW - dt.timedelta(seconds=1))
    assert plan.check_at == NOW.replace(microsecond=0) + dt.timedelta(minutes=1)
    assert plan.next_fire_at == plan.check_at

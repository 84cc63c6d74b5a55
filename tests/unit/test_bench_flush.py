"""``orbit bench tasks --backlog`` measures once the page cleaner's burst after the bulk insert
is over (bench/tasks.py ``flush_settled``)."""

from __future__ import annotations

from bench.tasks import flush_settled


def test_falling_dirty_pages_are_still_a_burst() -> None:
    assert not flush_settled(51_492, 40_138)
    assert not flush_settled(18_773, 17_010)


def test_a_flat_or_rising_count_or_a_clean_pool_is_settled() -> None:
    assert flush_settled(17_010, 17_010)
    assert flush_settled(17_010, 16_900)  # under 1 % in one look
    assert flush_settled(17_010, 17_500)  # the measured phase is not running yet: new writes
    assert flush_settled(5_000, 999)

"""``orbit bench tasks``' CPU figures: the bound the database's own CPU puts on ratio_to_shape."""

from __future__ import annotations

import os

import pytest

from bench.common import cpu_seconds, poll_until
from bench.tasks import _bound_by_database, _cpu_per_task


def test_the_bound_is_the_database_ceiling_over_the_shape() -> None:
    cores = os.cpu_count() or 1
    # 1,000 µs of database CPU per task: at most 1,000 tasks/s per core end to end.
    assert _bound_by_database(1000, 1000 * cores) == 1.0
    assert _bound_by_database(1000, 4000 * cores) == 0.25
    assert _bound_by_database(500, 4000 * cores) == 0.5


def test_cpu_per_task_counts_this_process_and_skips_an_unknown_server() -> None:
    with _cpu_per_task("phase", 1000, None) as figures:
        assert figures == {}  # filled in only when the block ends
        sum(i * i for i in range(200_000))  # some CPU
    assert set(figures) == {"phase_cpu_us_per_task_client"}
    assert figures["phase_cpu_us_per_task_client"] > 0
    # The "server" here is this process. /proc counts CPU in clock ticks (10 ms), so the work
    # goes on until the counter has moved: a fixed amount of work may end inside one tick.
    with _cpu_per_task("phase", 1000, os.getpid()) as figures:
        before = cpu_seconds(os.getpid())  # at least what the block's start read
        while cpu_seconds(os.getpid()) == before:
            sum(i * i for i in range(20_000))
    assert figures["phase_cpu_us_per_task_database"] > 0


def test_poll_until_returns_the_first_answer_that_is_done_and_names_what_it_waited_for() -> None:
    answers = iter([1, 2, 3, 4])
    assert poll_until(lambda: next(answers), lambda n: n >= 3, "three", every=0) == 3
    with pytest.raises(RuntimeError, match="three: only 0 after 0 s"):
        poll_until(lambda: 0, lambda n: n >= 3, "three", timeout=0, every=0)

"""``orbit bench latency``'s verdict: p99 submit → start under 50 ms in 8 of 10 runs."""

from __future__ import annotations

from bench.latency import summary


def test_eight_of_ten_runs_under_50_ms_meet_the_target() -> None:
    p99s = [10.0] * 8 + [50.0, 120.0]  # 50.0 itself is not under 50
    assert summary(p99s) == {"runs": 10, "runs_under_50ms": 8, "runs_needed": 8,
                             "target_met": True}


def test_seven_of_ten_do_not() -> None:
    p99s = [49.9] * 7 + [50.0, 51.0, 400.0]
    verdict = summary(p99s)
    assert verdict["runs_under_50ms"] == 7
    assert verdict["target_met"] is False


def test_other_run_counts_need_the_same_share_rounded_up() -> None:
    assert summary([1.0] * 3 + [99.0, 99.0])["runs_needed"] == 4  # 8/10 of 5
    assert summary([1.0] * 3)["target_met"] is True  # 8/10 of 3 is 2.4: 3 needed
    assert summary([1.0, 1.0, 99.0])["target_met"] is False
    assert summary([])["target_met"] is False

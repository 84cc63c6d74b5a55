"""bench.peers.plan (the interleaving, the medians, the JSON figures) and ``orbit bench peers``'
arguments. Nothing here installs or starts a peer."""

from __future__ import annotations

from collections import Counter

import pytest
from click.testing import CliRunner

from bench.peers import plan
from orbit_cli.main import cli


def test_each_system_runs_once_per_round_in_a_rotating_order() -> None:
    steps = plan.schedule(3)
    assert steps == [
        (0, "orbit"), (0, "pgqueuer"), (0, "celery"),
        (1, "pgqueuer"), (1, "celery"), (1, "orbit"),
        (2, "celery"), (2, "orbit"), (2, "pgqueuer")]
    # Over three rounds every system is first, middle and last exactly once.
    positions = Counter((system, step % 3) for step, (_round, system) in enumerate(steps))
    assert set(positions.values()) == {1}
    assert len(positions) == 9


def test_a_fourth_round_starts_the_rotation_again() -> None:
    assert plan.round_order(3) == plan.round_order(0) == plan.SYSTEMS


def test_no_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one round"):
        plan.schedule(0)


def test_median_of_odd_and_even_counts() -> None:
    assert plan.median([900.0, 100.0, 500.0]) == 500.0
    assert plan.median([100.0, 400.0]) == 250.0
    with pytest.raises(ValueError, match="no figures"):
        plan.median([])


def test_summary_holds_the_medians_the_ratios_and_every_round() -> None:
    rounds = [
        {"orbit": 700.0, "orbit_submit_while_draining": 600.0, "pgqueuer": 3000.0,
         "celery": 1400.0},
        {"orbit": 800.0, "orbit_submit_while_draining": 650.0, "pgqueuer": 2000.0,
         "celery": 1600.0},
        {"orbit": 750.0, "orbit_submit_while_draining": 500.0, "pgqueuer": 2500.0,
         "celery": 1500.0},
    ]
    summary = plan.summarise(rounds)
    assert summary["orbit_tasks_per_s"] == 750.0
    assert summary["orbit_submit_while_draining_tasks_per_s"] == 600.0
    assert summary["pgqueuer_tasks_per_s"] == 2500.0
    assert summary["celery_tasks_per_s"] == 1500.0
    assert summary["orbit_ratio_to_pgqueuer"] == 0.3
    assert summary["orbit_ratio_to_celery"] == 0.5
    assert summary["rounds"][1] == {
        "orbit_tasks_per_s": 800.0, "orbit_submit_while_draining_tasks_per_s": 650.0,
        "pgqueuer_tasks_per_s": 2000.0, "celery_tasks_per_s": 1600.0}
    assert summary["timing"] == plan.TIMING


def test_cpu_model_is_the_first_model_name() -> None:
    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\n"
            "processor\t: 1\nmodel name\t: other\n")
    assert plan.cpu_model(text) == "AMD EPYC 7B13"
    assert plan.cpu_model("processor\t: 0\n") == "unknown"


def test_bench_peers_refuses_zero_rounds_before_starting_anything() -> None:
    result = CliRunner().invoke(cli, ["bench", "peers", "--rounds", "0", "--json"])
    assert result.exit_code == 2
    assert "--rounds" in result.output


def test_bench_peers_is_listed_with_its_options() -> None:
    result = CliRunner().invoke(cli, ["bench", "peers", "--help"])
    assert result.exit_code == 0
    for option in ("--rounds", "--tasks", "--json"):
        assert option in result.output

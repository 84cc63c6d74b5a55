"""``orbit bench tasks --backlog`` and ``orbit bench latency`` refuse bad options before anything
starts (no database, no process)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orbit_cli.main import cli


@pytest.mark.parametrize("extra", [["--keys", "10"], ["--apps", "2"]])
def test_a_backlog_run_measures_the_plain_phase_only(extra: list[str]) -> None:
    result = CliRunner().invoke(cli, ["bench", "tasks", "--backlog", "100", *extra])
    assert result.exit_code == 2, result.output
    assert "--backlog measures the plain phase" in result.output


@pytest.mark.parametrize("args", [["--backlog", "-1"]])
def test_a_negative_backlog_is_refused(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["bench", "tasks", *args])
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize("args", [["--runs", "0"], ["--max-rate", "0"], ["--max-rate", "-5"]])
def test_latency_needs_a_run_and_a_positive_rate(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["bench", "latency", *args])
    assert result.exit_code == 2, result.output

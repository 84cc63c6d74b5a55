"""``orbit dev up --examples``' helpers without a stack: the examples are found in the source
checkout, their environment comes from the bootstrap file, and a setup that keeps failing is
reported and gives up (its worker is then not started). The whole path with a real stack is
tests/e2e/test_dev_examples.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orbit_cli import dev


def test_the_examples_are_found_in_the_checkout() -> None:
    source = dev.examples_source()
    for name in dev.EXAMPLES:
        assert (source / "examples" / name / "__main__.py").is_file()


def test_the_environment_comes_from_the_bootstrap_file(tmp_path: Path) -> None:
    (tmp_path / "bootstrap.json").write_text(json.dumps(
        {"api_key": "orb_x", "namespace": "default", "api_url": "http://127.0.0.1:1"}))
    ports = dev.Ports(api=9090, dispatcher=9091)
    env = dev.example_env(Path("/src"), tmp_path, ports,
                          {"PATH": "/bin", "PYTHONPATH": "/lib", "ORBIT_DATABASE_URL": "secret"})
    assert env == {"PATH": "/bin", "ORBIT_API_URL": "http://127.0.0.1:9090",
                   "ORBIT_DISPATCHER_URL": "http://127.0.0.1:9091", "ORBIT_API_KEY": "orb_x",
                   "ORBIT_NAMESPACE": "default", "PYTHONPATH": f"/src{os.pathsep}/lib"}


def test_a_setup_that_keeps_failing_gives_up(capsys: pytest.CaptureFixture[str]) -> None:
    # No ORBIT_API_URL: the example's setup exits at once with its usage message.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["PYTHONPATH"] = str(dev.examples_source())
    assert dev.setup_example("order_workflow", dev.examples_source(), env, timeout_s=0) is None
    out = capsys.readouterr().out
    assert "example order_workflow: setup failed, its worker is not started" in out
    assert "set ORBIT_API_URL" in out

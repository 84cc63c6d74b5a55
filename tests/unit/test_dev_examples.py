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


def test_a_setup_that_fails_is_reported_and_starts_no_worker(
        capsys: pytest.CaptureFixture[str]) -> None:
    # No ORBIT_API_URL: the example's setup exits at once with its usage message.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["PYTHONPATH"] = str(dev.examples_source())
    assert dev.setup_example("order_workflow", dev.examples_source(), env) is None
    out = capsys.readouterr().out
    assert "example order_workflow: setup failed, its worker is not started" in out
    assert "set ORBIT_API_URL" in out


def test_an_exited_child_is_restarted_when_its_delay_is_due(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The supervisor never sleeps through a restart delay: an exited child gets a due time,
    the others are still watched, and it is spawned again once the time has come."""
    import subprocess
    import sys

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "pass"])

    spawned: list[subprocess.Popen[bytes]] = []

    def respawn() -> subprocess.Popen[bytes]:
        spawned.append(spawn())
        return spawned[-1]

    exited = spawn()
    exited.wait()
    # A child that runs until it is killed: it blocks reading its stdin, which stays open.
    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)
    try:
        group = {"gone": exited, "alive": running}
        restarts = {"gone": 0, "alive": 0}
        due: dict[str, float] = {}
        dev._restart_exited(group, {"gone": respawn, "alive": respawn}, restarts, due)
        assert (restarts, spawned, group["gone"]) == ({"gone": 1, "alive": 0}, [], exited)
        assert "gone exited with 0; restarting in 2s" in capsys.readouterr().out
        dev._restart_exited(group, {"gone": respawn, "alive": respawn}, restarts, due)
        assert spawned == []  # not yet due: nothing spawned, nothing counted twice
        assert restarts["gone"] == 1
        due["gone"] = 0.0  # the delay has passed
        dev._restart_exited(group, {"gone": respawn, "alive": respawn}, restarts, due)
        assert group["gone"] is spawned[0]
        assert due == {}
        assert group["alive"] is running
    finally:
        running.kill()
        running.wait()
        assert running.stdin is not None
        running.stdin.close()
        for proc in spawned:
            proc.wait()

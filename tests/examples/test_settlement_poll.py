"""examples/settlement_poll end to end, as its README runs it: the real API, dispatcher and
workflow engine (``orbit weave``) as processes, the example's CLI for setup, transfers and
rounds, and its worker as a process. A transfer that settles about a second after it starts
(the POLL step's condition holds after a few rounds) and one that never settles (six rounds,
then ``not_settled``); the invariant checker is green."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.invariants import check
from tests.support.processes import WeaveDaemon
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def example(stack: Stack, *args: str) -> Any:
    """``python -m examples.settlement_poll …`` with the stack's environment; its JSON output."""
    done = subprocess.run(
        [sys.executable, "-m", "examples.settlement_poll", *args], cwd=ROOT,
        env={**os.environ, "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
             "ORBIT_NAMESPACE": stack.namespace,
             "ORBIT_DISPATCHER_URL": stack.dispatchers[0].url},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_transfer_settles_and_another_never_does(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    engine: WeaveDaemon | None = None
    try:
        assert example(stack, "setup") == {"definition": "settlement", "version": 1}
        engine = WeaveDaemon(stack.daemon_url, tmp_path / "weave.log", "example-engine")
        engine.wait_ready()
        stack.start_worker("-m", "examples.settlement_poll", "worker", log_name="worker.log")

        settled = example(stack, "transfer", "T-1", "--amount", "250",
                          "--settle-after-ms", "1000", "--wait")
        assert settled["state"] == "SUCCEEDED", settled
        assert settled["output"]["transfer_id"] == "T-1"
        (step,) = [s for s in settled["steps"] if s["name"] == "settle"]
        assert step["poll"]["state"] == "SATISFIED"
        found = example(stack, "rounds", settled["id"])
        states = [r["state"] for r in found["rounds"]]
        assert 2 <= len(states) <= 6
        assert states == ["NOT_MET"] * (len(states) - 1) + ["MET"]
        assert found["rounds"][-1]["result"]["checked_at"] == settled["output"]["settled_at"]
        assert found["poll"]["used_rounds"] == len(states)

        never = example(stack, "transfer", "T-2", "--amount", "99",
                        "--settle-after-ms", "3600000", "--wait")
        assert never["state"] == "FAILED", never
        assert never["error"]["error"] == "not_settled"
        found = example(stack, "rounds", never["id"])
        assert (found["poll"]["state"], found["poll"]["used_rounds"]) == ("EXHAUSTED", 6)
        assert [r["state"] for r in found["rounds"]] == ["NOT_MET"] * 6
        (step,) = [s for s in never["steps"] if s["name"] == "settle"]
        assert step["error"]["error"] == "poll_exhausted"
        with stack.sql() as conn:
            assert check(conn, quiescent=True) == []
    finally:
        if engine is not None:
            engine.stop()
        stack.close()

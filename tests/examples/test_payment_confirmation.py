"""examples/payment_confirmation end to end, as its README runs it: the real API, dispatcher and
workflow engine (``orbit weave``) as processes, the example's CLI, and its worker as a process.
Three payments: one approved by a callback sent before the workflow waits for it (the early
signal is consumed when the wait is reached) whose settlement is then polled until the funds
settle, one declined, one never confirmed (the wait times out); a repeated callback returns the
first receipt. The invariant checker is green."""

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
    """``python -m examples.payment_confirmation …`` with the stack's environment; its JSON
    output."""
    done = subprocess.run(
        [sys.executable, "-m", "examples.payment_confirmation", *args], cwd=ROOT,
        env={**os.environ, "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
             "ORBIT_NAMESPACE": stack.namespace,
             "ORBIT_DISPATCHER_URL": stack.dispatchers[0].url},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_three_payments_end_as_the_example_says(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    engine: WeaveDaemon | None = None
    try:
        assert example(stack, "setup") == {"definition": "payment", "version": 1}
        engine = WeaveDaemon(stack.daemon_url, tmp_path / "weave.log", "example-engine")
        engine.wait_ready()
        # P-1: the callback arrives before the worker even ran the request task.
        paid = example(stack, "pay", "P-1", "--amount-cents", "1250")
        early = example(stack, "confirm", "P-1", "--status", "approved", "--version", "2")
        assert early["signal"]["workflow_id"] == paid["id"]
        stack.start_worker("-m", "examples.payment_confirmation", "worker",
                           log_name="worker.log")
        ok = example(stack, "confirm", "P-1", "--status", "approved", "--version", "2",
                     "--wait")
        assert ok["signal"]["id"] == early["signal"]["id"]  # the same callback: one signal
        assert ok["signal"]["state"] == "CONSUMED"
        assert ok["signal"]["disposition"] == "consumed"
        assert ok["workflow"]["state"] == "SUCCEEDED", ok
        output = ok["workflow"]["output"]
        settled_at = output.pop("settled_at")
        assert output == {"payment_id": "P-1", "confirmation": {"status": "approved"},
                          "shipping": {"parcel": "P-P-1"}}
        settle = {s["name"]: s for s in ok["workflow"]["steps"]}["settle"]
        assert settle["state"] == "SUCCEEDED"
        assert settle["output"] == {"settled": True, "checked_at": settled_at}
        # The query's rounds: every one before the last found the funds not yet settled.
        used = settle["poll"]["used_rounds"]
        assert settle["poll"]["state"] == "SATISFIED"
        assert 1 <= used <= settle["poll"]["max_rounds"]

        example(stack, "pay", "P-2", "--amount-cents", "990")
        declined = example(stack, "confirm", "P-2", "--status", "declined", "--wait")
        assert declined["workflow"]["state"] == "FAILED"
        assert declined["workflow"]["error"]["error"] == "payment_declined"
        assert declined["workflow"]["error"]["cause"] == {"status": "declined"}

        late = example(stack, "pay", "P-3", "--amount-cents", "500")
        shown = example(stack, "show", late["id"])
        while shown["state"] == "RUNNING":  # the 20 s timeout, in database time
            shown = example(stack, "show", late["id"])
        assert shown["state"] == "FAILED"
        assert shown["error"] == {"error": "payment_not_confirmed", "cause": "P-3",
                                  "step": "unconfirmed"}
        steps = {s["name"]: s for s in shown["steps"]}
        assert steps["confirmed"]["error"] == {"error": "signal_timeout", "step": "confirmed"}
        assert shown["signals"] == []
        shown = example(stack, "show", paid["id"])
        assert [s["id"] for s in shown["signals"]] == [early["signal"]["id"]]
        with stack.sql() as conn:
            assert check(conn, quiescent=True) == []
    finally:
        if engine is not None:
            engine.stop()
        stack.close()

"""examples/order_workflow end to end, as its README runs it: the real API, dispatcher and
workflow engine (``orbit weave``) as processes, the example's CLI for setup and orders, and its
worker as a process. Three orders: one that goes through (the parallel block's two branches'
results in the output), one with a sold-out SKU (the CHOICE fails it) and one whose charge is
declined (a failed branch fails the block). Each step runs once; the invariant checker is
green."""

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
    """``python -m examples.order_workflow …`` with the stack's environment; its JSON output."""
    done = subprocess.run(
        [sys.executable, "-m", "examples.order_workflow", *args], cwd=ROOT,
        env={**os.environ, "ORBIT_API_URL": stack.api.url, "ORBIT_API_KEY": stack.api_key,
             "ORBIT_NAMESPACE": stack.namespace,
             "ORBIT_DISPATCHER_URL": stack.dispatchers[0].url},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_three_orders_end_as_the_example_says(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    engine: WeaveDaemon | None = None
    try:
        assert example(stack, "setup") == {"definition": "order", "version": 1}
        assert example(stack, "setup") == {"definition": "order", "version": 1}  # unchanged
        engine = WeaveDaemon(stack.daemon_url, tmp_path / "weave.log", "example-engine")
        engine.wait_ready()
        stack.start_worker("-m", "examples.order_workflow", "worker", log_name="worker.log")

        ok = example(stack, "order", "A-1", "--amount", "99.5", "--sku", "BOOK-1",
                     "--sku", "PEN-2", "--express", "--wait")
        assert ok["state"] == "SUCCEEDED", ok
        assert ok["business_key"] == "A-1"
        payment = ok["output"]["payment"]
        assert payment["charged"] == 99.5
        assert payment["reference"].startswith("ch_")
        assert ok["output"]["shipping"] == {"label": "L-A-1", "service": "express"}
        steps = {s["name"]: s for s in ok["steps"]}
        assert {n: s["state"] for n, s in steps.items() if n != "$root"} == {
            "reserve": "SUCCEEDED", "check": "SUCCEEDED", "fulfil": "SUCCEEDED",
            "charge": "SUCCEEDED", "paid": "SUCCEEDED", "label": "SUCCEEDED",
            "shipped": "SUCCEEDED", "done": "SUCCEEDED"}
        for name in ("reserve", "charge", "label"):
            (activation,) = steps[name]["activations"]
            assert (activation["task_state"], activation["result"]) == ("SUCCEEDED", "advanced")

        sold_out = example(stack, "order", "A-2", "--amount", "20", "--sku", "SOLDOUT-9",
                           "--wait")
        assert sold_out["state"] == "FAILED"
        assert sold_out["error"]["error"] == "order_failed"
        assert sold_out["error"]["cause"] == "A-2"
        assert "fulfil" not in {s["name"] for s in sold_out["steps"]}

        declined = example(stack, "order", "A-3", "--amount", "9000", "--sku", "TV-1", "--wait")
        assert declined["state"] == "FAILED"
        assert declined["error"]["error"] == "order_failed"
        by_name = {s["name"]: s for s in declined["steps"]}
        assert by_name["charge"]["state"] == "FAILED"
        assert by_name["fulfil"]["state"] == "FAILED"

        again = example(stack, "order", "A-1", "--amount", "99.5", "--sku", "BOOK-1",
                        "--sku", "PEN-2", "--express")
        assert again["id"] == ok["id"]  # the same order: the first instance's receipt

        shown = example(stack, "show", ok["id"])
        assert shown["state"] == "SUCCEEDED"
        with stack.sql() as conn, conn.cursor() as cur:
            cur.execute("SELECT COUNT(*), COUNT(DISTINCT step_id) FROM weave_activations")
            activations, distinct_steps = cur.fetchone()
            cur.execute("SELECT COUNT(*) FROM weave_instances")
            (instances,) = cur.fetchone()
        assert instances == 3
        assert activations == distinct_steps  # every step ran once
        with stack.sql() as conn:
            assert check(conn, quiescent=True) == []
    finally:
        if engine is not None:
            engine.stop()
        stack.close()

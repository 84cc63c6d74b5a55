"""``orbit dev up --examples`` (``script/server --examples``) as a real process: once the stack is
up it sets up the workflow examples and supervises their workers, so an order (a PARALLEL block:
payment and shipping label side by side) and a payment (a SIGNAL wait for the provider's
confirmation, then a POLL until the funds settle) run to their end through the API alone -- no
worker started by the test. Ctrl-C stops the workers and the daemons cleanly."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from orbit_sdk import Client, NotFound

import orbit_devdb as devdb
from orbit_cli.dev import EXAMPLES
from tests.e2e.test_local_stack import Stack, stack_env  # noqa: F401 - the fixture
from tests.support.waiting import until

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 60.0


async def _published(orbit: Client, definition: str) -> bool:
    try:
        return bool((await orbit.get_workflow_definition(definition)).latest_version)
    except NotFound:
        return False


async def _ended(orbit: Client, workflow_id: str) -> Any:
    async def done() -> bool:
        return (await orbit.get_workflow(workflow_id)).state != "RUNNING"

    await until(done, timeout=RUN_TIMEOUT_S, interval=0.2, message=f"{workflow_id} ends")
    return await orbit.get_workflow(workflow_id)


async def drive(api_url: str, api_key: str, namespace: str) -> dict[str, Any]:
    """One order and one payment through the API, to their end."""
    async with Client(api_url, api_key, namespace) as orbit:
        for definition in ("order", "payment", "settlement"):
            await until(lambda d=definition: _published(orbit, d), timeout=RUN_TIMEOUT_S,
                        interval=0.2, message=f"the example set up {definition}")
        order = await orbit.start_workflow(
            "order", {"order_id": "A-1", "amount": 42.5,
                      "items": [{"sku": "BOOK-1", "qty": 1}, {"sku": "PEN-2", "qty": 1}]},
            business_key="A-1")
        payment = await orbit.start_workflow(
            "payment", {"payment_id": "P-1", "amount_cents": 1250}, business_key="P-1")

        async def waiting_for_confirmation() -> bool:
            return any(w.state == "WAITING" and w.kind == "SIGNAL"
                       for w in await orbit.list_workflow_waits(payment.id))

        # The request task ran on the example's worker; the workflow now waits for the signal.
        await until(waiting_for_confirmation, timeout=RUN_TIMEOUT_S, interval=0.2,
                    message="the payment waits for its confirmation")
        signal = await orbit.send_signal(payment.id, "payment_confirmed",
                                         {"status": "approved"}, correlation_key="P-1")
        ordered = await _ended(orbit, order.id)
        paid = await _ended(orbit, payment.id)
        return {
            "order": ordered.raw, "payment": paid.raw,
            "signal": (await orbit.get_signal(payment.id, signal.id)).raw,
            "order_tasks": [t.raw async for t in orbit.list_workflow_tasks(order.id)],
            "payment_tasks": [t.raw async for t in orbit.list_workflow_tasks(payment.id)],
        }


def test_dev_up_runs_the_examples_end_to_end(tmp_path: Path,
                                             stack_env: dict[str, str]) -> None:  # noqa: F811
    state = tmp_path / "state"
    stack = Stack(state, devdb.free_port(), stack_env, tmp_path / "examples.log",
                  devdb.free_port(), extra=("--examples",))
    try:
        stack.wait_ready()
        doc = json.loads((state / "bootstrap.json").read_text())
        ran = asyncio.run(drive(stack.api_url, doc["api_key"], doc["namespace"]))

        order = ran["order"]
        assert order["state"] == "SUCCEEDED", order
        assert order["output"]["order_id"] == "A-1"
        assert set(order["output"]) == {"order_id", "payment", "shipping"}
        steps = {s["name"]: s for s in order["steps"]}
        assert steps["fulfil"]["kind"] == "PARALLEL"
        assert {steps[n]["state"] for n in ("reserve", "charge", "label", "fulfil")} == {
            "SUCCEEDED"}
        # Both branches' tasks ran on the example's worker, each once.
        assert sorted(t["step"] for t in ran["order_tasks"]) == ["charge", "label", "reserve"]
        assert all(t["verified"] and t["state"] == "SUCCEEDED" for t in ran["order_tasks"])

        payment = ran["payment"]
        assert payment["state"] == "SUCCEEDED", payment
        assert payment["output"]["confirmation"] == {"status": "approved"}
        assert (ran["signal"]["state"], ran["signal"]["disposition"]) == (
            "CONSUMED", "consumed")
        settle = {s["name"]: s for s in payment["steps"]}["settle"]
        assert settle["poll"]["state"] == "SATISFIED"
        rounds = [t for t in ran["payment_tasks"] if t["step"] == "settle"]
        assert len(rounds) == settle["poll"]["used_rounds"] >= 1
        assert sorted(t["round"] for t in rounds) == list(range(1, len(rounds) + 1))

        output = stack.output()
        for name in EXAMPLES:
            assert f"example {name}: set up" in stack.log.read_text(errors="replace"), output
        started = time.monotonic()
        assert stack.interrupt() == 0, stack.output()
        assert time.monotonic() - started < 60
    finally:
        stack.kill()

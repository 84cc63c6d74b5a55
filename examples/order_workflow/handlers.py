"""The order workflow's task handlers: what each TASK step's task does.

A real shop would call its inventory, payment and shipping systems here, passing the task id as
the idempotency key of each external call (a task may run again after a lost lease). The example
decides from the input alone, so its outcomes are predictable:

* ``inventory.reserve``: a SKU starting with ``SOLDOUT`` cannot be reserved (``reserved: false``;
  the workflow's CHOICE then fails the order);
* ``pay.charge``: an amount over ``DECLINE_ABOVE`` is declined -- a failure for good (no retry),
  which fails the ``pay`` branch and with it the PARALLEL block;
* ``ship.label``: always prints a label.
"""

from __future__ import annotations

from typing import Any

from orbit_sdk import Context, Worker

QUEUES = ("inventory", "payments", "shipping")
DECLINE_ABOVE = 5000.0


class PaymentDeclined(Exception):
    """The payment provider refused the charge: retrying would not help."""


async def reserve(ctx: Context, data: Any) -> dict[str, Any]:
    skus = list(data.get("skus", [])) if isinstance(data, dict) else []
    return {"reserved": not any(str(sku).startswith("SOLDOUT") for sku in skus)}


async def charge(ctx: Context, data: Any) -> dict[str, Any]:
    amount = float(data.get("amount", 0)) if isinstance(data, dict) else 0.0
    if amount > DECLINE_ABOVE:
        raise PaymentDeclined(f"a charge of {amount:.2f} is over the limit")
    return {"charged": amount, "reference": f"ch_{ctx.task_id[:12]}"}


async def label(ctx: Context, data: Any) -> dict[str, Any]:
    order_id = data.get("order_id", "") if isinstance(data, dict) else ""
    express = bool(data.get("express")) if isinstance(data, dict) else False
    return {"label": f"L-{order_id}", "service": "express" if express else "standard"}


def register(worker: Worker) -> None:
    worker.add_handler("inventory.reserve", reserve)
    worker.add_handler("pay.charge", charge)
    worker.add_handler("ship.label", label)

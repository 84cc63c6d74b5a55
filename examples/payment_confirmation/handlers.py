"""The payment workflow's task handlers.

* ``payments.request`` asks the (pretend) payment provider to collect the amount; the provider
  answers later, out of band, by calling back -- which the example's ``confirm`` command plays:
  it sends the ``payment_confirmed`` signal the workflow's SIGNAL step waits for;
* ``payments.ship`` ships the order once the payment is approved.

A real handler would call the provider with the task id as the idempotency key of the call (a
task may run again after a lost lease).
"""

from __future__ import annotations

from typing import Any

from orbit_sdk import Context, Worker

QUEUES = ("payments",)


async def request(ctx: Context, data: Any) -> dict[str, Any]:
    payment_id = data.get("payment_id", "") if isinstance(data, dict) else ""
    return {"requested": payment_id, "provider_reference": f"psp_{ctx.task_id[:12]}"}


async def ship(ctx: Context, data: Any) -> dict[str, Any]:
    payment_id = data.get("payment_id", "") if isinstance(data, dict) else ""
    return {"parcel": f"P-{payment_id}"}


def register(worker: Worker) -> None:
    worker.add_handler("payments.request", request)
    worker.add_handler("payments.ship", ship)

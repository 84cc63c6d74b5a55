"""The payment workflow's task handlers.

* ``payments.request`` asks the (pretend) payment provider to collect the amount; the provider
  answers later, out of band, by calling back -- which the example's ``confirm`` command plays:
  it sends the ``payment_confirmed`` signal the workflow's SIGNAL step waits for;
* ``payments.settlement`` asks the provider whether the approved payment's funds have settled
  (the workflow's POLL step repeats it, with backoff, until they have): the pretend provider
  settles ``SETTLE_AFTER_MS`` after the request;
* ``payments.ship`` ships the order once the payment is approved and settled.

A real handler would call the provider with the task id as the idempotency key of the call (a
task may run again after a lost lease).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from orbit_sdk import Context, Worker

QUEUES = ("payments",)
SETTLE_AFTER_MS = 600


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def request(ctx: Context, data: Any) -> dict[str, Any]:
    payment_id = data.get("payment_id", "") if isinstance(data, dict) else ""
    return {"requested": payment_id, "provider_reference": f"psp_{ctx.task_id[:12]}",
            "requested_at": _now().isoformat(timespec="milliseconds")}


async def settlement(ctx: Context, data: Any) -> dict[str, Any]:
    requested = dt.datetime.fromisoformat(str(data["requested_at"]))
    now = _now()
    return {"settled": now >= requested + dt.timedelta(milliseconds=SETTLE_AFTER_MS),
            "checked_at": now.isoformat(timespec="milliseconds")}


async def ship(ctx: Context, data: Any) -> dict[str, Any]:
    payment_id = data.get("payment_id", "") if isinstance(data, dict) else ""
    return {"parcel": f"P-{payment_id}"}


def register(worker: Worker) -> None:
    worker.add_handler("payments.request", request)
    worker.add_handler("payments.settlement", settlement)
    worker.add_handler("payments.ship", ship)

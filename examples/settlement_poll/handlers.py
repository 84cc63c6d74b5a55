"""The settlement example's task handlers.

A real integration would call the bank: ``bank.transfer`` submits the transfer (the task id as
the bank call's idempotency key), ``bank.status`` asks whether it has settled. The example's
"bank" settles a transfer ``settle_after_ms`` after it was initiated, so its outcomes are
predictable: a transfer with a large ``settle_after_ms`` never settles within the poll's rounds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from orbit_sdk import Context, Worker

QUEUES = ("bank",)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def transfer(ctx: Context, data: Any) -> dict[str, Any]:
    return {"transfer_id": str(data["transfer_id"]),
            "initiated_at": _now().isoformat(timespec="milliseconds"),
            "settle_after_ms": int(data["settle_after_ms"])}


async def status(ctx: Context, data: Any) -> dict[str, Any]:
    initiated = dt.datetime.fromisoformat(str(data["initiated_at"]))
    due = initiated + dt.timedelta(milliseconds=int(data["settle_after_ms"]))
    now = _now()
    return {"settled": now >= due, "checked_at": now.isoformat(timespec="milliseconds")}


def register(worker: Worker) -> None:
    worker.add_handler("bank.transfer", transfer)
    worker.add_handler("bank.status", status)

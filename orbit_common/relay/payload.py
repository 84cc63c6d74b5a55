"""The delivery payload: what the pump POSTs and what a pull consumer receives (one JSON
object per delivery). Pure; :func:`body` gives the exact bytes the pump signs and sends (the
snapshot is spliced in as the exact text stored with the result event, never re-parsed)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from orbit_common.model import jsondoc
from orbit_common.relay.model import iso

TYPE = "task.result"


def build(*, delivery_id: bytes, subscription_id: bytes, subscription: str,
          namespace: str, sequence: int, event_id: bytes, task_id: bytes, queue: str,
          task_revision: int, state: str, committed_at: dt.datetime, attempt: int,
          snapshot: str) -> dict[str, Any]:
    """The payload of one delivery attempt (``attempt`` is 1-based)."""
    return {
        "type": TYPE, "id": delivery_id.hex(), "subscription_id": subscription_id.hex(),
        "subscription": subscription, "namespace": namespace, "sequence": sequence,
        "event_id": event_id.hex(), "task_id": task_id.hex(), "queue": queue,
        "task_revision": task_revision, "state": state, "committed_at": iso(committed_at),
        "attempt": attempt, "snapshot": jsondoc.RawJson(snapshot),
    }


def body(document: dict[str, Any]) -> bytes:
    """The UTF-8 JSON bytes of a payload, keys in contract order: what the pump signs and POSTs
    (the signature covers exactly these bytes)."""
    return jsondoc.dumps(document).encode("utf-8")

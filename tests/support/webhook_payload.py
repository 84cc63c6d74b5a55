"""Delivery payloads for webhook tests, built by the one body builder the pump uses
(orbit_common.relay.payload): ids as 32 hex characters, as receivers see them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_common.relay import payload


@attrs.frozen(kw_only=True)
class Delivery:
    delivery_id: str
    subscription_id: str
    subscription: str
    namespace: str
    sequence: int
    event_id: str
    task_id: str
    queue: str
    task_revision: int
    state: str
    committed_at: dt.datetime
    attempt: int
    snapshot: str  # the stored snapshot text, spliced in verbatim

    def document(self) -> dict[str, Any]:
        return payload.build(
            delivery_id=bytes.fromhex(self.delivery_id),
            subscription_id=bytes.fromhex(self.subscription_id),
            subscription=self.subscription, namespace=self.namespace, sequence=self.sequence,
            event_id=bytes.fromhex(self.event_id), task_id=bytes.fromhex(self.task_id),
            queue=self.queue, task_revision=self.task_revision, state=self.state,
            committed_at=self.committed_at, attempt=self.attempt, snapshot=self.snapshot)

    def body(self) -> bytes:
        """The exact bytes the pump signs and sends."""
        return payload.body(self.document())

    def again(self, **changes: Any) -> Delivery:
        return attrs.evolve(self, **changes)

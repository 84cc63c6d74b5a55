"""The webhook body: one ``task.result`` JSON document per delivery attempt.

The contract (docs/subscriptions.md): a JSON object with ``type`` (``"task.result"``), ``id``
(the delivery id, also the ``webhook-id`` header), ``subscription_id``, ``subscription`` (its
name), ``namespace``, ``sequence`` (the result event's position in the namespace's result
stream), ``event_id``, ``task_id``, ``queue``, ``task_revision``, ``state`` (``SUCCEEDED``,
``FAILED``, ``CANCELLED`` or ``NEEDS_REVIEW``), ``committed_at`` (when the result committed, UTC,
ISO 8601 with microseconds), ``attempt`` (1-based delivery attempt) and ``snapshot`` (the task
as the result event froze it: ``task_id``, ``handler``, ``state``, ``revision``,
``outcome_reason``, ``attempts_used``, ``effect_uncertain``, ``result``, ``error``, …).

The snapshot is spliced in as stored (:class:`~orbit_common.model.jsondoc.RawJson`): a result's
numbers reach the receiver with the digits the worker reported, and a large result is copied,
not parsed and re-encoded.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

import attrs

from orbit_common.db.clock import as_utc
from orbit_common.model import jsondoc

TYPE: Final = "task.result"
STATES: Final = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW"})


@attrs.frozen(kw_only=True)
class ResultDelivery:
    """What one attempt of a delivery sends (ids as 32 hex characters)."""

    delivery_id: str
    subscription_id: str
    subscription: str
    namespace: str
    sequence: int
    event_id: str
    task_id: str
    queue: str
    task_revision: int
    state: str = attrs.field(validator=attrs.validators.in_(STATES))
    committed_at: dt.datetime
    attempt: int = attrs.field(validator=attrs.validators.ge(1))
    snapshot: jsondoc.RawJson

    def body(self) -> bytes:
        """The UTF-8 JSON body, keys in contract order."""
        return jsondoc.dumps({
            "type": TYPE,
            "id": self.delivery_id,
            "subscription_id": self.subscription_id,
            "subscription": self.subscription,
            "namespace": self.namespace,
            "sequence": self.sequence,
            "event_id": self.event_id,
            "task_id": self.task_id,
            "queue": self.queue,
            "task_revision": self.task_revision,
            "state": self.state,
            "committed_at": as_utc(self.committed_at).isoformat(timespec="microseconds"),
            "attempt": self.attempt,
            "snapshot": self.snapshot,
        }).encode("utf-8")

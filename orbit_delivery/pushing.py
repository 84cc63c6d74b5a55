"""One webhook attempt: signing and sending -- everything but the rows and the circuit.

:meth:`WebhookPusher.push` is what the pump calls for a leased webhook delivery: it takes the
delivery's payload (``orbit_common.relay.payload.build``, the one body builder), signs exactly
the bytes :func:`orbit_common.relay.payload.body` gives (a new ``webhook-timestamp`` per
attempt), sends them with the sender's bounds and counts the outcome. Whether the endpoint may
be sent to at all is the endpoint circuit's decision, kept on the subscription row
(``orbit_common.relay.circuit``); the pump asks it before leasing and records each outcome in
the same transaction as the delivery's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from orbit_common.relay import payload
from orbit_delivery import signing
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.sender import SendOutcome, WebhookSender


class WebhookPusher:
    def __init__(self, sender: WebhookSender, *, metrics: PumpMetrics | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.sender = sender
        self.metrics = metrics
        self.wall_clock = wall_clock  # only for the webhook-timestamp header

    @staticmethod
    def signed(document: dict[str, Any], secrets: signing.SigningSecrets,
               timestamp: int) -> tuple[bytes, dict[str, str]]:
        """The body (the payload's exact bytes) and the Standard Webhooks headers over them."""
        body = payload.body(document)
        return body, signing.headers(secrets, msg_id=document["id"], timestamp=timestamp,
                                     body=body)

    async def push(self, url: str, document: dict[str, Any], secrets: signing.SigningSecrets,
                   *, namespace: str | None = None, deadline: float | None = None
                   ) -> SendOutcome:
        """Sign and POST one attempt of a delivery, over by ``deadline`` (monotonic) at the
        latest; never raises for network trouble."""
        body, headers = self.signed(document, secrets, int(self.wall_clock()))
        outcome = await self.sender.send(url, body, headers, deadline=deadline)
        if self.metrics is not None:
            self.metrics.attempt(outcome, namespace=namespace)
        return outcome

"""One webhook attempt: circuit check, signing, sending, recording -- everything but the rows.

:meth:`WebhookPusher.push` is what the pump's loop calls for a leased webhook delivery. It asks
the endpoint's circuit first; an open circuit refuses without a request and says how long to
wait (:class:`CircuitRefused` -- not an attempt: the caller postpones the delivery without
spending budget). Otherwise it signs the body afresh (a new ``webhook-timestamp`` per attempt),
sends it, reports the outcome to the circuit and the metrics, and returns the
:class:`~orbit_delivery.sender.SendOutcome` for the caller to write (acknowledged on a 2xx, else
backoff or exhaustion). A cancelled send gives its circuit ticket back (a half-open circuit's
probe slot is freed).

Every non-2xx answer and every transport error counts against the endpoint's circuit: an
endpoint that answers 4xx to everything is as stuck, for its subscriptions, as one that is down.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from orbit_delivery import signing
from orbit_delivery.circuits import CircuitBreakers, CircuitState
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.payload import ResultDelivery
from orbit_delivery.sender import SendOutcome, WebhookSender, endpoint_key, webhook_url


@attrs.frozen(kw_only=True)
class CircuitRefused:
    """The endpoint's circuit is open: try again in ``retry_in_s`` seconds (no request made)."""

    endpoint: str
    retry_in_s: float


class WebhookPusher:
    def __init__(self, sender: WebhookSender, breakers: CircuitBreakers, *,
                 metrics: PumpMetrics | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.sender = sender
        self.breakers = breakers
        self.metrics = metrics
        self.monotonic = monotonic
        self.wall_clock = wall_clock  # only for the webhook-timestamp header

    async def push(self, url: str, delivery: ResultDelivery, secrets: signing.SigningSecrets,
                   *, namespace: str | None = None) -> SendOutcome | CircuitRefused:
        body = delivery.body()
        headers = signing.headers(secrets, msg_id=delivery.delivery_id,
                                  timestamp=int(self.wall_clock()), body=body)
        target = webhook_url(url)
        if target is None:  # not a URL with an endpoint: the sender says why
            return self._record(await self.sender.send(url, body, headers), namespace)
        endpoint = endpoint_key(target)
        circuit = self.breakers.get(endpoint)
        now = self.monotonic()
        ticket = circuit.allow(now)
        if ticket is None:
            if self.metrics is not None:
                self.metrics.circuit_refused(namespace=namespace)
            return CircuitRefused(endpoint=endpoint, retry_in_s=circuit.retry_at(now) - now)
        try:
            outcome = await self.sender.send(url, body, headers)
        except BaseException:
            circuit.abandon(ticket)
            raise
        if outcome.delivered:
            circuit.success(ticket)
            if circuit.state is CircuitState.CLOSED and circuit.failures == 0:
                self.breakers.circuits.pop(endpoint, None)  # nothing left to remember
        else:
            circuit.failure(ticket, self.monotonic())
        return self._record(outcome, namespace)

    def _record(self, outcome: SendOutcome, namespace: str | None) -> SendOutcome:
        if self.metrics is not None:
            self.metrics.attempt(outcome, namespace=namespace)
            self.metrics.set_circuits(self.breakers)
        return outcome

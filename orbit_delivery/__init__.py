"""``orbit delivery``: the delivery pump -- result events to subscription deliveries to webhooks.

Modules (the daemon's loops wire them to the relay transactions of ``orbit_common.relay``):

* :mod:`orbit_delivery.service` -- the daemon: fan-out, webhook batches, lapse recovery, gauges,
  drain;
* :mod:`orbit_delivery.signing` -- Standard Webhooks signatures (two secrets while rotating);
* :mod:`orbit_delivery.sender` -- the HTTP sender: concurrency bounds, timeouts, no redirects,
  address policy at connect time (SSRF, DNS rebinding), one outcome object per attempt;
* :mod:`orbit_delivery.pushing` -- one webhook attempt: sign the relay payload's exact bytes,
  send, count;
* :mod:`orbit_delivery.metrics` -- the pump's Prometheus metrics.

The body is ``orbit_common.relay.payload`` (the one builder, shared with pull consumers); the
endpoint circuit is ``orbit_common.relay.circuit`` (kept on the subscription row, so every
replica and every operator sees the same state).
"""

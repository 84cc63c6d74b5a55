"""``orbit delivery``: the delivery pump -- result events to subscription deliveries to webhooks.

Modules, each usable on its own (the daemon's loop wires them to the delivery transactions of
``orbit_common``):

* :mod:`orbit_delivery.signing` -- Standard Webhooks signatures (two secrets while rotating);
* :mod:`orbit_delivery.payload` -- the webhook body (the fixed ``task.result`` document);
* :mod:`orbit_delivery.sender` -- the HTTP sender: concurrency bounds, timeouts, no redirects,
  address policy at connect time (SSRF, DNS rebinding), one outcome object per attempt;
* :mod:`orbit_delivery.circuits` -- per-endpoint circuit breakers (pure logic);
* :mod:`orbit_delivery.metrics` -- the pump's Prometheus metrics;
* :mod:`orbit_delivery.pushing` -- one webhook attempt: circuit, signing, sending, recording.
"""

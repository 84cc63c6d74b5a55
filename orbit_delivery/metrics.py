"""The delivery pump's Prometheus metrics.

* ``orbit_delivery_attempts_total{outcome}`` -- webhook attempts by
  :attr:`~orbit_delivery.sender.SendOutcome.kind` (``delivered``, ``http_4xx``, ``http_5xx``,
  ``timeout``, ``refused``, ``dns``, ``tls``, ``address_refused``, …); a send an open circuit
  stops is no attempt (``orbit_delivery_released_total{reason="circuit_open"}``);
* ``orbit_delivery_attempt_duration_seconds{outcome}`` -- how long the attempts took;
* ``orbit_delivery_sends_in_flight`` -- requests on the wire now;
* ``orbit_delivery_endpoint_circuits{state}`` -- active webhook subscriptions whose endpoint
  circuit (kept on the subscription row, orbit_common/relay/circuit.py) is ``closed`` /
  ``open`` / ``half_open``, as the database says;
* ``orbit_delivery_backlog`` / ``orbit_delivery_backlog_max`` -- open (PENDING + LEASED)
  deliveries of active subscriptions: the sum and the largest one (with tenant labels, one
  ``orbit_delivery_backlog{namespace,subscription}`` series per subscription instead of the
  sum);
* ``orbit_delivery_released_total`` -- leased deliveries handed back unsent (an open circuit,
  a draining pump): no attempt spent;
* ``orbit_delivery_fanout_created_total`` -- deliveries created by fan-out;
* ``orbit_delivery_exhausted_total`` -- deliveries that spent their budget;
* ``orbit_delivery_ack_lag_seconds`` -- from the result's commit to the acknowledgement.

Tenant labels. By default no series names a tenant: the labels above are closed sets. With
``tenant_labels=True`` (``[delivery] metrics_tenant_labels``) the attempt counter, the exhausted
counter and the lag histogram gain a ``namespace`` label and the backlog is per subscription;
endpoints (hosts of customers) are never labels, only counted by circuit state. Without tenant
labels a ``namespace`` passed in is recorded as :data:`ALL`, like the usage gauges
(orbit_common/pulse/usage.py).
"""

from __future__ import annotations

import prometheus_client

from orbit_common.relay.gauges import Backlog
from orbit_delivery.sender import SendOutcome, WebhookSender

# The collapsed namespace label; names start with [a-z0-9], so no namespace is called this.
ALL = "_all"
CIRCUIT_STATES = ("closed", "open", "half_open")
RELEASE_REASONS = ("circuit_open", "draining", "no_secret")

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)

_DEFAULT: dict[bool, PumpMetrics] = {}


class PumpMetrics:
    """The pump's metrics in ``registry`` (a test's own), or -- through :func:`default` -- in
    the process-wide registry that ``/metrics`` serves."""

    def __init__(self, registry: prometheus_client.CollectorRegistry, *,
                 tenant_labels: bool = False) -> None:
        self.registry = registry
        self.tenant_labels = tenant_labels
        tenant = ["namespace"] if tenant_labels else []
        self.attempts = prometheus_client.Counter(
            "orbit_delivery_attempts_total",
            "Webhook delivery attempts by outcome.",
            [*tenant, "outcome"], registry=registry)
        self.duration = prometheus_client.Histogram(
            "orbit_delivery_attempt_duration_seconds",
            "Duration of webhook delivery attempts, by outcome.",
            ["outcome"], buckets=DURATION_BUCKETS, registry=registry)
        self.in_flight = prometheus_client.Gauge(
            "orbit_delivery_sends_in_flight", "Webhook requests on the wire now.",
            registry=registry)
        self.circuits = prometheus_client.Gauge(
            "orbit_delivery_endpoint_circuits",
            "Active webhook subscriptions by endpoint circuit state (from the database).",
            ["state"], registry=registry)
        self.backlog = prometheus_client.Gauge(
            "orbit_delivery_backlog",
            "Open (PENDING + LEASED) deliveries of active subscriptions"
            + (", per subscription." if tenant_labels else ", summed."),
            ["namespace", "subscription"] if tenant_labels else [], registry=registry)
        self.backlog_max = prometheus_client.Gauge(
            "orbit_delivery_backlog_max",
            "The largest backlog of one active subscription.", registry=registry)
        self.released = prometheus_client.Counter(
            "orbit_delivery_released_total",
            "Leased deliveries handed back unsent (open circuit, draining, no secret): no attempt"
            " spent.",
            ["reason"], registry=registry)
        self.created = prometheus_client.Counter(
            "orbit_delivery_fanout_created_total", "Deliveries created by fan-out.",
            registry=registry)
        self.exhausted = prometheus_client.Counter(
            "orbit_delivery_exhausted_total",
            "Deliveries that spent their attempt budget without an acknowledgement.",
            tenant, registry=registry)
        self.ack_lag = prometheus_client.Histogram(
            "orbit_delivery_ack_lag_seconds",
            "Time from a result's commit to its delivery's acknowledgement.",
            tenant, buckets=LAG_BUCKETS, registry=registry)
        for state in CIRCUIT_STATES:
            self.circuits.labels(state).set(0)
        for reason in RELEASE_REASONS:
            self.released.labels(reason)

    def _tenant(self, namespace: str | None) -> list[str]:
        if not self.tenant_labels:
            return []
        return [namespace or ALL]

    def attempt(self, outcome: SendOutcome, *, namespace: str | None = None) -> None:
        """Count one attempt and observe its duration."""
        self.attempts.labels(*self._tenant(namespace), outcome.kind).inc()
        self.duration.labels(outcome.kind).observe(outcome.duration_ms / 1000)

    def exhausted_delivery(self, *, namespace: str | None = None) -> None:
        counter = self.exhausted
        if self.tenant_labels:
            counter = counter.labels(namespace or ALL)
        counter.inc()

    def acknowledged(self, lag_s: float, *, namespace: str | None = None) -> None:
        histogram = self.ack_lag
        if self.tenant_labels:
            histogram = histogram.labels(namespace or ALL)
        histogram.observe(max(lag_s, 0.0))

    def watch(self, sender: WebhookSender) -> None:
        """Report ``sender``'s in-flight count whenever metrics are scraped."""
        self.in_flight.set_function(lambda: sender.in_flight)

    def set_circuits(self, counts: dict[str, int]) -> None:
        """``counts``: subscriptions per circuit state as stored (``CLOSED``, ``OPEN``, …)."""
        for state in CIRCUIT_STATES:
            self.circuits.labels(state).set(counts.get(state.upper(), 0))

    def set_backlogs(self, backlogs: list[Backlog]) -> None:
        self.backlog_max.set(max((b.backlog for b in backlogs), default=0))
        if not self.tenant_labels:
            self.backlog.set(sum(b.backlog for b in backlogs))
            return
        self.backlog.clear()  # a removed or paused subscription's series goes away
        for b in backlogs:
            self.backlog.labels(b.namespace, b.subscription).set(b.backlog)

def default(*, tenant_labels: bool = False) -> PumpMetrics:
    """The process-wide metrics (created on first use; one label set per process)."""
    if not _DEFAULT:
        _DEFAULT[tenant_labels] = PumpMetrics(prometheus_client.REGISTRY,
                                              tenant_labels=tenant_labels)
    metrics = next(iter(_DEFAULT.values()))
    if metrics.tenant_labels != tenant_labels:
        raise ValueError("the pump's metrics were registered with the other tenant_labels")
    return metrics

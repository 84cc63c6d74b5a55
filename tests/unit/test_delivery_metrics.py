"""The delivery pump's metrics (orbit_delivery/metrics.py): outcomes, circuits, tenant labels."""

from __future__ import annotations

import prometheus_client

from orbit_common.relay.gauges import Backlog
from orbit_delivery.metrics import PumpMetrics
from orbit_delivery.sender import SenderLimits, SendOutcome, TransportError, WebhookSender


def value(registry: prometheus_client.CollectorRegistry, name: str,
          **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def scrape(registry: prometheus_client.CollectorRegistry) -> str:
    return prometheus_client.generate_latest(registry).decode()


def test_attempts_are_counted_by_outcome_without_tenant_labels() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry)
    metrics.attempt(SendOutcome(delivered=True, duration_ms=12, status=200), namespace="acme")
    metrics.attempt(SendOutcome(delivered=False, duration_ms=30, status=503), namespace="acme")
    metrics.attempt(SendOutcome(delivered=False, duration_ms=5000,
                                error=TransportError.TIMEOUT), namespace="acme")
    metrics.exhausted_delivery(namespace="acme")
    metrics.acknowledged(0.2, namespace="acme")
    assert value(registry, "orbit_delivery_attempts_total", outcome="delivered") == 1
    assert value(registry, "orbit_delivery_attempts_total", outcome="http_5xx") == 1
    assert value(registry, "orbit_delivery_attempts_total", outcome="timeout") == 1
    assert value(registry, "orbit_delivery_attempt_duration_seconds_sum", outcome="timeout") == 5
    assert value(registry, "orbit_delivery_exhausted_total") == 1
    assert value(registry, "orbit_delivery_ack_lag_seconds_count") == 1
    assert "acme" not in scrape(registry)


def test_tenant_labels_add_the_namespace() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry, tenant_labels=True)
    metrics.attempt(SendOutcome(delivered=True, duration_ms=1, status=204), namespace="acme")
    metrics.exhausted_delivery(namespace="acme")
    metrics.acknowledged(1.5)
    assert value(registry, "orbit_delivery_attempts_total", namespace="acme",
                 outcome="delivered") == 1
    assert value(registry, "orbit_delivery_exhausted_total", namespace="acme") == 1
    assert value(registry, "orbit_delivery_ack_lag_seconds_count", namespace="_all") == 1


def test_circuit_states_are_counted_never_named() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry, tenant_labels=True)
    metrics.set_circuits({"OPEN": 2, "CLOSED": 5})
    assert value(registry, "orbit_delivery_endpoint_circuits", state="open") == 2
    assert value(registry, "orbit_delivery_endpoint_circuits", state="closed") == 5
    assert value(registry, "orbit_delivery_endpoint_circuits", state="half_open") == 0


BACKLOGS = [Backlog(namespace="acme", subscription="billing", backlog=7),
            Backlog(namespace="acme", subscription="audit", backlog=2)]


def test_the_backlog_is_summed_without_tenant_labels() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry)
    metrics.set_backlogs(BACKLOGS)
    assert value(registry, "orbit_delivery_backlog") == 9
    assert value(registry, "orbit_delivery_backlog_max") == 7
    assert "acme" not in scrape(registry)
    assert "billing" not in scrape(registry)


def test_the_backlog_is_per_subscription_with_tenant_labels() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry, tenant_labels=True)
    metrics.set_backlogs(BACKLOGS)
    assert value(registry, "orbit_delivery_backlog", namespace="acme",
                 subscription="billing") == 7
    metrics.set_backlogs(BACKLOGS[1:])  # billing paused or deleted: its series goes away
    assert value(registry, "orbit_delivery_backlog", namespace="acme",
                 subscription="billing") is None
    assert value(registry, "orbit_delivery_backlog_max") == 2


async def test_in_flight_follows_the_sender() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PumpMetrics(registry)
    async with WebhookSender(SenderLimits(), address_refused=lambda _ip: False) as sender:
        metrics.watch(sender)
        sender.in_flight = 3  # what send() keeps while requests are out
        assert value(registry, "orbit_delivery_sends_in_flight") == 3

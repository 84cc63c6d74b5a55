"""The workflow engine's Prometheus metrics.

* ``orbit_weave_advances_total{outcome}`` -- inbox rows and pending advances handled, by outcome
  (``advanced``, ``held``, ``duplicate``, ``stale``, ``closed_block``, ``instance_ended``,
  ``rejected``, ``paused``, ``stopping``; ``fenced``: a row whose lease another replica took
  before this one locked it;
  ``error``: an advance that failed and rolled back, its rows' leases will lapse);
* ``orbit_weave_advance_duration_seconds`` -- one instance's advance transaction;
* ``orbit_weave_result_to_advance_seconds`` -- database time from a task's ending commit (its
  inbox row's creation) to the advance that consumed it: result commit → next task created;
* ``orbit_weave_inbox_backlog`` / ``orbit_weave_inbox_oldest_age_seconds`` -- PENDING + LEASED
  inbox rows and the age of the oldest (database time);
* ``orbit_weave_advances_due`` -- pending advances due or leased;
* ``orbit_weave_advances_overdue_seconds`` -- database time since the oldest due, not yet leased
  pending advance came due (how late timers, signal timeouts and poll rounds are running);
* ``orbit_weave_signals_pending`` -- PENDING + LEASED signals (accepted, not yet consumed or
  rejected: waiting for their wait, backing off, or in an engine's hands);
* ``orbit_weave_inbox_quarantined`` -- QUARANTINED inbox rows (links missing: a person looks);
* ``orbit_weave_instances{state}`` -- instances by state;
* ``orbit_weave_instances_paused`` / ``orbit_weave_checkpoints_parked`` -- paused instances and
  the checkpoints they parked (results, due timers and poll rounds) that a resume replays;
* ``orbit_weave_instances_stopping`` -- instances with a stop intent (a cancel or a failure
  settlement) still waiting for in-flight steps (docs/weave/stop.md): one that stays up names
  a worker that does not stop its task.

The gauges come from the database every ``[weave] gauge_interval_s``; no series names a tenant.
"""

from __future__ import annotations

import prometheus_client

from orbit_common.weave.engine import FAILED_ADVANCE, FENCED, OUTCOMES, Gauges, Round
from orbit_common.weave.instances import STATES

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_DEFAULT: list[EngineMetrics] = []


class EngineMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.registry = registry
        self.advances = prometheus_client.Counter(
            "orbit_weave_advances_total",
            "Inbox rows and pending advances handled by the engine, by outcome.",
            ["outcome"], registry=registry)
        self.duration = prometheus_client.Histogram(
            "orbit_weave_advance_duration_seconds",
            "Duration of one instance's advance transaction.",
            buckets=DURATION_BUCKETS, registry=registry)
        self.latency = prometheus_client.Histogram(
            "orbit_weave_result_to_advance_seconds",
            "From a task's ending commit to the advance that consumed its result.",
            buckets=LATENCY_BUCKETS, registry=registry)
        self.backlog = prometheus_client.Gauge(
            "orbit_weave_inbox_backlog", "PENDING + LEASED inbox rows.", registry=registry)
        self.oldest = prometheus_client.Gauge(
            "orbit_weave_inbox_oldest_age_seconds",
            "Age of the oldest PENDING or LEASED inbox row (database time).", registry=registry)
        self.due = prometheus_client.Gauge(
            "orbit_weave_advances_due", "Pending advances due or leased.", registry=registry)
        self.overdue = prometheus_client.Gauge(
            "orbit_weave_advances_overdue_seconds",
            "Since the oldest due, unleased pending advance came due (database time).",
            registry=registry)
        self.signals_pending = prometheus_client.Gauge(
            "orbit_weave_signals_pending", "PENDING + LEASED workflow signals.",
            registry=registry)
        self.quarantined = prometheus_client.Gauge(
            "orbit_weave_inbox_quarantined", "QUARANTINED inbox rows.", registry=registry)
        self.instances = prometheus_client.Gauge(
            "orbit_weave_instances", "Workflow instances by state.", ["state"],
            registry=registry)
        self.paused = prometheus_client.Gauge(
            "orbit_weave_instances_paused", "Paused workflow instances.", registry=registry)
        self.checkpoints = prometheus_client.Gauge(
            "orbit_weave_checkpoints_parked",
            "Checkpoints parked while instances were paused, waiting for the replay.",
            registry=registry)
        self.stopping = prometheus_client.Gauge(
            "orbit_weave_instances_stopping",
            "Workflow instances stopping: stop intent recorded, in-flight steps still running.",
            registry=registry)
        for outcome in (*OUTCOMES, FENCED, FAILED_ADVANCE):
            self.advances.labels(outcome)

    def record(self, done: Round) -> None:
        for outcome, count in done.outcomes.items():
            self.advances.labels(outcome).inc(count)
        for seconds in done.advance_seconds:
            self.duration.observe(seconds)
        for seconds in done.result_latency_seconds:
            self.latency.observe(seconds)

    def set_gauges(self, found: Gauges) -> None:
        self.backlog.set(found.inbox_backlog)
        self.oldest.set(found.inbox_oldest_age_s)
        self.due.set(found.advances_due)
        self.quarantined.set(found.quarantined)
        self.overdue.set(found.advances_overdue_s)
        self.signals_pending.set(found.signals_pending)
        self.paused.set(found.paused)
        self.checkpoints.set(found.checkpoints)
        self.stopping.set(found.instances.get("STOPPING", 0))
        for state in STATES:
            self.instances.labels(state).set(found.instances.get(state, 0))


def default() -> EngineMetrics:
    """The process-wide metrics (created on first use)."""
    if not _DEFAULT:
        _DEFAULT.append(EngineMetrics(prometheus_client.REGISTRY))
    return _DEFAULT[0]

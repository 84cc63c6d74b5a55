"""Per-endpoint circuit breakers (orbit_delivery/circuits.py): examples and a Hypothesis model."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orbit_delivery.circuits import (
    Circuit,
    CircuitBreakers,
    CircuitPolicy,
    CircuitState,
    Ticket,
)

POLICY = CircuitPolicy(failure_threshold=3, open_base_s=10, open_factor=2, open_max_s=50)


def fail(circuit: Circuit, now: float) -> None:
    ticket = circuit.allow(now)
    assert ticket is not None
    circuit.failure(ticket, now)


def test_n_consecutive_failures_open_the_circuit() -> None:
    circuit = Circuit(policy=POLICY)
    fail(circuit, 0)
    fail(circuit, 0)
    ticket = circuit.allow(0)
    assert ticket is not None
    circuit.success(ticket)  # a success in between resets the count
    fail(circuit, 0)
    fail(circuit, 0)
    assert circuit.state is CircuitState.CLOSED
    fail(circuit, 1)
    assert circuit.state is CircuitState.OPEN
    assert circuit.allow(5) is None
    assert circuit.retry_at(5) == 11


def test_the_open_period_grows_with_repeated_openings_up_to_the_cap() -> None:
    circuit = Circuit(policy=POLICY)
    for _ in range(3):
        fail(circuit, 0)
    periods = []
    now = 0.0
    for _ in range(5):
        periods.append(circuit.open_until - now)
        now = circuit.open_until
        probe = circuit.allow(now)
        assert probe is not None
        assert probe.probe
        assert circuit.state is CircuitState.HALF_OPEN
        circuit.failure(probe, now)  # the probe fails: open again, longer
    assert periods == [10, 20, 40, 50, 50]
    probe = circuit.allow(circuit.open_until)
    assert probe is not None
    circuit.success(probe)
    assert circuit.state is CircuitState.CLOSED
    for _ in range(3):  # after closing, the next opening starts from the base period again
        fail(circuit, 1000)
    assert circuit.open_until == 1010


def test_half_open_lets_one_probe_through() -> None:
    circuit = Circuit(policy=POLICY)
    for _ in range(3):
        fail(circuit, 0)
    probe = circuit.allow(10)
    assert probe is not None
    assert circuit.allow(10) is None
    assert circuit.allow(99) is None
    circuit.abandon(probe)  # the probe's send was cancelled: someone else may probe
    again = circuit.allow(99)
    assert again is not None
    assert again.probe


def test_a_stale_report_changes_nothing() -> None:
    circuit = Circuit(policy=POLICY)
    slow = circuit.allow(0)  # allowed while closed, answers after the circuit opened
    assert slow is not None
    for _ in range(3):
        fail(circuit, 0)
    circuit.success(slow)
    assert circuit.state is CircuitState.OPEN
    probe = circuit.allow(10)
    assert probe is not None
    circuit.success(probe)
    circuit.failure(slow, 10)  # and a stale failure does not count against the closed one
    assert (circuit.state, circuit.failures) == (CircuitState.CLOSED, 0)


def test_breakers_keep_endpoints_apart_and_forget_healthy_ones() -> None:
    breakers = CircuitBreakers(POLICY)
    for _ in range(3):
        fail(breakers.get("https://a:443"), 0)
    fail(breakers.get("https://b:443"), 0)
    ticket = breakers.get("https://c:443").allow(0)
    assert ticket is not None
    breakers.get("https://c:443").success(ticket)
    assert breakers.state("https://a:443") is CircuitState.OPEN
    assert breakers.state("https://b:443") is CircuitState.CLOSED
    assert breakers.counts() == {CircuitState.CLOSED: 2, CircuitState.OPEN: 1,
                                 CircuitState.HALF_OPEN: 0}
    breakers.prune()
    assert set(breakers.circuits) == {"https://a:443", "https://b:443"}
    assert breakers.state("https://never-seen:443") is CircuitState.CLOSED


class CircuitModel(RuleBasedStateMachine):
    """Random allows, reports, abandons and clock steps; the rules' invariants must hold."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = CircuitPolicy(failure_threshold=3, open_base_s=1, open_factor=3,
                                    open_max_s=20)
        self.circuit = Circuit(policy=self.policy)
        self.now = 0.0
        self.outstanding: list[Ticket] = []
        self.closed_failures = 0  # consecutive current-epoch failures reported while CLOSED

    @rule(step=st.floats(min_value=0, max_value=30))
    def advance(self, step: float) -> None:
        self.now += step

    @rule()
    def allow(self) -> None:
        before = self.circuit.state
        refusing = before is CircuitState.OPEN and self.now < self.circuit.open_until
        ticket = self.circuit.allow(self.now)
        if refusing:
            assert ticket is None, "an open circuit let a send through"
        if ticket is not None:
            self.outstanding.append(ticket)

    def _take(self, index: int) -> Ticket:
        return self.outstanding.pop(index % len(self.outstanding))

    @precondition(lambda self: self.outstanding)
    @rule(index=st.integers(min_value=0), outcome=st.sampled_from(["success", "failure",
                                                                    "abandon"]))
    def report(self, index: int, outcome: str) -> None:
        ticket = self._take(index)
        circuit = self.circuit
        before = (circuit.state, circuit.failures, circuit.openings, circuit.open_until,
                  circuit.probe_out, circuit.epoch)
        current = ticket.epoch == circuit.epoch
        was_closed = circuit.state is CircuitState.CLOSED
        if outcome == "success":
            circuit.success(ticket)
        elif outcome == "failure":
            circuit.failure(ticket, self.now)
        else:
            circuit.abandon(ticket)
        if not current:
            after = (circuit.state, circuit.failures, circuit.openings, circuit.open_until,
                     circuit.probe_out, circuit.epoch)
            assert after == before, "a stale ticket changed the circuit"
            return
        if ticket.probe and outcome == "success":
            assert circuit.state is CircuitState.CLOSED
        if ticket.probe and outcome == "failure":
            assert circuit.state is CircuitState.OPEN
            period = circuit.open_until - self.now
            assert self.policy.open_base_s <= period <= self.policy.open_max_s
        if was_closed and outcome == "failure":
            self.closed_failures += 1
            if self.closed_failures >= self.policy.failure_threshold:
                assert circuit.state is CircuitState.OPEN, "threshold reached, still closed"
        if was_closed and outcome == "success":
            self.closed_failures = 0

    @invariant()
    def track_epochs(self) -> None:
        if self.circuit.state is not CircuitState.CLOSED:
            self.closed_failures = 0

    @invariant()
    def at_most_one_probe_in_flight(self) -> None:
        probes = [t for t in self.outstanding if t.probe and t.epoch == self.circuit.epoch]
        assert len(probes) <= 1
        if self.circuit.state is not CircuitState.HALF_OPEN:
            assert probes == []
        assert self.circuit.probe_out == bool(probes)

    @invariant()
    def closed_means_below_threshold(self) -> None:
        if self.circuit.state is CircuitState.CLOSED:
            assert self.circuit.failures < self.policy.failure_threshold


TestCircuitModel = CircuitModel.TestCase
TestCircuitModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)

"""Per-endpoint circuit breakers: an endpoint that keeps failing stops costing sends.

State diagram (one :class:`Circuit` per endpoint, ``scheme://host:port``)::

    CLOSED --N consecutive failures--> OPEN --open period over, next allow()--> HALF_OPEN
      ^                                  ^                                        |
      |                                  +-------------- probe fails -------------+
      +--------------------------------------------------- probe succeeds --------+

* CLOSED lets every send through; a success resets the failure count.
* OPEN refuses every send until ``open_until``. The open period is ``base × factor^(k-1)`` for
  the k-th opening in a row, capped at ``max``; closing resets k.
* HALF_OPEN lets exactly one send through, the probe; while it is out, every other send is
  refused. Its success closes the circuit, its failure opens it again (k + 1). A probe that
  ends without an outcome (the send was cancelled) is :meth:`Circuit.abandon`\\ ed, which lets
  the next caller probe.

Every permission is a :class:`Ticket` stamped with the circuit's epoch (bumped on every state
change); a report whose epoch is not current is ignored, so a slow send allowed before the
circuit opened cannot close it, and one allowed before it closed cannot open it again.

Pure logic: callers pass ``now`` (a monotonic clock reading, seconds). This is an in-memory
accelerator, not a lease decision: losing it (a pump restart) only means a few extra sends to a
failing endpoint. A refused send is not a delivery attempt; the caller postpones it to
:meth:`Circuit.retry_at`.
"""

from __future__ import annotations

import enum
import itertools

import attrs

# Epochs are unique in the process, not per circuit: a ticket of a forgotten (pruned) circuit
# can never match the epoch of the endpoint's next circuit.
_EPOCHS = itertools.count(1)


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@attrs.frozen(kw_only=True)
class CircuitPolicy:
    failure_threshold: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    open_base_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    open_factor: float = attrs.field(default=2.0, validator=attrs.validators.ge(1))
    open_max_s: float = attrs.field(default=300.0, validator=attrs.validators.gt(0))

    def open_period(self, openings: int) -> float:
        """Seconds the circuit stays open at its ``openings``-th opening in a row (1-based)."""
        exponent = min(openings - 1, 64)  # beyond this the cap has long been reached
        return min(self.open_base_s * self.open_factor ** exponent, self.open_max_s)


@attrs.frozen(kw_only=True)
class Ticket:
    """Permission for one send: ``probe`` when it is the half-open circuit's probe."""

    epoch: int
    probe: bool


@attrs.define(kw_only=True)
class Circuit:
    policy: CircuitPolicy
    state: CircuitState = CircuitState.CLOSED
    failures: int = 0  # consecutive failures while CLOSED
    openings: int = 0  # openings in a row since the circuit last closed
    open_until: float = 0.0
    probe_out: bool = False
    epoch: int = attrs.field(factory=lambda: next(_EPOCHS))

    def allow(self, now: float) -> Ticket | None:
        """A ticket to send now, or ``None``: the circuit refuses (see :meth:`retry_at`)."""
        if self.state is CircuitState.OPEN:
            if now < self.open_until:
                return None
            self._move(CircuitState.HALF_OPEN)
        if self.state is CircuitState.HALF_OPEN:
            if self.probe_out:
                return None
            self.probe_out = True
            return Ticket(epoch=self.epoch, probe=True)
        return Ticket(epoch=self.epoch, probe=False)

    def success(self, ticket: Ticket) -> None:
        if ticket.epoch != self.epoch:
            return
        if ticket.probe:
            self.openings = 0
            self._move(CircuitState.CLOSED)
        else:
            self.failures = 0

    def failure(self, ticket: Ticket, now: float) -> None:
        if ticket.epoch != self.epoch:
            return
        if ticket.probe:
            self._open(now)
            return
        self.failures += 1
        if self.failures >= self.policy.failure_threshold:
            self._open(now)

    def abandon(self, ticket: Ticket) -> None:
        """The send ended without an outcome: free the probe slot it held, if any."""
        if ticket.epoch == self.epoch and ticket.probe:
            self.probe_out = False

    def retry_at(self, now: float) -> float:
        """The earliest time a refused send may be tried again (``now`` when not refusing)."""
        if self.state is CircuitState.OPEN:
            return max(now, self.open_until)
        return now

    def _open(self, now: float) -> None:
        self.openings += 1
        self.open_until = now + self.policy.open_period(self.openings)
        self._move(CircuitState.OPEN)

    def _move(self, state: CircuitState) -> None:
        self.state = state
        self.failures = 0
        self.probe_out = False
        self.epoch = next(_EPOCHS)


class CircuitBreakers:
    """The circuits of every endpoint this pump sends to. A closed circuit with no failures
    is forgotten (:meth:`prune`), so the map holds only endpoints with something to remember."""

    def __init__(self, policy: CircuitPolicy | None = None) -> None:
        self.policy = policy or CircuitPolicy()
        self.circuits: dict[str, Circuit] = {}

    def get(self, endpoint: str) -> Circuit:
        circuit = self.circuits.get(endpoint)
        if circuit is None:
            circuit = self.circuits[endpoint] = Circuit(policy=self.policy)
        return circuit

    def state(self, endpoint: str) -> CircuitState:
        circuit = self.circuits.get(endpoint)
        return CircuitState.CLOSED if circuit is None else circuit.state

    def counts(self) -> dict[CircuitState, int]:
        """Endpoints per state (closed counts only remembered ones)."""
        counts = dict.fromkeys(CircuitState, 0)
        for circuit in self.circuits.values():
            counts[circuit.state] += 1
        return counts

    def prune(self) -> None:
        for endpoint, circuit in list(self.circuits.items()):
            if circuit.state is CircuitState.CLOSED and circuit.failures == 0:
                del self.circuits[endpoint]

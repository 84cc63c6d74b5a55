"""Bounded exponential backoff with jitter, for client retries and worker reconnects."""

from __future__ import annotations

import random

import attrs


@attrs.define
class Backoff:
    """Delays for successive retries: uniform in ``[c / 2, c]`` with
    ``c = min(maximum, initial * 2**n)`` ("equal jitter": never zero, never above the cap)."""

    initial: float = 0.1
    maximum: float = 5.0
    _failures: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(factory=random.Random, init=False, repr=False)

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * (2 ** min(self._failures, 30)))
        self._failures += 1
        # Jitter spreads reconnect storms; not a security use of randomness.
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._failures = 0

    @property
    def failures(self) -> int:
        return self._failures

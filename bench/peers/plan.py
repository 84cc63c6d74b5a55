"""The pure part of ``orbit bench peers``: which system runs when, and how rounds become figures.

Every system is timed the same way: the queue is filled before the clock, the consumers start,
and the drain is **first claim to last finish**, each read from the system's own record of those
two moments:

- Orbit: ``MIN(pulse_attempts.offered_at)`` (the claim's database time) to
  ``MAX(pulse_tasks.updated_at)`` over the SUCCEEDED tasks (the finish commit's database time);
- PgQueuer: the first ``picked`` row to the last ``successful`` row of ``pgqueuer_log`` (both
  ``now()`` of the claim and of the finish transaction);
- Celery: the worker's first ``task_received`` to its children's last ``task_postrun`` (the
  machine's clock; the acknowledgement follows the postrun within the same millisecond).

Orbit's submit-while-draining figure (``orbit bench tasks``' end-to-end ``tasks_per_s``: workers
connected first, tasks submitted through the API while they drain) is reported beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

SYSTEMS = ("orbit", "pgqueuer", "celery")

# Per-round figure -> the median field of the JSON line.
FIGURES = {
    "orbit": "orbit_tasks_per_s",
    "orbit_submit_while_draining": "orbit_submit_while_draining_tasks_per_s",
    "pgqueuer": "pgqueuer_tasks_per_s",
    "celery": "celery_tasks_per_s",
}

TIMING = "first claim to last finish, queue filled before the clock"


def round_order(index: int) -> tuple[str, ...]:
    """The systems of round ``index`` (from 0), rotated by one each round, so that over three
    rounds each system runs once first, once in the middle and once last."""
    shift = index % len(SYSTEMS)
    return SYSTEMS[shift:] + SYSTEMS[:shift]


def schedule(rounds: int) -> list[tuple[int, str]]:
    """Every (round, system) step in the order they run."""
    if rounds < 1:
        raise ValueError("at least one round")
    return [(index, system) for index in range(rounds) for system in round_order(index)]


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("no figures")
    return round(statistics.median(values), 1)


def summarise(rounds: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The medians of the per-round figures, the ratios Orbit is judged by, and the rounds."""
    result: dict[str, Any] = {
        field: median([one[figure] for one in rounds]) for figure, field in FIGURES.items()}
    for peer in ("pgqueuer", "celery"):
        result[f"orbit_ratio_to_{peer}"] = round(
            result["orbit_tasks_per_s"] / result[f"{peer}_tasks_per_s"], 3)
    result["rounds"] = [{FIGURES[figure]: one[figure] for figure in FIGURES} for one in rounds]
    result["timing"] = TIMING
    return result


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of ``/proc/cpuinfo``'s text ("unknown" when there is none)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and value.strip():
            return value.strip()
    return "unknown"

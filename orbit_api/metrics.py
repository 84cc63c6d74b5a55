"""The API process's own metrics (besides the HTTP ones of orbit_common.service.http).

``orbit_weave_recoveries_total{kind}``: manual recoveries of workflow steps the API committed
(``retry``, ``resolve``, ``rearm``, ``continue``; a replay of an earlier request under its
``Idempotency-Key`` is not counted). Routes call :func:`count_recovery` after the transaction
committed.
"""

from __future__ import annotations

import prometheus_client

RECOVERY_KINDS = ("retry", "resolve", "rearm", "continue")

RECOVERIES = prometheus_client.Counter(
    "orbit_weave_recoveries_total",
    "Manual recoveries of workflow steps committed by the API, by kind (replays not counted).",
    ["kind"],
)
for _kind in RECOVERY_KINDS:  # every kind is exported from the start, at 0
    RECOVERIES.labels(kind=_kind)


def count_recovery(kind: str) -> None:
    """Count one committed recovery of ``kind`` (one of :data:`RECOVERY_KINDS`)."""
    if kind not in RECOVERY_KINDS:
        raise ValueError(f"unknown recovery kind {kind!r}")
    RECOVERIES.labels(kind=kind).inc()

"""The API's own metrics (orbit_api/metrics.py): the recovery counter and its helper."""

from __future__ import annotations

import prometheus_client
import pytest

from orbit_api.metrics import RECOVERY_KINDS, count_recovery


def _value(kind: str) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(
        "orbit_weave_recoveries_total", {"kind": kind})


def test_every_kind_is_exported_and_counted() -> None:
    assert RECOVERY_KINDS == ("retry", "resolve", "rearm", "continue")
    for kind in RECOVERY_KINDS:
        before = _value(kind)
        assert before is not None  # exported from the start
        count_recovery(kind)
        assert _value(kind) == before + 1


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown recovery kind"):
        count_recovery("undo")
    assert _value("undo") is None

"""The console's server-side bar charts (orbit_api/console/charts.py)."""

from __future__ import annotations

from orbit_api.console.charts import LABEL_ROW, bar_chart


def test_bars_scale_to_the_largest_value_and_stand_on_the_baseline() -> None:
    chart = bar_chart([("a", 2), ("b", 8), ("c", 0)], title="t", width=300, height=100)
    a, b, c = chart.bars
    assert chart.maximum == 8
    assert chart.baseline == 100 - LABEL_ROW
    assert b.height == chart.baseline - 10  # the tallest leaves room for its value
    assert a.height == b.height / 4
    assert c.height == 0
    for bar in chart.bars:
        assert bar.y + bar.height == chart.baseline
    assert [bar.x for bar in chart.bars] == sorted(bar.x for bar in chart.bars)
    assert chart.labelled  # 100 px a bar


def test_an_empty_or_all_zero_chart_is_flat_and_crowded_bars_lose_their_labels() -> None:
    assert bar_chart([], title="t").bars == ()
    flat = bar_chart([(str(i), 0) for i in range(12)], title="t", width=360)
    assert flat.maximum == 1
    assert {bar.height for bar in flat.bars} == {0}
    assert not flat.labelled  # 30 px a bar

"""Small charts drawn on the server as SVG geometry (the templates draw the shapes): no script,
no external library, readable without a browser plug-in."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    value: int
    label: str


@attrs.frozen(kw_only=True)
class BarChart:
    width: int
    height: int  # the whole drawing, the label row included
    baseline: float  # where the bars stand
    bars: tuple[Bar, ...]
    maximum: int
    title: str
    labelled: bool  # room enough to write each bar's label under it


LABEL_ROW = 14
LABEL_MIN_SLOT = 48  # px a bar needs for its label to be written


def bar_chart(values: list[tuple[str, int]], *, title: str, width: int = 360,
              height: int = 80, gap: float = 2.0) -> BarChart:
    """Bars for ``(label, value)`` pairs left to right, scaled to the largest value (at least
    1, so an all-zero chart is flat rather than undefined); each label is under its bar when
    there is room, and always in the bar's tooltip."""
    top = max([1, *(v for _label, v in values)])
    count = max(1, len(values))
    slot = width / count
    baseline = height - LABEL_ROW
    bars = []
    for index, (label, value) in enumerate(values):
        h = (baseline - 10) * max(0, value) / top
        bars.append(Bar(x=round(index * slot + gap / 2, 2), y=round(baseline - h, 2),
                        width=round(max(1.0, slot - gap), 2), height=round(h, 2),
                        value=value, label=label))
    return BarChart(width=width, height=height, baseline=baseline, bars=tuple(bars),
                    maximum=top, title=title, labelled=slot >= LABEL_MIN_SLOT)

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
    height: int
    bars: tuple[Bar, ...]
    maximum: int
    title: str


def bar_chart(values: list[tuple[str, int]], *, title: str, width: int = 360,
              height: int = 80, gap: float = 2.0) -> BarChart:
    """Bars for ``(label, value)`` pairs left to right, scaled to the largest value (at least
    1, so an all-zero chart is flat rather than undefined)."""
    top = max([1, *(v for _label, v in values)])
    count = max(1, len(values))
    slot = width / count
    bars = []
    for index, (label, value) in enumerate(values):
        h = (height - 12) * max(0, value) / top
        bars.append(Bar(x=round(index * slot + gap / 2, 2), y=round(height - h, 2),
                        width=round(max(1.0, slot - gap), 2), height=round(h, 2),
                        value=value, label=label))
    return BarChart(width=width, height=height, bars=tuple(bars), maximum=top, title=title)

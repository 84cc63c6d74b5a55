"""Small charts drawn on the server as SVG geometry (the templates draw the shapes): no script,
no external library, readable without a browser plug-in. The bar charts of the overview, and
a workflow definition's steps and transitions as a graph (coloured by state on an instance)."""

from __future__ import annotations

import attrs

from orbit_common.weave import language


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


@attrs.frozen(kw_only=True)
class Node:
    name: str
    kind: str
    x: float  # the box's top-left corner
    y: float
    state: str | None  # the instance's step state; None on a definition, or not reached yet


@attrs.frozen(kw_only=True)
class Edge:
    source: str
    target: str
    label: str  # the transition's field: next, on_failure, default, choice 1, a branch's name
    x1: float
    y1: float
    x2: float
    y2: float


@attrs.frozen(kw_only=True)
class StepGraph:
    width: int
    height: int
    node_width: int
    node_height: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    title: str
    coloured: bool  # drawn for an instance: a box without a state is a step not reached yet


NODE_WIDTH = 132
NODE_HEIGHT = 40
COLUMN_GAP = 56
ROW_GAP = 18
MARGIN = 8


def _transitions(definition: language.Definition) -> list[tuple[str, str, str]]:
    """(source, target, label) of every transition, a PARALLEL step's arrow to each of its
    branches' first steps included; ``$hold`` is no transition."""
    found = []
    for name, step in definition.all_steps.items():
        for where, target in language.targets(step):
            field = where.rsplit(".", 1)[-1]
            choice = where.rsplit(".", 2)[-2] if where.count(".") >= 2 else ""
            if choice.startswith("choices["):  # $.steps.x.choices[0].next
                field = "choice " + str(int(choice[8:choice.index("]")]) + 1)
            found.append((name, target, field))
        if isinstance(step, language.ParallelStep):
            found.extend((name, branch.start, branch.name) for branch in step.branches)
    return found


def _columns(names: list[str], start: str, transitions: list[tuple[str, str, str]]
             ) -> dict[str, int]:
    """Each step's column: the longest path to it from ``start`` (the document is acyclic in
    every scope, a branch nested in its PARALLEL step). A step the walk cannot place (none in
    a valid document) goes after the last column."""
    incoming = dict.fromkeys(names, 0)
    outgoing: dict[str, list[str]] = {name: [] for name in names}
    for source, target, _label in transitions:
        if source in outgoing and target in incoming:
            outgoing[source].append(target)
            incoming[target] += 1
    column = dict.fromkeys(names, 0)
    ready = [name for name in names if incoming[name] == 0]
    placed = []
    while ready:
        name = ready.pop(0)
        placed.append(name)
        for target in outgoing[name]:
            column[target] = max(column[target], column[name] + 1)
            incoming[target] -= 1
            if incoming[target] == 0:
                ready.append(target)
    last = max([0, *(column[name] for name in placed)])
    for name in names:
        if name not in placed:
            column[name] = last + 1
    if start in column and column[start] != 0:  # unreachable: start has no incoming arrow
        column[start] = 0
    return column


def step_graph(definition: language.Definition, *, title: str,
               states: dict[str, str] | None = None) -> StepGraph:
    """A definition's steps as boxes left to right, each in the column of its longest path
    from the start and in document order within it, with an arrow per transition; with
    ``states`` (step name -> state) each box carries its instance step's state."""
    names = list(definition.all_steps)
    transitions = _transitions(definition)
    column = _columns(names, definition.start, transitions)
    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for name in names:
        index = column[name]
        row = rows.get(index, 0)
        rows[index] = row + 1
        nodes[name] = Node(
            name=name, kind=definition.all_steps[name].kind,
            x=MARGIN + index * (NODE_WIDTH + COLUMN_GAP),
            y=MARGIN + row * (NODE_HEIGHT + ROW_GAP),
            state=(states or {}).get(name))
    edges = []
    for source, target, label in transitions:
        a, b = nodes.get(source), nodes.get(target)
        if a is None or b is None:
            continue
        edges.append(Edge(source=source, target=target, label=label,
                          x1=a.x + NODE_WIDTH, y1=a.y + NODE_HEIGHT / 2,
                          x2=b.x, y2=b.y + NODE_HEIGHT / 2))
    columns = max([1, *(c + 1 for c in column.values())])
    tallest = max([1, *rows.values()])
    return StepGraph(
        width=2 * MARGIN + columns * NODE_WIDTH + (columns - 1) * COLUMN_GAP,
        height=2 * MARGIN + tallest * NODE_HEIGHT + (tallest - 1) * ROW_GAP,
        node_width=NODE_WIDTH, node_height=NODE_HEIGHT, nodes=tuple(nodes.values()),
        edges=tuple(edges), title=title, coloured=states is not None)

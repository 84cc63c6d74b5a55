"""The console's server-side charts (orbit_api/console/charts.py): bars, and a workflow
definition's step graph."""

from __future__ import annotations

import json

from orbit_api.console.charts import COLUMN_GAP, LABEL_ROW, NODE_WIDTH, bar_chart, step_graph
from orbit_common.weave import language
from tests.unit.weave.test_language import ORDER


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


def test_the_step_graph_places_each_step_in_the_column_of_its_longest_path() -> None:
    graph = step_graph(language.parse_definition(json.dumps(ORDER)), title="orders 版本 1")
    column = {n.name: round((n.x - graph.nodes[0].x) / (NODE_WIDTH + COLUMN_GAP))
              for n in graph.nodes}
    # reserve -> check -> fulfil -> {charge, label} -> {paid, shipped}; failed is reached from
    # reserve, check and fulfil, so it stands after fulfil; done after fulfil.
    assert column == {"reserve": 0, "check": 1, "fulfil": 2, "charge": 3, "paid": 4,
                      "label": 3, "shipped": 4, "done": 3, "failed": 3}
    assert not graph.coloured
    assert {n.state for n in graph.nodes} == {None}
    by_name = {n.name: n for n in graph.nodes}
    for a in graph.nodes:  # no two boxes overlap
        for b in graph.nodes:
            if a is not b and a.x == b.x:
                assert abs(a.y - b.y) >= graph.node_height
    for n in graph.nodes:
        assert n.x + graph.node_width <= graph.width
        assert n.y + graph.node_height <= graph.height
    edges = {(e.source, e.target, e.label) for e in graph.edges}
    assert edges == {("reserve", "check", "next"), ("reserve", "failed", "on_failure"),
                     ("check", "fulfil", "choice 1"), ("check", "failed", "default"),
                     ("fulfil", "done", "next"), ("fulfil", "failed", "on_failure"),
                     ("fulfil", "charge", "pay"), ("fulfil", "label", "ship"),
                     ("charge", "paid", "next"), ("label", "shipped", "next")}
    for e in graph.edges:  # from the right side of the source to the left side of the target
        source, target = by_name[e.source], by_name[e.target]
        assert (e.x1, e.x2) == (source.x + graph.node_width, target.x)
        assert (e.y1, e.y2) == (source.y + graph.node_height / 2,
                                target.y + graph.node_height / 2)
        assert e.x1 < e.x2  # every arrow points rightwards


def test_an_instance_graph_carries_each_step_state_and_a_held_target_is_no_arrow() -> None:
    document = {"format": "orbit.weave/1", "input_schema": {"type": "object"}, "start": "a",
                "steps": {"a": {"kind": "TASK", "queue": "q", "handler": "h", "next": "b",
                                "on_failure": "$hold"},
                          "b": {"kind": "SUCCEED"}}}
    graph = step_graph(language.parse_definition(json.dumps(document)), title="t",
                       states={"a": "WAITING", "$root": "RUNNING"})
    assert graph.coloured
    assert [(n.name, n.kind, n.state) for n in graph.nodes] == [
        ("a", "TASK", "WAITING"), ("b", "SUCCEED", None)]
    assert [(e.source, e.target) for e in graph.edges] == [("a", "b")]

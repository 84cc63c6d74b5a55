"""Hypothesis strategies for workflow definitions: random VALID documents (linear chains, choices
that rejoin, TASK failure transitions, nested PARALLEL blocks with structured joins), built from a
structure drawn first and emitted with names and expressions that type-check."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

from orbit_common.weave import language

RESULT_SCHEMA = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}
INPUT_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _task() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(st.just("task"), st.sampled_from(["none", "end", "skip", "hold"]))


def _nodes(depth: int, timers: bool) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    node = st.one_of(
        _task(),
        *([st.tuples(st.just("timer"))] if timers else []),
        st.tuples(st.just("choice"), st.lists(_task(), max_size=2), st.lists(_task(), max_size=2)),
        *([] if depth >= 2 else [st.tuples(
            st.just("par"), st.sampled_from(language.POLICIES),
            st.lists(st.deferred(lambda: _sequence(depth + 1, timers)), min_size=1,
                     max_size=3))]),
    )
    return st.lists(node, max_size=3)


def _sequence(depth: int, timers: bool = False) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(_nodes(depth, timers), st.sampled_from(["succeed", "succeed", "fail"]))


class _Emitter:
    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def number(self, available: list[str]) -> str:
        # Only TASK results have a declared shape; a PARALLEL result is map(string, dyn).
        terms = ["input.n", *(f"steps.{t}.result.v" for t in available if t.startswith("t"))]
        picked = self.draw(st.lists(st.sampled_from(terms), min_size=1, max_size=2))
        return " + ".join(picked)

    def task(self, name: str, mode: str, next_name: str, steps: dict[str, Any],
             available: list[str]) -> list[str]:
        body: dict[str, Any] = {"kind": "TASK", "queue": self.draw(st.sampled_from(["qa", "qb"])),
                                "handler": "h.run", "input": f"{{'v': {self.number(available)}}}",
                                "result_schema": RESULT_SCHEMA, "next": next_name}
        if mode == "end":
            body["on_failure"] = self.name("f")
            steps[body["on_failure"]] = {"kind": "FAIL", "error": "task_failed_here"}
        elif mode == "skip":
            body["on_failure"] = next_name
        elif mode == "hold":  # a failure holds the step for a person (no transition)
            body["on_failure"] = language.HOLD
        steps[name] = body
        return available if mode == "skip" else [*available, name]

    def sequence(self, seq: tuple[Any, ...], steps: dict[str, Any], available: list[str],
                 top: bool) -> str:
        nodes, end = seq
        names = [self.name({"task": "t", "choice": "c", "par": "p", "timer": "w"}[n[0]])
                 for n in nodes]
        names.append(self.name("s" if end == "succeed" else "x"))
        for index, node in enumerate(nodes):
            name, after = names[index], names[index + 1]
            if node[0] == "task":
                available = self.task(name, node[1], after, steps, available)
            elif node[0] == "timer":  # its result is readable, never read (late_ms varies)
                steps[name] = {"kind": "TIMER", "duration_ms": 1, "next": after}
            elif node[0] == "choice":
                arms = []
                for arm in node[1:]:
                    arm_names = [self.name("t") for _ in arm]
                    seen = available
                    followers = [*arm_names[1:], after][:len(arm_names)]
                    for (_, mode), here, following in zip(arm, arm_names, followers,
                                                          strict=True):
                        seen = self.task(here, mode, following, steps, seen)
                    arms.append(arm_names[0] if arm_names else after)
                steps[name] = {"kind": "CHOICE", "choices": [
                    {"when": f"({self.number(available)}) % 2 == 0", "next": arms[0]}],
                    "default": arms[1]}
            else:
                branches = []
                for position, branch in enumerate(node[2]):
                    inner: dict[str, Any] = {}
                    start = self.sequence(branch, inner, available, top=False)
                    branches.append({"name": f"b{position}", "start": start, "steps": inner})
                steps[name] = {"kind": "PARALLEL", "branches": branches,
                               "join": {"policy": node[1]}, "next": after}
                available = [*available, name]
        numbers = [a for a in available if a.startswith("t")]
        if end == "succeed":
            steps[names[-1]] = {"kind": "SUCCEED", "output": f"{{'n': {self.number(numbers)}}}"}
        else:
            steps[names[-1]] = {"kind": "FAIL", "error": "ended_by_fail",
                                "cause": self.number(numbers)}
        return names[0]


@st.composite
def definitions(draw: Any, timers: bool = False) -> dict[str, Any]:
    """A valid definition document (``timers``: with TIMER steps of 1 ms)."""
    emitter = _Emitter(draw)
    steps: dict[str, Any] = {}
    start = emitter.sequence(draw(_sequence(0, timers)), steps, [], top=True)
    return {"format": language.FORMAT, "input_schema": INPUT_SCHEMA, "start": start,
            "steps": steps}


_TOKEN = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def set_at(document: Any, path: str, value: Any) -> None:
    """Set the member a JSON path (``$.steps.p1.branches[0].steps.t2.next``) names."""
    tokens = [name if name else int(index) for name, index in _TOKEN.findall(path[1:])]
    target = document
    for token in tokens[:-1]:
        target = target[token]
    target[tokens[-1]] = value

"""The reference interpreter's POLL steps: rounds from a sequence of round results, the
condition over ``round.result``, exhaustion by rounds and its transitions, failed rounds, a
result that breaks the schema, and a poll inside a FAIL_FAST block."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit_common.weave import interpreter as wi
from orbit_common.weave import language

SCHEMA = {"type": "object", "properties": {"done": {"type": "boolean"}, "i": {"type": "integer"}},
          "required": ["done"]}


def definition(**poll: Any) -> language.Definition:
    step: dict[str, Any] = {"kind": "POLL", "queue": "q", "handler": "check",
                            "input": "{'n': input.n}", "result_schema": SCHEMA,
                            "until": "round.result.done", "interval_ms": 100, "max_rounds": 3,
                            "next": "after"}
    step.update(poll)
    steps: dict[str, Any] = {
        "poll": step,
        "after": {"kind": "TASK", "queue": "q", "handler": "after",
                  "input": "{'i': steps.poll.result.i}", "next": "done"},
        "done": {"kind": "SUCCEED", "output": "steps.poll.result"},
    }
    for target in {v for v in poll.values() if isinstance(v, str)}:
        if target in ("gave_up", "mend"):
            steps[target] = {"kind": "FAIL", "error": target}
    return language.parse_definition(json.dumps({
        "format": "orbit.weave/1", "start": "poll", "steps": steps,
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                         "required": ["n"]}}))


def rounds(*results: Any) -> Callable[[wi.TaskCall], wi.Outcome]:
    """Round n ends with ``results[n - 1]`` (an Outcome, or a result to succeed with); other
    tasks succeed with ``{}``."""
    def outcome(call: wi.TaskCall) -> wi.Outcome:
        if call.step != "poll":
            return wi.Succeeded(result={})
        found = results[call.round - 1]
        return found if isinstance(found, wi.Failed | wi.NeedsReview) else wi.Succeeded(
            result=found)
    return outcome


def test_rounds_until_the_condition_holds() -> None:
    run = wi.run(definition(), {"n": 4}, rounds({"done": False, "i": 1}, {"done": False},
                                                {"done": True, "i": 3}))
    assert run.state is wi.InstanceState.SUCCEEDED
    assert [(c.seq, c.step, c.round, c.input) for c in run.tasks] == [
        (1, "poll", 1, {"n": 4}), (2, "poll", 2, {"n": 4}), (3, "poll", 3, {"n": 4}),
        (4, "after", 0, {"i": 3})]
    assert run.results["poll"] == {"done": True, "i": 3}
    assert run.output == {"done": True, "i": 3}
    # Each not-met round makes the next one in the advance that consumed it.
    assert [(a.trigger, [c.round for c in a.created]) for a in run.advances] == [
        (0, [1]), (1, [2]), (2, [3]), (3, [0]), (4, [])]


@pytest.mark.parametrize(("transitions", "error"), [
    ({}, {"error": "poll_exhausted", "rounds": 3, "reason": "max_rounds", "step": "poll"}),
    ({"on_exhausted": "gave_up", "on_failure": "mend"},
     {"error": "gave_up", "cause": None, "step": "gave_up"}),
    ({"on_failure": "mend"}, {"error": "mend", "cause": None, "step": "mend"}),
])
def test_exhausted_by_rounds(transitions: dict[str, str], error: Any) -> None:
    run = wi.run(definition(**transitions), {"n": 1}, rounds(*[{"done": False}] * 3))
    assert run.state is wi.InstanceState.FAILED
    assert run.error == error
    assert [c.round for c in run.tasks] == [1, 2, 3]


def test_a_failed_round_fails_the_step() -> None:
    run = wi.run(definition(), {"n": 1}, rounds({"done": False}, wi.Failed(error={"x": 1})))
    assert run.error == {"error": "task_failed", "cause": {"x": 1}, "step": "poll"}
    run = wi.run(definition(on_failure="mend"), {"n": 1}, rounds(wi.Failed(error=None)))
    assert run.error["error"] == "mend"


def test_a_result_that_breaks_the_schema_fails_the_step() -> None:
    run = wi.run(definition(), {"n": 1}, rounds({"done": "yes"}))
    assert (run.error["error"], run.error["step"]) == ("result_shape_mismatch", "poll")
    assert len(run.tasks) == 1


def test_a_round_in_review_holds_the_instance() -> None:
    run = wi.run(definition(), {"n": 1}, rounds({"done": False}, wi.NeedsReview()))
    assert run.state is wi.InstanceState.RUNNING
    assert [c.round for c in run.tasks] == [1, 2]


def test_a_poll_in_a_closed_block_is_ignored() -> None:
    document = {
        "format": "orbit.weave/1", "start": "fan",
        "steps": {
            "fan": {"kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
                    "on_failure": "recover",
                    "branches": [
                        {"name": "a", "start": "poll", "steps": {
                            "poll": {"kind": "POLL", "queue": "q", "handler": "check",
                                     "until": "round.result == 1", "interval_ms": 100,
                                     "max_rounds": 5, "next": "ok"},
                            "ok": {"kind": "SUCCEED"}}},
                        {"name": "b", "start": "t", "steps": {
                            "t": {"kind": "TASK", "queue": "q", "handler": "t",
                                  "next": "okb"},
                            "okb": {"kind": "SUCCEED"}}}]},
            "recover": {"kind": "TASK", "queue": "q", "handler": "r", "next": "failed"},
            "failed": {"kind": "FAIL", "error": "recovered"},
            "done": {"kind": "SUCCEED"}}}

    def outcome(call: wi.TaskCall) -> wi.Outcome:
        return wi.Failed(error="no") if call.step == "t" else wi.Succeeded(result=0)

    order = iter([2, 1, 3])  # b's task first, then the poll's round, then recover

    run = wi.run(language.parse_definition(json.dumps(document)), {}, outcome,
                 choose=lambda calls: [c.seq for c in calls].index(next(order)))
    assert run.state is wi.InstanceState.FAILED
    assert run.error["error"] == "recovered"
    assert [c.step for c in run.tasks] == ["poll", "t", "recover"]
    assert [(a.trigger, a.ignored) for a in run.advances] == [
        (0, False), (2, False), (1, True), (3, False)]


@settings(max_examples=60, deadline=None)
@given(results=st.lists(st.one_of(st.booleans(), st.just("fail")), min_size=1, max_size=6),
       max_rounds=st.integers(1, 5))
def test_rounds_never_exceed_the_maximum_and_stop_at_the_first_met(
        results: list[bool | str], max_rounds: int) -> None:
    """Random round outcomes: the query runs rounds 1..k with k <= max_rounds, stops at the first
    met or failed round, and ends as that round (or the budget) says."""
    padded = [*results, *[False] * max_rounds]
    outcomes = [wi.Failed(error="e") if r == "fail" else {"done": r, "i": i}
                for i, r in enumerate(padded)]
    run = wi.run(definition(max_rounds=max_rounds), {"n": 1}, rounds(*outcomes))
    made = [c.round for c in run.tasks if c.step == "poll"]
    assert made == list(range(1, len(made) + 1))
    assert len(made) <= max_rounds
    decisive = next((i for i, r in enumerate(padded[:max_rounds]) if r is not False), None)
    if decisive is None:
        assert len(made) == max_rounds
        assert run.error == {"error": "poll_exhausted", "rounds": max_rounds,
                             "reason": "max_rounds", "step": "poll"}
    elif padded[decisive] == "fail":
        assert len(made) == decisive + 1
        assert run.error["error"] == "task_failed"
    else:
        assert len(made) == decisive + 1
        assert run.state is wi.InstanceState.SUCCEEDED
        assert run.results["poll"] == {"done": True, "i": decisive}

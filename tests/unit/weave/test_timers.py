"""TIMER due times (orbit_common/weave/timers.py) and TIMER steps in the reference interpreter."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from orbit_common.weave import expressions, language, timers
from orbit_common.weave import interpreter as wi

NOW = dt.datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _step(**wait: Any) -> language.TimerStep:
    return language.TimerStep(name="pause", path="$.steps.pause", next="done",
                              duration_ms=wait.get("duration_ms"), until=wait.get("until"))


def test_a_duration_is_due_that_long_after_the_database_time() -> None:
    assert timers.due_at(_step(duration_ms=1500), NOW, lambda _: None) == (
        NOW + dt.timedelta(milliseconds=1500))


@pytest.mark.parametrize(("value", "due"), [
    ("2030-06-01T12:00:00Z", dt.datetime(2030, 6, 1, 12, tzinfo=dt.UTC)),
    ("2030-06-01T17:30:00.5+05:30", dt.datetime(2030, 6, 1, 12, 0, 0, 500000, tzinfo=dt.UTC)),
    ("2000-01-01t00:00:00z", dt.datetime(2000, 1, 1, tzinfo=dt.UTC)),  # past: fires late
])
def test_an_until_instant_is_converted_to_utc(value: str, due: dt.datetime) -> None:
    assert timers.due_at(_step(until="x"), NOW, lambda _: value) == due


@pytest.mark.parametrize("value", ["2030-06-01T12:00:00", "2030-06-01", "soon", 5, None,
                                   "1969-12-31T23:59:59Z", "2031-06-02T12:00:01Z"])
def test_an_until_that_is_not_a_usable_instant_is_an_expression_failure(value: Any) -> None:
    with pytest.raises(expressions.ExpressionError):
        timers.due_at(_step(until="x"), NOW, lambda _: value)


def test_lateness_is_whole_milliseconds_and_none_before_the_due_time() -> None:
    wait = timers.enter(b"s" * 16, b"a" * 16, NOW)
    assert timers.late_ms(wait, NOW - dt.timedelta(microseconds=1)) is None
    with pytest.raises(ValueError, match="due"):
        timers.fire(wait, NOW - dt.timedelta(microseconds=1))
    assert wait.state == "WAITING"
    result = timers.fire(wait, NOW + dt.timedelta(microseconds=2999))
    assert result == {"due_at": "2030-06-01T12:00:00.123456+00:00",
                      "fired_at": "2030-06-01T12:00:00.126455+00:00", "late_ms": 2}
    assert (wait.state, wait.late_ms) == ("FIRED", 2)


WAITS = {
    "format": "orbit.weave/1",
    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"]},
    "start": "fan",
    "steps": {
        "fan": {"kind": "PARALLEL", "join": {"policy": "FAIL_FAST"}, "next": "done",
                "branches": [
                    {"name": "a", "start": "pause", "steps": {
                        "pause": {"kind": "TIMER", "duration_ms": 10, "next": "late"},
                        "late": {"kind": "TASK", "queue": "q", "handler": "h.a",
                                 "input": "{'late': steps.pause.result.late_ms}",
                                 "next": "ok_a"},
                        "ok_a": {"kind": "SUCCEED"}}},
                    {"name": "b", "start": "work", "steps": {
                        "work": {"kind": "TASK", "queue": "q", "handler": "h.b",
                                 "next": "ok_b"},
                        "ok_b": {"kind": "SUCCEED"}}}]},
        "done": {"kind": "SUCCEED", "output": "steps.fan.result"},
    },
}


def test_the_interpreter_fires_a_timer_as_its_own_advance_before_the_next_result() -> None:
    definition = language.parse_definition(json.dumps(WAITS))
    run = wi.run(definition, {"n": 1}, lambda call: wi.Succeeded(result={}))
    assert run.state is wi.InstanceState.SUCCEEDED
    assert [(a.trigger, a.timer, [c.step for c in a.created]) for a in run.advances] == [
        (0, None, ["work"]), (0, "pause", ["late"]), (1, None, []), (2, None, [])]
    assert run.tasks[1].input == {"late": 0}
    assert run.output == {"a": None, "b": None}
    assert run.results["pause"] == {"due_at": run.results["pause"]["due_at"],
                                    "fired_at": run.results["pause"]["due_at"], "late_ms": 0}


def test_the_interpreter_drops_the_timer_of_a_closed_block() -> None:
    document = json.loads(json.dumps(WAITS))
    document["steps"]["fan"]["branches"][1]["steps"]["work"]["on_failure"] = "stop"
    document["steps"]["fan"]["branches"][1]["steps"]["stop"] = {"kind": "FAIL",
                                                                "error": "stopped"}
    document["steps"]["fan"]["branches"][1]["start"] = "stop"
    del document["steps"]["fan"]["branches"][1]["steps"]["work"]
    del document["steps"]["fan"]["branches"][1]["steps"]["ok_b"]
    run = wi.run(language.parse_definition(json.dumps(document)), {"n": 1},
                 lambda call: wi.Succeeded(result={}))
    assert (run.state, run.error["error"]) == (wi.InstanceState.FAILED, "stopped")
    assert [a.timer for a in run.advances] == [None]
    assert run.tasks == []

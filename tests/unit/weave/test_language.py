"""The workflow definition validator: what it accepts, and every refusal with its path and code."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from orbit_common import errors
from orbit_common.weave import language

ORDER: dict[str, Any] = {
    "format": "orbit.weave/1",
    "input_schema": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "amount": {"type": "number"},
            "express": {"type": "boolean"},
            "items": {"type": "array", "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"]}},
        },
        "required": ["order_id", "amount", "items"],
    },
    "start": "reserve",
    "steps": {
        "reserve": {
            "kind": "TASK", "queue": "inventory", "handler": "inventory.reserve",
            "input": "{'order_id': input.order_id, 'skus': input.items.map(i, i.sku)}",
            "result_schema": {"type": "object", "properties": {"reserved": {"type": "boolean"}},
                              "required": ["reserved"]},
            "retry": {"max_attempts": 5, "multiplier": 2.5}, "rerun_safe": True,
            "deadline_ms": 60000, "concurrency_key": "inventory",
            "next": "check", "on_failure": "failed"},
        "check": {"kind": "CHOICE",
                  "choices": [{"when": "steps.reserve.result.reserved && input.amount > 0.0",
                               "next": "fulfil"}],
                  "default": "failed"},
        "fulfil": {
            "kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": "done",
            "on_failure": "failed",
            "branches": [
                {"name": "pay", "start": "charge", "steps": {
                    "charge": {"kind": "TASK", "queue": "payments", "handler": "pay.charge",
                               "input": "{'amount': input.amount}", "next": "paid"},
                    "paid": {"kind": "SUCCEED", "output": "steps.charge.result"}}},
                {"name": "ship", "start": "label", "steps": {
                    "label": {"kind": "TASK", "queue": "shipping", "handler": "ship.label",
                              "next": "shipped"},
                    "shipped": {"kind": "SUCCEED"}}},
            ]},
        "done": {"kind": "SUCCEED",
                 "output": "{'order_id': input.order_id, 'payment': steps.fulfil.result.pay}"},
        "failed": {"kind": "FAIL", "error": "order_failed", "cause": "input.order_id"},
    },
}


def refusals(mutate: Callable[[dict[str, Any]], None]) -> list[tuple[str, str]]:
    document = copy.deepcopy(ORDER)
    mutate(document)
    with pytest.raises(errors.DefinitionInvalid) as caught:
        language.parse_definition(json.dumps(document))
    assert caught.value.code == "definition_invalid"
    assert caught.value.status == 400
    return [(found["path"], found["code"]) for found in caught.value.errors]


def test_the_order_workflow_is_valid() -> None:
    definition = language.parse_definition(json.dumps(ORDER))
    assert definition.start == "reserve"
    assert definition.queues == ("inventory", "payments", "shipping")
    assert set(definition.all_steps) == {"reserve", "check", "fulfil", "charge", "paid", "label",
                                         "shipped", "done", "failed"}
    assert set(definition.steps) == {"reserve", "check", "fulfil", "done", "failed"}
    reserve = definition.steps["reserve"]
    assert isinstance(reserve, language.TaskStep)
    assert reserve.options.retry.max_attempts == 5
    assert str(reserve.options.retry.multiplier) == "2.500"
    assert reserve.options.concurrency_key == b"inventory"
    assert reserve.options.rerun_safe is True
    fulfil = definition.steps["fulfil"]
    assert isinstance(fulfil, language.ParallelStep)
    assert [b.name for b in fulfil.branches] == ["pay", "ship"]
    # The model is immutable: a validated definition cannot be changed after the digest.
    with pytest.raises(TypeError):
        definition.steps["other"] = reserve  # type: ignore[index]
    with pytest.raises(TypeError):
        fulfil.branches[0].steps["other"] = reserve  # type: ignore[index]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        reserve.next = "done"  # type: ignore[misc]


def _step(name: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        document["steps"][name].update(fields)
    return mutate


def _branch_step(branch: int, name: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        document["steps"]["fulfil"]["branches"][branch]["steps"][name].update(fields)
    return mutate


@pytest.mark.parametrize(("mutate", "expected"), [
    # shape
    (lambda d: d.update(extra=1), [("$.extra", "unknown_field")]),
    (lambda d: d.pop("start"), [("$.start", "missing_field")]),
    (lambda d: d.update(format="orbit.weave/2"), [("$.format", "unsupported_format")]),
    (_step("check", bogus=1), [("$.steps.check.bogus", "unknown_field")]),
    (_step("done", kind="NOPE"), [("$.steps.done.kind", "invalid_value")]),
    (_step("reserve", priority=12), [("$.steps.reserve.priority", "invalid_value")]),
    (_step("reserve", retry={"max_attempts": "5"}),
     [("$.steps.reserve.retry.max_attempts", "invalid_value")]),
    (_step("reserve", retry={"jitter": 0.0001}), [("$.steps.reserve.retry.jitter",
                                                   "invalid_value")]),
    (_step("reserve", queue="Bad Queue"), [("$.steps.reserve.queue", "invalid_value")]),
    (_step("reserve", handler="no spaces"), [("$.steps.reserve.handler", "invalid_value")]),
    (_step("reserve", concurrency_key=""), [("$.steps.reserve.concurrency_key",
                                            "invalid_value")]),
    (_step("reserve", retry={"bogus": 1}), [("$.steps.reserve.retry", "unknown_field")]),
    (_step("reserve", rerun_safe="yes"), [("$.steps.reserve.rerun_safe", "invalid_value")]),
    (_step("reserve", on_failure=None), [("$.steps.reserve.on_failure", "invalid_value")]),
    (_step("reserve", delay_ms=5), [("$.steps.reserve.delay_ms", "unknown_field")]),
    (_step("failed", error="Not A Code"), [("$.steps.failed.error", "invalid_value")]),
    (lambda d: d["steps"].update({"in": {"kind": "SUCCEED"}}), [("$.steps.in", "invalid_name")]),
    (lambda d: d["steps"].update({"a b": {"kind": "SUCCEED"}}),
     [('$.steps["a b"]', "invalid_name")]),
    (lambda d: d["steps"]["reserve"].pop("queue"), [("$.steps.reserve.queue", "missing_field")]),
    (lambda d: d["steps"]["fulfil"]["branches"][1]["steps"].update(
        reserve={"kind": "SUCCEED"}),
     [("$.steps.fulfil.branches[1].steps.reserve", "duplicate_name")]),
    (lambda d: d["steps"]["fulfil"].update(join={"policy": "SOME"}),
     [("$.steps.fulfil.join.policy", "invalid_value")]),
    (lambda d: d["input_schema"]["properties"].update(x={"type": "decimal"}),
     [("$.input_schema.properties.x.type", "invalid_value")]),
    (lambda d: d["input_schema"]["required"].append("nope"),
     [("$.input_schema.required[3]", "invalid_value")]),
    (lambda d: d["steps"].update(wait={"kind": "TIMER", "next": "done"}),
     [("$.steps.wait", "invalid_value")]),
    (lambda d: d["steps"].update(wait={"kind": "TIMER", "next": "done", "duration_ms": 5,
                                       "until": "'2030-01-01T00:00:00Z'"}),
     [("$.steps.wait", "invalid_value")]),
    (lambda d: d["steps"].update(wait={"kind": "TIMER", "next": "done", "duration_ms": 0}),
     [("$.steps.wait.duration_ms", "invalid_value")]),
    (lambda d: d["steps"].update(wait={"kind": "SIGNAL", "signal": "paid"}),
     [("$.steps.wait.next", "missing_field")]),  # SIGNAL is enabled: checked as any step
    (lambda d: d["steps"].update(wait={"kind": "POLL"}),  # enabled: its fields are required
     [("$.steps.wait.queue", "missing_field"), ("$.steps.wait.handler", "missing_field"),
      ("$.steps.wait.until", "missing_field"), ("$.steps.wait.interval_ms", "missing_field"),
      ("$.steps.wait.max_rounds", "missing_field"), ("$.steps.wait.next", "missing_field")]),
    # graph
    (_step("check", default="nowhere"), [("$.steps.check.default", "missing_target")]),
    (lambda d: d.update(start="nowhere"), [("$.start", "missing_target")]),
    (_branch_step(0, "charge", next="label"),
     [("$.steps.fulfil.branches[0].steps.charge.next", "unstructured_join")]),
    (_branch_step(0, "charge", on_failure="done"),
     [("$.steps.fulfil.branches[0].steps.charge.on_failure", "unstructured_join")]),
    (_step("check", default="paid"), [("$.steps.check.default", "unstructured_join")]),
    (lambda d: d["steps"].update(lonely={"kind": "SUCCEED"}), [("$.steps.lonely", "orphan_step")]),
    (lambda d: d["steps"].update(a={"kind": "TASK", "queue": "q", "handler": "h", "next": "b"},
                                 b={"kind": "TASK", "queue": "q", "handler": "h", "next": "done"}),
     [("$.steps.a", "orphan_step"), ("$.steps.b", "unreachable_step")]),
    (_step("fulfil", next="reserve"),
     [("$.steps.done", "orphan_step"), ("$.steps.fulfil.next", "cycle")]),
    (_branch_step(1, "label", next="label"),
     [("$.steps.fulfil.branches[1].steps.shipped", "orphan_step"),
      ("$.steps.fulfil.branches[1].steps.label.next", "cycle")]),
    # expressions
    (_step("reserve", input="{'a': input.order_id +"),
     [("$.steps.reserve.input", "expression_invalid")]),
    (_step("reserve", input="{'a': input.amount + 1}"),
     [("$.steps.reserve.input", "expression_type")]),
    (_step("reserve", input="{'a': input.no_such_field}"),
     [("$.steps.reserve.input", "expression_type")]),
    (_step("reserve", input="{'a': unknown_variable}"),
     [("$.steps.reserve.input", "expression_type")]),
    (_step("reserve", input="[input.order_id]"), [("$.steps.reserve.input", "expression_type")]),
    (_step("reserve", input="input.order_id"), [("$.steps.reserve.input", "expression_type")]),
    (_step("check", choices=[{"when": "input.amount", "next": "fulfil"}]),
     [("$.steps.check.choices[0].when", "expression_type")]),
    (_step("check", choices=[{"when": "input.items[0].qty > 'x'", "next": "fulfil"}]),
     [("$.steps.check.choices[0].when", "expression_type")]),
    (_step("check", choices=[{"when": "steps.reserve.result.nope", "next": "fulfil"}]),
     [("$.steps.check.choices[0].when", "expression_type")]),
    (_step("done", output="b'bytes'"), [("$.steps.done.output", "expression_type")]),
    (_step("done", output="duration('1s')"), [("$.steps.done.output", "expression_type")]),
    # a step's result is visible only where the step certainly completed before
    (_step("failed", cause="steps.reserve.result"), [("$.steps.failed.cause", "expression_type")]),
    (_branch_step(0, "charge", input="{'l': steps.label.result}"),
     [("$.steps.fulfil.branches[0].steps.charge.input", "expression_type")]),
    (_step("done", output="steps.charge.result"), [("$.steps.done.output", "expression_type")]),
    (_step("reserve", input="x" * 4097), [("$.steps.reserve.input", "limit_exceeded")]),
], ids=lambda value: value[0][0] if isinstance(value, list) else None)
def test_refusals_point_at_the_offending_part(mutate: Callable[[dict[str, Any]], None],
                                              expected: list[tuple[str, str]]) -> None:
    assert refusals(mutate) == expected


def test_expressions_see_earlier_results_typed_by_their_schema() -> None:
    document = copy.deepcopy(ORDER)
    document["steps"]["done"]["output"] = (
        "{'first_qty': input.items[0].qty + 1, 'express': has(input.express) && input.express,"
        " 'both': steps.fulfil.result, 'reserved': steps.reserve.result.reserved}")
    language.parse_definition(json.dumps(document))


def test_a_type_error_message_has_its_position() -> None:
    document = copy.deepcopy(ORDER)
    document["steps"]["reserve"]["input"] = "{'a': input.amount + 1}"
    with pytest.raises(errors.DefinitionInvalid) as caught:
        language.parse_definition(json.dumps(document))
    assert caught.value.errors[0]["message"].startswith("expression:1:20: ")
    assert "(double, int)" in caught.value.errors[0]["message"]


def test_parallel_nesting_depth_is_limited() -> None:
    inner: dict[str, Any] = {"kind": "SUCCEED"}
    steps: dict[str, Any] = {"leaf": inner}
    for level in range(language.MAX_PARALLEL_DEPTH + 1):
        steps = {f"p{level}": {
            "kind": "PARALLEL", "join": {"policy": "ALL_SUCCEED"}, "next": f"end{level}",
            "branches": [{"name": "b", "start": next(iter(steps)), "steps": steps}]},
            f"end{level}": {"kind": "SUCCEED"}}
    document = {"format": language.FORMAT, "start": f"p{language.MAX_PARALLEL_DEPTH}",
                "steps": steps}
    with pytest.raises(errors.DefinitionInvalid) as caught:
        language.parse_definition(json.dumps(document))
    assert [(p["path"], p["code"]) for p in caught.value.errors] == [
        ("$.steps.p4.branches[0].steps.p3.branches[0].steps.p2.branches[0].steps.p1"
         ".branches[0].steps.p0", "limit_exceeded")]


def test_step_count_and_document_size_are_limited() -> None:
    steps = {f"s{i}": {"kind": "TASK", "queue": "q", "handler": "h", "next": f"s{i + 1}"}
             for i in range(language.MAX_STEPS)}
    steps[f"s{language.MAX_STEPS}"] = {"kind": "SUCCEED"}
    document = {"format": language.FORMAT, "start": "s0", "steps": steps}
    with pytest.raises(errors.DefinitionInvalid) as caught:
        language.parse_definition(json.dumps(document))
    assert [(p["path"], p["code"]) for p in caught.value.errors] == [
        (f"$.steps.s{language.MAX_STEPS}", "limit_exceeded")]
    big = json.dumps({**ORDER, "description": "x" * language.MAX_DOCUMENT_BYTES})
    with pytest.raises(errors.DefinitionInvalid) as caught:
        language.parse_definition(big)
    assert caught.value.errors[0]["path"] == "$"


def test_the_document_is_strict_json() -> None:
    text = json.dumps(ORDER)
    with pytest.raises(errors.DuplicateJsonKey):
        language.parse_definition(text[:-1] + ', "start": "reserve"}')
    with pytest.raises(errors.MalformedJson):
        language.parse_definition(text.replace('"orbit.weave/1"', "NaN"))


def test_canonical_form_ignores_key_order_and_whitespace() -> None:
    first = language.parse_definition(json.dumps(ORDER))

    def reorder(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: reorder(value[key]) for key in reversed(list(value))}
        if isinstance(value, list):
            return [reorder(item) for item in value]
        return value

    second = language.parse_definition(json.dumps(reorder(ORDER), indent=3))
    assert second.canonical == first.canonical
    assert second.digest == first.digest
    assert len(first.digest) == 32
    assert first.canonical.startswith(
        b'{"format":"orbit.weave/1","input_schema":{"properties":{"amount":{"type":"number"},')
    assert first.digest == hashlib.sha256(first.canonical).digest()
    changed = copy.deepcopy(ORDER)
    changed["steps"]["reserve"]["priority"] = 1
    assert language.parse_definition(json.dumps(changed)).digest != first.digest


def test_input_problems_check_the_declared_schema() -> None:
    definition = language.parse_definition(json.dumps(ORDER))
    assert definition.input_problems(
        {"order_id": "o", "amount": 1, "items": [{"sku": "a", "qty": 2}]}) == []
    assert definition.input_problems(
        {"order_id": 1, "amount": "x", "items": [{"sku": "a", "qty": 1.5}], "extra": 0}) == [
        {"path": "$.input.extra", "message": "not a declared property"},
        {"path": "$.input.order_id", "message": "expected a string"},
        {"path": "$.input.amount", "message": "expected a number"},
        {"path": "$.input.items[0].qty", "message": "expected an integer"},
    ]
    assert definition.input_problems({}) == [
        {"path": "$.input.order_id", "message": "required"},
        {"path": "$.input.amount", "message": "required"},
        {"path": "$.input.items", "message": "required"},
    ]


def test_the_example_of_the_language_document_is_valid() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "weave" / "language.md").read_text(
        encoding="utf-8")
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    definition = language.parse_definition(example)
    assert definition.queues == ("inventory", "payments", "shipping")


def test_the_largest_chain_validates() -> None:
    """200 steps, each reading the previous step's result: 200 distinct views, each type-checked.
    (Its speed is not asserted here: with one descriptor pool for all views it took about 5 s,
    with a pool per view about 0.6 s on the 2-core machine.)"""
    count = language.MAX_STEPS - 1
    result = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}
    steps: dict[str, Any] = {
        f"s{i}": {"kind": "TASK", "queue": "q", "handler": "h", "result_schema": result,
                  "input": "{'v': input.n + %s}" % (f"steps.s{i - 1}.result.v" if i else "1"),
                  "next": f"s{i + 1}"} for i in range(count)}
    steps[f"s{count}"] = {"kind": "SUCCEED", "output": f"steps.s{count - 1}.result"}
    document = {"format": language.FORMAT, "start": "s0", "steps": steps, "input_schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}
    definition = language.parse_definition(json.dumps(document))
    assert len(definition.steps) == language.MAX_STEPS


def _hold_document(**reserve: Any) -> dict[str, Any]:
    document = copy.deepcopy(ORDER)
    document["steps"]["reserve"].update(reserve)
    return document


def test_hold_is_a_target_of_failure_and_timeout_transitions_only() -> None:
    """``$hold`` is allowed as TASK/POLL on_failure, SIGNAL on_timeout, POLL on_exhausted; it is
    no step: a step that only ``$hold`` would lead to is still an orphan, and results after a
    held step are visible as after its success."""
    document = _hold_document(on_failure="$hold")
    document["steps"]["wait"] = {"kind": "SIGNAL", "signal": "paid", "timeout_ms": 1000,
                                 "on_timeout": "$hold", "next": "query"}
    document["steps"]["query"] = {
        "kind": "POLL", "queue": "payments", "handler": "pay.status", "until": "true",
        "max_rounds": 3, "interval_ms": 1000, "on_exhausted": "$hold",
        "on_failure": "$hold", "next": "done"}
    document["steps"]["check"]["default"] = "wait"
    del document["steps"]["failed"]
    document["steps"]["done"].pop("output")  # reached also without fulfil
    document["steps"]["fulfil"].pop("on_failure")
    document["steps"]["check"]["choices"][0]["next"] = "fulfil"
    definition = language.parse_definition(json.dumps(document))
    reserve = definition.steps["reserve"]
    assert isinstance(reserve, language.TaskStep)
    assert reserve.on_failure == language.HOLD
    assert language.targets(reserve) == [("$.steps.reserve.next", "check")]
    wait = definition.steps["wait"]
    assert isinstance(wait, language.SignalStep)
    assert wait.on_timeout == language.HOLD
    query = definition.steps["query"]
    assert isinstance(query, language.PollStep)
    assert (query.on_exhausted, query.on_failure) == (language.HOLD, language.HOLD)


@pytest.mark.parametrize(("mutate", "expected"), [
    (_step("fulfil", on_failure="$hold"), [("$.steps.fulfil.on_failure", "invalid_value")]),
    (_step("reserve", next="$hold"), [("$.steps.reserve.next", "invalid_name")]),
    (_step("check", default="$hold"), [("$.steps.check.default", "invalid_name")]),
    (_step("reserve", on_failure="$Hold"), [("$.steps.reserve.on_failure", "invalid_name")]),
    # `failed` was reached only by on_failure transitions that now hold: it is an orphan
    # unless something else leads there (check's default still does).
    (lambda d: (d["steps"]["reserve"].update(on_failure="$hold"),
                d["steps"]["fulfil"].update(on_failure="$hold")),
     [("$.steps.fulfil.on_failure", "invalid_value")]),
])
def test_hold_elsewhere_is_refused(mutate: Callable[[dict[str, Any]], None],
                                   expected: list[tuple[str, str]]) -> None:
    assert refusals(mutate) == expected


def test_a_step_reached_only_through_hold_is_an_orphan() -> None:
    document = _hold_document(on_failure="$hold")
    document["steps"]["check"]["default"] = "done"
    document["steps"]["fulfil"]["on_failure"] = "done"
    with pytest.raises(errors.DefinitionInvalid) as caught:
        language.parse_definition(json.dumps(document))
    assert [(p["path"], p["code"]) for p in caught.value.errors] == [
        ("$.steps.failed", "orphan_step")]

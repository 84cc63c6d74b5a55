"""The reference interpreter: advances, joins and their policies, failure transitions, held
tasks, expression and result-shape failures."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orbit_common.weave import interpreter as wi
from orbit_common.weave import language
from tests.unit.weave.test_language import ORDER

INPUT = {"order_id": "o-1", "amount": 12, "items": [{"sku": "a", "qty": 2}]}


DELETE = object()


def order(**changes: Any) -> language.Definition:
    """The order workflow of test_language with members changed (``a/b/0/c``: a path)."""
    document = json.loads(json.dumps(ORDER))
    for path, value in changes.items():
        target = document
        keys = path.split("/")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is DELETE:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
    return language.parse_definition(json.dumps(document))


def happy(call: wi.TaskCall) -> wi.Outcome:
    if call.step == "reserve":
        return wi.Succeeded(result={"reserved": True})
    if call.step == "charge":
        return wi.Succeeded(result={"charged": call.input["amount"]})
    return wi.Succeeded(result={"label": "L1"})


def test_the_order_workflow_runs_its_tasks_advance_by_advance() -> None:
    run = wi.run(order(), INPUT, happy)
    assert run.state is wi.InstanceState.SUCCEEDED
    assert run.output == {"order_id": "o-1", "payment": {"charged": 12.0}}
    assert [(a.trigger, [c.step for c in a.created]) for a in run.advances] == [
        (0, ["reserve"]), (1, ["charge", "label"]), (2, []), (3, [])]
    reserve, charge, label = run.tasks
    assert reserve.input == {"order_id": "o-1", "skus": ["a"]}
    assert (reserve.queue, reserve.handler, reserve.branch) == ("inventory",
                                                                "inventory.reserve", ())
    assert charge.input == {"amount": 12.0}  # a "number" is a double, whatever its spelling
    assert (charge.branch, label.branch) == (("fulfil.pay",), ("fulfil.ship",))
    assert run.results["fulfil"] == {"pay": {"charged": 12.0}, "ship": None}


def test_a_choice_takes_its_default_when_no_condition_holds() -> None:
    run = wi.run(order(), INPUT, lambda call: wi.Succeeded(result={"reserved": False}))
    assert run.state is wi.InstanceState.FAILED
    assert run.error == {"error": "order_failed", "cause": "o-1", "step": "failed"}
    assert [c.step for c in run.tasks] == ["reserve"]


def test_a_failed_task_follows_its_failure_transition() -> None:
    run = wi.run(order(), INPUT, lambda call: wi.Failed(error="no stock"))
    assert run.state is wi.InstanceState.FAILED
    assert run.error["error"] == "order_failed"


def test_without_a_failure_transition_a_failed_task_fails_the_instance() -> None:
    definition = order(**{"steps/reserve/on_failure": DELETE})
    run = wi.run(definition, INPUT, lambda call: wi.Failed(error="no stock"))
    assert run.state is wi.InstanceState.FAILED
    assert run.error == {"error": "task_failed", "cause": "no stock", "step": "reserve"}


REFUND = {"kind": "TASK", "queue": "payments", "handler": "pay.refund", "next": "failed"}


@pytest.mark.parametrize("policy", ["ALL_SUCCEED", "FAIL_FAST"])
def test_a_failed_branch_fails_the_block_by_its_policy(policy: str) -> None:
    definition = order(**{"steps/fulfil/join/policy": policy, "steps/refund": REFUND,
                          "steps/fulfil/on_failure": "refund"})

    def outcome(call: wi.TaskCall) -> wi.Outcome:
        return wi.Failed(error="card declined") if call.step == "charge" else happy(call)

    run = wi.run(definition, INPUT, outcome)
    assert run.state is wi.InstanceState.FAILED
    assert run.error["error"] == "order_failed"
    steps = [(a.trigger, [c.step for c in a.created], a.ignored) for a in run.advances]
    if policy == "FAIL_FAST":
        # The first failure closes the block: the refund starts at once; the other branch's
        # result is kept but advances nothing.
        assert steps == [(0, ["reserve"], False), (1, ["charge", "label"], False),
                         (2, ["refund"], False), (3, [], True), (4, [], False)]
    else:
        # ALL_SUCCEED waits for every branch before it fails the block.
        assert steps == [(0, ["reserve"], False), (1, ["charge", "label"], False),
                         (2, [], False), (3, ["refund"], False), (4, [], False)]


def test_a_failure_settlement_records_the_in_flight_result_and_advances_no_more() -> None:
    """label fails under FAIL_FAST while charge runs: the instance fails once charge's result
    is in (docs/weave/stop.md); that result is recorded, nothing advances after the failure."""
    definition = order(**{"steps/fulfil/join/policy": "FAIL_FAST"})

    def outcome(call: wi.TaskCall) -> wi.Outcome:
        return wi.Failed(error="no label") if call.step == "label" else happy(call)

    run = wi.run(definition, INPUT, outcome, choose=lambda pending: len(pending) - 1)
    assert run.state is wi.InstanceState.FAILED
    assert run.error["step"] == "failed"  # fulfil's on_failure: a FAIL step
    assert [(a.trigger, a.created, a.ignored) for a in run.advances[2:]] == [
        (3, (), False), (2, (), False)]
    assert run.results["charge"] == happy(run.tasks[1]).result  # type: ignore[union-attr]
    assert "fulfil" not in run.results


def test_a_failure_with_nothing_in_flight_fails_at_once() -> None:
    """The same failure after charge's result: nothing is in flight, the instance fails in
    the advance of the failure."""
    definition = order(**{"steps/fulfil/join/policy": "FAIL_FAST"})

    def outcome(call: wi.TaskCall) -> wi.Outcome:
        return wi.Failed(error="no label") if call.step == "label" else happy(call)

    run = wi.run(definition, INPUT, outcome)
    assert run.state is wi.InstanceState.FAILED
    assert [a.trigger for a in run.advances] == [0, 1, 2, 3]


def test_a_branch_that_fails_at_once_under_fail_fast_starts_no_later_branch() -> None:
    definition = order(**{
        "steps/fulfil/join/policy": "FAIL_FAST",
        "steps/fulfil/branches/0/start": "nope",
        "steps/fulfil/branches/0/steps": {"nope": {"kind": "FAIL", "error": "declined"}},
        "steps/fulfil/on_failure": DELETE,
    })
    run = wi.run(definition, INPUT, happy)
    assert [c.step for c in run.tasks] == ["reserve"]
    assert run.error == {"error": "declined", "cause": None, "step": "nope"}


def test_a_timer_cancelled_with_its_block_is_never_offered_to_fire() -> None:
    """A branch sets a timer, a later branch of the FAIL_FAST block fails in the same advance:
    the timer is cancelled with the block (the engine never fires it), so ``fire`` -- which
    answers from the timers the engine fired -- is never asked about it."""
    definition = order(**{
        "steps/fulfil/join/policy": "FAIL_FAST",
        "steps/fulfil/branches/0/start": "pause",
        "steps/fulfil/branches/0/steps": {
            "pause": {"kind": "TIMER", "duration_ms": 1, "next": "paid"},
            "paid": {"kind": "SUCCEED"}},
        "steps/fulfil/branches/1/start": "nope",
        "steps/fulfil/branches/1/steps": {"nope": {"kind": "FAIL", "error": "declined"}},
        "steps/fulfil/on_failure": "mend",
        "steps/mend": {"kind": "TASK", "queue": "payments", "handler": "pay.refund",
                       "next": "done"},
        "steps/done/output": "{'order_id': input.order_id}",
    })

    def fire(timers: Any) -> int:
        raise AssertionError(f"asked to fire {timers}")

    run = wi.run(definition, INPUT, happy, fire=fire)
    assert run.state is wi.InstanceState.SUCCEEDED
    assert [c.step for c in run.tasks] == ["reserve", "mend"]
    assert all(a.timer is None for a in run.advances)


def test_a_task_in_needs_review_holds_its_step() -> None:
    def outcome(call: wi.TaskCall) -> wi.Outcome:
        return wi.NeedsReview() if call.step == "label" else happy(call)

    run = wi.run(order(), INPUT, outcome)
    assert run.state is wi.InstanceState.RUNNING
    assert "fulfil" not in run.results
    assert run.results["charge"] == {"charged": 12.0}


def test_a_result_that_breaks_its_declared_shape_fails_the_step() -> None:
    definition = order(**{"steps/reserve/on_failure": DELETE})
    run = wi.run(definition, INPUT, lambda call: wi.Succeeded(result={"reserved": "yes"}))
    assert run.state is wi.InstanceState.FAILED
    assert run.error == {"error": wi.RESULT_SHAPE, "step": "reserve",
                         "cause": "$.result.reserved: expected true or false"}


def test_an_expression_that_fails_while_evaluating_fails_its_step() -> None:
    definition = order(**{
        "steps/reserve/on_failure": DELETE,
        "steps/reserve/input": "{'first': input.items[3].sku}"})
    run = wi.run(definition, INPUT, happy)
    assert run.state is wi.InstanceState.FAILED
    assert run.error["error"] == wi.EXPRESSION_FAILED
    assert run.error["step"] == "reserve"
    assert run.tasks == []


def test_optional_members_are_tested_with_has() -> None:
    definition = order(**{"steps/done/output": "has(input.express) ? input.express : false"})
    assert wi.run(definition, INPUT, happy).output is False
    assert wi.run(definition, {**INPUT, "express": True}, happy).output is True


def _waiting(**signal: Any) -> language.Definition:
    """approve (SIGNAL "paid", correlation input.order_id) -> ship (TASK) -> done; on timeout:
    late (FAIL)."""
    steps: dict[str, Any] = {
        "approve": {"kind": "SIGNAL", "signal": "paid", "correlation": "input.order_id",
                    "next": "ship", **signal},
        "ship": {"kind": "TASK", "queue": "q", "handler": "ship",
                 "input": "{'amount': steps.approve.result.payload.amount}", "next": "done"},
        "done": {"kind": "SUCCEED"},
    }
    if "on_timeout" in signal:
        steps["late"] = {"kind": "FAIL", "error": "not_paid"}
    return language.parse_definition(json.dumps({
        "format": "orbit.weave/1",
        "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}},
                         "required": ["order_id"]},
        "start": "approve", "steps": steps}))


def test_an_arrived_signal_completes_its_step_with_the_signal_as_result() -> None:
    seen: list[tuple[str, bytes]] = []
    result = {"signal_id": "ab" * 16, "payload": {"amount": 5}, "payload_version": 1,
              "accepted_at": "2026-12-02T06:00:00+00:00"}

    def arrives(step: language.SignalStep, key: bytes) -> wi.SignalArrived:
        seen.append((step.signal, key))
        return wi.SignalArrived(result=result)

    run = wi.run(_waiting(), {"order_id": "o-1"}, lambda c: wi.Succeeded(result={}),
                 signals=arrives)
    assert seen == [("paid", b"o-1")]
    assert run.state is wi.InstanceState.SUCCEEDED
    assert [(c.step, c.input) for c in run.tasks] == [("ship", {"amount": 5})]
    assert run.results["approve"] == result


def test_a_signal_that_never_arrives_times_out_or_waits() -> None:
    timed = wi.run(_waiting(timeout_ms=1000, on_timeout="late"), {"order_id": "o-1"},
                   lambda c: wi.Succeeded(result={}))
    assert timed.state is wi.InstanceState.FAILED
    assert timed.error == {"error": "not_paid", "cause": None, "step": "late"}
    assert timed.advances[-1].timeout == "approve"
    forever = wi.run(_waiting(), {"order_id": "o-1"}, lambda c: wi.Succeeded(result={}))
    assert forever.state is wi.InstanceState.RUNNING
    assert forever.tasks == []


def test_a_correlation_over_512_bytes_fails_the_step() -> None:
    run = wi.run(_waiting(), {"order_id": "é" * 257}, lambda c: wi.Succeeded(result={}),
                 signals=lambda step, key: wi.SignalArrived(result={}))
    assert run.state is wi.InstanceState.FAILED
    assert run.error["error"] == "expression_failed"
    assert run.error["step"] == "approve"

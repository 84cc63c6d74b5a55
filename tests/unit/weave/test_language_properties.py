"""Properties of the validator and the reference interpreter over random definitions: valid ones
validate and run to an end; one broken rule is refused with a path at the broken part."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.weave import interpreter, language
from tests.unit.weave.strategies import definitions, set_at

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _outcome(failing: set[str]) -> Any:
    def outcome(call: interpreter.TaskCall) -> interpreter.Outcome:
        if call.step in failing:
            return interpreter.Failed(error={"reason": "drawn"})
        return interpreter.Succeeded(result={"v": call.input["v"] + 1})
    return outcome


@SETTINGS
@given(document=definitions(timers=True), data=st.data())
def test_valid_definitions_validate_and_run_to_an_end(document: dict[str, Any],
                                                      data: st.DataObject) -> None:
    definition = language.parse_definition(json.dumps(document))
    tasks = sorted(n for n, s in definition.all_steps.items() if isinstance(s, language.TaskStep))
    failing = data.draw(st.sets(st.sampled_from(tasks)) if tasks else st.just(set()))
    n = data.draw(st.integers(-1000, 1000))
    order = data.draw(st.randoms(use_true_random=False))
    run = interpreter.run(definition, {"n": n}, _outcome(failing),
                          choose=lambda pending: order.randrange(len(pending)))
    # An instance ends, unless a failure held a step ($hold) whose block is still open.
    if run.state is interpreter.InstanceState.RUNNING:
        assert run.held
        assert set(run.held) <= failing
        assert all(e["error"] == "task_failed" for e in run.held.values())
    else:
        assert run.held == {}
    created = [call.step for call in run.tasks]
    assert len(created) == len(set(created)), "a step ran twice"
    assert [call.seq for call in run.tasks] == list(range(1, len(created) + 1))
    # Every result consumed is one advance; each task's result is consumed at most once.
    triggers = [advance.trigger for advance in run.advances[1:] if advance.timer is None]
    assert len(triggers) == len(set(triggers))
    assert set(triggers) <= {call.seq for call in run.tasks}
    # Timers always fire, each once, in an advance of its own (unless its block closed).
    fired = [advance.timer for advance in run.advances if advance.timer is not None]
    assert len(fired) == len(set(fired))
    timer_steps = {n for n, s in definition.all_steps.items()
                   if isinstance(s, language.TimerStep)}
    assert set(fired) <= timer_steps
    for name in fired:
        assert run.results[name]["late_ms"] == 0
    if run.state is interpreter.InstanceState.SUCCEEDED:
        assert isinstance(run.output, dict)
        assert run.error is None
    elif run.state is interpreter.InstanceState.FAILED:
        assert run.error["error"] in ("ended_by_fail", "task_failed", "task_failed_here")


@settings(SETTINGS, max_examples=40)
@given(document=definitions(timers=True))
def test_canonical_form_is_stable_under_reordering_and_whitespace(document: dict[str, Any]
                                                                  ) -> None:
    def reorder(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: reorder(value[key]) for key in reversed(list(value))}
        if isinstance(value, list):
            return [reorder(item) for item in value]
        return value

    first = language.parse_definition(json.dumps(document))
    second = language.parse_definition(json.dumps(reorder(document), indent=2))
    assert (first.canonical, first.digest) == (second.canonical, second.digest)


def _scopes(definition: language.Definition) -> list[tuple[str, dict[str, language.Step]]]:
    """(start, steps) of every scope."""
    found = [(definition.start, dict(definition.steps))]
    for step in definition.all_steps.values():
        if isinstance(step, language.ParallelStep):
            found.extend((b.start, dict(b.steps)) for b in step.branches)
    return found


def _mutations(definition: language.Definition) -> list[tuple[str, Any, str]]:
    """(path, new value, the code the refusal must carry at that path)."""
    found: list[tuple[str, Any, str]] = [("$.start", "zz_missing", "missing_target")]
    top = sorted(definition.steps)
    inner_names = sorted(set(definition.all_steps) - set(top))
    for start, steps in _scopes(definition):
        inner = steps is not definition.steps and start not in definition.steps
        for name, step in steps.items():
            for where, _target in language.targets(step):
                found.append((where, "zz_missing", "missing_target"))
                if inner:  # out of its block
                    found.append((where, top[0], "unstructured_join"))
                elif inner_names:  # into a block
                    found.append((where, inner_names[0], "unstructured_join"))
            if isinstance(step, language.TaskStep):
                found.append((f"{step.path}.next", start, "cycle"))
                found.append((f"{step.path}.input", "{'v': input.nope}", "expression_type"))
                found.append((f"{step.path}.input", "{'v': input.n +", "expression_invalid"))
                found.append((f"{step.path}.input", "{'v': input.n + 1.5}", "expression_type"))
            if isinstance(step, language.ChoiceStep):
                found.append((f"{step.path}.choices[0].when", "input.n + 1", "expression_type"))
            if name != start:
                found.append((f"{step.path}.kind", "LOOP", "invalid_value"))
    return found


@SETTINGS
@given(document=definitions(timers=True), data=st.data())
def test_one_broken_rule_is_refused_with_its_path(document: dict[str, Any],
                                                  data: st.DataObject) -> None:
    definition = language.parse_definition(json.dumps(document))
    path, value, code = data.draw(st.sampled_from(_mutations(definition)))
    broken = copy.deepcopy(document)
    set_at(broken, path, value)
    try:
        language.parse_definition(json.dumps(broken))
    except errors.DefinitionInvalid as exc:
        found = [(p["path"], p["code"]) for p in exc.errors]
    else:
        raise AssertionError(f"{path} = {value!r} was accepted")
    assert (path, code) in found, found

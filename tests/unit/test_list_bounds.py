"""List-shaped inputs are bounded before their items are checked (issue 11 §1)."""

from __future__ import annotations

import pytest

from orbit_common import errors
from orbit_common.model import jsondoc
from orbit_common.pulse import workers


def test_a_registration_with_too_many_handlers_is_refused_as_a_whole() -> None:
    handlers = [f"bad name {n}" for n in range(100_000)]
    with pytest.raises(errors.ValidationFailed) as refused:
        workers.validate_registration(["q"], handlers, 1)
    # One problem per handler within the bound, none past it.
    assert len(refused.value.errors) == errors.MAX_LISTED_ERRORS
    assert refused.value.extra["errors_omitted"] == workers.MAX_HANDLERS + 1 - 100


def test_a_validation_problem_lists_a_bounded_number_of_errors() -> None:
    problem = errors.ValidationFailed([{"path": f"$[{n}]", "message": "x"} for n in range(5000)])
    assert len(problem.errors) == errors.MAX_LISTED_ERRORS
    assert problem.extra == {"errors_omitted": 5000 - errors.MAX_LISTED_ERRORS}
    assert problem.detail == "$[0]: x"
    assert "errors_omitted" not in errors.ValidationFailed([{"path": "$", "message": "x"}]).extra


@pytest.mark.parametrize(("document", "over"), [
    (b'{"tasks": [' + b",".join([b"{}"] * 100_000) + b"]}", True),
    (b'{"tasks": [' + b",".join([b"{}"] * 3) + b"]}", False),
    (b' { "other" : [1, {"tasks": [1,2,3,4]}] , "tasks" :[ 1 , "x" , {} , [] ] } ', True),
    (b'{"tasks": []}', False),
    (b'{"tasks": [1, 2, 3, 4', True),      # counted as read: the rest is never looked at
    (b'{"tasks": [1, 2, 3', False),        # malformed: the strict parse reports it
    (b'[{}, {}, {}, {}]', False),
    (b'{"tasks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),  # too deep: reported later
    (b'\xff', False),
])
def test_an_array_is_counted_as_it_is_read(document: bytes, over: bool) -> None:
    assert jsondoc.array_longer_than(document, "tasks", 3) is over

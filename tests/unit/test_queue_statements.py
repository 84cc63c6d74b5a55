"""Configuration statements never write a runtime counter (queues.py and quotas.py docstrings).

The counters -- unfinished tasks, active and reserved attempts, the start window -- belong to the
submit and lease transactions. A configuration change that wrote one would reset usage (or
overwrite a concurrent claim's change), so the statements are checked as text: every column they
assign or insert is a configuration column.
"""

from __future__ import annotations

import re

import pytest

from orbit_common.pulse import queues, quotas


def _assigned(update: str) -> set[str]:
    """The columns of an UPDATE's SET list."""
    match = re.search(r"\bSET\b(.*)\bWHERE\b", update, re.S | re.I)
    assert match is not None, update
    return {part.split("=")[0].strip() for part in match.group(1).split(",")}


def _inserted(insert: str) -> set[str]:
    match = re.search(r"\(([^)]*)\)\s*VALUES", insert, re.S | re.I)
    assert match is not None, insert
    return {column.strip() for column in match.group(1).split(",")}


@pytest.mark.parametrize(("statement", "runtime"), [
    (queues.UPDATE_SETTINGS_IF_REVISION, queues.RUNTIME_COLUMNS),
    (quotas.UPDATE_LIMITS_IF_REVISION, quotas.RUNTIME_COLUMNS),
], ids=["queues.UPDATE_SETTINGS_IF_REVISION", "quotas.UPDATE_LIMITS_IF_REVISION"])
def test_a_configuration_update_assigns_no_runtime_column(statement: str,
                                                          runtime: frozenset[str]) -> None:
    assigned = _assigned(statement)
    assert assigned, statement
    assert not assigned & runtime, assigned & runtime
    assert "revision" in assigned  # a configuration version, never a usage one


def test_the_queue_update_sets_every_limit() -> None:
    assert set(queues.LIMIT_FIELDS) <= _assigned(queues.UPDATE_SETTINGS_IF_REVISION)
    assert set(quotas.LIMIT_FIELDS) <= _assigned(quotas.UPDATE_LIMITS_IF_REVISION)


def test_a_new_queue_starts_with_zero_counters_and_no_window() -> None:
    inserted = _inserted(queues.INSERT_QUEUE)
    assert set(queues.LIMIT_FIELDS) <= inserted
    # active_attempts is written as the literal 0; the others take their column defaults.
    assert inserted & queues.RUNTIME_COLUMNS == {"active_attempts"}
    assert re.search(r",\s*0,\s*UTC_TIMESTAMP", queues.INSERT_QUEUE)


def test_patches_keep_what_they_do_not_name() -> None:
    current = queues.QueueSettings(max_concurrent_attempts=3, max_unfinished_tasks=4,
                                   max_starts_per_second=5)
    assert queues.QueuePatch().apply(current) == current
    cleared = queues.QueuePatch(max_unfinished_tasks=None).apply(current)
    assert (cleared.max_concurrent_attempts, cleared.max_unfinished_tasks,
            cleared.max_starts_per_second) == (3, None, 5)
    limits = quotas.Limits(max_unfinished_tasks=1, max_active_attempts=2,
                           max_reserved_attempts=3, max_starts_per_second=4)
    assert quotas.LimitsPatch().apply(limits) == limits
    assert quotas.LimitsPatch(max_reserved_attempts=None).apply(limits) == quotas.Limits(
        max_unfinished_tasks=1, max_active_attempts=2, max_starts_per_second=4)


@pytest.mark.parametrize("value", [0, -1, quotas.INT_MAX + 1])
def test_limits_outside_the_check_constraints_are_problems(value: int) -> None:
    for name in quotas.LIMIT_FIELDS:
        problems = quotas.LimitsPatch(**{name: value}).problems()
        assert [p["path"] for p in problems] == [f"$.{name}"]
    for name in queues.LIMIT_FIELDS:
        problems = queues.QueuePatch(**{name: value}).problems()
        assert [p["path"] for p in problems] == [f"$.{name}"]


def test_a_create_without_the_new_limits_has_the_digest_of_before_them() -> None:
    # Idempotency records written before migration 0009 must still replay.
    plain = queues.QueueSettings().request_json()
    assert "max_unfinished_tasks" not in plain
    assert "max_starts_per_second" not in plain
    assert "max_concurrent_attempts" in plain
    limited = queues.QueueSettings(max_unfinished_tasks=9).request_json()
    assert limited["max_unfinished_tasks"] == 9

"""Pure pieces: JSON with exact numbers, the outcome table, problem parsing, DTOs, backoff."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from orbit_sdk import (
    BadRequest,
    Grant,
    OrbitError,
    OutcomeUnknown,
    RawJson,
    RetryableError,
    SessionLost,
    Task,
    outcomes,
)
from orbit_sdk._backoff import Backoff
from orbit_sdk.errors import error_from_problem
from orbit_sdk.jsonvalue import dumps, loads

GRANT = Grant(task_id="t" * 32, attempt_id="a" * 32, generation=2, token="secret-token",
              queue="q", handler="h", input=None, rerun_safe=False)


def test_raw_json_and_decimals_keep_their_text() -> None:
    text = dumps({"a": RawJson("1.10"), "b": [Decimal("1E+400"), RawJson('{"x": 1}')],
                  "s": "\u00e9"})
    assert text == '{"a":1.10,"b":[1E+400,{"x": 1}],"s":"\u00e9"}'
    assert loads("0.10000000000000000001", exact_numbers=True) == \
        Decimal("0.10000000000000000001")


def test_raw_json_must_be_one_json_value() -> None:
    for bad in ("", "{", "NaN", "1 2"):
        with pytest.raises(ValueError):
            RawJson(bad)
    with pytest.raises(ValueError):
        dumps(float("nan"))
    with pytest.raises(ValueError):
        dumps(Decimal("Infinity"))
    with pytest.raises(TypeError):
        dumps({1: "int key"})


def test_the_outcome_table() -> None:
    class Flaky(Exception):
        retryable = True

    ok = outcomes.succeeded(GRANT, {"ok": 1}).item()
    assert set(ok) == {"attempt_id", "token", "generation", "report_id", "outcome", "result"}
    assert (ok["outcome"], ok["result"]) == ("succeeded", {"ok": 1})
    assert "retryable" not in ok
    assert "error" not in ok
    cases = {
        RetryableError("later"): ("failed", True),
        Flaky("by attribute"): ("failed", True),
        ValueError("bad"): ("failed", False),
        OutcomeUnknown("who knows"): ("unknown", None),
    }
    for exc, (outcome, retryable) in cases.items():
        report = outcomes.from_exception(GRANT, exc)
        assert (report.outcome, report.retryable) == (outcome, retryable)
        assert report.error == {"type": type(exc).__qualname__, "message": str(exc)}
    assert outcomes.interrupted(GRANT, "lost") is None
    assert outcomes.interrupted(GRANT, "cancel").outcome == "cancelled"  # type: ignore[union-attr]
    assert outcomes.interrupted(GRANT, "shutdown").outcome == "unknown"  # type: ignore[union-attr]
    rerun_safe = outcomes.interrupted(
        Grant(task_id="t", attempt_id="a", generation=1, token="x", queue="q", handler="h",
              input=None, rerun_safe=True), "shutdown")
    assert rerun_safe is not None
    assert (rerun_safe.outcome, rerun_safe.retryable) == ("failed", True)
    assert outcomes.succeeded(GRANT, {1, 2}).error["type"] == "ResultNotJson"  # type: ignore[index]
    too_large = outcomes.succeeded(GRANT, "x" * 100, max_result_bytes=101)
    assert (too_large.outcome, too_large.retryable) == ("failed", False)
    assert too_large.error["type"] == "ResultTooLarge"  # type: ignore[index]
    assert outcomes.succeeded(GRANT, "x" * 99, max_result_bytes=101).outcome == "succeeded"
    first, again = outcomes.succeeded(GRANT, 1), outcomes.succeeded(GRANT, 1)
    assert first.report_id != again.report_id, "every report gets its own id"


def test_tokens_stay_out_of_reprs() -> None:
    assert "secret-token" not in repr(GRANT)
    assert "secret-token" not in repr(outcomes.succeeded(GRANT, 1))


def test_problem_parsing_edge_cases() -> None:
    lost = error_from_problem(409, json.dumps({"code": "session_lost", "detail": "x"}).encode())
    assert isinstance(lost, SessionLost)
    weird = error_from_problem(418, b"I'm a teapot")
    assert isinstance(weird, BadRequest)
    assert (weird.code, weird.detail) == ("http_error", "I'm a teapot")
    unknown = error_from_problem(409, json.dumps({"code": "already_retried",
                                                  "successor": "ab"}).encode())
    assert unknown.code == "already_retried"
    assert unknown.problem["successor"] == "ab"
    assert "409 already_retried" in str(unknown)
    assert isinstance(unknown, OrbitError)


def test_task_from_json_tolerates_missing_and_new_fields() -> None:
    task = Task.from_json({"id": "ab", "queue": "q", "handler": "h", "state": "SUCCEEDED",
                           "created_at": "2030-01-02T03:04:05.000006Z", "brand_new": 1})
    assert task.finished
    assert task.created_at == dt.datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert task.raw["brand_new"] == 1
    assert task.result is None


def test_backoff_is_bounded_and_jittered() -> None:
    backoff = Backoff(0.1, 1.0)
    delays = [backoff.next_delay() for _ in range(10)]
    assert all(0.05 <= d <= 1.0 for d in delays)
    assert max(delays[5:]) <= 1.0
    assert delays[-1] >= 0.5
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_grants_carry_the_concurrency_key_and_its_fencing_token() -> None:
    raw = {"task_id": "t" * 32, "attempt_id": "a" * 32, "generation": 1, "token": "s",
           "queue": "q", "handler": "h", "concurrency_key": "账户:42",
           "concurrency_token": 2**62}
    grant = Grant.from_json(raw)
    assert (grant.concurrency_key, grant.concurrency_token) == ("账户:42", 2**62)
    for bad in (True, "7", 1.5):
        assert Grant.from_json({**raw, "concurrency_token": bad}).concurrency_token is None
    plain = Grant.from_json({k: v for k, v in raw.items() if not k.startswith("concurrency")})
    assert (plain.concurrency_key, plain.concurrency_token) == (None, None)
    assert "secret" not in repr(GRANT)


def test_finish_batches_keep_their_results_under_the_limit() -> None:
    from orbit_sdk.worker import _sized

    reports = [outcomes.succeeded(GRANT, "x" * 98) for _ in range(5)]  # 100 bytes each
    assert [r.size for r in reports] == [100] * 5
    assert len(_sized(reports, 250)) == 2
    assert len(_sized(reports, 500)) == 5
    assert len(_sized(reports, 10)) == 1, "a report alone is always sent"

"""Schemathesis against the real API process: the served OpenAPI document is the contract.

One test per operation of ``/v1/openapi.json`` (parametrized from ``orbit_api.openapi.DOCUMENT``
at import, so every xdist worker collects the same ids; the fixture checks that the API serves
exactly that document). Every check of the pinned schemathesis runs (its default is all of them:
not_a_server_error, status_code_conformance, content_type_conformance,
response_headers_conformance, response_schema_conformance, negative_data_rejection,
positive_data_acceptance, missing_required_header, ignored_auth, unsupported_method,
allow_header_conformance, use_after_free, ensure_resource_availability, …) in every phase
(examples, coverage, fuzzing) with a fixed seed and at most ``MAX_EXAMPLES`` fuzzed cases per
operation, against a fresh database and the API daemon started as a process.

What the test does to the generated cases, and why:

* Path parameters: a generated *valid* namespace, queue, schedule, application or task id is
  replaced by one of the objects the fixture created, so schema-valid requests reach real rows
  (a random name is only ever a 404); invalid ones are sent as generated. Disable and enable
  act on a namespace of their own, so the others stay usable.
* Integral floats (``5.0``) in a JSON body are written as integers (``5``): JSON Schema counts
  ``5.0`` as an integer, but Orbit's integer fields take JSON integers only (docs/api/README.md,
  "数值"), a rule about spelling that no schema keyword states. Both spellings are the same
  value to JSON Schema, so this never turns a valid case invalid or the reverse.
* ``TOLERATED``: a 400 to a schema-valid request is accepted only when every problem it lists is
  one of the rules below that JSON Schema cannot state (each with its reason), or its code is
  one of ``TOLERATED_CODES`` (a cursor the server never issued, a backfill range too large for
  the schedule's stored rule); any other rejection of a valid request still fails.
* An omitted optional body in a case schemathesis calls "negative body" is a positive case
  (see ``_omitted_optional_body_called_negative``): negative_data_rejection skips it.

No other check is skipped, and no operation is excluded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.core import NOT_SET
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from orbit_api import app as _app  # noqa: F401  (the route modules merge into DOCUMENT)
from orbit_api.openapi import DOCUMENT
from tests.support import database
from tests.support.processes import ApiDaemon, http

pytestmark = pytest.mark.slow

SEED = 20261201
# Fuzzed cases per operation (the coverage phase adds its own boundary cases): the module stays
# well under 90 s on two cores.
MAX_EXAMPLES = 10
APPLICATION, NAMESPACE, QUEUE, SCHEDULE = "st", "st", "q", "s"
STATE_NAMESPACE = "st-state"  # the one disable and enable act on

schema = schemathesis.openapi.from_dict(
    json.loads(json.dumps(DOCUMENT)),
    config=SchemathesisConfig.from_dict({
        "seed": SEED,
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
    }),
)


@attrs.frozen
class Served:
    url: str
    auth: dict[str, str]
    task_id: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    server = database.server_url()
    name = database.scratch_name("orbit_st")
    url = database.create_database(server, name)
    boot = subprocess.run(
        [sys.executable, "-m", "orbit_cli", "admin", "bootstrap", "--application", APPLICATION,
         "--namespace", NAMESPACE],
        env={**os.environ, "ORBIT_DATABASE_URL": url.render(hide_password=False)},
        capture_output=True, text=True, check=True)
    api = ApiDaemon(db_url=url, log=tmp / "api.log")
    try:
        api.wait_listening()
        # The all-access key of the bootstrap: every action on every namespace and queue.
        auth = {"Authorization": f"Bearer {json.loads(boot.stdout)['api_key']}"}
        assert http("GET", f"{api.url}/v1/openapi.json") == (
            200, json.loads(json.dumps(DOCUMENT)))
        base = f"{api.url}/v1/namespaces/{NAMESPACE}"
        for path, request in [
            (f"{base}/queues", {"name": QUEUE}),
            (f"{api.url}/v1/namespaces", {"name": STATE_NAMESPACE}),
            (f"{base}/schedules", {"name": SCHEDULE, "queue": QUEUE,
                                   "rule": {"interval_ms": 3_600_000},
                                   "template": {"handler": "h"}}),
            (f"{base}/tasks", {"queue": QUEUE, "handler": "h"}),
        ]:
            status, body = http("POST", path, headers=auth, body=request)
            assert status == 201, body
        yield Served(url=api.url, auth=auth, task_id=body["id"])
    finally:
        api.stop()
        database.drop_database(server, name)


_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?")
_VALID = {"namespace": _NAME, "queue": _NAME, "application": _NAME, "schedule": _NAME,
          "task_id": re.compile(r"[0-9a-f]{32}")}

_ITEM = r"\$(\.tasks\[\d+\])?(\.template)?"  # a submission, a batch item or a schedule template
# (operationId or "*", problem path, message): the only rejections of a schema-valid request
# the test accepts. Each is a rule JSON Schema cannot state; the document says it in words.
TOLERATED: list[tuple[str, str, str]] = [
    # The caller decides: an operator's credential (one that may manage the task's queue, as
    # the test's key may) must give a reason; a request schema cannot see who sends it.
    ("cancelTask", r"\$\.reason", r"required for an operator's cancel"),
    # Cron syntax (fields, ranges, names, steps) is the parser's: no pattern states it. A zone
    # name must exist in the server's tz database, a release the document does not pin.
    ("*", r"\$\.rule\.cron", r""),
    ("*", r"\$\.rule\.timezone", r"unknown time zone"),
    # Relations between two values, or a value and the time of acceptance.
    ("*", r"\$\.rule\.end_at", r"later than start_at"),
    ("backfillSchedule", r"\$\.end", r"after start"),
    ("*", _ITEM + r"\.retry\.max_ms", r"at least|an integer from"),  # >= merged initial_ms
    ("*", _ITEM + r"\.deadline_ms", r"deadline would pass"),
    ("*", _ITEM + r"\.not_before", r"at most 31 days"),
    # UTF-8 bytes: maxLength counts characters; these keys are bounded in bytes.
    ("*", r"(\?|" + _ITEM + r"\.)(business_key|concurrency_key)", r"bytes of UTF-8"),
    # str.isprintable: the pattern excludes control characters; format, private-use,
    # unassigned and separator characters would need Unicode categories in the pattern.
    ("*", r"Idempotency-Key|\$\.tasks\[\d+\]\.idempotency_key",
     r"bytes of printable characters"),
]


# (operationId, code): whole problems of that kind. A cursor is an opaque token only the server
# issues (any other string is invalid_cursor); how many planned instants a backfill range holds
# depends on the schedule's stored rule, not on the request.
TOLERATED_CODES: list[tuple[str, str]] = [
    ("*", "invalid_cursor"),
    ("backfillSchedule", "range_too_large"),
]


def _tolerated(case: Any, response: Any) -> bool:
    if response.status_code != 400:
        return False
    problem = response.json()
    operation = case.operation.definition.raw.get("operationId")
    if problem.get("code") == "invalid_cursor" and "cursor" not in (case.query or {}):
        return False
    if any(op in ("*", operation) and problem.get("code") == code
           for op, code in TOLERATED_CODES):
        return True
    found = problem.get("errors") or []
    return bool(found) and all(
        any(op in ("*", operation) and re.fullmatch(path, error["path"])
            and re.search(message, error["message"]) for op, path, message in TOLERATED)
        for error in found)


def _integers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integers(v) for v in value]
    return value


def _omitted_optional_body_called_negative(case: Any) -> bool:
    """schemathesis 4.32.5 may omit an optional body in a case it draws as "negative body"
    (``_maybe_set_optional_body`` adds "no body" to the negative strategy too) and still calls
    the body negative; an omitted optional body is valid, so the case is a positive one."""
    meta = case.meta
    if meta is None or case.body is not NOT_SET:
        return False
    negative = {location for location, info in meta.components.items()
                if info.mode is GenerationMode.NEGATIVE}
    body = case.operation.definition.raw.get("requestBody", {})
    return negative == {ParameterLocation.BODY} and not body.get("required", False)


@schema.parametrize()
def test_api(case: Any, served: Served) -> None:
    real = {"namespace": NAMESPACE, "queue": QUEUE, "application": APPLICATION,
            "schedule": SCHEDULE, "task_id": served.task_id}
    if case.operation.path.endswith(("/disable", "/enable")):
        real["namespace"] = STATE_NAMESPACE
    for key, value in (case.path_parameters or {}).items():
        if key in _VALID and isinstance(value, str) and _VALID[key].fullmatch(value):
            case.path_parameters[key] = real[key]
    if case.body is not None:
        case.body = _integers(case.body)
    response = case.call(base_url=served.url, headers=served.auth)
    excluded = [positive_data_acceptance] if _tolerated(case, response) else []
    if _omitted_optional_body_called_negative(case):
        excluded.append(negative_data_rejection)
    case.validate_response(response, headers=served.auth, excluded_checks=excluded,
                           transport_kwargs={"base_url": served.url, "headers": served.auth})

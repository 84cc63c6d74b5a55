"""Schemathesis against the real API process: the served OpenAPI document is the contract.

One test per operation of ``/v1/openapi.json`` (parametrized from ``orbit_api.openapi.DOCUMENT``
at import, so every xdist worker collects the same ids; the fixture checks that the API serves
exactly that document: loading it from the URL would need a server at collection time, and
schemathesis' fixture-time loader, ``schemathesis.pytest.from_fixture``, breaks on pytest 9.2).
Every check of the pinned schemathesis runs (its default is all of them: not_a_server_error,
status_code_conformance, content_type_conformance, response_headers_conformance,
response_schema_conformance, negative_data_rejection, positive_data_acceptance,
missing_required_header, ignored_auth, unsupported_method, allow_header_conformance,
use_after_free, ensure_resource_availability, …) in every phase (examples, coverage, fuzzing)
with a fixed seed and at most ``MAX_EXAMPLES`` fuzzed cases per operation,
against a fresh database and the API daemon started as a process. How the cases are
sent and which rejections are tolerated: tests/support/conformance.py and ``TOLERANCE`` below.
Disable and enable act on a namespace of their own, so the others stay usable. No check and no
operation is excluded.

use_after_free and ensure_resource_availability are enabled but judge a history of linked calls
(a DELETE then a GET, a create then a read), which only a stateful run has. A stateful run
(``schema.as_state_machine()`` over the links schemathesis infers) is not part of the suite: its
choice of the next call depends on the live server's answers, which Hypothesis 6 refuses as
FlakyStrategyDefinition after a few scenarios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig

from orbit_api import app as _app  # noqa: F401  (the route modules merge into DOCUMENT)
from orbit_api.openapi import DOCUMENT
from tests.support import conformance, database
from tests.support.processes import ApiDaemon, http

pytestmark = pytest.mark.slow

SEED = 20261201
# Fuzzed cases per operation. Most requests come from the coverage phase (boundary and
# violation cases of every keyword, about 1,000 for the document), which the count does not
# bound; the module takes about 45 s on two idle cores.
MAX_EXAMPLES = 10
APPLICATION, NAMESPACE, QUEUE, SCHEDULE = "st", "st", "q", "s"
STATE_NAMESPACE = "st-state"  # the one disable and enable act on

schema = schemathesis.openapi.from_dict(
    json.loads(json.dumps(DOCUMENT)),
    config=SchemathesisConfig.from_dict({
        "seed": SEED,
        # no-shrink: a failure is reported as found (reproducible with its curl line); shrinking
        # it over HTTP could take minutes.
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none", "no-shrink": True},
    }),
)

_ITEM = r"\$(\.tasks\[\d+\])?(\.template)?"  # a submission, a batch item or a schedule template
# The only rejections of a schema-valid request the test accepts: rules JSON Schema cannot
# state (the document says each in words, docs/api/README.md lists them).
TOLERANCE = conformance.Tolerance(
    rules=[
        # The caller decides: an operator's credential (one that may manage the task's queue,
        # as the test's key may) must give a reason; a request schema cannot see the caller.
        ("cancelTask", r"\$\.reason", r"required for an operator's cancel"),
        # Cron syntax (fields, ranges, names, steps) is the parser's: no pattern states it. A
        # zone name must exist in the server's tz database, a release the document cannot pin.
        ("*", r"\$\.rule\.cron", r""),
        ("*", r"\$\.rule\.timezone", r"unknown time zone"),
        # Relations between two values, or between a value and the time of acceptance.
        ("*", r"\$\.rule\.end_at", r"later than start_at"),
        ("backfillSchedule", r"\$\.end", r"after start"),
        ("*", _ITEM + r"\.retry\.max_ms", r"at least|an integer from"),  # >= merged initial_ms
        ("*", _ITEM + r"\.deadline_ms", r"deadline would pass"),
        ("*", _ITEM + r"\.not_before", r"at most 31 days"),
        # UTF-8 bytes: maxLength counts characters; these keys are bounded in bytes.
        ("*", r"(\?|" + _ITEM + r"\.)(business_key|concurrency_key)", r"bytes of UTF-8"),
        # str.isprintable: the pattern excludes the control characters; format, private-use,
        # unassigned and separator characters would need Unicode categories in a pattern.
        ("*", r"Idempotency-Key|\$\.tasks\[\d+\]\.idempotency_key",
         r"bytes of printable characters"),
    ],
    codes=[
        # A cursor is an opaque token only the server issues: any other string is invalid.
        ("*", "invalid_cursor"),
        # How many planned instants a range holds depends on the schedule's stored rule.
        ("backfillSchedule", "range_too_large"),
    ],
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


@schema.parametrize()
def test_api(case: Any, served: Served) -> None:
    namespace = NAMESPACE
    if case.operation.path.endswith(("/disable", "/enable")):
        namespace = STATE_NAMESPACE
    real = {"namespace": (conformance.NAME, namespace), "queue": (conformance.NAME, QUEUE),
            "application": (conformance.NAME, APPLICATION),
            "schedule": (conformance.NAME, SCHEDULE), "task_id": (conformance.ID, served.task_id)}
    conformance.check(case, url=served.url, auth=served.auth, real=real, tolerance=TOLERANCE)

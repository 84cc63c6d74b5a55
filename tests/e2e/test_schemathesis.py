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
from orbit_common.model.sealing import new_key_text
from tests.support import conformance, database
from tests.support.processes import ApiDaemon, http

pytestmark = pytest.mark.slow

SEED = 20261201
# Fuzzed cases per operation. Most requests come from the coverage phase (boundary and
# violation cases of every keyword, about 1,000 for the document), which the count does not
# bound; the module takes about 45 s on two idle cores.
MAX_EXAMPLES = 10
APPLICATION, NAMESPACE, QUEUE, SCHEDULE, SUBSCRIPTION = "st", "st", "q", "s", "sub"
DEFINITION = "wf"  # a workflow definition with version 1 (one TASK step on QUEUE)
STATE_NAMESPACE = "st-state"  # the one disable and enable act on
NAMESPACE_STATE_PATHS = ("/v1/namespaces/{namespace}/disable",
                         "/v1/namespaces/{namespace}/enable")
# A lease's valid wait_ms (up to 20 s, waited in full when nothing is due) is lowered to at most
# this, another valid value, to keep the run short.
LEASE_WAIT_MS = 100

schema = schemathesis.openapi.from_dict(
    json.loads(json.dumps(DOCUMENT)),
    config=SchemathesisConfig.from_dict({
        "seed": SEED,
        # no-shrink: a failure is reported as found (reproducible with its curl line); shrinking
        # it over HTTP could take minutes.
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none", "no-shrink": True},
    }),
)

# A submission, a batch item (of tasks or workflow starts) or a schedule template.
_ITEM = r"\$(\.(tasks|instances)\[\d+\])?(\.template)?"
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
        ("*", r"Idempotency-Key|\$\.(tasks|instances)\[\d+\]\.idempotency_key",
         r"bytes of printable characters"),
        # A subscription's rules between values and the stored state: the longest backoff is
        # at least the first one, the start is at most the stream's last sequence, an endpoint
        # belongs to a WEBHOOK subscription (update), a secret decodes to 24-64 bytes, a handler
        # name is printable (str.isprintable), only a WEBHOOK subscription has a secret.
        ("*", r"\$\.backoff_max_ms", r"at least backoff_initial_ms"),
        ("createSubscription", r"\$\.start_after_sequence", r"last committed sequence"),
        ("updateSubscription", r"\$\.endpoint_url", r"only for WEBHOOK"),
        ("createSubscription", r"\$\.secret", r"base64"),
        ("*", r"\$\.filters\.handlers\[\d+\]", r"printable"),
        ("rotateSubscriptionSecret", r"\$", r"only a WEBHOOK subscription has a secret"),
        # A workflow's input is checked against its version's input_schema, a stored document.
        ("startWorkflow", r"\$\.input(\..*|\[.*)?", r""),
        # A version number means something only within its definition: the list's version
        # filter needs the definition filter (a relation between two parameters).
        ("listWorkflows", r"\?version", r"needs definition"),
        # Each delivery once per batch: uniqueItems cannot name one property of the items.
        ("settleDeliveries", r"\$\.items\[\d+\]\.delivery_id", r"listed twice"),
    ],
    codes=[
        # A cursor is an opaque token only the server issues: any other string is invalid.
        ("*", "invalid_cursor"),
        # Whether an endpoint may be called is the operator's policy (schemes, allow-list,
        # address ranges), not a pattern.
        ("*", "endpoint_refused"),
        # A WebSocket handshake is made of HTTP/1.1 protocol headers (Upgrade, Connection,
        # Sec-WebSocket-Key and -Version, RFC 6455), not of the operation's parameters: a GET
        # without them is no handshake and aiohttp answers 400 bad_request.
        ("subscriptionStream", "bad_request"),
        # How many planned instants a range holds depends on the schedule's stored rule.
        ("backfillSchedule", "range_too_large"),
        # A definition document's rules (graph, expressions, types, queues) are the validator's
        # (docs/weave/language.md), which no schema states.
        ("publishWorkflowVersion", "definition_invalid"),
        ("validateWorkflowDefinition", "definition_invalid"),
    ],
)


@attrs.frozen
class Served:
    url: str
    auth: dict[str, str]
    task_id: str
    workflow_id: str


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
    # A sealing key, so that WEBHOOK subscriptions can be created (else 503 webhooks_unavailable).
    api = ApiDaemon(db_url=url, log=tmp / "api.log",
                    env={"ORBIT_DELIVERY_SECRET_KEY": new_key_text()})
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
            (f"{base}/subscriptions", {"name": SUBSCRIPTION, "kind": "PULL"}),
            (f"{base}/tasks", {"queue": QUEUE, "handler": "h"}),
        ]:
            status, body = http("POST", path, headers=auth, body=request)
            assert status == 201, body
        task_id = body["id"]
        flow = {"format": "orbit.weave/1", "start": "a",
                "steps": {"a": {"kind": "TASK", "queue": QUEUE, "handler": "h", "next": "done"},
                          "done": {"kind": "SUCCEED"}}}
        for path, request in [
            (f"{base}/workflow-definitions", {"name": DEFINITION}),
            (f"{base}/workflow-definitions/{DEFINITION}/versions",
             {"revision": 1, "document": flow}),
            (f"{base}/workflows", {"definition": DEFINITION, "input": {}}),
        ]:
            status, body = http("POST", path, headers=auth, body=request)
            assert status == 201, body
        yield Served(url=api.url, auth=auth, task_id=task_id, workflow_id=body["id"])
    finally:
        api.stop()
        database.drop_database(server, name)


@schema.parametrize()
def test_api(case: Any, served: Served) -> None:
    namespace = NAMESPACE
    if case.operation.path in NAMESPACE_STATE_PATHS:
        namespace = STATE_NAMESPACE
    real = {"namespace": (conformance.NAME, namespace), "queue": (conformance.NAME, QUEUE),
            "application": (conformance.NAME, APPLICATION),
            "schedule": (conformance.NAME, SCHEDULE), "task_id": (conformance.ID, served.task_id),
            "subscription": (conformance.NAME, SUBSCRIPTION),
            "definition": (conformance.NAME, DEFINITION),
            "workflow_id": (conformance.ID, served.workflow_id)}
    body = case.body
    wait = body.get("wait_ms") if isinstance(body, dict) else None
    if (case.operation.definition.raw.get("operationId") == "leaseDeliveries"
            and isinstance(wait, int | float) and not isinstance(wait, bool)
            and float(wait).is_integer() and LEASE_WAIT_MS < wait <= 20_000):
        case.body = {**body, "wait_ms": LEASE_WAIT_MS}
    conformance.check(case, url=served.url, auth=served.auth, real=real, tolerance=TOLERANCE)

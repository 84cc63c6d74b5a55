"""Schemathesis against a real dispatcher: its worker-gateway OpenAPI document is the contract.

Like tests/e2e/test_schemathesis.py (the API's document; same seed, checks, phases and
adjustments, tests/support/conformance.py), for ``orbit_dispatcher.openapi.DOCUMENT``: the
dispatcher and the API run as processes on a fresh database with a queue and a registered
worker session, whose id replaces every generated valid ``session_id``. The WebSocket upgrade is
an operation too: a plain GET of it must answer as documented. A long poll's valid wait_ms is
lowered to ``POLL_WAIT_MS`` (still valid) so that the run stays short. No check and no operation
is excluded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig

from orbit_dispatcher.openapi import DOCUMENT
from tests.support import conformance
from tests.support.processes import http
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

SEED = 20261201
MAX_EXAMPLES = 10
QUEUE = "q"

schema = schemathesis.openapi.from_dict(
    json.loads(json.dumps(DOCUMENT)),
    config=SchemathesisConfig.from_dict({
        "seed": SEED,
        # no-shrink: a failure is reported as found (reproducible with its curl line); shrinking
        # it over HTTP could take minutes.
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none", "no-shrink": True},
    }),
)

# The only rejections of a schema-valid request the test accepts (rules JSON Schema cannot
# state; the document says each in words).
TOLERANCE = conformance.Tolerance(
    rules=[
        # UTF-8 bytes: maxLength counts characters; these are bounded in bytes.
        ("registerWorkerSession", r"\$\.instance_key", r"bytes"),
        ("workerFinish", r"\$\.items\[\d+\]\.report_id", r"bytes"),
    ],
    codes=[
        # A WebSocket handshake is made of HTTP/1.1 protocol headers (Upgrade, Connection,
        # Sec-WebSocket-Key and -Version, RFC 6455), not of the operation's parameters: a GET
        # without them is no handshake and aiohttp answers 400 bad_request.
        ("workerWebSocket", "bad_request"),
    ],
)
# A long poll with no work waits for as long as it is asked to (wait_ms, up to 30 s): the test
# lowers a valid wait_ms to at most this, another valid value, to keep its time bounded.
POLL_WAIT_MS = 100


@attrs.frozen
class Served:
    url: str
    auth: dict[str, str]
    namespace: str
    session_id: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    stack = Stack(tmp_path_factory.mktemp("schemathesis-dispatcher"))
    try:
        stack.create_queue(QUEUE)
        url = stack.dispatchers[0].url
        assert http("GET", f"{url}/v1/openapi.json") == (200, json.loads(json.dumps(DOCUMENT)))
        status, body = http("POST", f"{url}/v1/namespaces/{stack.namespace}/worker/sessions",
                            headers=stack.auth,
                            body={"instance_key": "w", "queues": [QUEUE], "handlers": ["h"]})
        assert status == 201, body
        yield Served(url=url, auth=stack.auth, namespace=stack.namespace,
                     session_id=body["session_id"])
    finally:
        stack.close()


@schema.parametrize()
def test_dispatcher(case: Any, served: Served) -> None:
    real = {"namespace": (conformance.NAME, served.namespace),
            "session_id": (conformance.ID, served.session_id)}
    body = case.body
    wait = body.get("wait_ms") if isinstance(body, dict) else None
    if (case.operation.definition.raw.get("operationId") == "workerPoll"
            and isinstance(wait, int | float) and not isinstance(wait, bool)
            and float(wait).is_integer() and POLL_WAIT_MS < wait <= 30_000):
        case.body = {**body, "wait_ms": POLL_WAIT_MS}
    conformance.check(case, url=served.url, auth=served.auth, real=real, tolerance=TOLERANCE)

"""The webhook receiver: verify the signature, apply the result, answer 2xx only after commit.

``POST /orbit/results`` answers:

* 401 -- the signature does not verify (or the timestamp is stale): nothing is written;
* 400 -- an authentic body that is not a task.result delivery (nothing written; Orbit retries
  it until its budget is spent, which an operator sees);
* 200 ``{"outcome": "applied" | "stale" | "duplicate"}`` -- committed (or committed before);
  a duplicate is acknowledged too, so a delivery whose 2xx was lost stops being retried;
* 204 -- a signed event of another type, ignored so it does not clog the subscription;
* 503 -- the database failed: nothing was committed, Orbit redelivers later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aiomysql
import pymysql
from aiohttp import web
from orbit_sdk import WebhookVerificationError, webhooks

from result_inbox.inbox import BadDelivery, OnApplied, TaskResult, apply_with_retry

log = logging.getLogger(__name__)

PATH = "/orbit/results"
MAX_BODY = 8 * 1024 * 1024  # Orbit's results are bounded; this bounds what we buffer

POOL = web.AppKey("pool", aiomysql.Pool)


def create_app(pool: aiomysql.Pool, secrets: Sequence[str], *,
               on_applied: OnApplied | None = None, tolerance: float = 300) -> web.Application:
    """The receiver application on ``pool`` (its owner closes it), verifying with ``secrets``
    (one, or two while rotating). ``on_applied`` is the business step run in the transaction."""
    if not secrets:
        raise ValueError("at least one webhook secret is needed")
    keys = list(secrets)

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            document = webhooks.verify(keys, request.headers, body, tolerance=tolerance,
                                       exact_numbers=True)
        except WebhookVerificationError as exc:
            return web.json_response({"error": str(exc)}, status=401)
        if document.get("type") != "task.result":
            return web.Response(status=204)
        try:
            result = TaskResult.from_delivery(document)
        except BadDelivery as exc:
            return web.json_response({"error": str(exc)}, status=400)
        try:
            outcome = await apply_with_retry(request.app[POOL], result, on_applied=on_applied)
        except (pymysql.err.MySQLError, OSError):
            log.exception("applying delivery %s failed", result.delivery_id)
            return web.json_response({"error": "not stored, retry later"}, status=503)
        return web.json_response({"outcome": outcome.value})

    app = web.Application(client_max_size=MAX_BODY)
    app[POOL] = pool
    app.router.add_post(PATH, receive)
    return app


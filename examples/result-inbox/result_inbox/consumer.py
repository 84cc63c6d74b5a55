"""The pull consumer: the same ``apply`` as the webhook receiver, fed by ``orbit_sdk.Subscriber``.

For each delivery of a PULL subscription the handler reads the ``task.result`` body (numbers
exact), applies it in one transaction (:func:`result_inbox.inbox.apply_with_retry`) and returns;
the Subscriber acknowledges **only after** that commit. A duplicate (the event was applied
before: an acknowledgement that got lost, a lease that lapsed) or a stale revision commits
nothing new and is acknowledged too, so it stops coming. A failure before the commit (the
database, the business step, a body this consumer does not understand) raises: the Subscriber
reports the delivery failed and Orbit delivers it again after the subscription's backoff, until
its budget is spent (then an operator sees it EXHAUSTED).
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import aiomysql
from orbit_sdk import ResultDelivery, Subscriber

from result_inbox.inbox import OnApplied, TaskResult, apply_with_retry

log = logging.getLogger(__name__)


class InboxConsumer:
    """A Subscriber whose handler applies each delivery to the inbox on ``pool``.

    ``outcomes`` counts what :func:`apply` answered (``applied``, ``stale``, ``duplicate``).
    Further keyword options go to :class:`orbit_sdk.Subscriber` (``concurrency``,
    ``transport``, ``drain_timeout``, …).
    """

    def __init__(self, pool: aiomysql.Pool, *, api_url: str, api_key: str, namespace: str,
                 subscription: str, on_applied: OnApplied | None = None,
                 **options: Any) -> None:
        self.pool = pool
        self.on_applied = on_applied
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.subscriber = Subscriber(api_url, api_key, namespace, subscription, self.handle,
                                     exact_numbers=True, **options)

    async def handle(self, delivery: ResultDelivery) -> None:
        """Apply one delivery; returning means committed (the Subscriber then acknowledges)."""
        result = TaskResult.from_delivery(delivery.raw)  # BadDelivery: reported failed
        outcome = await apply_with_retry(self.pool, result, on_applied=self.on_applied)
        self.outcomes[outcome.value] += 1
        log.info("delivery %s (task %s revision %d, attempt %d): %s", delivery.id,
                 delivery.task_id, delivery.task_revision, delivery.attempt, outcome.value)

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until SIGTERM/SIGINT (or :meth:`stop`), then drain."""
        await self.subscriber.run(install_signal_handlers=install_signal_handlers)

    def stop(self) -> None:
        self.subscriber.stop()

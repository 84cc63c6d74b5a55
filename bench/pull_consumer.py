"""The delivery benchmark's pull consumer: the SDK's :class:`orbit_sdk.Subscriber` over the
API's WebSocket stream (``…/subscriptions/{name}/stream``), a handler that does nothing,
``PULL_CONCURRENCY`` deliveries held at once (32), until SIGTERM (the subscriber drains).

It consumes through the public interface a real consumer uses -- credit, pushed deliveries,
``ack`` frames answered by ``settled`` -- so the figure includes the API's stream and the SDK,
not only the relay's transactions."""

from __future__ import annotations

import asyncio
import logging
import os

from orbit_sdk import Subscriber
from orbit_sdk.models import ResultDelivery


async def _handle(_delivery: ResultDelivery) -> None:
    return None


async def consume() -> None:
    subscriber = Subscriber(
        os.environ["ORBIT_API_URL"], os.environ["ORBIT_API_KEY"], os.environ["ORBIT_NAMESPACE"],
        os.environ["PULL_SUBSCRIPTION"], _handle,
        concurrency=int(os.environ.get("PULL_CONCURRENCY", "32")),
        transport=os.environ.get("PULL_TRANSPORT", "websocket"), drain_timeout=10.0)
    await subscriber.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(consume())

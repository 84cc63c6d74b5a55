"""The delivery benchmark's pull consumer: lease a batch of a PULL subscription, acknowledge
each delivery (eight acknowledgements in flight), repeat (a short pause when nothing is due)
until SIGTERM.

It runs the relay's consumer transactions (``orbit_common.relay.deliveries``) directly -- the
same ones the API's pull routes run -- so it measures the delivery path, not an HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.platform import credentials
from orbit_common.relay import deliveries


async def consume() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    db = await open_database(DatabaseUrl.parse(os.environ["ORBIT_DATABASE_URL"]), minsize=1,
                             maxsize=9)
    in_flight = asyncio.Semaphore(8)
    namespace, name = os.environ["ORBIT_NAMESPACE"], os.environ["PULL_SUBSCRIPTION"]
    try:
        who = await db.read("bench.auth", lambda cur: credentials.authenticate(
            cur, os.environ["ORBIT_API_KEY"]))
        while not stop.is_set():
            leased = await deliveries.lease_deliveries(db, who, namespace=namespace, name=name,
                                                       limit=100)

            async def acknowledge(lease: deliveries.Leased) -> None:
                async with in_flight:
                    await deliveries.acknowledge_delivery(
                        db, who, namespace=namespace, name=name,
                        delivery_id=lease.delivery_id, token=lease.token)

            await asyncio.gather(*(acknowledge(lease) for lease in leased))
            if not leased:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.02)
    finally:
        await db.close()


if __name__ == "__main__":
    asyncio.run(consume())

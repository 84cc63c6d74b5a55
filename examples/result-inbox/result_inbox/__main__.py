"""``python -m result_inbox {init-db,serve,consume}`` (run from examples/result-inbox).

``serve`` runs the webhook receiver (for a WEBHOOK subscription); ``consume`` runs the pull
consumer (for a PULL subscription: WebSocket, or HTTP long-polling when the upgrade is refused).
Both apply each result with the same transaction and acknowledge only after its commit.

Configuration from the environment:

* ``RESULT_INBOX_DATABASE_URL`` -- ``mysql://user:password@host:port/database`` (required);
* ``RESULT_INBOX_SECRETS`` -- the subscription's ``whsec_…`` secret; two, space separated,
  while you rotate yours (required for ``serve``);
* ``RESULT_INBOX_LISTEN`` -- ``host:port`` to listen on (default ``127.0.0.1:8090``);
* ``ORBIT_API_URL``, ``ORBIT_API_KEY``, ``ORBIT_NAMESPACE`` -- the Orbit API, a credential with
  ``subscriptions.consume`` and the namespace (required for ``consume``);
* ``RESULT_INBOX_SUBSCRIPTION`` -- the PULL subscription's name (required for ``consume``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys

from aiohttp import web

from result_inbox.consumer import InboxConsumer
from result_inbox.database import init_db, open_pool
from result_inbox.receiver import PATH, create_app


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name) or default
    if not value:
        sys.exit(f"set {name} (see python -m result_inbox --help)")
    return value


async def serve(url: str, secrets: list[str], host: str, port: int) -> None:
    pool = await open_pool(url)
    runner = web.AppRunner(create_app(pool, secrets))
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        print(f"receiving Orbit results at http://{host}:{port}{PATH}", flush=True)
        await asyncio.Event().wait()  # until Ctrl-C / SIGTERM
    finally:
        await runner.cleanup()
        pool.close()
        await pool.wait_closed()


async def consume(url: str, *, concurrency: int, transport: str) -> None:
    pool = await open_pool(url, maxsize=max(2, concurrency))
    try:
        consumer = InboxConsumer(
            pool, api_url=_env("ORBIT_API_URL"), api_key=_env("ORBIT_API_KEY"),
            namespace=_env("ORBIT_NAMESPACE"), subscription=_env("RESULT_INBOX_SUBSCRIPTION"),
            concurrency=concurrency, transport=transport)
        print(f"consuming {consumer.subscriber.subscription} into the inbox", flush=True)
        await consumer.run()  # until Ctrl-C / SIGTERM, then drain
    finally:
        pool.close()
        await pool.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m result_inbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init-db", help="create receiver_inbox and receiver_task_views")
    commands.add_parser("serve", help="run the webhook receiver")
    pull = commands.add_parser("consume", help="run the pull consumer of a PULL subscription")
    pull.add_argument("--concurrency", type=int, default=8,
                      help="deliveries applied at once (default 8)")
    pull.add_argument("--transport", choices=["auto", "websocket", "long-poll"],
                      default="auto", help="auto: WebSocket, long-polling if refused")
    args = parser.parse_args()
    url = _env("RESULT_INBOX_DATABASE_URL")
    if args.command == "init-db":
        asyncio.run(init_db(url))
        print("tables ready", flush=True)
        return
    if args.command == "consume":
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        asyncio.run(consume(url, concurrency=args.concurrency, transport=args.transport))
        return
    secrets = _env("RESULT_INBOX_SECRETS").split()
    host, _, port = _env("RESULT_INBOX_LISTEN", "127.0.0.1:8090").rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(url, secrets, host or "127.0.0.1", int(port)))


if __name__ == "__main__":
    main()

"""``python -m result_inbox {init-db,serve}`` (run from examples/result-inbox).

Configuration from the environment:

* ``RESULT_INBOX_DATABASE_URL`` -- ``mysql://user:password@host:port/database`` (required);
* ``RESULT_INBOX_SECRETS`` -- the subscription's ``whsec_…`` secret; two, space separated,
  while you rotate yours (required for ``serve``);
* ``RESULT_INBOX_LISTEN`` -- ``host:port`` to listen on (default ``127.0.0.1:8090``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

from aiohttp import web

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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m result_inbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init-db", help="create receiver_inbox and receiver_task_views")
    commands.add_parser("serve", help="run the webhook receiver")
    args = parser.parse_args()
    url = _env("RESULT_INBOX_DATABASE_URL")
    if args.command == "init-db":
        asyncio.run(init_db(url))
        print("tables ready", flush=True)
        return
    secrets = _env("RESULT_INBOX_SECRETS").split()
    host, _, port = _env("RESULT_INBOX_LISTEN", "127.0.0.1:8090").rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(url, secrets, host or "127.0.0.1", int(port)))


if __name__ == "__main__":
    main()

"""``python -m examples.fencing {run,submit}``: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import Any

from orbit_sdk import Client, Conflict, Context, Worker

from examples.fencing.ledger import apply, open_ledger

QUEUE = "ledger"


class StaleToken(Exception):
    """The resource refused the write: a newer fencing token has written there."""


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name) or default
    if not value:
        sys.exit(f"set {name} (see python -m examples.fencing --help)")
    return value


def build_worker() -> Worker:
    ledger = open_ledger(_env("ORBIT_LEDGER", "ledger.sqlite3"))
    worker = Worker(_env("ORBIT_DISPATCHER_URL"), _env("ORBIT_API_KEY"),
                    _env("ORBIT_NAMESPACE"), queues=[QUEUE], concurrency=8)

    @worker.handler("deposit")
    async def deposit(ctx: Context, data: Any) -> Any:
        token = ctx.concurrency_token
        if token is None:  # submitted without a concurrency key: nothing to fence with
            raise ValueError("deposit tasks must carry concurrency_key='account:<id>'")
        outcome = apply(ledger, data["account"], data["amount"], token)
        if outcome == "stale":
            # A newer permit on this account has written: this attempt was superseded (its
            # lease is gone) and its write did not land. Nothing to undo; the report that
            # follows is kept by Orbit as late evidence.
            raise StaleToken(f"token {token} is stale for account {data['account']}")
        return {"account": data["account"], "token": token, "outcome": outcome}

    return worker


async def submit(count: int) -> None:
    ledger = open_ledger(_env("ORBIT_LEDGER", "ledger.sqlite3"))
    async with Client(_env("ORBIT_API_URL"), _env("ORBIT_API_KEY"),
                      _env("ORBIT_NAMESPACE")) as orbit:
        with contextlib.suppress(Conflict):
            await orbit.create_queue(QUEUE, description="fencing-token example")
        for n in range(count):
            account = f"acct-{n % 3}"
            ledger.execute("INSERT OR IGNORE INTO accounts (id, balance) VALUES (?, 0)",
                           (account,))
            task = await orbit.submit(QUEUE, "deposit", {"account": account, "amount": 10},
                                      concurrency_key=f"account:{account}")
            print(task.id, account)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.fencing")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="run the worker")
    submit_parser = commands.add_parser("submit", help="submit deposits")
    submit_parser.add_argument("-n", type=int, default=9)
    args = parser.parse_args()
    if args.command == "run":
        build_worker().run_forever()
    else:
        asyncio.run(submit(args.n))


if __name__ == "__main__":
    main()

"""``python -m examples.worker {run,submit}``: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from typing import Any

from orbit_sdk import Client, Conflict, Worker

from examples.worker.handlers import register


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name) or default
    if not value:
        sys.exit(f"set {name} (see python -m examples.worker --help)")
    return value


def run_worker(args: argparse.Namespace) -> None:
    worker = Worker(
        _env("ORBIT_DISPATCHER_URL"), _env("ORBIT_API_KEY"), _env("ORBIT_NAMESPACE"),
        queues=[args.queue], concurrency=args.concurrency, drain_timeout=args.drain_timeout,
    )
    register(worker)
    logging.getLogger("examples.worker").info("working on queue %r; Ctrl-C to stop", args.queue)
    worker.run_forever()


async def submit(args: argparse.Namespace) -> None:
    async with Client(_env("ORBIT_API_URL"), _env("ORBIT_API_KEY"),
                      _env("ORBIT_NAMESPACE")) as orbit:
        with contextlib.suppress(Conflict):  # the queue may exist already
            await orbit.create_queue(args.queue, description="Orbit SDK example")
        inputs: list[tuple[str, Any]] = [("greet", {"name": f"user-{i}"}) for i in range(args.n)]
        inputs += [("charge", {"amount": 5, "mode": "flaky", "seconds": 0.2}),
                   ("charge", {"amount": 7, "mode": "invalid"})]
        receipts = [await orbit.submit(args.queue, handler, data, rerun_safe=handler == "greet")
                    for handler, data in inputs]
        print(f"submitted {len(receipts)} task(s); waiting for their outcomes")
        deadline = time.monotonic() + args.wait
        for receipt in receipts:
            task = await orbit.get_task(receipt.id)
            while not task.finished and task.state != "NEEDS_REVIEW" \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                task = await orbit.get_task(receipt.id)
            print(f"{task.id} {task.handler:<7} {task.state:<12} "
                  f"result={task.result} error={task.error}")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.worker",
        description="Orbit SDK example. Environment: ORBIT_API_URL (submit), "
                    "ORBIT_DISPATCHER_URL (run), ORBIT_API_KEY, ORBIT_NAMESPACE, ORBIT_QUEUE.")
    parser.add_argument("--queue", default=os.environ.get("ORBIT_QUEUE") or "examples")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the worker until SIGTERM or Ctrl-C")
    run.add_argument("--concurrency", type=int, default=8)
    run.add_argument("--drain-timeout", type=float, default=30.0)
    sub = commands.add_parser("submit", help="submit example tasks and print their outcomes")
    sub.add_argument("-n", type=int, default=3, help="how many greet tasks")
    sub.add_argument("--wait", type=float, default=30.0, help="seconds to wait for outcomes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    if args.command == "run":
        run_worker(args)
    else:
        asyncio.run(submit(args))


if __name__ == "__main__":
    main()

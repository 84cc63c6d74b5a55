"""``python -m examples.order_workflow {setup,worker,order,show}``.

* ``setup`` -- create the three queues and the ``order`` definition (each only if missing) and
  publish ``definition.json`` unless the latest version already has the same digest;
* ``worker`` -- an SDK worker for the three queues (Ctrl-C drains and stops);
* ``order ORDER_ID --amount A --sku S [--sku S …] [--express]`` -- start an instance (the order
  id is its business key and, with the ``order-`` prefix, its idempotency key: placing the same
  order twice returns the first instance); ``--wait`` waits for its end;
* ``show WORKFLOW_ID`` -- the instance with its steps, as JSON.

Environment: ORBIT_API_URL, ORBIT_DISPATCHER_URL (worker), ORBIT_API_KEY, ORBIT_NAMESPACE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from orbit_sdk import Client, Conflict, Worker

from examples.order_workflow.handlers import QUEUES, register

DEFINITION = "order"
DOCUMENT = Path(__file__).with_name("definition.json")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"set {name} (see python -m examples.order_workflow --help)")
    return value


def _client() -> Client:
    return Client(_env("ORBIT_API_URL"), _env("ORBIT_API_KEY"), _env("ORBIT_NAMESPACE"))


async def setup() -> int:
    """The queues, the definition and its latest version; the version number."""
    document = json.loads(DOCUMENT.read_text())
    async with _client() as orbit:
        for queue in QUEUES:
            with contextlib.suppress(Conflict):  # it exists already
                await orbit.create_queue(queue, description="order workflow example")
        with contextlib.suppress(Conflict):
            await orbit.create_workflow_definition(DEFINITION,
                                                   description="order workflow example")
        found = await orbit.get_workflow_definition(DEFINITION)
        wanted = (await orbit.validate_workflow_definition(document)).digest
        if found.latest_version:
            latest = await orbit.get_workflow_version(DEFINITION, found.latest_version)
            if latest.digest == wanted:
                return found.latest_version
        published = await orbit.publish_workflow_version(DEFINITION, document,
                                                         revision=found.revision)
        return int(published.published_version or 0)


async def place(order_id: str, amount: float, skus: list[str], express: bool,
                wait: bool) -> dict[str, Any]:
    async with _client() as orbit:
        instance = await orbit.start_workflow(
            DEFINITION, {"order_id": order_id, "amount": amount, "express": express,
                         "items": [{"sku": sku, "qty": 1} for sku in skus]},
            business_key=order_id, idempotency_key=f"order-{order_id}")
        while wait and not instance.finished:  # RUNNING, or STOPPING (docs/weave/stop.md)
            await asyncio.sleep(0.2)
            instance = await orbit.get_workflow(instance.id)
        return instance.raw


async def show(workflow_id: str) -> dict[str, Any]:
    async with _client() as orbit:
        return (await orbit.get_workflow(workflow_id)).raw


def run_worker() -> None:
    worker = Worker(_env("ORBIT_DISPATCHER_URL"), _env("ORBIT_API_KEY"),
                    _env("ORBIT_NAMESPACE"), queues=list(QUEUES))
    register(worker)
    worker.run_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.order_workflow",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="queues, definition, latest version")
    commands.add_parser("worker", help="run the handlers")
    order = commands.add_parser("order", help="place an order (start an instance)")
    order.add_argument("order_id")
    order.add_argument("--amount", type=float, required=True)
    order.add_argument("--sku", action="append", required=True)
    order.add_argument("--express", action="store_true")
    order.add_argument("--wait", action="store_true", help="wait until the workflow ends")
    shown = commands.add_parser("show", help="an instance with its steps")
    shown.add_argument("workflow_id")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "setup":
        print(json.dumps({"definition": DEFINITION, "version": asyncio.run(setup())}))
    elif args.command == "worker":
        run_worker()
    elif args.command == "order":
        print(json.dumps(asyncio.run(place(args.order_id, args.amount, args.sku,
                                           args.express, args.wait)), ensure_ascii=False))
    else:
        print(json.dumps(asyncio.run(show(args.workflow_id)), ensure_ascii=False))


if __name__ == "__main__":
    main()

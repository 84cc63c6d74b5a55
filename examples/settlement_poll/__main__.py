"""``python -m examples.settlement_poll {setup,worker,transfer,rounds}``.

* ``setup`` -- create the ``bank`` queue and the ``settlement`` definition (each only if
  missing) and publish ``definition.json`` unless the latest version already has its digest;
* ``worker`` -- an SDK worker for the queue (Ctrl-C drains and stops);
* ``transfer TRANSFER_ID --amount A --settle-after-ms MS [--wait]`` -- start an instance (the
  transfer id is its business key and, with the ``transfer-`` prefix, its idempotency key);
  ``--wait`` waits for its end;
* ``rounds WORKFLOW_ID`` -- the POLL step's query and its rounds, as JSON.

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

from examples.settlement_poll.handlers import QUEUES, register

DEFINITION = "settlement"
POLL_STEP = "settle"
DOCUMENT = Path(__file__).with_name("definition.json")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"set {name} (see python -m examples.settlement_poll --help)")
    return value


def _client() -> Client:
    return Client(_env("ORBIT_API_URL"), _env("ORBIT_API_KEY"), _env("ORBIT_NAMESPACE"))


async def setup() -> int:
    """The queue, the definition and its latest version; the version number."""
    document = json.loads(DOCUMENT.read_text())
    async with _client() as orbit:
        for queue in QUEUES:
            with contextlib.suppress(Conflict):  # it exists already
                await orbit.create_queue(queue, description="settlement example")
        with contextlib.suppress(Conflict):
            await orbit.create_workflow_definition(DEFINITION,
                                                   description="settlement example")
        found = await orbit.get_workflow_definition(DEFINITION)
        wanted = (await orbit.validate_workflow_definition(document)).digest
        if found.latest_version:
            latest = await orbit.get_workflow_version(DEFINITION, found.latest_version)
            if latest.digest == wanted:
                return found.latest_version
        published = await orbit.publish_workflow_version(DEFINITION, document,
                                                         revision=found.revision)
        return int(published.published_version or 0)


async def start(transfer_id: str, amount: float, settle_after_ms: int,
                wait: bool) -> dict[str, Any]:
    async with _client() as orbit:
        instance = await orbit.start_workflow(
            DEFINITION, {"transfer_id": transfer_id, "amount": amount,
                         "settle_after_ms": settle_after_ms},
            business_key=transfer_id, idempotency_key=f"transfer-{transfer_id}")
        while wait and not instance.finished:  # RUNNING, or STOPPING (docs/weave/stop.md)
            await asyncio.sleep(0.2)
            instance = await orbit.get_workflow(instance.id)
        return instance.raw


async def rounds(workflow_id: str) -> dict[str, Any]:
    async with _client() as orbit:
        found = await orbit.get_poll_rounds(workflow_id, POLL_STEP)
        return {"workflow_id": found.workflow_id, "step": found.step, "poll": found.poll.raw,
                "rounds": [r.raw for r in found.rounds]}


def run_worker() -> None:
    worker = Worker(_env("ORBIT_DISPATCHER_URL"), _env("ORBIT_API_KEY"),
                    _env("ORBIT_NAMESPACE"), queues=list(QUEUES))
    register(worker)
    worker.run_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.settlement_poll",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="queue, definition, latest version")
    commands.add_parser("worker", help="run the handlers")
    transfer = commands.add_parser("transfer", help="start a transfer's workflow")
    transfer.add_argument("transfer_id")
    transfer.add_argument("--amount", type=float, required=True)
    transfer.add_argument("--settle-after-ms", type=int, required=True)
    transfer.add_argument("--wait", action="store_true", help="wait until the workflow ends")
    shown = commands.add_parser("rounds", help="the POLL step's query and rounds")
    shown.add_argument("workflow_id")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "setup":
        print(json.dumps({"definition": DEFINITION, "version": asyncio.run(setup())}))
    elif args.command == "worker":
        run_worker()
    elif args.command == "transfer":
        print(json.dumps(asyncio.run(start(args.transfer_id, args.amount,
                                           args.settle_after_ms, args.wait)),
                         ensure_ascii=False))
    else:
        print(json.dumps(asyncio.run(rounds(args.workflow_id)), ensure_ascii=False))


if __name__ == "__main__":
    main()

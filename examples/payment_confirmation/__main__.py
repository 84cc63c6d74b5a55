"""``python -m examples.payment_confirmation {setup,worker,pay,confirm,show}``.

* ``setup`` -- create the ``payments`` queue and the ``payment`` definition (each only if
  missing) and publish ``definition.json`` unless the latest version already has its digest;
* ``worker`` -- an SDK worker for the queue (Ctrl-C drains and stops);
* ``pay PAYMENT_ID --amount-cents N`` -- start an instance (the payment id is its business key
  and, with the ``pay-`` prefix, its idempotency key);
* ``confirm PAYMENT_ID --status approved|declined [--version 1|2] [--wait]`` -- the provider's
  callback: send the ``payment_confirmed`` signal to the payment's running instance by
  definition and business key, correlated by the payment id (idempotency key ``confirm-`` +
  payment id: a repeated callback gets the first receipt); ``--wait`` waits for the workflow's
  end. A confirmation sent before the workflow waits for it is kept and consumed when it does;
* ``show WORKFLOW_ID`` -- the instance with its steps and its signals, as JSON.

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

from examples.payment_confirmation.handlers import QUEUES, register

DEFINITION = "payment"
DOCUMENT = Path(__file__).with_name("definition.json")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"set {name} (see python -m examples.payment_confirmation --help)")
    return value


def _client() -> Client:
    return Client(_env("ORBIT_API_URL"), _env("ORBIT_API_KEY"), _env("ORBIT_NAMESPACE"))


async def setup() -> int:
    """The queue, the definition and its latest version; the version number."""
    document = json.loads(DOCUMENT.read_text())
    async with _client() as orbit:
        for queue in QUEUES:
            with contextlib.suppress(Conflict):  # it exists already
                await orbit.create_queue(queue, description="payment workflow example")
        with contextlib.suppress(Conflict):
            await orbit.create_workflow_definition(DEFINITION,
                                                   description="payment workflow example")
        found = await orbit.get_workflow_definition(DEFINITION)
        wanted = (await orbit.validate_workflow_definition(document)).digest
        if found.latest_version:
            latest = await orbit.get_workflow_version(DEFINITION, found.latest_version)
            if latest.digest == wanted:
                return found.latest_version
        published = await orbit.publish_workflow_version(DEFINITION, document,
                                                         revision=found.revision)
        return int(published.published_version or 0)


async def pay(payment_id: str, amount_cents: int) -> dict[str, Any]:
    async with _client() as orbit:
        instance = await orbit.start_workflow(
            DEFINITION, {"payment_id": payment_id, "amount_cents": amount_cents},
            business_key=payment_id, idempotency_key=f"pay-{payment_id}")
        return instance.raw


async def confirm(payment_id: str, status: str, version: int, wait: bool) -> dict[str, Any]:
    async with _client() as orbit:
        sent = await orbit.send_signal(
            None, "payment_confirmed", {"status": status}, correlation_key=payment_id,
            payload_version=version, evidence_ref=f"callback:{payment_id}",
            definition=DEFINITION, business_key=payment_id,
            idempotency_key=f"confirm-{payment_id}")
        instance = await orbit.get_workflow(sent.workflow_id)
        while wait and not instance.finished:  # RUNNING, or STOPPING (docs/weave/stop.md)
            await asyncio.sleep(0.2)
            instance = await orbit.get_workflow(sent.workflow_id)
        signal = await orbit.get_signal(sent.workflow_id, sent.id)
        return {"signal": signal.raw, "workflow": instance.raw}


async def show(workflow_id: str) -> dict[str, Any]:
    async with _client() as orbit:
        instance = (await orbit.get_workflow(workflow_id)).raw
        instance["signals"] = [s.raw async for s in orbit.list_signals(workflow_id)]
        return instance


def run_worker() -> None:
    worker = Worker(_env("ORBIT_DISPATCHER_URL"), _env("ORBIT_API_KEY"),
                    _env("ORBIT_NAMESPACE"), queues=list(QUEUES))
    register(worker)
    worker.run_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.payment_confirmation",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="queue, definition, latest version")
    commands.add_parser("worker", help="run the handlers")
    paid = commands.add_parser("pay", help="start a payment (an instance)")
    paid.add_argument("payment_id")
    paid.add_argument("--amount-cents", type=int, required=True)
    confirmed = commands.add_parser("confirm", help="the provider's callback (a signal)")
    confirmed.add_argument("payment_id")
    confirmed.add_argument("--status", choices=("approved", "declined"), required=True)
    confirmed.add_argument("--version", type=int, default=1, help="the payload version")
    confirmed.add_argument("--wait", action="store_true", help="wait until the workflow ends")
    shown = commands.add_parser("show", help="an instance with its steps and signals")
    shown.add_argument("workflow_id")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "setup":
        print(json.dumps({"definition": DEFINITION, "version": asyncio.run(setup())}))
    elif args.command == "worker":
        run_worker()
    elif args.command == "pay":
        print(json.dumps(asyncio.run(pay(args.payment_id, args.amount_cents))))
    elif args.command == "confirm":
        print(json.dumps(asyncio.run(confirm(args.payment_id, args.status, args.version,
                                             args.wait))))
    else:
        print(json.dumps(asyncio.run(show(args.workflow_id))))


if __name__ == "__main__":
    main()

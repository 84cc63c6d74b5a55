"""Celery drains N no-op tasks from a durable RabbitMQ queue (runs in the peers' virtualenv).

``python -m bench.peers.celery_drain --tasks N --concurrency C --prefetch P`` (broker and queue
from the environment, below)
publishes N ``noop`` tasks to a durable queue as persistent messages with publisher confirms
(each publish returns once the broker has confirmed it), then starts one Celery worker (prefork
pool of C processes, late acknowledgement, ``worker_prefetch_multiplier`` P) and waits until
its children have run all N. The figure is N over the time from the worker's first
``task_received`` to its children's last ``task_postrun`` (the machine's clock, written to small
files in a temporary directory as they happen). Afterwards the worker is stopped warmly and the
queue must be empty (every message acknowledged). Prints one JSON line:
``{"celery_tasks_per_s": ...}``.

Module level is the Celery application (the worker imports it with ``-A``); its broker and
queue come from ``ORBIT_PEERS_AMQP`` and ``ORBIT_PEERS_QUEUE``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals
from kombu import Connection, Queue

MARK = struct.Struct("<qd")  # tasks finished so far, the time of the last finish

QUEUE = os.environ.get("ORBIT_PEERS_QUEUE", "bench")
app = Celery("orbit_peers", broker=os.environ.get("ORBIT_PEERS_AMQP", "amqp://"))
app.conf.update(
    task_queues=[Queue(QUEUE, durable=True)],
    task_default_queue=QUEUE,
    task_default_delivery_mode="persistent",
    broker_transport_options={"confirm_publish": True},
    task_acks_late=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get("ORBIT_PEERS_PREFETCH", "16")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="noop")
def noop() -> None:
    return None


_marks: dict[str, Any] = {"count": 0, "fd": None, "received": False}


def _marks_dir() -> Path:
    return Path(os.environ["ORBIT_PEERS_MARKS"])


@signals.worker_process_init.connect
def _open_marks(**_kwargs: Any) -> None:
    path = _marks_dir() / f"finished-{os.getpid()}"
    _marks["fd"] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


@signals.task_postrun.connect
def _mark_finished(**_kwargs: Any) -> None:
    _marks["count"] += 1
    os.pwrite(_marks["fd"], MARK.pack(_marks["count"], time.time()), 0)


@signals.task_received.connect
def _mark_received(**_kwargs: Any) -> None:
    if not _marks["received"]:
        _marks["received"] = True
        (_marks_dir() / f"received-{os.getpid()}").write_text(repr(time.time()))


def _finished(marks: Path) -> tuple[int, float]:
    count, last = 0, 0.0
    for path in marks.glob("finished-*"):
        data = path.read_bytes()
        if len(data) == MARK.size:
            done, at = MARK.unpack(data)
            count, last = count + done, max(last, at)
    return count, last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=16)
    args = parser.parse_args()
    app.conf.worker_prefetch_multiplier = args.prefetch
    with app.connection_for_write() as connection, connection.Producer() as producer:
        for _ in range(args.tasks):
            noop.apply_async(producer=producer)
        if not producer.channel._confirm_selected:  # py-amqp's flag: confirms were on
            raise RuntimeError("celery: the messages were published without confirms")
    with tempfile.TemporaryDirectory(prefix="orbit-bench-celery-") as marks_dir:
        marks = Path(marks_dir)
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.peers.celery_drain", "worker",
             "--pool", "prefork", "--concurrency", str(args.concurrency), "--queues", QUEUE,
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING", "--hostname", f"peers-{os.getpid()}@localhost"],
            stdout=subprocess.DEVNULL, env={**os.environ, "ORBIT_PEERS_MARKS": marks_dir,
                 "ORBIT_PEERS_PREFETCH": str(args.prefetch)})
        try:
            deadline = time.monotonic() + 900
            while (done := _finished(marks))[0] < args.tasks:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"celery: {done[0]} of {args.tasks} tasks finished")
                time.sleep(0.1)
            first = min(float(path.read_text()) for path in marks.glob("received-*"))
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=120)
    with Connection(app.conf.broker_url) as connection:
        channel = connection.default_channel
        _name, left, _consumers = channel.queue_declare(QUEUE, passive=True)
        channel.queue_delete(QUEUE)
    if left or done[0] != args.tasks:
        raise RuntimeError(f"celery: {done[0]} of {args.tasks} finished, {left} left queued")
    print(json.dumps({"celery_tasks_per_s": round(args.tasks / (done[1] - first), 1)}))


if __name__ == "__main__":
    main()

"""``orbit bench peers``: interleaved rounds of Orbit, PgQueuer and Celery (plan.py says how each
is timed); the JSON line holds the medians, every round's figures and the machine.

Set-up, once for all rounds: the peers' virtualenv, a MariaDB (``ORBIT_DATABASE_URL``'s server,
or a private instance as in ``orbit bench tasks``), a private PostgreSQL and a private RabbitMQ
node; all three servers stay up for the whole run (idle while another system is measured). Every
round gives each system a fresh store: a new Orbit database per phase, a new PostgreSQL database,
a new RabbitMQ queue. Orbit's phases begin once InnoDB has purged the previous phase's history.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import bench_server
from bench.peers import orbit_drain, plan, services
from bench.tasks import _wait_purged

ROOT = Path(__file__).resolve().parents[2]
PGQUEUER_WORKERS = 2  # processes, as Orbit's two SDK workers
PGQUEUER_BATCH = 32  # jobs per dequeue, as Orbit's claim batch
CELERY_CONCURRENCY = 2  # prefork pool processes
CELERY_PREFETCH = 16  # worker_prefetch_multiplier: 32 unacknowledged messages in flight


def _peer(python: str, logs: Path, module: str, args: list[str],
          env: dict[str, str] | None = None) -> dict[str, float]:
    """Run a peer script in the peers' interpreter; its last stdout line is the JSON figure."""
    log = logs / f"{module.rsplit('.', 1)[-1]}.log"
    with log.open("ab") as stderr:
        done = subprocess.run([python, "-m", module, *args], cwd=str(ROOT), stdout=subprocess.PIPE,
                              stderr=stderr, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                  **(env or {})}, check=False, timeout=1800)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{module} exited with {done.returncode}:\n{tail}")
    figure: dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return figure


def run(url_text: str | None, rounds: int, tasks: int = 20_000, workers: int = 2,
        concurrency: int = 64, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    steps = plan.schedule(rounds)
    say = progress or (lambda _line: None)
    python = services.peers_python()
    postgres: services.Postgres | None = None
    rabbit: services.RabbitMQ | None = None
    with contextlib.ExitStack() as stack:
        where = stack.enter_context(bench_server(url_text, "orbit-bench-peers-"))
        server, logs, db_pid = where.server, where.logs, where.db_pid
        stack.callback(lambda: rabbit.stop() if rabbit is not None else None)
        stack.callback(lambda: postgres.stop() if postgres is not None else None)
        postgres = services.Postgres()
        rabbit = services.RabbitMQ()
        figures: list[dict[str, float]] = [{} for _ in range(rounds)]
        for index, system in steps:
            say(f"round {index + 1} of {rounds}: {system}")
            if system == "orbit":
                _wait_purged(server)
                figures[index]["orbit"] = orbit_drain.drain(
                    server, logs, db_pid, tasks, workers, concurrency)
                _wait_purged(server)
                figures[index]["orbit_submit_while_draining"] = (
                    orbit_drain.submit_while_draining(
                        server, logs, db_pid, tasks, workers, concurrency))
            elif system == "pgqueuer":
                database = f"pgqueuer_round_{index}"  # a fixed pattern: no quoting needed
                postgres.sql(f"CREATE DATABASE {database}")
                figures[index]["pgqueuer"] = _peer(
                    python, logs, "bench.peers.pgqueuer_drain",
                    ["run", postgres.dsn(database), "--tasks", str(tasks), "--workers",
                     str(PGQUEUER_WORKERS), "--batch", str(PGQUEUER_BATCH)],
                )["pgqueuer_tasks_per_s"]
                postgres.sql(f"DROP DATABASE {database}")
            else:
                figures[index]["celery"] = _peer(
                    python, logs, "bench.peers.celery_drain",
                    ["--tasks", str(tasks), "--concurrency", str(CELERY_CONCURRENCY),
                     "--prefetch", str(CELERY_PREFETCH)],
                    {"ORBIT_PEERS_AMQP": rabbit.url, "ORBIT_PEERS_QUEUE": f"bench-{index}"},
                )["celery_tasks_per_s"]
            say(f"  {json.dumps(figures[index])}")
        return {
            **plan.summarise(figures),
            "tasks": tasks, "orbit_workers": workers, "orbit_worker_concurrency": concurrency,
            "pgqueuer_workers": PGQUEUER_WORKERS, "pgqueuer_batch": PGQUEUER_BATCH,
            "celery_concurrency": CELERY_CONCURRENCY, "celery_prefetch_multiplier":
            CELERY_PREFETCH,
            "peers": list(services.REQUIREMENTS),
            "postgresql": postgres.sql("SHOW server_version"), "rabbitmq": rabbit.version(),
            "cores": os.cpu_count(), "cpu_model": plan.cpu_model(_cpuinfo()),
        }


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""

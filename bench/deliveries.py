"""``orbit bench deliveries``: result deliveries end to end (issue 13).

Four phases, each on a fresh database with its own API, dispatcher and SDK workers
(bench/tasks.py's ``_Phase``):

1. **plain** -- N no-op tasks end to end, no subscription: the reference throughput.
2. **deliveries** -- the same with one WEBHOOK subscription on every result (a loopback
   receiver, bench/webhook_receiver.py, that acknowledges at once) and one PULL subscription
   consumed by the SDK's ``Subscriber`` over the API's WebSocket stream (bench/pull_consumer.py,
   32 deliveries held at once), one delivery pump (``orbit delivery``).
   ``delivery_per_s`` is N over the time from the first task's creation to the last
   acknowledgement of either subscription; ``delivery_ratio`` is that over phase 1's
   ``tasks_per_s``. The pump's CPU over the phase, per delivery (both subscriptions' rows are
   its fan-out; the webhook ones its sends), is ``pump_cpu_us_per_delivery``.
3. **lag and catch-up** -- N tasks at half of ``delivery_per_s``, submitted in batches at
   ``LAG_SUBMIT_HZ`` (10) requests a second (``lag_submits_per_request`` tasks each; phase 1
   submits 500 a request): ``ack_lag_p99_ms`` is the webhook deliveries' p99 of
   ``acknowledged_at - committed_at`` of their result (database time). Then the receiver
   stops for ``down_s`` seconds (60) while N more tasks run; from its return to the last
   acknowledgement, ``catch_up_deliveries_per_s`` is the webhook backlog over that time (it
   includes the wait for the endpoint circuit's probe, ``circuit_open_s`` = 2 s);
   ``catch_up_first_ack_s`` is that wait (return to the first acknowledgement) and
   ``catch_up_sending_per_s`` the backlog over the rest (first to last acknowledgement).
4. **lag, small batches** -- the lag of phase 3 again on a fresh database, at the same rate but
   ``SMALL_BATCH_HZ`` (50) requests a second, as ``orbit bench tasks --rate`` paces
   (``ack_lag_p50_ms_small_batches``, ``ack_lag_p99_ms_small_batches``,
   ``lag_submits_per_request_small_batches``; bench/RESULTS.md compares the two).

CPU per task by process role, without (``cpu_us_per_task_plain``) and with the deliveries
(``cpu_us_per_task_with_deliveries``, up to the last acknowledgement), the bench's own receiving
side (receiver and consumer) and ``ratio_if_receivers_elsewhere``: see :func:`cpu_split`.

``duplicates`` and ``missing`` (both must be 0) come from the database (delivery rows per
(subscription, event); result events without an acknowledged delivery of each subscription)
and from the receiver's log (an event acknowledged to the receiver twice; an acknowledged
webhook delivery the receiver never saw).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import (
    bench_server,
    cpu_seconds,
    free_port,
    paced_batch,
    percentile,
    poll_until,
    wait_ready,
)
from bench.tasks import (
    SUBMIT_BATCH,
    _end_to_end,
    _Phase,
    _submit_all,
    _wait_purged,
    wait_succeeded,
)
from orbit_common.db.pool import DatabaseUrl, connect_sync, open_database
from orbit_common.model.endpoints import EndpointPolicy
from orbit_common.model.sealing import Sealer, new_key_text
from orbit_common.platform import credentials
from orbit_common.relay import model, subscriptions
from orbit_common.relay.model import RelaySettings

ROOT = Path(__file__).resolve().parents[1]
CIRCUIT_OPEN_S = 2.0
LAG_SUBMIT_HZ = 10  # the lag phase's submit requests per second
SMALL_BATCH_HZ = 50  # the small-batch lag phase's (bench/tasks.py's pacing)


class _DeliveryPhase:
    """A ``_Phase`` with a webhook and a pull subscription, their receiver and consumer, and one
    delivery pump."""

    def __init__(self, server: DatabaseUrl, logs: Path, db_pid: int | None) -> None:
        self.phase = _Phase(server, 1, logs, db_pid)
        self.logs = logs
        key_text = new_key_text()
        self.port = free_port()
        self.receiver_log = logs / f"{self.phase.name}-received.txt"
        self.receiver: subprocess.Popen[Any] | None = None
        api_key, namespace = self.phase.tenants[0]
        asyncio.run(_subscribe(self.phase.url, api_key, namespace, key_text,
                               f"http://127.0.0.1:{self.port}/hook"))
        self.start_receiver()
        ops = free_port()
        self.phase._spawn("delivery", [sys.executable, "-m", "orbit_cli", "delivery"], {
            "ORBIT_DELIVERY_SECRET_KEY": key_text, "ORBIT_DELIVERY_ALLOW_HTTP": "true",
            "ORBIT_DELIVERY_ALLOW_LOOPBACK": "true",
            "ORBIT_DELIVERY_CIRCUIT_OPEN_S": str(CIRCUIT_OPEN_S),
            "ORBIT_SERVICE_METRICS_PORT": str(ops), "ORBIT_SERVICE_LOG_LEVEL": "WARNING"})
        self.pump = self.phase.procs[-1]
        self.phase._spawn("consumer", [sys.executable, "-m", "bench.pull_consumer"], {
            "ORBIT_API_URL": self.phase.api, "ORBIT_API_KEY": api_key,
            "ORBIT_NAMESPACE": namespace, "PULL_SUBSCRIPTION": "pull"})
        wait_ready(f"http://127.0.0.1:{ops}/readyz")

    def start_receiver(self) -> None:
        with (self.logs / f"{self.phase.name}-receiver.log").open("ab") as log:
            self.receiver = subprocess.Popen(
                [sys.executable, "-m", "bench.webhook_receiver"], cwd=str(ROOT),
                env={**self.phase.env, "RECEIVER_PORT": str(self.port),
                     "RECEIVER_LOG": str(self.receiver_log)},
                stdout=log, stderr=subprocess.STDOUT)
        self.phase.extra_cpu["receiver"] = self.receiver.pid
        wait_ready(f"http://127.0.0.1:{self.port}/healthz")

    def stop_receiver(self) -> None:
        if self.receiver is not None and self.receiver.poll() is None:
            self.receiver.terminate()
            self.receiver.wait(timeout=30)
        self.receiver = None

    def received(self) -> list[tuple[str, str]]:
        """``(webhook-id, event_id)`` of every request the receiver answered."""
        if not self.receiver_log.exists():
            return []
        found = []
        for line in self.receiver_log.read_text().splitlines():
            delivery_id, _, event_id = line.partition(" ")
            if delivery_id:
                found.append((delivery_id, event_id))
        return found

    def close(self) -> None:
        self.stop_receiver()
        self.phase.close()


async def _subscribe(url: DatabaseUrl, api_key: str, namespace: str, key_text: str,
                     endpoint: str) -> None:
    settings = RelaySettings(sealer=Sealer.from_config(key_text),
                             policy=EndpointPolicy(allow_http=True, allow_loopback=True))
    db = await open_database(url, minsize=1, maxsize=2)
    try:
        who = await db.read("bench.auth", lambda cur: credentials.authenticate(cur, api_key))
        for doc in ({"name": "hook", "kind": "WEBHOOK", "endpoint_url": endpoint,
                     "backoff_initial_ms": 100, "backoff_max_ms": 2000},
                    {"name": "pull", "kind": "PULL"}):
            spec = model.parse_create(doc, settings.policy)
            await subscriptions.create_subscription(db, who, settings, namespace=namespace,
                                                    spec=spec)
    finally:
        await db.close()


def _acknowledged(conn: Any) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute("SELECT s.name, COUNT(*) FROM orbit_deliveries d JOIN orbit_subscriptions s"
                    " ON s.namespace_id = d.namespace_id AND s.id = d.subscription_id"
                    " WHERE d.state = 'ACKNOWLEDGED' GROUP BY s.name")
        return {name: int(n) for name, n in cur.fetchall()}


def _wait_acknowledged(conn: Any, each: int, timeout: float = 900) -> None:
    """Until both subscriptions have ``each`` acknowledged deliveries (polled a few times a
    second: the count is a scan of the server being measured)."""
    poll_until(lambda: _acknowledged(conn),
               lambda done: done.get("hook", 0) >= each and done.get("pull", 0) >= each,
               f"{each} deliveries acknowledged on each subscription", timeout)


def _elapsed_by_subscription(conn: Any) -> dict[str, int]:
    """Microseconds from the first task's creation to each subscription's last acknowledgement
    (``webhook`` and ``pull``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT s.name, TIMESTAMPDIFF(MICROSECOND, (SELECT MIN(created_at)"
                    " FROM pulse_tasks), MAX(d.acknowledged_at)) FROM orbit_deliveries d"
                    " JOIN orbit_subscriptions s ON s.namespace_id = d.namespace_id"
                    " AND s.id = d.subscription_id GROUP BY s.name")
        names = {"hook": "webhook", "pull": "pull"}
        return {names[name]: int(us) for name, us in cur.fetchall()}


def _one(conn: Any, sql: str, *params: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def _audit(conn: Any, phase: _DeliveryPhase) -> tuple[int, int]:
    """(duplicates, missing) from the database and the receiver's log."""
    db_duplicates = int(_one(conn, "SELECT COUNT(*) - COUNT(DISTINCT subscription_id, event_id)"
                                   " FROM orbit_deliveries"))
    db_missing = int(_one(conn, "SELECT COUNT(*) FROM orbit_result_events r JOIN"
                                " orbit_subscriptions s ON s.namespace_id = r.namespace_id"
                                " WHERE NOT EXISTS (SELECT 1 FROM orbit_deliveries d"
                                " WHERE d.namespace_id = r.namespace_id AND d.subscription_id"
                                " = s.id AND d.event_id = r.id AND d.state = 'ACKNOWLEDGED')"))
    seen = Counter(event for _delivery, event in phase.received())
    with conn.cursor() as cur:
        cur.execute("SELECT LOWER(HEX(d.event_id)) FROM orbit_deliveries d JOIN"
                    " orbit_subscriptions s ON s.namespace_id = d.namespace_id"
                    " AND s.id = d.subscription_id WHERE s.name = 'hook'"
                    " AND d.state = 'ACKNOWLEDGED'")
        acknowledged = {row[0] for row in cur.fetchall()}
    receiver_duplicates = sum(n - 1 for n in seen.values() if n > 1)
    receiver_missing = len(acknowledged - set(seen))
    return db_duplicates + receiver_duplicates, db_missing + receiver_missing


def _deliveries_phase(server: DatabaseUrl, logs: Path, db_pid: int | None, tasks: int,
                      workers: int, concurrency: int) -> dict[str, Any]:
    phase = _DeliveryPhase(server, logs, db_pid)
    try:
        cpu_before = cpu_seconds(phase.pump.pid)
        # The CPU figures run until the last acknowledgement: they cover the deliveries.
        e2e = _end_to_end(phase.phase, tasks, workers, None, concurrency, 0,
                          settle=lambda conn: _wait_acknowledged(conn, tasks))
        conn = connect_sync(phase.phase.url, autocommit=True)
        try:
            pump_cpu = cpu_seconds(phase.pump.pid) - cpu_before
            elapsed_us = _one(conn, "SELECT TIMESTAMPDIFF(MICROSECOND, (SELECT MIN(created_at)"
                                    " FROM pulse_tasks), (SELECT MAX(acknowledged_at)"
                                    " FROM orbit_deliveries))")
            per_kind = _elapsed_by_subscription(conn)
            phase.stop_receiver()  # its log is complete once it has exited
            duplicates, missing = _audit(conn, phase)
        finally:
            conn.close()
    finally:
        phase.close()
    per_s = tasks / (int(elapsed_us) / 1e6)
    return {"tasks_per_s_with_pump": e2e["tasks_per_s"], "delivery_per_s": round(per_s, 1),
            **{f"{name}_per_s": round(tasks / (us / 1e6), 1) for name, us in per_kind.items()},
            "pump_cpu_us_per_delivery": round(pump_cpu * 1e6 / (2 * tasks)),
            **{key: value for key, value in e2e.items() if key.startswith("cpu_us_per_task_")},
            "duplicates": duplicates, "missing": missing}


def cpu_split(plain: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """CPU per task of every process, without and with the deliveries, and what the bench's
    own receiving side (the webhook receiver and the pull consumer, on the same cores) costs.

    On a machine whose cores are all busy, throughput goes as 1 / (CPU per task, all
    processes): ``ratio_if_receivers_elsewhere`` is the plain total over the total without the
    receiving side -- an estimate of ``delivery_ratio`` with the receivers on other machines,
    as a production receiver would be. An estimate, not a measurement."""
    def total(figures: dict[str, Any]) -> int:
        return sum(v for k, v in figures.items() if k.startswith("cpu_us_per_task_") and v)

    receiving = sum(full.get(f"cpu_us_per_task_{role}") or 0 for role in ("receiver", "consumer"))
    plain_total, full_total = total(plain), total(full)
    return {
        "cpu_us_per_task_plain": {k.removeprefix("cpu_us_per_task_"): v
                                  for k, v in plain.items() if k.startswith("cpu_us_per_task_")},
        "cpu_us_per_task_with_deliveries": {
            k.removeprefix("cpu_us_per_task_"): v for k, v in full.items()
            if k.startswith("cpu_us_per_task_")},
        "cpu_us_per_task_total_plain": plain_total,
        "cpu_us_per_task_total_with_deliveries": full_total,
        "receiving_cpu_us_per_task": receiving,
        "ratio_if_receivers_elsewhere": (round(plain_total / (full_total - receiving), 3)
                                         if full_total > receiving else None),
    }


def _lag_and_catch_up(server: DatabaseUrl, logs: Path, db_pid: int | None,
                      tasks: int, workers: int, concurrency: int, rate: float,
                      down_s: float | None, submit_hz: int = LAG_SUBMIT_HZ) -> dict[str, Any]:
    """The ack lag of N tasks submitted at ``rate`` (``submit_hz`` requests a second); then,
    unless ``down_s`` is None, the receiver's outage and catch-up."""
    phase = _DeliveryPhase(server, logs, db_pid)
    try:
        _end_to_end(phase.phase, tasks, workers, rate, concurrency, 0, submit_hz=submit_hz)
        conn = connect_sync(phase.phase.url, autocommit=True)
        try:
            _wait_acknowledged(conn, tasks)
            with conn.cursor() as cur:
                cur.execute("SELECT TIMESTAMPDIFF(MICROSECOND, r.committed_at, d.acknowledged_at)"
                            " FROM orbit_deliveries d JOIN orbit_subscriptions s"
                            " ON s.namespace_id = d.namespace_id AND s.id = d.subscription_id"
                            " JOIN orbit_result_events r ON r.namespace_id = d.namespace_id"
                            " AND r.id = d.event_id WHERE s.name = 'hook'")
                lags = [row[0] / 1000 for row in cur.fetchall()]
            lag = {"lag_rate": rate,
                   "lag_submits_per_request": paced_batch(rate, submit_hz, SUBMIT_BATCH),
                   "ack_lag_p50_ms": round(percentile(lags, 0.5), 1),
                   "ack_lag_p99_ms": round(percentile(lags, 0.99), 1)}
            if down_s is None:
                phase.stop_receiver()
                duplicates, missing = _audit(conn, phase)
                return {**lag, "duplicates": duplicates, "missing": missing}
            # The receiver goes away; N more tasks run; it comes back after down_s.
            phase.stop_receiver()
            stopped = time.monotonic()
            key, namespace = phase.phase.tenants[0]
            asyncio.run(_submit_all(phase.phase.api, key, namespace, tasks, None))
            wait_succeeded(conn, 2 * tasks)
            time.sleep(max(0.0, down_s - (time.monotonic() - stopped)))  # the outage itself
            backlog = 2 * tasks - _acknowledged(conn).get("hook", 0)
            back_at = _one(conn, "SELECT UTC_TIMESTAMP(6)")
            phase.start_receiver()
            _wait_acknowledged(conn, 2 * tasks)
            catch_up_us = _one(conn, "SELECT TIMESTAMPDIFF(MICROSECOND, %s,"
                                     " MAX(acknowledged_at)) FROM orbit_deliveries", back_at)
            # The circuit's probe: the first acknowledgement after the receiver came back.
            probe_us = _one(conn, "SELECT TIMESTAMPDIFF(MICROSECOND, %s, MIN(acknowledged_at))"
                                  " FROM orbit_deliveries WHERE acknowledged_at >= %s",
                            back_at, back_at)
            phase.stop_receiver()
            duplicates, missing = _audit(conn, phase)
        finally:
            conn.close()
    finally:
        phase.close()
    return {**lag, "catch_up_backlog": backlog, "down_s": down_s,
            "catch_up_deliveries_per_s": round(backlog / (int(catch_up_us) / 1e6), 1),
            "catch_up_first_ack_s": round(int(probe_us) / 1e6, 3),
            "catch_up_sending_per_s": round(
                backlog / max(1e-6, (int(catch_up_us) - int(probe_us)) / 1e6), 1),
            "duplicates": duplicates, "missing": missing}


def run(url_text: str | None, tasks: int, workers: int, concurrency: int,
        down_s: float = 60.0) -> dict[str, Any]:
    with bench_server(url_text, "orbit-bench-deliveries-") as where:
        server, logs, db_pid = where.server, where.logs, where.db_pid
        phase = _Phase(server, 1, logs, db_pid)
        try:
            plain = _end_to_end(phase, tasks, workers, None, concurrency, 0)
        finally:
            phase.close()
        _wait_purged(server.with_database(""))
        full = _deliveries_phase(server, logs, db_pid, tasks, workers, concurrency)
        _wait_purged(server.with_database(""))
        half = _lag_and_catch_up(server, logs, db_pid, tasks, workers, concurrency,
                                 round(full["delivery_per_s"] / 2, 1), down_s)
        _wait_purged(server.with_database(""))
        small = _lag_and_catch_up(server, logs, db_pid, tasks, workers, concurrency,
                                  round(full["delivery_per_s"] / 2, 1), None,
                                  submit_hz=SMALL_BATCH_HZ)
    return {
        "tasks": tasks, "workers": workers, "worker_concurrency": concurrency,
        "plain_tasks_per_s": plain["tasks_per_s"],
        "tasks_per_s_with_pump": full["tasks_per_s_with_pump"],
        "delivery_per_s": full["delivery_per_s"],
        "delivery_ratio": round(full["delivery_per_s"] / plain["tasks_per_s"], 3),
        "webhook_per_s": full.get("webhook_per_s"), "pull_per_s": full.get("pull_per_s"),
        "lag_rate": half["lag_rate"], "ack_lag_p50_ms": half["ack_lag_p50_ms"],
        "ack_lag_p99_ms": half["ack_lag_p99_ms"],
        "lag_submits_per_request": half["lag_submits_per_request"],
        "ack_lag_p50_ms_small_batches": small["ack_lag_p50_ms"],
        "ack_lag_p99_ms_small_batches": small["ack_lag_p99_ms"],
        "lag_submits_per_request_small_batches": small["lag_submits_per_request"],
        "down_s": down_s, "catch_up_backlog": half["catch_up_backlog"],
        "catch_up_deliveries_per_s": half["catch_up_deliveries_per_s"],
        "catch_up_first_ack_s": half["catch_up_first_ack_s"],
        "catch_up_sending_per_s": half["catch_up_sending_per_s"],
        "pump_cpu_us_per_delivery": full["pump_cpu_us_per_delivery"],
        **cpu_split(plain, full),
        "duplicates": full["duplicates"] + half["duplicates"] + small["duplicates"],
        "missing": full["missing"] + half["missing"] + small["missing"],
    }

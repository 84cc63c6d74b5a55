"""``orbit delivery``: the delivery pump. Any number of replicas; none is a leader.

Four loops share one database pool:

* **fan-out** -- :func:`orbit_common.relay.fanout.fan_out` passes (a bounded batch of result
  events per due subscription, one transaction each, ``SKIP LOCKED`` on the subscription row so
  replicas never fan out one subscription at once). A pass that found nothing to do backs off
  from ``poll_min_ms`` to ``poll_max_ms``; one that created deliveries wakes the webhook loop.
* **webhooks** -- :func:`orbit_common.relay.circuit.webhook_targets` (ACTIVE webhook
  subscriptions with a delivery due now whose circuit lets a pump send) → batch tasks, up to
  ``batches_per_subscription`` per subscription (so a batch's slow tail does not idle the
  endpoint) and ``subscriptions_in_flight`` subscriptions at once. A task leases up to
  ``lease_batch`` due deliveries (a circuit due for its probe: first claims the probe with
  :func:`~orbit_common.relay.circuit.begin_probe` -- one pump of many wins -- and leases one),
  signs each payload's exact bytes, sends them with the sender's bounds
  (``endpoint_concurrency`` at a time; every request is over before its lease ends, so no other
  pump can lease the delivery while it is on the wire), and records everything in one
  transaction: deliveries handed back unsent (:func:`~orbit_common.relay.deliveries.release`, no
  attempt spent), the attempts' outcomes (:func:`~orbit_common.relay.deliveries.settle`: a 2xx
  acknowledges, anything else backs off or exhausts), then the endpoint circuit
  (:func:`~orbit_common.relay.circuit.record`, the subscription row last). While a batch is out
  the circuit's next state is followed in memory with the same pure rule
  (:func:`~orbit_common.relay.circuit.after`): once the batch's failures open it, the batch's
  unsent deliveries are released instead of sent. A failing endpoint therefore holds one task
  slot for a few timeouts per batch (until the failures reach the threshold), and between its
  retries it is not a target at all (nothing due, or its circuit open).
* **lapse recovery** -- every ``recovery_interval_s``,
  :func:`~orbit_common.relay.deliveries.recover_lapsed` (a killed pump's leases come back with
  their attempt counted).
* **gauges** -- every ``gauge_interval_s``, backlogs and circuit states from the database.

Drain (SIGTERM): stop leasing and fanning out; sends already on the wire finish (each bounded by
``timeout_s``) and are recorded; leased deliveries not yet sent are released. A kill -9 loses
nothing: an uncommitted fan-out batch is redone from the committed scan position, and an
unsettled lease lapses and is recovered (the receiver may see that attempt again: delivery is
at least once, deduplicated by ``event_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import time
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import as_utc, db_now
from orbit_common.db.pool import Database
from orbit_common.model import endpoints
from orbit_common.relay import circuit, deliveries, fanout, gauges, model
from orbit_common.relay.circuit import Circuit, CircuitState
from orbit_common.relay.deliveries import Leased, Settled
from orbit_common.relay.model import DeliveryState
from orbit_common.service.config import DeliveryConfig, OrbitConfig
from orbit_common.service.health import ReadinessGate
from orbit_common.service.loops import Pacer
from orbit_delivery import signing
from orbit_delivery.metrics import PumpMetrics, default
from orbit_delivery.pushing import WebhookPusher
from orbit_delivery.sender import SenderLimits, SendOutcome, WebhookSender

log = logging.getLogger(__name__)

# A request ends at least this long (at most a quarter of the lease) before its lease does, so
# its outcome is recorded while the lease is still live.
LEASE_MARGIN_S = 2.0


def sender_limits(config: DeliveryConfig) -> SenderLimits:
    return SenderLimits(global_concurrency=config.send_concurrency,
                        per_endpoint=config.endpoint_concurrency,
                        connect_timeout_s=config.connect_timeout_s,
                        total_timeout_s=config.timeout_s,
                        max_response_bytes=config.max_response_bytes)


def attempt_error(outcome: SendOutcome) -> str | None:
    """The text stored for a failed attempt: the response body, or the transport error."""
    if outcome.delivered:
        return None
    if outcome.status is not None:
        return outcome.body
    return f"{outcome.kind}: {outcome.detail}" if outcome.detail else outcome.kind


@attrs.frozen(kw_only=True)
class BatchResult:
    """What one subscription batch did (for tests and the loop's pacing)."""

    leased: int
    sent: int
    released: int
    circuit: CircuitState | None = None


class DeliveryService:
    name = "delivery"

    def __init__(self, config: OrbitConfig, db: Database, gate: ReadinessGate, *,
                 metrics: PumpMetrics | None = None) -> None:
        self.config = config.delivery
        self.db = db
        self.gate = gate
        self.sealer = self.config.sealer()
        self.address_refused = functools.partial(endpoints.address_refused,
                                                 policy=self.config.policy())
        self.sender = WebhookSender(sender_limits(self.config),
                                    address_refused=self.address_refused)
        self.metrics = metrics or default(tenant_labels=self.config.metrics_tenant_labels)
        self.metrics.watch(self.sender)
        self.pusher = WebhookPusher(self.sender, metrics=self.metrics)
        self.threshold = self.config.circuit_failure_threshold
        self.open_for = dt.timedelta(seconds=self.config.circuit_open_s)
        self.probe_window = dt.timedelta(seconds=self.config.probe_window_s)
        self.stopping = asyncio.Event()
        self.pacer = Pacer(self.stopping, gate, log, "delivery")
        self.wake = asyncio.Event()  # deliveries became due: fan-out created, a batch was full
        self.loops: list[asyncio.Task[None]] = []
        # Batches in flight, per subscription.
        self.busy: dict[tuple[bytes, bytes], set[asyncio.Task[BatchResult]]] = {}
        self._warned_sealer = False

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loops = [
            asyncio.create_task(self._fan_out_loop(), name="delivery-fanout"),
            asyncio.create_task(self._webhook_loop(), name="delivery-webhooks"),
            asyncio.create_task(self.pacer.every(self.config.recovery_interval_s, self.recover,
                                            "lapse recovery"), name="delivery-recovery"),
            asyncio.create_task(self.pacer.every(self.config.gauge_interval_s, self.refresh_gauges,
                                            "gauges"), name="delivery-gauges"),
        ]

    async def drain(self) -> None:
        """Stop leasing and fanning out; finish (or release) the batches in flight."""
        self.stopping.set()
        self.wake.set()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.loops = []
        batches = self.batches()
        if batches:
            await asyncio.gather(*batches, return_exceptions=True)

    async def close(self) -> None:
        self.stopping.set()
        for task in [*self.loops, *self.batches()]:
            task.cancel()
        for task in [*self.loops, *self.batches()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.loops = []
        await self.sender.close()

    # --- loops ----------------------------------------------------------------------------------

    async def _fan_out_loop(self) -> None:
        poll_min, poll_max = self.config.poll_min_ms / 1000, self.config.poll_max_ms / 1000
        delay = poll_min
        after: tuple[bytes, bytes] | None = None
        while not self.stopping.is_set():
            try:
                await self.gate.wait()
                done = await fanout.fan_out(self.db, self.config.fanout_batch,
                                            self.config.fanout_subscriptions, after)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delivery fan-out failed")
                await self.pacer.pause(poll_max)
                continue
            after = done.next_after
            if done.created:
                self.metrics.created.inc(done.created)
                self.wake.set()
            if done.subscriptions and done.created:
                delay = poll_min
                continue
            # Nothing due, or every due subscription held by another pump: back off.
            await self.pacer.pause(delay)
            delay = poll_min if done.subscriptions else min(delay * 2, poll_max)

    async def _webhook_loop(self) -> None:
        poll_min, poll_max = self.config.poll_min_ms / 1000, self.config.poll_max_ms / 1000
        delay = poll_min
        while not self.stopping.is_set():
            try:
                await self.gate.wait()
                self.wake.clear()
                self.start_batches(await self.db.read(
                    "delivery.targets",
                    lambda cur: circuit.webhook_targets(cur, self.config.targets_limit)))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delivery target scan failed")
                await self.pacer.pause(poll_max)
                continue
            try:
                await asyncio.wait_for(self.wake.wait(), delay)
                delay = poll_min
            except TimeoutError:
                delay = min(delay * 2, poll_max)

    def batches(self) -> list[asyncio.Task[BatchResult]]:
        """The batch tasks in flight in this pump."""
        return [task for running in self.busy.values() for task in running]

    def start_batches(self, targets: list[dict[str, Any]]) -> int:
        """One more batch task per target subscription, up to ``batches_per_subscription`` in
        flight each (a circuit's probe: one) and ``subscriptions_in_flight`` subscriptions."""
        started = 0
        for row in targets:
            key = (row["namespace_id"], row["id"])
            if self.stopping.is_set():
                break
            running = self.busy.get(key)
            if running is None and len(self.busy) >= self.config.subscriptions_in_flight:
                continue
            probing = row["circuit_state"] != CircuitState.CLOSED
            limit = 1 if probing else self.config.batches_per_subscription
            if running is not None and len(running) >= limit:
                continue
            task = asyncio.create_task(self._batch_guarded(row), name="delivery-batch")
            self.busy.setdefault(key, set()).add(task)
            task.add_done_callback(functools.partial(self._done, key))
            started += 1
        return started

    def _done(self, key: tuple[bytes, bytes], task: asyncio.Task[BatchResult]) -> None:
        running = self.busy.get(key)
        if running is not None:
            running.discard(task)
            if not running:
                del self.busy[key]

    async def _batch_guarded(self, row: dict[str, Any]) -> BatchResult:
        try:
            result = await self.batch(row)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("delivery batch failed",
                          extra={"subscription_id": row["id"].hex()})
            return BatchResult(leased=0, sent=0, released=0)
        if result.leased:
            self.wake.set()  # more may be due: look again at once
        return result

    # --- one subscription's batch ---------------------------------------------------------------

    async def batch(self, row: dict[str, Any]) -> BatchResult:
        """Lease, sign, send and record one batch of a webhook subscription (``row``: one of
        :func:`~orbit_common.relay.circuit.webhook_targets`)."""
        namespace_id, subscription_id = row["namespace_id"], row["id"]
        if self.sealer is None:
            if not self._warned_sealer:
                log.error("webhook subscriptions exist but [delivery] secret_key is not set:"
                          " they cannot be signed, so they are not sent")
                self._warned_sealer = True
            return BatchResult(leased=0, sent=0, released=0)
        before = Circuit.from_row(row)
        probing = before.state is not CircuitState.CLOSED
        if probing:
            claimed = await self.db.transaction("delivery.probe", lambda cur: circuit.begin_probe(
                cur, namespace_id, subscription_id, self.probe_window))
            if not claimed:
                return BatchResult(leased=0, sent=0, released=0)
        limit = 1 if probing else self.config.lease_batch

        async def take(cur: Any) -> tuple[list[Leased], dt.datetime]:
            now = await db_now(cur)
            return await deliveries.lease(cur, namespace_id, subscription_id, limit), now

        try:
            leased, now = await self.db.transaction("delivery.lease", take)
            leased_at = time.monotonic()
        except (model.SubscriptionNotActive, model.SubscriptionNotFound):
            return BatchResult(leased=0, sent=0, released=0)
        if not leased:
            return BatchResult(leased=0, sent=0, released=0)
        if len(leased) == limit and not probing:
            self.wake.set()  # a full batch: more may be due, another batch can start meanwhile
        found = model.signing_secrets(self.sealer, row, now)
        if not found:
            log.error("webhook subscription without a signing secret",
                      extra={"subscription_id": subscription_id.hex()})
            await self._record(row, [], leased, "no_secret", [])
            return BatchResult(leased=len(leased), sent=0, released=len(leased))
        secrets = signing.SigningSecrets(current=found[0],
                                         previous=found[1] if len(found) > 1 else None)
        namespace = leased[0].payload["namespace"]
        state = {"circuit": before}
        sent: list[tuple[Leased, SendOutcome]] = []
        unsent: list[Leased] = []
        slots = asyncio.Semaphore(self.config.endpoint_concurrency)

        async def one(lease: Leased) -> None:
            # Every request is over before the lease ends (database time, measured from the
            # lease's own transaction), leaving a margin to record the outcome: no other pump
            # can lease the delivery while this one's request is out.
            held_s = (lease.lease_expires_at - now).total_seconds()
            deadline = leased_at + held_s - min(LEASE_MARGIN_S, held_s / 4)
            async with slots:
                if self.stopping.is_set() or (
                        not probing and state["circuit"].state is not CircuitState.CLOSED):
                    unsent.append(lease)
                    return
                outcome = await self.pusher.push(row["endpoint_url"], lease.payload, secrets,
                                                 namespace=namespace, deadline=deadline)
            sent.append((lease, outcome))
            # The same rule the database applies on record: a batch whose failures open the
            # circuit sends no more (now is approximate; only the state matters here).
            state["circuit"] = circuit.after(state["circuit"], outcome.delivered, now,
                                             threshold=self.threshold, open_for=self.open_for)

        # One chain per task: a task's results go out in sequence order, each attempt ending
        # before the next starts (a receiver that applies by task_revision then rarely sees an
        # older revision after a newer one; retries and other batches may still overtake).
        chains: dict[str, list[Leased]] = {}
        for lease in sorted(leased, key=lambda lease: lease.payload["sequence"]):
            chains.setdefault(lease.payload["task_id"], []).append(lease)

        async def chain(leases: list[Leased]) -> None:
            for lease in leases:
                await one(lease)

        await asyncio.gather(*(chain(leases) for leases in chains.values()))
        reason = "draining" if self.stopping.is_set() else "circuit_open"
        after = await self._record(row, sent, unsent, reason,
                                   [o.delivered for _, o in sent], probing=probing)
        return BatchResult(leased=len(leased), sent=len(sent), released=len(unsent),
                           circuit=after.state if after is not None else None)

    async def _record(self, row: dict[str, Any],
                      sent: list[tuple[Leased, SendOutcome]], unsent: list[Leased],
                      reason: str, outcomes: list[bool], *, probing: bool = False
                      ) -> Circuit | None:
        """One transaction: release the unsent, settle the sent, then the circuit."""
        namespace_id, subscription_id = row["namespace_id"], row["id"]
        before = Circuit.from_row(row)
        # A clean batch on a clean circuit changes nothing on the subscription row.
        touch_circuit = bool(outcomes) and (
            probing or before.state is not CircuitState.CLOSED or before.failures > 0
            or not all(outcomes))
        reports = [deliveries.webhook_report(lease.delivery_id, lease.token, outcome.status,
                                             attempt_error(outcome), outcome.duration_ms)
                   for lease, outcome in sent]
        delay_ms = self.config.release_delay_ms
        if reason == "circuit_open":
            delay_ms = max(delay_ms, int(self.open_for / dt.timedelta(milliseconds=1)))

        async def body(cur: Any) -> tuple[list[Settled | errors.OrbitError], dt.datetime,
                                          Circuit | None]:
            if unsent:
                await deliveries.release(cur, namespace_id, subscription_id,
                                         [(u.delivery_id, u.token) for u in unsent], delay_ms)
            answers = await deliveries.settle(cur, namespace_id, subscription_id, reports)
            after: Circuit | None = None
            if touch_circuit:
                for ok in outcomes:
                    after = await circuit.record(cur, namespace_id, subscription_id, ok=ok,
                                                 threshold=self.threshold,
                                                 open_for=self.open_for)
            return answers, await db_now(cur), after

        answers, now, after = await self.db.transaction("delivery.settle", body)
        if unsent:
            self.metrics.released.labels(reason).inc(len(unsent))
        leases = [lease for lease, _ in sent] + unsent
        namespace = leases[0].payload["namespace"] if leases else None
        by_id = {lease.delivery_id: lease for lease, _ in sent}
        for answer in answers:
            if not isinstance(answer, Settled) or answer.repeated:
                continue
            if answer.state is DeliveryState.ACKNOWLEDGED:
                committed = by_id[answer.delivery_id].payload["committed_at"]
                lag = now - as_utc(dt.datetime.fromisoformat(committed))
                self.metrics.acknowledged(lag.total_seconds(), namespace=namespace)
            elif answer.state is DeliveryState.EXHAUSTED:
                self.metrics.exhausted_delivery(namespace=namespace)
        return after

    # --- timers ---------------------------------------------------------------------------------

    async def recover(self) -> int:
        recovered = await self.db.transaction("delivery.recover", deliveries.recover_lapsed)
        if recovered:
            log.info("recovered lapsed delivery leases", extra={"count": recovered})
            self.wake.set()
        return recovered

    async def refresh_gauges(self) -> None:
        async def body(cur: Any) -> tuple[list[gauges.Backlog], dict[str, int]]:
            return await gauges.backlogs(cur), await gauges.circuits(cur)

        backlogs, circuits = await self.db.read("delivery.gauges", body)
        self.metrics.set_backlogs(backlogs)
        self.metrics.set_circuits(circuits)

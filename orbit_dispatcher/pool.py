"""The per-node claim pool: which session's demand the next claim transaction serves.

Identities
    *Demand* is one claimant on this dispatcher process: a WebSocket session with its credit
    (``ready`` slots) or one long-poll request (``max``, ``wait_ms``). A *lane* is one queue of
    one namespace; a demand sits in a lane for each queue its session works. An *application*
    owns its namespaces' lanes (``Session.application_id``, the authenticated application).
    A *probe key* is ``(namespace, queue, handler set, concurrency_keys)``: two sessions with the
    same key would run the same claim query.

Order (one claim *turn* = one ``leases.claim`` transaction)
    Round-robin on three levels, each kept in least-recently-served order: the next
    application with claimable demand → within it the next lane → within the lane the next
    demand that is not already claiming and wants slots. The turn asks for
    ``min(slots, claim_batch)`` tasks. An application with ten busy sessions and one with a
    single session therefore alternate turns (1/2 each, not 10/11 and 1/11) while both have work;
    an application without claimable demand is skipped, so the scheme is work-conserving. At
    most ``claim_concurrency`` turns run at once on a node, so the pool, not the number of
    sessions or of free database connections, decides the order.

Empty probes
    A turn that grants nothing marks its probe key empty for a TTL: ``empty_probe_ms`` (or
    ``idle_poll_min_ms``) at first, doubling per consecutive empty result up to
    ``idle_poll_max_ms``, with jitter (×0.5–1.0) so replicas do not probe in step. Every demand
    with that key passes the lane over until the TTL ends; a turn that grants anything resets the
    key. Idle cost is one transaction per probe key per TTL per node, whatever the number of
    sessions. The cache is a hint only: "empty" can be stale by up to one TTL (the added start
    latency after an idle period, as the per-session back-off was before).

Invariants
    * Nothing here is an authorization or lease fact. The pool is in-memory and rebuilt from the
      connections after a restart; ``leases.claim`` re-checks the session, its grants, the gate
      and every counter inside its transaction, in database time. The monotonic clock (injectable
      for tests) only ages the probe cache and long-poll deadlines.
    * A demand has at most one claim in flight; its slots shrink by what it was granted (a later
      ``ready`` replaces them, as before).
    * A long-poll demand gets at least one pass over its queues (each claimed, or known empty)
      before its deadline can answer it with nothing; a claim in flight at the deadline is
      awaited, never abandoned.

Failure handling
    A claim that fails with ``ServiceUnavailable`` (database down, retries exhausted, commit
    outcome unknown) pauses the whole pool for ``idle_poll_max_ms``: the database is shared, so
    every other turn would fail the same way. A long-poll demand gets the error (a problem
    document); a WebSocket demand keeps its place. Any other error (``session_lost``, a revoked
    grant, a bug) ends that demand: the long poll gets the error, the WebSocket an ``error`` frame
    and a close (the worker registers again). While the readiness gate is closed no turn runs;
    long polls still end at their deadline, with no grants. Draining stops new turns, answers
    waiting long polls with no grants and waits for the turns in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import prometheus_client

from orbit_common import errors
from orbit_common.pulse.leases import Grant
from orbit_common.pulse.workers import QueueRef, Session

log = logging.getLogger(__name__)

TURNS = prometheus_client.Counter(
    "orbit_dispatch_claim_turns_total",
    "Claim transactions run by the node's claim pool, by outcome (granted, empty, error).",
    ["outcome"])
PROBE_SKIPS = prometheus_client.Counter(
    "orbit_dispatch_empty_probe_skips_total",
    "Times the claim pool passed a queue over because a recent claim found it empty"
    " (once per probe key per scheduling pass).")
DEMAND = prometheus_client.Gauge("orbit_dispatch_claim_demand",
                                 "Sessions and long polls registered with the claim pool.")

ProbeKey = tuple[bytes, bytes, frozenset[str], bool]
ClaimFn = Callable[[Session, QueueRef, int], Awaitable[list[Grant]]]
Clock = Callable[[], float]
PRUNE_AFTER_S = 60.0  # forget a probe key this long after its TTL ended


def probe_key(session: Session, queue: QueueRef) -> ProbeKey:
    """Sessions with equal keys run the same claim query on this queue."""
    return (session.namespace_id, queue.id, frozenset(session.handlers),
            session.concurrency_keys)


def _jitter() -> float:
    return random.uniform(0.5, 1.0)  # noqa: S311 - spreading probes, not security


@attrs.define
class _Probe:
    until: float
    ttl_ms: float  # 0: the last claim with this key granted something


class ProbeCache:
    """Remembers "this claim found nothing" per probe key, for a TTL that doubles while empty."""

    def __init__(self, *, first_ms: float, max_ms: float, clock: Clock = time.monotonic,
                 jitter: Callable[[], float] = _jitter) -> None:
        self.first_ms = max(1.0, first_ms)  # 0 would claim an empty queue in a hot loop
        self.max_ms = max(self.first_ms, max_ms)
        self.clock = clock
        self.jitter = jitter
        self._entries: dict[ProbeKey, _Probe] = {}
        self._pruned_at = clock()

    def empty_until(self, key: ProbeKey) -> float | None:
        """The clock time until which ``key`` counts as empty, or None if it should be probed."""
        entry = self._entries.get(key)
        if entry is None or self.clock() >= entry.until:
            return None
        return entry.until

    def expires_at(self, key: ProbeKey) -> float | None:
        """When the key's current empty streak ends (possibly already past), or None if it
        has none (never probed, or its last claim granted something)."""
        entry = self._entries.get(key)
        return None if entry is None or entry.ttl_ms == 0 else entry.until

    def known_empty(self, key: ProbeKey) -> bool:
        return self.empty_until(key) is not None

    def ttl_ms(self, key: ProbeKey) -> float | None:
        """The TTL (before jitter) of the key's current empty streak, for tests and logs."""
        entry = self._entries.get(key)
        return None if entry is None or entry.ttl_ms == 0 else entry.ttl_ms

    def productive(self, key: ProbeKey) -> bool:
        """The last claim with this key granted something (so parallel claims are worth it)."""
        entry = self._entries.get(key)
        return entry is not None and entry.ttl_ms == 0

    def record(self, key: ProbeKey, *, found: bool) -> None:
        """A claim with this key granted something (reset) or nothing (start or extend)."""
        now = self.clock()
        previous = self._entries.get(key)
        if found:
            self._entries[key] = _Probe(until=now, ttl_ms=0.0)
        elif previous is not None and previous.ttl_ms > 0 and now < previous.until:
            pass  # a claim that raced the one that started this TTL: not a further probe
        else:
            ttl = (self.first_ms if previous is None or previous.ttl_ms == 0
                   else min(self.max_ms, previous.ttl_ms * 2))
            self._entries[key] = _Probe(until=now + ttl * self.jitter() / 1000, ttl_ms=ttl)
        if now - self._pruned_at > PRUNE_AFTER_S:
            self._pruned_at = now
            for stale in [k for k, e in self._entries.items() if now - e.until > PRUNE_AFTER_S]:
                del self._entries[stale]


@attrs.define(eq=False)
class Demand:
    """One claimant: a session that wants up to ``slots`` grants.

    ``deadline`` (pool clock) marks a long poll; ``untried`` holds the queue ids it has not yet
    tried (claimed, or found known-empty), so it gets one full pass before the deadline answers.
    The runtime fields say where grants go: ``deliver``/``fail`` for a WebSocket, ``result`` for
    a long poll.
    """

    session: Session
    slots: int
    deadline: float | None = None
    untried: set[bytes] = attrs.Factory(set)
    busy: bool = False
    deliver: Callable[[list[Grant]], Awaitable[None]] | None = None
    fail: Callable[[BaseException], Awaitable[None]] | None = None
    result: asyncio.Future[list[Grant]] | None = None

    @property
    def application_id(self) -> bytes:
        return self.session.application_id


@attrs.frozen(eq=False)
class Turn:
    demand: Demand
    queue: QueueRef
    limit: int


@attrs.define
class _Lane:
    queue: QueueRef
    demands: dict[Demand, None] = attrs.Factory(dict)  # least recently served first


def _to_end(mapping: dict[Any, Any], key: Any) -> None:
    mapping[key] = mapping.pop(key)


class FairOrder:
    """The pure scheduling state: round-robin over applications, lanes and demands.

    No I/O and no asyncio: the caller asks for the next turn, runs it, and records the result.
    Time comes from the probe cache's clock.
    """

    def __init__(self, probes: ProbeCache, *, batch: int) -> None:
        self.probes = probes
        self.batch = max(1, batch)
        self.skipped = 0  # probe-cache skips so far (PROBE_SKIPS follows it)
        self._probing: dict[ProbeKey, int] = {}  # claims in flight per probe key
        # application → (namespace, queue) → lane; each level in least-recently-served order
        self._apps: dict[bytes, dict[tuple[bytes, bytes], _Lane]] = {}
        self._demands: dict[Demand, None] = {}

    def __len__(self) -> int:
        return len(self._demands)

    def __contains__(self, demand: object) -> bool:
        return demand in self._demands

    def demands(self) -> list[Demand]:
        return list(self._demands)

    def add(self, demand: Demand) -> None:
        if demand in self._demands:
            return
        self._demands[demand] = None
        lanes = self._apps.setdefault(demand.application_id, {})
        for queue in demand.session.queues:
            lane = lanes.setdefault((demand.session.namespace_id, queue.id), _Lane(queue))
            lane.demands[demand] = None

    def remove(self, demand: Demand) -> None:
        if demand not in self._demands:
            return
        del self._demands[demand]
        lanes = self._apps.get(demand.application_id, {})
        for queue in demand.session.queues:
            lane_key = (demand.session.namespace_id, queue.id)
            lane = lanes.get(lane_key)
            if lane is not None:
                lane.demands.pop(demand, None)
                if not lane.demands:
                    del lanes[lane_key]
        if not lanes:
            self._apps.pop(demand.application_id, None)

    def _wants(self, demand: Demand, queue: QueueRef, now: float) -> bool:
        if demand.busy or demand.slots <= 0:
            return False
        # A long poll past its deadline only finishes its one pass.
        return demand.deadline is None or now < demand.deadline or queue.id in demand.untried

    def next_turn(self) -> Turn | None:
        """The next claim to run, or None when no demand can claim now; marks it served."""
        now = self.probes.clock()
        passed_over: set[ProbeKey] = set()
        for app_id, lanes in self._apps.items():
            for lane_key, lane in lanes.items():
                for demand in lane.demands:
                    if not self._wants(demand, lane.queue, now):
                        continue
                    key = probe_key(demand.session, lane.queue)
                    if self.probes.known_empty(key):
                        demand.untried.discard(lane.queue.id)
                        if key not in passed_over:
                            passed_over.add(key)
                            self.skipped += 1
                        continue
                    if self._probing.get(key) and not self.probes.productive(key):
                        continue  # one probe at a time until the key is known to have work
                    _to_end(self._apps, app_id)
                    _to_end(lanes, lane_key)
                    _to_end(lane.demands, demand)
                    self._probing[key] = self._probing.get(key, 0) + 1
                    return Turn(demand=demand, queue=lane.queue,
                                limit=min(demand.slots, self.batch))
        return None

    def record(self, turn: Turn, granted: int | None) -> None:
        """A turn's claim returned ``granted`` tasks (None: it failed); once per turn."""
        key = probe_key(turn.demand.session, turn.queue)
        left = self._probing.get(key, 0) - 1
        if left > 0:
            self._probing[key] = left
        else:
            self._probing.pop(key, None)
        if granted is not None:
            self.probes.record(key, found=granted > 0)
            turn.demand.untried.discard(turn.queue.id)

    def due_polls(self) -> list[Demand]:
        """Long polls past their deadline that are done with their pass and not claiming."""
        now = self.probes.clock()
        due = []
        for demand in self._demands:
            if demand.deadline is None or demand.busy or now < demand.deadline:
                continue
            demand.untried = {q for q in demand.untried if not self.probes.known_empty(
                probe_key(demand.session, _queue(demand.session, q)))}
            if not demand.untried:
                due.append(demand)
        return due

    def next_change(self) -> float | None:
        """The earliest clock time at which a turn may become possible without a new event
        (a probe TTL ends or a long poll's deadline passes; *now* if a demand could claim at
        once), or None when every possible turn waits for an event that wakes the pool (a
        claim in flight ending, new slots, a new demand).

        A probe TTL that ended between :meth:`next_turn` and this call (the clock moves on)
        counts as *now*, not as nothing to wait for: the pool would otherwise sleep with
        demand and work left until some unrelated event woke it.
        """
        now = self.probes.clock()
        soonest: float | None = None
        for demand in self._demands:
            if demand.busy:
                continue  # its claim ending wakes the pool
            if demand.deadline is not None and demand.deadline > now:
                soonest = demand.deadline if soonest is None else min(soonest, demand.deadline)
            if demand.slots <= 0:
                continue  # new slots wake the pool
            for queue in demand.session.queues:
                if not self._wants(demand, queue, now):
                    continue
                key = probe_key(demand.session, queue)
                if self._probing.get(key) and not self.probes.productive(key):
                    continue  # the probe in flight wakes the pool when it ends
                until = self.probes.expires_at(key)
                at = now if until is None or until < now else until
                soonest = at if soonest is None else min(soonest, at)
        return soonest


def _queue(session: Session, queue_id: bytes) -> QueueRef:
    return next(q for q in session.queues if q.id == queue_id)


class ClaimPool:
    """The node's claim loop: runs the turns ``FairOrder`` picks, at most ``concurrency`` at once.

    ``claim(session, queue, limit)`` runs one claim transaction (the service wraps
    ``leases.claim``); ``ready()`` says whether the readiness gate is open (no turns while it
    is closed; long polls still end at their deadline).
    """

    def __init__(self, claim: ClaimFn, *, batch: int, concurrency: int, probes: ProbeCache,
                 ready: Callable[[], bool] | None = None,
                 error_pause_ms: float = 500) -> None:
        self.order = FairOrder(probes, batch=batch)
        self.probes = probes
        self.clock = probes.clock
        self.concurrency = max(1, concurrency)
        self.error_pause_s = error_pause_ms / 1000
        self._claim = claim
        self._ready = ready
        self._wakeup = asyncio.Event()
        self._claims: set[Turn] = set()  # claim transactions in flight
        self._turns: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._stopped = False
        self._paused_until = 0.0
        self._settled: list[asyncio.Future[None]] = []
        self._skipped = 0

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is None:
            self._stopped = False
            self._loop = asyncio.create_task(self._run(), name="claim-pool")

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop_claiming(self) -> None:
        """Drain, step 1: no new turns; long polls not claiming are answered with nothing."""
        self._stopped = True
        for demand in self.order.demands():
            if demand.result is not None and not demand.busy:
                self._answer(demand, [])
        self.wake()

    async def close(self) -> None:
        """Drain, step 2: stop the loop and wait for the turns in flight (they are short)."""
        self.stop_claiming()
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        if self._turns:
            await asyncio.gather(*self._turns, return_exceptions=True)
        for future in self._settled:
            if not future.done():
                future.set_result(None)
        self._settled.clear()

    def wake(self) -> None:
        self._wakeup.set()

    async def settled(self) -> None:
        """Test signal: resolves after a fresh scheduling pass finds no turn to run and no turn
        is in flight (every demand is satisfied, busy elsewhere, or passed over as empty)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settled.append(future)
        self.wake()
        await future

    # --- demand -------------------------------------------------------------------------------

    def open_stream(self, session: Session, *,
                    deliver: Callable[[list[Grant]], Awaitable[None]],
                    fail: Callable[[BaseException], Awaitable[None]]) -> Demand:
        """A WebSocket session's demand; it claims while its slots (``ready``) are positive."""
        demand = Demand(session=session, slots=0, deliver=deliver, fail=fail)
        self.order.add(demand)
        DEMAND.inc()
        return demand

    def set_slots(self, demand: Demand, slots: int) -> None:
        demand.slots = slots
        if slots > 0:
            self.wake()

    def discard(self, demand: Demand) -> None:
        if demand in self.order:
            self.order.remove(demand)
            DEMAND.dec()

    async def poll(self, session: Session, limit: int, wait_s: float) -> list[Grant]:
        """A long poll: grants from one claim turn, or none once ``wait_s`` has passed (after
        at least one pass over the session's queues)."""
        if self._stopped:
            return []
        result: asyncio.Future[list[Grant]] = asyncio.get_running_loop().create_future()
        demand = Demand(session=session, slots=limit, deadline=self.clock() + wait_s,
                        untried={q.id for q in session.queues}, result=result)
        self.order.add(demand)
        DEMAND.inc()
        self.wake()
        try:
            return await result
        finally:
            self.discard(demand)

    def _answer(self, demand: Demand, grants: list[Grant],
                error: BaseException | None = None) -> None:
        self.discard(demand)
        if demand.result is not None and not demand.result.done():
            if error is not None:
                demand.result.set_exception(error)
            else:
                demand.result.set_result(grants)

    # --- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopped:
            try:
                await self._pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claim pool pass failed")
                await asyncio.sleep(self.error_pause_s)

    async def _pass(self) -> None:
        self._wakeup.clear()
        if self._ready is not None and not self._ready():
            await self._not_ready()
            return
        for demand in self.order.due_polls():
            self._answer(demand, [])
        now = self.clock()
        turn = None
        if len(self._claims) < self.concurrency and now >= self._paused_until:
            turn = self.order.next_turn()
        if self.order.skipped != self._skipped:
            PROBE_SKIPS.inc(self.order.skipped - self._skipped)
            self._skipped = self.order.skipped
        if turn is not None:
            self._begin(turn)
            return
        if not self._turns:
            for future in self._settled:
                if not future.done():
                    future.set_result(None)
            self._settled.clear()
        timeout = None
        if len(self._claims) < self.concurrency:
            soonest = self.order.next_change()
            if now < self._paused_until:
                soonest = self._paused_until
            if soonest is not None:
                timeout = max(0.0, soonest - now) + 0.0005  # past the boundary, not just before
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def _not_ready(self) -> None:
        """The gate is closed: no turns; long polls past their deadline get nothing."""
        now = self.clock()
        deadlines = []
        for demand in self.order.demands():
            if demand.deadline is None or demand.busy:
                continue
            if now >= demand.deadline:
                self._answer(demand, [])
            else:
                deadlines.append(demand.deadline - now)
        timeout = min([self.error_pause_s, *deadlines]) + 0.0005
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _begin(self, turn: Turn) -> None:
        turn.demand.busy = True
        self._claims.add(turn)
        task = asyncio.create_task(self._turn(turn), name="claim-turn")
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)

    async def _turn(self, turn: Turn) -> None:
        demand = turn.demand
        grants: list[Grant] | None = None
        try:
            try:
                grants = await self._claim(demand.session, turn.queue, turn.limit)
            except Exception as exc:  # noqa: BLE001 - every failure is handed to the demand
                TURNS.labels("error").inc()
                self._end_claim(turn, None)
                await self._failed(demand, exc)
                return
            TURNS.labels("granted" if grants else "empty").inc()
            self._end_claim(turn, len(grants))
            if demand.result is not None:
                if grants or self._stopped:
                    self._answer(demand, grants)
                return
            demand.slots = max(0, demand.slots - len(grants))
            if grants and demand.deliver is not None:
                await demand.deliver(grants)
        finally:
            if turn in self._claims:  # cancelled mid-claim
                self._end_claim(turn, None)
            demand.busy = False
            # Out of the in-flight set before the wake-up, so the next pass can see "settled".
            current = asyncio.current_task()
            if current is not None:
                self._turns.discard(current)
            self.wake()

    def _end_claim(self, turn: Turn, granted: int | None) -> None:
        """The claim transaction is over (``granted`` None: it failed); frees a pool slot."""
        self._claims.discard(turn)
        self.order.record(turn, granted)
        self.wake()

    async def _failed(self, demand: Demand, exc: Exception) -> None:
        transient = isinstance(exc, errors.ServiceUnavailable)
        if transient:
            self._paused_until = self.clock() + self.error_pause_s
            log.warning("claim failed; pausing the claim pool: %s", exc,
                        extra={"code": getattr(exc, "code", None)})
        elif not isinstance(exc, errors.OrbitError):
            log.error("claim failed unexpectedly", exc_info=exc)
        if demand.result is not None:
            self._answer(demand, [], exc)
            return
        if transient:
            return
        self.discard(demand)
        if demand.fail is not None:
            await demand.fail(exc)

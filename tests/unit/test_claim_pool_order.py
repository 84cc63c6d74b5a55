"""orbit_dispatcher.pool without a database: the fair order of claim turns and the probe cache.

``FairOrder`` is driven by hand here: ask for the next turn, pretend the claim granted something
(or nothing), record it. Time is a fake clock the tests move.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from orbit_common.pulse.workers import QueueRef, Session
from orbit_dispatcher.pool import Demand, FairOrder, ProbeCache, Turn, probe_key

_ids = itertools.count(1)


def _id() -> bytes:
    return next(_ids).to_bytes(16, "big")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


def queue(name: str = "q") -> QueueRef:
    return QueueRef(id=_id(), name=name, gate_id=_id())


def session(app: bytes, queues: list[QueueRef], *, namespace: bytes | None = None,
            handlers: tuple[str, ...] = ("noop",)) -> Session:
    return Session(namespace_id=namespace or app, namespace="ns", id=_id(), instance_id=_id(),
                   generation=1, credential_id=_id(), queues=tuple(queues), handlers=handlers,
                   max_in_flight=64, expires_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
                   application_id=app)


def stream(app: bytes, queues: list[QueueRef], slots: int = 1_000_000, **kw: object) -> Demand:
    return Demand(session=session(app, queues, **kw), slots=slots)  # type: ignore[arg-type]


def make_order(clock: FakeClock | None = None, *, batch: int = 32, first_ms: float = 20,
               max_ms: float = 500) -> FairOrder:
    probes = ProbeCache(first_ms=first_ms, max_ms=max_ms, clock=clock or FakeClock(),
                        jitter=lambda: 1.0)
    return FairOrder(probes, batch=batch)


def run(order: FairOrder, turns: int, granted: int = 1) -> list[Turn]:
    """``turns`` turns, each claim granting ``granted`` (sequential: claim_concurrency=1)."""
    out = []
    for _ in range(turns):
        turn = order.next_turn()
        assert turn is not None
        order.record(turn, granted)
        out.append(turn)
    return out


# --- fair order --------------------------------------------------------------------------------


def test_a_small_application_gets_every_other_turn_against_a_busy_one() -> None:
    order = make_order()
    a, b = _id(), _id()
    qa, qb = queue("a"), queue("b")
    for _ in range(10):
        order.add(stream(a, [qa]))
    order.add(stream(b, [qb]))
    apps = [t.demand.application_id for t in run(order, 100)]
    assert Counter(apps) == {a: 50, b: 50}
    assert all(x != y for x, y in itertools.pairwise(apps))  # strict alternation


def test_within_an_application_queues_rotate_then_sessions() -> None:
    order = make_order()
    app = _id()
    q1, q2 = queue("q1"), queue("q2")
    on_q1 = [stream(app, [q1]) for _ in range(3)]
    on_q2 = stream(app, [q2])
    for d in [*on_q1, on_q2]:
        order.add(d)
    turns = run(order, 12)
    assert [t.queue.name for t in turns] == ["q1", "q2"] * 6
    q1_turns = [t.demand for t in turns if t.queue is q1]
    assert q1_turns == on_q1 * 2  # every session of the lane before any repeats


def test_a_session_on_two_queues_takes_turns_on_both() -> None:
    order = make_order()
    app = _id()
    q1, q2 = queue("q1"), queue("q2")
    order.add(stream(app, [q1, q2]))
    assert [t.queue.name for t in run(order, 4)] == ["q1", "q2", "q1", "q2"]


def test_the_order_is_work_conserving() -> None:
    """A demand that is claiming already or wants no slots is skipped, not waited for."""
    order = make_order()
    a, b = _id(), _id()
    busy_b = stream(b, [queue()])
    order.add(stream(a, [queue()]))
    order.add(busy_b)
    busy_b.busy = True
    assert {t.demand.application_id for t in run(order, 3)} == {a}
    busy_b.busy = False
    busy_b.slots = 0
    assert {t.demand.application_id for t in run(order, 3)} == {a}
    busy_b.slots = 1
    assert run(order, 1)[0].demand is busy_b


def test_a_turn_asks_for_the_slots_up_to_the_batch() -> None:
    order = make_order(batch=32)
    d = stream(_id(), [queue()], slots=5)
    order.add(d)
    turn = order.next_turn()
    assert turn is not None
    assert turn.limit == 5
    order.record(turn, 5)
    d.slots = 500
    turn = order.next_turn()
    assert turn is not None
    assert turn.limit == 32


def test_removed_demand_is_never_served_and_empty_levels_go() -> None:
    order = make_order()
    a, b = _id(), _id()
    da, db = stream(a, [queue()]), stream(b, [queue()])
    order.add(da)
    order.add(db)
    order.remove(db)
    order.remove(db)  # idempotent
    assert {t.demand.application_id for t in run(order, 4)} == {a}
    order.remove(da)
    assert order.next_turn() is None
    assert len(order) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=12), min_size=2, max_size=6),
       st.integers(min_value=1, max_value=5))
def test_round_robin_share_is_per_application_not_per_session(
    sessions_per_app: list[int], rounds: int
) -> None:
    """While every application has hungry demand, over any window of k·N turns each of the N
    applications gets exactly k turns, whatever its number of sessions."""
    order = make_order()
    apps = [_id() for _ in sessions_per_app]
    for app, count in zip(apps, sessions_per_app, strict=True):
        lane = queue()
        for _ in range(count):
            order.add(stream(app, [lane]))
    turns = run(order, rounds * len(apps))
    assert Counter(t.demand.application_id for t in turns) == dict.fromkeys(apps, rounds)


# --- probe cache ---------------------------------------------------------------------------------


def test_probe_cache_expires_doubles_caps_and_resets() -> None:
    clock = FakeClock()
    cache = ProbeCache(first_ms=20, max_ms=100, clock=clock, jitter=lambda: 1.0)
    key = (b"n", b"q", frozenset({"h"}), True)
    assert not cache.known_empty(key)
    ttls = []
    for _ in range(5):
        cache.record(key, found=False)
        ttls.append(cache.ttl_ms(key))
        assert cache.known_empty(key)
        clock.advance_ms(cache.ttl_ms(key) - 1)  # type: ignore[operator]
        assert cache.known_empty(key)
        clock.advance_ms(2)
        assert not cache.known_empty(key)
    assert ttls == [20, 40, 80, 100, 100]
    cache.record(key, found=True)
    assert cache.ttl_ms(key) is None
    cache.record(key, found=False)
    assert cache.ttl_ms(key) == 20  # a non-empty result started the streak over


def test_an_empty_result_that_raced_the_probe_does_not_double_the_ttl() -> None:
    clock = FakeClock()
    cache = ProbeCache(first_ms=20, max_ms=500, clock=clock, jitter=lambda: 1.0)
    key = (b"n", b"q", frozenset({"h"}), True)
    cache.record(key, found=True)
    assert cache.productive(key)
    cache.record(key, found=False)  # two claims in flight on a productive key, both empty
    cache.record(key, found=False)
    assert cache.ttl_ms(key) == 20
    assert not cache.productive(key)


def test_probe_cache_jitter_shortens_never_lengthens() -> None:
    clock = FakeClock()
    cache = ProbeCache(first_ms=40, max_ms=40, clock=clock, jitter=lambda: 0.5)
    key = (b"n", b"q", frozenset({"h"}), True)
    cache.record(key, found=False)
    assert cache.empty_until(key) == clock.now + 0.020


def test_probe_keys_separate_handler_sets_and_concurrency_key_flag() -> None:
    app, q = _id(), queue()
    s1 = session(app, [q], handlers=("a", "b"))
    s2 = session(app, [q], handlers=("b", "a"))
    s3 = session(app, [q], handlers=("a",))
    assert probe_key(s1, q) == probe_key(s2, q)
    assert probe_key(s1, q) != probe_key(s3, q)


def test_many_sessions_on_an_empty_queue_share_one_probe_per_ttl() -> None:
    clock = FakeClock()
    order = make_order(clock, first_ms=20, max_ms=80)
    app, q = _id(), queue()
    for _ in range(50):
        order.add(stream(app, [q]))
    probed_at = []
    for step in range(28):  # a scheduling pass every 7 ms for 189 ms
        while (turn := order.next_turn()) is not None:
            probed_at.append(step * 7)
            order.record(turn, 0)
        clock.advance_ms(7)
    # Empty TTLs 20, 40, 80, 80 ms: one claim per expiry, not one per session per pass.
    assert probed_at == [0, 21, 63, 147]
    assert order.skipped == 28  # each pass ends passing the known-empty key over, once


def test_an_empty_queue_does_not_hide_another_handler_set_or_queue() -> None:
    clock = FakeClock()
    order = make_order(clock)
    app, q_empty, q_busy = _id(), queue(), queue()
    order.add(stream(app, [q_empty]))
    other_handlers = stream(app, [q_empty], handlers=("other",))
    order.add(other_handlers)
    order.add(stream(app, [q_busy]))
    first = order.next_turn()
    assert first is not None
    assert first.queue is q_empty
    order.record(first, 0)
    rest = run(order, 4)
    assert other_handlers in {t.demand for t in rest}
    assert {t.queue.id for t in rest if t.demand is not other_handlers} == {q_busy.id}


def test_one_probe_at_a_time_until_a_key_is_known_to_have_work() -> None:
    """claim_concurrency > 1 must not send several sessions to probe the same queue at once;
    once a claim with the key granted something, parallel claims on it are fine."""
    order = make_order()
    app, q = _id(), queue()
    demands = [stream(app, [q]) for _ in range(3)]
    for d in demands:
        order.add(d)
    first = order.next_turn()
    assert first is not None
    first.demand.busy = True
    assert order.next_turn() is None  # same key, nothing known yet: wait for the first probe
    order.record(first, 5)
    first.demand.busy = False
    second, third = order.next_turn(), order.next_turn()
    assert second is not None
    assert third is not None
    assert second.demand is not third.demand  # two claims in flight on a productive key
    order.record(second, 0)
    order.record(third, 0)
    assert order.next_turn() is None  # now known empty


def test_next_change_is_the_earliest_probe_expiry_or_poll_deadline() -> None:
    clock = FakeClock()
    order = make_order(clock, first_ms=20)
    app, q = _id(), queue()
    order.add(stream(app, [q]))
    assert order.next_change() == clock.now  # claimable now
    turn = order.next_turn()
    assert turn is not None
    order.record(turn, 0)
    assert order.next_turn() is None
    assert order.next_change() == clock.now + 0.020
    waiter = Demand(session=session(app, [q]), slots=1, deadline=clock.now + 0.005,
                    untried={q.id})
    order.add(waiter)
    assert order.next_change() == clock.now + 0.005


def test_a_probe_expiring_between_the_turn_and_the_wait_is_not_a_reason_to_sleep() -> None:
    """The stall seen in the tasks benchmark: next_turn saw the queue known-empty, the TTL ended
    before next_change looked, and next_change answered "nothing to wait for" -- the pool slept
    with free slots and 7,640 waiting tasks until an unrelated event. It must answer "now"."""
    clock = FakeClock()
    order = make_order(clock, first_ms=20)
    app, q = _id(), queue()
    order.add(stream(app, [q]))
    turn = order.next_turn()
    assert turn is not None
    order.record(turn, 0)  # empty until now + 20 ms
    clock.advance_ms(19.999)
    assert order.next_turn() is None  # still known empty
    clock.advance_ms(0.002)  # the TTL ends here, before the pool computes its wait
    soonest = order.next_change()
    assert soonest is not None
    assert soonest <= clock.now


def test_next_change_waits_for_events_only_when_no_turn_could_start_without_one() -> None:
    clock = FakeClock()
    order = make_order(clock, first_ms=20)
    app, q = _id(), queue()
    busy, dry = stream(app, [q]), stream(app, [q], slots=0)
    order.add(busy)
    order.add(dry)
    turn = order.next_turn()
    assert turn is not None
    assert turn.demand is busy
    busy.busy = True  # as the pool marks a demand whose claim is in flight
    # The other demand has no slots, and the only key has a probe in flight: wait for events.
    assert order.next_change() is None
    dry.slots = 5  # (the pool is woken by set_slots) -- the key is still being probed
    assert order.next_turn() is None
    assert order.next_change() is None  # the probe in flight wakes the pool when it ends
    order.record(turn, 0)
    busy.busy = False
    assert order.next_change() == clock.now + 0.020


# --- long polls ----------------------------------------------------------------------------------


def test_a_long_poll_gets_one_full_pass_before_its_deadline_answers() -> None:
    clock = FakeClock()
    order = make_order(clock)
    app, q1, q2 = _id(), queue("q1"), queue("q2")
    waiter = Demand(session=session(app, [q1, q2]), slots=4, deadline=clock.now,
                    untried={q1.id, q2.id})  # wait_ms = 0
    order.add(waiter)
    assert order.due_polls() == []  # deadline passed, but no queue tried yet
    turn = order.next_turn()
    assert turn is not None
    order.record(turn, 0)
    assert order.due_polls() == []
    turn = order.next_turn()
    assert turn is not None
    assert turn.queue is not None
    order.record(turn, 0)
    assert order.due_polls() == [waiter]
    assert order.next_turn() is None  # past its deadline it does not go round again


def test_a_known_empty_queue_counts_as_tried_for_a_long_poll() -> None:
    clock = FakeClock()
    order = make_order(clock)
    app, q = _id(), queue()
    prober = stream(app, [q])
    order.add(prober)
    turn = order.next_turn()
    assert turn is not None
    order.record(turn, 0)
    waiter = Demand(session=prober.session, slots=1, deadline=clock.now, untried={q.id})
    order.remove(prober)
    order.add(waiter)
    assert order.due_polls() == [waiter]


def test_a_long_poll_before_its_deadline_retries_when_the_probe_expires() -> None:
    clock = FakeClock()
    order = make_order(clock, first_ms=20)
    app, q = _id(), queue()
    waiter = Demand(session=session(app, [q]), slots=1, deadline=clock.now + 1.0,
                    untried={q.id})
    order.add(waiter)
    turn = order.next_turn()
    assert turn is not None
    order.record(turn, 0)
    assert order.next_turn() is None
    assert order.due_polls() == []  # tried, but the deadline is a second away
    clock.advance_ms(20)
    assert order.next_turn() is not None

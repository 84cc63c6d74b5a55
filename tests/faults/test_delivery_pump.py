"""The delivery pump as real processes (API, dispatcher and pumps as subprocesses) against a real
webhook receiver (examples/result-inbox on a loopback port):

* every result event that matches an active subscription gets exactly one delivery row, while
  pumps are killed with SIGKILL mid-batch and restarted; two pumps never have one delivery on
  the wire at once; the receiver applies each event once;
* a lost acknowledgement (the receiver committed, the 2xx never arrived) is redelivered and
  applied once;
* a receiver that is down opens its subscription's circuit (on the row and in /metrics) while
  another subscription keeps flowing, and gets everything once it is back;
* SIGTERM drains: no lease is left behind and no attempt is spent on an unsent delivery.

The invariant checker is clean after each.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.invariants import check
from tests.support.processes import free_port, wait_until
from tests.support.pump import PATH, InboxReceiver, PumpDaemon, Relay, cancel_all
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

RESULTS = int(os.environ.get("ORBIT_PUMP_FAULT_RESULTS", "120"))
FAST_RETRY = {"backoff_initial_ms": 100, "backoff_max_ms": 400}


def hook_url(port: int) -> str:
    return f"http://127.0.0.1:{port}{PATH}"


def all_acknowledged(relay: Relay, name: str, count: int, timeout: float = 60) -> Any:
    def done() -> list[dict[str, Any]] | None:
        rows = relay.deliveries(name)
        ok = len(rows) == count and all(r["state"] == "ACKNOWLEDGED" for r in rows)
        return rows if ok else None

    return wait_until(done, timeout=timeout, interval=0.1,
                      message=f"{count} acknowledged deliveries of {name!r}")


def leased(relay: Relay, since: Any = None) -> int:
    """LEASED deliveries (leased after ``since``, database time, when given)."""
    if since is None:
        return int(relay.rows("SELECT COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s"
                              " AND state = 'LEASED'", relay.namespace_id())[0][0])
    return int(relay.rows("SELECT COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s"
                          " AND state = 'LEASED' AND updated_at > %s", relay.namespace_id(),
                          since)[0][0])


def db_now(relay: Relay) -> Any:
    return relay.rows("SELECT UTC_TIMESTAMP(6)")[0][0]


def assert_clean(stack: Stack, relay: Relay) -> None:
    with stack.sql() as conn:
        assert check(conn, [relay.namespace_id()], quiescent=True) == []


def test_killed_pumps_leave_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    relay = Relay(stack)
    pumps: list[PumpDaemon] = []
    receiver: InboxReceiver | None = None
    try:
        stack.create_queue("jobs")
        port = free_port()
        secret = relay.subscribe("hook", kind="WEBHOOK", endpoint_url=hook_url(port),
                                 lease_ms=1500, **FAST_RETRY)
        assert secret is not None
        relay.subscribe("pull", kind="PULL")
        relay.subscribe("none", kind="PULL", filters={"states": ["SUCCEEDED"]})
        receiver = InboxReceiver(stack.server, port, secret, work_s=0.05)
        receiver.start()

        def pump(n: int) -> PumpDaemon:
            return PumpDaemon(stack, relay.key, tmp_path / f"pump-{n}.log", lease_batch="20")

        pumps = [pump(0), pump(1)]
        for p in pumps:
            p.wait_ready()
        task_ids = stack.submit("jobs", "noop", [{"i": i} for i in range(RESULTS)])
        # Results keep coming (one cancellation at a time) while the pumps are killed.
        producer = threading.Thread(target=cancel_all, args=(stack, task_ids), daemon=True)
        producer.start()
        started = 2
        since = db_now(relay)
        for round_ in range(4):
            # Mid-batch: a delivery is leased by a live pump (on the wire or about to be) when
            # the kill lands (leases of pumps killed before lapse only later).
            wait_until(lambda after=since: leased(relay, after) > 0, timeout=30,
                       interval=0.002, message="a leased delivery")
            victims = [0, 1] if round_ % 2 == 0 else [round_ // 2]
            for v in victims:
                pumps[v].proc.send_signal(signal.SIGKILL)
                pumps[v].proc.wait(timeout=10)
            since = db_now(relay)
            for v in victims:
                pumps[v] = pump(started)
                started += 1
        producer.join(timeout=60)
        assert not producer.is_alive()
        events = relay.result_events()
        assert len(events) == RESULTS
        rows = all_acknowledged(relay, "hook", RESULTS)
        event_ids = {e["id"] for e in events}
        assert {r["event_id"] for r in rows} == event_ids  # no gap, and (count) no duplicate
        pulled = wait_until(lambda: len(relay.deliveries("pull")) == RESULTS, timeout=30,
                            message="the pull subscription's rows") and relay.deliveries("pull")
        assert {r["event_id"] for r in pulled} == event_ids
        assert relay.deliveries("none") == []  # matches no event: no row
        lapsed = relay.rows("SELECT COUNT(*) FROM orbit_delivery_attempts WHERE"
                            " namespace_id = %s AND outcome = 'LAPSED'", relay.namespace_id())
        # Two rounds killed both pumps while one of them held a lease: at least two lapses.
        assert lapsed[0][0] >= 2, "a kill of both pumps did not land mid-batch"
        inbox = receiver.inbox()
        assert set(inbox) == {e.hex() for e in event_ids}
        assert {outcome for _rev, outcome in inbox.values()} == {"APPLIED"}
        # Redeliveries after a kill are sequential, never concurrent: one request at a time.
        assert max(receiver.max_active.values()) == 1
        for p in pumps:
            p.signal(signal.SIGTERM)
        for p in pumps:
            assert p.wait(timeout=20) == 0, p.output()
        assert_clean(stack, relay)
        print(f"\npump kill test: {RESULTS} results, {started - 2} kills, {lapsed[0][0]} lapsed"
              f" attempts, {sum(receiver.requests.values())} requests, 0 gaps, 0 duplicates")
    finally:
        for p in pumps:
            p.stop()
        if receiver is not None:
            receiver.close()
        stack.close()


def test_a_lost_acknowledgement_is_redelivered_and_applied_once(tmp_path: Path) -> None:
    # The pump runs as the least-privileged runtime user (rows only), as deployed.
    stack = Stack(tmp_path, runtime_user=True)
    relay = Relay(stack)
    pump: PumpDaemon | None = None
    receiver: InboxReceiver | None = None
    count = 12
    try:
        stack.create_queue("jobs")
        port = free_port()
        secret = relay.subscribe("hook", kind="WEBHOOK", endpoint_url=hook_url(port),
                                 **FAST_RETRY)
        assert secret is not None
        receiver = InboxReceiver(stack.server, port, secret)
        # The receiver commits every first delivery and then closes the connection unanswered.
        receiver.lose_first = True
        receiver.start()
        pump = PumpDaemon(stack, relay.key, tmp_path / "pump.log",
                          circuit_failure_threshold="1000")
        pump.wait_ready()
        cancel_all(stack, stack.submit("jobs", "noop", [{"i": i} for i in range(count)]))
        rows = all_acknowledged(relay, "hook", count)
        # Every first answer was lost after the commit.
        assert receiver.lost == {r["id"].hex() for r in rows}
        assert all(r["attempts_used"] == 2 for r in rows)  # so every delivery was sent again
        by_id: dict[str, list[str | None]] = {}
        for delivery_id, status, outcome in receiver.outcomes:
            assert status == 200
            by_id.setdefault(delivery_id, []).append(outcome)
        assert all(o == ["applied", "duplicate"] for o in by_id.values()), by_id
        inbox = receiver.inbox()
        assert len(inbox) == count
        assert {outcome for _rev, outcome in inbox.values()} == {"APPLIED"}
        pump.signal(signal.SIGTERM)
        assert pump.wait(timeout=20) == 0
        assert_clean(stack, relay)
    finally:
        if pump is not None:
            pump.stop()
        if receiver is not None:
            receiver.close()
        stack.close()


def test_a_receiver_down_opens_its_circuit_others_flow_and_it_catches_up(
        tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    relay = Relay(stack)
    pump: PumpDaemon | None = None
    receivers: list[InboxReceiver] = []
    count = 30
    try:
        stack.create_queue("jobs")
        down_port, up_port = free_port(), free_port()
        down_secret = relay.subscribe("down", kind="WEBHOOK", endpoint_url=hook_url(down_port),
                                      **FAST_RETRY)
        up_secret = relay.subscribe("up", kind="WEBHOOK", endpoint_url=hook_url(up_port),
                                    **FAST_RETRY)
        assert down_secret is not None
        assert up_secret is not None
        down = InboxReceiver(stack.server, down_port, down_secret)  # not listening yet
        up = InboxReceiver(stack.server, up_port, up_secret)
        receivers = [down, up]
        up.start()
        pump = PumpDaemon(stack, relay.key, tmp_path / "pump.log",
                          circuit_failure_threshold="3", circuit_open_s="1.5")
        pump.wait_ready()
        task_ids = stack.submit("jobs", "noop", [{"i": i} for i in range(count)])
        cancel_all(stack, task_ids)
        all_acknowledged(relay, "up", count)  # the healthy subscription is not held up
        wait_until(lambda: relay.subscription("down")["circuit_state"] == "OPEN", timeout=20,
                   message="the down endpoint's circuit to open")
        wait_until(lambda: (pump.metric("orbit_delivery_endpoint_circuits", state="open")
                            or 0) >= 1, timeout=20, message="the open circuit in /metrics")
        spent = sum(r["attempts_used"] for r in relay.deliveries("down"))
        # Refused connections opened the circuit after a few attempts: the budget of the 30
        # deliveries was not burned while the endpoint was down.
        assert spent < count, spent
        # None acknowledged or exhausted; one may be out as the half-open circuit's probe (the
        # circuit reopens for another probe every 1.5 s while the endpoint stays down).
        states = [r["state"] for r in relay.deliveries("down")]
        assert set(states) <= {"PENDING", "LEASED"}, states
        assert states.count("LEASED") <= 1, states

        down.start()  # back
        rows = all_acknowledged(relay, "down", count, timeout=60)
        wait_until(lambda: relay.subscription("down")["circuit_state"] == "CLOSED", timeout=20,
                   message="the circuit to close")
        events = relay.result_events()
        revisions = {e["id"].hex(): e["task_revision"] for e in events}
        assert {r["event_id"].hex() for r in rows} == set(revisions)
        inbox = down.inbox()
        # Everything arrived once, each at its task's revision.
        assert {event: rev for event, (rev, _o) in inbox.items()} == revisions
        pump.signal(signal.SIGTERM)
        assert pump.wait(timeout=20) == 0
        assert_clean(stack, relay)
    finally:
        if pump is not None:
            pump.stop()
        for r in receivers:
            r.close()
        stack.close()


def test_sigterm_drains_without_leaving_a_lease_or_spending_an_unsent_attempt(
        tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    relay = Relay(stack)
    pumps: list[PumpDaemon] = []
    receiver: InboxReceiver | None = None
    count = 20
    try:
        stack.create_queue("jobs")
        port = free_port()
        secret = relay.subscribe("hook", kind="WEBHOOK", endpoint_url=hook_url(port),
                                 **FAST_RETRY)
        assert secret is not None
        receiver = InboxReceiver(stack.server, port, secret, work_s=0.3)
        receiver.start()
        first = PumpDaemon(stack, relay.key, tmp_path / "pump-0.log", lease_batch="20",
                           endpoint_concurrency="2")
        pumps = [first]
        first.wait_ready()
        cancel_all(stack, stack.submit("jobs", "noop", [{"i": i} for i in range(count)]))
        wait_until(lambda: sum(receiver.requests.values()) >= 1 and leased(relay) >= 10,
                   timeout=20, interval=0.01, message="a batch on the wire")
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 0, first.output()
        rows = relay.deliveries("hook")
        assert [r for r in rows if r["state"] == "LEASED"] == []  # sent and recorded, or released
        requests = sum(receiver.requests.values())
        assert requests < count
        # Only what went on the wire spent an attempt; the released rest did not.
        assert sum(r["attempts_used"] for r in rows) == requests
        assert sum(1 for r in rows if r["state"] == "PENDING") == count - requests
        second = PumpDaemon(stack, relay.key, tmp_path / "pump-1.log")
        pumps.append(second)
        all_acknowledged(relay, "hook", count)
        second.signal(signal.SIGTERM)
        assert second.wait(timeout=20) == 0
        assert_clean(stack, relay)
    finally:
        for p in pumps:
            p.stop()
        if receiver is not None:
            receiver.close()
        stack.close()

"""The relay's hot reads use their indexes (DESIGN §7): leasing due deliveries
(``ix_deliveries_due``), lapse recovery (``ix_deliveries_lease``), the delivery history with and
without a state (``ix_deliveries_history`` / ``ix_deliveries_state_history``: newest first, no
sort), retention protection (``ix_deliveries_source``), fan-out's event read
(``uq_result_events_sequence``) and its duplicate probe (``uq_deliveries_event``) — each reads
its index in order and only about the rows it returns, on a database holding thousands of
deliveries over several namespaces, subscriptions and states."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from orbit_common.db.batch import placeholders
from orbit_common.db.clock import to_db
from orbit_common.db.pool import DatabaseUrl
from orbit_common.relay import deliveries, fanout
from tests.schema.test_explain import explain
from tests.support import migrations

NAMESPACES = 3
SUBSCRIPTIONS = 4  # per namespace
EVENTS = 600  # per namespace
STATES = ("ACKNOWLEDGED", "ACKNOWLEDGED", "ACKNOWLEDGED", "PENDING", "LEASED", "EXHAUSTED")
BASE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PAGE = 50


@attrs.frozen(kw_only=True)
class RelaySeed:
    namespace_id: bytes
    subscription_id: bytes
    event_ids: tuple[bytes, ...]


def seed(cur: Any) -> RelaySeed:
    first: RelaySeed | None = None
    for _ in range(NAMESPACES):
        namespace_id = secrets.token_bytes(16)
        events = []
        for n in range(EVENTS):
            event_id = secrets.token_bytes(16)
            events.append((namespace_id, event_id, n + 1, secrets.token_bytes(16),
                           secrets.token_bytes(16), 2, "SUCCEEDED", '{"handler": "h"}',
                           to_db(BASE + dt.timedelta(milliseconds=n))))
        cur.executemany(
            "INSERT INTO orbit_result_events (namespace_id, id, sequence, task_id, queue_id,"
            " task_revision, state, snapshot, committed_at) VALUES"
            " (%s, %s, %s, %s, %s, %s, %s, %s, %s)", events)
        cur.execute("INSERT INTO orbit_event_streams (namespace_id, next_sequence, revision,"
                    " created_at, updated_at) VALUES (%s, %s, 1, UTC_TIMESTAMP(6),"
                    " UTC_TIMESTAMP(6))", (namespace_id, EVENTS + 1))
        for s in range(SUBSCRIPTIONS):
            subscription_id = secrets.token_bytes(16)
            cur.execute(
                "INSERT INTO orbit_subscriptions (namespace_id, id, name, owner_application_id,"
                " created_by_credential_id, kind, filters, start_after_sequence,"
                " scan_after_sequence, backlog, max_attempts, backoff_initial_ms,"
                " backoff_max_ms, lease_ms, state, revision, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, 'PULL', '{}', 0, %s, 0, 5, 0, 0, 30000,"
                " 'ACTIVE', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                (namespace_id, subscription_id, f"s{s}", bytes(16), bytes(16), EVENTS))
            rows = []
            for n, event in enumerate(events):
                state = STATES[(n + s) % len(STATES)]
                at = to_db(BASE + dt.timedelta(milliseconds=n))
                rows.append((
                    namespace_id, secrets.token_bytes(16), subscription_id, event[1], n + 1,
                    event[3], 2, state, 0 if state == "PENDING" else 1, at,
                    at if state == "LEASED" else None,
                    secrets.token_bytes(32) if state in ("LEASED", "ACKNOWLEDGED") else None,
                    at, at, at if state == "ACKNOWLEDGED" else None,
                    at if state == "EXHAUSTED" else None))
            cur.executemany(
                "INSERT INTO orbit_deliveries (namespace_id, id, subscription_id, event_id,"
                " sequence, task_id, task_revision, state, attempts_used, max_attempts,"
                " available_at, lease_expires_at, lease_token_digest, created_at, updated_at,"
                " acknowledged_at, exhausted_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " 5, %s, %s, %s, %s, %s, %s, %s)", rows)
            if first is None:
                first = RelaySeed(namespace_id=namespace_id, subscription_id=subscription_id,
                                  event_ids=tuple(e[1] for e in events[:20]))
    cur.execute("ANALYZE TABLE orbit_deliveries, orbit_result_events")
    assert first is not None
    return first


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, RelaySeed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def _top() -> tuple[Any, ...]:
    at = to_db(deliveries.TIME_MAX)
    return (at, at, deliveries.ID_MAX)


def _unlocked(sql: str) -> str:
    return sql.replace("FOR UPDATE SKIP LOCKED", "")


MARKS = placeholders(20)
# name → (statement, its parameters, the table alias, the index it must read, row bound)
READS: dict[str, tuple[str, Callable[[RelaySeed], tuple[Any, ...]], str, int]] = {
    "deliveries.DUE": (
        _unlocked(deliveries.DUE), lambda s: (s.namespace_id, s.subscription_id, PAGE),
        "orbit_deliveries", "ix_deliveries_due", EVENTS // 3),
    "deliveries.LAPSED": (
        _unlocked(deliveries.LAPSED), lambda s: (PAGE,),
        "orbit_deliveries", "ix_deliveries_lease", EVENTS * SUBSCRIPTIONS * NAMESPACES // 3),
    "deliveries.HISTORY": (
        deliveries.HISTORY, lambda s: (s.namespace_id, s.subscription_id, *_top(), PAGE),
        "orbit_deliveries", "ix_deliveries_history", 2 * EVENTS),
    "deliveries.HISTORY_BY_STATE": (
        deliveries.HISTORY_BY_STATE,
        lambda s: (s.namespace_id, s.subscription_id, "EXHAUSTED", *_top(), PAGE),
        "orbit_deliveries", "ix_deliveries_state_history", EVENTS),
    "deliveries.UNACKNOWLEDGED": (
        deliveries.UNACKNOWLEDGED.format(MARKS),
        lambda s: (s.namespace_id, *s.event_ids),
        "orbit_deliveries", "ix_deliveries_source", 20 * SUBSCRIPTIONS * 2),
    "fanout.EVENTS": (
        fanout.EVENTS, lambda s: (s.namespace_id, 100, 400, PAGE),
        "r", "uq_result_events_sequence", 2 * 300),
    "fanout.EXISTING": (
        fanout.EXISTING.format(MARKS),
        lambda s: (s.namespace_id, s.subscription_id, *s.event_ids),
        "orbit_deliveries", "uq_deliveries_event", 40),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_the_read_uses_its_index(seeded: tuple[DatabaseUrl, RelaySeed], name: str) -> None:
    url, s = seeded
    sql, params, table, index, most = READS[name]
    plan = explain(url, sql, params(s))
    text = "\n".join(map(str, plan))
    (row,) = [r for r in plan if r["table"] == table]
    assert row["key"] == index, text
    assert row["type"] in {"range", "ref", "eq_ref"}, text
    extra = row["Extra"] or ""
    assert "filesort" not in extra, text
    assert int(row["rows"]) <= most, text

"""POLL steps with real ``orbit weave`` processes killed with SIGKILL inside the advances that
decide a round and make the next one (the test holds the instance row's lock, so the engine is
provably inside its advance, its lease committed): after a restart the used rounds, the rounds'
tasks and their attempts are what they were, the maximum is never exceeded and the absolute
query deadline never moves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orbit_common.db.pool import Database
from tests.conftest import make_tenant
from tests.faults.test_weave_engine import db, kill_inside_advance, url  # noqa: F401 - fixtures
from tests.integration.weave.engine_support import Flow, begin, doc
from tests.support.invariants import check_db
from tests.support.processes import WeaveDaemon
from tests.support.waiting import until

pytestmark = pytest.mark.slow

MAX_ROUNDS = 3
POLL = doc({
    "check": {"kind": "POLL", "queue": "Q", "handler": "w.a", "input": "{'n': input.n}",
              "until": "round.result.done", "interval_ms": 300, "max_rounds": MAX_ROUNDS,
              "query_deadline_ms": 60_000, "retry": {"max_attempts": 2},
              "next": "done"},
    "done": {"kind": "SUCCEED", "output": "steps.check.result"},
}, "check")


async def poll_state(flow: Flow) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute("SELECT * FROM weave_poll_states WHERE namespace_id = %s"
                          " AND instance_id = %s", (flow.tenant.namespace_id, flow.instance_id))
        state = dict(await cur.fetchone())
        await cur.execute("SELECT COUNT(*) AS n FROM weave_poll_rounds WHERE namespace_id = %s"
                          " AND instance_id = %s", (flow.tenant.namespace_id, flow.instance_id))
        state["rounds"] = (await cur.fetchone())["n"]
        await cur.execute("SELECT id, starts_used, attempts_used FROM pulse_tasks"
                          " WHERE namespace_id = %s AND owner_id = %s ORDER BY created_at",
                          (flow.tenant.namespace_id, flow.instance_id))
        state["tasks"] = [dict(r) for r in await cur.fetchall()]
        return state
    return await flow.db.read("test.poll_state", body)


def budget(state: dict[str, Any]) -> tuple[Any, ...]:
    return (state["state"], state["used_rounds"], state["rounds"], state["deadline_at"],
            state["tasks"])


async def test_kill_9_mid_round_keeps_rounds_attempts_and_the_deadline(
        db: Database, url: Any, tmp_path: Path) -> None:  # noqa: F811 - the fixtures
    tenant = await make_tenant(db)
    flow = await begin(db, tenant, POLL, {"n": 2})
    engine = WeaveDaemon(url, tmp_path / "engine-0.log", "engine-0")
    try:
        await until(lambda: _rounds(flow, 1), timeout=20)
    finally:
        engine.stop()
    entered = await poll_state(flow)
    deadline = entered["deadline_at"]
    assert (entered["state"], entered["used_rounds"]) == ("ROUND", 1)
    engines = 0
    for n in range(1, MAX_ROUNDS + 1):
        # The round's result: the engine deciding it dies inside its advance.
        task_id = (await flow.tasks())[-1]["id"]
        await flow.end(task_id, "ok", {"done": False})
        before = budget(await poll_state(flow))
        engines += 1
        await kill_inside_advance(url, flow, tmp_path, f"engine-{engines}")
        assert budget(await poll_state(flow)) == before
        if n < MAX_ROUNDS:
            # The next engine decides the round (WAITING); the one making the next round dies
            # inside that advance: no round counted, no task made.
            engines += 1
            engine = WeaveDaemon(url, tmp_path / f"engine-{engines}.log", f"engine-{engines}")
            try:
                await until(lambda: _waiting(flow), timeout=20)
            finally:
                engine.stop()
            waiting = await poll_state(flow)
            assert (waiting["used_rounds"], waiting["deadline_at"]) == (n, deadline)
            engines += 1
            await kill_inside_advance(url, flow, tmp_path, f"engine-{engines}")
            assert budget(await poll_state(flow)) == budget(waiting)
        engines += 1
        engine = WeaveDaemon(url, tmp_path / f"engine-{engines}.log", f"engine-{engines}")
        try:
            if n < MAX_ROUNDS:
                await until(lambda n=n: _rounds(flow, n + 1), timeout=20)  # type: ignore[misc]
            else:
                await until(lambda: _ended(flow), timeout=20)
        finally:
            engine.stop()
        after = await poll_state(flow)
        assert after["deadline_at"] == deadline
        assert after["used_rounds"] <= MAX_ROUNDS
    final = await poll_state(flow)
    assert (final["state"], final["used_rounds"], final["rounds"]) == (
        "EXHAUSTED", MAX_ROUNDS, MAX_ROUNDS)
    assert final["deadline_at"] == deadline
    assert len(final["tasks"]) == MAX_ROUNDS  # one task per round
    assert all(t["starts_used"] == 1 for t in final["tasks"])  # each ran once
    instance = await flow.instance()
    assert instance["state"] == "FAILED"
    assert json.loads(instance["error"]) == {
        "error": "poll_exhausted", "rounds": MAX_ROUNDS, "reason": "max_rounds",
        "step": "check"}
    assert {r["outcome"] for r in await flow.inbox()} == {"advanced"}
    assert await check_db(db, [tenant.namespace_id]) == []


async def _rounds(flow: Flow, count: int) -> bool:
    return bool(len(await flow.tasks()) >= count
                and (await poll_state(flow))["used_rounds"] >= count)


async def _waiting(flow: Flow) -> bool:
    return bool((await poll_state(flow))["state"] == "WAITING")


async def _ended(flow: Flow) -> bool:
    return bool((await flow.instance())["state"] != "RUNNING")

"""Orbit's lease kernel alone: the dispatcher's claim/start/finish transactions, in one process.

The middle point between the raw queue cycle (bench/rawqueue.py) and the full stack: the same
named transactions the dispatcher runs (``orbit_common/pulse/dispatch.py``: claim, start,
finish, heartbeat), through the same transaction runner, in batches of 32, with ``loops``
concurrent sessions — but no HTTP, no WebSocket, no SDK worker processes. Its throughput is what
the database work Orbit records per task (attempts, receipts, state and result events, counters)
costs on this server; the gap between it and the end-to-end figure is the cost of the processes
and the protocol.

Like a dispatcher, the cycle heartbeats its sessions while it runs (every third of the session
timeout), so a phase that outlasts the timeout on a busy machine keeps its sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.model import ids
from orbit_common.platform import principals
from orbit_common.pulse import dispatch, leases, workers

BATCH = 32


async def run_kernel_cycle(url: DatabaseUrl, api_key: str, namespace: str, queue: str,
                           tasks: int, loops: int = 4,
                           session_ttl_s: int = workers.SESSION_TTL_S) -> dict[str, Any]:
    """Run ``tasks`` already-submitted tasks of ``queue`` through claim/start/finish (its
    sessions live ``session_ttl_s`` from each heartbeat, as a dispatcher's do)."""
    # One connection per loop, one for the heartbeats.
    db = await open_database(url, minsize=loops, maxsize=loops + 1)
    try:
        principal = await principals.authenticate(db, api_key)
        sessions = [await dispatch.register(
            db, principal, namespace=namespace, instance_key=f"kernel-bench-{n}",
            queues=[queue], handlers=["noop"], max_in_flight=BATCH, session_id=ids.new_id(),
            instance_id=ids.new_id(), node="bench", name="bench.register", ttl_s=session_ttl_s)
            for n in range(loops)]
        done = 0
        started = time.perf_counter()

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(session_ttl_s / 3)
                for session in sessions:
                    await dispatch.heartbeat(db, session, name="bench.heartbeat")

        async def loop(session: workers.Session) -> None:
            nonlocal done
            ref = session.queues[0]
            while done < tasks:
                grants = await dispatch.claim(db, session, ref, BATCH, name="bench.claim")
                if not grants:
                    if done >= tasks:
                        return
                    await asyncio.sleep(0.005)
                    continue
                refs = [leases.AttemptRef(attempt_id=g.attempt_id, token=g.token,
                                          generation=g.generation) for g in grants]
                await dispatch.start(db, session, refs, name="bench.start")
                reports = [leases.FinishReport(ref=r, report_id=ids.new_id(),
                                               outcome="succeeded", result="{}") for r in refs]
                outcomes = await dispatch.finish(db, session, reports,
                                                 name="bench.finish")
                if not all(o.accepted for o in outcomes):
                    raise RuntimeError(f"kernel cycle: a finish was refused: {outcomes[0]}")
                done += len(grants)

        heartbeats = asyncio.create_task(keep_alive(), name="bench-heartbeat")
        try:
            runs = asyncio.gather(*(loop(s) for s in sessions))
            # A failed heartbeat (the session was lost after all) ends the run with its error.
            either: set[asyncio.Future[Any]] = {runs, heartbeats}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if heartbeats.done():
                runs.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runs
                heartbeats.result()
            await runs
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
        elapsed = time.perf_counter() - started
        for session in sessions:
            await dispatch.close(db, session, name="bench.close")
        return {"kernel_tasks": done, "kernel_tasks_per_s": round(done / elapsed, 1),
                "kernel_loops": loops}
    finally:
        await db.close()

"""Orbit's lease kernel alone: the dispatcher's claim/start/finish transactions, in one process.

The middle point between the raw queue cycle (bench/rawqueue.py) and the full stack: the same
``leases.claim`` / ``leases.start`` / ``leases.finish`` calls the dispatcher makes, through the
same transaction runner, in batches of 32, with ``loops`` concurrent sessions — but no HTTP, no
WebSocket, no SDK worker processes. Its throughput is what the database work Orbit records per
task (attempts, receipts, state and result events, counters) costs on this server; the gap
between it and the end-to-end figure is the cost of the processes and the protocol.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.model import ids
from orbit_common.platform import credentials
from orbit_common.pulse import leases, workers

BATCH = 32


async def _start(cur: Any, *, session: workers.Session,
                 refs: list[leases.AttemptRef]) -> list[leases.StartOutcome]:
    return await leases.start(cur, session, refs)


async def _finish(cur: Any, *, session: workers.Session,
                  reports: list[leases.FinishReport]) -> list[leases.FinishOutcome]:
    return await leases.finish(cur, session, reports)


async def run_kernel_cycle(url: DatabaseUrl, api_key: str, namespace: str, queue: str,
                           tasks: int, loops: int = 4) -> dict[str, Any]:
    """Run ``tasks`` already-submitted tasks of ``queue`` through claim/start/finish."""
    db = await open_database(url, minsize=loops, maxsize=loops + 1)
    try:
        principal = await db.read("bench.auth", lambda cur: credentials.authenticate(cur, api_key))

        async def register(n: int) -> workers.Session:
            return await db.transaction("bench.register", lambda cur: workers.register(
                cur, principal, namespace=namespace, instance_key=f"kernel-bench-{n}",
                queues=[queue], handlers=["noop"], max_in_flight=BATCH,
                session_id=ids.new_id(), instance_id=ids.new_id(), node="bench"))

        sessions = [await register(n) for n in range(loops)]
        done = 0
        started = time.perf_counter()

        async def loop(session: workers.Session) -> None:
            nonlocal done
            ref = session.queues[0]
            while done < tasks:
                grants = await leases.run_claim(db, "bench.claim", session, ref, BATCH)
                if not grants:
                    if done >= tasks:
                        return
                    await asyncio.sleep(0.005)
                    continue
                refs = [leases.AttemptRef(attempt_id=g.attempt_id, token=g.token,
                                          generation=g.generation) for g in grants]
                await db.transaction("bench.start", functools.partial(
                    _start, session=session, refs=refs))
                reports = [leases.FinishReport(ref=r, report_id=ids.new_id(),
                                               outcome="succeeded", result="{}") for r in refs]
                outcomes = await db.transaction("bench.finish", functools.partial(
                    _finish, session=session, reports=reports))
                if not all(o.accepted for o in outcomes):
                    raise RuntimeError(f"kernel cycle: a finish was refused: {outcomes[0]}")
                done += len(grants)

        await asyncio.gather(*(loop(s) for s in sessions))
        elapsed = time.perf_counter() - started
        for session in sessions:
            await db.transaction("bench.close", functools.partial(workers.close,
                                                                  session=session))
        return {"kernel_tasks": done, "kernel_tasks_per_s": round(done / elapsed, 1),
                "kernel_loops": loops}
    finally:
        await db.close()

"""The lease calls as the worker that holds each attempt would make them.

Start, renew and finish verify the caller's session (the execution identity). Tests that drive
the protocol without a dispatcher act, for each attempt, as the worker instance that holds it,
through that instance's current ACTIVE session (a reconnected worker's newest session), or the
session recorded on the attempt when the instance has none active (so a fenced or expired
session is refused as it would be in production). Items of one batch held by different
sessions are sent as one call per session, in the caller's transaction, answers in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from orbit_common.db.batch import placeholders
from orbit_common.model import ids
from orbit_common.pulse import leases
from orbit_common.pulse.leases import SessionRef

T = TypeVar("T")
HOLDERS = """
SELECT a.id AS attempt_id, a.worker_instance_id AS instance_id,
       COALESCE((SELECT s.id FROM pulse_worker_sessions s
                 WHERE s.namespace_id = a.namespace_id AND s.instance_id = a.worker_instance_id
                   AND s.state = 'ACTIVE' ORDER BY s.generation DESC LIMIT 1),
                a.worker_session_id) AS session_id
FROM pulse_attempts a WHERE a.namespace_id = %s AND a.id IN ({})
"""


async def holders(cur: Any, namespace_id: bytes,
                  attempt_ids: Sequence[bytes]) -> dict[bytes, SessionRef]:
    if not attempt_ids:
        return {}
    unique = sorted(set(attempt_ids))
    await cur.execute(HOLDERS.format(placeholders(len(unique))), (namespace_id, *unique))
    return {row["attempt_id"]: SessionRef(namespace_id=namespace_id, id=row["session_id"],
                                          instance_id=row["instance_id"])
            for row in await cur.fetchall()}


async def _as_holders(cur: Any, namespace_id: bytes, items: Sequence[Any],
                      attempt_of: Callable[[Any], bytes],
                      call: Callable[[Any, SessionRef, list[Any]], Awaitable[list[T]]]
                      ) -> list[T]:
    found = await holders(cur, namespace_id, [attempt_of(i) for i in items])
    nobody = SessionRef(namespace_id=namespace_id, id=ids.new_id(), instance_id=ids.new_id())
    groups: dict[SessionRef, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(found.get(attempt_of(item), nobody), []).append(index)
    answers: dict[int, T] = {}
    for holder, indexes in groups.items():
        outcomes = await call(cur, holder, [items[i] for i in indexes])
        answers.update(zip(indexes, outcomes, strict=True))
    return [answers[i] for i in range(len(items))]


async def start(cur: Any, namespace_id: bytes,
                refs: Sequence[leases.AttemptRef]) -> list[leases.StartOutcome]:
    return await _as_holders(cur, namespace_id, refs, lambda r: r.attempt_id, leases.start)


async def renew(cur: Any, namespace_id: bytes,
                refs: Sequence[leases.AttemptRef]) -> list[leases.RenewOutcome]:
    return await _as_holders(cur, namespace_id, refs, lambda r: r.attempt_id, leases.renew)


async def finish(cur: Any, namespace_id: bytes,
                 reports: Sequence[leases.FinishReport]) -> list[leases.FinishOutcome]:
    if not reports:
        return []
    leases.finish_validate(reports)
    return await _as_holders(cur, namespace_id, reports, lambda r: r.ref.attempt_id,
                             leases.finish)

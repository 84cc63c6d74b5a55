"""engine.TaskIds: one advance transaction's task ids, random and handed out in order."""

from __future__ import annotations

from orbit_common.model import ids
from orbit_common.weave.engine import TaskIds


def test_ids_come_out_increasing_from_the_pool_then_fresh() -> None:
    draw = TaskIds(50)
    pooled = [draw() for _ in range(50)]
    assert pooled == sorted(pooled) and len(set(pooled)) == 50
    assert all(len(value) == ids.ID_BYTES for value in pooled)
    more = [draw() for _ in range(20)]  # the pool is spent: fresh ids, none repeated
    assert len(set(pooled + more)) == 70


def test_an_empty_pool_still_gives_fresh_ids() -> None:
    draw = TaskIds(0)
    assert len({draw() for _ in range(10)}) == 10

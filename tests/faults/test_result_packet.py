"""The result limit against the server's ``max_allowed_packet`` (docs/configuration.md, 结果大小与
max_allowed_packet): on a private server whose packet is exactly what the docs require for
``[dispatcher].max_result_bytes``, a finish whose results come to the limit, of the characters
SQL escaping doubles, is stored; with the 1 MiB margin taken away the same finish fails (the
1153 of issue 11) and the readiness report warns."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient

import orbit_devdb as devdb
from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.db.schema import SchemaChecker, packet_bytes_needed
from orbit_common.service.config import MAX_RESULT_BYTES
from orbit_common.service.health import ReadinessGate
from orbit_dispatcher.service import DispatcherService
from tests.conftest import api_config, make_tenant
from tests.support.database import create_database, scratch_name
from tests.support.lease_fixtures import task_row
from tests.support.servers import ServiceTestServer
from tests.support.worker_calls import running_attempt, text_result

ITEMS = 8  # results of MAX_RESULT_BYTES / 8 each: the whole limit in one finish


async def _finish_at_the_limit(url: DatabaseUrl, packet: int) -> tuple[int, list[str], bool]:
    """With the server's packet at ``packet``: the finish's HTTP status, the task states after
    it, and whether the readiness report warns about the packet."""
    db: Database = await open_database(url, minsize=1, maxsize=4)
    try:
        checker = SchemaChecker(db, min_packet_bytes=packet_bytes_needed(MAX_RESULT_BYTES))
        gate = ReadinessGate(checker)
        await gate.refresh()
        report = await checker.check()
        warned = any(w.startswith("max_allowed_packet") for w in report.warnings)
        assert report.durability["max_allowed_packet"] == packet
        service = DispatcherService(api_config(url), db, gate)
        client = TestClient(ServiceTestServer(service.app))
        await client.start_server()
        try:
            tenant = await make_tenant(db)
            session_url, task_ids, refs = await running_attempt(client, db, tenant, ITEMS)
            response = await client.post(f"{session_url}/finish", headers=tenant.auth, json={
                "items": [{**ref, "report_id": f"r{i}", "outcome": "succeeded",
                           "result": text_result(MAX_RESULT_BYTES // ITEMS)}
                          for i, ref in enumerate(refs)]})
            states = [(await task_row(db, tenant, t))["state"] for t in task_ids]
            return response.status, states, warned
        finally:
            service.draining = True
            await client.close()
    finally:
        await db.close()


def _set_packet(instance: devdb.Instance, packet: int) -> None:
    conn = instance.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL max_allowed_packet = %s", (packet,))
    finally:
        conn.close()


async def test_the_documented_packet_carries_a_finish_at_the_result_limit(
    private_server: Path,
) -> None:
    instance = devdb.load(private_server)
    assert instance is not None
    url = create_database(DatabaseUrl.parse(instance.url()), scratch_name())
    needed = packet_bytes_needed(MAX_RESULT_BYTES)
    assert needed % 1024 == 0  # the server rounds the packet down to a multiple of 1 KiB

    _set_packet(instance, needed)  # new connections get it
    status, states, warned = await _finish_at_the_limit(url, needed)
    assert status == 200
    assert states == ["SUCCEEDED"] * ITEMS
    assert not warned

    _set_packet(instance, needed - 1024 * 1024)  # twice the results: the rows do not fit
    status, states, warned = await _finish_at_the_limit(url, needed - 1024 * 1024)
    assert status >= 500
    assert states == ["RUNNING"] * ITEMS
    assert warned

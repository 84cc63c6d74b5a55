"""The console's task list over 10,000 tasks stays bounded (issue 17: "a page of 10,000 tasks' list
renders within the same bound as the API list: cursor paging, no count(*) over the table on every
view").

No timing: the page is checked by what it runs. It calls the API list's domain function
(queries.list_tasks) with the console's page size, runs the very statement the API list runs for
the same page, one keyset read in the order of ``ix_tasks_created`` whose rows read (the
server's handler counters, not EXPLAIN's estimate, which ignores the LIMIT) are a page, not the
table; no statement counts tasks; the next page follows the cursor without overlap.
"""

from __future__ import annotations

import re
from typing import Any

import aiomysql.cursors
import pymysql
import pytest
from aiohttp.test_utils import TestClient

from orbit_api.console import tasks as console_tasks
from orbit_common.db.pool import Database
from orbit_common.model import jsondoc, strict
from orbit_common.platform import credentials
from orbit_common.pulse import queries, tasks
from tests.console.conftest import Admin
from tests.console.test_console_http import log_in, rows
from tests.support import pulse

Client = TestClient[Any, Any]
TASKS = 10_000
PAGE = console_tasks.PAGE
ROW = re.compile(r'<tr>\s*<td><a href="[^"]*/tasks/([0-9a-f]{32})">')
NEXT = re.compile(r'<a class="next" href="\?cursor=([^"]+)">')
# The handler counters of a read (SHOW SESSION STATUS); their sum is the rows the server touched.
READS = ("Handler_read_first", "Handler_read_key", "Handler_read_last", "Handler_read_next",
         "Handler_read_prev", "Handler_read_rnd", "Handler_read_rnd_next")

Statement = tuple[str, tuple[Any, ...]]


async def submit_many(db: Database, principal: credentials.Principal, namespace: str) -> None:
    """TASKS tasks through the domain's submit, a full batch per transaction."""
    dto = strict.structure({"queue": "work", "handler": "reports.build"}, tasks.SubmitRequest)
    spec, _ = tasks.validate(dto, jsondoc.loads_strict("{}", keep_number_text=True), "$")
    assert spec is not None
    for _ in range(TASKS // tasks.MAX_BATCH):
        batch = tasks.make_items(principal, [(spec, None, f"$.tasks[{n}]", "-")
                                             for n in range(tasks.MAX_BATCH)])
        await tasks.submit(db, principal, namespace=namespace, items=batch)


class Recorder:
    """Every statement the application runs (aiomysql's execute), and every list_tasks call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[Statement] = []
        self.calls: list[dict[str, Any]] = []
        execute = aiomysql.cursors.Cursor.execute
        list_tasks = queries.list_tasks

        async def recording(cursor: Any, query: str, args: Any = None) -> Any:
            self.statements.append((query, tuple(args or ())))
            return await execute(cursor, query, args)

        async def listing(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(kwargs)
            return await list_tasks(*args, **kwargs)

        monkeypatch.setattr(aiomysql.cursors.Cursor, "execute", recording)
        monkeypatch.setattr(queries, "list_tasks", listing)

    def take(self) -> tuple[list[Statement], list[dict[str, Any]]]:
        taken = self.statements[:], self.calls[:]
        self.statements.clear()
        self.calls.clear()
        return taken


def list_statements(statements: list[Statement]) -> list[Statement]:
    listed = set(queries.LIST_SQL.values())
    return [(sql, args) for sql, args in statements if sql in listed]


def handler_reads(conn: pymysql.connections.Connection[Any]) -> int:
    with conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(value) for name, value in cur.fetchall() if name in READS)


def rows_read(conn: pymysql.connections.Connection[Any], sql: str, args: tuple[Any, ...]
              ) -> int:
    """Rows the server reads for ``sql`` (its handler counters, less those of the counting)."""
    idle = -handler_reads(conn) + handler_reads(conn)
    before = handler_reads(conn)
    with conn.cursor() as cur:
        cur.execute(sql, args)
        cur.fetchall()
    return handler_reads(conn) - before - idle


async def test_the_console_task_list_over_ten_thousand_tasks_reads_one_page(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant = admin.tenant
    await pulse.create_queue(db, tenant.namespace_id, "work")
    principal = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    await submit_many(db, principal, tenant.namespace)
    newest = [r["id"].hex() for r in rows(
        sync_conn, "SELECT id FROM pulse_tasks WHERE namespace_id = %s"
        " ORDER BY created_at DESC, id DESC", tenant.namespace_id)]
    assert len(newest) == TASKS
    await log_in(api, admin)
    base = f"/console/ns/{tenant.namespace}/tasks"
    recorder = Recorder(monkeypatch)

    # The first page: a page of rows and a cursor, from one call of the API's list function.
    first = await api.get(base)
    page = await first.text()
    assert first.status == 200, page
    statements, calls = recorder.take()
    assert ROW.findall(page) == newest[:PAGE]
    assert [(c["namespace"], c["limit"], c["cursor"]) for c in calls] == [
        (tenant.namespace, PAGE, None)]
    assert PAGE <= queries.PAGE_DEFAULT  # within the API list's own default page
    assert not [sql for sql, _ in statements
                if "COUNT(" in sql.upper() and "PULSE_TASKS" in sql.upper()]
    [(sql, args)] = list_statements(statements)
    assert args[-1] == PAGE

    # The API's list for the same page runs the same statement with the same values.
    api_page = await api.get(f"/v1/namespaces/{tenant.namespace}/tasks",
                             params={"limit": str(PAGE)}, headers=tenant.auth)
    assert api_page.status == 200, await api_page.text()
    api_statements, _ = recorder.take()
    assert list_statements(api_statements) == [(sql, args)]
    assert [t["id"] for t in (await api_page.json())["items"]] == newest[:PAGE]

    # The statement reads the namespace's slice of ix_tasks_created in order, a page of it.
    with sync_conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("EXPLAIN " + sql, args)
        plan = {row["table"]: row for row in cur.fetchall()}
    assert plan["t"]["key"] == "ix_tasks_created", plan
    assert plan["t"]["type"] in ("range", "ref"), plan
    assert "filesort" not in (plan["t"]["Extra"] or ""), plan
    assert plan["q"]["key"] == "PRIMARY", plan
    read = rows_read(sync_conn, sql, args)
    assert read <= 4 * PAGE, f"{read} rows read for a page of {PAGE} out of {TASKS}"

    # The next page follows the cursor: the next rows, none of the first page's.
    cursor = NEXT.search(page)
    assert cursor is not None, "no next-page link"
    second = await api.get(base, params={"cursor": cursor.group(1).replace("&amp;", "&")})
    following = await second.text()
    assert second.status == 200, following
    statements, calls = recorder.take()
    assert ROW.findall(following) == newest[PAGE:2 * PAGE]
    assert [c["limit"] for c in calls] == [PAGE]
    [(_, next_args)] = list_statements(statements)
    assert rows_read(sync_conn, sql, next_args) <= 4 * PAGE
    assert NEXT.search(following) is not None

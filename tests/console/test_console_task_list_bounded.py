"""The console's task list over 10,000 tasks stays bounded (issue 17: "a page of 10,000 tasks' list
renders within the same bound as the API list: cursor paging, no count(*) over the table on every
view").

No timing and no stand-ins: the page is checked by what the server received (its general log,
on for the two page views only). The console runs the very statement the API list runs for the
same page, with the console's page size; it is one keyset read in the order of
``ix_tasks_created`` whose rows read (the server's handler counters, not EXPLAIN's estimate,
which ignores the LIMIT) are a page, not the table; no statement counts tasks; the next page
follows the cursor without overlap.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pymysql
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

async def submit_many(db: Database, principal: credentials.Principal, namespace: str) -> None:
    """TASKS tasks through the domain's submit, a full batch per transaction."""
    dto = strict.structure({"queue": "work", "handler": "reports.build"}, tasks.SubmitRequest)
    spec, _ = tasks.validate(dto, jsondoc.loads_strict("{}", keep_number_text=True), "$")
    assert spec is not None
    for _ in range(TASKS // tasks.MAX_BATCH):
        batch = tasks.make_items(principal, [(spec, None, f"$.tasks[{n}]", "-")
                                             for n in range(tasks.MAX_BATCH)])
        await tasks.submit(db, principal, namespace=namespace, items=batch)


class GeneralLog:
    """The statements the server receives, from its general log (a table), while it is on."""

    def __init__(self, conn: pymysql.connections.Connection[Any], marker: str) -> None:
        self.conn = conn
        self.marker = marker  # only statements naming it (the test's namespace id, in hex)
        self.seen = 0

    def take(self) -> list[str]:
        """The statements naming the marker since the last call, in the order received."""
        with self.conn.cursor() as cur:
            cur.execute("SELECT argument FROM mysql.general_log WHERE command_type = 'Query'"
                        " AND argument LIKE %s ORDER BY event_time", (f"%{self.marker}%",))
            found = [bytes(r[0]).decode() if isinstance(r[0], bytes | bytearray) else r[0]
                     for r in cur.fetchall()]
        taken, self.seen = found[self.seen:], len(found)
        return taken


@contextlib.contextmanager
def general_log(conn: pymysql.connections.Connection[Any], marker: str) -> Iterator[GeneralLog]:
    with conn.cursor() as cur:
        cur.execute("SELECT @@global.general_log, @@global.log_output")
        was_on, output = cur.fetchone()
        cur.execute("TRUNCATE TABLE mysql.general_log")
        cur.execute("SET GLOBAL log_output = 'TABLE'")
        cur.execute("SET GLOBAL general_log = 1")
    try:
        yield GeneralLog(conn, marker)
    finally:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL general_log = %s", (was_on,))
            cur.execute("SET GLOBAL log_output = %s", (output,))
            cur.execute("TRUNCATE TABLE mysql.general_log")


def list_statements(statements: list[str]) -> list[str]:
    """The task-list statements among ``statements`` (any filter combination)."""
    heads = {sql.split("%s")[0] for sql in queries.LIST_SQL.values()}
    return [sql for sql in statements if any(sql.startswith(head) for head in heads)]


def limit_of(sql: str) -> int:
    return int(re.findall(r"LIMIT\s+(\d+)", sql)[-1])


def handler_reads(conn: pymysql.connections.Connection[Any]) -> int:
    with conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(value) for name, value in cur.fetchall() if name in READS)


def rows_read(conn: pymysql.connections.Connection[Any], sql: str) -> int:
    """Rows the server reads for ``sql`` (its handler counters, less those of the counting)."""
    idle = -handler_reads(conn) + handler_reads(conn)
    before = handler_reads(conn)
    with conn.cursor() as cur:
        cur.execute(sql)
        cur.fetchall()
    return handler_reads(conn) - before - idle


async def test_the_console_task_list_over_ten_thousand_tasks_reads_one_page(
    api: Client, admin: Admin, db: Database, sync_conn: pymysql.connections.Connection[Any],
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
    with general_log(sync_conn, tenant.namespace_id.hex()) as log:
        # The first page: a page of rows and a cursor, from one list statement of the page.
        first = await api.get(base)
        page = await first.text()
        assert first.status == 200, page
        statements = log.take()
        assert ROW.findall(page) == newest[:PAGE]
        assert not [sql for sql in statements
                    if "COUNT(" in sql.upper() and "PULSE_TASKS" in sql.upper()]
        [sql] = list_statements(statements)
        assert limit_of(sql) == PAGE
        assert PAGE <= queries.PAGE_DEFAULT  # within the API list's own default page

        # The API's list for the same page runs the same statement with the same values.
        api_page = await api.get(f"/v1/namespaces/{tenant.namespace}/tasks",
                                 params={"limit": str(PAGE)}, headers=tenant.auth)
        assert api_page.status == 200, await api_page.text()
        assert list_statements(log.take()) == [sql]
        assert [t["id"] for t in (await api_page.json())["items"]] == newest[:PAGE]

        # The next page follows the cursor: the next rows, none of the first page's.
        cursor = NEXT.search(page)
        assert cursor is not None, "no next-page link"
        second = await api.get(base, params={"cursor": cursor.group(1).replace("&amp;", "&")})
        following = await second.text()
        assert second.status == 200, following
        assert ROW.findall(following) == newest[PAGE:2 * PAGE]
        [next_sql] = list_statements(log.take())
        assert limit_of(next_sql) == PAGE
        assert NEXT.search(following) is not None

    # The statement reads the namespace's slice of ix_tasks_created in order, a page of it.
    with sync_conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("EXPLAIN " + sql)
        plan = {row["table"]: row for row in cur.fetchall()}
    assert plan["t"]["key"] == "ix_tasks_created", plan
    assert plan["t"]["type"] in ("range", "ref"), plan
    assert "filesort" not in (plan["t"]["Extra"] or ""), plan
    assert plan["q"]["key"] == "PRIMARY", plan
    read = rows_read(sync_conn, sql)
    assert read <= 4 * PAGE, f"{read} rows read for a page of {PAGE} out of {TASKS}"
    assert rows_read(sync_conn, next_sql) <= 4 * PAGE

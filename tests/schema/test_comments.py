"""Every table and every column of a fresh install carries a Chinese COMMENT (DESIGN §7)."""

from __future__ import annotations

import re

from orbit_common.db.pool import DatabaseUrl
from tests.support import migrations

CHINESE = re.compile(r"[\u4e00-\u9fff]")

TABLE_COMMENTS = """
SELECT TABLE_NAME AS table_name, TABLE_COMMENT AS comment FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME
"""
COLUMN_COMMENTS = """
SELECT TABLE_NAME AS table_name, COLUMN_NAME AS column_name, COLUMN_COMMENT AS comment
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
ORDER BY TABLE_NAME, ORDINAL_POSITION
"""


def _bad(comment: str | None) -> bool:
    return not comment or not comment.strip() or not CHINESE.search(comment)


def table_offenders(url: DatabaseUrl) -> list[str]:
    rows = migrations.query(url, TABLE_COMMENTS)
    return [f"{r['table_name']} ({r['comment']!r})" for r in rows if _bad(r["comment"])]


def column_offenders(url: DatabaseUrl) -> list[str]:
    rows = migrations.query(url, COLUMN_COMMENTS)
    return [
        f"{r['table_name']}.{r['column_name']} ({r['comment']!r})"
        for r in rows
        if _bad(r["comment"])
    ]


class TestFreshInstallBaselineHasChineseModelComments:
    def test_the_fresh_install_includes_the_migration_ledger(
        self, fresh_install: DatabaseUrl
    ) -> None:
        names = migrations.tables(fresh_install)
        assert "orbit_schema_migrations" in names
        assert len(names) > 1

    def test_every_table_has_a_chinese_comment(self, fresh_install: DatabaseUrl) -> None:
        offenders = table_offenders(fresh_install)
        assert not offenders, "tables without a Chinese COMMENT:\n  " + "\n  ".join(offenders)

    def test_every_column_has_a_chinese_comment(self, fresh_install: DatabaseUrl) -> None:
        offenders = column_offenders(fresh_install)
        assert not offenders, "columns without a Chinese COMMENT:\n  " + "\n  ".join(offenders)


def test_the_gate_names_every_offender(scratch: migrations.ScratchDatabases) -> None:
    """The check itself works: uncommented, blank and English-only comments are all caught."""
    url = scratch.create()
    conn = migrations.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE t_plain (a INT, b INT COMMENT '  ', c INT COMMENT 'English only',"
                " d INT COMMENT '中文说明') COMMENT='no chinese here'"
            )
            cur.execute("CREATE TABLE t_ok (a INT COMMENT '列') COMMENT='表'")
    finally:
        conn.close()
    assert table_offenders(url) == ["t_plain ('no chinese here')"]
    assert column_offenders(url) == [
        "t_plain.a ('')",
        "t_plain.b ('  ')",
        "t_plain.c ('English only')",
    ]

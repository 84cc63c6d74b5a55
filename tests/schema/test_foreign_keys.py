"""No foreign keys, no cascades (DESIGN §7): zero in a fresh install, and readiness enforces it."""

from __future__ import annotations

from orbit_common.db.pool import DatabaseUrl, open_database
from orbit_common.db.schema import SchemaChecker
from tests.support import migrations

FOREIGN_KEYS = """
SELECT CONSTRAINT_NAME AS name, TABLE_NAME AS table_name,
       REFERENCED_TABLE_NAME AS referenced_table
FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE()
"""


def test_a_fresh_install_has_zero_foreign_keys(fresh_install: DatabaseUrl) -> None:
    assert migrations.query(fresh_install, FOREIGN_KEYS) == []


async def test_readiness_fails_when_someone_adds_a_foreign_key(
    scratch: migrations.ScratchDatabases,
) -> None:
    url = scratch.create(migrate=True)
    db = await open_database(url, minsize=1, maxsize=2)
    try:
        checker = SchemaChecker(db)
        before = await checker.check()
        assert before.ready, before.problems
        assert before.foreign_keys == 0

        conn = migrations.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "ALTER TABLE orbit_namespaces ADD CONSTRAINT fk_by_hand"
                    " FOREIGN KEY (application_id) REFERENCES orbit_applications (id)"
                )
        finally:
            conn.close()

        after = await checker.check()
    finally:
        await db.close()
    assert not after.ready
    assert after.foreign_keys == 1
    assert any("foreign key" in problem for problem in after.problems), after.problems
    # Only the foreign key is wrong: every migration is still reported applied.
    assert set(after.migrations.values()) == {"applied"}

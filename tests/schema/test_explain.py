"""Every hot query uses its intended index (DESIGN §7: "every hot query is checked with EXPLAIN").

``HOT_QUERIES`` is the one list: a later issue that adds a hot query adds a ``HotQuery`` here
(and, if its table is new, rows to ``seed`` and the values it needs to ``Seed``). The queries are
the production constants themselves, run through EXPLAIN with real parameter values on a
database holding a few hundred rows per table, so a table scan is never the cheap choice.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pymysql
import pytest

from orbit_common.db.pool import DatabaseUrl
from orbit_common.platform import applications, credentials, idempotency, namespaces
from tests.support import migrations

APPLICATIONS = 200
PER_APPLICATION = 3  # namespaces and credentials per application
IDEMPOTENCY_NAMESPACES = 8
IDEMPOTENCY_PER_NAMESPACE = 50


@attrs.frozen(kw_only=True)
class Seed:
    """Values of rows that exist in the seeded database, to EXPLAIN with."""

    application_id: bytes
    application_name: str
    namespace_id: bytes
    namespace_name: str
    credential_id: bytes
    credential_prefix: str
    idempotency_identity: tuple[bytes, str, bytes, bytes]


@attrs.frozen(kw_only=True)
class HotQuery:
    name: str
    sql: str
    params: Callable[[Seed], tuple[Any, ...]]
    # EXPLAIN's ``table`` column (the alias when the query has one) → the index it must use.
    keys: dict[str, str]


HOT_QUERIES = (
    HotQuery(
        name="credentials.AUTHENTICATE",
        sql=credentials.AUTHENTICATE,
        params=lambda s: (s.credential_prefix,),
        keys={"c": "uq_credentials_prefix", "a": "PRIMARY"},
    ),
    HotQuery(
        name="credentials.RECHECK",
        sql=credentials.RECHECK,
        params=lambda s: (s.credential_id, s.application_id),
        keys={"c": "PRIMARY", "a": "PRIMARY"},
    ),
    HotQuery(
        name="credentials.SELECT_BY_PREFIX_FOR_UPDATE",
        sql=credentials.SELECT_BY_PREFIX_FOR_UPDATE,
        params=lambda s: (s.credential_prefix,),
        keys={"orbit_credentials": "uq_credentials_prefix"},
    ),
    HotQuery(
        name="credentials.LIST_FOR_APPLICATION",
        sql=credentials.LIST_FOR_APPLICATION,
        params=lambda s: (s.application_id,),
        keys={"orbit_credentials": "ix_credentials_application"},
    ),
    HotQuery(
        name="namespaces.SELECT_BY_NAME",
        sql=namespaces.SELECT_BY_NAME,
        params=lambda s: (s.namespace_name,),
        keys={"orbit_namespaces": "uq_namespaces_name"},
    ),
    HotQuery(
        name="namespaces.SELECT_BY_ID",
        sql=namespaces.SELECT_BY_ID,
        params=lambda s: (s.namespace_id,),
        keys={"orbit_namespaces": "PRIMARY"},
    ),
    HotQuery(
        name="namespaces.LIST_FOR_APPLICATION",
        sql=namespaces.LIST_FOR_APPLICATION,
        params=lambda s: (s.application_id, "", 100),
        keys={"orbit_namespaces": "ix_namespaces_application"},
    ),
    HotQuery(
        name="applications.SELECT_BY_NAME",
        sql=applications.SELECT_BY_NAME,
        params=lambda s: (s.application_name,),
        keys={"orbit_applications": "uq_applications_name"},
    ),
    HotQuery(
        name="idempotency.SELECT_IDENTITY",
        sql=idempotency.SELECT_IDENTITY,
        params=lambda s: s.idempotency_identity,
        keys={"orbit_idempotency_keys": "uq_idempotency_identity"},
    ),
    HotQuery(
        name="idempotency.SELECT_IDENTITY_FOR_UPDATE",
        sql=idempotency.SELECT_IDENTITY_FOR_UPDATE,
        params=lambda s: s.idempotency_identity,
        keys={"orbit_idempotency_keys": "uq_idempotency_identity"},
    ),
)

SEEDED_TABLES = (
    "orbit_applications",
    "orbit_namespaces",
    "orbit_credentials",
    "orbit_idempotency_keys",
)


def seed(cur: Any) -> Seed:
    """A few hundred rows per table, spread over many owners, as production would have."""
    apps = [(secrets.token_bytes(16), f"explain-app-{a:03d}") for a in range(APPLICATIONS)]
    cur.executemany(applications.INSERT_APPLICATION, apps)
    ns_rows, cred_rows = [], []
    for app_id, app_name in apps:
        for n in range(PER_APPLICATION):
            ns_rows.append((secrets.token_bytes(16), app_id, f"{app_name}-ns-{n}"))
            cred_rows.append(
                (
                    secrets.token_bytes(16),
                    app_id,
                    f"cred-{n}",
                    secrets.token_hex(6),
                    secrets.token_bytes(32),
                )
            )
    cur.executemany(
        "INSERT INTO orbit_namespaces (id, application_id, name, state, created_at, updated_at)"
        " VALUES (%s, %s, %s, 'ACTIVE', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        ns_rows,
    )
    cur.executemany(
        "INSERT INTO orbit_credentials (id, application_id, name, prefix, secret_digest, grants,"
        " state, created_by, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, '[]',"
        " 'ACTIVE', 'pytest', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        cred_rows,
    )
    idem_rows = []
    for namespace_id, _app_id, _name in ns_rows[:IDEMPOTENCY_NAMESPACES]:
        for k in range(IDEMPOTENCY_PER_NAMESPACE):
            idem_rows.append(
                (
                    namespace_id,
                    secrets.token_bytes(16),
                    "tasks.submit",
                    b"queue-a",
                    f"key-{k}".encode(),
                    secrets.token_bytes(32),
                    secrets.token_bytes(16),
                )
            )
    cur.executemany(
        "INSERT INTO orbit_idempotency_keys (namespace_id, id, operation, scope, idem_key,"
        " request_digest, credential_id, response_status, response_body, created_at,"
        " expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, 201, '{}', UTC_TIMESTAMP(6),"
        " UTC_TIMESTAMP(6) + INTERVAL 1 DAY)",
        idem_rows,
    )
    for table in SEEDED_TABLES:  # fixed names above
        cur.execute(f"ANALYZE TABLE {table}")
        cur.fetchall()
    # Pick rows from the middle, not the first ones inserted.
    app_id, app_name = apps[APPLICATIONS // 2]
    ns_id, _, ns_name = ns_rows[len(ns_rows) // 2]
    cred = cred_rows[len(cred_rows) // 2]
    idem = idem_rows[len(idem_rows) // 2]
    return Seed(
        application_id=app_id,
        application_name=app_name,
        namespace_id=ns_id,
        namespace_name=ns_name,
        credential_id=cred[0],
        credential_prefix=cred[3],
        idempotency_identity=(idem[0], idem[2], idem[3], idem[4]),
    )


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[DatabaseUrl, Seed]]:
    with migrations.seeded_database(seed) as seeded_:
        yield seeded_


def explain(url: DatabaseUrl, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    conn = migrations.connect(url)
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("EXPLAIN " + sql.strip(), params)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_the_seed_is_large_enough(seeded: tuple[DatabaseUrl, Seed]) -> None:
    url, _ = seeded
    for table in SEEDED_TABLES:
        (row,) = migrations.query(url, f"SELECT COUNT(*) AS n FROM {table}")
        assert row["n"] >= 200, table


@pytest.mark.parametrize("hot", HOT_QUERIES, ids=[q.name for q in HOT_QUERIES])
def test_hot_query_uses_its_index(seeded: tuple[DatabaseUrl, Seed], hot: HotQuery) -> None:
    url, values = seeded
    plan = explain(url, hot.sql, hot.params(values))
    used = {row["table"]: row["key"] for row in plan}
    assert used == hot.keys, f"{hot.name}: EXPLAIN says\n" + "\n".join(map(str, plan))
    filesorts = [row for row in plan if "filesort" in (row["Extra"] or "")]
    assert not filesorts, f"{hot.name} sorts instead of reading in index order: {filesorts}"

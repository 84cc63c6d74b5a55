"""A published version never changes (property test): whatever is published after it, replayed
or refused, and whatever a session tries on its rows directly, version 1's stored document,
digest and scope stay what the publish wrote, its digest is the SHA-256 of its document, and an
instance started on it runs it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.db.pool import DatabaseUrl, connect_sync, open_database
from orbit_common.model import digests
from orbit_common.weave import definitions, instances
from tests.conftest import make_tenant, unique
from tests.integration.weave.support import principal
from tests.support.lease_fixtures import make_queue
from tests.unit.weave.strategies import definitions as random_definitions

# Direct writes a session might try on a published version's rows: the triggers refuse each.
TAMPERS = (
    "UPDATE weave_definition_versions SET document = '{}' WHERE namespace_id = %s",
    "UPDATE weave_definition_versions SET digest = UNHEX(SHA2('x', 256)) WHERE namespace_id = %s",
    "UPDATE weave_definition_versions SET version = version + 10 WHERE namespace_id = %s",
    "DELETE FROM weave_definition_versions WHERE namespace_id = %s",
    "UPDATE weave_version_scopes SET queue_ids = '[]' WHERE namespace_id = %s",
    "UPDATE weave_version_scopes SET digest = UNHEX(SHA2('x', 256)) WHERE namespace_id = %s",
    "DELETE FROM weave_version_scopes WHERE namespace_id = %s",
)

Action = tuple[str, Any]


def actions() -> st.SearchStrategy[list[Action]]:
    return st.lists(st.one_of(
        st.tuples(st.just("publish"), random_definitions()),
        st.tuples(st.just("replay"), st.just(None)),
        st.tuples(st.just("stale"), random_definitions()),
        st.tuples(st.just("tamper"), st.sampled_from(TAMPERS)),
    ), max_size=4)


def _rows(url: DatabaseUrl, namespace_id: bytes) -> list[tuple[Any, ...]]:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT v.version, v.document, v.digest, s.digest, s.queue_ids"
                        " FROM weave_definition_versions v JOIN weave_version_scopes s"
                        " ON s.namespace_id = v.namespace_id AND s.definition_id = v.definition_id"
                        " AND s.version = v.version WHERE v.namespace_id = %s"
                        " ORDER BY v.version", (namespace_id,))
            return list(cur.fetchall())
    finally:
        conn.close()


def _tamper(url: DatabaseUrl, sql: str, namespace_id: bytes) -> None:
    conn = connect_sync(url, autocommit=True)
    try:
        with conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as refused:
            cur.execute(sql, (namespace_id,))
        assert refused.value.args[0] == 1644  # SIGNAL SQLSTATE '45000' from the trigger
    finally:
        conn.close()


async def _run(url: DatabaseUrl, first: dict[str, Any], steps: list[Action]) -> None:
    db = await open_database(url, minsize=1, maxsize=2)
    try:
        tenant = await make_tenant(db)
        for name in ("qa", "qb"):
            await make_queue(db, tenant, name=name)
        who = await principal(db, tenant.api_key)
        name = unique("wf")
        await definitions.create_definition(db, who, namespace=tenant.namespace, name=name)
        text = json.dumps(first).encode()
        key = unique("publish")
        await definitions.publish_version(db, who, namespace=tenant.namespace, name=name,
                                          revision=1, document=text, idempotency_key=key)
        (original,) = _rows(url, tenant.namespace_id)
        started = await instances.start_instance(db, who, namespace=tenant.namespace,
                                                 definition=name, version=1,
                                                 input_json=b'{"n": 1}')
        revision = 2
        for kind, value in steps:
            if kind == "publish":
                out = await definitions.publish_version(
                    db, who, namespace=tenant.namespace, name=name, revision=revision,
                    document=json.dumps(value).encode())
                revision = out.body["revision"]
            elif kind == "replay":
                again = await definitions.publish_version(
                    db, who, namespace=tenant.namespace, name=name, revision=1, document=text,
                    idempotency_key=key)
                assert again.body["published_version"] == 1
            elif kind == "stale":
                try:
                    await definitions.publish_version(
                        db, who, namespace=tenant.namespace, name=name, revision=1,
                        document=json.dumps(value).encode())
                except errors.StaleRevision:
                    pass
                else:
                    raise AssertionError("a publish at an old revision was accepted")
            else:
                _tamper(url, value, tenant.namespace_id)
            now = _rows(url, tenant.namespace_id)
            assert now[0] == original
            assert [row[0] for row in now] == list(range(1, len(now) + 1))
        version, document, digest, scope_digest, _queues = original
        assert digest == scope_digest == digests.sha256(document.encode())
        async def load(cur: Any) -> definitions.PinnedVersion:
            await cur.execute("SELECT id FROM weave_definitions WHERE namespace_id = %s"
                              " AND name = %s", (tenant.namespace_id, name))
            definition_id = bytes((await cur.fetchone())["id"])
            return await definitions.load_version(cur, tenant.namespace_id, definition_id,
                                                  version)

        pinned = await db.read("test.load", load)
        assert pinned.digest == digest
        got = await instances.get_instance(db, who, namespace=tenant.namespace,
                                           instance_id=started.body["id"])
        assert (got["version"], got["version_digest"]) == (1, digest.hex())
    finally:
        await db.close()


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(first=random_definitions(), steps=actions())
def test_a_published_version_never_changes(db_url: DatabaseUrl, first: dict[str, Any],
                                           steps: list[Action]) -> None:
    asyncio.run(_run(db_url, first, steps))

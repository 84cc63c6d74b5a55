"""Helpers for the Weave integration tests: a principal, a small definition, counts."""

from __future__ import annotations

import json
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.weave import definitions
from tests.conftest import Tenant, unique
from tests.support.lease_fixtures import scalar


async def principal(db: Database, api_key: str) -> credentials.Principal:
    return await db.read("test.auth", lambda cur: credentials.authenticate(cur, api_key))


def document(queue: str, *, handler: str = "work.do", extra_queue: str | None = None) -> bytes:
    """A small valid definition: one TASK step on ``queue`` (and one on ``extra_queue``)."""
    steps: dict[str, Any] = {
        "a": {"kind": "TASK", "queue": queue, "handler": handler,
              "next": "b" if extra_queue else "done"},
        "done": {"kind": "SUCCEED"},
    }
    if extra_queue:
        steps["b"] = {"kind": "TASK", "queue": extra_queue, "handler": handler, "next": "done"}
    return json.dumps({
        "format": "orbit.weave/1",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                         "required": ["n"]},
        "start": "a", "steps": steps,
    }).encode()


async def published(db: Database, tenant: Tenant, queue: str, *, name: str | None = None
                    ) -> str:
    """A definition with one published version on ``queue``; its name."""
    who = await principal(db, tenant.api_key)
    name = name or unique("wf")
    await definitions.create_definition(db, who, namespace=tenant.namespace, name=name)
    await definitions.publish_version(db, who, namespace=tenant.namespace, name=name,
                                      revision=1, document=document(queue))
    return name


async def count(db: Database, table: str, namespace_id: bytes) -> int:
    # table names come from the tests, never from input
    return int(await scalar(db, f"SELECT COUNT(*) AS n FROM {table} WHERE namespace_id = %s",
                            namespace_id))


WEAVE_TABLES = ("weave_definitions", "weave_definition_versions", "weave_version_scopes",
                "weave_instances", "weave_steps", "weave_activations", "weave_pending_advances")


async def counts(db: Database, namespace_id: bytes) -> dict[str, int]:
    return {t: await count(db, t, namespace_id) for t in WEAVE_TABLES}

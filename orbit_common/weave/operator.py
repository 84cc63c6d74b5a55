"""Operator reads of workflows (``orbit admin workflows``): definitions, versions and instances
of a namespace by its name, with the database credentials of the command line (no API
credential, no grant: the operator reads everything, like ``orbit admin subscriptions``). The
views are the API's (orbit_common.weave.definitions and instances). The operator's pause and
resume are orbit_common.weave.controls.operator_set_paused."""

from __future__ import annotations

from typing import Any

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids
from orbit_common.platform import namespaces
from orbit_common.weave import definitions, instance_tasks, instances, timeline, waits


async def _namespace(cur: Any, name: str) -> namespaces.Namespace:
    found = await namespaces.find_namespace(cur, name)
    if found is None:
        raise errors.NamespaceNotFound(f"no namespace {name!r}")
    return found


namespace_of = _namespace  # for the operator reads of other weave modules (signals.py)


async def list_definitions(db: Database, *, namespace: str, after: str = "",
                           limit: int = definitions.LIST_MAX) -> list[dict[str, Any]]:
    """A namespace's definitions by name (after ``after``)."""
    definitions.check_limit(limit)

    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await _namespace(cur, namespace)
        return await definitions.definitions_after(cur, ns.id, after, limit)

    return await db.read("weave.operator.definitions", body)


async def get_definition(db: Database, *, namespace: str, name: str) -> dict[str, Any]:
    """A definition with its versions (without their documents)."""
    async def body(cur: Any) -> dict[str, Any]:
        ns = await _namespace(cur, namespace)
        return await definitions.definition_detail(cur, ns.id, name)

    return await db.read("weave.operator.definition", body)


async def get_version(db: Database, *, namespace: str, name: str, version: int
                      ) -> dict[str, Any]:
    """One version with its document."""
    async def body(cur: Any) -> dict[str, Any]:
        ns = await _namespace(cur, namespace)
        return await definitions.version_detail(cur, ns.id, name, version)

    return await db.read("weave.operator.version", body)


async def list_instances(db: Database, *, namespace: str, definition: str | None = None,
                         state: str | None = None, business_key: str | None = None,
                         limit: int = instances.LIST_MAX, version: int | None = None
                         ) -> cursors.Page:
    """The newest instances (at most ``limit``), filtered like the API's list."""
    filters = instances.ListFilters.check(
        definition=definition, state=state, business_key=business_key, created_from=None,
        created_to=None, limit=limit, version=version)

    async def body(cur: Any) -> cursors.Page:
        ns = await _namespace(cur, namespace)
        return await instances.page(cur, ns.id, filters, None)

    return await db.read("weave.operator.instances", body)


async def get_instance(db: Database, *, namespace: str, instance_id: str,
                       all_activations: bool = False) -> dict[str, Any]:
    """An instance with its steps, their current activations (every activation with
    ``all_activations``) and their tasks' results."""
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> dict[str, Any]:
        ns = await _namespace(cur, namespace)
        return await instances.detail(cur, ns.id, raw_id, all_activations=all_activations)

    return await db.read("weave.operator.instance", body)


async def instance_timeline(db: Database, *, namespace: str, instance_id: str,
                            order: str = "asc", limit: int = timeline.LIMIT_MAX
                            ) -> cursors.Page:
    """The first ``limit`` events of the instance's timeline in ``order`` (the API's view)."""
    raw_id = timeline.check(instance_id, order, limit)

    async def body(cur: Any) -> cursors.Page:
        ns = await _namespace(cur, namespace)
        await timeline.exists(cur, ns.id, raw_id)
        return await timeline.page(cur, ns.id, raw_id, order=order, limit=limit, position=None,
                                   filters={"namespace": namespace,
                                            "workflow_id": raw_id.hex(), "order": order})

    return await db.read("weave.operator.timeline", body)


async def instance_waits(db: Database, *, namespace: str, instance_id: str
                         ) -> list[dict[str, Any]]:
    """Every wait of the instance (TIMER and SIGNAL), oldest first (the API's view)."""
    try:
        raw_id = ids.from_hex(instance_id)
    except ValueError as exc:
        raise instances.InstanceNotFound("no such workflow instance in this namespace") from exc

    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await _namespace(cur, namespace)
        await timeline.exists(cur, ns.id, raw_id)
        return await waits.waits_of(cur, ns.id, raw_id)

    return await db.read("weave.operator.waits", body)


async def list_instance_tasks(db: Database, *, namespace: str, instance_id: str,
                              limit: int = instance_tasks.LIST_MAX) -> cursors.Page:
    """The first ``limit`` tasks the instance created, each verified back to its activation
    (the API's view, task id order)."""
    raw_id = instance_tasks.check(instance_id, limit)

    async def body(cur: Any) -> cursors.Page:
        ns = await _namespace(cur, namespace)
        return await instance_tasks.page(cur, ns.id, raw_id, after=instance_tasks.ID_MIN,
                                         limit=limit, filters={"namespace": namespace,
                                                               "workflow_id": raw_id.hex()})

    return await db.read("weave.operator.tasks", body)


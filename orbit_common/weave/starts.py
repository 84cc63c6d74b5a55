"""Batch start: ``POST …/workflows/batch`` starts 1–100 instances in one transaction.

Each item is what a single start (``instances.start_instance``) takes, with its own optional
``idempotency_key``, and becomes exactly what a single start writes: the instance (RUNNING), its
execution gate, the ``$root`` step and first activation, the ROOT pending advance, the
``workflow.started`` event and audit record. The difference is the number of statements: one
multi-row INSERT per table for the whole batch (a single start sends one statement per row),
which is what a client starting many instances at once pays for.

Transaction (READ COMMITTED)
    1. ``workflows.start`` in the namespace (the credential, application and namespace re-read).
    2. Each distinct (definition, version) pinned once (scope verified against the digest) and
       ``tasks.submit`` checked on every queue it uses, before any idempotency record is read:
       a caller that may not start an item gets the same 404 or 403 with a key as without one.
    3. One read of every keyed item's identity: the identity of a single start (operation
       ``workflows.instances.start``, scoped by the definition name, the same request digest),
       so a key used by a single start replays in a batch and the other way round; another
       request under a used key is ``409 idempotency_conflict`` naming the item.
    4. Every new item's input checked against its version's input schema; any problem fails
       the whole batch (``validation_failed``, paths ``$.instances[i].input…``).
    5. The idempotency records with their receipts (a concurrent first use that committed first
       turns the item into a replay), then the rows, one statement per table.

All or nothing: a refusal anywhere writes nothing. A COMMIT whose outcome is unknown is
re-checked by a locking read of the first new instance: found, the computed answer stands;
not found, the body runs again with the same identities.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import multi_insert
from orbit_common.db.clock import to_db
from orbit_common.db.pool import Database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import authz, credentials, idempotency, namespaced
from orbit_common.platform.audit import INSERT_AUDIT_PREFIX, INSERT_AUDIT_ROW
from orbit_common.platform.events import EventRecord, append_events
from orbit_common.platform.idempotency import IdempotencyRequest, Replay
from orbit_common.weave import definitions
from orbit_common.weave.instances import (
    BUSINESS_KEY_MAX_BYTES,
    INPUT_MAX_BYTES,
    ROOT_STEP,
    DefinitionNotPublished,
    instance_view,
)

MAX_BATCH = 100
OPERATION = "workflows.instances.start"


@attrs.frozen(kw_only=True)
class StartItem:
    """One instance to start, its identities made before the transaction runner is entered (a
    re-run after a deadlock or a lost COMMIT carries the same ids and digest)."""

    path: str
    definition: str
    version: int | None
    value: Any
    input_text: str
    business_key: str | None
    idem: IdempotencyRequest | None
    instance_id: bytes = attrs.field(factory=ids.new_id)
    gate_id: bytes = attrs.field(factory=ids.new_id)
    root_id: bytes = attrs.field(factory=ids.new_id)
    activation_id: bytes = attrs.field(factory=ids.new_id)
    advance_id: bytes = attrs.field(factory=ids.new_id)
    record_id: bytes = attrs.field(factory=ids.new_id)
    event_id: bytes = attrs.field(factory=ids.new_id)


@attrs.frozen(kw_only=True)
class Started:
    """One item's answer: its receipt, and whether it replays an earlier start."""

    instance_id: bytes
    receipt: dict[str, Any]
    replayed: bool


def start_item(principal: credentials.Principal, *, index: int, definition: str,
               input_json: bytes, version: int | None = None, business_key: str | None = None,
               idempotency_key: str | None = None) -> StartItem:
    """Check one item's own fields (their paths under ``$.instances[index]``) and make its
    identities; the same request digest as a single start of the same request."""
    path = f"$.instances[{index}]"
    problems: list[dict[str, str]] = []
    if len(input_json) > INPUT_MAX_BYTES:
        problems.append({"path": f"{path}.input", "message": f"at most {INPUT_MAX_BYTES} bytes"})
    if business_key is not None and not 1 <= len(business_key.encode()) <= BUSINESS_KEY_MAX_BYTES:
        problems.append({"path": f"{path}.business_key",
                         "message": f"a string of 1-{BUSINESS_KEY_MAX_BYTES} bytes (UTF-8)"})
    if problems:
        raise errors.ValidationFailed(problems)
    input_text = jsondoc.dumps(jsondoc.loads_strict(input_json, keep_number_text=True))
    try:
        idem = namespaced.request(
            OPERATION, idempotency_key, definition.encode(),
            {"definition": definition, "version": version, "input": input_text,
             "business_key": business_key}, principal)
    except errors.ValidationFailed as exc:
        raise errors.ValidationFailed([{**p, "path": f"{path}.idempotency_key"}
                                       for p in exc.errors]) from exc
    return StartItem(path=path, definition=definition, version=version,
                     value=jsondoc.loads_strict(input_json), input_text=input_text,
                     business_key=business_key, idem=idem)


def _duplicates(items: Sequence[StartItem]) -> list[dict[str, str]]:
    """An identity may appear once per batch (two items under one key cannot both be it)."""
    seen: set[tuple[bytes, bytes]] = set()
    problems = []
    for item in items:
        if item.idem is None:
            continue
        identity = (item.idem.scope, item.idem.key)
        if identity in seen:
            problems.append({"path": f"{item.path}.idempotency_key",
                             "message": "the same key for the same definition appears earlier"
                                        " in this batch"})
        seen.add(identity)
    return problems


_Pinned = tuple[dict[str, Any], definitions.PinnedVersion]


async def _pin(cur: Any, grants: Sequence[authz.Grant], namespace: str, namespace_id: bytes,
               items: Sequence[StartItem]
               ) -> tuple[dict[tuple[str, int | None], _Pinned], dt.datetime]:
    """Each distinct (definition, version) resolved once, with ``tasks.submit`` on its queues
    (``grants``: the credential's, re-read in this transaction); and the database clock, read
    with the first of them."""
    pinned: dict[tuple[str, int | None], _Pinned] = {}
    now: dt.datetime | None = None
    for name, version in dict.fromkeys((i.definition, i.version) for i in items):
        row, found, read_at = await definitions.pin_by_name(cur, namespace_id, name, version)
        now = now or read_at
        if found is None:
            raise DefinitionNotPublished(f"workflow definition {name!r} has no version")
        for queue in found.definition.queues:
            if not authz.allowed(grants, authz.Action.TASKS_SUBMIT.value, namespace, queue):
                raise errors.Forbidden(
                    f"the credential may not tasks.submit in queue {queue!r}, which workflow"
                    f" {name!r} version {found.version}'s steps use")
        pinned[(name, version)] = (row, found)
    assert now is not None  # noqa: S101 - items is never empty (checked by the caller)
    return pinned, now


def _receipt(item: StartItem, pinned: _Pinned, namespace_id: bytes, now: Any) -> dict[str, Any]:
    row, version = pinned
    return instance_view({
        "namespace_id": namespace_id, "id": item.instance_id, "definition_id": row["id"],
        "version": version.version, "version_digest": version.digest, "state": "RUNNING",
        "revision": 1, "paused": 0, "control_revision": 1, "checkpoints": 0,
        "stop_kind": None, "stop_requested_at": None, "cancel_requested_at": None,
        "business_key": None if item.business_key is None else item.business_key.encode(),
        "input": item.input_text, "output": None, "error": None, "gate_id": item.gate_id,
        "created_at": now, "updated_at": now, "completed_at": None,
        "definition_name": row["name"]})


async def _insert(cur: Any, namespace_id: bytes, principal: credentials.Principal,
                  new: Sequence[tuple[StartItem, _Pinned]], now: Any, *,
                  request_id: str | None) -> None:
    """The rows of the new instances: one statement per table."""
    when = to_db(now)

    async def insert(prefix: str, template: str, rows: list[tuple[Any, ...]]) -> None:
        sql, params = multi_insert(prefix, template, rows)
        await cur.execute(sql, params)

    await insert("INSERT INTO pulse_execution_gates (namespace_id, id, owner_kind, owner_id,"
                 " state, control_revision, created_at, updated_at)",
                 "(%s, %s, 'WORKFLOW', %s, 'OPEN', 1, %s, %s)",
                 [(namespace_id, i.gate_id, i.instance_id, when, when) for i, _ in new])
    await insert("INSERT INTO weave_instances (namespace_id, id, definition_id, version,"
                 " version_digest, state, revision, business_key, input, gate_id,"
                 " started_by_credential_id, created_at, updated_at)",
                 "(%s, %s, %s, %s, %s, 'RUNNING', 1, %s, %s, %s, %s, %s, %s)",
                 [(namespace_id, i.instance_id, row["id"], version.version, version.digest,
                   None if i.business_key is None else i.business_key.encode(), i.input_text,
                   i.gate_id, principal.credential_id, when, when)
                  for i, (row, version) in new])
    await insert("INSERT INTO weave_steps (namespace_id, instance_id, id, name, kind, state,"
                 " revision, activation_count, live_activation_id, created_at, updated_at)",
                 "(%s, %s, %s, %s, 'ROOT', 'RUNNING', 1, 1, %s, %s, %s)",
                 [(namespace_id, i.instance_id, i.root_id, ROOT_STEP, i.activation_id, when,
                   when) for i, _ in new])
    await insert("INSERT INTO weave_activations (namespace_id, instance_id, step_id, id,"
                 " sequence, state, live_step_id, created_at)",
                 "(%s, %s, %s, %s, 1, 'LIVE', %s, %s)",
                 [(namespace_id, i.instance_id, i.root_id, i.activation_id, i.root_id, when)
                  for i, _ in new])
    await insert("INSERT INTO weave_pending_advances (namespace_id, id, instance_id, step_id,"
                 " kind, state, due_at, created_at)",
                 "(%s, %s, %s, %s, 'ROOT', 'PENDING', %s, %s)",
                 [(namespace_id, i.advance_id, i.instance_id, i.root_id, when, when)
                  for i, _ in new])
    payloads = [{"definition": i.definition, "version": version.version,
                 "digest": version.digest.hex(), "business_key": i.business_key}
                for i, (_, version) in new]
    await append_events(cur, [
        EventRecord(namespace_id=namespace_id, id=i.event_id, aggregate_type="workflow_instance",
                    aggregate_id=i.instance_id, aggregate_revision=1,
                    event_type="workflow.started", from_state=None, to_state="RUNNING",
                    payload=payload)
        for (i, _), payload in zip(new, payloads, strict=True)])
    actor = principal.actor
    await insert(INSERT_AUDIT_PREFIX, INSERT_AUDIT_ROW, [
        (ids.new_id(), namespace_id, principal.application_id, actor.kind.value, actor.id,
         "workflow.started", "workflow_instance", i.instance_id, 1, None, None, None,
         jsondoc.dumps(payload), request_id)
        for (i, _), payload in zip(new, payloads, strict=True)])


async def start_instances(db: Database, principal: credentials.Principal, *, namespace: str,
                          items: Sequence[StartItem], request_id: str | None = None
                          ) -> list[Started]:
    """Start ``items`` in one transaction (see the module docstring); one answer per item, in
    order."""
    if not 1 <= len(items) <= MAX_BATCH:
        raise errors.ValidationFailed([{"path": "$.instances",
                                        "message": f"1-{MAX_BATCH} items"}])
    problems = _duplicates(items)
    if problems:
        raise errors.ValidationFailed(problems)
    last: list[tuple[bytes, list[Started]]] = []

    async def body(cur: Any) -> list[Started]:
        ns, grants = await credentials.authorize_with_grants(
            cur, principal, authz.Action.WORKFLOWS_START, namespace)
        pinned, now = await _pin(cur, grants, namespace, ns.id, items)
        scoped = [attrs.evolve(i, idem=attrs.evolve(i.idem, namespace_id=ns.id))
                  if i.idem is not None else i for i in items]
        keyed = [i for i in scoped if i.idem is not None]
        replays: dict[bytes, Replay] = {
            keyed[index].instance_id: replay
            for index, replay in (await idempotency.find_many(
                cur, [i.idem for i in keyed if i.idem is not None],
                where=[f"{i.path}.idempotency_key" for i in keyed])).items()}
        fresh = [i for i in scoped if i.instance_id not in replays]
        found: list[dict[str, str]] = []
        for item in fresh:
            _, version = pinned[(item.definition, item.version)]
            found += [{**p, "path": item.path + p["path"].removeprefix("$")}
                      for p in version.definition.input_problems(item.value)]
        if found:
            raise errors.ValidationFailed(found)
        receipts = {i.instance_id: _receipt(i, pinned[(i.definition, i.version)], ns.id, now)
                    for i in fresh}
        claimable = [i for i in fresh if i.idem is not None]
        if claimable:
            outcomes = await idempotency.record_many(cur, [
                idempotency.Entry(request=i.idem, record_id=i.record_id,
                                  response=Replay(status=201, body=receipts[i.instance_id],
                                                  resource_id=i.instance_id))
                for i in claimable if i.idem is not None],
                where=[f"{i.path}.idempotency_key" for i in claimable])
            for item, outcome in zip(claimable, outcomes, strict=True):
                if isinstance(outcome, Replay):
                    replays[item.instance_id] = outcome
        new = [(i, pinned[(i.definition, i.version)]) for i in fresh
               if i.instance_id not in replays]
        if new:
            await _insert(cur, ns.id, principal, new, now, request_id=request_id)
        result = [
            Started(instance_id=replays[i.instance_id].resource_id or i.instance_id,
                    receipt=replays[i.instance_id].body, replayed=True)
            if i.instance_id in replays
            else Started(instance_id=i.instance_id, receipt=receipts[i.instance_id],
                         replayed=False)
            for i in scoped]
        last[:] = [(ns.id, result)]
        return result

    async def recheck(cur: Any) -> list[Started] | None:
        if not last:
            return None
        namespace_id, result = last[0]
        new = [s.instance_id for s in result if not s.replayed]
        if not new:  # nothing was written: the body runs again and replays the same receipts
            return None
        await cur.execute("SELECT id FROM weave_instances WHERE namespace_id = %s AND id = %s"
                          " FOR UPDATE", (namespace_id, new[0]))
        return result if await cur.fetchone() is not None else None

    return await db.transaction(OPERATION + ".batch", body, recheck=recheck)

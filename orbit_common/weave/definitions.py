"""Workflow definitions and their immutable versions: create, publish, get, list, validate.

A definition is a name in a namespace; each published version is the validated canonical
document (docs/weave/language.md) with its SHA-256 digest, immutable (triggers refuse UPDATE and
DELETE). Publishing is one transaction: CAS on the definition's revision, the version row, its
version scope (the de-duplicated queue ids of its TASK steps and the digest, written once and
never updated; 000024), the event and the audit record; idempotent with an ``Idempotency-Key``
(platform/namespaced.py).

Authorization: ``workflows.manage`` (create, publish) and ``workflows.read`` are namespace-wide
actions; publishing also needs ``tasks.submit`` on every queue the version uses — a version
scope is never a grant by itself. The document is validated before the transaction, so bad
input writes nothing; what needs the database (the queues, the name, the revision) is checked
inside it.
"""

from __future__ import annotations

import collections
import datetime as dt
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.clock import as_utc, db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import digests, ids, jsondoc, names
from orbit_common.platform import authz, credentials, namespaced
from orbit_common.platform.audit import AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import tasks
from orbit_common.weave import language

DESCRIPTION_MAX = 512
LIST_MAX = 100


class DefinitionNotFound(errors.NotFound):
    code = "definition_not_found"
    title = "Workflow definition not found"


class VersionNotFound(errors.NotFound):
    code = "definition_version_not_found"
    title = "Workflow definition version not found"


class VersionScopeMismatch(errors.OrbitError):
    """A version scope whose digest is not its version's: the scope is not used (000024)."""

    status = 500
    code = "version_scope_mismatch"
    title = "The version scope does not match its version"


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


DEFINITION_COLUMNS = ("namespace_id, id, name, description, revision, latest_version,"
                      " created_by_credential_id, created_at, updated_at")


def definition_view(row: dict[str, Any], versions: list[dict[str, Any]] | None = None
                    ) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": row["id"].hex(), "name": row["name"], "description": row["description"],
        "revision": row["revision"], "latest_version": row["latest_version"] or None,
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
    }
    if versions is not None:
        view["versions"] = [version_view(v) for v in versions]
    return view


def version_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": row["version"], "digest": row["digest"].hex(),
        "document": jsondoc.RawJson(row["document"]) if "document" in row else None,
        "created_by": row["created_by_credential_id"].hex(),
        "created_at": _iso(row["created_at"]),
    }


@attrs.frozen(kw_only=True)
class Scope:
    """A version scope, verified against its version's digest."""

    definition_id: bytes
    version: int
    digest: bytes
    queue_ids: tuple[bytes, ...]


@attrs.frozen(kw_only=True)
class PinnedVersion:
    """A published version, its parsed definition and its verified scope."""

    definition_id: bytes
    version: int
    digest: bytes
    definition: language.Definition
    scope: Scope


# --- plumbing -----------------------------------------------------------------------------------


async def _by_name(cur: Any, namespace_id: bytes, name: str, *, lock: bool = False
                   ) -> dict[str, Any]:
    await cur.execute(f"SELECT {DEFINITION_COLUMNS} FROM weave_definitions"
                      " WHERE namespace_id = %s AND name = %s" + (" FOR UPDATE" if lock else ""),
                      (namespace_id, name))
    row = await cur.fetchone()
    if not names.found(row, "name", name):
        raise DefinitionNotFound(f"no workflow definition named {name!r} in this namespace")
    return dict(row)


def _locate(name: str, principal: credentials.Principal | None = None, namespace: str = "",
            queues: dict[str, str] | None = None) -> namespaced.Locate:
    """The definition exists, and ``principal`` may submit to each of ``queues`` (checked
    before an idempotent replay, so a credential that may not publish this document gets
    neither another caller's receipt nor a conflict)."""
    async def locate(cur: Any, namespace_id: bytes) -> None:
        await _by_name(cur, namespace_id, name)
        if principal is not None and queues:
            await queue_ids_for(cur, principal, namespace=namespace, namespace_id=namespace_id,
                                queues=queues)

    return locate


async def _versions(cur: Any, namespace_id: bytes, definition_id: bytes, *,
                    documents: bool = False) -> list[dict[str, Any]]:
    columns = "version, digest, created_by_credential_id, created_at"
    if documents:
        columns += ", document"
    await cur.execute(f"SELECT {columns} FROM weave_definition_versions"
                      " WHERE namespace_id = %s AND definition_id = %s ORDER BY version",
                      (namespace_id, definition_id))
    return [dict(r) for r in await cur.fetchall()]


async def _reload(cur: Any, namespace_id: bytes, definition_id: bytes, *,
                  documents: bool = False) -> dict[str, Any]:
    await cur.execute(f"SELECT {DEFINITION_COLUMNS} FROM weave_definitions"
                      " WHERE namespace_id = %s AND id = %s", (namespace_id, definition_id))
    row = await cur.fetchone()
    return definition_view(row, await _versions(cur, namespace_id, definition_id,
                                                documents=documents))


async def _audit(cur: Any, principal: credentials.Principal, namespace_id: bytes,  # noqa: PLR0917
                 definition_id: bytes, revision: int, event: str, payload: dict[str, Any],
                 request_id: str | None) -> None:
    await append_event(cur, namespace_id=namespace_id, aggregate_type="workflow_definition",
                       aggregate_id=definition_id, aggregate_revision=revision,
                       event_type=event, from_state=None, to_state=None, payload=payload)
    await append_audit(cur, AuditRecord(
        actor=principal.actor, action=event, resource_type="workflow_definition",
        resource_id=definition_id, resource_revision=revision, namespace_id=namespace_id,
        application_id=principal.application_id, reason=None, before=None, after=payload,
        request_id=request_id))


async def queue_ids_for(cur: Any, principal: credentials.Principal, *, namespace: str,
                        namespace_id: bytes, queues: dict[str, str]
                        ) -> tuple[bytes, ...]:
    """The ids of ``queues`` (sorted, distinct), each existing and allowed for ``tasks.submit``
    to ``principal`` (re-read in this transaction); a missing or uncovered queue is a
    ``definition_invalid`` problem at its first use (``queues`` maps each queue to the path of
    the first TASK step's ``queue`` field) naming it (an uncovered queue is reported like a
    missing one: no existence leak)."""
    if not queues:
        return ()
    grants = await credentials.recheck_principal(cur, principal)
    found = await tasks.queues_by_name(cur, namespace_id, list(queues))
    problems = [
        {"path": path, "code": "queue_not_found",
         "message": f"no queue {q!r} in this namespace that this credential may submit to"}
        for q, path in queues.items()
        if q not in found or not authz.allowed(grants, authz.Action.TASKS_SUBMIT.value,
                                               namespace, q)]
    if problems:
        raise errors.DefinitionInvalid(problems)
    return tuple(sorted({found[q].id for q in queues}))


def queue_paths(parsed: language.Definition) -> dict[str, str]:
    """Each queue of ``parsed`` and the path of the first TASK step's ``queue`` that names it."""
    paths: dict[str, str] = {}
    for step in sorted(parsed.all_steps.values(), key=lambda s: s.path):
        if isinstance(step, language.TaskStep):
            paths.setdefault(step.queue, f"{step.path}.queue")
    return paths


def _scope_text(queue_ids: tuple[bytes, ...]) -> str:
    return jsondoc.dumps([q.hex() for q in queue_ids])


# --- commands -----------------------------------------------------------------------------------


def validate(document: bytes) -> dict[str, Any]:
    """Validate without publishing (no database): the canonical digest and the queues used,
    or ``definition_invalid`` with every problem's path."""
    parsed = language.parse_definition(document)
    return {"valid": True, "digest": parsed.digest.hex(), "queues": list(parsed.queues)}


async def create_definition(db: Database, principal: credentials.Principal, *, namespace: str,
                            name: str, description: str = "",
                            idempotency_key: str | None = None,
                            request_id: str | None = None) -> Replay:
    """A new definition without versions (publish adds them). 201 with the definition."""
    problems = []
    if not names.is_valid_name(name):
        problems.append({"path": "$.name", "message": names.NAME_RULE})
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX:
        problems.append({"path": "$.description",
                         "message": f"at most {DESCRIPTION_MAX} characters"})
    if problems:
        raise errors.ValidationFailed(problems)
    definition_id = ids.new_id()
    idem = namespaced.request("workflows.definitions.create", idempotency_key, name.encode(),
                              {"name": name, "description": description}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        now = await db_now(cur)
        try:
            await cur.execute(
                "INSERT INTO weave_definitions (namespace_id, id, name, description, revision,"
                " latest_version, created_by_credential_id, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, 1, 0, %s, %s, %s)",
                (namespace_id, definition_id, name, description, principal.credential_id,
                 to_db(now), to_db(now)))
        except Exception as exc:
            if dberrors.is_duplicate(exc, "uq_weave_definitions_name"):
                raise errors.AlreadyExists(
                    f"workflow definition {name!r} already exists") from exc
            raise
        await _audit(cur, principal, namespace_id, definition_id, 1,
                     "workflow_definition.created", {"name": name}, request_id)
        return 201, await _reload(cur, namespace_id, definition_id), definition_id

    return await namespaced.run(
        db, "workflows.definitions.create", principal=principal,
        action=authz.Action.WORKFLOWS_MANAGE, namespace=namespace, idem=idem, act=act)


async def publish_version(db: Database, principal: credentials.Principal, *, namespace: str,
                          name: str, revision: int, document: bytes,
                          idempotency_key: str | None = None,
                          request_id: str | None = None) -> Replay:
    """Publish ``document`` as the next version; CAS on the definition's ``revision``. The
    version, its scope, the event and the audit record commit together. 201 with the
    definition (versions without documents) and the new version's number."""
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise errors.ValidationFailed([{"path": "$.revision", "message": "an integer ≥ 1"}])
    parsed = language.parse_definition(document)
    idem = namespaced.request("workflows.definitions.publish", idempotency_key, name.encode(),
                              {"revision": revision, "digest": parsed.digest.hex()}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _by_name(cur, namespace_id, name, lock=True)
        if row["revision"] != revision:
            raise errors.StaleRevision(
                f"workflow definition {name!r} is at revision {row['revision']}, not {revision}")
        queue_ids = await queue_ids_for(cur, principal, namespace=namespace,
                                        namespace_id=namespace_id, queues=queue_paths(parsed))
        now = await db_now(cur)
        version = row["latest_version"] + 1
        await cur.execute(
            "INSERT INTO weave_definition_versions (namespace_id, definition_id, version,"
            " document, digest, created_by_credential_id, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (namespace_id, row["id"], version, parsed.canonical.decode(), parsed.digest,
             principal.credential_id, to_db(now)))
        await cur.execute(
            "INSERT INTO weave_version_scopes (namespace_id, definition_id, version, digest,"
            " queue_ids, created_at) VALUES (%s, %s, %s, %s, %s, %s)",
            (namespace_id, row["id"], version, parsed.digest, _scope_text(queue_ids),
             to_db(now)))
        await cur.execute(
            "UPDATE weave_definitions SET latest_version = %s, revision = revision + 1,"
            " updated_at = %s WHERE namespace_id = %s AND id = %s AND revision = %s",
            (version, to_db(now), namespace_id, row["id"], revision))
        if cur.rowcount != 1:
            raise errors.StaleRevision(f"workflow definition {name!r} changed concurrently")
        await _audit(cur, principal, namespace_id, row["id"], revision + 1,
                     "workflow_definition.version_published",
                     {"version": version, "digest": parsed.digest.hex(),
                      "queues": list(parsed.queues)}, request_id)
        view = await _reload(cur, namespace_id, row["id"])
        return 201, {**view, "published_version": version}, row["id"]

    return await namespaced.run(
        db, "workflows.definitions.publish", principal=principal,
        action=authz.Action.WORKFLOWS_MANAGE, namespace=namespace, idem=idem, act=act,
        locate=_locate(name, principal, namespace, queue_paths(parsed)))


# --- reads --------------------------------------------------------------------------------------


PARSED_CACHE_SIZE = 256
_parsed_by_digest: collections.OrderedDict[bytes, language.Definition] = (
    collections.OrderedDict())


def _parsed(digest: bytes, document: bytes) -> language.Definition:
    """The validated model of a version's document, by its digest (the caller has checked
    that ``document`` hashes to it): parsing re-runs the validator and its CEL type checks,
    the dearest part of starting an instance, and a published document never changes. A few
    hundred recent versions are kept per process."""
    found = _parsed_by_digest.get(digest)
    if found is None:
        found = _parsed_by_digest[digest] = language.parse_definition(document)
        while len(_parsed_by_digest) > PARSED_CACHE_SIZE:
            _parsed_by_digest.popitem(last=False)
    else:
        _parsed_by_digest.move_to_end(digest)
    return found


VERSION_COLUMNS = ("v.document, v.digest, s.digest AS scope_digest, s.queue_ids")
VERSION_JOIN = (" LEFT JOIN weave_version_scopes s ON s.namespace_id = v.namespace_id"
                " AND s.definition_id = v.definition_id AND s.version = v.version")


def _pinned(row: dict[str, Any], definition_id: bytes, version: int) -> PinnedVersion:
    """A version read with :data:`VERSION_COLUMNS`, re-validated from its stored document, with
    its scope verified against the version's digest (the stored digest, and the digest of the
    stored bytes)."""
    document = row["document"].encode()
    if (row["scope_digest"] is None or row["scope_digest"] != row["digest"]
            or digests.sha256(document) != row["digest"]):
        raise VersionScopeMismatch(
            f"version {version}'s scope or document does not match its digest")
    parsed = _parsed(row["digest"], document)
    scope = Scope(definition_id=definition_id, version=version, digest=row["digest"],
                  queue_ids=tuple(bytes.fromhex(q) for q in jsondoc.loads_strict(
                      row["queue_ids"])))
    return PinnedVersion(definition_id=definition_id, version=version, digest=row["digest"],
                         definition=parsed, scope=scope)


async def load_version(cur: Any, namespace_id: bytes, definition_id: bytes,
                       version: int) -> PinnedVersion:
    """A published version, re-validated from its stored document, with its scope verified
    against the version's digest (the stored digest, and the digest of the stored bytes)."""
    await cur.execute(
        f"SELECT {VERSION_COLUMNS} FROM weave_definition_versions v{VERSION_JOIN}"
        " WHERE v.namespace_id = %s AND v.definition_id = %s AND v.version = %s",
        (namespace_id, definition_id, version))
    row = await cur.fetchone()
    if row is None:
        raise VersionNotFound(f"no version {version} of this workflow definition")
    return _pinned(row, definition_id, version)


_DEFINITION_FIELDS = tuple(c.strip() for c in DEFINITION_COLUMNS.split(","))
PIN_BY_NAME = (
    "SELECT " + ", ".join("d." + c for c in _DEFINITION_FIELDS)
    + f", v.version AS pinned_version, {VERSION_COLUMNS}, UTC_TIMESTAMP(6) AS now"
    " FROM weave_definitions d LEFT JOIN weave_definition_versions v"
    " ON v.namespace_id = d.namespace_id AND v.definition_id = d.id"
    " AND v.version = COALESCE(%s, d.latest_version)" + VERSION_JOIN
    + " WHERE d.namespace_id = %s AND d.name = %s"
)


async def pin_by_name(cur: Any, namespace_id: bytes, name: str, version: int | None
                      ) -> tuple[dict[str, Any], PinnedVersion | None, dt.datetime]:
    """The definition named ``name``, its version ``version`` (None: the latest) verified as
    :func:`load_version` does, and the database clock -- one statement, for a start. The
    version is None when the definition has none yet (and none was asked for).

    Raises :class:`DefinitionNotFound`, :class:`VersionNotFound` or
    :class:`VersionScopeMismatch`."""
    await cur.execute(PIN_BY_NAME, (version, namespace_id, name))
    row = await cur.fetchone()
    if not names.found(row, "name", name):
        raise DefinitionNotFound(f"no workflow definition named {name!r} in this namespace")
    definition = {c: row[c] for c in _DEFINITION_FIELDS}
    number = version if version is not None else definition["latest_version"]
    if number == 0:
        return definition, None, as_utc(row["now"])
    if row["pinned_version"] is None:
        raise VersionNotFound(f"no version {number} of this workflow definition")
    return definition, _pinned(row, definition["id"], number), as_utc(row["now"])


async def get_definition(db: Database, principal: credentials.Principal, *, namespace: str,
                         name: str, documents: bool = True) -> dict[str, Any]:
    """The definition with its versions (and their documents)."""
    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await definition_detail(cur, ns.id, name, documents=documents)

    return await db.read("workflows.definitions.get", body)


async def definition_detail(cur: Any, namespace_id: bytes, name: str, *,
                            documents: bool = False) -> dict[str, Any]:
    """The definition named ``name`` with its versions (and their documents)."""
    row = await _by_name(cur, namespace_id, name)
    return await _reload(cur, namespace_id, row["id"], documents=documents)


async def list_definitions(db: Database, principal: credentials.Principal, *, namespace: str,
                           after: str = "", limit: int = LIST_MAX) -> list[dict[str, Any]]:
    """Definitions in name order after ``after`` (a name), at most ``limit``."""
    check_limit(limit)

    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await definitions_after(cur, ns.id, after, limit)

    return await db.read("workflows.definitions.list", body)


def check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_MAX:
        raise errors.ValidationFailed([{"path": "limit", "message": f"1-{LIST_MAX}"}])


async def definitions_after(cur: Any, namespace_id: bytes, after: str, limit: int
                            ) -> list[dict[str, Any]]:
    """At most ``limit`` definitions in name order after the name ``after``."""
    await cur.execute(f"SELECT {DEFINITION_COLUMNS} FROM weave_definitions"
                      " WHERE namespace_id = %s AND name > %s ORDER BY name LIMIT %s",
                      (namespace_id, after, limit))
    return [definition_view(r) for r in await cur.fetchall()]


async def get_version(db: Database, principal: credentials.Principal, *, namespace: str,
                      name: str, version: int) -> dict[str, Any]:
    """One published version of ``name`` with its document (``workflows.read``)."""
    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_READ, namespace)
        return await version_detail(cur, ns.id, name, version)

    return await db.read("workflows.definitions.version", body)


async def version_detail(cur: Any, namespace_id: bytes, name: str, version: int
                         ) -> dict[str, Any]:
    """Version ``version`` of the definition ``name``, with its document."""
    row = await _by_name(cur, namespace_id, name)
    await cur.execute("SELECT version, digest, created_by_credential_id, created_at, document"
                      " FROM weave_definition_versions WHERE namespace_id = %s"
                      " AND definition_id = %s AND version = %s",
                      (namespace_id, row["id"], version))
    found = await cur.fetchone()
    if found is None:
        raise VersionNotFound(f"workflow definition {name!r} has no version {version}")
    return {"definition": row["name"], **version_view(dict(found))}


async def check_document(db: Database, principal: credentials.Principal, *, namespace: str,
                         document: bytes) -> dict[str, Any]:
    """Validate without publishing, as a publish in ``namespace`` would (``workflows.manage``):
    the document, then its queues (each existing and allowed for ``tasks.submit``); the digest
    and the queues, or ``definition_invalid``. Writes nothing."""
    parsed = language.parse_definition(document)

    async def body(cur: Any) -> None:
        ns = await credentials.authorize(cur, principal, authz.Action.WORKFLOWS_MANAGE,
                                         namespace)
        await queue_ids_for(cur, principal, namespace=namespace, namespace_id=ns.id,
                            queues=queue_paths(parsed))

    await db.read("workflows.definitions.validate", body)
    return {"valid": True, "digest": parsed.digest.hex(), "queues": list(parsed.queues)}

"""Platform use cases: each composes authorization, idempotency and one domain transaction.

These are what the API handlers and ``orbit admin`` call. Ids and the request digest are made
before the transaction runner is entered, so a re-run (deadlock, lost connection, unknown commit)
carries the same operation identity.
"""

from __future__ import annotations

from typing import Any

import attrs

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import PLATFORM_NAMESPACE_ID, authz, idempotency
from orbit_common.platform import applications as apps
from orbit_common.platform import credentials as creds
from orbit_common.platform import namespaces as nss
from orbit_common.platform.audit import Actor
from orbit_common.platform.idempotency import IdempotencyRequest, Replay

PAGE_MAX = 500


def namespace_view(namespace: nss.Namespace) -> dict[str, Any]:
    """The public representation of a namespace (docs/api/namespaces.md)."""
    return {
        "id": namespace.id.hex(),
        "name": namespace.name,
        "description": namespace.description,
        "state": namespace.state.value,
        "revision": namespace.revision,
        "created_at": namespace.created_at.isoformat(timespec="microseconds"),
        "updated_at": namespace.updated_at.isoformat(timespec="microseconds"),
    }


async def create_namespace(
    db: Database,
    principal: creds.Principal,
    *,
    name: str,
    description: str,
    idempotency_key: str | None,
    request_id: str | None = None,
) -> Replay:
    """``POST /v1/namespaces``: create a namespace in the caller's application.

    Locks, in order: the idempotency identity (if a key is given), the new namespace row.
    """
    namespace_id = ids.new_id()
    idem = None
    if idempotency_key is not None:
        idem = IdempotencyRequest.build(
            namespace_id=PLATFORM_NAMESPACE_ID,
            operation="namespaces.create",
            scope=principal.application_id,
            key=idempotency_key,
            request={"name": name, "description": description},
            credential_id=principal.credential_id,
        )

    async def body(cur: Any) -> Replay:
        await creds.authorize_platform(cur, principal, authz.Action.NAMESPACES_CREATE, name)

        async def effect() -> Replay:
            namespace = await nss.create_namespace(
                cur,
                namespace_id=namespace_id,
                application_id=principal.application_id,
                name=name,
                description=description,
                actor=principal.actor,
                request_id=request_id,
            )
            return Replay(status=201, body=namespace_view(namespace), resource_id=namespace.id)

        return await idempotency.once(cur, idem, effect)

    async def recheck(cur: Any) -> Replay | None:
        if idem is not None:
            return await idempotency.lookup(cur, idem)
        await cur.execute(nss.SELECT_BY_ID + " LOCK IN SHARE MODE", (namespace_id,))
        row = await cur.fetchone()
        if row is None:
            return None
        return Replay(status=201, body=namespace_view(nss.Namespace.from_row(row)),
                      resource_id=namespace_id)

    return await db.transaction("namespaces.create", body, recheck=recheck)


async def set_namespace_state(
    db: Database,
    principal: creds.Principal,
    *,
    name: str,
    disabled: bool,
    reason: str | None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """``POST /v1/namespaces/{namespace}/disable`` and ``…/enable``; idempotent.

    Authorized like creation (the namespace may be disabled, so it is named, not looked up):
    ``namespaces.manage`` on the name, then the namespace must be the caller's application's.
    Locks: the namespace row (:func:`nss.set_namespace_state`).
    """
    to = nss.NamespaceState.DISABLED if disabled else nss.NamespaceState.ACTIVE

    async def body(cur: Any) -> dict[str, Any]:
        await creds.authorize_platform(cur, principal, authz.Action.NAMESPACES_MANAGE, name)
        namespace = await nss.set_namespace_state(
            cur, name=name, to=to, actor=principal.actor, reason=reason or "",
            application_id=principal.application_id, request_id=request_id)
        return namespace_view(namespace)

    async def recheck(_cur: Any) -> dict[str, Any] | None:
        return None  # re-running is safe: a repeated change is a no-op

    return await db.transaction("namespaces.disable" if disabled else "namespaces.enable",
                                body, recheck=recheck)


@attrs.frozen(kw_only=True)
class Page:
    items: list[dict[str, Any]]
    last_name: str | None


async def list_namespaces(
    db: Database, principal: creds.Principal, *, after_name: str, limit: int
) -> Page:
    """Namespaces of the caller's application that it may read, by name."""

    async def body(cur: Any) -> Page:
        grants = await creds.recheck_principal(cur, principal)
        items: list[dict[str, Any]] = []
        cursor = after_name
        exhausted = False
        # Rows the credential may not read are skipped; scan a bounded number of batches.
        for _ in range(10):
            batch = await nss.list_namespaces(
                cur, application_id=principal.application_id, after_name=cursor, limit=limit
            )
            for namespace in batch:
                cursor = namespace.name
                if namespace.state is nss.NamespaceState.ACTIVE and authz.allowed(
                    grants, authz.Action.NAMESPACES_READ, namespace.name
                ):
                    items.append(namespace_view(namespace))
                    if len(items) == limit:
                        break
            if len(items) == limit or len(batch) < limit:
                exhausted = len(batch) < limit and len(items) < limit
                break
        return Page(items=items, last_name=None if exhausted else cursor)

    return await db.read("namespaces.list", body)


async def whoami(db: Database, principal: creds.Principal) -> dict[str, Any]:
    """The caller's application, credential, grants and the namespaces it can see."""

    async def body(cur: Any) -> dict[str, Any]:
        grants = await creds.recheck_principal(cur, principal)
        visible = [
            ns.name
            for ns in await nss.list_namespaces(
                cur, application_id=principal.application_id, limit=PAGE_MAX
            )
            if ns.state is nss.NamespaceState.ACTIVE and authz.sees_namespace(grants, ns.name)
        ]
        return {
            "application": {
                "id": principal.application_id.hex(),
                "name": principal.application_name,
            },
            "credential": {
                "id": principal.credential_id.hex(),
                "name": principal.credential_name,
                "prefix": principal.prefix,
            },
            "grants": [g.to_json() for g in grants],
            "namespaces": visible,
        }

    return await db.read("whoami", body)


@attrs.frozen(kw_only=True)
class Bootstrap:
    application: apps.Application
    namespace: nss.Namespace
    issued: creds.IssuedKey


async def bootstrap(
    db: Database, *, application: str, namespace: str, credential: str, actor: Actor
) -> Bootstrap:
    """Create an application, a namespace and an all-access credential in one transaction."""
    app_id, ns_id, cred_id = ids.new_id(), ids.new_id(), ids.new_id()

    async def body(cur: Any) -> Bootstrap:
        app = await apps.create_application(cur, app_id=app_id, name=application, actor=actor)
        ns = await nss.create_namespace(
            cur, namespace_id=ns_id, application_id=app.id, name=namespace, description="",
            actor=actor,
        )
        issued = await creds.create_credential(
            cur, credential_id=cred_id, application_id=app.id, name=credential,
            grants=authz.ALL_ACCESS, actor=actor,
        )
        return Bootstrap(application=app, namespace=ns, issued=issued)

    # No recheck: the secret exists only in this process, so an unknown commit is reported
    # (the operator re-runs bootstrap under other names or revokes the credential).
    return await db.transaction("platform.bootstrap", body)

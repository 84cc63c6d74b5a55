"""``orbit admin``'s transactions: applications, namespaces and credentials, by name.

Each function is one transaction over the domain bodies of ``applications.py``,
``namespaces.py`` and ``credentials.py`` (their docstrings state what they lock). New ids are
drawn before the transaction, so a re-run carries the same identity. Listings read every page
in one read-only transaction (keyset pages of :data:`PAGE` rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orbit_common.db.pool import Database
from orbit_common.model import ids
from orbit_common.platform import applications as apps
from orbit_common.platform import authz
from orbit_common.platform import credentials as creds
from orbit_common.platform import namespaces as nss
from orbit_common.platform.audit import Actor

PAGE = 500  # rows per keyset page when a command lists everything


async def create_application(db: Database, *, name: str, actor: Actor) -> apps.Application:
    app_id = ids.new_id()
    return await db.transaction("applications.create", lambda cur: apps.create_application(
        cur, app_id=app_id, name=name, actor=actor))


async def list_applications(db: Database) -> list[apps.Application]:
    async def every(cur: Any) -> list[apps.Application]:
        found: list[apps.Application] = []
        while True:
            page = await apps.list_applications(
                cur, after_name=found[-1].name if found else "", limit=PAGE)
            found.extend(page)
            if len(page) < PAGE:
                return found

    return await db.read("applications.list", every)


async def disable_application(db: Database, *, name: str, actor: Actor,
                              reason: str) -> apps.Application:
    """Disable an application: all its credentials stop working at once."""
    return await db.transaction("applications.disable", lambda cur: apps.disable_application(
        cur, name=name, actor=actor, reason=reason))


async def create_namespace(db: Database, *, name: str, application: str, description: str,
                           actor: Actor) -> nss.Namespace:
    namespace_id = ids.new_id()

    async def body(cur: Any) -> nss.Namespace:
        app = await apps.find_application(cur, application)
        return await nss.create_namespace(
            cur, namespace_id=namespace_id, application_id=app.id, name=name,
            description=description, actor=actor)

    return await db.transaction("namespaces.create", body)


async def set_namespace_state(db: Database, *, name: str, to: nss.NamespaceState, actor: Actor,
                              reason: str) -> nss.Namespace:
    """Disable or enable a namespace (audited, idempotent)."""
    return await db.transaction(
        "namespaces.disable" if to is nss.NamespaceState.DISABLED else "namespaces.enable",
        lambda cur: nss.set_namespace_state(cur, name=name, to=to, actor=actor, reason=reason))


async def list_namespaces(db: Database, *, application: str) -> list[nss.Namespace]:
    async def body(cur: Any) -> list[nss.Namespace]:
        app = await apps.find_application(cur, application)
        found: list[nss.Namespace] = []
        while True:
            page = await nss.list_namespaces(
                cur, application_id=app.id, after_name=found[-1].name if found else "",
                limit=PAGE)
            found.extend(page)
            if len(page) < PAGE:
                return found

    return await db.read("namespaces.list", body)


async def create_credential(db: Database, *, name: str, application: str,
                            grants: Sequence[authz.Grant], actor: Actor) -> creds.IssuedKey:
    """A credential; the API key exists only in the returned value (stored as a digest)."""
    credential_id = ids.new_id()

    async def body(cur: Any) -> creds.IssuedKey:
        app = await apps.find_application(cur, application)
        return await creds.create_credential(
            cur, credential_id=credential_id, application_id=app.id, name=name, grants=grants,
            actor=actor)

    return await db.transaction("credentials.create", body)


async def list_credentials(db: Database, *, application: str) -> list[creds.Credential]:
    async def body(cur: Any) -> list[creds.Credential]:
        app = await apps.find_application(cur, application)
        return await creds.list_credentials(cur, application_id=app.id)

    return await db.read("credentials.list", body)


async def revoke_credential(db: Database, *, prefix: str, actor: Actor,
                            reason: str) -> creds.Credential:
    """Revoke a credential by its public prefix; it stops working at once."""
    return await db.transaction("credentials.revoke", lambda cur: creds.revoke_credential(
        cur, prefix=prefix, actor=actor, reason=reason))

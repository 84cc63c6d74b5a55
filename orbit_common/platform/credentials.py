"""API credentials and the authentication/authorization transactions.

Key format: ``orb_<prefix>_<secret>``. ``prefix`` (12 lowercase hex characters) is public and
unique: it finds the row. Only the SHA-256 of the whole key is stored, and compared in constant
time. The key itself is returned once, by :func:`create_credential`, and never again.

Authorization is decided inside the transaction that uses the resource: :func:`authorize`
re-reads the credential, its application and the namespace in that transaction, so a revoked
credential or a disabled application stops working at the next statement that needs it, and a
resource id in a request is never trusted on its own.
"""

from __future__ import annotations

import datetime as dt
import enum
import hmac
import re
import secrets
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.batch import placeholders
from orbit_common.db.clock import as_utc
from orbit_common.model import digests, ids
from orbit_common.platform import PLATFORM_NAMESPACE_ID, authz
from orbit_common.platform.applications import ApplicationState, check_name
from orbit_common.platform.audit import Actor, ActorKind, AuditRecord, append_audit
from orbit_common.platform.console_seat import ConsoleSeat, check_seat
from orbit_common.platform.events import append_event
from orbit_common.platform.namespaces import Namespace, NamespaceState, find_namespace

KEY_PATTERN = re.compile(r"\Aorb_([0-9a-f]{12})_([A-Za-z0-9_-]{43})\Z")


class CredentialState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    REVOKED = "REVOKED"


@attrs.frozen(kw_only=True)
class Credential:
    id: bytes
    application_id: bytes
    name: str
    prefix: str
    grants: tuple[authz.Grant, ...]
    state: CredentialState
    revision: int
    created_by: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    revoked_reason: str | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Credential:
        return cls(
            id=row["id"],
            application_id=row["application_id"],
            name=row["name"],
            prefix=row["prefix"],
            grants=authz.grants_from_db(row["grants"]),
            state=CredentialState(row["state"]),
            revision=row["revision"],
            created_by=row["created_by"],
            created_at=as_utc(row["created_at"]),
            revoked_at=as_utc(row["revoked_at"]) if row["revoked_at"] else None,
            revoked_reason=row["revoked_reason"],
        )

    def summary(self) -> dict[str, Any]:
        return {"id": self.id.hex(), "name": self.name, "prefix": self.prefix,
                "state": self.state.value, "revision": self.revision,
                "grants": [g.to_json() for g in self.grants]}


@attrs.frozen(kw_only=True)
class Principal:
    """An authenticated caller. A snapshot: every transaction re-checks it (:func:`authorize`).

    A console request's principal is the administrator's bound credential with ``console`` set:
    its actor is the console, and every re-check also re-checks the console session.
    """

    credential_id: bytes
    credential_name: str
    prefix: str
    application_id: bytes
    application_name: str
    grants: tuple[authz.Grant, ...]
    console: ConsoleSeat | None = None

    @property
    def actor(self) -> Actor:
        if self.console is not None:
            return self.console.actor(self.credential_id)
        return Actor(kind=ActorKind.CREDENTIAL, id=self.credential_id.hex())


@attrs.frozen(kw_only=True)
class IssuedKey:
    """A newly created credential with its secret, shown exactly once."""

    credential: Credential
    api_key: str = attrs.field(repr=False)


def key_digest(api_key: str) -> bytes:
    return digests.sha256(api_key.encode("ascii"))


def generate_key() -> tuple[str, str]:
    """A fresh ``(prefix, api_key)``."""
    prefix = secrets.token_hex(6)
    return prefix, f"orb_{prefix}_{secrets.token_urlsafe(32)}"


COLUMNS = (
    "id, application_id, name, prefix, grants, state, revision, created_by, created_at,"
    " revoked_at, revoked_reason"
)
INSERT_CREDENTIAL = """
INSERT INTO orbit_credentials (id, application_id, name, prefix, secret_digest, grants, state,
  revision, created_by, created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, 'ACTIVE', 1, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
SELECT_BY_ID = f"SELECT {COLUMNS} FROM orbit_credentials WHERE id = %s"
SELECT_BY_PREFIX_FOR_UPDATE = (
    f"SELECT {COLUMNS} FROM orbit_credentials WHERE prefix = %s FOR UPDATE"
)
LIST_FOR_APPLICATION = f"""
SELECT {COLUMNS} FROM orbit_credentials WHERE application_id = %s ORDER BY created_at, id
"""
# Hot query of every request (uq_credentials_prefix, then the application by primary key).
AUTHENTICATE = """
SELECT c.id, c.name, c.prefix, c.secret_digest, c.grants, c.state, c.application_id,
       a.name AS application_name, a.state AS application_state
FROM orbit_credentials c
JOIN orbit_applications a ON a.id = c.application_id
WHERE c.prefix = %s
"""
REVOKE_IF_REVISION = """
UPDATE orbit_credentials
SET state = 'REVOKED', revoked_at = UTC_TIMESTAMP(6), revoked_reason = %s,
    updated_at = UTC_TIMESTAMP(6), revision = revision + 1
WHERE id = %s AND revision = %s AND state = 'ACTIVE'
"""


async def create_credential(
    cur: Any,
    *,
    credential_id: bytes,
    application_id: bytes,
    name: str,
    grants: Sequence[authz.Grant],
    actor: Actor,
) -> IssuedKey:
    """Create a credential for an active application; the key is returned once.

    Locks: the application row (shared, so a concurrent disable serialises with it), the new row.
    """
    check_name(name, "credential")
    await cur.execute(
        "SELECT state FROM orbit_applications WHERE id = %s LOCK IN SHARE MODE", (application_id,)
    )
    row = await cur.fetchone()
    if row is None:
        raise errors.ApplicationNotFound()
    if row["state"] != ApplicationState.ACTIVE:
        raise errors.Conflict("the application is disabled")
    prefix, api_key = generate_key()
    await cur.execute(
        INSERT_CREDENTIAL,
        (ids.check_id(credential_id), application_id, name, prefix, key_digest(api_key),
         authz.grants_to_db(grants), actor.describe()),
    )
    credential = await get_credential(cur, credential_id)
    await append_event(
        cur, namespace_id=PLATFORM_NAMESPACE_ID, aggregate_type="credential",
        aggregate_id=credential.id, aggregate_revision=credential.revision,
        event_type="credential.created", from_state=None, to_state=credential.state.value,
        payload=credential.summary(),
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action="credential.create", resource_type="credential",
        resource_id=credential.id, resource_revision=credential.revision,
        application_id=application_id, after=credential.summary(),
    ))
    return IssuedKey(credential=credential, api_key=api_key)


async def get_credential(cur: Any, credential_id: bytes) -> Credential:
    await cur.execute(SELECT_BY_ID, (credential_id,))
    row = await cur.fetchone()
    if row is None:
        raise errors.CredentialNotFound()
    return Credential.from_row(row)


async def list_credentials(cur: Any, *, application_id: bytes) -> list[Credential]:
    await cur.execute(LIST_FOR_APPLICATION, (application_id,))
    return [Credential.from_row(r) for r in await cur.fetchall()]


async def revoke_credential(
    cur: Any, *, prefix: str, actor: Actor, reason: str | None
) -> Credential:
    """Revoke a credential by its public prefix; idempotent. Locks: the credential row."""
    await cur.execute(SELECT_BY_PREFIX_FOR_UPDATE, (prefix,))
    row = await cur.fetchone()
    if row is None:
        raise errors.CredentialNotFound(f"no credential with prefix {prefix!r}")
    before = Credential.from_row(row)
    if before.state is CredentialState.REVOKED:
        return before
    await cur.execute(REVOKE_IF_REVISION, (reason, before.id, before.revision))
    if cur.rowcount != 1:
        raise errors.StaleRevision("the credential changed concurrently")
    after = await get_credential(cur, before.id)
    await append_event(
        cur, namespace_id=PLATFORM_NAMESPACE_ID, aggregate_type="credential",
        aggregate_id=after.id, aggregate_revision=after.revision,
        event_type="credential.revoked", from_state=before.state.value,
        to_state=after.state.value, payload=after.summary(),
    )
    await append_audit(cur, AuditRecord(
        actor=actor, action="credential.revoke", resource_type="credential",
        resource_id=after.id, resource_revision=after.revision,
        application_id=after.application_id, reason=reason, before=before.summary(),
        after=after.summary(),
    ))
    return after


async def authenticate(cur: Any, api_key: str) -> Principal:
    """Resolve an API key to a principal, or raise :class:`errors.InvalidCredential`.

    Unknown prefix, wrong secret, revoked credential and disabled application all give the same
    error, so a caller learns nothing about which part was wrong.
    """
    match = KEY_PATTERN.match(api_key)
    if match is None:
        raise errors.InvalidCredential()
    await cur.execute(AUTHENTICATE, (match.group(1),))
    row = await cur.fetchone()
    digest = key_digest(api_key)
    if row is None:
        hmac.compare_digest(digest, bytes(32))  # same work whether or not the prefix exists
        raise errors.InvalidCredential()
    if not hmac.compare_digest(digest, row["secret_digest"]):
        raise errors.InvalidCredential()
    if (
        row["state"] != CredentialState.ACTIVE
        or row["application_state"] != ApplicationState.ACTIVE
    ):
        raise errors.InvalidCredential()
    return Principal(
        credential_id=row["id"],
        credential_name=row["name"],
        prefix=row["prefix"],
        application_id=row["application_id"],
        application_name=row["application_name"],
        grants=authz.grants_from_db(row["grants"]),
    )


RECHECK = """
SELECT c.state, c.grants, a.state AS application_state
FROM orbit_credentials c
JOIN orbit_applications a ON a.id = c.application_id
WHERE c.id = %s AND c.application_id = %s
"""


async def recheck_principal(cur: Any, principal: Principal) -> tuple[authz.Grant, ...]:
    """Re-read the credential and application in the caller's transaction; current grants. A
    console principal's session is re-checked too (:func:`console_seat.check_seat`)."""
    await cur.execute(RECHECK, (principal.credential_id, principal.application_id))
    row = await cur.fetchone()
    if (
        row is None
        or row["state"] != CredentialState.ACTIVE
        or row["application_state"] != ApplicationState.ACTIVE
    ):
        raise errors.InvalidCredential()
    if principal.console is not None:
        await check_seat(cur, principal.console, principal.credential_id)
    return authz.grants_from_db(row["grants"])


CREDENTIAL_GRANTS = """
SELECT c.grants FROM orbit_credentials c
JOIN orbit_applications a ON a.id = c.application_id
WHERE c.id = %s AND c.state = 'ACTIVE' AND a.state = 'ACTIVE'
"""


# The dispatcher's re-check of its open sessions' credentials (by primary key).
ACTIVE_AMONG = """
SELECT c.id FROM orbit_credentials c
JOIN orbit_applications a ON a.id = c.application_id
WHERE c.id IN ({}) AND c.state = 'ACTIVE' AND a.state = 'ACTIVE'
"""


async def active_among(cur: Any, credential_ids: Sequence[bytes]) -> set[bytes]:
    """Which of ``credential_ids`` are ACTIVE credentials of ACTIVE applications (one read)."""
    ordered = sorted(set(credential_ids))
    if not ordered:
        return set()
    await cur.execute(ACTIVE_AMONG.format(placeholders(len(ordered))), ordered)
    return {row["id"] for row in await cur.fetchall()}


NAMESPACE_STATE = "SELECT state FROM orbit_namespaces WHERE id = %s"


async def active_grants(cur: Any, credential_id: bytes, *, namespace_id: bytes | None = None
                        ) -> tuple[authz.Grant, ...]:
    """The grants of an active credential of an active application, or InvalidCredential;
    with ``namespace_id``, that namespace must be active too (else NamespaceNotFound)."""
    await cur.execute(CREDENTIAL_GRANTS, (credential_id,))
    row = await cur.fetchone()
    if row is None:
        raise errors.InvalidCredential()
    if namespace_id is not None:
        await cur.execute(NAMESPACE_STATE, (namespace_id,))
        namespace = await cur.fetchone()
        if namespace is None or namespace["state"] != NamespaceState.ACTIVE:
            raise errors.NamespaceNotFound("the namespace is disabled")
    return authz.grants_from_db(row["grants"])


async def authorize(
    cur: Any, principal: Principal, action: authz.Action, namespace_name: str,
    queue: str | None = None,
) -> Namespace:
    """Check, inside the caller's transaction, that ``principal`` may do ``action`` there.

    Returns the namespace row. A namespace that does not exist, belongs to another application,
    is disabled, or is not covered by any grant is reported as not found (no existence leak);
    one the credential can see but not act on is forbidden.
    """
    namespace, _ = await authorize_with_grants(cur, principal, action, namespace_name, queue)
    return namespace


async def authorize_with_grants(
    cur: Any, principal: Principal, action: authz.Action, namespace_name: str,
    queue: str | None = None,
) -> tuple[Namespace, tuple[authz.Grant, ...]]:
    """:func:`authorize`, also returning the grants it re-read in the caller's transaction
    (for a caller that checks more actions in it without reading the credential again)."""
    grants = await recheck_principal(cur, principal)
    namespace = await find_namespace(cur, namespace_name)
    if (
        namespace is None
        or namespace.application_id != principal.application_id
        or namespace.state is not NamespaceState.ACTIVE
        or not authz.sees_namespace(grants, namespace_name)
    ):
        raise errors.NamespaceNotFound(f"no namespace {namespace_name!r} for this credential")
    if not authz.allowed(grants, action.value, namespace_name, queue):
        raise errors.Forbidden(f"the credential may not {action.value} in {namespace_name!r}")
    return namespace, grants


async def authorize_platform(
    cur: Any, principal: Principal, action: authz.Action, namespace_name: str
) -> None:
    """Authorization for an action on a namespace that may not exist yet (creation)."""
    grants = await recheck_principal(cur, principal)
    if not authz.allowed(grants, action.value, namespace_name):
        raise errors.Forbidden(f"the credential may not {action.value} {namespace_name!r}")

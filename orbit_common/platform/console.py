"""The console's identity: one administrator account and its sessions (specification 000029).

Account (``orbit_console_users``): at most one row (``seat = 1``, unique). Its password is kept
only as a bcrypt hash (cost :data:`BCRYPT_COST`); a password over :data:`PASSWORD_MAX_BYTES`
UTF-8 bytes is refused, never silently cut (bcrypt reads only 72 bytes). The account is bound to
an API credential: a console request acts as that credential (its grants, checked inside each
domain transaction) with the console as the audit actor (:mod:`.console_seat`).
:func:`set_password` (``orbit admin console set-password``) creates or resets the account and
revokes every session in the same transaction.

Sessions (``orbit_console_sessions``): a login draws a 256-bit random token, sets it as an
HttpOnly cookie and stores only its SHA-256. A session ends at ``idle_expires_at`` (last use plus
the idle limit, refreshed at most every :data:`TOUCH_EVERY` of the idle limit) or
``absolute_expires_at`` (login plus the absolute limit), database time, whichever comes first,
or when revoked (logout, password change).

Login throttling: consecutive failures are counted on the account row; the
``login_max_failures``-th sets ``throttled_until`` (database time plus ``login_lockout_s``) and
every login before it is refused without checking the password. A wrong name counts against the
account like a wrong password (there is one account). bcrypt runs outside every transaction.

Locks: :func:`set_password` and the login's recording transaction lock the account row, then the
account's session rows; nothing else locks them, so they sit apart from the domain lock order
(docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import hmac
import secrets
from typing import Any

import attrs
import bcrypt

from orbit_common import errors
from orbit_common.db.clock import as_utc
from orbit_common.db.pool import Database
from orbit_common.model import digests, ids
from orbit_common.platform import authz
from orbit_common.platform.applications import ApplicationState
from orbit_common.platform.audit import Actor, ActorKind, AuditRecord, append_audit
from orbit_common.platform.console_seat import ConsoleSeat
from orbit_common.platform.credentials import KEY_PATTERN, CredentialState, Principal

BCRYPT_COST = 12
PASSWORD_MAX_BYTES = 72  # bcrypt's limit; longer passwords are refused, not truncated
PASSWORD_MIN_CHARS = 12
NAME_MAX = 64
DEFAULT_NAME = "admin"
TOUCH_EVERY = 0.1  # refresh last use when this fraction of the idle limit has passed
USER_AGENT_MAX = 255

@functools.cache
def _dummy_hash() -> bytes:
    """Checked against when there is no account, so that the answer takes as long as a real
    check (same cost). A hash of a random password: nothing verifies against it."""
    return bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(BCRYPT_COST))


@attrs.frozen(kw_only=True)
class SessionPolicy:
    """The ``[console]`` limits a login and a session check apply."""

    idle_timeout_s: int
    absolute_timeout_s: int
    login_max_failures: int
    login_lockout_s: int


@attrs.frozen(kw_only=True)
class ConsoleUser:
    id: bytes
    name: str
    credential_id: bytes
    revision: int
    password_changed_at: dt.datetime

    def summary(self, *, credential_prefix: str) -> dict[str, Any]:
        """The audited view: never the hash."""
        return {"id": self.id.hex(), "name": self.name, "revision": self.revision,
                "credential_id": self.credential_id.hex(),
                "credential_prefix": credential_prefix}


@attrs.frozen(kw_only=True)
class IssuedSession:
    """A new session; the token exists only here and in the browser's cookie."""

    session_id: bytes
    token: str = attrs.field(repr=False)


def token_digest(token: str) -> bytes:
    return digests.sha256(token.encode("ascii"))


def csrf_token(session_token: str) -> str:
    """The CSRF token of a session: derived from its token (one-way), so nothing more is stored
    and a page's token cannot be turned back into the cookie."""
    return hashlib.sha256(b"orbit.console.csrf.v1:" + session_token.encode("ascii")).hexdigest()


def csrf_matches(session_token: str, sent: str) -> bool:
    return hmac.compare_digest(csrf_token(session_token).encode(), sent.encode("utf-8", "replace"))


def check_password(password: str) -> bytes:
    """The password's UTF-8 bytes, or ValidationFailed saying what is wrong with it."""
    encoded = password.encode("utf-8", "surrogatepass")
    problems = []
    if len(encoded) > PASSWORD_MAX_BYTES:
        problems.append({"path": "password", "message":
                         f"at most {PASSWORD_MAX_BYTES} bytes in UTF-8 (bcrypt reads no more; "
                         f"this one has {len(encoded)}): choose a shorter password"})
    elif len(password) < PASSWORD_MIN_CHARS:
        problems.append({"path": "password",
                         "message": f"at least {PASSWORD_MIN_CHARS} characters"})
    elif "\x00" in password or not password.isprintable():
        problems.append({"path": "password", "message": "printable characters only"})
    else:
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            problems.append({"path": "password", "message": "not valid Unicode text"})
    if problems:
        raise errors.ValidationFailed(problems)
    return encoded


def check_name(name: str) -> None:
    if not (1 <= len(name) <= NAME_MAX and name.isprintable() and name.strip() == name):
        raise errors.ValidationFailed([{"path": "name", "message":
                                        f"1 to {NAME_MAX} printable characters, no surrounding "
                                        "spaces"}])


async def hash_password(password: str) -> str:
    """bcrypt at :data:`BCRYPT_COST`, in a thread (about a quarter of a second of CPU)."""
    encoded = check_password(password)
    hashed = await asyncio.to_thread(bcrypt.hashpw, encoded, bcrypt.gensalt(BCRYPT_COST))
    return hashed.decode("ascii")


async def _verify(password: str, hashed: bytes) -> bool:
    encoded = password.encode("utf-8", "surrogatepass")
    if len(encoded) > PASSWORD_MAX_BYTES:
        # Never stored (check_password): still spend the time, then fail.
        await asyncio.to_thread(bcrypt.checkpw, b"", hashed)
        return False
    return await asyncio.to_thread(bcrypt.checkpw, encoded, hashed)


# --- SQL ---------------------------------------------------------------------------------------

USER_COLUMNS = "id, name, credential_id, revision, password_changed_at"
SELECT_USER_FOR_UPDATE = f"SELECT {USER_COLUMNS} FROM orbit_console_users WHERE seat = 1 FOR UPDATE"
INSERT_USER = """
INSERT INTO orbit_console_users (id, seat, name, password_hash, credential_id, revision,
  failed_logins, throttled_until, password_changed_at, created_at, updated_at)
VALUES (%s, 1, %s, %s, %s, 1, 0, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
"""
RESET_USER_IF_REVISION = """
UPDATE orbit_console_users
SET name = %s, password_hash = %s, credential_id = %s, revision = revision + 1,
    failed_logins = 0, throttled_until = NULL, password_changed_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND revision = %s
"""
REVOKE_ALL_SESSIONS = """
UPDATE orbit_console_sessions SET revoked_at = UTC_TIMESTAMP(6), revoked_reason = %s
WHERE user_id = %s AND revoked_at IS NULL
"""
# The credential to bind: by its public prefix, with its application's state.
CREDENTIAL_BY_PREFIX = """
SELECT c.id, c.prefix, c.state, a.state AS application_state
FROM orbit_credentials c JOIN orbit_applications a ON a.id = c.application_id
WHERE c.prefix = %s
"""
CREDENTIAL_PREFIX = "SELECT prefix FROM orbit_credentials WHERE id = %s"
# The login's first read: the account and whether it is throttled now (database time).
LOGIN_READ = """
SELECT id, name, password_hash, revision,
       (throttled_until IS NOT NULL AND throttled_until > UTC_TIMESTAMP(6)) AS throttled,
       TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), throttled_until) AS throttled_s
FROM orbit_console_users WHERE seat = 1
"""
LOGIN_LOCK = """
SELECT id, name, revision, failed_logins,
       (throttled_until IS NOT NULL AND throttled_until > UTC_TIMESTAMP(6)) AS throttled,
       TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), throttled_until) AS throttled_s
FROM orbit_console_users WHERE id = %s FOR UPDATE
"""
CLEAR_FAILURES = """
UPDATE orbit_console_users SET failed_logins = 0, throttled_until = NULL WHERE id = %s
"""
COUNT_FAILURE = "UPDATE orbit_console_users SET failed_logins = failed_logins + 1 WHERE id = %s"
START_THROTTLE = """
UPDATE orbit_console_users
SET failed_logins = 0, throttled_until = UTC_TIMESTAMP(6) + INTERVAL %s SECOND
WHERE id = %s
"""
INSERT_SESSION = """
INSERT INTO orbit_console_sessions (id, user_id, token_digest, created_at, last_seen_at,
  idle_expires_at, absolute_expires_at, revoked_at, revoked_reason, client_address, user_agent)
VALUES (%s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
  LEAST(UTC_TIMESTAMP(6) + INTERVAL %s SECOND, UTC_TIMESTAMP(6) + INTERVAL %s SECOND),
  UTC_TIMESTAMP(6) + INTERVAL %s SECOND, NULL, NULL, %s, %s)
"""
# Every request's read (uq_console_sessions_token, then primary keys): a live session, its
# account, the bound credential and its application.
SESSION_READ = """
SELECT s.id AS session_id, s.user_id,
       TIMESTAMPDIFF(MICROSECOND, s.last_seen_at, UTC_TIMESTAMP(6)) AS idle_us,
       u.name AS user_name, u.credential_id,
       c.name AS credential_name, c.prefix, c.grants, c.state, c.application_id,
       a.name AS application_name, a.state AS application_state
FROM orbit_console_sessions s
JOIN orbit_console_users u ON u.id = s.user_id
JOIN orbit_credentials c ON c.id = u.credential_id
JOIN orbit_applications a ON a.id = c.application_id
WHERE s.token_digest = %s AND s.revoked_at IS NULL
  AND s.idle_expires_at > UTC_TIMESTAMP(6) AND s.absolute_expires_at > UTC_TIMESTAMP(6)
"""
TOUCH_SESSION = """
UPDATE orbit_console_sessions
SET last_seen_at = UTC_TIMESTAMP(6),
    idle_expires_at = LEAST(UTC_TIMESTAMP(6) + INTERVAL %s SECOND, absolute_expires_at)
WHERE id = %s AND revoked_at IS NULL AND idle_expires_at > UTC_TIMESTAMP(6)
"""
REVOKE_SESSION = """
UPDATE orbit_console_sessions SET revoked_at = UTC_TIMESTAMP(6), revoked_reason = 'logout'
WHERE token_digest = %s AND revoked_at IS NULL
"""
SESSION_OWNER = "SELECT id, user_id FROM orbit_console_sessions WHERE token_digest = %s"


def _user(row: dict[str, Any]) -> ConsoleUser:
    return ConsoleUser(id=row["id"], name=row["name"], credential_id=row["credential_id"],
                       revision=row["revision"],
                       password_changed_at=as_utc(row["password_changed_at"]))


# --- the administrator account -----------------------------------------------------------------


async def _bindable_credential(cur: Any, prefix: str) -> tuple[bytes, str]:
    await cur.execute(CREDENTIAL_BY_PREFIX, (prefix,))
    row = await cur.fetchone()
    if row is None:
        raise errors.CredentialNotFound(f"no credential with prefix {prefix!r}")
    if (row["state"] != CredentialState.ACTIVE
            or row["application_state"] != ApplicationState.ACTIVE):
        raise errors.Conflict(f"credential {prefix!r} is revoked or its application disabled")
    return row["id"], row["prefix"]


async def set_password(db: Database, *, name: str | None, password: str,
                       credential_prefix: str | None, actor: Actor) -> dict[str, Any]:
    """Create the administrator (``credential_prefix`` required; ``name`` default
    :data:`DEFAULT_NAME`) or reset its password (with ``credential_prefix``, rebind it; with a
    ``name``, rename it). Revokes every session, clears the login throttle and writes one audit
    event, in one transaction. Returns the summary (never the hash)."""
    if name is not None:
        check_name(name)
    if credential_prefix is not None and not well_formed_prefix(credential_prefix):
        raise errors.CredentialNotFound(f"no credential with prefix {credential_prefix!r}")
    hashed = await hash_password(password)  # outside the transaction: CPU, not locks
    new_id = ids.new_id()

    async def body(cur: Any) -> dict[str, Any]:
        await cur.execute(SELECT_USER_FOR_UPDATE)
        row = await cur.fetchone()
        before = None if row is None else _user(row)
        if credential_prefix is not None:
            credential_id, prefix = await _bindable_credential(cur, credential_prefix)
        elif before is None:
            raise errors.ValidationFailed([{"path": "credential", "message":
                                            "required when creating the administrator: the "
                                            "prefix of the API credential it acts as"}])
        else:
            credential_id = before.credential_id
            await cur.execute(CREDENTIAL_PREFIX, (credential_id,))
            found = await cur.fetchone()
            prefix = "" if found is None else found["prefix"]
        revoked = 0
        if before is None:
            await cur.execute(INSERT_USER, (new_id, name or DEFAULT_NAME, hashed, credential_id))
            user_id, action = new_id, "console.user_create"
        else:
            await cur.execute(RESET_USER_IF_REVISION, (name or before.name, hashed, credential_id,
                                                       before.id, before.revision))
            if cur.rowcount != 1:
                raise errors.DatabaseError("the locked console account changed in its own "
                                           "transaction")
            await cur.execute(REVOKE_ALL_SESSIONS, ("password_changed", before.id))
            revoked = cur.rowcount
            user_id, action = before.id, "console.password_set"
        await cur.execute(f"SELECT {USER_COLUMNS} FROM orbit_console_users WHERE id = %s",
                          (user_id,))
        after = _user(await cur.fetchone())
        summary = {**after.summary(credential_prefix=prefix), "sessions_revoked": revoked}
        await append_audit(cur, AuditRecord(
            actor=actor, action=action, resource_type="console_user", resource_id=after.id,
            resource_revision=after.revision,
            before=None if before is None else before.summary(credential_prefix=""),
            after=summary,
        ))
        return summary

    return await db.transaction("console.set_password", body)


# --- login and logout --------------------------------------------------------------------------


def _throttled(row: dict[str, Any]) -> errors.ConsoleLoginThrottled:
    wait = max(1, int(row["throttled_s"] or 0) + 1)
    return errors.ConsoleLoginThrottled(
        f"too many failed logins: try again in {wait} s", retry_after_s=wait)


def _client_actor(user_name: str, credential_id: bytes) -> Actor:
    return Actor(kind=ActorKind.CONSOLE, id=f"{user_name}/{credential_id.hex()}")


async def login(db: Database, *, name: str, password: str, policy: SessionPolicy,
                client_address: str, user_agent: str, request_id: str | None = None
                ) -> IssuedSession:
    """Check the name and password and open a session; raises ConsoleLoginFailed (wrong name or
    password, no account), or ConsoleLoginThrottled (too many failures; the password is not
    checked). A success and the throttle's start are audited."""
    row = await db.read("console.login_read", _login_read)
    if row is not None and row["throttled"]:
        raise _throttled(row)
    hashed = (await asyncio.to_thread(_dummy_hash) if row is None
              else row["password_hash"].encode("ascii"))
    name_ok = row is not None and hmac.compare_digest(row["name"].encode(), name.encode())
    password_ok = await _verify(password, hashed)  # outside any transaction
    if row is None:
        raise errors.ConsoleLoginFailed("wrong name or password")
    token = secrets.token_urlsafe(32)
    session_id = ids.new_id()
    ok = name_ok and password_ok
    user_id: bytes = row["id"]

    async def record(cur: Any) -> str:
        await cur.execute(LOGIN_LOCK, (user_id,))
        locked = await cur.fetchone()
        if locked is None or locked["revision"] != row["revision"]:
            return "changed"  # reset (or re-created) since the read: judge nothing
        if locked["throttled"]:
            return "throttled"
        await cur.execute(
            "SELECT credential_id FROM orbit_console_users WHERE id = %s", (user_id,))
        credential_id = (await cur.fetchone())["credential_id"]
        actor = _client_actor(locked["name"], credential_id)
        if not ok:
            if locked["failed_logins"] + 1 < policy.login_max_failures:
                await cur.execute(COUNT_FAILURE, (user_id,))
                return "failed"
            await cur.execute(START_THROTTLE, (policy.login_lockout_s, user_id))
            await append_audit(cur, AuditRecord(
                actor=actor, action="console.login_throttled", resource_type="console_user",
                resource_id=user_id, resource_revision=locked["revision"],
                reason=f"{policy.login_max_failures} consecutive failed logins",
                after={"lockout_s": policy.login_lockout_s, "client_address": client_address},
                request_id=request_id or None,
            ))
            return "failed"
        await cur.execute(CLEAR_FAILURES, (user_id,))
        await cur.execute(INSERT_SESSION, (
            session_id, user_id, token_digest(token), policy.idle_timeout_s,
            policy.absolute_timeout_s, policy.absolute_timeout_s, client_address[:64],
            user_agent[:USER_AGENT_MAX],
        ))
        await append_audit(cur, AuditRecord(
            actor=actor, action="console.login", resource_type="console_session",
            resource_id=session_id, after={"client_address": client_address[:64]},
            request_id=request_id or None,
        ))
        return "ok"

    outcome = await db.transaction("console.login", record)
    if outcome == "ok":
        return IssuedSession(session_id=session_id, token=token)
    if outcome == "throttled":
        raise errors.ConsoleLoginThrottled("too many failed logins: try again later",
                                           retry_after_s=policy.login_lockout_s)
    raise errors.ConsoleLoginFailed("wrong name or password")


async def _login_read(cur: Any) -> dict[str, Any] | None:
    await cur.execute(LOGIN_READ)
    row: dict[str, Any] | None = await cur.fetchone()
    return row


def _well_formed(token: str) -> bool:
    return 20 <= len(token) <= 64 and all(c.isalnum() or c in "-_" for c in token)


async def authenticate(db: Database, token: str, policy: SessionPolicy) -> Principal:
    """The principal of a console session token: the bound credential with the console's seat.
    Raises ConsoleSessionInvalid (no such live session) or InvalidCredential (the bound
    credential or its application no longer works). Refreshes the idle expiry at most every
    :data:`TOUCH_EVERY` of the idle limit (a short write of its own)."""
    if not _well_formed(token):
        raise errors.ConsoleSessionInvalid("log in to use the console")
    digest = token_digest(token)

    async def read(cur: Any) -> dict[str, Any] | None:
        await cur.execute(SESSION_READ, (digest,))
        found: dict[str, Any] | None = await cur.fetchone()
        return found

    row = await db.read("console.session", read)
    if row is None:
        raise errors.ConsoleSessionInvalid("the console session expired or was revoked; "
                                           "log in again")
    if (row["state"] != CredentialState.ACTIVE
            or row["application_state"] != ApplicationState.ACTIVE):
        raise errors.InvalidCredential(
            "the credential the console account is bound to is revoked or its application "
            "disabled; rebind it with orbit admin console set-password --credential")
    if (row["idle_us"] or 0) >= policy.idle_timeout_s * TOUCH_EVERY * 1_000_000:
        await db.transaction("console.touch", lambda cur: cur.execute(
            TOUCH_SESSION, (policy.idle_timeout_s, row["session_id"])))
    seat = ConsoleSeat(user_id=row["user_id"], user_name=row["user_name"],
                       session_id=row["session_id"], session_digest=digest)
    return Principal(
        credential_id=row["credential_id"], credential_name=row["credential_name"],
        prefix=row["prefix"], application_id=row["application_id"],
        application_name=row["application_name"],
        grants=authz.grants_from_db(row["grants"]), console=seat,
    )


async def logout(db: Database, token: str, *, request_id: str | None = None) -> bool:
    """Revoke the session of ``token`` (audited); False when it was not live."""
    if not _well_formed(token):
        return False
    digest = token_digest(token)

    async def body(cur: Any) -> bool:
        await cur.execute(SESSION_OWNER, (digest,))
        owner = await cur.fetchone()
        if owner is None:
            return False
        await cur.execute(REVOKE_SESSION, (digest,))
        if cur.rowcount != 1:
            return False
        await cur.execute("SELECT name, credential_id FROM orbit_console_users WHERE id = %s",
                          (owner["user_id"],))
        user = await cur.fetchone()
        actor = (Actor(kind=ActorKind.CONSOLE, id="unknown") if user is None
                 else _client_actor(user["name"], user["credential_id"]))
        await append_audit(cur, AuditRecord(
            actor=actor, action="console.logout", resource_type="console_session",
            resource_id=owner["id"], request_id=request_id or None,
        ))
        return True

    return await db.transaction("console.logout", body)


def well_formed_prefix(prefix: str) -> bool:
    """Whether ``prefix`` can be a credential prefix (12 lowercase hex characters)."""
    return KEY_PATTERN.match(f"orb_{prefix}_{'a' * 43}") is not None

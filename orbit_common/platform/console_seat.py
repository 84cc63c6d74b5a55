"""The console's seat on a principal: which administrator session a console request comes from.

A console request acts as the credential the administrator account is bound to
(orbit_common/platform/console.py). Its :class:`~orbit_common.platform.credentials.Principal`
carries a :class:`ConsoleSeat`, and every domain transaction that re-checks the principal
(:func:`credentials.recheck_principal`) also re-checks the seat with :func:`check_seat`, in the
same transaction: the session must still be unrevoked and unexpired (database time) and the
account still bound to that credential. A logout or a password change that commits first stops
the action; one that commits after it did not exist when the action ran.
"""

from __future__ import annotations

from typing import Any

import attrs

from orbit_common import errors
from orbit_common.platform.audit import Actor, ActorKind


@attrs.frozen(kw_only=True)
class ConsoleSeat:
    user_id: bytes
    user_name: str
    session_id: bytes
    # SHA-256 of the session token (the token itself stays in the browser's cookie).
    session_digest: bytes = attrs.field(repr=False)

    def actor(self, credential_id: bytes) -> Actor:
        """The audit actor: ``console``, ``<administrator>/<bound credential id>``."""
        return Actor(kind=ActorKind.CONSOLE, id=f"{self.user_name}/{credential_id.hex()}")


# uq_console_sessions_token, then the account by primary key.
CHECK_SEAT = """
SELECT s.id FROM orbit_console_sessions s
JOIN orbit_console_users u ON u.id = s.user_id
WHERE s.token_digest = %s AND s.id = %s AND u.id = %s AND u.credential_id = %s
  AND s.revoked_at IS NULL
  AND s.idle_expires_at > UTC_TIMESTAMP(6) AND s.absolute_expires_at > UTC_TIMESTAMP(6)
"""


async def check_seat(cur: Any, seat: ConsoleSeat, credential_id: bytes) -> None:
    """Raise :class:`errors.ConsoleSessionInvalid` unless the seat's session is live and its
    account is still bound to ``credential_id`` (a plain read in the caller's transaction)."""
    await cur.execute(CHECK_SEAT, (seat.session_digest, seat.session_id, seat.user_id,
                                   credential_id))
    if await cur.fetchone() is None:
        raise errors.ConsoleSessionInvalid(
            "the console session expired or was revoked; log in again")

"""The platform's side of HTTP authentication: a bearer API key resolves to a principal.

The kernel's HTTP plumbing (``orbit_common/service/http``) knows no credentials: the API and the
dispatcher hand it :func:`authenticate`, and their routes read the caller with
:func:`principal_of`.
"""

from __future__ import annotations

from aiohttp import web

from orbit_common.db.pool import Database
from orbit_common.platform import credentials
from orbit_common.platform.credentials import Principal
from orbit_common.service.http.context import principal_as


async def authenticate(db: Database, api_key: str) -> Principal:
    """Resolve an API key (one read-only transaction); 401 ``invalid_credential`` otherwise."""
    return await db.read("auth.authenticate",
                         lambda cur: credentials.authenticate(cur, api_key))


def principal_of(request: web.Request) -> Principal:
    """The authenticated caller of a route behind the auth middleware."""
    return principal_as(request, Principal)

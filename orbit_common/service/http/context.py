"""Typed application state and per-request context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from orbit_common.db.pool import Database
from orbit_common.service.config import OrbitConfig

P = TypeVar("P")

# Resolves a bearer token to the caller (a principal); raises an OrbitError (401) otherwise.
Authenticate = Callable[[Database, str], Awaitable[object]]

DB = web.AppKey("db", Database)
CONFIG = web.AppKey("config", OrbitConfig)
AUTHENTICATE: web.AppKey[Authenticate] = web.AppKey("authenticate")

PRINCIPAL = web.RequestKey("principal", object)
REQUEST_ID = web.RequestKey("request_id", str)
# Set when the client went away before its request was read in full: nothing is answered.
CLIENT_GONE = web.RequestKey("client_gone", bool)


def principal_as(request: web.Request, cls: type[P]) -> P:
    """The authenticated caller of ``request``, which must be a ``cls``."""
    principal = request.get(PRINCIPAL)
    if not isinstance(principal, cls):
        raise TypeError("route is not behind the auth middleware")
    return principal


def request_id_of(request: web.Request) -> str:
    return str(request.get(REQUEST_ID, ""))

"""Typed application state and per-request context."""

from __future__ import annotations

from aiohttp import web

from orbit_common.db.pool import Database
from orbit_common.platform.credentials import Principal
from orbit_common.service.config import OrbitConfig

DB = web.AppKey("db", Database)
CONFIG = web.AppKey("config", OrbitConfig)

PRINCIPAL = web.RequestKey("principal", Principal)
REQUEST_ID = web.RequestKey("request_id", str)


def principal_of(request: web.Request) -> Principal:
    principal = request.get(PRINCIPAL)
    if not isinstance(principal, Principal):
        raise TypeError("route is not behind the auth middleware")
    return principal


def request_id_of(request: web.Request) -> str:
    return str(request.get(REQUEST_ID, ""))

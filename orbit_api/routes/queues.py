"""``/v1/namespaces/{namespace}/queues``: queue management (issue 3)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

OPENAPI_PATHS: dict[str, Any] = {}
OPENAPI_SCHEMAS: dict[str, Any] = {}


def add_routes(app: web.Application) -> None:
    """Register the queue routes."""

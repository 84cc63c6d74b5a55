"""``/v1/namespaces/{namespace}/tasks``: submission and queries (issue 3)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

OPENAPI_PATHS: dict[str, Any] = {}
OPENAPI_SCHEMAS: dict[str, Any] = {}


def add_routes(app: web.Application) -> None:
    """Register the task routes."""

"""Comparing an aiohttp application's routes with its OpenAPI document (the API's and the
dispatcher's documents are each kept true by a test that uses these)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
# The operator console's HTML pages (orbit_api/console): no part of the JSON API, its document or
# its bearer-credential matrix; tests/console exercises them (session cookie, CSRF, domain
# authorization as the bound credential).
CONSOLE = "/console"


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    """``(path, method)`` of every route of the JSON API the application serves (HEAD twins and
    the console's HTML pages left out)."""
    found = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # added by aiohttp next to every GET
            continue
        assert route.method != "*", f"a catch-all route cannot be documented: {route}"
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert path, f"route without a path: {route}"
        if path == CONSOLE or path.startswith(CONSOLE + "/"):
            continue
        # aiohttp writes {name} like OpenAPI; a {name:regex} is not allowed in the document
        found.add((re.sub(r"\{(\w+):[^}]+\}", r"{\1}", path), route.method.lower()))
    return found


def documented_routes(document: dict[str, Any]) -> set[tuple[str, str]]:
    """``(path, method)`` of every operation the document describes."""
    return {(path, method) for path, item in document["paths"].items()
            for method in item if method in HTTP_METHODS}

"""The console's web plumbing: sessions, CSRF-checked forms, rendering, errors, static files.

The operator console: server-rendered pages under ``/console/`` (docs/console.md).

The console is a face on the domain functions the HTTP API uses: every page reads and every
action writes through them, as the credential the administrator account is bound to, with the
console's session re-checked inside each transaction (orbit_common/platform/console_seat.py).
Nothing here touches SQL.

Routing: ``/console/login`` and ``/console/logout``; ``/console/`` sends the administrator to
the first namespace it may see; every page of a namespace lives under
``/console/ns/{namespace}/`` (the overview and ``queues`` in pages.py, ``tasks``,
``schedules``, ``subscriptions``, ``workflows``, ``audit`` in their modules; a new page is a
module with an ``add_routes``, registered in app.py, and a :data:`NAV` entry).

Static files are served at ``/console/static/{digest}/{name}``, cached for a year (the digest
changes with the content).
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from orbit_api.console import security
from orbit_common import errors
from orbit_common.platform import commands
from orbit_common.platform import console as identity
from orbit_common.platform.credentials import Principal
from orbit_common.service.http.context import CONFIG, DB, request_id_of

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
PREFIX = "/console"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PRINCIPAL = web.RequestKey("console_principal", Principal)

# The namespace pages, in navigation order: (route name suffix, label). Later slices add theirs.
NAV: list[tuple[str, str]] = [("overview", "概览"), ("queues", "队列"), ("tasks", "任务"),
                              ("schedules", "计划"), ("subscriptions", "订阅"),
                              ("workflows", "流程"), ("audit", "审计")]


def _static_files() -> dict[str, tuple[str, bytes, str]]:
    """name -> (digest, content, content type) of every vendored static file."""
    found = {}
    for path in sorted(STATIC_DIR.iterdir()):
        if path.is_file():
            content = path.read_bytes()
            kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            found[path.name] = (hashlib.sha256(content).hexdigest()[:16], content, kind)
    return found


STATIC = _static_files()


def static_url(name: str) -> str:
    return f"{PREFIX}/static/{STATIC[name][0]}/{name}"


def redirect(location: str) -> web.Response:
    """A 303 to ``location`` (returned, not raised: the middleware adds the headers)."""
    return web.Response(status=303, headers={"Location": location})


def policy_of(request: web.Request) -> identity.SessionPolicy:
    console = request.config_dict[CONFIG].console
    return identity.SessionPolicy(
        idle_timeout_s=console.idle_timeout_s, absolute_timeout_s=console.absolute_timeout_s,
        login_max_failures=console.login_max_failures, login_lockout_s=console.login_lockout_s)


async def principal_of(request: web.Request) -> Principal:
    """The console principal of this request's session; ConsoleSessionInvalid without one."""
    found = request.get(PRINCIPAL)
    if isinstance(found, Principal):
        return found
    token = security.session_token(request)
    if token is None:
        raise errors.ConsoleSessionInvalid("log in to use the console")
    principal = await identity.authenticate(request.config_dict[DB], token, policy_of(request))
    request[PRINCIPAL] = principal
    return principal


async def form_of(request: web.Request, *, principal: bool = True) -> dict[str, str]:
    """The POSTed form, after its CSRF token was checked against the session cookie (403
    otherwise) and, with ``principal``, the session resolved (ConsoleSessionInvalid). Call it
    before anything else in a state-changing handler."""
    form = await security.read_form(request)
    token = security.session_token(request)
    if token is None:
        raise errors.ConsoleSessionInvalid("log in to use the console")
    if not identity.csrf_matches(token, form.get("csrf", "")):
        raise errors.CsrfTokenInvalid(
            "the form's CSRF token is missing or belongs to another session; reload the page")
    if principal:
        await principal_of(request)
    return form


async def render(request: web.Request, template: str, context: dict[str, Any], *,
                 status: int = 200) -> web.Response:
    """A page in the layout: the navigation, the namespace switcher and the logout form."""
    principal = request.get(PRINCIPAL)
    layout: dict[str, Any] = {"nav": NAV, "user": None, "namespaces": [], "csrf": ""}
    if principal is not None and principal.console is not None:
        token = security.session_token(request) or ""
        visible = await commands.whoami(request.config_dict[DB], principal)
        layout.update(user=principal.console.user_name, namespaces=visible["namespaces"],
                      credential=principal.prefix, csrf=identity.csrf_token(token))
    return aiohttp_jinja2.render_template(template, request, {**layout, **context},
                                          status=status)


def _problem_context(exc: errors.OrbitError) -> dict[str, Any]:
    return {"status": exc.status, "code": exc.code, "title": exc.title, "detail": exc.detail,
            "problems": getattr(exc, "errors", [])}


async def error_page(request: web.Request, exc: errors.OrbitError) -> web.Response:
    try:
        response = await render(request, "error.html", _problem_context(exc),
                                status=exc.status)
    except errors.OrbitError:  # the layout's own read failed (the session ended meanwhile)
        request.pop(PRINCIPAL, None)
        response = await render(request, "error.html", _problem_context(exc),
                                status=exc.status)
    if isinstance(exc, errors.TooManyRequests):
        response.headers["Retry-After"] = str(exc.extra.get("retry_after_s", 1))
    return response


@web.middleware
async def console_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors as HTML pages with the problem's code and message; the security headers."""
    cacheable = request.match_info.route.name == "console.static"
    try:
        response = await handler(request)
    except errors.ConsoleSessionInvalid as exc:
        request.pop(PRINCIPAL, None)
        if request.method == "GET":
            response = redirect(f"{PREFIX}/login")
        else:
            response = await error_page(request, exc)
        security.clear_cookie(request, response, security.SESSION_COOKIE)
    except errors.OrbitError as exc:
        response = await error_page(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        problem = errors.NotFound("no such console page") if exc.status == 404 else (
            errors.MethodNotAllowed("this console page does not accept that method")
            if exc.status == 405 else errors.BadRequest(exc.reason))
        response = await error_page(request, problem)
    except Exception:
        log.exception("console page failed", extra={"path": request.path,
                                                    "request_id": request_id_of(request)})
        response = await error_page(request, errors.OrbitError(
            "an unexpected error occurred; the request id identifies it in the logs"))
    security.security_headers(response, cacheable=cacheable)
    return response


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    found = STATIC.get(name)
    if found is None or found[0] != request.match_info["digest"]:
        raise web.HTTPNotFound()
    digest, content, kind = found
    return web.Response(body=content, content_type=kind, headers={
        "Cache-Control": "public, max-age=31536000, immutable", "ETag": f'"{digest}"'})


def utc_text(text: str) -> str:
    """A ``datetime-local`` value (no zone) read as UTC; an RFC 3339 time as it is."""
    if len(text) == 16 and text[10] == "T":  # 2026-12-02T09:30
        return text + ":00Z"
    if len(text) == 19 and text[10] == "T":  # 2026-12-02T09:30:15
        return text + "Z"
    return text


def duration(seconds: float | None) -> str:
    """A short Chinese duration: 45 秒, 3 分 20 秒, 2 小时 5 分, 3 天 4 小时."""
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s} 秒"
    if s < 3600:
        return f"{s // 60} 分 {s % 60} 秒"
    if s < 86400:
        return f"{s // 3600} 小时 {s % 3600 // 60} 分"
    return f"{s // 86400} 天 {s % 86400 // 3600} 小时"



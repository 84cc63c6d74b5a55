"""The console's HTTP security: cookies, CSRF, form reading, response headers.

* The session cookie ``orbit_console_session`` holds the 256-bit token (only its SHA-256 is
  stored); ``orbit_console_login`` holds a random value that the login form's CSRF token is
  derived from (there is no session yet). Both: ``Path=/console/``, ``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` when the request came over HTTPS or ``[console]
  cookie_secure`` is set.
* Every POST carries a ``csrf`` field: the session's token derived one-way from its cookie
  (orbit_common/platform/console.py, :func:`csrf_token`), or for the login form one derived from
  the login cookie. A missing or wrong one is 403 ``csrf_token_invalid``; nothing is read
  further and nothing written.
* Forms are ``application/x-www-form-urlencoded``, at most :data:`FORM_MAX_BYTES` bytes and
  :data:`FORM_MAX_FIELDS` fields, each name at most once.
* Every answer has a CSP without inline script (``script-src 'self'``), ``frame-ancestors
  'none'``, ``X-Frame-Options: DENY``, ``nosniff`` and ``Referrer-Policy: no-referrer``; every
  page (anything but the versioned static files) has ``Cache-Control: no-store``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import urllib.parse

from aiohttp import web

from orbit_common import errors
from orbit_common.service.http.context import CONFIG

SESSION_COOKIE = "orbit_console_session"
LOGIN_COOKIE = "orbit_console_login"
COOKIE_PATH = "/console/"
FORM_MAX_BYTES = 16 * 1024
FORM_MAX_FIELDS = 32

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}

FORM = web.RequestKey("console_form", dict)


def secure_request(request: web.Request) -> bool:
    return request.secure or request.config_dict[CONFIG].console.cookie_secure


def set_cookie(request: web.Request, response: web.StreamResponse, name: str,
               value: str) -> None:
    response.set_cookie(name, value, path=COOKIE_PATH, httponly=True, samesite="Strict",
                        secure=secure_request(request))


def clear_cookie(request: web.Request, response: web.StreamResponse, name: str) -> None:
    response.del_cookie(name, path=COOKIE_PATH, httponly=True, samesite="Strict",
                        secure=secure_request(request))


def session_token(request: web.Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE) or None


def login_csrf(login_value: str) -> str:
    """The login form's CSRF token, derived from the login cookie's random value."""
    return hashlib.sha256(b"orbit.console.login.v1:" + login_value.encode()).hexdigest()


def new_login_value() -> str:
    return secrets.token_urlsafe(24)


def check_login_csrf(request: web.Request, sent: str) -> None:
    value = request.cookies.get(LOGIN_COOKIE, "")
    if not value or not hmac.compare_digest(login_csrf(value).encode(),
                                            sent.encode("utf-8", "replace")):
        raise errors.CsrfTokenInvalid(
            "the login form is stale or was not sent from this console; reload it and retry")


async def read_form(request: web.Request) -> dict[str, str]:
    """The POSTed form (bounded; see the module docstring), also kept in ``request[FORM]``."""
    kind = request.content_type
    if kind != "application/x-www-form-urlencoded":
        raise errors.UnsupportedMediaType("console forms are application/x-www-form-urlencoded")
    if request.content_length is not None and request.content_length > FORM_MAX_BYTES:
        raise errors.PayloadTooLarge(f"a console form is at most {FORM_MAX_BYTES} bytes")
    body = bytearray()
    while chunk := await request.content.read(FORM_MAX_BYTES + 1 - len(body)):
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            raise errors.PayloadTooLarge(f"a console form is at most {FORM_MAX_BYTES} bytes")
    try:
        text = bytes(body).decode("utf-8")
        pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, strict_parsing=False,
                                       max_num_fields=FORM_MAX_FIELDS, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise errors.BadRequest(f"the form is not valid UTF-8 form data, or has more than "
                                f"{FORM_MAX_FIELDS} fields") from exc
    form: dict[str, str] = {}
    for name, value in pairs:
        if name in form:
            raise errors.BadRequest(f"the form repeats the field {name!r}")
        form[name] = value
    request[FORM] = form
    return form


def security_headers(response: web.StreamResponse, *, cacheable: bool) -> None:
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    if not cacheable:
        response.headers["Cache-Control"] = "no-store"
        response.headers["Pragma"] = "no-cache"

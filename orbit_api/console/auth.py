"""Login, logout and the start page of the console (docs/console.md, "登录与会话")."""

from __future__ import annotations

from aiohttp import web

from orbit_api.console import security
from orbit_api.console.web import (
    PREFIX,
    PRINCIPAL,
    form_of,
    policy_of,
    principal_of,
    redirect,
    render,
)
from orbit_common import errors
from orbit_common.platform import commands
from orbit_common.platform import console as identity
from orbit_common.service.http.context import DB, request_id_of


async def login_page(request: web.Request, *, message: str | None = None,
                     status: int = 200) -> web.Response:
    value = request.cookies.get(security.LOGIN_COOKIE) or security.new_login_value()
    response = await render(request, "login.html", {
        "login_csrf": security.login_csrf(value), "message": message}, status=status)
    security.set_cookie(request, response, security.LOGIN_COOKIE, value)
    return response


async def login_get(request: web.Request) -> web.StreamResponse:
    return await login_page(request)


async def login_post(request: web.Request) -> web.StreamResponse:
    form = await security.read_form(request)
    security.check_login_csrf(request, form.get("csrf", ""))
    try:
        issued = await identity.login(
            request.config_dict[DB], name=form.get("name", ""),
            password=form.get("password", ""), policy=policy_of(request),
            client_address=request.remote or "", user_agent=request.headers.get("User-Agent", ""),
            request_id=request_id_of(request))
    except errors.ConsoleLoginThrottled as exc:
        response = await login_page(request, message=f"登录失败次数过多，请稍后再试"
                                    f"（{exc.code}：{exc.detail}）", status=429)
        response.headers["Retry-After"] = str(exc.extra.get("retry_after_s", 1))
        return response
    except errors.ConsoleLoginFailed as exc:
        return await login_page(request, message=f"用户名或密码错误（{exc.code}）", status=401)
    response = redirect(f"{PREFIX}/")
    security.set_cookie(request, response, security.SESSION_COOKIE, issued.token)
    security.clear_cookie(request, response, security.LOGIN_COOKIE)
    return response


async def logout_post(request: web.Request) -> web.StreamResponse:
    # The CSRF token is checked, but not the bound credential: a logout works even after the
    # credential was revoked (the session is revoked all the same).
    await form_of(request, principal=False)
    token = security.session_token(request) or ""
    await identity.logout(request.config_dict[DB], token, request_id=request_id_of(request))
    request.pop(PRINCIPAL, None)
    response = redirect(f"{PREFIX}/login")
    security.clear_cookie(request, response, security.SESSION_COOKIE)
    return response


async def start(request: web.Request) -> web.StreamResponse:
    principal = await principal_of(request)
    visible = await commands.whoami(request.config_dict[DB], principal)
    if not visible["namespaces"]:
        raise errors.NamespaceNotFound("the console's credential sees no namespace")
    return redirect(request.app.router["overview"].url_for(
        namespace=visible["namespaces"][0]).path)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", start, name="start")
    app.router.add_get("/login", login_get, name="login")
    app.router.add_post("/login", login_post)
    app.router.add_post("/logout", logout_post, name="logout")

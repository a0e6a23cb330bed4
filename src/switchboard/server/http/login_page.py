"""The login page: ``/public/apps/hypha-login/?key=…`` and its ``callback``, served by the hub itself.

The page sends the browser to the operator's provider for the key's sign-in,
and the provider sends it back to the callback, which finishes it
(:class:`~switchboard.hub.manager.login_service.LoginService`). Each answer is
a short page (HTML-escaped text) or a redirect; nothing is kept in the browser.
These routes come before the apps' (``/{workspace}/apps/…``).
"""

from __future__ import annotations

import html
import logging

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from switchboard.errors import AuthError
from switchboard.hub.identity import oidc_login
from switchboard.hub.manager.login_service import LOGIN_PATH
from switchboard.server.http.http_errors import status_of
from switchboard.server.http.http_services import server_state

log = logging.getLogger(__name__)


def routes() -> list[Route]:
    return [
        Route(LOGIN_PATH, to_slash, methods=["GET", "HEAD"]),
        Route(LOGIN_PATH + "/", page, methods=["GET", "HEAD"]),
        Route(LOGIN_PATH + "/callback", callback, methods=["GET"]),
    ]


async def to_slash(request: Request) -> Response:
    query = request.url.query
    return RedirectResponse(LOGIN_PATH + "/" + (f"?{query}" if query else ""), status_code=307)


def _page(title: str, text: str, status: int = 200) -> HTMLResponse:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Hypha Account: Switchboard sign-in</title></head>"
        f"<body><h1>{html.escape(title)}</h1><p id='message'>{html.escape(text)}</p></body></html>"
    )
    # never cached, never framed: each answer belongs to one sign-in
    headers = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
    return HTMLResponse(body, status_code=status, headers=headers)


def _refused(exc: Exception) -> HTMLResponse:
    status, detail = status_of(exc)
    if isinstance(exc, AuthError):
        status = 403
    return _page("Sign-in failed", detail, status)


async def page(request: Request) -> Response:
    login = server_state(request).http.login
    if request.query_params.get("logout"):
        return _page("Signed out", "The hub keeps no session in this browser: you may close this window.")
    if login.client is None:  # the page says what the operator sets (a client may report a token meanwhile)
        return _page("Hypha Account: signing in is not set up", oidc_login.not_configured())
    key = request.query_params.get("key")
    if not key:
        return _page("Sign in", "Open this page with the key your client gave (login_url).", 400)
    try:
        target = await login.begin(key)
    except Exception as exc:  # noqa: BLE001 - every refusal is shown on the page
        return _refused(exc)
    return RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})


async def callback(request: Request) -> Response:
    login = server_state(request).http.login
    q = request.query_params
    if q.get("error"):
        return _page(
            "Sign-in failed", f"The identity provider answered: {q.get('error_description') or q['error']}", 403
        )
    code, state = q.get("code"), q.get("state")
    if not code or not state:
        return _page("Sign-in failed", "The callback needs the code and state the identity provider sends.", 400)
    try:
        await login.finish(code, state)
    except Exception as exc:  # noqa: BLE001 - every refusal is shown on the page
        log.info("sign-in refused: %s", exc)
        return _refused(exc)
    return _page("Signed in", "You are signed in: you may close this window and go back to your client.")

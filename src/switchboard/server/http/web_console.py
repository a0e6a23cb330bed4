"""``GET /console``: the web console, a page the hub serves itself (no build step, no CDN).

Three files written for Switchboard (``console_files/``): the page reads
``/api/status`` every couple of seconds (:mod:`switchboard.server.http.status_api`)
and calls services through ``/{workspace}/services/...``, both with the token
the viewer signed in with (kept in the tab's ``sessionStorage``, sent as
``Authorization: Bearer``, never as a cookie). Its Content-Security-Policy
allows nothing but this origin.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

FILES = {"console.js": "text/javascript", "console.css": "text/css"}
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _read(name: str) -> bytes:
    return resources.files("switchboard.server.http").joinpath("console_files", name).read_bytes()


def routes() -> list[Route]:
    return [
        Route("/", lambda request: RedirectResponse("/console", status_code=307), methods=["GET"]),
        Route("/console", page, methods=["GET"]),
        Route("/console/{name}", asset, methods=["GET"]),
    ]


def _headers() -> dict[str, str]:
    return {"Content-Security-Policy": POLICY, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


async def page(request: Request) -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=_headers())


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in FILES:
        return Response("not found", status_code=404, media_type="text/plain")
    return Response(_read(name), media_type=f"{FILES[name]}; charset=utf-8", headers=_headers())

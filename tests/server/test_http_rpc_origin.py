"""A POST /rpc that speaks with the stream's cookie must come from the hub's own origin.

The stream cookie is ``SameSite=Strict``: a browser sends it on requests from
any page of the same *site*, and every port of 127.0.0.1 (or every subdomain of
a site) is one site. A page of another origin of that site could otherwise post
frames into a visitor's stream with a ``no-cors`` fetch, and each would reach
its receiver as the visitor's. So a cookie-authenticated POST that a browser
marks as coming from elsewhere (``Sec-Fetch-Site`` other than ``same-origin`` /
``none``, or else an ``Origin`` that is not the hub's) is refused with 403; a
request with neither header is not a browser's (hypha-rpc's Python client) and
its cookie is enough. A token still works from anywhere: a ``no-cors`` request
cannot carry one.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest

from switchboard.server.http import http_rpc
from switchboard.testing.hub import RunningServer

pytestmark = pytest.mark.timeout(30)

SIBLING = "http://127.0.0.1:1"  # same site as the hub (127.0.0.1), another origin (port)


class Stream:
    """One GET /rpc stream, the session (cookie jar) that opened it, and its frames."""

    def __init__(self, http: httpx.AsyncClient, response: httpx.Response, server: RunningServer) -> None:
        self.http, self.response, self.server = http, response, server
        self._chunks = response.aiter_bytes()
        self._buffer = b""
        self.params: dict[str, str] = {}

    async def frame(self) -> Any:
        for _ in range(10_000):  # chunks (the test's timeout bounds the time)
            if len(self._buffer) >= 4:
                (length,) = struct.unpack(">I", self._buffer[:4])
                if len(self._buffer) >= 4 + length:
                    body, self._buffer = self._buffer[4 : 4 + length], self._buffer[4 + length :]
                    return msgpack.unpackb(body, strict_map_key=False)
            self._buffer += await self._chunks.__anext__()
        raise AssertionError("no whole frame within 10,000 chunks")

    async def control_frame(self) -> str:
        """The type of the next frame that is not a keepalive ping."""
        for _ in range(100):
            frame = await self.frame()
            if frame.get("type") != "ping":
                return str(frame["type"])
        raise AssertionError("only keepalives")

    async def post(self, kind: str, headers: dict[str, str]) -> httpx.Response:
        """A control frame posted with the stream's own cookie and ``headers``."""
        return await self.http.post("/rpc", content=msgpack.packb({"type": kind}), params=self.params, headers=headers)


@contextlib.asynccontextmanager
async def stream(server: RunningServer, client_id: str, token: str | None = None) -> AsyncIterator[Stream]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        http.stream("GET", "/rpc", params={"client_id": client_id}, headers=headers) as response,
    ):
        assert response.status_code == 200
        opened = Stream(http, response, server)
        info = await opened.frame()
        opened.params = {"workspace": info["workspace"], "client_id": client_id}
        assert http.cookies.get(http_rpc.cookie_name(f"{info['workspace']}/{client_id}"))
        yield opened


REFUSED = [
    {"Origin": SIBLING},  # a browser without Fetch Metadata: the page's origin is another port
    {"Origin": "null"},  # a sandboxed or file page
    {"Sec-Fetch-Site": "same-site", "Origin": SIBLING},  # Chromium's no-cors POST from a sibling origin
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site"},
]


@pytest.mark.parametrize("headers", REFUSED, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()))
async def test_the_cookie_from_another_origin_of_the_site_is_refused(server: RunningServer, headers) -> None:
    async with stream(server, "victim") as victim:
        forged = await victim.post("refresh_token", headers)
        assert forged.status_code == 403, forged.text
        detail = forged.json()["detail"]
        assert "another origin" in detail, detail
        assert "cookie" in detail, detail
        # nothing of the refused POST reached the stream: the next control frame answers the next POST
        assert (await victim.post("ping", {})).status_code == 200
        assert await victim.control_frame() == "pong"


@pytest.mark.parametrize(
    "headers",
    [
        {},  # not a browser: hypha-rpc's Python client sends neither header
        {"Sec-Fetch-Site": "same-origin", "Origin": "{own}"},  # hypha-rpc's JS client on the hub's own page
        {"Origin": "{own}"},  # a browser without Fetch Metadata, on the hub's page
        {"Sec-Fetch-Site": "none"},  # typed or bookmarked by the user, no page behind it
    ],
    ids=["no-browser-headers", "same-origin", "own-origin", "user-initiated"],
)
async def test_the_cookie_from_the_hubs_own_origin_or_a_non_browser_is_accepted(server: RunningServer, headers) -> None:
    headers = {k: v.replace("{own}", server.url) for k, v in headers.items()}
    async with stream(server, "own") as own:
        assert (await own.post("ping", headers)).status_code == 200
        assert await own.control_frame() == "pong"


async def test_the_public_url_is_an_own_origin_behind_a_proxy(server: RunningServer) -> None:
    public = server.hub.settings.public_base_url.rstrip("/")
    async with stream(server, "proxied") as proxied:
        reply = await proxied.post("ping", {"Origin": public, "Host": "internal:8080"})
        assert reply.status_code == 200, reply.text


async def test_a_token_of_the_streams_user_still_works_from_another_origin(server: RunningServer, connect) -> None:
    token = await (await connect(client_id="owner")).generate_token()
    async with stream(server, "tokened", token=token) as tokened:
        headers = {"Origin": SIBLING, "Sec-Fetch-Site": "same-site", "Authorization": f"Bearer {token}"}
        assert (await tokened.post("ping", headers)).status_code == 200
        assert await tokened.control_frame() == "pong"

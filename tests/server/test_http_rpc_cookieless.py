"""HTTP streaming for clients that keep no cookie: the refusal says what to do.

A POST to ``/rpc`` speaks as a stream's peer, so it must prove it owns the
stream: the stream's cookie, or a token of the peer's user. hypha-rpc's
JavaScript client sends neither when it is anonymous and cannot keep cookies
(Node's fetch keeps none; a page on another origin sends none, and the hub
allows no credentials cross-origin). Client ids are public, so a POST by id
alone is refused; the refusal names the remedy, a token. A cross-origin
anonymous stream could never work, so it is refused when it opens.
"""

from __future__ import annotations

import httpx
import msgpack
import pytest

pytestmark = pytest.mark.timeout(30)

OTHER_ORIGIN = "http://127.0.0.1:8000"


def _says_what_to_do(detail: str) -> None:
    assert "token" in detail
    assert "README" in detail


async def test_a_cross_origin_anonymous_stream_is_refused_with_the_remedy(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        reply = await http.get("/rpc", params={"client_id": "page"}, headers={"Origin": OTHER_ORIGIN})
    assert reply.status_code == 403
    assert reply.headers["access-control-allow-origin"] == "*", "readable by the page, so it can show why"
    _says_what_to_do(reply.json()["detail"])
    assert not server.hub.peers, "nothing was attached"


async def test_same_origin_and_token_streams_still_open(server, connect):
    token = await (await connect(client_id="owner")).generate_token()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        for client_id, headers in (
            ("same-origin", {"Origin": server.url}),  # a page served by the hub: its cookie comes back
            ("with-token", {"Origin": OTHER_ORIGIN, "Authorization": f"Bearer {token}"}),
        ):
            async with http.stream("GET", "/rpc", params={"client_id": client_id}, headers=headers) as response:
                assert response.status_code == 200, client_id


async def test_a_post_without_cookie_or_token_is_refused_with_the_remedy(server):
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10) as owner,
        owner.stream("GET", "/rpc", params={"client_id": "nodejs"}) as stream,
    ):
        assert stream.status_code == 200
        workspace = next(iter(server.hub.peers)).partition("/")[0]
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as cookieless:
            reply = await cookieless.post(
                "/rpc", content=msgpack.packb({"type": "ping"}), params={"client_id": "nodejs", "workspace": workspace}
            )
        assert reply.status_code == 403
        detail = reply.json()["detail"]
        assert "not the owner" in detail
        _says_what_to_do(detail)


async def test_the_older_workspace_path_form_works(server, connect):
    """hypha-rpc's JavaScript client before 0.21.40 used ``/{workspace}/rpc`` (``public``: not chosen yet)."""
    token = await (await connect(client_id="owner")).generate_token()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        async with http.stream("GET", "/public/rpc", params={"client_id": "old-anon"}) as response:
            assert response.status_code == 200
            peer = next(p for p in server.hub.peers if p.endswith("/old-anon"))
            workspace = peer.partition("/")[0]
            ping = msgpack.packb({"type": "ping"})
            assert (
                await http.post(f"/{workspace}/rpc", content=ping, params={"client_id": "old-anon"})
            ).status_code == 200
        bearer = {"Authorization": f"Bearer {token}"}
        owner_ws = next(p for p in server.hub.peers if p.endswith("/owner")).partition("/")[0]
        async with http.stream("GET", f"/{owner_ws}/rpc", params={"client_id": "old-tok"}, headers=bearer) as response:
            assert response.status_code == 200
            assert f"{owner_ws}/old-tok" in server.hub.peers

"""A reconnection token never outlives the credential it descends from (issue 21, item 4).

The attacker holds a short-lived token (a 3 s grant, a leaked token already
revoked by expiry): the reconnection token it yields, and every refresh of it,
expires with that grant, on the connection and on a new one. An anonymous
user has no credential and keeps the configured lifetime.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from websockets.asyncio.client import connect as ws_connect

from support.tokens import claims, credential, first_reply, past
from switchboard.testing.hub import RunningServer

LIFE = 3.0  # seconds the attacker's credential is valid


async def _refresh(ws: Any) -> str:
    await ws.send(json.dumps({"type": "refresh_token"}))
    for _ in range(20):  # bounded: the answer is the next text frame but for pongs
        frame = await asyncio.wait_for(ws.recv(), 5)
        if isinstance(frame, str) and json.loads(frame).get("type") == "reconnection_token":
            token: str = json.loads(frame)["reconnection_token"]
            return token
    raise AssertionError("no reconnection_token answered refresh_token")


async def test_a_short_credentials_reconnection_token_expires_with_it(server: RunningServer) -> None:
    token, expires = credential("alice", LIFE)
    async with ws_connect(server.url.replace("http", "ws", 1) + "/ws", open_timeout=5) as ws:
        hello = {"client_id": "worker", "workspace": None, "token": token, "reconnection_token": None}
        await ws.send(json.dumps(hello))
        info = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert info["type"] == "connection_info", info
        resume = info["reconnection_token"]
        assert claims(resume)["exp"] <= expires, "the reconnection token outlives the credential"
        assert claims(await _refresh(ws))["exp"] <= expires, "a refresh outlives the credential"
        await past(expires)
        renewed = await _refresh(ws)  # the connection is still open: the refresh itself must not extend
        assert claims(renewed)["exp"] <= expires, "a refresh after the credential expired extends it"
    for candidate in (resume, renewed):
        reply = await first_reply(server.url, "worker", reconnection_token=candidate, workspace=info["workspace"])
        assert reply["type"] == "error", f"reconnected after the credential expired: {reply}"
        assert "token has expired" in reply["message"]


async def test_nor_can_an_http_streaming_client(server: RunningServer) -> None:
    token, expires = credential("frank", LIFE)
    info = await first_reply(server.url, "franks-stream", token=token)
    resume = info["reconnection_token"]
    await past(expires)
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
        query = {"client_id": "franks-stream", "workspace": info["workspace"], "reconnection_token": resume}
        async with http.stream("GET", "/rpc", params=query) as response:
            assert response.status_code == 401, "a stream opened after the credential expired"
            body = (await response.aread()).decode()
    assert "token has expired" in body


async def test_an_unmodified_client_cannot_resume_after_its_credential_expired(server: RunningServer) -> None:
    token, expires = credential("bob", LIFE)
    client = await connect_to_server({"server_url": server.url, "client_id": "bobs-worker", "token": token})
    resume = client.config["reconnection_token"]
    workspace = client.config["workspace"]
    await client.disconnect()
    await past(expires)
    with pytest.raises(Exception, match="token has expired"):  # noqa: PT011 - hypha-rpc raises several types
        await connect_to_server(
            {
                "server_url": server.url,
                "client_id": "bobs-worker",
                "workspace": workspace,
                "reconnection_token": resume,
            }
        )


async def test_an_anonymous_user_keeps_the_configured_lifetime(server: RunningServer) -> None:
    info = await first_reply(server.url, "guest")
    assert info["type"] == "connection_info", info
    lifetime = server.hub.settings.reconnection_token_lifetime
    resume = info["reconnection_token"]
    assert claims(resume)["exp"] >= time.time() + lifetime - 60
    again = await first_reply(server.url, "guest", reconnection_token=resume)
    assert again["type"] == "connection_info", again
    assert claims(again["reconnection_token"])["exp"] >= time.time() + lifetime - 60  # renewed, still unbounded


async def test_a_token_minted_with_a_short_credential_expires_with_it(server: RunningServer) -> None:
    """A token's lifetime never grows through what is derived from it: an admin
    holding a 3 s grant cannot mint a day-long token for its workspace."""
    token, expires = credential("carol", LIFE)
    client = await connect_to_server({"server_url": server.url, "client_id": "carols-minter", "token": token})
    try:
        minted = await client.generate_token({"permission": "read", "expires_in": 86400})
    finally:
        await client.disconnect()
    assert claims(minted)["exp"] <= expires, "a generated token outlives the credential it was minted with"
    await past(expires)
    reply = await first_reply(server.url, "carols-guest", token=minted)
    assert reply["type"] == "error", f"joined with a token minted from an expired credential: {reply}"
    assert "token has expired" in reply["message"]


async def test_an_anonymous_user_mints_tokens_of_the_lifetime_it_asks_for(server: RunningServer) -> None:
    client = await connect_to_server({"server_url": server.url, "client_id": "anon-minter"})
    try:
        minted = await client.generate_token({"permission": "read", "expires_in": 7200})
    finally:
        await client.disconnect()
    assert claims(minted)["exp"] >= time.time() + 7200 - 60

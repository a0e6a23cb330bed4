"""Revoking a credential cuts it off, and everything that descends from it (issue 37, item 5). The attacker holds
a leaked admin token: its connections are closed when it is revoked, a session opened with it mints nothing
more, and the tokens it minted (and those minted from them) stop working too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.tokens import claims, first_reply
from switchboard.clock import SystemClock
from switchboard.errors import AuthError
from switchboard.hub.identity.auth import MAX_TOKEN_CHAIN, TokenIssuer, child_user
from switchboard.hub.identity.users import Permission, User
from switchboard.testing.hub import TEST_SECRET, RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

LAB = "lab_shared"  # an operator's name: grants in it are handed out before any record


@pytest.fixture
async def hub() -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests()) as srv:
        yield srv


def grant(user_id: str, permission: Permission = Permission.ADMIN) -> str:
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    user = User(id=user_id, grants={LAB: permission})
    return issuer.issue(user, workspace=LAB, permission=permission, expires_in=600)


async def client(hub: RunningServer, client_id: str, token: str) -> Any:
    return await connect_to_server({"server_url": hub.url, "client_id": client_id, "token": token})


async def refused(hub: RunningServer, token: str, client_id: str) -> None:
    reply = await first_reply(hub.url, client_id, token=token)
    assert reply["type"] == "error", f"a token descended from a revoked credential still connects: {reply}"
    assert "revoked" in reply["message"]
    async with httpx.AsyncClient(base_url=hub.url, timeout=5) as http:
        response = await http.get(f"/{LAB}/services", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401, response.text


async def closed(raw: ClientConnection) -> int | None:
    """The close code the hub ends ``raw`` with; ``None`` if it is still open after 20 frames, 5 s each."""
    try:
        for _ in range(20):  # bounded: frames before the close are skipped
            await asyncio.wait_for(raw.recv(), 5)
    except ConnectionClosed:
        return raw.close_code
    except TimeoutError:
        pass
    return None


async def test_a_revoked_credentials_open_connections_are_closed(hub: RunningServer) -> None:
    leaked = grant("mallory")
    async with ws_connect(hub.url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as raw:
        await raw.send(json.dumps({"client_id": "thief", "workspace": LAB, "token": leaked}))
        assert json.loads(await asyncio.wait_for(raw.recv(), 5))["type"] == "connection_info"
        operator = await client(hub, "operator", grant("olga"))
        try:
            await operator.revoke_token(leaked)
        finally:
            await operator.disconnect()
        assert await closed(raw) == 1008
        assert "revoked" in raw.close_reason


async def test_revoking_a_credential_revokes_the_tokens_minted_from_it_and_from_those(hub: RunningServer) -> None:
    leaked = grant("mallory")
    first = await client(hub, "m1", leaked)
    child = await first.generate_token({"workspace": LAB, "permission": "admin"})
    second = await client(hub, "m2", child)
    grandchild = await second.generate_token({"workspace": LAB, "permission": "admin"})
    resume = second.config["reconnection_token"]
    operator = await client(hub, "operator", grant("olga"))
    try:
        await operator.revoke_token(leaked)
    finally:
        for c in (operator, first, second):
            await c.disconnect()
    await refused(hub, child, "m3")
    await refused(hub, grandchild, "m4")
    resumed = await first_reply(hub.url, "m2", reconnection_token=resume, workspace=LAB)
    assert resumed["type"] == "error"
    assert "revoked" in resumed["message"]


async def test_a_session_whose_credential_was_revoked_mints_nothing(hub: RunningServer) -> None:
    """Even if the notice that closes it never reached its replica: each mint asks the revocations."""
    leaked = grant("mallory")
    session = await client(hub, "m1", leaked)
    try:
        # revoked in the store only, as if the notice to close its connections had been lost
        await hub.hub.gate.credentials.revocations.revoke(
            claims(leaked)["jti"], until=claims(leaked)["exp"] + 60, principal="mallory"
        )
        with pytest.raises(RemoteException, match="revoked"):
            await session.generate_token({"workspace": LAB, "permission": "admin"})
    finally:
        await session.disconnect()


async def test_the_holder_revoking_its_own_token_gets_the_answer(hub: RunningServer) -> None:
    token = grant("carol")
    session = await client(hub, "carol", token)
    try:
        await asyncio.wait_for(session.revoke_token(token), 10)
        # then its connection is closed too, as every one standing on the revoked credential
        await eventually(lambda: f"{LAB}/carol" not in hub.hub.peers, "the revoker's connection closed")
    finally:
        await session.disconnect()
    await refused(hub, token, "carol-again")


def test_a_chain_of_generated_tokens_is_bounded_and_each_carries_its_ancestry() -> None:
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    user = issuer.verify(grant("root-of-chain"))
    ancestry: list[str] = []
    for _ in range(MAX_TOKEN_CHAIN):
        assert user.token_id is not None
        ancestry.insert(0, user.token_id)
        child = child_user(user, workspace=LAB, permission=Permission.ADMIN)
        token = issuer.issue(child, workspace=LAB, permission=Permission.ADMIN, expires_in=60)
        user = issuer.verify(token)
        assert user.revocation_ids[1:] == tuple(ancestry)
    with pytest.raises(AuthError, match="generations"):
        child_user(user, workspace=LAB, permission=Permission.ADMIN)

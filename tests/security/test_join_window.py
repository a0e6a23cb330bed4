"""Deletion and revocation are decided when a session joins its workspace, not on a read taken before a wait
(issue 37, item 1). The attacker is a read member: it holds a connection that never answers a ping and opens a
second one with the same client id, so the hub waits (up to 2 s) on the first one's ping between the admission
check and the join; the owner deletes the workspace, or revokes the member's token, in that window. The second
connection must be refused or closed, and no reconnection token descended from an older credential passes the
workspace's tombstone."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import jwt
import pytest
from hypha_rpc.rpc import RemoteException
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.tokens import credential
from switchboard.hub.identity.auth import AUDIENCE, ISSUER
from switchboard.testing.hub import TEST_SECRET, RunningServer

pytestmark = pytest.mark.timeout(60)

FRAME_WAIT = 5.0  # seconds one frame may take on loopback


def login_token(user_id: str) -> str:
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode(claims, TEST_SECRET)


async def open_raw(url: str, **first: Any) -> ClientConnection:
    raw = await ws_connect(url, open_timeout=5, close_timeout=2)
    await raw.send(json.dumps(first))
    return raw


async def outcome(raw: ClientConnection, *, frames: int = 20) -> tuple[str, int | None, str]:
    """How a raw connection ends up: ``("closed", code, reason)`` once the hub closes it (admitted first or not),
    else ``("open", None, "")`` if it is still open after the frames it was sent (at most ``frames``, each within
    :data:`FRAME_WAIT`); the connection is closed by us then."""
    try:
        for _ in range(frames):
            await asyncio.wait_for(raw.recv(), FRAME_WAIT)
    except ConnectionClosed:
        return "closed", raw.close_code, raw.close_reason
    except TimeoutError:
        pass
    await raw.close()
    return "open", None, ""


async def admitted(raw: ClientConnection) -> dict[str, Any]:
    info = json.loads(await asyncio.wait_for(raw.recv(), FRAME_WAIT))
    assert info["type"] == "connection_info", info
    return dict(info)


async def team(server: RunningServer, connect: Any) -> tuple[Any, Any, str, str, str]:
    """alice's workspace, her connections outside and inside it, and a read member's token:
    ``(alice, owner, ws, url, member)``."""
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    ws = f"team-{uuid.uuid4().hex[:10]}"
    await alice.create_workspace({"id": ws})
    owner = await connect(client_id="owner", workspace=ws, token=login_token("alice"))
    member = await owner.generate_token({"permission": "read"})
    return alice, owner, ws, server.url.replace("http", "ws", 1) + "/ws", member


async def second_connection_in_the_window(url: str, ws: str, member: str) -> tuple[ClientConnection, ClientConnection]:
    """The member's mute first connection and its second one, the second held between admission and join:
    the hub pings the first (which never answers) before the second may take the client id."""
    mute = await open_raw(url, client_id="m", workspace=ws, token=member)
    await admitted(mute)
    second = await open_raw(url, client_id="m", workspace=ws, token=member)
    ping = await asyncio.wait_for(mute.recv(), FRAME_WAIT)  # the hub asks the first one whether it lives
    assert isinstance(ping, bytes)
    return mute, second


async def test_a_deletion_during_the_join_window_reaches_the_joining_connection(server, connect) -> None:
    alice, _, ws, url, member = await team(server, connect)
    mute, second = await second_connection_in_the_window(url, ws, member)
    await alice.delete_workspace(ws)
    assert await outcome(second) == ("closed", 1008, f"Workspace {ws} was deleted")
    assert (await outcome(mute))[:2] == ("closed", 1008)


async def test_a_revocation_during_the_join_window_reaches_the_joining_connection(server, connect) -> None:
    _, owner, ws, url, member = await team(server, connect)
    mute, second = await second_connection_in_the_window(url, ws, member)
    await owner.revoke_token(member)
    state, code, reason = await outcome(second)
    assert (state, code) == ("closed", 1008)
    assert "revoked" in reason
    assert (await outcome(mute))[:2] == ("closed", 1008)


async def test_no_reconnection_token_launders_a_credential_older_than_a_deletion(server, connect) -> None:
    """A member's credential was issued before the deletion; its reconnection token (and the one a reconnection
    hands out again) is signed after it: the tombstone still compares the credential's issue time."""
    _, _, ws, url, _ = await team(server, connect)
    issued = int(time.time()) - 100
    old = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "mel", "iat": issued, "exp": issued + 3600, "scope": f"ws:{ws}#r"},
        TEST_SECRET,
    )
    first = await open_raw(url, client_id="mel", workspace=ws, token=old)
    resume = (await admitted(first))["reconnection_token"]
    await first.close()
    again = await open_raw(url, client_id="mel", workspace=ws, reconnection_token=resume)
    refreshed = (await admitted(again))["reconnection_token"]
    await again.close()
    # the workspace was deleted after the credential was issued, before both reconnection tokens were signed
    await server.hub.http.workspaces.mark_deleted(ws, issued + 50, ttl=3600, principal="owner")
    for token in (resume, refreshed):
        back = await open_raw(url, client_id="mel", workspace=ws, reconnection_token=token)
        assert await outcome(back) == ("closed", 1008, f"Workspace {ws} was deleted")


async def test_a_credential_older_than_a_deletion_mints_no_token_for_the_workspace(server, connect) -> None:
    """An admin grant issued before the deletion, used from a session elsewhere: a token minted now would carry a
    fresh issue time past the tombstone."""
    _, _, ws, _, _ = await team(server, connect)
    issued = int(time.time()) - 100
    grant = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "olga", "iat": issued, "exp": issued + 3600, "scope": f"ws:{ws}#a"},
        TEST_SECRET,
    )
    olga = await connect(client_id="olga", token=grant)  # in her own workspace
    await server.hub.http.workspaces.mark_deleted(ws, issued + 50, ttl=3600, principal="owner")
    with pytest.raises(RemoteException, match=f"Workspace {ws} was deleted"):
        await olga.generate_token({"workspace": ws, "permission": "read"})

"""A deleted workspace stays deleted for the tokens that granted it: after ``delete_workspace`` its former
owner's reconnection token, a member's token and a client in transit at the deletion are refused (close
1008, ``Workspace <ws> was deleted``; HTTP 403), even once it is created again: then only the owners of
the new record enter, by their ownership."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.tokens import credential
from switchboard.hub.gate.admission import deletion_refusal
from switchboard.hub.identity.auth import AUDIENCE, ISSUER
from switchboard.hub.identity.users import User
from switchboard.testing.hub import TEST_SECRET

pytestmark = pytest.mark.timeout(60)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def login_token(user_id: str) -> str:
    """A first-hand credential naming no current workspace (an identity provider's login token, no ``iat``)."""
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode(claims, TEST_SECRET)


async def hello(url: str, **first: str) -> tuple[dict | None, int | None, str]:
    """Open a raw connection with ``first`` as its first frame: ``(connection_info, None, "")`` if admitted
    (then closed by us), else ``(None, close code, close reason)``; bounded by 5 s per frame, 20 frames."""
    async with ws_connect(url, open_timeout=5, close_timeout=2) as raw:
        await raw.send(json.dumps(first))
        try:
            for _ in range(20):
                frame = json.loads(await asyncio.wait_for(raw.recv(), 5))
                if frame.get("type") == "connection_info":
                    return frame, None, ""
        except ConnectionClosed:
            return None, raw.close_code, raw.close_reason
    raise AssertionError("neither admitted nor refused")


async def deleted_team(server, connect):
    """alice's workspace with an owner's connection, a member token and a client dropped mid-session;
    then deleted. Returns what each held before the deletion."""
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    ws = fresh("team")
    await alice.create_workspace({"id": ws})
    url = server.url.replace("http", "ws", 1) + "/ws"
    owner_info, _, _ = await hello(url, client_id="owner", workspace=ws, token=login_token("alice"))
    assert owner_info is not None
    owner = await connect(client_id="minter", workspace=ws, token=login_token("alice"))
    member = await owner.generate_token({"permission": "read_write"})
    # a client whose connection drops (no close handshake): in transit when the workspace goes
    raw = await ws_connect(url, open_timeout=5, close_timeout=2)
    await raw.send(json.dumps({"client_id": "roamer", "workspace": ws, "token": member}))
    roamer_info = json.loads(await asyncio.wait_for(raw.recv(), 5))
    assert roamer_info["type"] == "connection_info"
    raw.transport.abort()
    await alice.delete_workspace(ws)
    return alice, ws, url, owner_info["reconnection_token"], member, roamer_info["reconnection_token"]


async def test_tokens_issued_before_the_deletion_do_not_enter_it_again(server, connect):
    _, ws, url, owner_resume, member, roamer_resume = await deleted_team(server, connect)
    gone = (None, 1008, f"Workspace {ws} was deleted")
    tried = {
        "owner's reconnection token": await hello(
            url, client_id="owner", workspace=ws, reconnection_token=owner_resume
        ),
        "member's token": await hello(url, client_id="member", workspace=ws, token=member),
        "in transit": await hello(url, client_id="roamer", workspace=ws, reconnection_token=roamer_resume),
    }
    assert {k: v[1:] for k, v in tried.items()} == {k: gone[1:] for k in tried}
    assert all(v == gone for v in tried.values())
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        for path in (f"/{ws}/services", f"/{ws}/services/~/list_services"):
            refused = await http.get(path, headers={"Authorization": f"Bearer {member}"})
            assert refused.status_code == 403, path
            assert refused.json()["detail"].endswith(f"Workspace {ws} was deleted")


async def test_a_stranger_creating_it_again_lets_none_of_its_old_tokens_in(server, connect):
    """bob takes the name alice deleted: the tokens alice's workspace granted (a member's, a
    client's in transit, alice's own reconnection token) reach nothing in bob's; bob enters by
    his ownership, with a token issued before the deletion."""
    _, ws, url, owner_resume, member, roamer_resume = await deleted_team(server, connect)
    bob_login = login_token("bob")
    bob = await connect(client_id="bob", token=bob_login)
    await bob.create_workspace({"id": ws})
    gone = f"Workspace {ws} was deleted"
    assert (await hello(url, client_id="member", workspace=ws, token=member))[1:] == (1008, gone)
    assert (await hello(url, client_id="roamer", workspace=ws, reconnection_token=roamer_resume))[1:] == (1008, gone)
    assert (await hello(url, client_id="owner", workspace=ws, reconnection_token=owner_resume))[1:] == (1008, gone)
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
        response = await http.get(f"/{ws}/services", headers={"Authorization": f"Bearer {member}"})
    assert response.status_code == 403, response.text
    info, _, _ = await hello(url, client_id="bobs-desk", workspace=ws, token=bob_login)
    assert info is not None
    assert info["workspace"] == ws
    assert info["user"]["id"] == "bob"


async def test_an_owner_creating_it_again_lets_its_tokens_in(server, connect):
    alice, ws, url, owner_resume, member, _ = await deleted_team(server, connect)
    await alice.create_workspace({"id": ws})
    info, _, _ = await hello(url, client_id="owner", workspace=ws, token=login_token("alice"))
    assert info is not None
    assert info["workspace"] == ws
    assert (await hello(url, client_id="owner", workspace=ws, reconnection_token=owner_resume))[0] is not None


def test_the_rule_compares_the_tokens_issue_time_with_the_deletion() -> None:
    def user(iat: float | None) -> User:
        return User(id="bob", issued_at=iat)

    assert deletion_refusal(user(100.0), "team-a", None) is None  # never deleted
    assert deletion_refusal(user(99.0), "team-a", 100.5) == "Workspace team-a was deleted"
    assert deletion_refusal(user(None), "team-a", 100.5) == "Workspace team-a was deleted"  # no iat: older
    assert deletion_refusal(user(101.0), "team-a", 100.5) is None  # issued after


async def test_deleting_the_record_of_a_personal_workspace_does_not_lock_its_user_out(server, connect):
    team = fresh("team")
    before = credential("alice", 3600)[0]  # issued before the deletion
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    await alice.create_workspace({"id": team})
    elsewhere = await connect(client_id="alice-2", workspace=team, token=login_token("alice"))
    await elsewhere.create_workspace({"id": "ws-user-alice", "persistent": True}, overwrite=True)
    await elsewhere.delete_workspace("ws-user-alice")
    url = server.url.replace("http", "ws", 1) + "/ws"
    info, _, _ = await hello(url, client_id="alice-3", workspace="ws-user-alice", token=before)
    assert info is not None

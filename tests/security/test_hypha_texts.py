"""Where Switchboard refuses what Hypha refuses, its refusal carries Hypha's words (issue 38, item 7),
so an application matching on them keeps working; Switchboard's own detail may follow them.

Each refusal is played by the one it stops, with an unmodified hypha-rpc client: a second client
taking an active client's id (the same user, and another one), a revoked token, a token restricted
to another client id, an anonymous client and a stranger joining a workspace another user created,
and subscriptions to another workspace's events. The strings are Hypha 0.21.137's
(``hypha/websocket.py``, ``hypha/core/store.py``, ``hypha/core/workspace.py``), matched as Hypha's
own tests match them.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import jwt
import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from support.tokens import credential, first_reply
from switchboard.hub.identity.auth import AUDIENCE, ISSUER
from switchboard.testing.hub import TEST_SECRET

pytestmark = pytest.mark.timeout(60)


def login(user_id: str) -> str:
    """A registered user's credential naming no current workspace (it may ask to join any)."""
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode({**claims, "https://amun.ai/roles": []}, TEST_SECRET)


async def _refusal(server: Any, **config: Any) -> str:
    """What hypha-rpc raises when the hub refuses its connection."""
    with pytest.raises(ConnectionAbortedError) as refused:
        await connect_to_server({"server_url": server.url, "method_timeout": 10, **config})
    return str(refused.value)


async def test_a_second_client_with_an_active_clients_id_hears_it_already_exists_and_is_active(connect, server) -> None:
    alice_token = credential("alice", 3600)[0]
    first = await connect(client_id="my-app", token=alice_token)
    ws = first.config["workspace"]
    said = await _refusal(server, client_id="my-app", token=alice_token)
    assert f"Client already exists and is active: {ws}/my-app" in said
    # Hypha's test_connect_to_server_two_client_same_id: an anonymous client's generated token is
    # another user here, who may not take the id either; the refusal starts with the same words
    anonymous = await connect(client_id="anon-app")
    token = await anonymous.generate_token()
    said = await _refusal(server, client_id="anon-app", token=token, workspace=anonymous.config["workspace"])
    assert "Client already exists and is active:" in said
    assert "belongs to another user" in said


async def test_a_revoked_token_is_refused_with_token_has_been_revoked(connect, server) -> None:
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    token = await owner.generate_token()
    await owner.revoke_token(token)
    assert "Token has been revoked" in await _refusal(server, client_id="holder", token=token, workspace=ws)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        answer = await http.get(f"/{ws}/services", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401
    assert "Token has been revoked" in answer.json()["detail"]


async def test_a_token_restricted_to_another_client_id_is_refused_with_client_id_mismatch(connect, server) -> None:
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    token = await owner.generate_token({"client_id": "allowed-client"})
    said = await _refusal(server, client_id="unauthorized-client", token=token, workspace=ws)
    assert "Client id mismatch" in said
    assert "allowed-client" in said
    # a reconnection token names its client: another client id presenting it is refused alike
    resumed = await first_reply(
        server.url, "not-the-owner", reconnection_token=owner.config["reconnection_token"], workspace=ws
    )
    assert resumed["type"] == "error"
    assert "Client id mismatch" in resumed["message"]


async def test_joining_a_workspace_another_user_created_is_permission_denied_even_when_nobody_is_in_it(
    connect, server
) -> None:
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    ws = f"team-{uuid.uuid4().hex[:10]}"
    await alice.create_workspace({"name": ws})
    await alice.disconnect()  # nobody is in it: its record alone says it exists
    expected = f"Permission denied for workspace: {ws}"
    assert expected in await _refusal(server, client_id="anonymous", workspace=ws)
    assert expected in await _refusal(server, client_id="mallory", token=login("mallory"), workspace=ws)
    # a workspace that has no record and nobody in it is not there, as in Hypha
    unknown = f"team-{uuid.uuid4().hex[:10]}"
    said = await _refusal(server, client_id="anonymous", workspace=unknown)
    assert f"Workspace {unknown} does not exist or is not accessible" in said


FORBIDDEN = ["ws-other-workspace/service_added", "workspace:another/event", "other/workspace/event", "ws-user-x:news"]


async def test_a_subscription_to_another_workspaces_events_is_forbidden_in_hyphas_words(connect) -> None:
    client = await connect(client_id="listener", token=credential("listener", 3600)[0])
    own = client.config["workspace"]
    for name in FORBIDDEN:
        with pytest.raises(RemoteException) as refused:
            await client.subscribe(name)
        said = str(refused.value)
        assert f"Subscription to event '{name}' is forbidden" in said
        if "/" in name:
            assert f"does not match your workspace '{own}'" in said
    suffix = own.rpartition("-")[2]
    with pytest.raises(Exception, match=re.escape(f"Subscription to event 'ws-{suffix}/secret_event' is forbidden")):
        await client.subscribe(f"ws-{suffix}/secret_event")
    # its own workspace's events and the server's stay open to it
    assert await client.subscribe([f"{own}/custom_event", "service_added", "my_custom_event"])

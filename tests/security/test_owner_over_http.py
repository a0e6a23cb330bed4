"""A workspace record's owner is that workspace's admin on every door, not only the WebSocket
(issue 38, item 6).

Alice creates ``team-…`` (its record names her) and signs in with a login credential that grants
nothing there: the WebSocket admits her as admin by her ownership, and so must each HTTP door:
the service routes (a call, an info, a listing), ``/{ws}/info``, the manager route
``/{ws}/services/~/…``, the status API and the ``/rpc`` transport. Mallory, a registered user
the record does not name, holding the same kind of credential, is refused on each of them, and
Bob, whom the record only invites, gains nothing by the invitation.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import jwt
import msgpack
import pytest

from support.tokens import credential
from switchboard.hub.identity.auth import AUDIENCE, ISSUER
from switchboard.testing.hub import TEST_SECRET

pytestmark = pytest.mark.timeout(60)


def login_token(user_id: str) -> str:
    """A first-hand credential naming no current workspace, as an identity provider's login token."""
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode({**claims, "https://amun.ai/roles": []}, TEST_SECRET)


async def _team(connect: Any) -> tuple[str, Any]:
    """Alice's workspace with a provider offering a protected service that reports its caller."""
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    ws = f"team-{uuid.uuid4().hex[:10]}"
    await alice.create_workspace({"id": ws, "owners": ["alice", "bob"]})
    member = await alice.generate_token({"workspace": ws, "permission": "read_write"})
    provider = await connect(client_id="provider", token=member, workspace=ws)

    def who(context: dict[str, Any] | None = None) -> str:
        assert context is not None
        return f"{context['user']['id']}@{context['ws']}"

    await provider.register_service(
        {"id": "prot", "config": {"visibility": "protected", "require_context": True}, "who": who}
    )
    return ws, provider


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_an_owner_with_no_grant_there_is_its_admin_on_every_http_door(connect, server) -> None:
    ws, _ = await _team(connect)
    token = login_token("alice")
    # the WebSocket admits her as admin by her ownership alone ...
    on_ws = await connect(client_id="alice-ws", token=token, workspace=ws)
    assert (await on_ws.check_status())["user_permission"] == "a"
    # ... and so does every HTTP door
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(token), timeout=10) as http:
        called = await http.get(f"/{ws}/services/provider:prot/who")
        assert (called.status_code, called.json()) == (200, f"alice@{ws}")
        assert (await http.get(f"/{ws}/services/provider:prot")).status_code == 200
        listed = await http.get(f"/{ws}/services")
        assert f"{ws}/provider:prot" in [s["id"] for s in listed.json()]
        assert (await http.get(f"/{ws}/info")).json()["owners"] == ["alice"]
        clients = await http.get(f"/{ws}/services/~/list_clients", params={"workspace": ws})
        assert clients.status_code == 200, clients.text
        assert f"{ws}/provider" in [c["id"] for c in clients.json()]
        shown = {w["id"]: w for w in (await http.get("/api/status")).json()["workspaces"]}
        assert shown[ws]["readable"] is True
        assert "prot" in [s["id"].rpartition(":")[2] for s in shown[ws]["services"]]
    # the /rpc transport admits her as admin, as the WebSocket does ...
    on_http = await connect(client_id="alice-http", token=token, workspace=ws, transport="http")
    assert (await on_http.check_status())["user_permission"] == "a"
    assert await (await on_http.get_service(f"{ws}/provider:prot")).who() == f"alice@{ws}"
    # ... and takes her token, without the stream's cookie, as proof that a POST is hers
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(token), timeout=10) as cookieless:
        ping = msgpack.packb({"type": "ping"})
        posted = await cookieless.post("/rpc", content=ping, params={"client_id": "alice-http", "workspace": ws})
        assert posted.status_code == 200, posted.text


@pytest.mark.parametrize("user_id", ["mallory", "bob"], ids=["a stranger", "one only invited"])
async def test_a_user_the_record_does_not_name_an_owner_is_refused_on_every_http_door(
    connect, server, user_id: str
) -> None:
    ws, _ = await _team(connect)
    token = login_token(user_id)
    with pytest.raises(Exception, match="Permission denied"):
        await connect(client_id=f"{user_id}-ws", token=token, workspace=ws)
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(token), timeout=10) as http:
        assert (await http.get(f"/{ws}/services/provider:prot/who")).status_code == 403
        assert (await http.get(f"/{ws}/services/provider:prot")).status_code == 403
        assert f"{ws}/provider:prot" not in [s["id"] for s in (await http.get(f"/{ws}/services")).json()]
        assert (await http.get(f"/{ws}/info")).status_code == 403
        assert (await http.get(f"/{ws}/services/~/list_clients", params={"workspace": ws})).status_code == 403
        shown = {w["id"]: w for w in (await http.get("/api/status")).json()["workspaces"]}
        assert ws not in shown or shown[ws]["readable"] is False
        # the /rpc transport refuses the stream (hypha-rpc's HTTP client retries a refusal until it times out)
        async with http.stream("GET", "/rpc", params={"client_id": f"{user_id}-http", "workspace": ws}) as stream:
            assert stream.status_code == 403
            assert "Permission denied" in (await stream.aread()).decode()

"""Workspaces as records, with an unmodified hypha-rpc client: create, list, describe, delete,
bookmarks, summary, clean-up; each refused to an outsider and to a member with a weaker token."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import jwt
import pytest
from hypha_rpc.rpc import RemoteException
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.tokens import credential
from switchboard.hub.identity.auth import AUDIENCE, ISSUER
from switchboard.testing.hub import TEST_SECRET, running, settings_for_tests

pytestmark = pytest.mark.timeout(60)


def fresh(prefix: str) -> str:
    """A workspace name no other test (nor an earlier run on the shared state directory) used."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def token_of(user_id: str) -> str:
    return credential(user_id, 3600)[0]


def login_token(user_id: str, email: str | None = None, *, grants: str = "") -> str:
    """A first-hand credential naming no current workspace, as an identity provider's login token."""
    scope = f"ws:ws-user-{user_id}#a" + (f" {grants}" if grants else "")
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": scope}
    return jwt.encode({**claims, "https://amun.ai/email": email, "https://amun.ai/roles": []}, TEST_SECRET)


async def test_a_registered_user_creates_a_workspace_it_owns_and_administers(connect):
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("team")
    made = await alice.create_workspace({"id": ws, "description": "our lab", "persistent": False})
    assert made["owners"] == ["alice"]
    assert made["description"] == "our lab"
    assert made["created_at"]
    info = await alice.get_workspace_info(ws)
    assert (info["id"], info["owners"], info["persistent"], info["description"]) == (ws, ["alice"], False, "our lab")
    assert info["created_at"] == made["created_at"]
    assert ws in [w["id"] for w in await alice.list_workspaces()]
    # the owner mints tokens for it from anywhere (its record makes it the admin) ...
    admin_token = await alice.generate_token({"workspace": ws, "permission": "admin"})
    inside = await connect(client_id="alice-admin", token=admin_token, workspace=ws)
    assert (await inside.check_status())["user_permission"] == "a"
    # ... and joins it with a login credential that grants nothing there
    owner = await connect(client_id="alice-in", token=login_token("alice"), workspace=ws)
    assert owner.config["user"]["scope"]["workspaces"][ws] == "a"
    assert await owner.generate_token({"permission": "read"})
    bookmarks = (await alice.get_workspace_info())["config"]["bookmarks"]
    assert ws in [b["id"] for b in bookmarks]


async def test_creating_is_refused_to_anonymous_users_over_others_and_for_taken_names(connect):
    anonymous = await connect(client_id="anon")
    with pytest.raises(RemoteException, match="Only registered user can create workspace"):
        await anonymous.create_workspace({"id": fresh("team")})
    alice = await connect(client_id="alice", token=token_of("alice"))
    mallory = await connect(client_id="mallory", token=token_of("mallory"))
    ws = fresh("team")
    await alice.create_workspace({"id": ws})
    with pytest.raises(RemoteException, match="Workspace already exists"):
        await mallory.create_workspace({"id": ws})
    with pytest.raises(RemoteException, match="cannot overwrite"):
        await mallory.create_workspace({"id": ws, "owners": ["mallory"]}, overwrite=True)
    with pytest.raises(RemoteException, match="personal workspace of another user"):
        await mallory.create_workspace({"id": "ws-user-alice"})
    with pytest.raises(RemoteException, match="Invalid workspace name"):
        await mallory.create_workspace({"id": "NoHyphen"})
    # a workspace in use without a record belongs to its members: an outsider cannot claim it
    shared = fresh("shared")
    await connect(client_id="bob", token=login_token("bob", grants=f"ws:{shared}#rw"), workspace=shared)
    with pytest.raises(RemoteException, match="in use"):
        await mallory.create_workspace({"id": shared})
    assert (await alice.get_workspace_info(ws))["owners"] == ["alice"]


async def test_outsiders_and_weaker_members_cannot_read_or_delete_a_workspace(connect):
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("team")
    await alice.create_workspace({"id": ws})
    owner = await connect(client_id="owner", token=login_token("alice"), workspace=ws)
    mallory = await connect(client_id="mallory", token=token_of("mallory"))
    with pytest.raises(RemoteException, match="Permission denied"):
        await mallory.get_workspace_info(ws)
    with pytest.raises(RemoteException, match="Permission denied"):
        await mallory.delete_workspace(ws)
    assert ws not in [w["id"] for w in await mallory.list_workspaces()]
    for weaker in ("read", "read_write"):
        member = await connect(
            client_id=f"m-{weaker}", token=await owner.generate_token({"permission": weaker}), workspace=ws
        )
        assert (await member.get_workspace_info())["owners"] == ["alice"]
        with pytest.raises(RemoteException, match="Permission denied"):
            await member.delete_workspace(ws)
        with pytest.raises(RemoteException, match="Permission denied"):
            await member.cleanup()
    assert (await alice.get_workspace_info(ws))["id"] == ws


async def until_closed(raw) -> None:
    """Read until the hub closes the socket (bounded: at most 20 frames before the close are skipped)."""
    for _ in range(20):
        try:
            await asyncio.wait_for(raw.recv(), 5)
        except ConnectionClosed:
            return
    raise AssertionError("the hub did not close the connection")


async def test_deleting_ends_its_clients_sessions_with_a_reason(server, connect):
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("team")
    await alice.create_workspace({"id": ws})
    owner = await connect(client_id="owner", token=login_token("alice"), workspace=ws)
    member_token = await owner.generate_token({"permission": "read_write"})
    url = server.url.replace("http", "ws", 1) + "/ws"
    async with ws_connect(url, open_timeout=5, close_timeout=2) as raw:
        await raw.send(json.dumps({"client_id": "member", "workspace": ws, "token": member_token}))
        assert json.loads(await asyncio.wait_for(raw.recv(), 5))["type"] == "connection_info"
        await alice.delete_workspace(ws)
        await until_closed(raw)
        assert raw.close_code == 1008
        assert raw.close_reason == f"Workspace {ws} was deleted"
    with pytest.raises(RemoteException, match="Permission denied"):  # gone: its owner is an outsider now
        await alice.delete_workspace(ws)
    assert ws not in [w["id"] for w in await alice.list_workspaces()]
    assert ws not in [b["id"] for b in (await alice.get_workspace_info())["config"].get("bookmarks", [])]


async def test_list_workspaces_pages_and_matches(connect):
    alice = await connect(client_id="alice", token=token_of("alice"))
    tag = uuid.uuid4().hex[:6]
    names = sorted(f"page-{tag}-{i}" for i in range(3))
    for i, name in enumerate(names):
        await alice.create_workspace({"id": name, "persistent": i == 0})
    mine = [w for w in await alice.list_workspaces() if w["id"].startswith(f"page-{tag}")]
    assert [w["id"] for w in mine] == names
    assert set(mine[0]) == {"id", "name", "description", "read_only", "persistent", "owners"}
    persistent = await alice.list_workspaces({"persistent": True})
    assert names[0] in [w["id"] for w in persistent]
    assert names[1] not in [w["id"] for w in persistent]
    assert len(await alice.list_workspaces(None, 0, 1)) == 1
    with pytest.raises(RemoteException, match="Limit must be"):
        await alice.list_workspaces(None, 0, 1000)


async def test_bookmarks_summary_and_cleanup(connect):
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("team")
    await alice.create_workspace({"id": ws})
    await alice.unbookmark({"bookmark_type": "workspace", "id": ws})
    assert ws not in [b["id"] for b in (await alice.get_workspace_info())["config"].get("bookmarks", [])]
    await alice.register_service({"id": "calc", "config": {"visibility": "public"}, "add": lambda a, b: a + b})
    await alice.bookmark({"bookmark_type": "service", "id": "calc"})
    marks = (await alice.get_workspace_info())["config"]["bookmarks"]
    assert [m["bookmark_type"] for m in marks if m["id"].endswith("alice:calc")] == ["service"]
    summary = await alice.get_summary()
    assert summary["client_count"] == 1
    assert summary["clients"] == [f"{alice.config['workspace']}/alice"]
    assert any(s["id"].endswith(":calc") for s in summary["services"])
    assert await alice.cleanup() == {}  # every client answers
    # an empty non-persistent workspace is removed by its clean-up, as Hypha's
    assert await alice.cleanup(ws) == {"removed_workspace": ws, "removed_clients": []}
    with pytest.raises(RemoteException, match="Permission denied"):
        await alice.delete_workspace(ws)


async def test_a_persistent_workspace_survives_a_restart_of_the_embedded_hub(tmp_path, clients):
    settings = settings_for_tests(state_dir=str(tmp_path / "state"))
    ws = fresh("kept")
    async with running(settings) as hub:
        alice = await clients(hub.url, client_id="alice", token=token_of("alice"))
        await alice.create_workspace({"id": ws, "persistent": True, "description": "kept"})
        await alice.create_workspace({"id": ws + "-brief"})
        await alice.disconnect()
    async with running(settings) as hub:
        owner = await clients(hub.url, client_id="owner", token=login_token("alice"), workspace=ws)
        info = await owner.get_workspace_info()
        assert (info["owners"], info["persistent"], info["description"]) == (["alice"], True, "kept")
        assert (await owner.check_status())["user_permission"] == "a"
        assert [w["id"] for w in await owner.list_workspaces() if w["id"].startswith(ws)] == [ws]


async def test_hypha_info_routes_answer_over_http(server, connect):
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("team")
    await alice.create_workspace({"id": ws, "description": "our lab"})
    auth = {"Authorization": f"Bearer {login_token('alice')}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        health = await http.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "HEALTHY"
        config = (await http.get("/assets/config.json", headers=auth)).json()
        assert config["user"]["id"] == "alice"
        assert config["public_base_url"]
        assert config["hypha_version"]
        info = await http.get(f"/{ws}/info", headers=auth)
        assert info.status_code == 200
        assert (info.json()["owners"], info.json()["description"]) == (["alice"], "our lab")
        outsider = {"Authorization": f"Bearer {login_token('mallory')}"}
        refused = await http.get(f"/{ws}/info", headers=outsider)
        assert refused.status_code == 403
        assert refused.json() == {"success": False, "detail": f"mallory has no permission to access {ws}"}
        assert (await http.get(f"/{ws}/info")).status_code == 403  # anonymous


async def test_an_email_owner_is_admin_but_tokens_it_generates_inherit_its_email_not_its_rights(connect):
    alice = await connect(client_id="alice", token=login_token("alice", "alice@example.org"))
    ws = fresh("team")
    await alice.create_workspace({"id": ws, "owners": ["alice@example.org"]})
    assert (await alice.get_workspace_info(ws))["owners"] == ["alice@example.org"]
    owner = await connect(client_id="owner", token=login_token("alice", "alice@example.org"), workspace=ws)
    assert (await owner.check_status())["user_permission"] == "a"
    reader = await connect(client_id="reader", token=await owner.generate_token({"permission": "read"}), workspace=ws)
    assert reader.config["user"]["email"] == "alice@example.org"  # inherited, as in Hypha
    assert (await reader.check_status())["user_permission"] == "r"
    with pytest.raises(RemoteException, match="Permission denied"):
        await reader.delete_workspace(ws)
    with pytest.raises(RemoteException, match="Only admin can generate token"):
        await reader.generate_token({"workspace": ws, "permission": "admin"})

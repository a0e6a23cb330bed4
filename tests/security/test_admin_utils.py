"""``admin-utils``, Hypha's root service (issue 38, item 4): the root user reaches it from its workspace and each
function does what Hypha's does; nobody else does, by ``get_service`` or by asking the manager's RPC for it
directly: not an outsider, not an admin of a workspace, not a token root generated."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.tokens import credential
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import ROOT, Permission, User
from switchboard.testing.hub import TEST_SECRET, RunningServer

pytestmark = pytest.mark.timeout(60)


def root_token() -> str:
    """What ``switchboard token --root`` prints, for the tests' secret."""
    return TokenIssuer(TEST_SECRET, SystemClock()).issue(
        ROOT, workspace="ws-user-root", permission=Permission.ADMIN, expires_in=600
    )


@pytest.fixture
async def root(connect: Any) -> Any:
    return await connect(token=root_token())


@contextlib.asynccontextmanager
async def raw_connection(url: str, client_id: str, **hello: Any) -> AsyncIterator[Any]:
    """A client on raw frames: the close it receives is seen as sent (hypha-rpc would reconnect)."""
    async with ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as ws:
        first = {"client_id": client_id, "workspace": None, "token": None, "reconnection_token": None}
        await ws.send(json.dumps({**first, **hello}))
        info = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert info["type"] == "connection_info", info
        ws.workspace = info["workspace"]
        yield ws


@pytest.fixture
async def raw_client(server: RunningServer) -> AsyncIterator[Any]:
    """A client of its own anonymous workspace, on raw frames."""
    async with raw_connection(server.url, "victim") as ws:
        yield ws


async def _closed(ws: Any) -> tuple[int, str]:
    """The code and reason of the close ``ws`` receives (within 5 s, after at most 1000 frames)."""
    async with asyncio.timeout(5):
        for _ in range(1000):
            try:
                await ws.recv()
            except ConnectionClosed:
                return ws.close_code, ws.close_reason
    raise AssertionError("still open after 1000 frames")


async def test_the_root_user_reaches_admin_utils_from_its_workspace_as_in_hypha(
    root: Any, server: RunningServer
) -> None:
    listed = await root.list_services({"workspace": "ws-user-root"})
    assert [s["config"]["visibility"] for s in listed if s["id"].endswith(":admin-utils")] == ["protected"]
    admin = await root.get_service("admin-utils")
    assert admin["id"].startswith("ws-user-root/")
    assert admin["id"].endswith(":admin-utils")
    servers = await admin.list_servers()
    assert isinstance(servers, list)
    assert len(servers) == 1
    created = await root.create_workspace({"id": "test-admin-ws", "name": "test-admin-ws"}, overwrite=True)
    token = await root.generate_token({"workspace": created["id"]})
    async with raw_connection(server.url, "member", workspace=created["id"], token=token) as member:
        listed = {w["id"] for w in await admin.list_workspaces()}
        assert {"public", "ws-user-root", "test-admin-ws"} <= listed
        metrics = await admin.get_metrics()
        assert "rpc" in metrics
        assert "eventbus" in metrics
        assert any(name.startswith("switchboard_connected_clients") for name in metrics["rpc"])
        await admin.unload_workspace("test-admin-ws")
        assert await _closed(member) == (1001, "Workspace unloaded: test-admin-ws")
    assert "test-admin-ws" not in {w["id"] for w in await admin.list_workspaces()}


async def test_a_kickout_closes_the_client_with_the_code_and_reason_given(root: Any, raw_client: Any) -> None:
    admin = await root.get_service("admin-utils")
    await admin.kickout_client(raw_client.workspace, "victim", 4001, "maintenance")
    assert await _closed(raw_client) == (4001, "maintenance")
    with pytest.raises(Exception, match="Client not connected"):  # noqa: PT011 - hypha-rpc's error type
        await admin.kickout_client(raw_client.workspace, "nobody")
    with pytest.raises(Exception, match="code must be"):  # noqa: PT011
        await admin.kickout_client(raw_client.workspace, "victim", 1006)


def _workspace_admin() -> str:
    """An account's own credential: admin of its personal workspace, with the role ``user``."""
    return credential("alice", 600)[0]


def _operator_admin() -> str:
    """An operator's token with admin on a shared workspace (``switchboard token --permission admin``)."""
    user = User(id="op.ops", grants={"lab_shared": Permission.ADMIN})
    return TokenIssuer(TEST_SECRET, SystemClock()).issue(
        user, workspace="lab_shared", permission=Permission.ADMIN, expires_in=600
    )


@pytest.mark.parametrize("who", ["outsider", "workspace admin", "operator admin", "token root generated"])
async def test_nobody_but_root_reaches_admin_utils_not_even_by_asking_the_manager_directly(
    who: str, root: Any, connect: Any, raw_client: Any, server: RunningServer
) -> None:
    if who == "outsider":
        attacker = await connect()
    elif who == "workspace admin":
        attacker = await connect(token=_workspace_admin())
    elif who == "operator admin":
        attacker = await connect(token=_operator_admin(), workspace="lab_shared")
    else:  # admin of root's own workspace, carrying root's roles: still not root
        minted = await root.generate_token({"workspace": "ws-user-root", "permission": "admin"})
        attacker = await connect(token=minted, workspace="ws-user-root")
    with pytest.raises(Exception, match="Permission denied"):  # noqa: PT011
        await attacker.get_service("ws-user-root/admin-utils")
    for query in ({"workspace": "ws-user-root"}, {"workspace": "*", "service_id": "admin-utils"}):
        assert not [s for s in await attacker.list_services(query) if "admin-utils" in s["id"]], query
    with pytest.raises(Exception, match="Permission denied|Service not found"):  # noqa: PT011
        await attacker.get_service("admin-utils")  # its own workspace's: none, or root's refused
    direct = await attacker.rpc.get_remote_service(f"*/{server.hub.manager_id}:admin-utils")
    with pytest.raises(Exception, match="Permission denied: admin-utils serves only the root user"):  # noqa: PT011
        await direct.kickout_client(raw_client.workspace, "victim")
    with pytest.raises(Exception, match="Permission denied"):  # noqa: PT011
        await direct.list_workspaces()
    assert raw_client.close_code is None, "the victim was kicked out"


async def test_over_http_only_the_root_token_reaches_admin_utils(server: RunningServer) -> None:
    base = f"{server.url}/ws-user-root/services/admin-utils"
    async with httpx.AsyncClient(timeout=10) as http:
        listed = await http.get(f"{base}/list_servers", headers={"Authorization": f"Bearer {root_token()}"})
        assert listed.status_code == 200, listed.text
        assert listed.json() == [server.hub.replica_id]
        for headers in ({}, {"Authorization": f"Bearer {_workspace_admin()}"}):
            for path in ("", "/list_workspaces", "/kickout_client?workspace=public&client_id=x"):
                refused = await http.get(base + path, headers=headers)
                assert refused.status_code == 403, (path, refused.text)

"""Workspace records, environment, event log and service types are one hub's across two replicas."""

from __future__ import annotations

import asyncio
import json
import uuid

import jwt
import pytest
from hypha_rpc.rpc import RemoteException
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from switchboard.hub.identity.auth import AUDIENCE, ISSUER
from switchboard.testing.hub import TEST_SECRET

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def login_token(user_id: str) -> str:
    """A first-hand credential naming no current workspace (an identity provider's login token)."""
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode(claims, TEST_SECRET)


async def test_a_workspace_created_on_one_replica_is_listed_owned_and_deleted_on_another(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    ws = f"team-{uuid.uuid4().hex[:8]}"
    alice_a = await clients(a.url, client_id="alice-a", token=login_token("alice"))
    made = await alice_a.create_workspace({"id": ws, "description": "shared lab", "persistent": True})
    alice_b = await clients(b.url, client_id="alice-b", token=login_token("alice"))
    assert ws in [w["id"] for w in await alice_b.list_workspaces()]
    assert (await alice_b.get_workspace_info(ws))["created_at"] == made["created_at"]
    # the owner is its admin on B too: it joins with its login credential and mints tokens there
    owner_b = await clients(b.url, client_id="owner-b", token=login_token("alice"), workspace=ws)
    assert (await owner_b.check_status())["user_permission"] == "a"
    member_token = await owner_b.generate_token({"permission": "read_write"})
    mallory = await clients(a.url, client_id="mallory", token=login_token("mallory"))
    with pytest.raises(RemoteException, match="Permission denied"):
        await mallory.delete_workspace(ws)
    # a member connected to B loses its session when the owner deletes the workspace on A
    async with ws_connect(b.url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as raw:
        await raw.send(json.dumps({"client_id": "member", "workspace": ws, "token": member_token}))
        assert json.loads(await asyncio.wait_for(raw.recv(), 5))["type"] == "connection_info"
        await alice_a.delete_workspace(ws)
        for _ in range(20):  # bounded: frames before the close are skipped
            try:
                await asyncio.wait_for(raw.recv(), 10)
            except ConnectionClosed:
                break
        assert raw.close_code == 1008
        assert raw.close_reason == f"Workspace {ws} was deleted"
    assert ws not in [w["id"] for w in await alice_b.list_workspaces()]


async def test_env_events_and_service_types_set_on_one_replica_are_read_on_another(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    on_a = await clients(a.url, client_id="on-a", token=login_token("dora"))
    on_b = await clients(b.url, client_id="on-b", token=login_token("dora"))
    assert on_a.config["workspace"] == on_b.config["workspace"] == "ws-user-dora"
    await on_a.set_env("MODE", "fast")
    assert await on_b.get_env("MODE") == "fast"
    await on_a.log_event("step", {"on": "a"})
    await on_b.log_event("step", {"on": "b"})
    assert [e["data"]["on"] for e in await on_b.get_events("step")] == ["a", "b"]
    assert await on_a.get_event_stats("step") == [{"event_type": "step", "count": 2}]
    await on_b.register_service_type({"id": "calc", "name": "Calc", "definition": {}})
    assert (await on_a.get_service_type("calc"))["id"] == "ws-user-dora/calc"
    with pytest.raises(RemoteException, match="Service type already exists"):
        await on_a.register_service_type({"id": "calc", "name": "Again", "definition": {}})


async def _refusal(url: str, **first: str) -> tuple[int | None, str]:
    """The close code and reason a raw connection with ``first`` as its first frame ends with
    (``(None, "admitted")`` if it is admitted); bounded: 20 frames, 10 s each."""
    async with ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as raw:
        await raw.send(json.dumps(first))
        try:
            for _ in range(20):
                if json.loads(await asyncio.wait_for(raw.recv(), 10)).get("type") == "connection_info":
                    return None, "admitted"
        except ConnectionClosed:
            return raw.close_code, raw.close_reason
    raise AssertionError("neither admitted nor refused")


async def test_a_workspace_deleted_on_one_replica_refuses_its_old_tokens_on_both(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    ws = f"team-{uuid.uuid4().hex[:8]}"
    alice_a = await clients(a.url, client_id="alice-a", token=login_token("alice"))
    await alice_a.create_workspace({"id": ws})
    owner_b = await clients(b.url, client_id="owner-b", token=login_token("alice"), workspace=ws)
    member = await owner_b.generate_token({"permission": "read_write"})
    async with ws_connect(b.url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as raw:
        await raw.send(json.dumps({"client_id": "owner-raw", "workspace": ws, "token": login_token("alice")}))
        owner_resume = json.loads(await asyncio.wait_for(raw.recv(), 5))["reconnection_token"]
    await alice_a.delete_workspace(ws)
    gone = (1008, f"Workspace {ws} was deleted")
    for replica in (a, b):
        assert await _refusal(replica.url, client_id="owner-raw", workspace=ws, reconnection_token=owner_resume) == gone
        assert await _refusal(replica.url, client_id="member", workspace=ws, token=member) == gone
    # created again (on B): its owner enters by ownership, on A too; the old member token stays refused
    alice_b = await clients(b.url, client_id="alice-b", token=login_token("alice"))
    await alice_b.create_workspace({"id": ws})
    assert await _refusal(a.url, client_id="member", workspace=ws, token=member) == gone
    assert await _refusal(a.url, client_id="owner-raw", workspace=ws, reconnection_token=owner_resume) == (
        None,
        "admitted",
    )

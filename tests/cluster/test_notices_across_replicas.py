"""Deletion and revocation reach every replica: a connection joining on one replica while the workspace is deleted
(or its token revoked) on another is refused, and revoking a credential on one replica closes the sessions standing
on it, or on what was minted from it, on the other (issue 37, items 1 and 5). One pair of replicas serves them all."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from hypha_rpc import connect_to_server
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.tokens import first_reply
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import AUDIENCE, ISSUER, TokenIssuer
from switchboard.hub.identity.users import Permission, User
from switchboard.testing import ValkeyServer
from switchboard.testing.hub import TEST_SECRET
from switchboard.testing.replica import ReplicaProcess

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

FRAME_WAIT = 10.0  # seconds one frame may take between replica processes


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ReplicaProcess, ReplicaProcess]]:
    with ValkeyServer() as redis:
        started = [ReplicaProcess(replica_id=name, redis_url=redis.url) for name in ("notice-a", "notice-b")]
        try:
            yield started[0].start(), started[1].start()
        finally:
            for replica in started:
                replica.kill()


def login_token(user_id: str) -> str:
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode(claims, TEST_SECRET)


def ws_url(replica: ReplicaProcess) -> str:
    return replica.url.replace("http", "ws", 1) + "/ws"


async def open_raw(replica: ReplicaProcess, **first: Any) -> ClientConnection:
    raw = await ws_connect(ws_url(replica), open_timeout=5, close_timeout=2)
    await raw.send(json.dumps(first))
    return raw


async def outcome(raw: ClientConnection) -> tuple[str, int | None, str]:
    """``("closed", code, reason)`` once the hub closes ``raw``, else ``("open", None, "")`` (at most 20 frames,
    :data:`FRAME_WAIT` each)."""
    try:
        for _ in range(20):
            await asyncio.wait_for(raw.recv(), FRAME_WAIT)
    except ConnectionClosed:
        return "closed", raw.close_code, raw.close_reason
    except TimeoutError:
        pass
    await raw.close()
    return "open", None, ""


async def admitted(raw: ClientConnection) -> None:
    assert json.loads(await asyncio.wait_for(raw.recv(), FRAME_WAIT))["type"] == "connection_info"


@pytest.mark.parametrize("notice", ["deletion", "revocation"])
async def test_a_notice_from_another_replica_reaches_a_connection_joining_here(pair, clients, notice: str) -> None:
    """A read member on B holds a mute connection and opens a second with the same client id; while B waits on
    the first one's ping, the owner deletes the workspace (or revokes the member's token) on A."""
    a, b = pair
    ws = f"team-{uuid.uuid4().hex[:8]}"
    alice = await clients(a.url, client_id=f"alice-{ws}", token=login_token("alice"))
    await alice.create_workspace({"id": ws})
    owner = await clients(a.url, client_id="owner", token=login_token("alice"), workspace=ws)
    member = await owner.generate_token({"permission": "read"})
    mute = await open_raw(b, client_id="m", workspace=ws, token=member)
    await admitted(mute)
    second = await open_raw(b, client_id="m", workspace=ws, token=member)
    assert isinstance(await asyncio.wait_for(mute.recv(), FRAME_WAIT), bytes)  # B pings the first one
    if notice == "deletion":
        await alice.delete_workspace(ws)
        assert await outcome(second) == ("closed", 1008, f"Workspace {ws} was deleted")
    else:
        await owner.revoke_token(member)
        state, code, reason = await outcome(second)
        assert (state, code) == ("closed", 1008)
        assert "revoked" in reason
    assert (await outcome(mute))[:2] == ("closed", 1008)


async def test_revoking_on_one_replica_closes_the_sessions_standing_on_it_and_its_descendants_on_the_other(
    pair,
) -> None:
    a, b = pair
    lab = f"lab_{uuid.uuid4().hex[:8]}"  # an operator's name: grants in it come before any record
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    admin = User(id="mallory", grants={lab: Permission.ADMIN})
    leaked = issuer.issue(admin, workspace=lab, permission=Permission.ADMIN, expires_in=600)
    operator_user = User(id="olga", grants={lab: Permission.ADMIN})
    operator_token = issuer.issue(operator_user, workspace=lab, permission=Permission.ADMIN, expires_in=600)
    minter = await connect_to_server({"server_url": b.url, "client_id": "minter", "token": leaked})
    try:
        child = await minter.generate_token({"workspace": lab, "permission": "admin"})
    finally:
        await minter.disconnect()
    on_b = await open_raw(b, client_id="thief", workspace=lab, token=leaked)
    await admitted(on_b)
    child_on_b = await open_raw(b, client_id="accomplice", workspace=lab, token=child)
    await admitted(child_on_b)
    operator = await connect_to_server({"server_url": a.url, "client_id": "operator", "token": operator_token})
    try:
        await operator.revoke_token(leaked)
    finally:
        await operator.disconnect()
    for raw in (on_b, child_on_b):
        state, code, reason = await outcome(raw)
        assert (state, code) == ("closed", 1008)
        assert "revoked" in reason
    for replica in (a, b):
        reply = await first_reply(replica.url, "accomplice-again", token=child)
        assert reply["type"] == "error", reply
        assert "revoked" in reply["message"]

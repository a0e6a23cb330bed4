"""A client id belongs to one user hub-wide, and is live in one place: two replica processes on one Valkey.

The victim is a provider of ``W`` connected to replica A through a fault
proxy; the attacker, a member of ``W`` with only a ``read`` token, tries the
victim's id on replica B while the victim is in transit. B must refuse it
without touching the victim's registrations on A or announcing it gone, and
the victim, back on A with its reconnection token, answers the call held for
it. And the real client, resuming on B with its reconnection token while A
still has a stale copy of it, is the one copy: what A's clients send it
reaches B. (One replica: ``tests/security/test_client_id_ownership.py``.)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgpack
import pytest
import redis.asyncio as aredis
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from switchboard.testing import ValkeyServer
from switchboard.testing.proxy import FaultProxy
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


async def in_transit(valkey: ValkeyServer, client: str) -> bool:
    r = aredis.Redis.from_url(valkey.url)
    try:
        return await r.zscore("sb:transit", client) is not None
    finally:
        await r.aclose()


def head(frame: bytes) -> dict[str, Any]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    first: dict[str, Any] = next(unpacker)
    return first


async def raw_client(url: str, hello: dict[str, Any]) -> tuple[ClientConnection, dict[str, Any]]:
    """A WebSocket client that speaks for itself: its hello, then ``connection_info``."""
    conn = await ws_connect(url.replace("http://", "ws://") + "/ws")
    await conn.send(json.dumps(hello))
    info = json.loads(await asyncio.wait_for(conn.recv(), 10))
    assert info.get("type") == "connection_info", info
    return conn, info


async def test_a_read_member_on_another_replica_cannot_take_the_id_of_a_client_in_transit(
    replicas, clients, redis_server
):
    a, b = replicas.start("ra"), replicas.start("rb")
    async with FaultProxy("127.0.0.1", a.port, connect_timeout=2.0) as proxy:
        owner = await clients(a.url, client_id="owner")
        ws = owner.config["workspace"]
        rw = await owner.generate_token({"permission": "read_write"})
        read = await owner.generate_token({"permission": "read"})
        calls: list[Any] = []

        def act(arg: Any) -> str:
            calls.append(arg)
            return "the victim's answer"

        victim = await clients(f"http://127.0.0.1:{proxy.port}", client_id="victim", token=rw, workspace=ws)
        await victim.register_service({"id": "prot", "config": {"visibility": "protected"}, "act": act})
        gone: list[Any] = []
        owner.on("client_disconnected", gone.append)
        owner.on("service_removed", gone.append)
        await owner.subscribe(["client_disconnected", "service_removed"])
        svc = await owner.get_service("victim:prot")
        assert await svc.act("warm-up") == "the victim's answer"

        proxy.drop_new(True)
        proxy.reset_all()
        await eventually(lambda: in_transit(redis_server, f"{ws}/victim"), what="the victim in transit", timeout=10)
        held = asyncio.ensure_future(svc.act("held for the victim"))
        with pytest.raises(ConnectionAbortedError, match="belongs to another user"):
            await clients(b.url, client_id="victim", token=read, workspace=ws)
        listed = {s["id"] for s in await owner.list_services()}
        assert f"{ws}/victim:prot" in listed, "the attacker's admission purged the victim's registrations"
        assert await in_transit(redis_server, f"{ws}/victim")

        proxy.pass_through()  # the real victim comes back with its reconnection token
        assert await asyncio.wait_for(held, 20) == "the victim's answer"
        assert calls == ["warm-up", "held for the victim"]
        assert gone == [], "nobody was told the victim left"


async def test_a_client_resuming_on_another_replica_is_its_one_live_copy(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    async with FaultProxy("127.0.0.1", a.port, connect_timeout=2.0) as proxy:
        owner = await clients(a.url, client_id="owner")
        ws = owner.config["workspace"]
        rw = await owner.generate_token({"permission": "read_write"})
        stale, info = await raw_client(
            f"http://127.0.0.1:{proxy.port}", {"client_id": "twin", "workspace": ws, "token": rw}
        )
        proxy.blackhole()  # A keeps a copy of the client that hears nothing more
        resumed, _ = await raw_client(
            b.url, {"client_id": "twin", "workspace": ws, "reconnection_token": info["reconnection_token"]}
        )
        try:

            async def reaches_b() -> bool:
                await owner.emit({"type": "note", "to": f"{ws}/twin", "data": "for the client"})
                try:
                    for _ in range(100):  # bounded in count as well as time
                        frame = await asyncio.wait_for(resumed.recv(), 0.5)
                        if isinstance(frame, bytes) and head(frame).get("type") == "note":
                            return True
                except TimeoutError:
                    return False
                return False

            await eventually(reaches_b, what="a frame from A's client reaching the copy on B", timeout=10)
        finally:
            await resumed.close()
            proxy.pass_through()
            await stale.close()

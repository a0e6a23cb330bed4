"""Ids a caller writes are checked against the id grammar where they come in, before a key or channel.

A replica on a real Valkey: a workspace in an HTTP path would otherwise name a
Redis key (``HVALS sb:svc:<ws>``, and ``*`` is the query for every workspace),
and a ``to: "*/<id>"`` would name a client channel (``sb:client:*/<id>``). A
glob-like id gets a clear 400 or error, and nothing of another workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from typing import Any

import httpx
import msgpack
import pytest
import valkey.asyncio as aredis
from websockets.asyncio.client import connect as ws_connect

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

GLOBS = ["ws-*", "*", "ws-user-?*", "[a-z]*"]


@pytest.fixture
async def hub(replicas, clients) -> Any:
    """One replica on Valkey, with a public service in some workspace the attacker does not name."""
    replica = replicas.start("edge")
    provider = await clients(replica.url, client_id="prov")
    await provider.register_service({"id": "pub", "config": {"visibility": "public"}, "f": lambda: "secret-ish"})
    return replica


@pytest.mark.parametrize("ws", GLOBS)
async def test_a_glob_for_a_workspace_in_an_http_path_is_400(hub, ws) -> None:
    quoted = urllib.parse.quote(ws, safe="*")
    async with httpx.AsyncClient(base_url=hub.url, timeout=10) as http:
        for path in (f"/{quoted}/services", f"/{quoted}/services/prov:pub", f"/{quoted}/services/prov:pub/f"):
            reply = await http.get(path)
            assert reply.status_code == 400, f"{path}: {reply.status_code} {reply.text}"
            assert "invalid workspace" in reply.json()["detail"], path
            assert "prov" not in reply.text, f"{path} showed another workspace's service"
        posted = await http.post("/rpc", params={"workspace": ws, "client_id": "x"}, content=b"\x80")
        assert posted.status_code == 400
        assert "invalid workspace" in posted.json()["detail"]


@contextlib.asynccontextmanager
async def watching_starred_channels(redis_url: str) -> Any:
    """A Valkey subscriber to every channel with a literal ``*`` in its name."""
    redis = aredis.from_url(redis_url)
    pubsub = redis.pubsub()
    try:
        await pubsub.psubscribe("*\\**")
        assert (await pubsub.get_message(timeout=5))["type"] == "psubscribe"
        yield redis, pubsub
    finally:
        await pubsub.aclose()
        await redis.aclose()


@pytest.mark.parametrize("target", ["*/x*", "*/x", "*/ws-*"])
async def test_a_star_workspace_in_a_target_never_names_a_channel(hub, redis_server, target) -> None:
    url = hub.url.replace("http", "ws", 1) + "/ws"
    async with (
        watching_starred_channels(redis_server.url) as (redis, channels),
        ws_connect(url, open_timeout=5) as ws,
    ):
        await ws.send(json.dumps({"client_id": "caller"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_info"
        call = {"type": "method", "to": target, "method": "services.s.f", "session": "sess-1"}
        await ws.send(msgpack.packb(call) + msgpack.packb({"args": [], "promise": "*"}))
        answer = await asyncio.wait_for(ws.recv(), 5)  # the caller learns at once why
        if isinstance(answer, str):
            message = json.loads(answer)["message"]
        else:
            main, extra = _parts(answer)
            assert main["method"] == "sess-1.reject", main
            message = extra["args"][0]["_rvalue"]
        assert "invalid target" in message, message
        # anything the replica published came before its answer: a marker published now comes after it
        await redis.publish("marker:*", b"after")
        first = await channels.get_message(timeout=5)
        assert first is not None
        assert first["channel"] == b"marker:*", f"the target reached a Valkey channel: {first}"


def _parts(frame: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    main, extra = list(unpacker)
    return main, extra

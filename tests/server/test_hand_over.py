"""A draining replica sends a WebSocket client away without a close frame, and still hears it out.

The client gets ``{"type": "restarting", "code": 1012}`` and then the end of
the stream: an unmodified hypha-rpc client in the closing state of a close
handshake fails a call it sends, one whose stream simply ended waits for its
reconnection. What the client sent before it saw the end is still routed.
"""

from __future__ import annotations

import asyncio
import json

import msgpack
import pytest
import websockets

from switchboard.protocol.handshake import CLOSE_RESTARTING
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(30)


async def hello(url: str, client_id: str) -> tuple[websockets.ClientConnection, dict]:
    ws = await websockets.connect(url.replace("http", "ws", 1) + "/ws")
    await ws.send(json.dumps({"client_id": client_id, "workspace": None, "token": None, "reconnection_token": None}))
    return ws, json.loads(await ws.recv())


async def test_the_stream_ends_after_a_restarting_notice_and_what_the_client_sent_meanwhile_is_routed():
    async with running(settings_for_tests()) as srv:
        moving, info = await hello(srv.url, "moving")
        ws_id = info["workspace"]
        listener, _ = await hello(srv.url, "listener")
        peer = srv.hub.peers[f"{ws_id}/moving"]
        listener_id = next(p for p in srv.hub.peers if p.endswith("/listener"))
        peer.close(CLOSE_RESTARTING, "Server restarting, please reconnect")  # what the drain does
        # sent before the client has seen the end: the hub still reads and routes it
        await moving.send(msgpack.packb({"type": "note", "to": listener_id, "n": 1}))
        notice = json.loads(await asyncio.wait_for(moving.recv(), 5))
        assert notice["type"] == "restarting"
        assert notice["code"] == CLOSE_RESTARTING
        with pytest.raises(websockets.ConnectionClosed) as ended:
            await asyncio.wait_for(moving.recv(), 5)
        assert ended.value.rcvd is None, "no close frame: the stream just ended"
        got = msgpack.unpackb(await asyncio.wait_for(listener.recv(), 5))
        assert got["n"] == 1
        assert got["from"] == f"{ws_id}/moving"
        await eventually(lambda: f"{ws_id}/moving" not in srv.hub.peers, timeout=5, what="the peer detached")
        assert f"{ws_id}/moving" in srv.hub.transit, "handed over: in transit, not gone"
        await listener.close()

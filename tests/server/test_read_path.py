"""A client's frames are routed as they are read, in the order sent, whichever path each takes.

There is one read path: every message goes from the callback that parsed it to
the connection's inbox (``server/ws/inbox.py``), those a client sent behind its
first frame, before it was let in, first. A point-to-point event to a client
of this replica is routed in that callback; a broadcast has to wait for the
bus. The event sent after a broadcast must still arrive after it. An app
served by anything but the hub's own protocol refuses ``/ws`` rather than
reading frames some other way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
from hypha_rpc import connect_to_server
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect as ws_connect

import switchboard.server.runner as runner
from switchboard.server.app import create_app
from switchboard.server.ws.websocket import websocket_endpoint
from switchboard.server.ws.ws_protocol import HubWebSocketProtocol
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

PAIRS = 30


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests()) as server:
        yield server


@pytest.fixture
def hub_url(server: RunningServer) -> str:
    return server.url


async def test_an_event_never_overtakes_the_broadcast_sent_before_it(hub_url: str) -> None:
    clients = []
    try:
        sender = await connect_to_server({"server_url": hub_url, "client_id": "sender"})
        clients.append(sender)
        receiver = await connect_to_server(
            {
                "server_url": hub_url,
                "client_id": "receiver",
                "token": await sender.generate_token(),
            }
        )
        clients.append(receiver)
        got: list[str] = []
        receiver.on("news", lambda event: got.append(event["data"]))
        await receiver.subscribe(["news"])
        to_receiver = f"{receiver.config['workspace']}/receiver"
        for i in range(PAIRS):
            await sender.emit({"type": "news", "to": "*", "data": f"broadcast {i}"})
            await sender.emit({"type": "news", "to": to_receiver, "data": f"direct {i}"})
        await eventually(lambda: len(got) >= 2 * PAIRS, timeout=10, what="every event")
        assert got == [f"{kind} {i}" for i in range(PAIRS) for kind in ("broadcast", "direct")]
    finally:
        for client in reversed(clients):
            await client.disconnect()


async def test_calls_work(hub_url: str) -> None:
    provider = await connect_to_server({"server_url": hub_url, "client_id": "provider"})
    caller = await connect_to_server(
        {
            "server_url": hub_url,
            "client_id": "caller",
            "token": await provider.generate_token(),
        }
    )
    try:
        await provider.register_service({"id": "math", "config": {"visibility": "public"}, "double": lambda x: 2 * x})
        math = await caller.get_service("provider:math")
        assert [await math.double(i) for i in range(20)] == [2 * i for i in range(20)]
    finally:
        await caller.disconnect()
        await provider.disconnect()


def test_the_hub_serves_websockets_with_its_own_protocol() -> None:
    settings = settings_for_tests()
    config = runner.uvicorn_config(create_app(settings), settings)
    assert issubclass(config.ws, HubWebSocketProtocol)


async def test_frames_sent_behind_the_hello_are_routed_in_order_once_the_client_is_in(server: RunningServer) -> None:
    """A client that does not wait for ``connection_info``: what it sent meanwhile waited for
    ASGI's ``receive``, and is handed to the inbox, in order, before anything read later."""
    url = server.url.replace("http", "ws", 1) + "/ws"
    hello = {"client_id": "eager", "workspace": None, "token": None, "reconnection_token": None}
    ping = json.dumps({"type": "ping"})
    async with ws_connect(url, open_timeout=5, close_timeout=2) as ws:
        await ws.send(json.dumps(hello))
        for frame in (ping, b"\xc1", ping, msgpack.packb([1, 2, 3]), ping):
            await ws.send(frame)
        answers: list[dict[str, Any]] = []
        with contextlib.suppress(TimeoutError):  # a lost frame leaves its answer missing
            for _ in range(6):
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
    assert [a["type"] for a in answers] == ["connection_info", "pong", "error", "pong", "error", "pong"]
    assert "not valid msgpack" in answers[2]["message"]
    assert "must be a map" in answers[4]["message"]


async def test_an_app_served_without_the_hubs_protocol_refuses_websockets(server: RunningServer) -> None:
    """Under another server, /ws says it cannot serve instead of reading frames by another path."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "path": "/ws",
        "query_string": b"",
        "headers": [],
        "app": server.app,
        "extensions": {},  # no switchboard.websocket: not the hub's protocol
    }
    await websocket_endpoint(WebSocket(scope, receive, send))
    assert [m["type"] for m in sent] == ["websocket.close"], "refused before any accept"
    assert sent[0]["code"] == 1011
    assert "switchboard serve" in sent[0]["reason"]
    assert not server.hub.peers

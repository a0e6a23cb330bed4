"""A client's frames are routed as they are read, in the order sent, whichever path each takes.

A point-to-point event to a client of this replica is routed in the callback
that read it; a broadcast has to wait for the bus. The event sent after a
broadcast must still arrive after it. The same holds when the app runs on
uvicorn's own WebSocket protocol, where every frame goes through ASGI's queue.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypha_rpc import connect_to_server

import switchboard.server.runner as runner
from switchboard.server.ws_protocol import HubWebSocketProtocol
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

PAIRS = 30


@pytest.fixture(params=["hub protocol", "plain uvicorn protocol"])
async def hub_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    if request.param == "plain uvicorn protocol":

        def plain(app: Any, settings: Any) -> Any:
            config = original(app, settings)
            config.ws = "websockets-sansio"
            return config

        original = runner.uvicorn_config
        monkeypatch.setattr(runner, "uvicorn_config", plain)
    async with running(settings_for_tests()) as server:
        yield server.url


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


async def test_calls_work_on_either_protocol(hub_url: str) -> None:
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
    config = runner.uvicorn_config(object(), settings_for_tests())  # type: ignore[arg-type]
    assert issubclass(config.ws, HubWebSocketProtocol)

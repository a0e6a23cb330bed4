"""A drain sends its clients away in waves (``--drain-window``), and still everyone by its deadline.

Thirty clients on a hub whose drain keeps at most five in flight: none of them
comes back here (they have nowhere to go), so after the first five only the
schedule sends more, in proportion to the drain timeout's time gone. Sent all
at once, the thirty would reconnect to a sibling in the same instant.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets

from switchboard.protocol.handshake import CLOSE_RESTARTING
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually, scaled

pytestmark = pytest.mark.timeout(60)

CLIENTS = 30
WINDOW = 5
TIMEOUT = 3.0  # the drain's: everyone is sent away by then


async def test_a_drain_sends_at_most_its_window_at_once_and_everyone_by_its_timeout() -> None:
    settings = settings_for_tests(drain_window=WINDOW, transit_grace=10.0, drain_timeout=TIMEOUT)
    async with running(settings) as srv:
        srv.hub.drainer.window = WINDOW  # as on a replica of a cluster: alone, a hub sends everyone at once
        await _drain_in_waves(srv)


async def _drain_in_waves(srv: RunningServer) -> None:
    clients = []
    for i in range(CLIENTS):
        ws = await websockets.connect(srv.url.replace("http", "ws", 1) + "/ws")
        hello = {"client_id": f"c{i}", "workspace": None, "token": None, "reconnection_token": None}
        await ws.send(json.dumps(hello))
        json.loads(await ws.recv())
        clients.append(ws)
    await eventually(lambda: len(srv.hub.peers) == CLIENTS, "every client attached")

    started = time.monotonic()
    drain = asyncio.ensure_future(srv.hub.drain(TIMEOUT, code=CLOSE_RESTARTING, reason="restarting"))
    await asyncio.sleep(0.5)  # a look at the drain half a second in: what it has sent away by then
    sent = len(srv.hub.transit)
    elapsed = time.monotonic() - started
    scheduled = -(-CLIENTS * elapsed // TIMEOUT)  # what the schedule alone allows by now
    assert 0 < sent <= WINDOW + scheduled, f"{sent} of {CLIENTS} sent away after {elapsed:.2f} s"

    await asyncio.sleep(1.5)  # two seconds in: none came back, yet the schedule sent more
    sent, elapsed = len(srv.hub.transit), time.monotonic() - started
    assert sent >= min(CLIENTS, CLIENTS * (elapsed - 0.5) // TIMEOUT) > WINDOW, (
        f"{sent} of {CLIENTS} sent away after {elapsed:.2f} s"
    )

    await asyncio.wait_for(drain, scaled(TIMEOUT + 10))
    took = time.monotonic() - started
    assert len(srv.hub.transit) == CLIENTS, "everyone was sent away, in transit"
    assert took < scaled(TIMEOUT + 2), f"the drain took {took:.1f} s"
    for ws in clients:
        await ws.close()


async def test_a_hub_without_siblings_sends_everyone_at_once() -> None:
    """Alone (no --redis-url) nobody takes its clients in while it drains: no wave to wait for."""
    async with running(settings_for_tests(drain_window=WINDOW)) as srv:
        assert srv.hub.drainer.window == 0

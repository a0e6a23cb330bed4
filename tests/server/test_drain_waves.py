"""A drain sends its clients away in waves (``--drain-window``) the sibling admits, and still everyone by its deadline.

Thirty clients on a hub whose drain keeps at most five in flight: none of them
comes back here (they have nowhere to go), so after the first five nobody more
goes while they count (the transit grace): time alone does not push clients
onto a sibling that admits none. At the drain timeout the rest go at once, so
the stop keeps its budget. Sent all at once, the thirty would reconnect to a
sibling in the same instant.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import websockets

from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha.handshake import CLOSE_RESTARTING
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually, scaled

pytestmark = pytest.mark.timeout(60)

CLIENTS = 30
WINDOW = 5
TIMEOUT = 3.0  # the drain's: everyone is sent away by then


async def test_a_drain_sends_no_more_than_its_window_while_none_is_back_and_everyone_at_its_timeout() -> None:
    settings = settings_for_tests(drain_window=WINDOW, transit_grace=10.0, drain_timeout=TIMEOUT)
    async with running(settings) as srv:
        srv.hub.drainer.window = WINDOW  # as on a replica of a cluster: alone, a hub sends everyone at once
        await _drain_in_waves(srv)


async def _connect(srv: RunningServer, count: int) -> list[Any]:
    clients = []
    for i in range(count):
        ws = await websockets.connect(srv.url.replace("http", "ws", 1) + "/ws")
        hello = {"client_id": f"c{i}", "workspace": None, "token": None, "reconnection_token": None}
        await ws.send(json.dumps(hello))
        json.loads(await ws.recv())
        clients.append(ws)
    await eventually(lambda: len(srv.hub.peers) == count, "every client attached")
    return clients


async def _drain_in_waves(srv: RunningServer) -> None:
    clients = await _connect(srv, CLIENTS)

    started = time.monotonic()
    drain = asyncio.ensure_future(srv.hub.drain(TIMEOUT, code=CLOSE_RESTARTING, reason="restarting"))
    await eventually(lambda: len(srv.hub.transit) >= WINDOW, "the first wave sent away")
    await asyncio.sleep(2.0)  # two seconds in: none came back, so nobody more went
    sent, elapsed = len(srv.hub.transit), time.monotonic() - started
    assert sent == WINDOW or elapsed >= TIMEOUT, f"{sent} of {CLIENTS} sent away after {elapsed:.2f} s"

    await asyncio.wait_for(drain, scaled(TIMEOUT + 10))
    took = time.monotonic() - started
    assert len(srv.hub.transit) == CLIENTS, "everyone was sent away, in transit"
    assert took < scaled(TIMEOUT + 2), f"the drain took {took:.1f} s"
    for ws in clients:
        await ws.close()


async def test_a_pass_of_the_drain_looks_at_its_wave_not_at_every_client_here(monkeypatch: Any) -> None:
    """Issue 26: every pass (50 a second while a wave is out) scanned and copied the whole table,
    O(clients) each; with thousands waiting that starved the draining replica's own loop."""
    many, window, timeout = 300, 5, 2.0
    settings = settings_for_tests(drain_window=window, transit_grace=10.0, drain_timeout=timeout)
    async with running(settings) as srv:
        srv.hub.drainer.window = window
        clients = await _connect(srv, many)
        looks = 0
        closed = Peer.closed

        def counted(peer: Peer) -> bool:
            nonlocal looks
            looks += 1
            return bool(closed.fget(peer))  # type: ignore[attr-defined]

        monkeypatch.setattr(Peer, "closed", property(counted))
        await asyncio.wait_for(srv.hub.drain(timeout, code=CLOSE_RESTARTING, reason="restarting"), scaled(20))
        monkeypatch.undo()
        # the queue taken once, the first wave, and the rest at the deadline: a few looks per client
        assert looks <= 4 * many, f"{looks} looks at a client's state to drain {many} (passes at every 20 ms)"
        for ws in clients:
            await ws.close()


async def test_whoever_is_left_at_the_deadline_goes_side_by_side_not_one_after_the_other() -> None:
    """Issue 26: at the deadline 2,460 clients were put in transit one after the other, a few Redis
    round trips each on a loaded machine: the last went 110 s later, and the replica exited 120 s
    after its SIGTERM. Here each departure pays 0.2 s (a registry far away, or busy)."""
    latency, timeout = 0.2, 1.0
    settings = settings_for_tests(drain_window=WINDOW, transit_grace=10.0, drain_timeout=timeout)
    async with running(settings) as srv:
        srv.hub.drainer.window = WINDOW
        clients = await _connect(srv, CLIENTS)
        depart = srv.hub.moves.depart

        async def far_away(peer: Peer) -> bool:
            await asyncio.sleep(latency)
            return await depart(peer)

        srv.hub.moves.depart = far_away  # type: ignore[method-assign]
        started = time.monotonic()
        drain = asyncio.ensure_future(srv.hub.drain(timeout, code=CLOSE_RESTARTING, reason="restarting"))
        await eventually(lambda: len(srv.hub.transit) == CLIENTS, "everyone sent away", timeout=scaled(30))
        took = time.monotonic() - started
        assert took < timeout + scaled(4 * latency), (
            f"{CLIENTS} clients sent away {took:.1f} s after the drain began, its timeout {timeout} s "
            f"(one after the other: {CLIENTS - WINDOW} x {latency} s after it)"
        )
        await asyncio.wait_for(drain, scaled(20))
        for ws in clients:
            await ws.close()


async def test_a_hub_without_siblings_sends_everyone_at_once() -> None:
    """Alone (no --redis-url) nobody takes its clients in while it drains: no wave to wait for."""
    async with running(settings_for_tests(drain_window=WINDOW)) as srv:
        assert srv.hub.drainer.window == 0

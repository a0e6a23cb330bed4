"""A crowd's admissions take turns, first come first served, and a slow one holds up nobody for long.

Issue 26: while a sibling's drain sent 1,200 clients to a replica, their
admissions ran side by side and the replica's established clients waited
behind them (echo p50/p99 22/80 ms, against 6.6/40 ms with 8 at a time).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import websockets

from switchboard.server.admission_turns import ADMITTING, Turns
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(60)


async def test_no_more_turns_at_once_than_places_and_in_the_order_they_came() -> None:
    turns = Turns(size=3, hold=10.0)
    under_way: list[int] = []
    most = 0
    order: list[int] = []

    async def one(i: int) -> None:
        nonlocal most
        async with turns.turn():
            order.append(i)
            under_way.append(i)
            most = max(most, len(under_way))
            await asyncio.sleep(0.01)
            under_way.remove(i)

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(12))), scaled(10))
    assert most == 3
    assert order == list(range(12))


async def test_a_turn_longer_than_its_hold_stops_counting_then() -> None:
    """A probe waits up to 2 s for a ping: the crowd behind it must not."""
    turns = Turns(size=1, hold=0.05)
    slow_in = asyncio.Event()

    async def slow() -> None:
        async with turns.turn():
            slow_in.set()
            await asyncio.sleep(2.0)

    task = asyncio.ensure_future(slow())
    await slow_in.wait()
    started = time.monotonic()
    async with turns.turn():
        waited = time.monotonic() - started
    assert waited < 1.0, f"the next turn waited {waited:.2f} s behind a slow one"
    async with turns.turn():  # the slow one's place, given away, is not given back twice
        pass
    await task


async def test_a_crowd_s_handshakes_on_a_hub_take_turns(monkeypatch: Any) -> None:
    async with running(settings_for_tests()) as srv:
        admit = srv.hub.admit
        under_way = most = 0

        async def slow_admit(hello: Any) -> Any:  # a store a few milliseconds away
            nonlocal under_way, most
            under_way += 1
            most = max(most, under_way)
            try:
                await asyncio.sleep(0.02)
                return await admit(hello)
            finally:
                under_way -= 1

        monkeypatch.setattr(srv.hub, "admit", slow_admit)

        async def client(i: int) -> Any:
            ws = await websockets.connect(srv.url.replace("http", "ws", 1) + "/ws")
            await ws.send(json.dumps({"client_id": f"c{i}", "workspace": None, "token": None}))
            assert json.loads(await ws.recv())["type"] == "connection_info"
            return ws

        clients = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(4 * ADMITTING))), scaled(30))
        assert most <= ADMITTING, f"{most} admissions under way at once"
        for ws in clients:
            await ws.close()

"""A flood on the bus never holds the event loop: the other tasks (the lease's renewal) keep their times.

redis-py returns a reply that is already buffered without giving the loop a
turn, so a reader that always finds the next message waiting (a flat-out
event flood) would run its handlers back to back for as long as the flood
lasts: once the leader lease expired that way, the loop starved for over
3 s. Here a real Valkey floods one channel faster than the handler keeps up,
and a ticker that should wake every 10 ms measures how late it gets.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from support.listen import on
from switchboard.backends.redis import RedisBus, make_client
from switchboard.clock import SystemClock
from switchboard.testing import ValkeyServer

pytestmark = pytest.mark.timeout(60)

MESSAGES = 10_000
HANDLER_COST = 0.0002  # 200 µs of work per message (a broadcast to many members): 2 s for the flood
TICK = 0.01
LATE_AT_MOST = 0.25  # a turn of the loop the reader may take, with room for a slow shared machine


@pytest.fixture(scope="module")
def valkey_flood() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


FLOOD = """
for _ = 1, tonumber(ARGV[2]) do redis.call('PUBLISH', KEYS[1], ARGV[1]) end
return 1
"""


async def flood(server: ValkeyServer, channel: str) -> None:
    """Publish :data:`MESSAGES` inside Valkey itself, all at once: they wait in the socket
    faster than any handler takes them, with no work in this process to slow the reader."""
    client = make_client(server.url)
    try:
        await client.eval(FLOOD, 1, channel, b"x" * 100, MESSAGES)
    finally:
        await client.aclose()


async def test_a_flood_on_the_bus_leaves_the_loop_free_for_other_tasks(valkey_flood: ValkeyServer) -> None:
    bus = RedisBus(valkey_flood.url, clock=SystemClock(), replica_id=f"r-{uuid.uuid4().hex[:6]}", probe_idle=None)
    try:
        assert await bus.start()
        got = 0
        all_in = asyncio.Event()

        def handle(data: bytes) -> None:
            nonlocal got
            end = time.perf_counter() + HANDLER_COST
            while time.perf_counter() < end:  # the routing work a real handler does per message
                pass
            got += 1
            if got == MESSAGES:
                all_in.set()

        channel = f"flood-{uuid.uuid4().hex[:6]}"
        await on(bus).subscribe(channel, handle)
        loop = asyncio.get_running_loop()
        worst = 0.0

        async def ticker() -> None:
            nonlocal worst
            while not all_in.is_set():
                before = loop.time()
                await asyncio.sleep(TICK)
                worst = max(worst, loop.time() - before - TICK)

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(TICK * 3)
        await flood(valkey_flood, channel)
        await asyncio.wait_for(all_in.wait(), 40)
        await asyncio.wait_for(ticking, 5)
        assert got == MESSAGES
        assert worst < LATE_AT_MOST, f"a task waiting {TICK * 1000:.0f} ms was woken {worst:.2f} s late"
    finally:
        await bus.close()

"""A connection that ends after its client already came back on another replica.

The client reconnected to replica B, whose admission claimed its id (B owns it
now), before this replica, A, saw its old connection end: A's ``begin_transit``
is refused (it is back), so A puts nothing in transit. What A still had for
that connection, the frames never written to it, must then follow the client
to B, as the frames A held do; dropping them loses a call or a reply without a
word (its caller times out). A real Valkey decides who owns the client; B is
played by a second registry and by a subscriber on the client's channel in Valkey.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
import redis.asyncio as aredis

from support.wire import attach_client, settle
from switchboard.backends.redis import RedisRegistry
from switchboard.backends.redis.bus.bus import RedisBus
from switchboard.clock import SystemClock
from switchboard.hub.identity.users import new_anonymous_user
from switchboard.hub.sessions.life import HANDED_OVER
from switchboard.protocol.hypha import envelope
from switchboard.replicas.dataplane.remote import CLIENT_CHANNEL
from switchboard.server.app import build_hub
from switchboard.testing import FakeClock, ValkeyServer
from switchboard.testing.hub import settings_for_tests
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(30)

WS = "ws-1"
USER = new_anonymous_user()


async def next_message(pubsub: Any, timeout: float) -> bytes | None:
    """The next message on ``pubsub`` (its subscribe confirmations skipped), or ``None`` by ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for _ in range(100):  # bounded in count as well as time
        left = deadline - loop.time()
        if left <= 0:
            return None
        message = await pubsub.get_message(timeout=left)
        if message is not None and message["type"] == "message":
            data: bytes = message["data"]
            return data
    return None


@pytest.mark.parametrize("end", ["handed over by a drain", "dropped"])
async def test_frames_never_written_to_an_ended_connection_follow_the_client_back_on_another_replica(end: str):
    with ValkeyServer() as valkey:
        registry = RedisRegistry(valkey.url, replica_id="ra")
        bus = RedisBus(valkey.url, clock=SystemClock(), replica_id="ra", reconcile_interval=None, probe_idle=None)
        hub = build_hub(
            settings_for_tests(replica_id="ra", transit_grace=5.0), clock=FakeClock(), registry=registry, bus=bus
        )
        other = RedisRegistry(valkey.url, replica_id="rb")
        redis = aredis.Redis.from_url(valkey.url)
        on_b = redis.pubsub()  # replica B, where the client is live now: its channel
        await on_b.subscribe(CLIENT_CHANNEL + f"{WS}/prov")
        tasks: list[asyncio.Task[Any]] = []
        try:
            prov, _, writer = await attach_client(hub, WS, "prov", USER, services=("s",))
            tasks.append(writer)
            call = envelope.encode(
                {
                    "type": "method",
                    "from": f"{WS}/caller",
                    "to": f"{WS}/prov",
                    "method": "services.s.f",
                    "session": "q1",
                }
            )
            prov.queue._frames = deque([call])  # accepted for the connection, not written yet when it ends

            claim = await other.claim(WS, "prov", user=USER.id, owner="rb")  # it resumed on B first
            assert claim.previous_owner == "ra"
            if end == "dropped":
                prov.client_closed(1006)
            else:
                prov.close(HANDED_OVER, "Server restarting, please reconnect")
            await hub.detach(prov)
            await settle()

            assert f"{WS}/prov" not in hub.transit, "back on B already: not in transit here"
            got = await next_message(on_b, scaled(2.0))
            assert got is not None, "the call queued for the ended connection was dropped"
            assert call in got
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await on_b.aclose()
            await redis.aclose()
            await other.close()
            await bus.close()
            await registry.close()

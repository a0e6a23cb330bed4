"""A frame another replica relays to a connection whose end this replica is still cleaning up.

The client's connection dropped (no goodbye: it is coming back). Until the
hub has let go of the client's channel, frames for it still arrive here; the
clean-up (``Hub.detach``) waits on the store (the connection counts, then
the channel) before it puts the client in transit. A frame that arrives in
that wait must be held for the client like any frame after it, not dropped
because the client is neither connected here any more nor in transit yet.
The counts live in a real Valkey, so the wait is a real round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aredis

from support.wire import Wire, attach_client, settle
from switchboard.backends.redis.stores.counts import RedisConnectionCounts
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import new_anonymous_user
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.ids import CLIENT_CHANNEL
from switchboard.protocol.link import replica_wire
from switchboard.server.app import build_hub
from switchboard.testing import FakeClock, ValkeyServer
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(30)

WS = "ws-1"
USER = new_anonymous_user()


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    """An embedded hub whose connection counts live in a real Valkey: its clean-up waits a real round trip."""
    with ValkeyServer() as valkey:
        redis = aredis.Redis.from_url(valkey.url)
        hub = build_hub(settings_for_tests(transit_grace=5.0), clock=FakeClock())
        hub.gate.counts = RedisConnectionCounts(redis, replica_id=hub.replica_id)
        try:
            yield hub
        finally:
            await redis.aclose()


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Writer tasks of the test's connections, cancelled at its end."""
    started: list[asyncio.Task[Any]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


async def test_a_reply_relayed_while_a_dropped_connection_is_cleaned_up_waits_for_its_client(
    hub: Hub, tasks: list[asyncio.Task[Any]]
):
    caller, _, writer = await attach_client(hub, WS, "caller", USER)
    tasks.append(writer)
    reply = envelope.encode({"type": "method", "from": f"{WS}/prov", "to": f"{WS}/caller", "method": "q1.resolve"})

    caller.client_closed(1006)  # dropped: expected back
    detaching = asyncio.create_task(hub.detach(caller))
    await asyncio.sleep(0)  # its first step: no longer connected here, waiting on Valkey
    assert f"{WS}/caller" not in hub.peers
    hub.dispatch.from_replica_to_client(caller, reply)  # still subscribed: the reply lands here
    await detaching
    await settle()
    assert hub.transit.holding == 1, "the reply relayed while the connection was cleaned up was dropped"

    _, back, writer = await attach_client(hub, WS, "caller", USER, reconnecting=True)
    tasks.append(writer)
    await settle()
    assert [h["method"] for h in back.heads()] == ["q1.resolve"]


async def test_a_connection_that_attaches_while_the_last_one_is_cleaned_up_keeps_the_clients_channel(
    hub: Hub, tasks: list[asyncio.Task[Any]]
):
    """The client came back on a new connection before the hub had finished with its dropped one
    (hypha-rpc redials at once): the new connection's attach was waiting on the store when the old
    connection's clean-up began, and finished first. The clean-up must then leave the client's
    channel, and the client, to the new connection: frames from other replicas still reach it.
    Repeated, since it is a race of two round trips."""
    old, _, writer = await attach_client(hub, WS, "caller", USER)
    tasks.append(writer)
    for round_ in range(10):
        new = Peer(workspace=WS, client_id="caller", user=USER, transport=Wire(), max_queue_bytes=1 << 20)
        attaching = asyncio.create_task(hub.attach(new, reconnecting=True))
        await asyncio.sleep(0)  # its count is on its way to Valkey
        old.client_closed(1006)
        await hub.detach(old)  # its count out goes after the new one's count in
        await attaching
        tasks.append(asyncio.create_task(new.run_writer()))
        await settle()
        assert hub.peers.get(f"{WS}/caller") is new
        reply = envelope.encode(
            {"type": "method", "from": f"{WS}/prov", "to": f"{WS}/caller", "method": f"q{round_}.resolve"}
        )
        # as another replica sends it: published on the client's channel
        receivers = await hub.bus.publish(CLIENT_CHANNEL + f"{WS}/caller", replica_wire.tag("rB", reply))
        assert receivers == 1, f"round {round_}: the old connection's clean-up unsubscribed the new one's channel"
        await settle()
        assert [h["method"] for h in new.transport.heads()][-1] == f"q{round_}.resolve"
        assert not hub.transit.holding, f"round {round_}: the live client was put in transit"
        old = new

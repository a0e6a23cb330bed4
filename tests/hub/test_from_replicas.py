"""What other replicas send here climbs through one port: the bus has one listener, a subscription is
a channel's name, and which client a client channel's frame is for is the hub's lookup.

A hub on the embedded bus, on the fake clock; what the bus carries is published on it as another
replica would (a client's frame tagged with its sender's link address, ``protocol/link/replica_wire.py``).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from support.wire import Wire, attach_client, settle
from switchboard.backends.base import BusHandler, EventBus
from switchboard.backends.memory import MemoryBus, MemoryRegistry
from switchboard.backends.redis.bus.bus import RedisBus
from switchboard.backends.redis.bus.cluster_bus import ClusterBus
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing.replays import worth_replaying
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import replica_wire as wire
from switchboard.protocol.link.replica_wire import (
    ClientFrame,
    ClientKicked,
    CredentialRevoked,
    ManagerReply,
    Message,
    TransitNotice,
    WorkspaceDeleted,
    WorkspaceEvent,
)
from switchboard.replicas.dataplane.inbound import CLIENT_CHANNEL
from switchboard.replicas.dataplane.unicast import Unicast
from switchboard.server.app import build_hub
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(10)

WS = "ws-1"
USER = User(id="alice", grants={WS: Permission.READ_WRITE})


class ListenedBus(MemoryBus):
    """The embedded bus, noting every listener it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[BusHandler] = []

    def listen(self, handler: BusHandler) -> None:
        self.listeners.append(handler)
        super().listen(handler)


@pytest.fixture
async def hub() -> Any:
    bus = ListenedBus()
    made = build_hub(settings_for_tests(replica_id="r"), clock=FakeClock(), bus=bus, registry=MemoryRegistry())
    tasks: list[asyncio.Task[None]] = []
    made.tasks = tasks  # type: ignore[attr-defined]
    yield made
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def connect(hub: Hub, client_id: str) -> tuple[Peer, Wire]:
    peer, wire_, writer = await attach_client(hub, WS, client_id, USER)
    hub.tasks.append(writer)  # type: ignore[attr-defined]
    return peer, wire_


def call(to: str) -> bytes:
    """A call from a client of another replica, as that replica publishes it (tagged, no link)."""
    frame = envelope.encode(
        {"type": "method", "from": f"{WS}/far", "to": to, "method": "services.s.f", "session": "s1"}
    )
    return wire.tag("", frame)


@pytest.mark.parametrize("bus_class", [MemoryBus, RedisBus, ClusterBus])
def test_a_subscription_names_a_channel_and_nothing_else(bus_class: type[EventBus]) -> None:
    """Every bus, embedded or on Redis: no callable per channel can be registered."""
    assert list(inspect.signature(bus_class.subscribe).parameters) == ["self", "channel"]
    assert list(inspect.signature(bus_class.listen).parameters) == ["self", "handler"]


async def test_the_bus_is_given_one_listener_however_many_channels_the_hub_subscribes(hub: Hub) -> None:
    await hub.start()
    try:
        for n in range(3):
            await connect(hub, f"c{n}")
        async with hub.http.acting_as(USER.to_wire(WS, "m"), WS):
            pass
        bus = hub.bus
        assert isinstance(bus, ListenedBus)
        assert len(bus.listeners) == 1, "one listener, given once, not one per channel"
    finally:
        await hub.stop()


async def test_a_frame_on_a_clients_channel_reaches_that_client_and_no_other(hub: Hub) -> None:
    one, one_wire = await connect(hub, "one")
    two, two_wire = await connect(hub, "two")
    assert await hub.bus.publish(CLIENT_CHANNEL + two.id, call(two.id)) == 1
    await settle()
    assert two_wire.methods() == ["services.s.f"]
    assert one_wire.methods() == []
    assert hub.inflight.busy(two.id), "counted in flight, as the router decides for a relayed call"


async def test_a_newer_connection_of_the_client_takes_its_channels_frames(hub: Hub) -> None:
    _, old_wire = await connect(hub, "c")
    new, new_wire = await connect(hub, "c")  # superseded: same client id
    assert await hub.bus.publish(CLIENT_CHANNEL + new.id, call(new.id)) == 1
    await settle()
    assert new_wire.methods() == ["services.s.f"]
    assert old_wire.methods() == []


async def test_a_frame_for_a_client_not_here_or_an_unknown_channel_is_dropped_and_counted(hub: Hub) -> None:
    await hub.bus.subscribe(CLIENT_CHANNEL + f"{WS}/ghost")  # subscribed, but no connection of ours
    await hub.bus.subscribe("sb:nothing-of-ours")
    assert hub.unicast.dropped == 0
    assert await hub.bus.publish(CLIENT_CHANNEL + f"{WS}/ghost", call(f"{WS}/ghost")) == 1
    assert hub.unicast.dropped == 1
    assert await hub.bus.publish("sb:nothing-of-ours", b"?") == 1
    assert hub.unicast.dropped == 2


async def test_a_detached_clients_channel_is_forgotten_by_the_port(hub: Hub) -> None:
    peer, _ = await connect(hub, "gone")
    assert len(hub.from_replicas) == 1
    peer.close(1000, "bye")
    await hub.detach(peer)
    assert len(hub.from_replicas) == 0, "no entry left per connection once it is gone"
    assert await hub.bus.publish(CLIENT_CHANNEL + peer.id, call(peer.id)) == 0


async def test_each_kind_of_channel_reaches_the_port_as_its_value_decoded_once(hub: Hub) -> None:
    """The bus's listener decodes what each channel carries and hands the port the value."""
    seen: list[Message] = []

    class Port:
        def receive(self, message: Message) -> bool:
            seen.append(message)
            return not isinstance(message, ClientFrame) or message.address == f"{WS}/here"

    bus = MemoryBus()
    unicast = Unicast(
        bus, replica_id="r", clock=FakeClock(), worth_replaying=lambda data: worth_replaying(data, hub.router.inflight)
    )
    unicast.listen(Port())
    for channel, data in [
        (f"sb:client:{WS}/here", wire.tag("", b"f")),
        (f"sb:client:{WS}/away", wire.tag("", b"f")),
        ("sb:replica:r", b"reply"),
        (f"sb:ws:{WS}", b"r\nevent"),
        ("sb:deleted", WS.encode()),
        ("sb:revoked", b"jti-1"),
        ("sb:kick", b"ws/c\n1000\nbye"),
        ("sb:transit", b'{"left": "ws/c", "from": "r2"}'),
        ("sb:elsewhere", b"?"),
    ]:
        await bus.subscribe(channel)
        assert await bus.publish(channel, data) == 1
    assert seen == [
        ClientFrame(f"{WS}/here", b"f"),
        ClientFrame(f"{WS}/away", b"f"),
        ManagerReply("r", b"reply"),
        WorkspaceEvent(WS, "r", b"event"),
        WorkspaceDeleted(WS),
        CredentialRevoked("jti-1"),
        ClientKicked("ws", "c", 1000, "bye"),
        TransitNotice("left", "ws/c", "r2"),
    ]
    assert (unicast.dropped, unicast.malformed) == (2, 1), "the client not here, and the unknown channel"


async def test_an_http_caller_whose_channel_cannot_be_subscribed_leaves_nothing_behind(hub: Hub) -> None:
    """A subscribe that fails (a closed bus) or is cancelled: the caller's address is in no table."""

    class Boom(Exception):
        pass

    async def broken(channel: str) -> None:
        raise Boom

    hub.unicast.subscribe = broken  # type: ignore[method-assign]
    with pytest.raises(Boom):
        async with hub.http.acting_as(USER.to_wire(WS, "m"), WS):
            pytest.fail("never entered")
    assert len(hub.from_replicas) == 0
    assert hub.router.aliases == {}, "nor is it an alias the router sends replies to"

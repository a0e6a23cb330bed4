"""One replica's client channels, as the hub has them: a Redis bus and direct links, no hub."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from switchboard.backends.redis import RedisBus
from switchboard.clock import SystemClock
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.replays import worth_replaying
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.replica_wire import (
    BalancedCall,
    BouncedCall,
    ClientFrame,
    ManagerCall,
    ManagerReply,
    Message,
    WorkspaceEvent,
)
from switchboard.replicas.dataplane.inbound import CLIENT_CHANNEL, REPLICA_CHANNEL, WORKSPACE_CHANNEL
from switchboard.replicas.dataplane.links import Links, LinkSettings
from switchboard.replicas.dataplane.unicast import Unicast


class LinkedReplica:
    """A :class:`Unicast` over a real bus with links on loopback; ``calls`` are its open calls.

    It is its unicast's inbound port (``replicas/dataplane/inbound.py``), handing each frame to the
    test's callable for that channel.
    """

    def __init__(self, url: str, name: str, *, secret: str, **link_options: Any) -> None:
        self.replica_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.calls = InFlight()
        self.bus = RedisBus(
            url,
            clock=SystemClock(),
            replica_id=self.replica_id,
            backoff_initial=0.02,
            backoff_max=0.2,
            op_timeout=0.5,
        )
        self.unicast = Unicast(
            self.bus,
            replica_id=self.replica_id,
            clock=SystemClock(),
            worth_replaying=lambda data: worth_replaying(data, self.calls),
            links=LinkSettings(secret=secret, **link_options),
            untagged_prefix="sb:replica:",  # as the hub has it: replicas' own channels go untagged
        )
        self.publish = self.unicast.publish
        self.unsubscribe = self.unicast.unsubscribe
        self._handlers: dict[str, Callable[[bytes], Any]] = {}
        self.unicast.listen(self)

    async def subscribe(self, channel: str, handler: Callable[[bytes], Any]) -> None:
        """A client's channel, as the hub subscribes it."""
        self._handlers[channel] = handler
        await self.unicast.subscribe(channel)

    async def subscribe_own(self, channel: str, handler: Callable[[bytes], Any]) -> None:
        """This replica's own channel, as the hub subscribes it."""
        self._handlers[channel] = handler
        await self.unicast.subscribe_own(channel)

    async def subscribe_bus(self, channel: str, handler: Callable[[bytes], Any]) -> None:
        """A channel on the bus alone (a workspace's broadcasts)."""
        self._handlers[channel] = handler
        await self.bus.subscribe(channel)

    def _first(self, prefix: str, data: bytes) -> None:
        for channel, handler in self._handlers.items():
            if channel.startswith(prefix):
                handler(data)
                return

    # -- Inbound -------------------------------------------------------------------

    def receive(self, message: Message) -> bool:
        """Each message to the test's callable for its channel, as it travelled (without the bus's tag;
        a balanced or bounced call as the router hands it on, whichever way it came)."""
        if isinstance(message, BalancedCall):
            data = replica_wire.wrap_balanced(message.handle, message.frame)
        elif isinstance(message, BouncedCall):
            data = replica_wire.wrap_bounced(message.callee, message.frame)
        else:
            data = replica_wire.encode(message, linked=True)
        if isinstance(message, ClientFrame | ManagerCall | BalancedCall | BouncedCall):
            handler = self._handlers.get(CLIENT_CHANNEL + message.address)
            if handler is None:
                return False
            handler(data)
        elif isinstance(message, ManagerReply):
            self._first(REPLICA_CHANNEL, data)
        elif isinstance(message, WorkspaceEvent):
            self._first(WORKSPACE_CHANNEL, data)
        else:
            raise AssertionError(f"not subscribed: {message!r}")
        return True

    @property
    def links(self) -> Links:
        assert self.unicast.links is not None
        return self.unicast.links

    async def start(self) -> None:
        assert await self.bus.start()
        await self.unicast.start()

    async def close(self) -> None:
        await self.unicast.close()
        await self.bus.close()


@asynccontextmanager
async def linked_replicas(url: str, secret: str) -> AsyncIterator[Callable[..., Any]]:
    """``make(name, **link_options)``: started replicas (``secret`` unless given), all closed at the end."""
    made: list[LinkedReplica] = []

    async def make(name: str, **link_options: Any) -> LinkedReplica:
        replica = LinkedReplica(url, name, secret=link_options.pop("secret", secret), **link_options)
        made.append(replica)
        await replica.start()
        return replica

    try:
        yield make
    finally:
        for replica in made:
            await replica.close()

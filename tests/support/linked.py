"""One replica's client channels, as the hub has them: a Redis bus and direct links, no hub."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from switchboard.backends.redis import RedisBus
from switchboard.clock import SystemClock
from switchboard.hub.inflight import InFlight
from switchboard.replicas.links import Links, LinkSettings
from switchboard.replicas.unicast import Unicast


class LinkedReplica:
    """A :class:`Unicast` over a real bus with links on loopback; ``calls`` are its open calls."""

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
            calls=self.calls,
            links=LinkSettings(secret=secret, **link_options),
            untagged_prefix="sb:replica:",  # as the hub has it: replicas' own channels go untagged
        )
        self.publish = self.unicast.publish
        self.subscribe = self.unicast.subscribe
        self.unsubscribe = self.unicast.unsubscribe

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

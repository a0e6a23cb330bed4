"""A test's callable per channel on a bus that has one listener (``EventBus.listen``).

The hub gives its bus one listener and routes by channel name
(``replicas/dataplane/inbound.py``); the bus tests only need to see what came on each
channel, so they keep their table of callables here.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from switchboard.backends.base import EventBus


class Handlers:
    """The bus's one listener: ``handler(data)`` per subscribed channel."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.table: dict[str, Callable[[bytes], Any]] = {}
        bus.listen(self)

    def __call__(self, channel: str, data: bytes) -> None:
        handler = self.table.get(channel)
        if handler is not None:
            handler(data)

    async def subscribe(self, channel: str, handler: Callable[[bytes], Any]) -> None:
        self.table[channel] = handler
        await self.bus.subscribe(channel)


_of: weakref.WeakKeyDictionary[Any, Handlers] = weakref.WeakKeyDictionary()


def on(bus: EventBus) -> Handlers:
    """The listener of ``bus`` (made, and given to it, the first time)."""
    handlers = _of.get(bus)
    if handlers is None:
        handlers = _of[bus] = Handlers(bus)
    return handlers

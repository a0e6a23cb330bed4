"""How long a retry window may keep a client's frames beyond its own window.

A client in transit keeps them for its grace; a client of a draining replica
that waits here for its wave keeps them until the drain's end (the wave's
sibling will take them). The drainer writes the drain's end into a
:class:`DrainEnd` it shares with the bound, so the retry window, built before
the drainer, reads it without reaching the drainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Deadlines(Protocol):
    def deadline(self, client: str) -> float | None: ...


class Closable(Protocol):
    @property
    def closed(self) -> bool: ...


class DrainEnd:
    """Until when a drain under way holds frames for the clients waiting for their wave; ``None``: no drain."""

    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until: float | None = None  # written by the drainer alone


class RetryBound:
    """``bound(client)``: the monotonic time a retry window may keep ``client``'s frames until, or ``None``."""

    __slots__ = ("transit", "drain", "peers")

    def __init__(self, transit: Deadlines, drain: DrainEnd, peers: Mapping[str, Closable]) -> None:
        self.transit = transit
        self.drain = drain
        self.peers = peers

    def __call__(self, client: str) -> float | None:
        in_transit = self.transit.deadline(client)
        if in_transit:
            return in_transit
        if self.drain.until is None:
            return None
        peer = self.peers.get(client)
        return None if peer is None or peer.closed else self.drain.until

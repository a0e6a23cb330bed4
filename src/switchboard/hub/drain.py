"""Draining on SIGTERM: finish what is under way, then send every client elsewhere.

Part of :class:`~switchboard.hub.hub.Hub` (a mixin, kept apart so that each
file reads in one sitting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from switchboard.hub.across import CLIENT_CHANNEL

if TYPE_CHECKING:
    from switchboard.backends.base import EventBus
    from switchboard.clock import Clock
    from switchboard.hub.inflight import InFlight
    from switchboard.hub.peer import Peer


class Draining:
    """The drain; the attributes below are the hub's own."""

    draining: bool
    bus: EventBus
    clock: Clock
    inflight: InFlight
    peers: dict[str, Peer]
    log: logging.LoggerAdapter[logging.Logger]

    async def drain(self, timeout: float, *, code: int, reason: str) -> None:
        """Stop taking new calls, let calls in flight finish, then tell every client to move.

        A client's channel is unsubscribed as soon as it waits for no reply:
        new calls from other replicas then wait in their senders' retry windows
        until the client has reconnected to a sibling, instead of landing here.
        A client still waiting for replies keeps its channel until they came.
        """
        self.draining = True
        cutoff = self.inflight.opened_count  # only calls already under way are waited for
        unsubscribed: set[str] = set()
        deadline = self.clock.monotonic() + timeout
        while True:
            for peer in list(self.peers.values()):
                if peer.id not in unsubscribed and not self.inflight.waits_before(peer.id, cutoff):
                    unsubscribed.add(peer.id)
                    await self.bus.unsubscribe(CLIENT_CHANNEL + peer.id)
                if peer.id in unsubscribed and not self.inflight.busy_before(peer.id, cutoff):
                    peer.close(code, reason)
            busy = [p for p in self.peers.values() if not p.closed]
            remaining = deadline - self.clock.monotonic()
            if not busy or remaining <= 0:
                break
            self.log.info("draining: %d clients have %d calls in flight", len(busy), len(self.inflight))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inflight.changed(), min(remaining, 0.5))
        for peer in list(self.peers.values()):
            peer.close(code, reason)

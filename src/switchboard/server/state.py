"""What the ASGI layer knows about itself: phase (starting, ready, draining) and live peers."""

from __future__ import annotations

import asyncio
import enum
import logging

from switchboard.hub.hub import Hub
from switchboard.hub.peer import Peer

log = logging.getLogger("switchboard.server")

# 1012 "Service Restart": every client treats a server close as "reconnect",
# and this code says why to anyone reading logs or captures.
CLOSE_RESTARTING = 1012


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class ServerState:
    """One per app: the hub it serves and whether new clients are welcome."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.phase = Phase.STARTING
        self.peers: set[Peer] = set()
        self._none_left = asyncio.Event()

    @property
    def accepting(self) -> bool:
        return self.phase is Phase.READY

    def readiness(self) -> tuple[bool, str]:
        """(ready?, why) for ``/health/readiness``."""
        if self.phase is not Phase.READY:
            return False, self.phase.value
        healthy, reason = self.hub.bus.health
        if not healthy:
            return False, f"event bus: {reason}"
        return True, "ready"

    def track(self, peer: Peer) -> None:
        self.peers.add(peer)

    def untrack(self, peer: Peer) -> None:
        self.peers.discard(peer)
        if not self.peers:
            self._none_left.set()

    async def drain(self) -> None:
        """Readiness 503 at once; calls in flight finish (up to the drain timeout); clients move on."""
        if self.phase in (Phase.DRAINING, Phase.STOPPED):
            return
        self.phase = Phase.DRAINING
        timeout = self.hub.settings.drain_timeout
        log.info(
            "draining %d clients (at most %.1fs)", len(self.peers), timeout, extra={"replica": self.hub.replica_id}
        )
        await self.hub.drain(timeout, code=CLOSE_RESTARTING, reason="Server restarting, please reconnect")
        if self.peers:
            self._none_left.clear()
            try:
                await asyncio.wait_for(self._none_left.wait(), 5.0)
            except TimeoutError:
                log.warning("%d clients still connected 5s after being told to leave", len(self.peers))

"""What the ASGI layer knows about itself: phase (starting, ready, draining) and live peers."""

from __future__ import annotations

import enum

from switchboard.hub.hub import Hub
from switchboard.hub.peer import Peer


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

    @property
    def accepting(self) -> bool:
        return self.phase is Phase.READY

    def readiness(self) -> tuple[bool, str]:
        """(ready?, why) for ``/health/readiness``."""
        if self.phase is Phase.READY:
            return True, "ready"
        return False, self.phase.value

    def track(self, peer: Peer) -> None:
        self.peers.add(peer)

    def untrack(self, peer: Peer) -> None:
        self.peers.discard(peer)

"""What the ASGI layer knows about itself: phase (starting, ready, draining), live peers, connections."""

from __future__ import annotations

import asyncio
import enum
import functools
import time

from switchboard.hub.http_port import HttpPort
from switchboard.hub.hub import Hub
from switchboard.hub.routing.limits import Allowances
from switchboard.hub.sessions.peer import Peer
from switchboard.server.process.connections import Connections


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
        #: filled by the server's protocols (:func:`switchboard.server.runner.uvicorn_config`)
        self.connections = Connections()
        self._none_left = asyncio.Event()
        self.created = time.monotonic()  # for /health's uptime

    @property
    def http(self) -> HttpPort:
        """What the HTTP routes use of the hub (:mod:`switchboard.hub.http_port`)."""
        return self.hub.http

    @functools.cached_property
    def allowances(self) -> Allowances:
        """HTTP callers' rate and calls in flight, per user (anonymous: per address), as a connection's."""
        s = self.hub.settings
        return Allowances(
            rate=s.max_messages_per_second, burst=s.message_burst, limit=s.max_pending_calls, clock=self.hub.clock
        )

    @property
    def accepting(self) -> bool:
        return self.phase is Phase.READY

    def refusal(self) -> str | None:
        """Why a new WebSocket must be turned away before its upgrade (``None``: welcome).

        Starting or draining, or the shared backend is unreachable (its pub/sub
        connection down: a client admitted now could not be counted, looked up
        or reached from other replicas, and one that is accepted and then closed
        takes it as final, hypha-rpc's JavaScript client at least).
        """
        if not self.accepting:
            return "Server is draining or starting, please retry"
        healthy, _ = self.hub.bus.health
        if not healthy:
            return "Hub backend unavailable, please retry"
        return None

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

    async def peers_gone(self, timeout: float) -> bool:
        """Wait until no peer is left, at most ``timeout`` seconds; ``False`` if some still are."""
        if self.peers:
            self._none_left.clear()
            try:
                await asyncio.wait_for(self._none_left.wait(), timeout)
            except TimeoutError:
                return False
        return True

"""The cluster's port to the hub: what the replica layer reads and asks of this replica
(:class:`~switchboard.replicas.upkeep.served.Served`), and nothing else.

:class:`~switchboard.replicas.upkeep.cluster.Cluster` is handed this, not the hub:
the clients here and those in transit, what they announced and whether
they are counted, the manager's ping, the running
totals and loads its presence record carries, and the repairs, sweeps and
clean-ups its loop runs. Built by :mod:`switchboard.hub.assemble`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.hub.gate.admission import Gatekeeper
from switchboard.hub.manager.announced import Announced
from switchboard.hub.manager.manager import WorkspaceManager
from switchboard.hub.repairs import Repairs
from switchboard.hub.routing.loads import Loads
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.moves import Moves
from switchboard.hub.workspace_events import WorkspaceEvents
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha.services import ServiceInfo


class ClusterPort:
    """:class:`~switchboard.replicas.upkeep.served.Served`, for one hub (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        clock: Clock,
        peers: Mapping[str, Peer],
        announced: Announced,
        gate: Gatekeeper,
        transit: Transit[Undelivered],
        manager: WorkspaceManager,
        metrics: HubMetrics,
        loads: Loads,
        repairs: Repairs,
        moves: Moves,
        events: WorkspaceEvents,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.replica_id = settings.replica_id
        self.peers = peers
        self.transit = transit
        self.manager = manager
        self.metrics = metrics
        self.loads = loads
        self._repairs = repairs
        self._moves = moves
        self._events = events
        self._announced = announced
        self._gate = gate

    def services_of(self, client: str) -> Collection[ServiceInfo]:
        """What the live connection of ``client`` here announced (nothing if none is here)."""
        peer = self.peers.get(client)
        return self._announced.of(peer).values() if peer is not None else ()

    def counted(self, client: str) -> bool:
        """Whether the hub-wide connection counts include the live connection of ``client`` here."""
        peer = self.peers.get(client)
        return peer is not None and self._gate.counts_in(peer)

    async def repair_registry(self) -> list[ServiceInfo]:
        return await self._repairs.repair_registry()

    async def reclaim(self) -> None:
        await self._repairs.reclaim()

    async def sweep_transits(self) -> int:
        """End transits nobody here knew of whose grace is over (:meth:`Moves.sweep_transits`)."""
        return await self._moves.sweep_transits()

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int:
        return await self._events.purge(workspace, client_id, owner=owner)

    async def announce_gone(self, workspace: str, client_id: str, removed: list[ServiceInfo]) -> int:
        return await self._events.announce_gone(workspace, client_id, removed)

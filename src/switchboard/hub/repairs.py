"""What a backend outage left undone here, redone by the cluster loop (:mod:`switchboard.replicas.upkeep.cluster`).

Registry writes that failed while Redis was away: a departure's clean-up (a
client's registrations not removed) and a registration (written back with
every live client's, by the cluster's re-assertion).
"""

from __future__ import annotations

from collections.abc import Mapping

from switchboard.hub.gate.admission import Gatekeeper
from switchboard.hub.manager.announced import Announced
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.workspace_events import WorkspaceEvents
from switchboard.protocol.hypha.services import ServiceInfo


class Repairs:
    """This replica's registry writes that failed, and their retry."""

    def __init__(
        self,
        *,
        replica_id: str,
        gate: Gatekeeper,
        peers: Mapping[str, Peer],
        announced: Announced,
        events: WorkspaceEvents,
    ) -> None:
        self._replica_id = replica_id
        self._gate = gate
        self._peers = peers
        self._announced = announced  # what each of them announced (the service directory's)
        self._events = events
        self.unpurged: set[tuple[str, str]] = set()  # (workspace, client id) whose registrations stayed
        self.registry_dirty = False  # a registration could not be written: the cluster loop re-asserts

    async def repair_registry(self) -> list[ServiceInfo]:
        """Retry what a backend outage left undone; return the registrations to re-write, if any
        (the cluster re-asserts them)."""
        await self._gate.retry_uncounted()
        for ws, cid in list(self.unpurged):
            if f"{ws}/{cid}" not in self._peers:  # a reconnected client re-registered itself
                await self._events.purge(ws, cid, owner=self._replica_id)
            self.unpurged.discard((ws, cid))
        if not self.registry_dirty:
            return []
        self.registry_dirty = False
        return [info for peer in list(self._peers.values()) for info in self._announced.of(peer).values()]

    async def reclaim(self) -> None:
        """Record again whose client ids this replica's clients are (the store lost its data)."""
        await self._gate.reclaim(list(self._peers.values()))

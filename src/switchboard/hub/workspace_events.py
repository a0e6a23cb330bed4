"""What a workspace hears of its clients' comings and goings: server events, and a gone client's farewell.

Written by the manager (a service registered, a workspace deleted), the hub
(a client detached) and the moves (a transit that ended without its client).
The events go out through the dispatch, built after the moves that announce:
the composition root (:mod:`switchboard.hub.assemble`) connects it once, as
it connects :class:`~switchboard.hub.transit.released.Released`.
"""

from __future__ import annotations

import logging
from typing import Protocol

from switchboard.backends.base import Registry, WorkspaceStore
from switchboard.errors import BackendError
from switchboard.hub.manager.data_charges import lasts_only_while_connected
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery

log = logging.getLogger(__name__)


class Broadcaster(Protocol):
    """What carries an event to a workspace's subscribers everywhere (:class:`~switchboard.hub.dispatch.Dispatch`)."""

    async def broadcast(self, workspace: str, event_type: str, frame: bytes) -> None: ...


class WorkspaceEvents:
    """Server events for a workspace, and the departure of its clients (connected once to a broadcaster)."""

    def __init__(self, *, registry: Registry, workspaces: WorkspaceStore) -> None:
        self._registry = registry
        self._workspaces = workspaces
        self._broadcaster: Broadcaster | None = None

    def connect(self, broadcaster: Broadcaster) -> None:
        if self._broadcaster is not None:
            raise RuntimeError("the workspace events are connected already")
        self._broadcaster = broadcaster

    async def emit_event(self, workspace: str, event_type: str, data: object) -> None:
        """A server event (``service_added`` ...) for the workspace's subscribers."""
        if self._broadcaster is None:
            raise RuntimeError("an event was emitted before the dispatch was connected")
        frame = envelope.encode({"type": event_type, "to": "*", "ws": workspace, "data": data})
        await self._broadcaster.broadcast(workspace, event_type, frame)

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int:
        """Remove a gone client's registrations and tell its workspace; return how many."""
        removed = await self._registry.remove_client(workspace, client_id, owner=owner)
        return await self.announce_gone(workspace, client_id, removed)

    async def announce_gone(self, workspace: str, client_id: str, removed: list[ServiceInfo]) -> int:
        """Tell the workspace a client left: each of its ``removed`` services, then the client;
        then free the workspace's data if it lasts only while a client of it is connected."""
        for info in removed:  # none: nothing was announced, or a newer connection elsewhere owns it now
            if not info["id"].endswith(":built-in"):
                await self.emit_event(workspace, "service_removed", info)
        if removed:
            await self.emit_event(workspace, "client_disconnected", {"id": client_id, "workspace": workspace})
        if lasts_only_while_connected(workspace):  # also when it registered nothing: a raw client may write data
            try:
                if not await self._registry.find(ServiceQuery(workspace, "*", "built-in")):
                    await self._workspaces.remove(workspace)
            except BackendError as exc:  # the store is away: the data expires with its TTL instead
                log.warning("data of %s not freed at its last client's departure: %s", workspace, exc)
        return len(removed)

"""The manager's port to the hub: the few stores and acts the workspace manager uses, nothing more.

:class:`~switchboard.hub.manager.manager.WorkspaceManager` is handed this
(it satisfies :class:`~switchboard.hub.manager.manager.ManagerHost`), not the
hub: it sends frames as the manager or for an HTTP caller, announces events,
ends sessions (a workspace deleted, a credential revoked, a kick) and asks
who is here. Built by :mod:`switchboard.hub.assemble` from the collaborators
the hub is built from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import shortuuid

from switchboard.backends.base import Registry, WorkspaceStore
from switchboard.backends.logins import LoginStore
from switchboard.backends.queues import QueueStore
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.hub.dispatch import ACTING_AS, Dispatch
from switchboard.hub.from_replicas import FromReplicas
from switchboard.hub.gate.admission import Gatekeeper
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.credentials import REVOKED, Credentials
from switchboard.hub.identity.users import User
from switchboard.hub.manager.acting import Acting
from switchboard.hub.manager.announced import Announced
from switchboard.hub.repairs import Repairs
from switchboard.hub.routing.balance import Balanced, Refuse, Resend
from switchboard.hub.routing.limits import TokenBucket
from switchboard.hub.routing.loads import Loads
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.joins import Holders
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.subscribers import Subscribers
from switchboard.hub.workspace_events import WorkspaceEvents
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.handshake import CLOSE_POLICY
from switchboard.protocol.link.replica_wire import ClientKicked, CredentialRevoked, WorkspaceDeleted
from switchboard.replicas.dataplane.remote import CLIENT_CHANNEL, Remote
from switchboard.replicas.dataplane.unicast import Unicast
from switchboard.replicas.upkeep.stores import PresenceStore
from switchboard.tasks import spawn

log = logging.getLogger(__name__)

# Seconds a connection that revoked its own credential stays open, so the answer to its call reaches it:
# plenty for a frame already queued on loopback or a LAN, and short for a leaked credential's holder.
ANSWER_GRACE = 1.0


class ManagerInbox:
    """Where the dispatch hands frames for the manager: its door, connected once the manager is built.

    The dispatch is built before the manager that sends through it (this
    port's other half); this closes that cycle in one typed place, like
    :class:`~switchboard.hub.transit.released.Released`.
    """

    __slots__ = ("_receive",)

    def __init__(self) -> None:
        self._receive: Callable[[bytes, Peer | None, envelope.Envelope | None], None] | None = None

    def connect(self, receive: Callable[[bytes, Peer | None, envelope.Envelope | None], None]) -> None:
        if self._receive is not None:
            raise RuntimeError("the manager's inbox is connected already")
        self._receive = receive

    def __call__(self, frame: bytes, caller: Peer | None = None, env: envelope.Envelope | None = None) -> None:
        if self._receive is None:
            raise RuntimeError("a frame reached the manager before it was built")
        self._receive(frame, caller, env)


class ManagerPort:
    """What the workspace manager uses of the hub (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        clock: Clock,
        metrics: HubMetrics,
        registry: Registry,
        workspaces: WorkspaceStore,
        logins: LoginStore,
        queues: QueueStore,
        issuer: TokenIssuer,
        credentials: Credentials,
        gate: Gatekeeper,
        peers: Mapping[str, Peer],
        announced: Announced,
        transit: Transit[Undelivered],
        subscribers: Subscribers,
        holders: Holders,
        balanced: Balanced,
        loads: Loads,
        router: Router,
        dispatch: Dispatch,
        from_replicas: FromReplicas,
        unicast: Unicast,
        remote: Remote,
        events: WorkspaceEvents,
        repairs: Repairs,
        aliases: dict[str, Acting],
        presence: PresenceStore | None,
        background: set[asyncio.Task[Any]],
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.registry = registry
        self.workspaces = workspaces
        self.logins = logins
        self.queues = queues
        self.issuer = issuer
        self.credentials = credentials
        self.subscribers = subscribers
        self.balanced = balanced
        self.loads = loads
        self.replica_id = settings.replica_id
        self.manager_id = settings.manager_id
        self.manager_address = settings.manager_address
        self._gate = gate
        self.announced = announced  # what each connection announced (the directory writes it)
        self._peers = peers
        self._transit = transit
        self._holders = holders
        self._router = router
        self._dispatch = dispatch
        self._from_replicas = from_replicas
        self._unicast = unicast
        self._remote = remote
        self._events = events
        self._repairs = repairs
        self._aliases = aliases  # HTTP callers with a call under way, by address (the router's and dispatch's)
        self._presence = presence  # the replicas' presence records (on Redis), else this replica alone
        self._background = background  # the hub's tasks, cancelled when it stops

    @property
    def registry_dirty(self) -> bool:
        """A registration could not be written (Redis away): the cluster loop re-asserts them all."""
        return self._repairs.registry_dirty

    @registry_dirty.setter
    def registry_dirty(self, dirty: bool) -> None:
        self._repairs.registry_dirty = dirty

    async def deletion(self, user: User, workspace: str) -> str | None:
        """Why ``user`` may not enter ``workspace`` because it was deleted, if so (:meth:`Gatekeeper.deletion`)."""
        return await self._gate.deletion(user, workspace)

    @property
    def rates(self) -> Mapping[Peer, TokenBucket]:
        """Each connection's frame rate (the gatekeeper's)."""
        return self._gate.rates

    def peer_for(self, address: str) -> Peer | None:
        return self._peers.get(address)

    def holds(self, client: str) -> bool:
        """Is ``client`` connected here, or in transit (expected back)?"""
        return client in self._peers or client in self._transit

    def balanced_bound(self, peer: Peer, target: str, error: str | None) -> None:
        """A balanced handle looked up for ``peer`` on its first call here: what waited is routed (:meth:`Router.bound`)."""
        for action in self._router.bound(peer, target, error):
            self._dispatch.carry(action)

    def balanced_steps(self, steps: list[Resend | Refuse]) -> None:
        """Balanced calls whose instance left: resent elsewhere or failed (:meth:`Router.balanced_steps`)."""
        for action in self._router.balanced_steps(steps):
            self._dispatch.carry(action)

    async def emit_event(self, workspace: str, event_type: str, data: object) -> None:
        await self._events.emit_event(workspace, event_type, data)

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int:
        return await self._events.purge(workspace, client_id, owner=owner)

    async def route_from_manager(self, data: bytes) -> None:
        """Route a frame the manager's RPC emitted, stamped as the trusted manager
        (or as the HTTP caller it acts for, :meth:`acting_as`)."""
        acting = ACTING_AS.get()
        action = self._router.from_manager(
            data,
            sender=acting.address if acting else self.manager_address,
            workspace=acting.workspace if acting else None,
            user=acting.user if acting else self._dispatch.manager_user,
        )
        rest = self._dispatch.run(action)
        if rest is not None:
            await rest

    @contextlib.asynccontextmanager
    async def acting_as(self, user: dict[str, Any], workspace: str) -> AsyncIterator[Acting]:
        """Calls the manager's RPC makes inside this block carry the HTTP caller's identity.

        The caller gets an address of its own for the block's duration, so
        replies (from any replica) find their way back to the manager's RPC.
        """
        acting = Acting(f"{workspace}/http-{shortuuid.uuid()[:12]}", workspace, user)
        channel = CLIENT_CHANNEL + acting.address
        self._aliases[acting.address] = acting
        self._from_replicas.listen(acting.address, acting)
        try:  # a subscribe that fails or is cancelled leaves the address in no table either
            await self._unicast.subscribe(channel)
            token = ACTING_AS.set(acting)
            try:
                yield acting
            finally:
                ACTING_AS.reset(token)
        finally:
            self._aliases.pop(acting.address, None)
            self._router.inflight.forget_peer(acting.address)
            try:
                await self._unicast.unsubscribe(channel)
            finally:
                self._from_replicas.forget(acting.address, acting)

    async def end_workspace(self, workspace: str) -> None:
        """A workspace was deleted: every replica ends the sessions of its clients there (and refuses
        those joining it)."""
        self._from_replicas.workspace_deleted(workspace)
        await self._remote.publish_message(WorkspaceDeleted(workspace))

    async def end_credential(self, token_id: str, *, answering: Peer | None = None) -> None:
        """A credential was revoked: every replica ends the sessions standing on it or on what descends
        from it (and refuses those joining with it). ``answering``: the connection that revoked it,
        closed only once its answer was sent (after :data:`ANSWER_GRACE`)."""
        if answering is not None and token_id in answering.user.revocation_ids:
            self._holders.discard(answering)  # no notice reaches it now, not even this replica's own
            spawn(self._background, self._close_after_answer(answering), f"close {answering.id} after its answer")
        self._from_replicas.credential_revoked(token_id)
        await self._remote.publish_message(CredentialRevoked(token_id))

    async def kick(self, workspace: str, client_id: str | None, code: int, reason: str) -> None:
        """Close a client's connection (``None``: every client of ``workspace``) on every replica."""
        kick = ClientKicked(workspace, client_id, code, reason)
        self._from_replicas.kicked(kick)
        await self._remote.publish_message(kick)

    async def replica_ids(self) -> list[str]:
        """The live replicas of this hub, by id (this one alone on the embedded backends)."""
        if self._presence is None:
            return [self.replica_id]
        records, _ = await self._presence.read_all()
        return sorted({str(r["id"]) for r in records if "id" in r} | {self.replica_id})

    async def _close_after_answer(self, peer: Peer) -> None:
        await self.clock.sleep(ANSWER_GRACE)
        peer.close(CLOSE_POLICY, f"Authentication error: {REVOKED}")

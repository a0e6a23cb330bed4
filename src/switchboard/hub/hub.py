"""The hub: admits clients, keeps their connections, and carries out the routing of their frames.

It knows connections; the routing decisions are the
:class:`~switchboard.hub.routing.router.Router`'s (values, no I/O), carried out by
:class:`~switchboard.hub.dispatch.Dispatch`. It does not know sockets (the
server layer owns those) nor where shared state lives (the backends do).
It keeps admission, attach, detach and the route of each frame; its
collaborators, each in its own module, are built and handed to it by the
composition root (:mod:`switchboard.hub.assemble`): among them
:class:`~switchboard.hub.transit.moves.Moves` (clients in transit),
:class:`~switchboard.hub.transit.drain.Drainer` (SIGTERM) and the manager. The
manager and the cluster reach the hub through ports of their own
(:mod:`~switchboard.hub.manager_port`, :mod:`~switchboard.hub.cluster_port`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Any

from switchboard.backends.base import Arrival, EventBus, Registry
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import BackendError, HandshakeError
from switchboard.hub.dispatch import Dispatch
from switchboard.hub.from_replicas import FromReplicas
from switchboard.hub.gate.admission import Admitted, Gatekeeper
from switchboard.hub.http_port import HttpPort
from switchboard.hub.manager.manager import WorkspaceManager
from switchboard.hub.reconnection import ReconnectionTokens
from switchboard.hub.repairs import Repairs
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.transit_steps import superseded_leftovers
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.routing.uploads import Receivers
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.joins import Holders, Joining, Joins
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.subscribers import Subscribers
from switchboard.hub.transit.drain import Drainer
from switchboard.hub.transit.moves import Moves
from switchboard.hub.transit.retry import RetryWindow
from switchboard.hub.workspace_events import WorkspaceEvents
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha.handshake import CLOSE_GOING_AWAY, CLOSE_POLICY, HYPHA_VERSION, Hello
from switchboard.replicas.dataplane.inbound import DELETED_CHANNEL, KICK_CHANNEL, REVOKED_CHANNEL
from switchboard.replicas.dataplane.remote import CLIENT_CHANNEL, REPLICA_CHANNEL, WORKSPACE_CHANNEL
from switchboard.replicas.dataplane.unicast import Unicast
from switchboard.tasks import cancel_and_wait, spawn

if TYPE_CHECKING:
    from switchboard.replicas.upkeep.cluster import Cluster

log = logging.getLogger(__name__)


class Hub:
    """Every live client of this replica, and what carries their frames (see the module docstring).

    Built by :func:`switchboard.hub.assemble.assemble`, which hands it what it
    keeps: it constructs nothing itself.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        clock: Clock,
        metrics: HubMetrics,
        registry: Registry,
        bus: EventBus,
        gate: Gatekeeper,
        tokens: ReconnectionTokens,
        peers: dict[str, Peer],
        members: dict[str, set[Peer]],
        joins: Joins,
        holders: Holders,
        subscribers: Subscribers,
        transit: Transit[Undelivered],
        unicast: Unicast,
        uploads: Receivers,
        retry: RetryWindow,
        replies: RetryWindow,
        router: Router,
        moves: Moves,
        dispatch: Dispatch,
        from_replicas: FromReplicas,
        drainer: Drainer,
        events: WorkspaceEvents,
        repairs: Repairs,
        manager: WorkspaceManager,
        http: HttpPort,
        cluster: Cluster | None,
        background: set[asyncio.Task[Any]],
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.registry = registry
        self.bus = bus
        self.gate = gate  # admission: who a client is, whether it may have its id, the counts
        self.tokens = tokens  # each connection's reconnection token, signed at most once a minute
        self.replica_id = settings.replica_id
        self.manager_id = settings.manager_id
        self.peers = peers  # the live connection of each client here, by address
        self._by_workspace = members  # the same, by workspace
        # whom a deletion or revocation notice reaches besides the members: the connections joining
        # (hub/sessions/joins.py), and the sessions by the credentials they stand on
        self.joins = joins
        self.holders = holders
        self.subscribers = subscribers  # who here listens to which workspace event
        self.transit = transit  # clients whose connection ended and that are expected back
        self.unicast = unicast  # frames for clients of other replicas
        self.uploads = uploads
        self.retry = retry
        self.replies = replies
        self.router = router
        self.moves = moves
        self.dispatch = dispatch
        self.from_replicas = from_replicas
        self.drainer = drainer
        self.events = events  # server events, and a gone client's farewell
        self.repairs = repairs  # registry writes that failed while the backend was away
        self.manager = manager
        self.http = http  # the HTTP routes' port (server/http/), carried for the server
        # the replica layer on a shared Redis (presence, lease, reaper, recovery), started and
        # stopped with the hub; None on the embedded backends
        self.cluster = cluster
        self._background = background
        self.log = logging.LoggerAdapter(log, {"replica": self.replica_id})

    @property
    def inflight(self) -> InFlight:
        """The calls in flight through this replica (the router's)."""
        return self.router.inflight

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        if not await self.bus.start():
            self.log.warning("event bus not healthy at start (%s): serving, and retrying", self.bus.health[1])
        await self.unicast.start()
        spawn(self._background, self.dispatch.take_lost(), f"{self.replica_id} lost frames")
        await self.manager.start()
        await self.unicast.subscribe_own(REPLICA_CHANNEL + self.replica_id)
        await self.bus.subscribe(DELETED_CHANNEL)
        await self.bus.subscribe(REVOKED_CHANNEL)
        await self.bus.subscribe(KICK_CHANNEL)
        await self.moves.start()
        self.metrics.calls_in_flight.set_function(lambda: len(self.inflight))
        if self.cluster is not None:
            await self.cluster.start()

    async def stop(self) -> None:
        for peer in list(self.peers.values()):
            peer.close(CLOSE_GOING_AWAY, "Server shutting down")
        await self.retry.close()
        await self.replies.close()
        await self.moves.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        await self.manager.stop()
        await self.unicast.close()  # ends dispatch.take_lost
        await cancel_and_wait(list(self._background))
        await self.bus.close()
        await self.registry.close()

    async def drain(self, timeout: float, *, code: int, reason: str) -> None:
        """Finish what is under way, then send every client elsewhere (:class:`~switchboard.hub.transit.drain.Drainer`)."""
        await self.drainer.drain(timeout, code=code, reason=reason)

    # -- admission -----------------------------------------------------------

    @contextlib.contextmanager
    def joining(self) -> Iterator[Joining]:
        """A connection on its way in, from before its admission until it joined its workspace (or was
        refused): deletion and revocation notices reach it meanwhile (:mod:`~switchboard.hub.sessions.joins`)."""
        joining = self.joins.begin()
        try:
            yield joining
        finally:
            self.joins.end(joining)

    async def admit(self, hello: Hello, joining: Joining | None = None) -> Admitted:
        """Who the client is and which workspace it joins (see :class:`Gatekeeper`)."""
        return await self.gate.admit(hello, workspace_here=lambda ws: ws in self._by_workspace, joining=joining)

    async def attach(
        self, peer: Peer, *, reconnecting: bool, arrival: Arrival | None = None, joining: Joining | None = None
    ) -> dict[str, Any]:
        """Make ``peer`` the live connection for its id, hub-wide; return its ``connection_info``.

        ``reconnecting``: it presented the client's reconnection token; ``arrival``: what the
        stores knew when it was admitted (:class:`~switchboard.hub.gate.admission.Admitted`; read
        again if not given); ``joining``: what it held since before its admission, refused by a
        deletion or revocation notice that came since (decided with the join, nothing awaited
        between: a later notice finds it among the members). Whether
        it may have the id is :func:`~switchboard.hub.gate.admission.take_over`'s
        decision (a client id belongs to the user that first connected with it);
        this carries it out.
        """
        plan = await self.gate.plan(
            peer,
            resuming=reconnecting,
            live_here=peer.id in self.peers,
            in_transit=peer.id in self.transit,
            arrival=arrival,
        )
        if plan.refusal is not None:
            raise HandshakeError(plan.refusal, CLOSE_GOING_AWAY)
        if plan.probe and await self.manager.answers_ping(peer.id):
            raise HandshakeError(
                f"Failed to establish connection: Client already exists and is active: {peer.id}",
                CLOSE_GOING_AWAY,
            )
        if plan.replace:  # a new session: the earlier one's held frames fail, its registrations go
            await self.moves.abandon(peer.id)
            await self.events.purge(peer.workspace, peer.client_id)
        # counted in within the limits, and the id claimed: refused if another user claimed it meanwhile
        claim = await self.gate.enter(peer)
        old = self.peers.get(peer.id)
        if old is not None:
            old.log.info("superseded by a new connection")
            old.close(1000, "Superseded by a new connection of the same client")
            # queued behind connection_info if it resumes; the earlier session's fail if it is a new one
            for action in superseded_leftovers(peer, old.leftovers(self.clock.monotonic()), resume=plan.resume):
                self.dispatch.carry(action)
        self.peers[peer.id] = peer
        members = self._by_workspace.setdefault(peer.workspace, set())
        first_in_workspace = not members
        members.add(peer)
        if old is not None:
            members.discard(old)
        self.holders.add(peer)
        try:
            if joining is not None and joining.refusal is not None:  # a notice came since admission
                peer.close(CLOSE_POLICY, joining.refusal)
                raise HandshakeError(joining.refusal, CLOSE_POLICY)
            self.from_replicas.listen(peer.id, peer)
            await self.unicast.subscribe(CLIENT_CHANNEL + peer.id)
            if first_in_workspace:
                await self.bus.subscribe(WORKSPACE_CHANNEL + peer.workspace)
            self.metrics.clients.set(len(self.peers))
            peer.log.info("connected (reconnecting=%s, user=%s)", reconnecting, peer.user.id)
            if claim.previous_owner is not None:  # a copy on another replica is stale now
                await self.moves.taken(peer.id)
            if plan.resume:
                await self.moves.arrived(peer)
        except BaseException:  # failed or cancelled once live: attached whole or not at all
            await self.detach(peer)
            raise
        return {
            "type": "connection_info",
            "hypha_version": HYPHA_VERSION,
            "server": "switchboard",
            "public_base_url": self.settings.public_base_url,
            "local_base_url": self.settings.public_base_url,
            "manager_id": self.manager_id,
            "workspace": peer.workspace,
            "client_id": peer.client_id,
            "user": peer.user_wire,
            "reconnection_token": self.tokens(peer),
            "reconnection_token_life_time": float(self.settings.reconnection_token_lifetime),
        }

    async def detach(self, peer: Peer) -> None:
        """Forget a closed connection, unless a newer one of the same client replaced it.

        Every change to the hub's own tables happens before the first await, so
        clients leaving together never see each other's half-done clean-up.
        """
        peer.close(1000, "")
        self.subscribers.drop(peer)
        self.inflight.forget_peer(peer.id)
        self.manager.forget(peer)
        self.tokens.forget(peer)
        members = self._by_workspace.get(peer.workspace)
        if members is not None:
            members.discard(peer)
        self.holders.discard(peer)
        current = self.peers.get(peer.id) is peer
        if current:
            del self.peers[peer.id]
            self.moves.expect(peer)  # frames for it that come while the store is asked are held
        workspace_empty = members is not None and not members
        if workspace_empty:
            self._by_workspace.pop(peer.workspace, None)
        self.metrics.clients.set(len(self.peers))
        await self.gate.count_out(peer)
        if not current:
            return
        if (newer := self.peers.get(peer.id)) is not None:
            # a new connection of the client attached while the store was asked: the client's
            # channel is its own now (unsubscribing it would cut it off from the other replicas),
            # and it is no departure
            self.moves.taken_up(newer)
            peer.log.info("disconnected (%s), its client already back here", peer.close_reason or "closed")
            return
        try:
            await self.unicast.unsubscribe(CLIENT_CHANNEL + peer.id)
        finally:
            self.from_replicas.forget(peer.id, peer)
        if workspace_empty:
            channel = WORKSPACE_CHANNEL + peer.workspace
            await self.bus.unsubscribe(channel)
            if peer.workspace in self._by_workspace:  # someone joined while we unsubscribed
                await self.bus.subscribe(channel)
        if await self.moves.depart(peer):  # no goodbye: expected back, nothing is announced yet
            self.moves.salvage(peer)
            peer.log.info("disconnected (%s), in transit", peer.close_reason or "closed")
            return
        self.uploads.forget(peer.id)
        try:
            await self.events.purge(peer.workspace, peer.client_id, owner=self.replica_id)
        except BackendError as exc:
            # Redis is away: the registrations stay until the cluster loop retries
            peer.log.warning("registrations not removed yet: %s", exc)
            self.repairs.unpurged.add((peer.workspace, peer.client_id))
        peer.log.info("disconnected (%s)", peer.close_reason or "closed")

    # -- frames: decided by the router, carried out by the dispatch --------------

    def handle_text(self, peer: Peer, text: str) -> None:
        """Answer a text control frame (``ping``, ``refresh_token``)."""
        self.dispatch.run(self.router.text(peer, text))

    async def handle_binary(self, peer: Peer, data: bytes) -> None:
        """Route one binary frame from ``peer``; a bad frame gets an error, never a crash."""
        rest = self.route_binary(peer, data)
        if rest is not None:
            await rest

    def route_binary(self, peer: Peer, data: bytes) -> Awaitable[Any] | None:
        """Route a frame as far as it goes without waiting; return the rest of the work, if any.

        Most frames go to a client here or over a direct link and are done on
        return. The server calls this in the callback that read the frame and
        awaits what is returned before it routes the client's next frame.
        """
        counts = self.metrics.frames
        counts.received += 1
        peer.last_heard = self.clock.monotonic()  # a drain sends it away in a pause (drain.QUIET)
        counts.received_bytes += len(data)
        return self.dispatch.run(self.router.route(peer, data))

    def __repr__(self) -> str:
        return f"<Hub replica={self.replica_id} clients={len(self.peers)}>"

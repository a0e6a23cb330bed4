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
from switchboard.hub.sessions.effects import (
    Depart,
    Effect,
    Expect,
    HandOn,
    JoinWorkspace,
    LeaveWorkspace,
    Listen,
    Purge,
    RefuseJoin,
    Resume,
    Salvage,
    Supersede,
    TakeOver,
    Unlisten,
)
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.joins import Joins
from switchboard.hub.sessions.life import Life, Stage
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.roster import Roster
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
        roster: Roster,
        joins: Joins,
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
        self.roster = roster  # the live connections here: by address, by workspace, by credential
        self.peers = roster.peers  # (read by the server and the metrics)
        self.joins = joins  # the connections joining: whom a deletion or revocation notice refuses
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
    def joining(self) -> Iterator[Life]:
        """A connection's life, from before its admission until it joined its workspace (or was
        refused): deletion and revocation notices reach it meanwhile (:mod:`~switchboard.hub.sessions.joins`)."""
        life = self.joins.begin()
        try:
            yield life
        finally:
            self.joins.end(life)

    async def admit(self, hello: Hello, life: Life | None = None) -> Admitted:
        """Who the client is and which workspace it joins (see :class:`Gatekeeper`)."""
        admitted = await self.gate.admit(hello, workspace_here=self.roster.has_workspace, joining=life)
        if life is not None:
            life.admitted()
        return admitted

    async def attach(self, peer: Peer, *, reconnecting: bool, arrival: Arrival | None = None) -> dict[str, Any]:
        """Make ``peer`` the live connection for its id, hub-wide; return its ``connection_info``.

        ``reconnecting``: it presented the client's reconnection token; ``arrival``: what the
        stores knew when it was admitted (:class:`~switchboard.hub.gate.admission.Admitted`; read
        again if not given). A deletion or revocation notice that came since its admission
        refuses it at the join (its :class:`~switchboard.hub.sessions.life.Life`, nothing awaited
        between). Whether it may have the id is :func:`~switchboard.hub.gate.admission.take_over`'s
        decision (a client id belongs to the user that first connected with it);
        what follows the join is :meth:`Life.join`'s; this carries both out.
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
        joined = self.roster.join(peer)
        effects = peer.life.join(
            peer.id,
            peer.workspace,
            first_in_workspace=joined.first_in_workspace,
            took_over=claim.previous_owner is not None,  # a copy on another replica is stale now
            resume=plan.resume,
            replaced=joined.replaced is not None,
        )
        try:
            for effect in effects:
                if isinstance(effect, Supersede) and joined.replaced is not None:  # first: nothing awaited
                    self._supersede(joined.replaced, peer, resume=effect.resume)
                else:
                    await self._carry(peer, effect)
            self.metrics.clients.set(len(self.peers))
            peer.log.info("connected (reconnecting=%s, user=%s)", reconnecting, peer.user.id)
        except BaseException:  # failed or cancelled once live: attached whole or not at all
            await self.detach(peer)
            raise
        peer.life.attached()
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
        clients leaving together never see each other's half-done clean-up;
        what follows is :class:`~switchboard.hub.sessions.life.Life`'s to say.
        """
        peer.close(1000, "")
        self.subscribers.drop(peer)
        self.inflight.forget_peer(peer.id)
        self.manager.forget(peer)
        self.tokens.forget(peer)
        left = self.roster.leave(peer)
        effects = peer.life.detached(peer.id, current=left.current, workspace_empty=left.workspace_empty)
        for effect in effects:  # none awaits: frames that come while the stores are asked are held
            await self._carry(peer, effect)
        self.metrics.clients.set(len(self.peers))
        await self.gate.count_out(peer)
        newer_here = peer.id in self.peers  # a new connection of the client attached meanwhile
        for effect in peer.life.counted_out(peer.id, peer.workspace, newer_here=newer_here):
            await self._carry(peer, effect)
        if not left.current:
            return  # superseded: the newer connection is the client's
        why = peer.close_reason or "closed"
        if newer_here:
            peer.log.info("disconnected (%s), its client already back here", why)
        elif peer.life.stage is Stage.IN_TRANSIT:
            peer.log.info("disconnected (%s), in transit", why)
        else:
            peer.log.info("disconnected (%s)", why)

    async def _carry(self, peer: Peer, effect: Effect) -> None:
        """Carry out one effect of ``peer``'s life (:mod:`switchboard.hub.sessions.effects`)."""
        if isinstance(effect, Listen):
            self.from_replicas.listen(effect.address, peer)
            await self.unicast.subscribe(CLIENT_CHANNEL + effect.address)
        elif isinstance(effect, JoinWorkspace):
            await self.bus.subscribe(WORKSPACE_CHANNEL + effect.workspace)
        elif isinstance(effect, TakeOver):
            await self.moves.taken(effect.address)
        elif isinstance(effect, Resume):
            await self.moves.arrived(peer)
        elif isinstance(effect, RefuseJoin):
            peer.close(CLOSE_POLICY, effect.reason)
            raise HandshakeError(effect.reason, CLOSE_POLICY)
        elif isinstance(effect, Expect):
            self.moves.expect(peer)
        elif isinstance(effect, HandOn):
            # the client's channel is the newer connection's now (unsubscribing it would cut it off
            # from the other replicas), and it is no departure
            self.moves.taken_up(self.peers[effect.address])
        elif isinstance(effect, Unlisten):
            try:
                await self.unicast.unsubscribe(CLIENT_CHANNEL + effect.address)
            finally:
                self.from_replicas.forget(effect.address, peer)
        elif isinstance(effect, LeaveWorkspace):
            channel = WORKSPACE_CHANNEL + effect.workspace
            await self.bus.unsubscribe(channel)
            if self.roster.has_workspace(effect.workspace):  # someone joined while we unsubscribed
                await self.bus.subscribe(channel)
        elif isinstance(effect, Depart):  # no goodbye: expected back, nothing is announced yet
            in_transit = await self.moves.depart(peer)
            for then in peer.life.departed(effect.address, peer.workspace, peer.client_id, in_transit=in_transit):
                await self._carry(peer, then)
        elif isinstance(effect, Salvage):
            self.moves.salvage(peer)
        elif isinstance(effect, Purge):
            await self._purge(peer, effect)
        else:  # Supersede: carried out by the attach, which knows the connection replaced
            raise TypeError(f"not carried out here: {effect!r}")

    def _supersede(self, old: Peer, new: Peer, *, resume: bool) -> None:
        """Close the connection ``new`` replaced; what it still had is queued behind ``new``'s
        ``connection_info`` if it resumes, else (the earlier session's) fails."""
        old.log.info("superseded by a new connection")
        old.close(1000, "Superseded by a new connection of the same client")
        leftovers = old.leftovers(self.clock.monotonic())
        for action in superseded_leftovers(new, leftovers, resume=resume):
            self.dispatch.carry(action)

    async def _purge(self, peer: Peer, purge: Purge) -> None:
        self.uploads.forget(peer.id)
        try:
            await self.events.purge(purge.workspace, purge.client_id, owner=self.replica_id)
        except BackendError as exc:
            # Redis is away: the registrations stay until the cluster loop retries
            peer.log.warning("registrations not removed yet: %s", exc)
            self.repairs.unpurged.add((purge.workspace, purge.client_id))

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

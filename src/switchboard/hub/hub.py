"""The hub: admits clients, keeps their connections, and carries out the routing of their frames.

It knows connections; the routing decisions are the
:class:`~switchboard.hub.routing.router.Router`'s (values, no I/O), carried out by
:class:`~switchboard.hub.dispatch.Dispatch`. It does not know sockets (the
server layer owns those) nor where shared state lives (the backends do).
Its collaborators, each in its own module: :class:`~switchboard.hub.remote.Remote`
(the other replicas, through the bus), :class:`~switchboard.hub.transit.moves.Moves`
(clients in transit), :class:`~switchboard.hub.transit.drain.Drainer` (SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TYPE_CHECKING, Any

import shortuuid

from switchboard.backends.base import (
    WORKSPACE_DATA_TTL,
    Arrival,
    ConnectionCounts,
    Entrance,
    EventBus,
    Registry,
    WorkspaceStore,
)
from switchboard.backends.entrance import StoreEntrance
from switchboard.backends.logins import LoginStore, MemoryLogins
from switchboard.backends.memory import MemoryConnectionCounts
from switchboard.backends.memory_workspaces import MemoryWorkspaceStore
from switchboard.backends.queues import MemoryQueues, QueueBounds, QueueStore
from switchboard.backends.revocations import MemoryRevocations, Revocations
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import BackendError, HandshakeError
from switchboard.hub.dispatch import ACTING_AS, Acting, Dispatch
from switchboard.hub.from_replicas import FromReplicas
from switchboard.hub.gate.admission import Admitted, Gatekeeper
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.credentials import REVOKED, Credentials
from switchboard.hub.identity.oidc import OidcVerifier
from switchboard.hub.identity.users import ROOT
from switchboard.hub.manager.data_charges import lasts_only_while_connected
from switchboard.hub.manager.manager import WorkspaceManager
from switchboard.hub.routing.balance import Balanced, Refuse, Resend
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.loads import Loads
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered, undelivered_of
from switchboard.hub.routing.uploads import Receivers
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.joins import Holders, Joining, Joins
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.subscribers import Subscribers
from switchboard.hub.transit.drain import Drainer
from switchboard.hub.transit.moves import Moves
from switchboard.hub.transit.released import Released
from switchboard.hub.transit.retry import RetryWindow
from switchboard.hub.transit.retry_bound import DrainEnd, RetryBound
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.handshake import CLOSE_GOING_AWAY, CLOSE_POLICY, HYPHA_VERSION, Hello
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery
from switchboard.protocol.link.replica_wire import ClientKicked, CredentialRevoked, WorkspaceDeleted
from switchboard.replicas.dataplane.inbound import DELETED_CHANNEL, KICK_CHANNEL, REVOKED_CHANNEL
from switchboard.replicas.dataplane.links import LinkSettings
from switchboard.replicas.dataplane.remote import CLIENT_CHANNEL, REPLICA_CHANNEL, WORKSPACE_CHANNEL, Remote
from switchboard.replicas.dataplane.unicast import Unicast
from switchboard.tasks import cancel_and_wait, spawn

if TYPE_CHECKING:
    from switchboard.replicas.upkeep.cluster import Cluster

log = logging.getLogger(__name__)

# Seconds a connection's last reconnection token is handed out again instead of a
# new one (at most a tenth of the token's lifetime, so a reused token has nearly all
# of it left): hypha-rpc asks 2 s after connecting, then every 2 hours by default.
TOKEN_REUSE = 60.0
# Seconds a connection that revoked its own credential stays open, so the answer to its call reaches it:
# plenty for a frame already queued on loopback or a LAN, and short for a leaked credential's holder.
ANSWER_GRACE = 1.0


def queue_bounds(settings: Settings) -> QueueBounds:
    """The bounds of the task queues (``--max-queue-items*``)."""
    return QueueBounds(
        per_workspace=settings.max_queue_items_per_workspace,
        per_principal=settings.max_queue_items_per_user,
        total=settings.max_queue_items,
    )


class Hub:
    """Every live client of this replica, and what carries their frames (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: Registry,
        bus: EventBus,
        clock: Clock,
        metrics: HubMetrics,
        issuer: TokenIssuer,
        counts: ConnectionCounts | None = None,
        links: LinkSettings | None = None,
        workspaces: WorkspaceStore | None = None,
        revocations: Revocations | None = None,
        entrance: Entrance | None = None,
        queues: QueueStore | None = None,
        logins: LoginStore | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.issuer = issuer
        self.counts = counts or MemoryConnectionCounts()
        self.workspaces = workspaces or MemoryWorkspaceStore(
            clock=clock,
            ttl=WORKSPACE_DATA_TTL,
            max_bytes=settings.max_workspace_data_bytes,
            deletions_per_principal=settings.max_deletions_per_user,
            deletions=settings.max_deletions,
        )
        # how a token becomes a user at every door: the hub's own tokens, a provider's, revocations
        self.credentials = Credentials(
            issuer,
            revocations
            or MemoryRevocations(
                clock, per_principal=settings.max_revocations_per_user, total=settings.max_revocations
            ),
            OidcVerifier(settings, clock) if settings.oidc_issuer else None,
        )
        # the task queues of public/queue (hub/manager/task_queue.py)
        self.queues = queues or MemoryQueues(clock, queue_bounds(settings))
        # the pending sign-ins of public/hypha-login (hub/manager/login_service.py)
        self.logins: LoginStore = logins or MemoryLogins(clock)
        self.gate = Gatekeeper(
            settings=settings,
            issuer=issuer,
            credentials=self.credentials,
            registry=registry,
            counts=self.counts,
            clock=clock,
            workspaces=self.workspaces,
            # what admitting a client asks the stores (on Redis: one pipeline, then one script)
            entrance=entrance
            or StoreEntrance(
                revocations=self.credentials.revocations,
                registry=registry,
                counts=self.counts,
                workspaces=self.workspaces,
            ),
        )
        self.replica_id = settings.replica_id
        self.manager_id = settings.manager_id
        self.manager_address = f"*/{self.manager_id}"
        self.root_wire = ROOT.to_wire("*", self.manager_id)
        self.peers: dict[str, Peer] = {}
        self._by_workspace: dict[str, set[Peer]] = {}
        # whom a deletion or revocation notice reaches besides the members: the connections joining
        # (hub/sessions/joins.py), and the sessions by the credentials they stand on
        self.joins = Joins()
        self.holders = Holders()
        self.subscribers = Subscribers()  # who here listens to which workspace event
        self._background: set[asyncio.Task[Any]] = set()
        self._acting: dict[str, Acting] = {}  # HTTP callers with a call under way, by address
        # registry writes that failed while the backend was away, repaired by the cluster loop
        self.unpurged: set[tuple[str, str]] = set()
        self.registry_dirty = False
        # the replica layer on a shared Redis (presence, lease, reaper, recovery), started and
        # stopped with the hub; None on the embedded backends (set by the app, which builds it)
        self.cluster: Cluster | None = None
        self.log = logging.LoggerAdapter(log, {"replica": self.replica_id})
        calls_ended = asyncio.Event()  # a call in flight ended: what a drain waits for
        # the router's: the calls a lost link's unacked frames are judged by
        calls = InFlight(on_change=calls_ended.set)
        # calls in flight to each provider, for the min_load service selection
        self.loads = Loads(calls, clock=clock, is_local=lambda address: address in self.peers)
        # the balanced handles of this replica's callers, and their calls in flight (the router's)
        self.balanced = Balanced()
        self.manager = WorkspaceManager(self)
        # clients whose connection ended and that are expected back (switchboard.hub.transit.moves)
        self.transit: Transit[Undelivered] = Transit(
            clock=clock, grace=settings.transit_grace, max_bytes=settings.send_queue_bytes
        )
        # frames for clients of other replicas: over direct links (``links``) or through the bus
        self.unicast = Unicast(
            bus, replica_id=self.replica_id, clock=clock, calls=calls, links=links, untagged_prefix=REPLICA_CHANNEL
        )
        self.remote = Remote(
            bus=bus,
            unicast=self.unicast,
            registry=registry,
            replica_id=self.replica_id,
        )
        # what the retry window and the moves hand back goes to the dispatch, built after them (connected below)
        released = Released()
        drain_end = DrainEnd()  # the drainer's, read by the retry window's bound
        self.retry = RetryWindow(
            clock=clock,
            window=settings.undeliverable_retry_window,
            interval=0.1,
            publish=self.remote.publish_to_client,
            give_up=released.give_up,
            hold_until=RetryBound(self.transit, drain_end, self.peers),
        )
        # replies to calls another replica's manager made, waiting for its channel like a client's frames
        self.replies = RetryWindow(
            clock=clock,
            window=settings.undeliverable_retry_window,
            interval=0.1,
            publish=self.remote.publish_to_replica,
            give_up=lambda origin, _: self.log.warning("manager reply for replica %s dropped: unreachable", origin),
        )
        # chunked messages on their way to each client here or in transit from here (the router walks them)
        self.uploads = Receivers(
            clock=clock,
            max_bytes=settings.max_upload_bytes,
            alive=lambda client: client in self.peers or client in self.transit,
            allow_encrypted=settings.allow_encrypted_payloads,
        )
        self.router = Router(
            settings=settings,
            inflight=calls,
            balanced=self.balanced,
            uploads=self.uploads,
            clock=clock,
            metrics=metrics,
            peers=self.peers,
            aliases=self._acting,
            transit=self.transit,
            retry=self.retry,
            replies=self.replies,
        )
        self.moves = Moves(
            registry=registry,
            remote=self.remote,
            clock=clock,
            metrics=metrics,
            peers=self.peers,
            transit=self.transit,
            retry=self.retry,
            deliver=released.deliver,
            give_up=released.give_up,
            announce_gone=self.announce_gone,
            forget=self.uploads.forget,
        )
        self.dispatch = Dispatch(
            router=self.router,
            remote=self.remote,
            moves=self.moves,
            retry=self.retry,
            replies=self.replies,
            to_manager=self.manager.receive,
            subscribers=self.subscribers,
            aliases=self._acting,
            metrics=metrics,
            token=self.reconnection_token,
            manager_user=self.root_wire,
        )
        released.connect(self.dispatch)
        # what other replicas send here, whichever way it comes: the one port the unicast is handed
        self.from_replicas = FromReplicas(
            dispatch=self.dispatch,
            moves=self.moves,
            members=self._by_workspace,
            replica_id=self.replica_id,
            joins=self.joins,
            holders=self.holders,
        )
        self.unicast.listen(self.from_replicas)
        self.drainer = Drainer(
            router=self.router,
            moves=self.moves,
            unicast=self.unicast,
            clock=clock,
            peers=self.peers,
            retry=self.retry,
            calls_ended=calls_ended,
            window=settings.drain_window if settings.redis_url else 0,  # alone, nobody takes them in: all at once
            alone=not settings.redis_url,
            end=drain_end,
        )

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
        # counted from what the connected clients hold, not kept by +1/-1: a clean-up that
        # Redis ran but whose answer timed out (thousands leaving at once) cannot skew it
        self.metrics.services.set_function(lambda: sum(len(p.services) for p in self.peers.values()))
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
        stores knew when it was admitted (:class:`~switchboard.hub.sessions.admission.Admitted`; read
        again if not given); ``joining``: what it held since before its admission, refused by a
        deletion or revocation notice that came since (decided with the join, nothing awaited
        between: a later notice finds it among the members). Whether
        it may have the id is :func:`~switchboard.hub.sessions.admission.take_over`'s
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
            await self.purge(peer.workspace, peer.client_id)
        # counted in within the limits, and the id claimed: refused if another user claimed it meanwhile
        claim = await self.gate.enter(peer)
        old = self.peers.get(peer.id)
        if old is not None:
            old.log.info("superseded by a new connection")
            old.close(1000, "Superseded by a new connection of the same client")
            for frame in old.leftovers(self.clock.monotonic()):  # queued behind connection_info
                if plan.resume:
                    peer.send(frame)
                elif (item := undelivered_of(frame)) is not None:  # the earlier session's: it fails
                    self.dispatch.give_up(peer.id, item)
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
            "reconnection_token": self.reconnection_token(peer),
            "reconnection_token_life_time": float(self.settings.reconnection_token_lifetime),
        }

    def reconnection_token(self, peer: Peer) -> str:
        """A token that resumes ``peer``'s identity, signed afresh at most every
        :data:`TOKEN_REUSE` seconds per connection: a ``refresh_token`` flood gets
        the last one again, costing no signature each."""
        now = self.clock.monotonic()
        reuse = min(TOKEN_REUSE, self.settings.reconnection_token_lifetime / 10)
        if peer.token is None or now - peer.token_signed_at >= reuse:
            peer.token, peer.token_signed_at = self.gate.reconnection_token(peer), now
        return peer.token

    async def detach(self, peer: Peer) -> None:
        """Forget a closed connection, unless a newer one of the same client replaced it.

        Every change to the hub's own tables happens before the first await, so
        clients leaving together never see each other's half-done clean-up.
        """
        peer.close(1000, "")
        self.subscribers.drop(peer)
        self.inflight.forget_peer(peer.id)
        self.manager.forget(peer.id)
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
            await self.purge(peer.workspace, peer.client_id, owner=self.replica_id)
        except BackendError as exc:
            # Redis is away: the registrations stay until the cluster loop retries
            peer.log.warning("registrations not removed yet: %s", exc)
            self.unpurged.add((peer.workspace, peer.client_id))
        peer.log.info("disconnected (%s)", peer.close_reason or "closed")

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int:
        """Remove a gone client's registrations and tell its workspace; return how many."""
        removed = await self.registry.remove_client(workspace, client_id, owner=owner)
        return await self.announce_gone(workspace, client_id, removed)

    async def announce_gone(self, workspace: str, client_id: str, removed: list[Any]) -> int:
        """Tell the workspace a client left: each of its ``removed`` services, then the client;
        then free the workspace's data if it lasts only while a client of it is connected."""
        for info in removed:  # none: nothing was announced, or a newer connection elsewhere owns it now
            if not info["id"].endswith(":built-in"):
                await self.emit_event(workspace, "service_removed", info)
        if removed:
            await self.emit_event(workspace, "client_disconnected", {"id": client_id, "workspace": workspace})
        if lasts_only_while_connected(workspace):  # also when it registered nothing: a raw client may write data
            try:
                if not await self.registry.find(ServiceQuery(workspace, "*", "built-in")):
                    await self.workspaces.remove(workspace)
            except BackendError as exc:  # the store is away: the data expires with its TTL instead
                log.warning("data of %s not freed at its last client's departure: %s", workspace, exc)
        return len(removed)

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

    async def route_from_manager(self, data: bytes) -> None:
        """Route a frame the manager's RPC emitted, stamped as the trusted manager
        (or as the HTTP caller it acts for, :meth:`acting_as`)."""
        acting = ACTING_AS.get()
        action = self.router.from_manager(
            data,
            sender=acting.address if acting else self.manager_address,
            workspace=acting.workspace if acting else None,
            user=acting.user if acting else self.root_wire,
        )
        rest = self.dispatch.run(action)
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
        self._acting[acting.address] = acting
        self.from_replicas.listen(acting.address, acting)
        try:  # a subscribe that fails or is cancelled leaves the address in no table either
            await self.unicast.subscribe(channel)
            token = ACTING_AS.set(acting)
            try:
                yield acting
            finally:
                ACTING_AS.reset(token)
        finally:
            self._acting.pop(acting.address, None)
            self.inflight.forget_peer(acting.address)
            try:
                await self.unicast.unsubscribe(channel)
            finally:
                self.from_replicas.forget(acting.address, acting)

    async def end_workspace(self, workspace: str) -> None:
        """A workspace was deleted: every replica ends the sessions of its clients there (and refuses
        those joining it)."""
        self.from_replicas.workspace_deleted(workspace)
        await self.remote.publish_message(WorkspaceDeleted(workspace))

    async def end_credential(self, token_id: str, *, answering: Peer | None = None) -> None:
        """A credential was revoked: every replica ends the sessions standing on it or on what descends
        from it (and refuses those joining with it). ``answering``: the connection that revoked it,
        closed only once its answer was sent (after :data:`ANSWER_GRACE`)."""
        if answering is not None and token_id in answering.user.revocation_ids:
            self.holders.discard(answering)  # no notice reaches it now, not even this replica's own
            spawn(self._background, self._close_after_answer(answering), f"close {answering.id} after its answer")
        self.from_replicas.credential_revoked(token_id)
        await self.remote.publish_message(CredentialRevoked(token_id))

    async def kick(self, workspace: str, client_id: str | None, code: int, reason: str) -> None:
        """Close a client's connection (``None``: every client of ``workspace``) on every replica."""
        kick = ClientKicked(workspace, client_id, code, reason)
        self.from_replicas.kicked(kick)
        await self.remote.publish_message(kick)

    async def replica_ids(self) -> list[str]:
        """The live replicas of this hub, by id (this one alone on the embedded backends)."""
        if self.cluster is None:
            return [self.replica_id]
        records, _ = await self.cluster.presence.read_all()
        return sorted({str(r["id"]) for r in records if "id" in r} | {self.replica_id})

    async def _close_after_answer(self, peer: Peer) -> None:
        await self.clock.sleep(ANSWER_GRACE)
        peer.close(CLOSE_POLICY, f"Authentication error: {REVOKED}")

    async def emit_event(self, workspace: str, event_type: str, data: Any) -> None:
        """A server event (``service_added`` ...) for the workspace's subscribers."""
        frame = envelope.encode({"type": event_type, "to": "*", "ws": workspace, "data": data})
        await self.dispatch.broadcast(workspace, event_type, frame)

    # -- repairs -------------------------------------------------------------

    async def repair_registry(self) -> list[ServiceInfo]:
        """Retry what a backend outage left undone; return the registrations to re-write, if any
        (the cluster re-asserts them)."""
        await self.gate.retry_uncounted()
        for ws, cid in list(self.unpurged):
            if f"{ws}/{cid}" not in self.peers:  # a reconnected client re-registered itself
                await self.purge(ws, cid, owner=self.replica_id)
            self.unpurged.discard((ws, cid))
        if not self.registry_dirty:
            return []
        self.registry_dirty = False
        return [info for peer in list(self.peers.values()) for info in peer.services.values()]

    async def reclaim(self) -> None:
        """Record again whose client ids this replica's clients are (the store lost its data)."""
        await self.gate.reclaim(list(self.peers.values()))

    async def sweep_transits(self) -> int:
        """End transits nobody here knew of whose grace is over (:meth:`Moves.sweep_transits`)."""
        return await self.moves.sweep_transits()

    # -- queries used by the manager and HTTP layer --------------------------

    def peer_for(self, address: str) -> Peer | None:
        return self.peers.get(address)

    def holds(self, client: str) -> bool:
        """Is ``client`` connected here, or in transit (expected back)?"""
        return client in self.peers or client in self.transit

    def balanced_steps(self, steps: list[Resend | Refuse]) -> None:
        """Balanced calls whose instance left: resent elsewhere or failed (:meth:`Router.balanced_steps`)."""
        for action in self.router.balanced_steps(steps):
            self.dispatch.carry(action)

    def __repr__(self) -> str:
        return f"<Hub replica={self.replica_id} clients={len(self.peers)}>"

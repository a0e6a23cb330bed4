"""The hub: admits clients, routes their frames, and tells workspaces what changed.

It knows connections and routing decisions; it does not know sockets (the
server layer owns those) nor where shared state lives (the backends do).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import shortuuid

from switchboard.backends.base import ConnectionCounts, EventBus, Registry
from switchboard.backends.memory import MemoryConnectionCounts
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import (
    BackendError,
    HandshakeError,
    LimitExceeded,
    PermissionDenied,
    ProtocolError,
)
from switchboard.hub.across import (
    CLIENT_CHANNEL,
    REPLICA_CHANNEL,
    WORKSPACE_CHANNEL,
    AcrossReplicas,
)
from switchboard.hub.admission import Gatekeeper
from switchboard.hub.auth import ROOT, TokenIssuer, User
from switchboard.hub.drain import Draining
from switchboard.hub.inflight import InFlight, is_call
from switchboard.hub.manager_door import payload_map
from switchboard.hub.metrics import HubMetrics
from switchboard.hub.moves import Moves
from switchboard.hub.peer import Peer
from switchboard.hub.relay import ReplyRoutes
from switchboard.hub.retry import RetryWindow, Undelivered
from switchboard.hub.routing import Routing
from switchboard.hub.transit import Transit
from switchboard.hub.uploads import MAX_OPEN_UPLOADS, UPLOAD_IDLE_TIMEOUT, Uploads
from switchboard.protocol import envelope, relay
from switchboard.protocol.chunks import parse_cache_call
from switchboard.protocol.handshake import CLOSE_GOING_AWAY, Hello
from switchboard.protocol.services import ServiceQuery
from switchboard.replicas.links import LinkSettings
from switchboard.replicas.unicast import Unicast
from switchboard.tasks import spawn

log = logging.getLogger("switchboard.hub")

# Seconds a connection's last reconnection token is handed out again instead of a
# new one (at most a tenth of the token's lifetime, so a reused token has nearly all
# of it left): hypha-rpc asks 2 s after connecting, then every 2 hours by default.
TOKEN_REUSE = 60.0


@dataclass(frozen=True, slots=True)
class Acting:
    """Who the manager's RPC calls on behalf of (an HTTP caller), instead of as itself."""

    address: str
    workspace: str
    user: dict[str, Any]


# Context-local, not global state: set around one HTTP call, inherited by the
# tasks the manager's RPC creates to send that call's frames.
ACTING_AS: ContextVar[Acting | None] = ContextVar("switchboard_acting_as", default=None)


class Hub(Routing, AcrossReplicas, Draining, Moves):
    """Every live client of this replica, and the routes between them."""

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
    ) -> None:
        from switchboard.hub.manager import WorkspaceManager  # manager needs the hub type

        self.settings = settings
        self.registry = registry
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.issuer = issuer
        self.counts = counts or MemoryConnectionCounts()
        self.gate = Gatekeeper(settings=settings, issuer=issuer, registry=registry, counts=self.counts, clock=clock)
        self.replica_id = settings.replica_id
        self.manager_id = f"manager-{settings.server_id}"
        self.manager_address = f"*/{self.manager_id}"
        self.root_wire = ROOT.to_wire("*", self.manager_id)
        self.peers: dict[str, Peer] = {}
        self._by_workspace: dict[str, set[Peer]] = {}
        self.manager = WorkspaceManager(self)
        self.reply_routes = ReplyRoutes(clock)
        self.inflight = InFlight()
        # frames for clients of other replicas: over direct links (``links``) or through the bus
        self.unicast = Unicast(bus, replica_id=self.replica_id, clock=clock, calls=self.inflight, links=links)
        self._acting: dict[str, Acting] = {}  # HTTP callers with a call under way, by address
        self._background: set[asyncio.Task[Any]] = set()
        # registry writes that failed while the backend was away, repaired by the cluster loop
        self.unpurged: set[tuple[str, str]] = set()
        self.registry_dirty = False
        self.draining = False
        # background work with start()/stop() that lives as long as the hub (e.g. the cluster)
        self.companions: list[Any] = []
        # clients whose connection ended and that are expected back (switchboard.hub.moves)
        self.transit: Transit[Undelivered] = Transit(
            clock=clock, grace=settings.transit_grace, max_bytes=settings.send_queue_bytes
        )
        self.retry = RetryWindow(
            clock=clock,
            window=settings.undeliverable_retry_window,
            interval=0.1,
            publish=self._publish_to_client,
            give_up=lambda target, item: self._undeliverable(target, item.session, item.caller),
            hold_until=self.transit.deadline,
        )
        self.log = logging.LoggerAdapter(log, {"replica": self.replica_id})

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        if not await self.bus.start():
            self.log.warning("event bus not healthy at start (%s): serving, and retrying", self.bus.health[1])
        await self.unicast.start()
        spawn(self._background, self._take_lost(), f"{self.replica_id} lost frames")
        await self.manager.start()
        await self.bus.subscribe(REPLICA_CHANNEL + self.replica_id, self._on_bus_replica)
        await self.start_moves()
        self.metrics.calls_in_flight.set_function(lambda: len(self.inflight))
        # counted from what the connected clients hold, not kept by +1/-1: a clean-up that
        # Redis ran but whose answer timed out (thousands leaving at once) cannot skew it
        self.metrics.services.set_function(lambda: sum(len(p.services) for p in self.peers.values()))
        for companion in self.companions:
            await companion.start()

    async def stop(self) -> None:
        for peer in list(self.peers.values()):
            peer.close(CLOSE_GOING_AWAY, "Server shutting down")
        await self.retry.close()
        await self.stop_moves()
        for companion in reversed(self.companions):
            await companion.stop()
        await self.manager.stop()
        await self.unicast.close()
        await self.bus.close()
        await self.registry.close()

    # -- admission -----------------------------------------------------------

    async def admit(self, hello: Hello) -> tuple[User, str, bool]:
        """Who the client is and which workspace it joins (see :class:`Gatekeeper`)."""
        return await self.gate.admit(hello, workspace_here=lambda ws: ws in self._by_workspace)

    async def attach(self, peer: Peer, *, reconnecting: bool) -> dict[str, Any]:
        """Make ``peer`` the live connection for its id; return its ``connection_info``."""
        old = self.peers.get(peer.id)
        if old is not None and not reconnecting:
            if await self.manager.answers_ping(peer.id):
                raise HandshakeError(
                    f"Failed to establish connection: Client already exists and is active: {peer.id}",
                    CLOSE_GOING_AWAY,
                )
        elif old is None and not reconnecting:
            stale = await self.registry.find(ServiceQuery(peer.workspace, peer.client_id, "built-in"))
            if stale and await self.manager.answers_ping(peer.id):
                raise HandshakeError(
                    f"Failed to establish connection: Client already exists and is active: {peer.id}",
                    CLOSE_GOING_AWAY,
                )
            if stale:
                await self.purge(peer.workspace, peer.client_id)
        await self.gate.count_in(peer)
        old = self.peers.get(peer.id)
        if old is not None:
            old.log.info("superseded by a new connection")
            old.close(1000, "Superseded by a new connection of the same client")
        self.peers[peer.id] = peer
        members = self._by_workspace.setdefault(peer.workspace, set())
        first_in_workspace = not members
        members.add(peer)
        if old is not None:
            members.discard(old)
        await self.unicast.subscribe(CLIENT_CHANNEL + peer.id, lambda data: self._on_bus_client(peer, data))
        if first_in_workspace:
            await self.bus.subscribe(WORKSPACE_CHANNEL + peer.workspace, self._on_bus_broadcast)
        self.metrics.clients.set(len(self.peers))
        peer.log.info("connected (reconnecting=%s, user=%s)", reconnecting, peer.user.id)
        if reconnecting or peer.id in self.transit:
            await self.arrived(peer)
        return {
            "type": "connection_info",
            "hypha_version": "0.21.135",
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
        self.inflight.forget_peer(peer.id)
        self.manager.door.forget(peer.id)
        members = self._by_workspace.get(peer.workspace)
        if members is not None:
            members.discard(peer)
        current = self.peers.get(peer.id) is peer
        if current:
            del self.peers[peer.id]
        workspace_empty = members is not None and not members
        if workspace_empty:
            self._by_workspace.pop(peer.workspace, None)
        self.metrics.clients.set(len(self.peers))
        await self.gate.count_out(peer)
        if not current:
            return
        await self.unicast.unsubscribe(CLIENT_CHANNEL + peer.id)
        if workspace_empty:
            channel = WORKSPACE_CHANNEL + peer.workspace
            await self.bus.unsubscribe(channel)
            if peer.workspace in self._by_workspace:  # someone joined while we unsubscribed
                await self.bus.subscribe(channel, self._on_bus_broadcast)
        if await self.depart(peer):  # no goodbye: expected back, nothing is announced yet
            self.salvage(peer)
            peer.log.info("disconnected (%s), in transit", peer.close_reason or "closed")
            return
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
        """Tell the workspace a client left: each of its ``removed`` services, then the client."""
        if not removed:
            return 0  # nothing was announced, or a newer connection elsewhere owns it now
        for info in removed:
            if not info["id"].endswith(":built-in"):
                await self.emit_event(workspace, "service_removed", info)
        await self.emit_event(workspace, "client_disconnected", {"id": client_id, "workspace": workspace})
        return len(removed)

    # -- routing (the clients' own frames: switchboard.hub.routing) -----------

    async def route_from_manager(self, data: bytes) -> None:
        """Route a frame the manager's RPC emitted, stamped as the trusted manager."""
        env = envelope.decode(data)
        target = env.main.get("to")
        if not isinstance(target, str) or "/" not in target:
            self.log.warning("manager emitted a message without a full target: %r", target)
            return
        acting = ACTING_AS.get()
        sender = acting.address if acting else self.manager_address
        frame = envelope.stamp(
            env,
            sender=sender,
            workspace=acting.workspace if acting else target.partition("/")[0],
            user=acting.user if acting else self.root_wire,
            to=target,
            trusted=True,
        )
        if target == self.manager_address:
            self.manager.receive(frame)
            return
        if is_call(env.main.get("method"), env.session):  # so the client's reply is never refused
            self.inflight.opened(sender, env.session, target, self.peers)  # type: ignore[arg-type]
        await self.deliver(target, frame, session=env.session, caller=sender)

    @contextlib.asynccontextmanager
    async def acting_as(self, user: dict[str, Any], workspace: str) -> AsyncIterator[Acting]:
        """Calls the manager's RPC makes inside this block carry the HTTP caller's identity.

        The caller gets an address of its own for the block's duration, so
        replies (from any replica) find their way back to the manager's RPC.
        """
        acting = Acting(f"{workspace}/http-{shortuuid.uuid()[:12]}", workspace, user)
        channel = CLIENT_CHANNEL + acting.address
        self._acting[acting.address] = acting
        await self.unicast.subscribe(channel, lambda data: self._receive_as(acting, relay.unwrap(data)[2]))
        token = ACTING_AS.set(acting)
        try:
            yield acting
        finally:
            ACTING_AS.reset(token)
            self._acting.pop(acting.address, None)
            self.inflight.forget_peer(acting.address)
            await self.unicast.unsubscribe(channel)

    def _receive_as(self, acting: Acting, frame: bytes) -> None:
        """A frame for an HTTP caller: its calls live in the manager's RPC, which answers as the caller.

        The caller's address is an alias of the manager. Besides replies, a
        provider sends it the ``get_service("<address>:built-in")`` call with
        which it starts a reply too large for one frame; the RPC answers only
        calls addressed to its own id, and the provider accepts the answer only
        from the address it asked. So the frame goes in addressed to the
        manager, and what the RPC sends in answer leaves from the alias.
        """
        try:
            env = envelope.decode(frame)
        except ProtocolError as exc:
            self.log.info("dropped a frame for %s: %s", acting.address, exc)
            return
        env.main["to"] = self.manager_address
        token = ACTING_AS.set(acting)  # inherited by the tasks the RPC starts to answer
        try:
            self.manager.receive(envelope.encode(env.main, env.rest))
        finally:
            ACTING_AS.reset(token)

    async def broadcast(self, workspace: str, event_type: str, frame: bytes) -> None:
        """Deliver an event to every subscribed client of ``workspace`` on every replica."""
        self._broadcast_local(workspace, event_type, frame)
        await self._publish(WORKSPACE_CHANNEL + workspace, self.replica_id.encode() + b"\n" + frame)

    def _broadcast_local(self, workspace: str, event_type: str, frame: bytes) -> None:
        for peer in self._by_workspace.get(workspace, ()):
            if event_type in peer.subscriptions:
                peer.send(frame)

    async def emit_event(self, workspace: str, event_type: str, data: Any) -> None:
        """A server event (``service_added`` ...) for the workspace's subscribers."""
        frame = envelope.encode({"type": event_type, "to": "*", "ws": workspace, "data": data})
        await self.broadcast(workspace, event_type, frame)

    # -- chunked messages on their way to a client here ----------------------

    def upload_refusal(self, receiver: Peer, sender: str, op: str, rest: bytes | memoryview) -> str | None:
        """Why a ``message_cache`` call for ``receiver`` may not reach it, or ``None``.

        hypha-rpc joins the pieces of a large message on the receiving side
        and reads their payload over the header the hub stamped, so the hub
        walks them here, where every piece for this client passes, whichever
        replica it came from (:mod:`switchboard.hub.uploads`).
        """
        if receiver.uploads is None:
            receiver.uploads = Uploads(
                clock=self.clock,
                keep=False,
                max_bytes=self.settings.max_upload_bytes,
                max_uploads=MAX_OPEN_UPLOADS,
                idle_timeout=UPLOAD_IDLE_TIMEOUT,
            )
        uploads = receiver.uploads
        try:
            call = parse_cache_call(op, payload_map(rest))
            if call.op == "create":
                uploads.create(sender, call.key, overwrite=call.overwrite)
            elif call.op in ("append", "set"):
                uploads.add(sender, call.key, call.index, call.data)
            elif call.op == "remove":
                uploads.remove(sender, call.key)
            else:
                uploads.finish(sender, call.key)
        except (ProtocolError, PermissionDenied, LimitExceeded) as exc:
            self.metrics.bad_frames.inc()
            receiver.log.info("refused a chunk from %s: %s", sender, exc)
            return str(exc)
        return None

    # -- queries used by the manager and HTTP layer --------------------------

    def peer_for(self, address: str) -> Peer | None:
        return self.peers.get(address)

    def __repr__(self) -> str:
        return f"<Hub replica={self.replica_id} clients={len(self.peers)}>"

"""The composition root: one hub and everything it works with, built in dependency order.

The one place collaborators are constructed (``tests/test_layers.py`` holds
the :class:`~switchboard.hub.hub.Hub` to it): the stores come in as
:class:`Backends`; then identity and admission, the hub's tables, the
replica links, the router and what carries its actions out, the manager, the
replica layer (on Redis), and last the hub, handed what it keeps. Three
cycles are closed by ports connected once: frames released back to the
dispatch (:class:`~switchboard.hub.transit.released.Released`), events the
moves announce (:class:`~switchboard.hub.workspace_events.WorkspaceEvents`),
frames for the manager (:class:`~switchboard.hub.manager_port.ManagerInbox`).
The manager, the HTTP layer and the cluster are each handed a narrow port,
never the hub's parts.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from switchboard.backends.base import ConnectionCounts, Entrance, EventBus, Registry, WorkspaceStore
from switchboard.backends.entrance import StoreEntrance
from switchboard.backends.logins import LoginStore
from switchboard.backends.queues import QueueStore
from switchboard.backends.revocations import Revocations
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.hub.cluster_port import ClusterPort
from switchboard.hub.dispatch import Dispatch
from switchboard.hub.from_replicas import FromReplicas
from switchboard.hub.gate.admission import Gatekeeper
from switchboard.hub.http_port import HttpPort
from switchboard.hub.hub import Hub
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.credentials import Credentials
from switchboard.hub.identity.oidc import OidcVerifier
from switchboard.hub.identity.users import ROOT
from switchboard.hub.manager.acting import Acting
from switchboard.hub.manager.announced import Announced
from switchboard.hub.manager.manager import WorkspaceManager
from switchboard.hub.manager_port import ManagerInbox, ManagerPort
from switchboard.hub.reconnection import ReconnectionTokens
from switchboard.hub.repairs import Repairs
from switchboard.hub.routing.balance import Balanced
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.loads import Loads
from switchboard.hub.routing.replays import worth_replaying
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.routing.uploads import Receivers
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.joins import Joins
from switchboard.hub.sessions.roster import Roster
from switchboard.hub.sessions.subscribers import Subscribers
from switchboard.hub.transit.drain import Drainer
from switchboard.hub.transit.moves import Moves
from switchboard.hub.transit.released import Released
from switchboard.hub.transit.retry import RetryWindow
from switchboard.hub.transit.retry_bound import DrainEnd, RetryBound
from switchboard.hub.workspace_events import WorkspaceEvents
from switchboard.metrics import HubMetrics
from switchboard.replicas.dataplane.links import LinkSettings
from switchboard.replicas.dataplane.remote import REPLICA_CHANNEL, Remote
from switchboard.replicas.dataplane.unicast import Unicast

if TYPE_CHECKING:
    from switchboard.backends.redis.assemble import RedisBackends


@dataclass(frozen=True)
class Backends:
    """The stores a hub works on: the embedded ones, or Redis's (``redis``: its parts, for the replica layer)."""

    registry: Registry
    bus: EventBus
    counts: ConnectionCounts
    workspaces: WorkspaceStore
    revocations: Revocations
    queues: QueueStore
    logins: LoginStore
    entrance: Entrance | None = None  # what admitting a client asks the stores; built on the others if None
    links: LinkSettings | None = None  # direct links between replicas (on Redis, with --links)
    redis: RedisBackends | None = None


def assemble(settings: Settings, backends: Backends, *, clock: Clock, secret: str) -> Hub:
    """The hub of ``settings`` on ``backends``, with everything it works with (see the module docstring);
    ``secret`` signs its tokens."""
    metrics = HubMetrics(settings.replica_id)
    issuer = TokenIssuer(secret=secret, clock=clock)  # the hub's own tokens, signed with ``secret``
    replica_id = settings.replica_id
    hub_log = logging.LoggerAdapter(logging.getLogger("switchboard.hub.hub"), {"replica": replica_id})
    registry, bus = backends.registry, backends.bus
    # who a client is, and whether it may come in: the hub's own tokens, a provider's, revocations
    credentials = Credentials(
        issuer, backends.revocations, OidcVerifier(settings, clock) if settings.oidc_issuer else None
    )
    gate = Gatekeeper(
        settings=settings,
        issuer=issuer,
        credentials=credentials,
        registry=registry,
        counts=backends.counts,
        clock=clock,
        workspaces=backends.workspaces,
        # what admitting a client asks the stores (on Redis: one pipeline, then one script)
        entrance=backends.entrance
        or StoreEntrance(
            revocations=backends.revocations,
            registry=registry,
            counts=backends.counts,
            workspaces=backends.workspaces,
        ),
    )
    tokens = ReconnectionTokens(gate, clock=clock, lifetime=settings.reconnection_token_lifetime)
    # the hub's tables, shared read-only with what routes and moves frames
    roster = Roster()  # the clients here: by address, by workspace, by the credentials they stand on
    peers, members, holders = roster.peers, roster.members, roster.holders
    joins = Joins()  # the connections joining: whom a deletion or revocation notice refuses
    subscribers = Subscribers()  # who here listens to which workspace event
    announced = Announced()  # what each connection here announced (written by the service directory)

    def registered() -> int:
        # counted from what the connected clients hold, not kept by +1/-1: a clean-up that
        # Redis ran but whose answer timed out (thousands leaving at once) cannot skew it
        return sum(len(announced.of(peer)) for peer in peers.values())

    metrics.services.set_function(registered)
    aliases: dict[str, Acting] = {}  # HTTP callers with a call under way, by address
    background: set[asyncio.Task[Any]] = set()
    calls_ended = asyncio.Event()  # a call in flight ended: what a drain waits for
    # the router's: the calls a lost link's unacked frames are judged by
    calls = InFlight(on_change=calls_ended.set)
    # calls in flight to each provider, for the min_load service selection
    loads = Loads(calls, clock=clock, is_local=lambda address: address in peers)
    # the balanced handles of this replica's callers, and their calls in flight (the router's)
    balanced = Balanced()
    # clients whose connection ended and that are expected back (switchboard.hub.transit.moves)
    transit: Transit[Undelivered] = Transit(
        clock=clock, grace=settings.transit_grace, max_bytes=settings.send_queue_bytes
    )
    # frames for clients of other replicas: over direct links (``links``) or through the bus
    unicast = Unicast(
        bus,
        replica_id=replica_id,
        clock=clock,
        worth_replaying=lambda data: worth_replaying(data, calls),
        links=backends.links,
        untagged_prefix=REPLICA_CHANNEL,
    )
    remote = Remote(bus=bus, unicast=unicast, registry=registry, replica_id=replica_id)
    # what the retry window and the moves hand back goes to the dispatch, built after them (connected below)
    released = Released()
    events = WorkspaceEvents(registry=registry, workspaces=backends.workspaces)  # connected below too
    to_manager = ManagerInbox()  # and the manager's inbox, once the manager is built
    drain_end = DrainEnd()  # the drainer's, read by the retry window's bound
    retry = RetryWindow(
        clock=clock,
        window=settings.undeliverable_retry_window,
        interval=0.1,
        publish=remote.publish_to_client,
        give_up=released.give_up,
        hold_until=RetryBound(transit, drain_end, peers),
    )
    # replies to calls another replica's manager made, waiting for its channel like a client's frames
    replies = RetryWindow(
        clock=clock,
        window=settings.undeliverable_retry_window,
        interval=0.1,
        publish=remote.publish_to_replica,
        give_up=lambda origin, _: hub_log.warning("manager reply for replica %s dropped: unreachable", origin),
    )
    # chunked messages on their way to each client here or in transit from here (the router walks them)
    uploads = Receivers(
        clock=clock,
        max_bytes=settings.max_upload_bytes,
        alive=lambda client: client in peers or client in transit,
        allow_encrypted=settings.allow_encrypted_payloads,
    )
    router = Router(
        settings=settings,
        inflight=calls,
        balanced=balanced,
        uploads=uploads,
        clock=clock,
        metrics=metrics,
        peers=peers,
        rates=gate.rates,  # each connection's frame rate, spent per frame
        aliases=aliases,
        transit=transit,
        retry=retry,
        replies=replies,
    )
    moves = Moves(
        registry=registry,
        remote=remote,
        clock=clock,
        metrics=metrics,
        peers=peers,
        transit=transit,
        retry=retry,
        deliver=released.deliver,
        give_up=released.give_up,
        announce_gone=events.announce_gone,
        forget=uploads.forget,
    )
    dispatch = Dispatch(
        router=router,
        remote=remote,
        moves=moves,
        retry=retry,
        replies=replies,
        to_manager=to_manager,
        subscribers=subscribers,
        aliases=aliases,
        metrics=metrics,
        token=tokens,
        manager_user=ROOT.to_wire("*", settings.manager_id),
    )
    released.connect(dispatch)
    events.connect(dispatch)
    # what other replicas send here, whichever way it comes: the one port the unicast is handed
    from_replicas = FromReplicas(
        dispatch=dispatch, moves=moves, members=members, replica_id=replica_id, joins=joins, holders=holders
    )
    unicast.listen(from_replicas)
    repairs = Repairs(replica_id=replica_id, gate=gate, peers=peers, announced=announced, events=events)
    for_manager = ManagerPort(
        settings=settings,
        clock=clock,
        metrics=metrics,
        registry=registry,
        workspaces=backends.workspaces,
        logins=backends.logins,
        queues=backends.queues,
        issuer=issuer,
        credentials=credentials,
        gate=gate,
        peers=peers,
        announced=announced,
        transit=transit,
        subscribers=subscribers,
        holders=holders,
        balanced=balanced,
        loads=loads,
        router=router,
        dispatch=dispatch,
        from_replicas=from_replicas,
        unicast=unicast,
        remote=remote,
        events=events,
        repairs=repairs,
        aliases=aliases,
        presence=backends.redis.presence if backends.redis is not None else None,
        background=background,
    )
    manager = WorkspaceManager(for_manager)
    # a call through a balanced handle not bound here waits for the manager's lookup (a cycle: the
    # manager is built on the dispatch)
    dispatch.bind_first = manager.balancing.bind_later
    to_manager.connect(manager.receive)
    http = HttpPort(
        credentials=credentials,
        gate=gate,
        registry=registry,
        workspaces=backends.workspaces,
        manager=manager,
        for_manager=for_manager,
        registered=registered,
    )
    drainer = Drainer(
        router=router,
        moves=moves,
        unicast=unicast,
        clock=clock,
        peers=peers,
        retry=retry,
        calls_ended=calls_ended,
        window=settings.drain_window if settings.redis_url else 0,  # alone, nobody takes them in: all at once
        alone=not settings.redis_url,
        end=drain_end,
    )
    cluster = None
    if backends.redis is not None:
        from switchboard.hub.assemble_cluster import replica_layer

        port = ClusterPort(
            settings=settings,
            clock=clock,
            peers=peers,
            announced=announced,
            gate=gate,
            transit=transit,
            manager=manager,
            metrics=metrics,
            loads=loads,
            repairs=repairs,
            moves=moves,
            events=events,
        )
        cluster = replica_layer(port, backends.redis, metrics=metrics, unicast=unicast, loads=loads)
    return Hub(
        settings=settings,
        clock=clock,
        metrics=metrics,
        registry=registry,
        bus=bus,
        gate=gate,
        tokens=tokens,
        roster=roster,
        joins=joins,
        subscribers=subscribers,
        transit=transit,
        unicast=unicast,
        uploads=uploads,
        retry=retry,
        replies=replies,
        router=router,
        moves=moves,
        dispatch=dispatch,
        from_replicas=from_replicas,
        drainer=drainer,
        events=events,
        repairs=repairs,
        manager=manager,
        http=http,
        cluster=cluster,
        background=background,
    )

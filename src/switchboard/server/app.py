"""The ASGI application: routes, and the start and stop of everything behind them."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from switchboard.backends.base import WORKSPACE_DATA_TTL, EventBus, Registry, WorkspaceStore
from switchboard.backends.memory import MemoryBus, MemoryRegistry
from switchboard.backends.memory_workspaces import MemoryWorkspaceStore
from switchboard.clock import Clock, SystemClock
from switchboard.config import Settings
from switchboard.hub.hub import Hub, queue_bounds
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.metrics import HubMetrics
from switchboard.replicas.dataplane.links import LinkSettings
from switchboard.server.http import (
    http_apps,
    http_mcp,
    http_rpc,
    http_services,
    hypha_routes,
    login_page,
    static_mounts,
    status_api,
    web_console,
)
from switchboard.server.process.server_state import Phase, ServerState
from switchboard.server.process.state_dir import WORKSPACES_FILE, state_path, token_secret
from switchboard.server.ws.websocket import PATH, websocket_endpoint

if TYPE_CHECKING:
    from switchboard.backends.redis.assemble import RedisBackends
    from switchboard.replicas.upkeep.cluster import Cluster

log = logging.getLogger(__name__)

BUS_PROBE_IDLE = 1.0  # seconds without a byte from Redis's pub/sub before the bus probes it
BUS_PROBE_TIMEOUT = 1.0  # seconds a probe may take before the connection counts as dead


async def liveness(request: Request) -> Response:
    return JSONResponse({"status": "OK"})


async def readiness(request: Request) -> Response:
    state: ServerState = request.app.state.switchboard
    ready, why = state.readiness()
    body = {"status": "OK" if ready else "DOWN", "detail": why, "replica": state.hub.replica_id}
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.switchboard
    return Response(state.hub.metrics.render(), media_type="text/plain; version=0.0.4")


def build_hub(
    settings: Settings,
    *,
    clock: Clock | None = None,
    registry: Registry | None = None,
    bus: EventBus | None = None,
) -> Hub:
    """A hub on the embedded backends unless others are given."""
    clock = clock or SystemClock()
    secret = token_secret(settings)  # --jwt-secret, else the one kept in the state directory
    hub_registry: Registry = registry or MemoryRegistry(clock=clock)
    hub_bus: EventBus = bus or MemoryBus()
    parts = None
    links = counts = None
    workspaces: WorkspaceStore | None = None
    revocations = None
    entrance = None
    queues = None
    logins = None
    if settings.redis_url and registry is None and bus is None:
        from switchboard.backends.redis.assemble import redis_backends
        from switchboard.backends.redis.stores.entrance import RedisEntrance
        from switchboard.backends.redis.stores.logins import RedisLogins
        from switchboard.backends.redis.stores.queues import RedisQueues
        from switchboard.backends.redis.stores.revoked import RedisRevocations
        from switchboard.backends.redis.stores.workspaces import RedisWorkspaceStore

        parts = redis_backends(
            settings.redis_url,
            cluster=settings.redis_cluster,
            clock=clock,
            replica_id=settings.replica_id,
            reconcile_interval=settings.subscription_reconcile_interval,
            # a silent Redis (a blackholed connection) turns readiness 503 within about 2 s: probed
            # after 1 s without traffic, failed after 1 s without an echo (a loopback echo takes 0.1 ms)
            probe_idle=BUS_PROBE_IDLE,
            probe_timeout=BUS_PROBE_TIMEOUT,
            max_connections=settings.redis_max_connections,
        )
        hub_registry, hub_bus, counts = parts.registry, parts.bus, parts.counts
        workspaces = RedisWorkspaceStore(
            parts.client,
            ttl=WORKSPACE_DATA_TTL,
            clock=clock,
            max_bytes=settings.max_workspace_data_bytes,
            deletions_per_principal=settings.max_deletions_per_user,
            deletions=settings.max_deletions,
        )
        revocations = RedisRevocations(  # one revocation holds on every replica
            parts.client, clock=clock, per_principal=settings.max_revocations_per_user, total=settings.max_revocations
        )
        # an admission's reads in one pipeline, its count and claim in one script (keys as above)
        entrance = RedisEntrance(parts.client, replica_id=settings.replica_id, registry_prefix=parts.key_prefix)
        queues = RedisQueues(parts.client, clock=clock, bounds=queue_bounds(settings))  # public/queue, shared
        logins = RedisLogins(parts.client, clock=clock)  # public/hypha-login: a sign-in ends on any replica
        if settings.links:
            links = LinkSettings(
                secret=settings.jwt_secret,
                host=settings.link_host or settings.host,
                port=settings.link_port,
                advertise=settings.link_advertise,
                max_handshakes=settings.max_link_handshakes,
                max_frame=settings.max_message_bytes + (64 << 10),  # room for the relay's wrapping
            )
    if workspaces is None:
        # the embedded hub keeps its persistent workspace records in the state directory, when
        # it has one in use (no --jwt-secret, or --state-dir given); else they last while it runs
        kept = settings.state_dir or not settings.jwt_secret
        path = state_path(settings.state_dir) / WORKSPACES_FILE if kept else None
        workspaces = MemoryWorkspaceStore(
            clock=clock,
            ttl=WORKSPACE_DATA_TTL,
            path=path,
            max_bytes=settings.max_workspace_data_bytes,
            deletions_per_principal=settings.max_deletions_per_user,
            deletions=settings.max_deletions,
        )
    hub = Hub(
        counts=counts,
        links=links,
        workspaces=workspaces,
        settings=settings,
        registry=hub_registry,
        bus=hub_bus,
        clock=clock,
        metrics=HubMetrics(settings.replica_id),
        issuer=TokenIssuer(secret=secret, clock=clock),
        revocations=revocations,
        entrance=entrance,
        queues=queues,
        logins=logins,
    )
    if parts is not None:
        hub.cluster = _cluster(hub, parts)
    return hub


def _cluster(hub: Hub, parts: RedisBackends) -> Cluster:
    """The replica layer of a hub on Redis: presence, lease, reaper, recovery, metrics."""
    from switchboard.backends.redis.bus.cluster_bus import ClusterBus
    from switchboard.backends.redis.cluster_status import ShardCollector
    from switchboard.backends.redis.stores.lease import RedisLease
    from switchboard.replicas.metrics import ReplicaCollector
    from switchboard.replicas.upkeep.cluster import Cluster, lease_policy
    from switchboard.replicas.upkeep.liveness import LivenessThread

    policy = lease_policy(hub.settings, parts.leader_key)
    bus = parts.bus if isinstance(parts.bus, ClusterBus) else None
    owner = f"{hub.replica_id}#{int(time.time() * 1000)}"  # unique per incarnation
    cluster = Cluster(
        hub,
        registry=parts.registry,
        bus=parts.bus,
        presence=parts.presence,
        # the lease's renewal keeps its deadline whatever the clients do: never a place in the
        # queue of the pool their commands fill (the presence record writes on it too)
        lease=RedisLease(parts.liveness, key=policy.key, ttl_ms=policy.ttl_ms, owner_id=owner),
        policy=policy,
        counts=parts.counts,
        # a cluster: presence outlasts a failover, and one of the registry's shard is followed by re-assertion
        node_timeout=bus.node_timeout if bus else None,
        store_master=(lambda: bus.store_master) if bus else None,
        close=parts.liveness.aclose,
        stale=parts.registry.stale,  # deletes a failover (or a restart) lost are undone
        # the lease and the presence record on a thread (and an event loop) of their own, with
        # `liveness` used only there: a starved serving loop costs neither (replicas/liveness.py)
        liveness=LivenessThread(f"{hub.replica_id} liveness"),
    )
    hub.metrics.registry.register(ReplicaCollector(cluster, hub.unicast))
    hub.loads.remote = cluster.peer_loads  # min_load lookups see the other replicas' clients too
    if isinstance(parts.bus, ClusterBus):
        hub.metrics.registry.register(ShardCollector(parts.bus))
    return cluster


def _middleware(settings: Settings) -> list[Middleware]:
    """CORS for the HTTP endpoints (WebSockets are not subject to it), if any origin is allowed.

    No credentials: a cross-origin page's requests never carry a visitor's
    cookie (the stream cookie of the HTTP transport, the only one), only what
    the page sends itself. Any request header may be sent: the transport
    needs ``Authorization`` and ``Content-Type: application/msgpack``.
    """
    origins = settings.cors_origin_list
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],  # an app takes any
            allow_headers=["*"],
            allow_credentials=False,
            max_age=600,
        )
    ]


def create_app(settings: Settings, hub: Hub | None = None) -> Starlette:
    """The Switchboard ASGI app for ``settings`` (embedded backends by default)."""
    hub = hub or build_hub(settings)
    state = ServerState(hub)

    sampler = status_api.StatusSampler(hub)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        sampler.start()
        state.phase = Phase.READY
        log.info("ready at %s as %s", settings.public_base_url, hub.manager_id, extra={"replica": hub.replica_id})
        try:
            yield
        finally:
            state.phase = Phase.DRAINING
            await sampler.stop()
            await hub.stop()
            state.phase = Phase.STOPPED

    routes = [
        Route("/health/liveness", liveness),
        Route("/health/readiness", readiness),
        Route("/metrics", metrics),
        *hypha_routes.routes(),  # before the services': "/{workspace}/info" is not a service
        WebSocketRoute(PATH, websocket_endpoint),  # the hub's own protocol serves it directly (runner.py)
        *http_rpc.routes(),
        *status_api.routes(),
        *http_mcp.routes(),
        *http_services.routes(),
        *login_page.routes(),  # before the apps': the hub serves its own login page at /public/apps/hypha-login
        *http_apps.routes(),
        *web_console.routes(),  # after: a workspace named "console" keeps /console/services
        *static_mounts.routes(settings.static_mounts),  # last: the hub's routes and workspaces' win
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=_middleware(settings))
    app.state.switchboard = state
    app.state.status_sampler = sampler
    return app

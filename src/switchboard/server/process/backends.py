"""Which stores a hub works on: the embedded ones, or Redis's (``--redis-url``), chosen from the settings.

What :func:`switchboard.hub.assemble.assemble` is handed as its
:class:`~switchboard.hub.assemble.Backends`.
"""

from __future__ import annotations

from switchboard.backends.base import WORKSPACE_DATA_TTL, EventBus, Registry
from switchboard.backends.logins import MemoryLogins
from switchboard.backends.memory import MemoryBus, MemoryConnectionCounts, MemoryRegistry
from switchboard.backends.memory_workspaces import MemoryWorkspaceStore
from switchboard.backends.queues import MemoryQueues, QueueBounds
from switchboard.backends.revocations import MemoryRevocations
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.hub.assemble import Backends
from switchboard.replicas.dataplane.links import LinkSettings
from switchboard.server.process.state_dir import WORKSPACES_FILE, state_path

BUS_PROBE_IDLE = 1.0  # seconds without a byte from Redis's pub/sub before the bus probes it
BUS_PROBE_TIMEOUT = 1.0  # seconds a probe may take before the connection counts as dead


def queue_bounds(settings: Settings) -> QueueBounds:
    """The bounds of the task queues (``--max-queue-items*``)."""
    return QueueBounds(
        per_workspace=settings.max_queue_items_per_workspace,
        per_principal=settings.max_queue_items_per_user,
        total=settings.max_queue_items,
    )


def backends_for(
    settings: Settings, *, clock: Clock, registry: Registry | None = None, bus: EventBus | None = None
) -> Backends:
    """Redis's stores if ``--redis-url`` is set and no registry or bus is given; else the embedded ones
    (around the ``registry`` and ``bus`` given, if any)."""
    if settings.redis_url and registry is None and bus is None:
        return _on_redis(settings, settings.redis_url, clock=clock)
    # the embedded hub keeps its persistent workspace records in the state directory, when
    # it has one in use (no --jwt-secret, or --state-dir given); else they last while it runs
    kept = settings.state_dir or not settings.jwt_secret
    path = state_path(settings.state_dir) / WORKSPACES_FILE if kept else None
    return Backends(
        registry=registry or MemoryRegistry(clock=clock),
        bus=bus or MemoryBus(),
        counts=MemoryConnectionCounts(),
        workspaces=MemoryWorkspaceStore(
            clock=clock,
            ttl=WORKSPACE_DATA_TTL,
            path=path,
            max_bytes=settings.max_workspace_data_bytes,
            deletions_per_principal=settings.max_deletions_per_user,
            deletions=settings.max_deletions,
        ),
        revocations=MemoryRevocations(
            clock, per_principal=settings.max_revocations_per_user, total=settings.max_revocations
        ),
        queues=MemoryQueues(clock, queue_bounds(settings)),  # public/queue (hub/manager/task_queue.py)
        logins=MemoryLogins(clock),  # public/hypha-login's pending sign-ins (hub/manager/login_service.py)
    )


def _on_redis(settings: Settings, url: str, *, clock: Clock) -> Backends:
    from switchboard.backends.redis.assemble import redis_backends
    from switchboard.backends.redis.stores.entrance import RedisEntrance
    from switchboard.backends.redis.stores.logins import RedisLogins
    from switchboard.backends.redis.stores.queues import RedisQueues
    from switchboard.backends.redis.stores.revoked import RedisRevocations
    from switchboard.backends.redis.stores.workspaces import RedisWorkspaceStore

    parts = redis_backends(
        url,
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
    links = None
    if settings.links:
        links = LinkSettings(
            secret=settings.jwt_secret,
            host=settings.link_host or settings.host,
            port=settings.link_port,
            advertise=settings.link_advertise,
            max_handshakes=settings.max_link_handshakes,
            max_frame=settings.max_message_bytes + (64 << 10),  # room for the relay's wrapping
        )
    return Backends(
        registry=parts.registry,
        bus=parts.bus,
        counts=parts.counts,
        workspaces=RedisWorkspaceStore(
            parts.client,
            ttl=WORKSPACE_DATA_TTL,
            clock=clock,
            max_bytes=settings.max_workspace_data_bytes,
            deletions_per_principal=settings.max_deletions_per_user,
            deletions=settings.max_deletions,
        ),
        revocations=RedisRevocations(  # one revocation holds on every replica
            parts.client, clock=clock, per_principal=settings.max_revocations_per_user, total=settings.max_revocations
        ),
        # an admission's reads in one pipeline, its count and claim in one script (keys as above)
        entrance=RedisEntrance(parts.client, replica_id=settings.replica_id, registry_prefix=parts.key_prefix),
        queues=RedisQueues(parts.client, clock=clock, bounds=queue_bounds(settings)),  # public/queue, shared
        logins=RedisLogins(parts.client, clock=clock),  # public/hypha-login: a sign-in ends on any replica
        links=links,
        redis=parts,
    )

"""The Redis backends of one replica, for one instance or for a cluster.

The only place that knows which of the two runs: everything above sees a
:class:`~switchboard.backends.base.Registry`, an
:class:`~switchboard.backends.base.EventBus` and the small stores of
:mod:`switchboard.replicas.upkeep.stores`, whichever Redis is behind them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchboard.backends.redis.bus.bus import RedisBus
from switchboard.backends.redis.bus.cluster_bus import ClusterBus
from switchboard.backends.redis.shared.cluster_setup import (
    CLUSTER_KEY_PREFIX,
    SINGLE_KEY_PREFIX,
    address_of,
    detect_cluster,
    make_cluster_client,
    node_url,
    seed_urls,
)
from switchboard.backends.redis.shared.connection import LIVENESS_CONNECTIONS, POOL_SIZE, make_client
from switchboard.backends.redis.shared.topology import Address
from switchboard.backends.redis.stores.counts import RedisConnectionCounts
from switchboard.backends.redis.stores.presence import RedisPresence, presence_keys
from switchboard.backends.redis.stores.registry import RedisRegistry
from switchboard.clock import Clock


@dataclass
class RedisBackends:
    """What a replica on Redis runs on; ``client`` is shared by the stores (closed with the hub).

    ``liveness`` is the leader lease's and the presence record's own client, a connection
    each (:data:`LIVENESS_CONNECTIONS`): the clients' commands, however many, never make
    them wait for a pooled connection and miss their deadlines. Its user closes it.
    """

    cluster: bool
    client: Any
    liveness: Any
    registry: RedisRegistry
    bus: RedisBus | ClusterBus
    counts: RedisConnectionCounts
    presence: RedisPresence
    leader_key: str
    key_prefix: str  # of the registry's, the counts' and the presence's keys (one hash tag on a cluster)


def redis_backends(
    url: str,
    *,
    cluster: bool | None,
    clock: Clock,
    replica_id: str,
    reconcile_interval: float | None = 5.0,
    probe_idle: float | None = 3.0,
    probe_timeout: float = 2.0,
    max_connections: int = POOL_SIZE,
) -> RedisBackends:
    """Backends on ``url`` (one URL, or a cluster's seed nodes comma-separated); ``cluster``
    ``None`` asks the nodes (:func:`detect_cluster`). ``max_connections`` bounds the shared
    command client's connections (to each node of a cluster)."""
    is_cluster = detect_cluster(url, cluster)
    prefix = CLUSTER_KEY_PREFIX if is_cluster else SINGLE_KEY_PREFIX
    bus: RedisBus | ClusterBus
    if is_cluster:
        seeds = seed_urls(url)
        client: Any = make_cluster_client(url, max_connections=max_connections)
        liveness: Any = make_cluster_client(url, max_connections=LIVENESS_CONNECTIONS)

        def url_of(addr: Address) -> str:
            return node_url(seeds[0], addr)

        bus = ClusterBus(
            client,
            node_url=url_of,
            seeds=[address_of(s) for s in seeds],
            clock=clock,
            replica_id=replica_id,
            reconcile_interval=reconcile_interval,
            probe_idle=probe_idle,
            probe_timeout=probe_timeout,
        )
    else:
        client = make_client(url, max_connections=max_connections)
        liveness = make_client(url, max_connections=LIVENESS_CONNECTIONS)
        bus = RedisBus(
            url,
            clock=clock,
            replica_id=replica_id,
            reconcile_interval=reconcile_interval,
            probe_idle=probe_idle,
            probe_timeout=probe_timeout,
        )
    return RedisBackends(
        cluster=is_cluster,
        client=client,
        liveness=liveness,
        registry=RedisRegistry(client, replica_id=replica_id, key_prefix=prefix),
        bus=bus,
        counts=RedisConnectionCounts(client, replica_id=replica_id, key_prefix=prefix),
        presence=RedisPresence(client, replica_id=replica_id, key_prefix=prefix, writer=liveness),
        leader_key=presence_keys(prefix)[1],
        key_prefix=prefix,
    )

"""The replica layer of a hub on Redis, built by the composition root (:mod:`switchboard.hub.assemble`).

Presence, lease, reaper and recovery (:class:`~switchboard.replicas.upkeep.cluster.Cluster`),
handed the hub's :class:`~switchboard.hub.cluster_port.ClusterPort`; its
counters on ``/metrics``; the other replicas' loads for ``min_load`` lookups.
"""

from __future__ import annotations

import time

from switchboard.backends.redis.assemble import RedisBackends
from switchboard.backends.redis.bus.cluster_bus import ClusterBus
from switchboard.backends.redis.cluster_status import ShardCollector
from switchboard.backends.redis.stores.lease import RedisLease
from switchboard.hub.cluster_port import ClusterPort
from switchboard.hub.routing.loads import Loads
from switchboard.metrics import HubMetrics
from switchboard.replicas.dataplane.unicast import Unicast
from switchboard.replicas.metrics import ReplicaCollector
from switchboard.replicas.upkeep.cluster import Cluster, lease_policy
from switchboard.replicas.upkeep.liveness import LivenessThread


def replica_layer(
    port: ClusterPort, parts: RedisBackends, *, metrics: HubMetrics, unicast: Unicast, loads: Loads
) -> Cluster:
    """The replica layer of a hub on Redis: presence, lease, reaper, recovery, metrics."""
    policy = lease_policy(port.settings, parts.leader_key)
    bus = parts.bus if isinstance(parts.bus, ClusterBus) else None
    owner = f"{port.replica_id}#{int(time.time() * 1000)}"  # unique per incarnation
    cluster = Cluster(
        port,
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
        # `liveness` used only there: a starved serving loop costs neither (replicas/upkeep/liveness.py)
        liveness=LivenessThread(f"{port.replica_id} liveness"),
        # what each replica reads, from the records every round: may a balanced call take a link to it
        versions=unicast.peer_versions.learn,
    )
    metrics.registry.register(ReplicaCollector(cluster, unicast))
    loads.remote = cluster.peer_loads  # min_load lookups see the other replicas' clients too
    if isinstance(parts.bus, ClusterBus):
        metrics.registry.register(ShardCollector(parts.bus))
    return cluster

"""The cluster bus on a real 3-master Valkey Cluster: sharded, exact counts, and it heals by itself.

redis-py's own ClusterPubSub does neither after a failover or a slot move
(issue 24); these are the bus's answers, checked without replica processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.crc import key_slot

from switchboard.backends.redis.assemble import RedisBackends, redis_backends
from switchboard.backends.redis.cluster_bus import ClusterBus
from switchboard.clock import SystemClock
from switchboard.testing.valkey_cluster import ValkeyCluster
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def parts(valkey_cluster: ValkeyCluster) -> AsyncIterator[RedisBackends]:
    valkey_cluster.wait_ok()
    made = redis_backends(valkey_cluster.url, cluster=None, clock=SystemClock(), replica_id="bus-test")
    assert isinstance(made.bus, ClusterBus)
    assert await made.bus.start()
    try:
        yield made
    finally:
        await made.bus.close()
        await made.client.aclose()


async def delivered(bus: Any, channel: str, got: list[bytes], token: bytes) -> bool:
    """Publish ``token``; True once it came back (exactly one receiver counted)."""
    if token not in got:
        receivers = await bus.publish(channel, token)
        assert receivers in (0, 1), receivers
    return token in got


async def test_each_master_holds_only_its_channels_and_counts_receivers_exactly(parts, valkey_cluster) -> None:
    bus: ClusterBus = parts.bus  # type: ignore[assignment]
    masters = {("127.0.0.1", port) for port in valkey_cluster.masters_ports()}
    assert set(bus.shards) == masters  # one pub/sub connection per master, none on a cluster replica
    got: list[bytes] = []
    channels = [f"sb:client:ws/c{n}" for n in range(12)]
    for channel in channels:
        await bus.subscribe(channel, got.append)
    for channel in channels:
        assert await bus.publish(channel, channel.encode()) == 1
    assert await bus.publish("sb:client:ws/nobody", b"x") == 0
    await eventually(lambda: len(got) == 12, timeout=5, what="every message")
    for port in valkey_cluster.masters_ports():
        with valkey_cluster.client(port) as node:
            held = {c.decode() for c in node.execute_command("PUBSUB", "SHARDCHANNELS", "sb:client:*")}
        assert held == {c for c in channels if valkey_cluster.master_of(key_slot(c.encode())) == port}


async def test_a_moved_slot_takes_its_channel_to_the_new_master(parts, valkey_cluster) -> None:
    # no timer and no reconciler: only what the server says (an unsolicited sunsubscribe) can heal it
    seeds = [("127.0.0.1", valkey_cluster.nodes[0].port)]
    bus = ClusterBus(
        parts.client,
        node_url=lambda addr: f"redis://{addr[0]}:{addr[1]}/0",
        seeds=seeds,
        clock=SystemClock(),
        replica_id="mover",
        reconcile_interval=None,
        refresh_interval=60,
    )
    assert await bus.start()
    try:
        await moved_slot_follows(bus, valkey_cluster)
    finally:
        await bus.close()


async def moved_slot_follows(bus: ClusterBus, valkey_cluster: ValkeyCluster) -> None:
    got: list[bytes] = []
    channel = "sb:client:ws/mover"
    await bus.subscribe(channel, got.append)
    slot = key_slot(channel.encode())
    target = next(p for p in valkey_cluster.masters_ports() if p != valkey_cluster.master_of(slot))
    await asyncio.to_thread(valkey_cluster.move_slot, slot, target)
    loop = asyncio.get_running_loop()
    moved = loop.time()
    await eventually(lambda: delivered(bus, channel, got, b"after"), timeout=5, what="delivery after the move")
    assert loop.time() - moved < 1.0, f"delivered {loop.time() - moved:.2f}s after the move"
    with valkey_cluster.client(target) as node:
        assert node.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1


async def test_a_sigkilled_masters_channels_follow_its_promoted_replica(parts, valkey_cluster) -> None:
    bus: ClusterBus = parts.bus  # type: ignore[assignment]
    got: list[bytes] = []
    channel = "sb:client:ws/survivor"
    await bus.subscribe(channel, got.append)
    victim = valkey_cluster.master_of(key_slot(channel.encode()))
    valkey_cluster.kill_master(victim)
    try:
        await eventually(lambda: not bus.all_shards_healthy, timeout=5, what="the bus noticing the dead master")

        def promoted() -> bool:
            owners = valkey_cluster.slot_owners()
            return victim not in owners and sum(owners.values()) == 16384

        await eventually(promoted, timeout=15, what="the promotion")
        loop = asyncio.get_running_loop()
        at = loop.time()
        await eventually(lambda: bus.all_shards_healthy and bus.is_confirmed(channel), timeout=5, what="healed")
        assert loop.time() - at < 2.0
        assert ("127.0.0.1", victim) not in bus.shards  # never a connection to the dead node, nor to a replica
        await eventually(lambda: delivered(bus, channel, got, b"after"), timeout=5, what="delivery after failover")
    finally:
        await asyncio.to_thread(valkey_cluster.revive, victim)
        await asyncio.to_thread(valkey_cluster.wait_ok)

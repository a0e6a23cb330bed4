"""The cluster bus on a real 3-master Valkey Cluster: sharded, exact counts, and it heals by itself.

redis-py's own ClusterPubSub does neither after a failover or a slot move
(issue 24); these are the bus's answers, checked without replica processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.crc import key_slot

from support.listen import on
from switchboard.backends.redis.assemble import RedisBackends, redis_backends
from switchboard.backends.redis.bus.cluster_bus import ClusterBus
from switchboard.clock import SystemClock
from switchboard.testing.proxy import FaultProxy
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
        await on(bus).subscribe(channel, got.append)
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
    await on(bus).subscribe(channel, got.append)
    slot = key_slot(channel.encode())
    target = next(p for p in valkey_cluster.masters_ports() if p != valkey_cluster.master_of(slot))
    await asyncio.to_thread(valkey_cluster.move_slot, slot, target)
    loop = asyncio.get_running_loop()
    moved = loop.time()
    await eventually(lambda: delivered(bus, channel, got, b"after"), timeout=5, what="delivery after the move")
    assert loop.time() - moved < 1.0, f"delivered {loop.time() - moved:.2f}s after the move"
    with valkey_cluster.client(target) as node:
        assert node.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1


def bus_connections(valkey_cluster: ValkeyCluster, name: str) -> list[str]:
    """Every connection named ``name`` that any running node of the cluster still serves (CLIENT LIST)."""
    found = []
    for node in valkey_cluster.nodes:
        if node.is_running():
            with node.client() as admin:
                found += [f"{node.port}:{c['addr']}" for c in admin.client_list() if c.get("name") == name]
    return found


async def test_closing_on_a_busy_event_loop_closes_every_pub_sub_connection(parts, valkey_cluster) -> None:
    """The loop is blocked 0.1 s at every turn while the bus closes (a busy or descheduled process):
    every task is then cancelled twice, and no shard's pub/sub connection may be left open for the
    garbage collector to find (it was, in about one run of tests/backends in six)."""
    name = "sb-bus-bus-test"
    assert len(bus_connections(valkey_cluster, name)) == 3  # one per master
    closed = asyncio.Event()

    async def busy_loop() -> None:
        for _ in range(30):  # bounded: 3 s at most
            if closed.is_set():
                return
            time.sleep(0.1)  # noqa: ASYNC251 - the fault: a CPU-bound turn holds the whole loop
            await asyncio.sleep(0)

    busy = asyncio.create_task(busy_loop())
    await parts.bus.close()
    closed.set()
    await busy
    await eventually(
        lambda: not bus_connections(valkey_cluster, name), timeout=3, what="every pub/sub connection of the bus closed"
    )


async def test_a_bus_closed_while_it_starts_opens_no_pub_sub_connection(parts, valkey_cluster) -> None:
    """close() while start() still reads the slot map (over a slow link): no shard bus may start
    once the bus is closed, so no connection is left open with nobody to close it."""
    name = "sb-bus-closed-early"
    seed = next(node for node in valkey_cluster.nodes if node.is_running())
    async with FaultProxy("127.0.0.1", seed.port, connect_timeout=2.0) as slow:
        slow.delay(0.3)  # CLUSTER SLOTS answers 0.6 s late, within the reader's 1 s timeout
        bus = ClusterBus(
            parts.client,  # already knows the cluster: start() goes straight to reading the slot map
            node_url=lambda addr: f"redis://{addr[0]}:{addr[1]}/0",
            seeds=[("127.0.0.1", slow.port)],
            clock=SystemClock(),
            replica_id="closed-early",
        )
        starting = asyncio.create_task(bus.start(wait=5))
        await eventually(lambda: slow.stats.accepted >= 1, timeout=5, what="start() reading the slot map")
        await bus.close()
        assert await starting is False
        assert bus.health == (False, "closed")
        assert bus.shards == {}, "a shard bus started after close()"
        await eventually(
            lambda: not bus_connections(valkey_cluster, name), timeout=3, what="no pub/sub connection left open"
        )


async def test_a_sigkilled_masters_channels_follow_its_promoted_replica(parts, valkey_cluster) -> None:
    bus: ClusterBus = parts.bus  # type: ignore[assignment]
    got: list[bytes] = []
    channel = "sb:client:ws/survivor"
    await on(bus).subscribe(channel, got.append)
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


async def test_a_crowd_of_channels_unsubscribed_at_once_leaves_no_master_holding_one(parts) -> None:
    """Unsubscribes asked together go out as few commands; on a cluster each ``SUNSUBSCRIBE``
    names channels of one slot only (Redis refuses others), and every one is confirmed."""
    bus: ClusterBus = parts.bus  # type: ignore[assignment]
    channels = [f"sb:client:ws/leaver{n}" for n in range(60)]  # on every master, in many slots
    for channel in channels:
        await on(bus).subscribe(channel, lambda data: None)
    assert len({key_slot(c.encode()) for c in channels}) > 30
    started = time.monotonic()

    await asyncio.gather(*(bus.unsubscribe(channel) for channel in channels))

    assert time.monotonic() - started < 1.0  # each confirmed, none waited out its timeout
    assert [await bus.publish(channel, b"x") for channel in channels] == [0] * len(channels)
    assert sum(shard.unsubscribes.writes for shard in bus.shards.values()) <= len(bus.shards) * 2

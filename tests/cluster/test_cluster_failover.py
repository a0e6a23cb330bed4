"""A Valkey Cluster master SIGKILLed under traffic: its replica is promoted and the hub follows.

The master killed serves both the registry's slot (``{sb}``) and the
provider's channel: the worst case, where registrations, presence, the
leader lease and the cross-replica route all fail over at once.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.crc import key_slot

from support.on_cluster import Traffic, channel_of
from switchboard.testing.valkey_cluster import ValkeyCluster
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(120)]


async def test_a_master_sigkilled_under_traffic_costs_calls_no_longer_than_the_failover(
    on_cluster, clients, valkey_cluster: ValkeyCluster, traffic_stops
):
    registry_master = valkey_cluster.master_of(key_slot(b"sb"))
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=valkey_cluster.seeds_url)
    first = await clients(a.url, client_id="first")
    ws, token = first.config["workspace"], await first.generate_token()
    # a provider whose channel lives on the registry's master too
    cid = next(
        f"p{n}"
        for n in range(10_000)
        if valkey_cluster.master_of(key_slot(channel_of(ws, f"p{n}").encode())) == registry_master
    )
    provider = await clients(a.url, client_id=cid, token=token)
    await provider.register_service({"id": "svc", "add": lambda x: x + 1})
    caller = await clients(b.url, client_id="caller", token=token)
    traffic = Traffic(await caller.get_service(f"{cid}:svc")).start()
    traffic_stops.append(traffic)
    await eventually(lambda: len(traffic.ok) >= 5, timeout=10, what="calls flowing")

    loop = asyncio.get_running_loop()
    killed = loop.time()
    valkey_cluster.kill_master(registry_master)

    def promoted() -> bool:
        owners = valkey_cluster.slot_owners()
        return registry_master not in owners and sum(owners.values()) == 16384

    await eventually(promoted, timeout=15, what="the master's replica promoted")
    failed_over = loop.time()
    # Valkey's own failover takes cluster-node-timeout and an election (3.5-5 s here); the hub
    # then follows within 2 s: the slot map is re-read every 0.25 s while a shard is down
    await eventually(lambda: traffic.ok_after(failed_over), timeout=10, what="a call after the failover")
    resumed = traffic.ok_after(failed_over)
    assert resumed is not None
    assert resumed - failed_over < 2.0, (
        f"calls resumed {resumed - failed_over:.2f}s after the promotion ({failed_over - killed:.2f}s after the "
        f"kill); {traffic.failed[-3:]}\n{a.log_tail(4000)}"
    )
    # nobody reaped, nothing lost for good: the provider is still registered and callable, from both sides
    services = {s["id"] for s in await caller.list_services()}
    assert f"{ws}/{cid}:svc" in services
    assert await (await caller.get_service(f"{cid}:svc")).add(41) == 42
    assert await (await first.get_service(f"{cid}:svc")).add(1) == 2
    # the connection counters still count both replicas' clients (a replica taken for dead loses its counts)
    with valkey_cluster.client(valkey_cluster.master_of(key_slot(b"sb"))) as node:
        counted = {k: node.hgetall(k) for k in node.keys("{sb}:conns:u:*")}
    assert any(set(fields) == {b"ra", b"rb"} for fields in counted.values()), counted
    steady, calls = loop.time(), len(traffic.ok)
    await eventually(lambda: len(traffic.ok) >= calls + 10, timeout=10, what="ten more calls")
    assert not [f for t, f in traffic.failed if t > steady], traffic.failed[-3:]

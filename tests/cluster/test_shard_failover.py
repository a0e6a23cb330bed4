"""A Valkey Cluster shard failing over while replicas serve: ready where they can serve, nobody taken
for dead, and nothing the dead master acknowledged lost for good.

Each test fails one shard of the module's real 3-master cluster (a SIGKILL and the replica's
promotion, or a takeover by a replica that missed writes) and puts the shard back afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis
from redis.crc import key_slot

from support.on_cluster import Traffic, channel_of
from switchboard.replicas.upkeep.cluster import PRESENCE_INTERVAL
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.valkey_cluster import ValkeyCluster
from switchboard.testing.wait import eventually, scaled

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(150)]

STORE_SLOT = key_slot(b"sb")  # the registry's, presence's, lease's and counters' slot: keys are tagged {sb}


async def readiness(replica: ReplicaProcess) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{replica.url}/health/readiness", timeout=2)).status_code


def promoted(cluster: ValkeyCluster, victim: int) -> bool:
    owners = cluster.slot_owners()
    return victim not in owners and sum(owners.values()) == 16384


def standby_of(cluster: ValkeyCluster) -> int | None:
    """The port of the registry's master's replica, once the cluster lists it."""
    with cluster.client() as node:
        for row in node.execute_command("CLUSTER", "SLOTS"):
            if int(row[0]) <= STORE_SLOT <= int(row[1]) and len(row) > 3:
                return int(row[3][1])
    return None


def is_master(cluster: ValkeyCluster, port: int) -> bool:
    with cluster.client(port) as node:
        return bool(node.execute_command("ROLE")[0] in (b"master", "master"))


@pytest.fixture
def killed(valkey_cluster: ValkeyCluster) -> Iterator[list[int]]:
    """Ports of masters a test SIGKILLs: started again afterwards (they rejoin as replicas)."""
    ports: list[int] = []
    yield ports
    for port in ports:
        valkey_cluster.revive(port)
    valkey_cluster.wait_ok()


async def test_a_master_without_the_registry_sigkilled_leaves_every_replica_ready(
    on_cluster, clients, valkey_cluster: ValkeyCluster, traffic_stops, killed
):
    """While a shard other than the registry's fails over, every replica keeps answering readiness
    200 (a Kubernetes Service keeps its endpoints) and calls among one replica's clients go on."""
    store = valkey_cluster.master_of(STORE_SLOT)
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=valkey_cluster.seeds_url)
    provider = await clients(a.url, client_id="prov")
    await provider.register_service({"id": "svc", "add": lambda x: x + 1})
    caller = await clients(a.url, client_id="caller", token=await provider.generate_token())
    traffic = Traffic(await caller.get_service("prov:svc")).start()
    traffic_stops.append(traffic)
    await eventually(lambda: len(traffic.ok) >= 5, timeout=10, what="calls flowing")
    # the victim: a master serving neither the registry nor the provider's channel
    busy = {store, valkey_cluster.master_of(key_slot(channel_of(provider.config["workspace"], "prov").encode()))}
    victim = next((p for p in valkey_cluster.masters_ports() if p not in busy), None)
    victim = victim or next(p for p in valkey_cluster.masters_ports() if p != store)

    loop = asyncio.get_running_loop()
    killed.append(victim)
    valkey_cluster.kill_master(victim)
    kill_time = loop.time()
    not_ready: list[str] = []
    promoted_at = None
    for _ in range(400):  # every 0.05 s until a second after the promotion, 20 s at most
        for replica in (a, b):
            status = await readiness(replica)
            if status != 200:
                not_ready.append(f"{replica.replica_id} {status} at +{loop.time() - kill_time:.2f}s")
        if promoted_at is None and await asyncio.to_thread(promoted, valkey_cluster, victim):
            promoted_at = loop.time()
        if promoted_at is not None and loop.time() > promoted_at + 1.0:
            break
        await asyncio.sleep(0.05)
    assert promoted_at is not None, "the victim's replica was never promoted"
    assert not not_ready, f"{len(not_ready)} readiness answers not 200: {not_ready[:5]}\n{a.log_tail(2000)}"
    failed = [f for t, f in traffic.failed if t > kill_time]
    assert not failed, f"calls between clients of one replica failed: {failed[:3]}"
    assert len([t for t in traffic.ok if t > kill_time]) >= 20


def presence_gaps(cluster: ValkeyCluster, replica_ids: list[str], seconds: float) -> tuple[list[str], int, float]:
    """Read every replica's presence record on the registry's (new) master for ``seconds``; the
    moments one was missing, how many reads answered, and the shortest life left a record had
    at the first read (what remained of its TTL when the failover ended)."""
    import time

    gaps, reads, margin = [], 0, float("inf")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded in time; about 0.02 s a round
        with contextlib.suppress(redis.RedisError, OSError), cluster.client(cluster.master_of(STORE_SLOT)) as node:
            for rid in replica_ids:
                left = node.pttl(f"{{sb}}:presence:{rid}")
                if left < 0:
                    gaps.append(f"{rid} at {time.monotonic():.2f}")
                elif not reads:
                    margin = min(margin, left / 1000)
            reads += 1
        time.sleep(0.02)
    return gaps, reads, margin


async def test_a_registry_master_sigkilled_takes_no_replica_for_dead(
    on_cluster, clients, valkey_cluster: ValkeyCluster, traffic_stops, killed
):
    """The registry's master SIGKILLed: presence writes stop until its replica is promoted, yet
    no replica's presence record expires (its TTL outlasts the failover, derived from the cluster's
    cluster-node-timeout), so nobody is presumed dead and no client is reaped; calls between
    replicas resume within 1 s of the promotion, and cluster-node-timeout + 6 s of the kill
    (the figures are printed: kill -> promotion -> first call)."""
    store = valkey_cluster.master_of(STORE_SLOT)
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=valkey_cluster.seeds_url)
    first = await clients(a.url, client_id="first")
    ws, token = first.config["workspace"], await first.generate_token()
    cid = next(
        f"p{n}" for n in range(10_000) if valkey_cluster.master_of(key_slot(channel_of(ws, f"p{n}").encode())) == store
    )
    provider = await clients(a.url, client_id=cid, token=token)
    await provider.register_service({"id": "svc", "add": lambda x: x + 1})
    caller = await clients(b.url, client_id="caller", token=token)
    traffic = Traffic(await caller.get_service(f"{cid}:svc")).start()
    traffic_stops.append(traffic)
    await eventually(lambda: len(traffic.ok) >= 5, timeout=10, what="calls flowing")

    standby = await eventually(lambda: asyncio.to_thread(standby_of, valkey_cluster), timeout=10, what="a standby")

    loop = asyncio.get_running_loop()
    killed.append(store)
    valkey_cluster.kill_master(store)
    kill_time = loop.time()
    # the promotion: the moment the standby itself says it is the master (before the others know)
    await eventually(
        lambda: asyncio.to_thread(is_master, valkey_cluster, standby), timeout=15, interval=0.01, what="the promotion"
    )
    promoted_at = loop.time()
    await eventually(lambda: asyncio.to_thread(promoted, valkey_cluster, store), timeout=15, what="the new slot map")
    gaps, reads, margin = await asyncio.to_thread(presence_gaps, valkey_cluster, ["ra", "rb"], 5.0)
    resumed = await eventually(lambda: traffic.ok_after(promoted_at), timeout=10, what="a call after the failover")
    print(
        f"FAILOVER kill->promotion {promoted_at - kill_time:.2f}s promotion->call {resumed - promoted_at:.2f}s "
        f"presence life left {margin:.2f}s"
    )
    assert reads > 10
    # what was left of the records' lives must cover the replicas' next presence round and then some
    assert margin >= PRESENCE_INTERVAL + 1.0, f"presence records had only {margin:.2f}s left after the failover"
    assert not gaps, f"presence records missing after the failover: {gaps[:5]}\n{a.log_tail(3000)}"
    # nobody presumed dead: both replicas' connection counts kept, the provider still listed
    with valkey_cluster.client(valkey_cluster.master_of(STORE_SLOT)) as node:
        counted = {k: node.hgetall(k) for k in node.keys("{sb}:conns:u:*")}
        assert node.sismember("{sb}:replicas", "ra")
        assert node.sismember("{sb}:replicas", "rb")
    assert any(set(fields) == {b"ra", b"rb"} for fields in counted.values()), counted
    assert f"{ws}/{cid}:svc" in {s["id"] for s in await caller.list_services()}
    # the hub's share, from the promotion (the standby answering ROLE master), and the whole, from the
    # kill: Valkey's own detection and election take cluster-node-timeout and then some (3.2-4.5 s at 2 s)
    assert resumed - promoted_at < 1.0, f"calls resumed {resumed - promoted_at:.2f}s after the promotion"
    node_timeout = valkey_cluster.node_timeout_ms / 1000
    assert resumed - kill_time < node_timeout + 6.0, f"calls resumed {resumed - kill_time:.2f}s after the kill"


@contextlib.asynccontextmanager
async def replication_cut(cluster: ValkeyCluster) -> AsyncIterator[int]:
    """While the block runs, the registry's standby receives nothing from its master (it cannot
    authenticate to it again); then it takes over, without what the block wrote: writes the old
    master acknowledged, lost for good. Yields the standby's port."""
    standby = await eventually(lambda: asyncio.to_thread(standby_of, cluster), timeout=10, what="a standby")

    def link_down() -> bool:
        with cluster.client(standby) as node:
            return node.info("replication").get("master_link_status") == "down"

    with cluster.client(standby) as node:
        node.config_set("masteruser", "nobody-at-all")
        node.config_set("masterauth", "wrong")
        node.execute_command("CLIENT", "KILL", "TYPE", "master")
    try:
        await eventually(lambda: asyncio.to_thread(link_down), timeout=10, what="the standby cut off")
        yield standby
        with cluster.client(standby) as node:
            node.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")  # promoted, without the writes

        async def standby_promoted() -> bool:
            return await asyncio.to_thread(cluster.master_of, STORE_SLOT) == standby

        await eventually(standby_promoted, timeout=10, what="the standby promoted")
    finally:
        with cluster.client(standby) as node:
            node.config_set("masteruser", "")
            node.config_set("masterauth", "")
    await asyncio.to_thread(cluster.wait_ok)


async def listed(client: Any, ws: str) -> set[str] | None:
    """The ids ``list_services`` answers ``client`` for ``ws``; ``None`` if it fails (a failover)."""
    with contextlib.suppress(Exception):
        return {s["id"] for s in await asyncio.wait_for(client.list_services({"workspace": ws}), 3)}
    return None


async def test_a_registration_the_promoted_replica_never_got_is_written_back(
    on_cluster, clients, valkey_cluster: ValkeyCluster
):
    """The registry's master acknowledged a registration its replica never received, and then the
    replica took over: the write is gone from the cluster, and the epoch key (older) survived, so
    nothing says "data lost". The replica holding the client sees the registry's shard change
    master and writes its registrations back, within a few seconds."""
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=valkey_cluster.seeds_url)
    provider = await clients(a.url, client_id="prov")
    await provider.register_service({"id": "kept", "config": {"visibility": "public"}, "f": lambda: "kept"})
    caller = await clients(b.url, client_id="caller", token=await provider.generate_token())
    ws = provider.config["workspace"]
    assert await (await caller.get_service(f"{ws}/prov:kept")).f() == "kept"

    async with replication_cut(valkey_cluster):
        await provider.register_service({"id": "late", "config": {"visibility": "public"}, "f": lambda: "late"})
        assert await (await caller.get_service(f"{ws}/prov:late")).f() == "late"  # acknowledged by the master
    loop = asyncio.get_running_loop()
    taken_over = loop.time()

    async def late_listed() -> bool:
        return f"{ws}/prov:late" in (await listed(caller, ws) or set())

    try:
        await eventually(late_listed, timeout=scaled(15), interval=0.1, what="'late' written back")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{a.log_tail(3000)}") from None
    took = loop.time() - taken_over
    print(f"WRITTEN BACK {took:.2f}s after the takeover")
    assert took < scaled(8), f"written back only {took:.1f}s after the takeover"
    assert await (await caller.get_service(f"{ws}/prov:late")).f() == "late"
    assert await (await caller.get_service(f"{ws}/prov:kept")).f() == "kept"


async def test_a_service_unregistered_before_the_takeover_is_not_listed_again(
    on_cluster, clients, valkey_cluster: ValkeyCluster
):
    """The master acknowledged an unregistration its replica never received, then the replica took
    over: the service is back in the registry although its provider, alive, no longer has it (and
    no reaper removes the services of a live client). The provider's replica compares what the
    registry lists for its clients with what they hold and removes the rest, within seconds."""
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=valkey_cluster.seeds_url)
    provider = await clients(a.url, client_id="prov")
    for name in ("kept", "gone"):
        await provider.register_service({"id": name, "config": {"visibility": "public"}, "f": lambda n=name: n})
    caller = await clients(b.url, client_id="caller", token=await provider.generate_token())
    ws = provider.config["workspace"]
    assert {f"{ws}/prov:kept", f"{ws}/prov:gone"} <= (await listed(caller, ws) or set())

    async with replication_cut(valkey_cluster):
        await provider.unregister_service("gone")
        assert f"{ws}/prov:gone" not in (await listed(caller, ws) or {f"{ws}/prov:gone"})  # the master's
    loop = asyncio.get_running_loop()
    taken_over = loop.time()

    async def gone_for_good() -> bool:
        ids = await listed(caller, ws)
        return ids is not None and f"{ws}/prov:kept" in ids and f"{ws}/prov:gone" not in ids

    try:
        await eventually(gone_for_good, timeout=scaled(15), interval=0.1, what="'gone' no longer listed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: listed {await listed(caller, ws)}\n{a.log_tail(3000)}") from None
    took = loop.time() - taken_over
    print(f"UNREGISTRATION UNDONE AGAIN {took:.2f}s after the takeover")
    assert took < scaled(10), f"removed only {took:.1f}s after the takeover"
    assert await (await caller.get_service(f"{ws}/prov:kept")).f() == "kept"


def registry_of(cluster: ValkeyCluster, wc: str, replica_id: str) -> dict[str, Any]:
    """What the registry's (new) master holds about client ``wc``, and ``replica_id``'s
    connection counts of its user and workspace."""
    ws, _, cid = wc.partition("/")
    with cluster.client(cluster.master_of(STORE_SLOT)) as node:
        return {
            "services": [f for f in node.hkeys(f"{{sb}}:svc:{ws}") if f.decode().startswith(f"{cid}:")],
            "index": node.hget(f"{{sb}}:svcidx:{ws}", cid),
            "owner": node.hget("{sb}:owner", wc),
            "holder": node.hget("{sb}:holder", wc),
            "owned": node.sismember(f"{{sb}}:replica:{replica_id}:clients", wc),
            "workspace count": node.hget(f"{{sb}}:conns:w:{ws}", replica_id),
        }


async def test_a_client_that_left_before_the_takeover_is_not_listed_again(
    on_cluster, clients, valkey_cluster: ValkeyCluster
):
    """A client left (a goodbye) while the registry's standby heard nothing, then the standby took
    over: the client's services, its owner and holder entries and its connection count are back,
    and since its replica is alive no reaper ever looks at it. Its replica finds that it owns a
    client it does not hold (not in transit either) and removes what is left of it."""
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=valkey_cluster.seeds_url)
    provider = await clients(a.url, client_id="prov")
    await provider.register_service({"id": "kept", "config": {"visibility": "public"}, "f": lambda: "kept"})
    token = await provider.generate_token()
    leaver = await clients(a.url, client_id="leaver", token=token)
    await leaver.register_service({"id": "left", "config": {"visibility": "public"}, "f": lambda: "left"})
    caller = await clients(b.url, client_id="caller", token=token)
    ws = provider.config["workspace"]
    assert f"{ws}/leaver:left" in (await listed(caller, ws) or set())

    async with replication_cut(valkey_cluster):
        await leaver.disconnect()

        async def left() -> bool:
            return f"{ws}/leaver:left" not in (await listed(caller, ws) or {f"{ws}/leaver:left"})

        await eventually(left, timeout=10, what="the departure, on the master")
    loop = asyncio.get_running_loop()
    taken_over = loop.time()

    async def gone_for_good() -> bool:
        ids = await listed(caller, ws)
        if ids is None or f"{ws}/prov:kept" not in ids or any(i.startswith(f"{ws}/leaver:") for i in ids):
            return False
        held = await asyncio.to_thread(registry_of, valkey_cluster, f"{ws}/leaver", "ra")
        return held == {
            "services": [],
            "index": None,
            "owner": None,
            "holder": None,
            "owned": False,
            "workspace count": b"1",
        }

    try:
        await eventually(gone_for_good, timeout=scaled(15), interval=0.1, what="the client gone")
    except AssertionError as exc:
        held = await asyncio.to_thread(registry_of, valkey_cluster, f"{ws}/leaver", "ra")
        raise AssertionError(f"{exc}: listed {await listed(caller, ws)}, registry {held}\n{a.log_tail(3000)}") from None
    took = loop.time() - taken_over
    print(f"DEPARTURE UNDONE AGAIN {took:.2f}s after the takeover")
    assert took < scaled(10), f"removed only {took:.1f}s after the takeover"
    assert await (await caller.get_service(f"{ws}/prov:kept")).f() == "kept"

"""What an operator sees of a cluster's shards: ``switchboard status`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis.asyncio as aredis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.exceptions import RedisError

from switchboard.backends.redis.bus.cluster_bus import ClusterBus
from switchboard.backends.redis.shared.cluster_setup import address_of, node_url, seed_urls
from switchboard.backends.redis.shared.topology import SlotMap, address_text, probe_channel
from switchboard.errors import BackendError


async def read_shards(url: str, replica_ids: list[str]) -> list[dict[str, Any]]:
    """Per master: its replicas, slots, and which replicas' pub/sub is wired there.

    A replica's pub/sub on a master is wired when that master counts a
    subscriber on the replica's probe channel for it (``PUBSUB SHARDNUMSUB``):
    read from the cluster itself, not from what the replica says of itself.
    """
    seeds = seed_urls(url)
    slot_map: SlotMap | None = None
    for seed in seeds:
        async with aredis.Redis.from_url(seed, protocol=2, socket_timeout=2.0) as node:
            try:
                slot_map = SlotMap.parse(await node.execute_command("CLUSTER", "SLOTS"))  # type: ignore[no-untyped-call]
                break
            except (RedisError, OSError):
                continue
    if slot_map is None:
        raise BackendError(f"no cluster node of {[address_of(s) for s in seeds]} answered CLUSTER SLOTS")
    shards = []
    for shard in slot_map.shards:
        channels = [probe_channel("sb:", rid, shard) for rid in replica_ids]
        wired: list[str] = []
        async with aredis.Redis.from_url(node_url(seeds[0], shard.master), protocol=2, socket_timeout=2.0) as node:
            try:
                raw = await node.execute_command("PUBSUB", "SHARDNUMSUB", *channels) if channels else []  # type: ignore[no-untyped-call]
                counts = dict(zip(raw[::2], raw[1::2], strict=True))
                wired = [rid for rid, ch in zip(replica_ids, channels, strict=True) if int(counts.get(ch.encode(), 0))]
                pubsub = f"{len(wired)}/{len(replica_ids)} replicas subscribed"
            except (RedisError, OSError) as exc:
                pubsub = f"unreachable: {exc}"
        shards.append(
            {
                "master": address_text(shard.master),
                "replicas": [address_text(r) for r in shard.replicas],
                "slots": shard.slot_count,
                "ranges": [f"{a}-{b}" for a, b in shard.slots],
                "pubsub": pubsub,
                "subscribed": wired,
            }
        )
    return shards


def render_shards(shards: list[dict[str, Any]]) -> str:
    rows = [("MASTER", "REPLICAS", "SLOTS", "PUB/SUB")]
    rows += [(s["master"], ",".join(s["replicas"]) or "-", str(s["slots"]), s["pubsub"]) for s in shards]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    covered = sum(s["slots"] for s in shards)
    lines.append(f"{len(shards)} shards; {covered} of 16384 slots covered")
    return "\n".join(lines)


class ShardCollector:
    """``/metrics`` per master of the cluster, as this replica's bus sees it."""

    def __init__(self, bus: ClusterBus) -> None:
        self.bus = bus

    def collect(self) -> Iterator[Metric]:
        labels = ["replica", "master"]
        report = self.bus.shard_report()
        rid = self.bus.replica_id
        gauges = {
            "healthy": ("1 while this replica's pub/sub connection to the master passes its probe.", "healthy"),
            "slots": ("Hash slots the master serves.", "slots"),
            "subscriptions_desired": ("Channels this replica wants on the master.", "desired"),
            "subscriptions_confirmed": ("Channels the master confirmed on the live connection.", "confirmed"),
        }
        for name, (doc, key) in gauges.items():
            g = GaugeMetricFamily(f"switchboard_shard_{name}", doc, labels=labels)
            for shard in report:
                g.add_metric([rid, shard["master"]], float(shard[key]))
            yield g
        counters = {
            "reconnects": "Pub/sub reconnections to the master.",
            "repairs": "Subscriptions re-wired on the master by the reconciler.",
            "probe_failures": "Delivery probes through the master that failed.",
        }
        for key, doc in counters.items():
            c = CounterMetricFamily(f"switchboard_shard_{key}", doc, labels=labels)
            for shard in report:
                c.add_metric([rid, shard["master"]], float(shard[key]))
            yield c
        refreshes = CounterMetricFamily(
            "switchboard_cluster_slot_map_refreshes", "Reads of the cluster's slot map.", labels=["replica"]
        )
        refreshes.add_metric([rid], float(self.bus.refreshes))
        yield refreshes

"""The event bus on a Redis/Valkey Cluster: sharded pub/sub, one connection per master.

A channel lives on the master serving its slot; ``SPUBLISH`` reaches only
that master's subscribers and returns their count exactly, so "0 receivers =
nobody" holds as on one instance. Each master gets its own
:class:`~switchboard.backends.redis.bus.bus.RedisBus` in sharded mode (its own
connection, reader, supervisor, reconciler and delivery probe, desired vs
confirmed per shard), so a dead master stalls no other shard. Never a
replica node: sharded messages are read where they are published.

The slot map is read again on every hint that it changed (a MOVED reply, an
unsolicited ``sunsubscribe`` after a slot migration, a lost pub/sub
connection) and on a timer; channels whose master changed are moved
(:func:`~switchboard.backends.redis.shared.topology.moves`). redis-py's own
``ClusterPubSub`` is not used: it does not heal after a failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import fields
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import RedisError

from switchboard.backends.base import BusHandler
from switchboard.backends.redis.bus.bus import BusStats, RedisBus
from switchboard.backends.redis.bus.cluster_health import ShardHealth, cluster_readiness
from switchboard.backends.redis.shared.cluster_setup import CLUSTER_KEY_PREFIX
from switchboard.backends.redis.shared.topology import (
    Address,
    SlotMap,
    address_text,
    channel_slot,
    moves,
    plan_shards,
    slot_map_sources,
)
from switchboard.clock import Clock
from switchboard.errors import BackendError
from switchboard.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

REFRESH_INTERVAL = 5.0  # seconds between slot map reads while all is well
REFRESH_UNHEALTHY = 0.1  # ... and while a shard is down or slots are uncovered (a failover: follow it within 0.1 s)


class ClusterBus:
    """:class:`~switchboard.backends.base.EventBus` over a cluster's sharded pub/sub.

    ``cluster`` (a ``RedisCluster`` client, left open) publishes and follows
    MOVED on its own; ``node_url(addr)`` gives the URL of one node (the seeds'
    credentials and scheme) for its pub/sub connection and probe publisher.
    """

    def __init__(
        self,
        cluster: Any,
        *,
        node_url: Any,
        seeds: list[Address],
        clock: Clock,
        replica_id: str,
        reconcile_interval: float | None = 5.0,
        refresh_interval: float = REFRESH_INTERVAL,
        store_key: str = CLUSTER_KEY_PREFIX,
        **shard_options: Any,
    ) -> None:
        self.replica_id = replica_id
        self._store_slot = channel_slot(store_key)  # the registry's, presence's and lease's slot
        self._cluster = cluster
        self._node_url = node_url
        self._seeds = list(seeds)
        self._clock = clock
        self._reconcile_interval = reconcile_interval
        self._refresh_interval = refresh_interval
        self._shard_options = shard_options
        self.slot_map: SlotMap | None = None
        self.shards: dict[Address, RedisBus] = {}
        self._wanted: set[str] = set()
        self._handler: BusHandler | None = None  # handed to every shard's bus
        self._placement: dict[str, Address | None] = {}
        self._retired = BusStats()  # counters of shards gone (a failed master), kept for metrics
        self._hint = asyncio.Event()
        self._hint_reason = ""
        self._refreshes = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._extra = {"replica": replica_id}

    # -- EventBus -----------------------------------------------------------

    async def start(self, wait: float | None = 5.0) -> bool:
        if self._task is not None or self._closed:
            return self.health[0]
        with contextlib.suppress(RedisError, OSError):
            # Now, while the seeds answer: the command client learns every node, so it can
            # still find the cluster after the one seed named dies.
            await self._cluster.initialize()
        with contextlib.suppress(BackendError):
            await self.refresh()
        deadline = self._clock.monotonic() + (wait or 0)
        while (
            self.slot_map is not None
            and not self._closed
            and not self.all_shards_healthy
            and self._clock.monotonic() < deadline
        ):
            await self._clock.sleep(0.05)  # the shard buses confirming their probes
        if not self._closed:  # closed while starting: no loop to leave behind
            self._task = asyncio.create_task(self._refresh_loop(), name="switchboard-cluster-bus-refresh")
        return self.health[0]

    async def publish(self, channel: str, data: bytes) -> int:
        """SPUBLISH through the cluster client (it follows MOVED); the count is exact (0 = nobody)."""
        try:
            receivers = int(await self._cluster.spublish(channel, data))
        except (RedisError, OSError) as exc:
            self.hint(f"publish failed: {exc!r}")
            raise BackendError(f"publish to {channel!r} failed: {exc}") from exc
        if receivers == 0:
            self._retired.publishes_to_nobody += 1
        return receivers

    def listen(self, handler: BusHandler) -> None:
        """``handler(channel, data)``, whichever master's bus the channel is on."""
        self._handler = handler
        for shard in self.shards.values():
            shard.listen(handler)

    async def subscribe(self, channel: str) -> None:
        if self._closed:
            raise BackendError("bus is closed")
        self._wanted.add(channel)
        target = self.slot_map.master_of(channel) if self.slot_map else None
        shard = self.shards.get(target) if target else None
        # Unplaced (None) until its master has a bus: the next refresh's moves() places it.
        self._placement[channel] = target if shard is not None else None
        if shard is not None:
            await shard.subscribe(channel)  # never raises for an unconfirmed subscribe
        else:
            self.hint(f"{channel!r} has no master's bus yet")

    async def unsubscribe(self, channel: str) -> None:
        self._wanted.discard(channel)
        where = self._placement.pop(channel, None)
        shard = self.shards.get(where) if where else None
        if shard is not None:
            await shard.unsubscribe(channel)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            await cancel_and_wait([self._task])
        shards, self.shards = list(self.shards.values()), {}
        await asyncio.gather(*(s.close() for s in shards), return_exceptions=True)

    # -- health and metrics -------------------------------------------------

    @property
    def health(self) -> tuple[bool, str]:
        """Ready unless what this replica cannot serve without is down (:func:`cluster_readiness`)."""
        if self._closed:
            return False, "closed"
        if self.slot_map is None:
            return False, f"cluster slot map not read yet: {self._hint_reason or 'starting'}"
        store = self.store_master
        shards = [
            ShardHealth(addr, *shard.health, holds_store=addr == store) for addr, shard in sorted(self.shards.items())
        ]
        unplaced = sum(1 for c in self._wanted if self._placement.get(c) not in self.shards)
        return cluster_readiness(
            slot_map_read=True,
            store_served=store is not None,
            covered=self.slot_map.covered,
            shards=shards,
            unplaced=unplaced,
        )

    @property
    def all_shards_healthy(self) -> bool:
        """Every master's pub/sub confirmed (stricter than :attr:`health`: the refresh pace follows it)."""
        return self.health[0] and all(shard.health[0] for shard in self.shards.values())

    @property
    def store_master(self) -> Address | None:
        """The master serving the registry's slot, as last read (it changes on a failover)."""
        return self.slot_map.master_of_slot(self._store_slot) if self.slot_map else None

    @property
    def stats(self) -> BusStats:
        total = BusStats(**{f.name: getattr(self._retired, f.name) for f in fields(BusStats)})
        for shard in self.shards.values():
            for f in fields(BusStats):
                setattr(total, f.name, getattr(total, f.name) + getattr(shard.stats, f.name))
        return total

    @property
    def subscriptions(self) -> tuple[int, int]:
        pairs = [s.subscriptions for s in self.shards.values()]
        return sum(d for d, _ in pairs), sum(c for _, c in pairs)

    def shard_report(self) -> list[dict[str, Any]]:
        """Per master: address, replicas, slots, pub/sub health and counters (status and metrics)."""
        report = []
        for shard_info in self.slot_map.shards if self.slot_map else ():
            bus = self.shards.get(shard_info.master)
            ok, why = bus.health if bus else (False, "no pub/sub connection")
            stats = bus.stats if bus else BusStats()
            report.append(
                {
                    "master": address_text(shard_info.master),
                    "replicas": [address_text(r) for r in shard_info.replicas],
                    "slots": shard_info.slot_count,
                    "pubsub": "ok" if ok else f"down: {why}",
                    "healthy": ok,
                    "desired": stats.desired,
                    "confirmed": stats.confirmed,
                    "reconnects": stats.reconnects,
                    "repairs": stats.repairs,
                    "probe_failures": stats.probe_failures,
                }
            )
        return report

    @property
    def refreshes(self) -> int:
        return self._refreshes

    def is_confirmed(self, channel: str) -> bool:
        where = self._placement.get(channel)
        shard = self.shards.get(where) if where else None
        return shard is not None and shard.is_confirmed(channel)

    # -- the slot map -------------------------------------------------------

    def hint(self, reason: str) -> None:
        """Something suggests the slot map changed: refresh it soon."""
        if not self._hint.is_set():
            self._hint_reason = reason
            self._hint.set()

    async def _read_slot_map(self) -> SlotMap:
        """``CLUSTER SLOTS`` from the first node that answers: the replicas of a master whose pub/sub is
        down first (the one promoted knows it at once; the others learn it by gossip, later), then
        the known masters, then the seeds."""
        down = {addr for addr, shard in self.shards.items() if not shard.health[0]}
        candidates = slot_map_sources(self.slot_map, down, self._seeds)
        errors = []
        for addr in candidates:
            client = aredis.Redis.from_url(
                self._node_url(addr), protocol=2, socket_timeout=1.0, socket_connect_timeout=1.0
            )
            try:
                raw = await client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
                slot_map = SlotMap.parse(raw)
                if slot_map.shards:
                    self._seeds = list(dict.fromkeys([*self._seeds, *slot_map.masters]))
                    return slot_map
            except (RedisError, OSError) as exc:
                errors.append(f"{address_text(addr)}: {exc}")
            finally:
                await client.aclose()
        raise BackendError(f"no cluster node answered CLUSTER SLOTS: {'; '.join(errors) or 'no nodes known'}")

    async def node_timeout(self) -> float | None:
        """The cluster's ``cluster-node-timeout`` in seconds, from the registry's master (or a seed);
        ``None`` where ``CONFIG GET`` is refused (managed offerings) or nobody answers."""
        addr = self.store_master or (self._seeds[0] if self._seeds else None)
        if addr is None:
            return None
        client = aredis.Redis.from_url(self._node_url(addr), protocol=2, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            reply = await client.execute_command("CONFIG", "GET", "cluster-node-timeout")  # type: ignore[no-untyped-call]
            values = dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else dict(reply)
            raw = values.get(b"cluster-node-timeout", values.get("cluster-node-timeout"))
            return int(raw) / 1000 if raw is not None else None
        except (RedisError, OSError, ValueError) as exc:
            logger.info("cluster-node-timeout not readable from %s: %s", address_text(addr), exc, extra=self._extra)
            return None
        finally:
            await client.aclose()

    async def refresh(self) -> int:
        """Read the slot map and follow it: shard buses for new masters, channels moved; return moves."""
        async with self._lock:
            slot_map = await self._read_slot_map()
            self._refreshes += 1
            changed = slot_map != self.slot_map
            self.slot_map = slot_map
            if changed:
                logger.info(
                    "cluster slot map: %s",
                    ", ".join(f"{address_text(s.master)}={s.slot_count}" for s in slot_map.shards),
                    extra=self._extra,
                )
            await self._follow_masters(slot_map)
            todo = moves(self._placement, slot_map)
            for channel, _, target in todo:
                self._placement[channel] = target
            await asyncio.gather(*(self._move(channel, source, target) for channel, source, target in todo))
            if todo:
                logger.info("moved %d channel(s) to their new master", len(todo), extra=self._extra)
            return len(todo)

    async def _follow_masters(self, slot_map: SlotMap) -> None:
        """A shard bus per master serving slots; a bus whose probe slot moved away is replaced."""
        drop, start = plan_shards({a: b.probe_channel for a, b in self.shards.items()}, slot_map, self.replica_id)
        for addr in drop:
            bus = self.shards.pop(addr)
            for f in fields(BusStats):
                if f.name not in ("desired", "confirmed"):
                    setattr(self._retired, f.name, getattr(self._retired, f.name) + getattr(bus.stats, f.name))
            for channel, where in self._placement.items():
                if where == addr:
                    self._placement[channel] = None  # placed again by the caller's moves()
            await bus.close()
        for addr, probe in start.items():
            if self._closed:
                return  # close() ran during an await above; a bus started now would have no owner
            self.shards[addr] = bus = self._shard_bus(addr, probe)  # close() from here on closes it
            await bus.start(wait=0)

    def _shard_bus(self, addr: Address, probe: str) -> RedisBus:
        bus = RedisBus(
            self._node_url(addr),
            clock=self._clock,
            replica_id=self.replica_id,
            reconcile_interval=self._reconcile_interval,
            sharded=True,
            probe_channel=probe,
            on_hint=self.hint,
            **self._shard_options,
        )
        if self._handler is not None:
            bus.listen(self._handler)
        return bus

    async def _move(self, channel: str, source: Address | None, target: Address) -> None:
        old = self.shards.get(source) if source else None
        new = self.shards.get(target)
        if channel in self._wanted and new is not None and self._placement.get(channel) == target:
            await new.subscribe(channel)  # first: the old master serves the slot no more
        if old is not None and old.is_confirmed(channel):
            with contextlib.suppress(BackendError):
                await old.unsubscribe(channel)
        elif old is not None:
            old.forget(channel)  # the server dropped it already (a moved slot), or the master is dead

    async def _refresh_loop(self) -> None:
        while not self._closed:
            interval = self._refresh_interval if self.all_shards_healthy else REFRESH_UNHEALTHY
            hinted = asyncio.create_task(self._hint.wait())
            timer = asyncio.create_task(self._clock.sleep(interval))
            try:
                await asyncio.wait({hinted, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_and_wait([hinted, timer])
            self._hint.clear()
            try:
                await self.refresh()
            except BackendError as exc:
                logger.warning("cluster slot map refresh failed: %s", exc, extra=self._extra)
            except Exception:
                logger.exception("cluster slot map refresh failed", extra=self._extra)

    def __repr__(self) -> str:
        ok, reason = self.health
        return f"ClusterBus(replica={self.replica_id!r}, shards={len(self.shards)}, ready={ok}, {reason!r})"

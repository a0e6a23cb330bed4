"""What a replica does because it has peers.

* **Presence**: every few seconds each replica writes a short-lived hash
  ``sb:presence:<replica>`` (address, clients, subscription health). A
  replica whose key expired is gone; ``switchboard status`` reads these.
* **Leadership**: one replica at a time holds the ``sb:leader`` lease and runs
  the singleton work: the orphan reaper.
* **Reaper**: clients registered through a replica that is gone are probed
  pass after pass and reaped only after several failures in a row.
* **Re-assertion**: when Redis comes back empty (restart without
  persistence, failover to a fresh instance), each replica writes back the
  registrations of its live clients; the bus re-wires its own subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.exceptions import RedisError

from switchboard.backends.redis import RedisBus, RedisRegistry
from switchboard.backends.redis.lease import LeaderElector, LeasePolicy, RedisLease
from switchboard.backends.redis.reaper import OrphanReaper, ReaperPolicy
from switchboard.errors import BackendError
from switchboard.tasks import cancel_and_wait

if TYPE_CHECKING:
    import redis.asyncio as aredis

    from switchboard.hub.hub import Hub

log = logging.getLogger(__name__)

PRESENCE_PREFIX = "sb:presence:"
LEADER_KEY = "sb:leader"
REPLICAS_KEY = "sb:replicas"  # every replica that announced itself, until the leader forgets it
PRESENCE_INTERVAL = 2.0  # seconds between presence writes and registry epoch checks
PRESENCE_TTL = 6.0  # three missed writes and a replica counts as gone


class Cluster:
    """Presence, leadership, reaping and recovery for one replica."""

    def __init__(self, hub: Hub, *, registry: RedisRegistry, bus: RedisBus, redis: aredis.Redis) -> None:
        self.hub = hub
        self.registry = registry
        self.bus = bus
        self.redis = redis
        s = hub.settings
        self.started_at = time.time()
        self.lease = RedisLease(
            redis,
            policy=LeasePolicy(key=LEADER_KEY, ttl=s.leader_lease_ttl, renew_every=s.leader_lease_ttl / 3),
            owner_id=f"{hub.replica_id}#{int(self.started_at * 1000)}",
            clock=hub.clock,
        )
        self.elector = LeaderElector(self.lease)
        self.reaper = OrphanReaper(
            policy=ReaperPolicy(
                interval=s.orphan_reap_interval,
                first_pass_delay=min(5.0, s.orphan_reap_interval),
                min_failures=s.orphan_reap_min_failures,
                probe_timeout=min(5.0, s.orphan_reap_interval),
            ),
            clock=hub.clock,
            list_candidates=self._candidates,
            probe=self._probe,
            reap=self._reap,
            is_leader=lambda: self.elector.is_leader,
        )
        self._owners: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.reaped = 0
        self.reasserted = 0
        self._stopping = False
        self.log = logging.LoggerAdapter(log, {"replica": hub.replica_id})
        hub.metrics.registry.register(_ClusterCollector(self))

    async def start(self) -> None:
        with contextlib.suppress(RedisError, BackendError, OSError):
            await self.registry.check_reset()  # remember the epoch now, to notice a loss later
        with contextlib.suppress(RedisError, BackendError, OSError):
            await self._write_presence()
        for name, coro in (
            ("presence", self._presence_loop()),
            ("leader", self.elector.run()),
            ("reaper", self.reaper.run()),
        ):
            self._tasks.append(asyncio.create_task(coro, name=f"{self.hub.replica_id} {name}"))

    async def stop(self) -> None:
        """Leave cleanly: give up the lease and remove only this replica's own keys."""
        self._stopping = True
        await cancel_and_wait(self._tasks)
        with contextlib.suppress(RedisError, BackendError, OSError, TimeoutError):
            async with asyncio.timeout(2):
                await self.elector.resign()
                await self.registry.remove_replica_state(self.hub.replica_id)
                await self.redis.delete(PRESENCE_PREFIX + self.hub.replica_id)
                await self.redis.srem(REPLICAS_KEY, self.hub.replica_id)

    # -- presence and recovery ---------------------------------------------

    async def _presence_loop(self) -> None:
        while not self._stopping:  # also ends the loop if redis-py swallowed its cancel
            await self.hub.clock.sleep(PRESENCE_INTERVAL)
            try:
                await self._write_presence()
                if await self.registry.check_reset():
                    await self._reassert()
                elif repaired := await self.hub.repair_registry():
                    self.reasserted += repaired
                    self.log.info("re-wrote %d registrations deferred by a Redis outage", repaired)
                if self.elector.is_leader:
                    await self._forget_dead_replicas()
                    await self.hub.sweep_transits()
            except (RedisError, BackendError, OSError) as exc:
                self.log.warning("presence update failed: %s", exc)

    async def _write_presence(self) -> None:
        stats = self.bus.stats
        healthy, reason = self.bus.health
        key = PRESENCE_PREFIX + self.hub.replica_id
        fields = {
            "id": self.hub.replica_id,
            "address": self.hub.settings.public_base_url,
            "started": f"{self.started_at:.3f}",
            "seen": f"{time.time():.3f}",
            "clients": len(self.hub.peers),
            "desired": stats.desired,
            "confirmed": stats.confirmed,
            "bus": "ok" if healthy else f"down: {reason}",
            "leader": int(self.elector.is_leader),
            # running totals, for the rates the web console draws (server/status_api.py)
            **{name: value for name, value in self.hub.metrics.totals().items()},
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.pexpire(key, int(PRESENCE_TTL * 1000))
            pipe.sadd(REPLICAS_KEY, self.hub.replica_id)
            await pipe.execute()

    async def _reassert(self) -> None:
        infos = [info for peer in list(self.hub.peers.values()) for info in peer.services.values()]
        count = await self.registry.reassert(infos)
        self.reasserted += count
        self.log.warning("Redis lost its data: re-asserted %d registrations of %d clients", count, len(self.hub.peers))

    async def known_and_live(self) -> tuple[set[str], set[str]]:
        """Replicas that ever announced themselves, and those whose presence is current.

        One set read and one pipelined EXISTS per replica: no keyspace scan,
        so the cost does not grow with the number of clients.
        """
        known = {m.decode() for m in await self.redis.smembers(REPLICAS_KEY)}
        async with self.redis.pipeline(transaction=False) as pipe:
            for replica in sorted(known):
                pipe.exists(PRESENCE_PREFIX + replica)
            alive = await pipe.execute()
        return known, {r for r, up in zip(sorted(known), alive, strict=True) if up}

    async def live_replicas(self) -> set[str]:
        return (await self.known_and_live())[1]

    async def _forget_dead_replicas(self) -> None:
        """The leader drops what replicas that died without a goodbye still count."""
        known, live = await self.known_and_live()
        for dead in known - live:
            forget = getattr(self.hub.counts, "forget_replica", None)
            if forget is not None:
                await forget(dead)
            await self.redis.srem(REPLICAS_KEY, dead)

    # -- the reaper's three callbacks --------------------------------------

    async def _candidates(self) -> set[str]:
        """Clients whose owning replica no longer shows presence."""
        owners = await self.registry.owners()
        live = await self.live_replicas()
        self._owners = {client: owner for client, owner in owners.items() if owner not in live}
        return set(self._owners)

    async def _probe(self, client: str) -> bool:
        return await self.hub.manager.answers_ping(client, timeout=self.reaper.policy.probe_timeout)

    async def _reap(self, client: str) -> None:
        ws, _, cid = client.partition("/")
        if await self.hub.purge(ws, cid, owner=self._owners.get(client)):
            self.reaped += 1


class _ClusterCollector:
    """Reads the bus, lease and reaper counters at scrape time (no per-message work)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        c = self.cluster
        replica = c.hub.replica_id
        stats = c.bus.stats
        healthy, _ = c.bus.health

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["replica"])
            g.add_metric([replica], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=["replica"])
            m.add_metric([replica], value)
            return m

        yield gauge("switchboard_subscriptions_desired", "Pub/sub channels this replica wants.", stats.desired)
        yield gauge(
            "switchboard_subscriptions_confirmed",
            "Pub/sub channels Redis confirmed on the live connection.",
            stats.confirmed,
        )
        yield gauge(
            "switchboard_bus_healthy", "1 while the pub/sub connection passes its delivery probe.", int(healthy)
        )
        yield gauge("switchboard_is_leader", "1 on the replica holding the leader lease.", int(c.elector.is_leader))
        yield gauge(
            "switchboard_reaper_suspects", "Clients that failed at least one probe in a row.", len(c.reaper.ledger)
        )
        yield counter("switchboard_subscription_repairs", "Subscriptions re-wired by the reconciler.", stats.repairs)
        yield counter(
            "switchboard_bus_publishes_to_nobody", "Publishes no replica received.", stats.publishes_to_nobody
        )
        yield counter("switchboard_redis_reconnects", "Pub/sub reconnections.", stats.reconnects)
        yield counter("switchboard_reaped_clients", "Clients whose registrations the reaper removed.", c.reaped)
        yield counter(
            "switchboard_reasserted_registrations", "Registrations re-written after Redis lost its data.", c.reasserted
        )
        links = stats.links
        if links is not None:
            yield counter(
                "switchboard_link_frames_sent",
                "Frames sent straight to another replica instead of through Redis.",
                links.direct,
            )
            yield counter(
                "switchboard_link_frames_received",
                "Frames another replica sent straight here and a client got.",
                links.received,
            )
            yield counter(
                "switchboard_link_frames_returned",
                "Frames sent back because their client had left this replica.",
                links.nacked,
            )
            yield counter(
                "switchboard_link_frames_replayed",
                "Frames a lost link left unacked, sent again through Redis.",
                links.replayed,
            )
            yield counter(
                "switchboard_link_frames_not_replayed",
                "Unacked frames of a lost link not sent again: calls whose reply had come back.",
                links.not_replayed,
            )
            yield counter(
                "switchboard_link_dial_failures",
                "Links to other replicas that could not be opened.",
                links.dial_failures,
            )
            yield counter(
                "switchboard_link_refused", "Incoming links refused for a bad or missing signature.", links.refused
            )

    def describe(self) -> list[Any]:
        return []

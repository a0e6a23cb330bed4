"""What a replica does because it has peers: presence, leadership, reaping and recovery.

* **Presence**: every :data:`PRESENCE_INTERVAL` seconds each replica rewrites
  a short-lived record (address, clients, subscription health, totals); a
  replica whose record expired is gone; ``switchboard status`` reads them.
  The record and the lease are kept on a thread of their own
  (:mod:`.liveness`), while the serving loop turns: a starved loop costs
  neither.
* **Leadership**: one replica at a time holds the leader lease
  (:mod:`.lease`) and runs the singleton work: the orphan reaper, forgetting
  dead replicas' connection counts, ending transit graces.
* **Reaper** (:mod:`.reaper`): clients registered through a replica that is
  gone are probed pass after pass and reaped only after several failures.
* **Re-assertion**: when the store comes back empty (a restart without
  persistence), each replica writes back its live clients' registrations;
  the bus re-wires its own subscriptions. On a cluster, also when the
  registry's shard changed master (a failover): the promoted replica may
  lack writes the dead master acknowledged, and the epoch key it kept
  cannot tell. Deletes it lacks come back too: :mod:`.lost_deletes` then
  removes what the registry holds of this replica's clients and they do not.

Every store call here raises :class:`BackendError` at worst (the backends
translate their own errors), so a store outage costs a logged warning and a
retry at the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from switchboard.config import Settings
from switchboard.errors import BackendError
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.peer_versions import FIELD as READS_FIELD
from switchboard.replicas.upkeep.lease import LeaderElector, Lease, LeasePolicy
from switchboard.replicas.upkeep.liveness import BEAT_EVERY, LivenessThread, LoopBeat, loop_alive
from switchboard.replicas.upkeep.lost_deletes import LostDeletes, StaleStore
from switchboard.replicas.upkeep.reaper import OrphanReaper, ReaperPolicy
from switchboard.replicas.upkeep.served import Bus, Served
from switchboard.replicas.upkeep.stores import OwnedRegistry, PresenceStore, ReplicaCounts
from switchboard.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

PRESENCE_INTERVAL = 2.0  # seconds between presence writes and registry epoch checks
PRESENCE_TTL = 6.0  # three missed writes and a replica counts as gone (one instance; see presence_ttl)
FAILOVER_SLACK = 2.0  # seconds of a cluster failover beyond 2 x cluster-node-timeout: election delay, gossip
# after a data loss, lookups answer "retry" until every replica had its chance to re-assert:
# each checks every PRESENCE_INTERVAL, plus a second for a round slowed by the outage
SETTLE = PRESENCE_INTERVAL + 1.0
# seconds between looks at the bus while waiting for the next round: once Redis answers again (the
# bus re-wired after an outage) the round runs at once, so what Redis lost is re-written within
# a few hundredths of a second and lookups stop answering "retry" (the settling set empties)
BACK_WATCH = 0.05


def presence_ttl(node_timeout: float | None, *, interval: float = PRESENCE_INTERVAL) -> float:
    """How long a presence record lives: on a cluster (``node_timeout``: its ``cluster-node-timeout``
    in seconds), long enough to outlast a failover of the registry's shard.

    While that shard fails over no replica can write presence: the record written last (up to
    ``interval`` before the master died) must survive the failover and the replica's next round
    after the promotion (``interval`` more), with a second to spare for a round slowed by the
    outage. A failover takes ``node_timeout`` to detect, then an election: its delay (0.5-1 s,
    more for a lower-ranked replica) and a vote, retried after ``2 * node_timeout`` if it fails;
    :data:`FAILOVER_SLACK` covers what does not scale with the timeout (measured 3.7-4.7 s at
    2 s). Shorter, every replica would be presumed dead by the leader at once (its connection
    counts forgotten, its clients probed for reaping).
    """
    if node_timeout is None:
        return PRESENCE_TTL
    return max(PRESENCE_TTL, 2 * node_timeout + FAILOVER_SLACK + 2 * interval + 1.0)


def store_failed_over(seen: Hashable | None, current: Hashable | None) -> bool:
    """Whether the registry's shard changed master since ``seen`` (``None``: unknown, never a change)."""
    return seen is not None and current is not None and current != seen


def lease_policy(settings: Settings, key: str) -> LeasePolicy:
    """The leader lease of ``settings``: renewed every third of its TTL."""
    return LeasePolicy(key=key, ttl=settings.leader_lease_ttl, renew_every=settings.leader_lease_ttl / 3)


class Cluster:
    """Presence, leadership, reaping and recovery for one replica (the hub's `cluster`, started and stopped with it)."""

    def __init__(
        self,
        hub: Served,
        *,
        registry: OwnedRegistry,
        bus: Bus,
        presence: PresenceStore,
        lease: Lease,
        policy: LeasePolicy,
        counts: ReplicaCounts,
        node_timeout: Callable[[], Awaitable[float | None]] | None = None,
        store_master: Callable[[], Hashable | None] | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
        stale: StaleStore | None = None,
        liveness: LivenessThread | None = None,
        versions: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        """``node_timeout`` (a cluster): reads the cluster's ``cluster-node-timeout`` in seconds,
        ``None`` if refused; ``store_master`` (a cluster): the registry's shard's master now;
        ``close`` frees what the lease and the presence record use (connections of their own),
        last on :meth:`stop`; ``stale``: the registry's side of undoing deletes a failover lost;
        ``liveness``: the thread the lease and the presence record are kept on (then ``lease``,
        ``presence.write`` and ``close`` are only ever run there), else the serving loop;
        ``versions``: given the live replicas' presence records every round, for the wire
        version each reads (``protocol/link/peer_versions.py``)."""
        self.hub = hub
        self._close = close
        self._versions = versions
        self.registry = registry
        self.bus = bus
        self.presence = presence
        self.counts = counts
        s = hub.settings
        self.started_at = time.time()
        self._liveness = liveness
        self.beat = LoopBeat(hub.clock)
        self.elector = LeaderElector(
            lease, policy=policy, clock=hub.clock, loop_tick=(lambda: self.beat.last) if liveness else None
        )
        self._fields: dict[str, Any] = {}  # the presence record as the serving loop last saw it
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
        self._node_timeout = node_timeout
        self._store_master = store_master
        self._seen_master: Hashable | None = None  # read at start: the bus has its slot map by then
        self.presence_ttl = PRESENCE_TTL
        self._tasks: list[asyncio.Task[None]] = []
        self.log = logging.LoggerAdapter(logger, {"replica": hub.replica_id})
        self.lost_deletes = LostDeletes(stale, hub, reassert=self._write_back, log=self.log) if stale else None
        self.reaped = 0
        self.reasserted = 0
        self._stopping = False
        # the replicas seen alive in the last round: after a loss, lookups wait for them to re-assert
        self._peers_seen: set[str] | None = None

    async def start(self) -> None:
        self._seen_master = self._store_master() if self._store_master else None
        await self.learn_presence_ttl()
        with contextlib.suppress(BackendError, OSError):
            await self.registry.check_reset()  # remember the epoch now, to notice a loss later
        self._fields = self._record()
        liveness = self._liveness
        if liveness is not None:
            liveness.start()
            with contextlib.suppress(BackendError, OSError, TimeoutError):
                await liveness.call(self._write_presence(), timeout=5)
            await liveness.spawn(self._presence_loop(), f"{self.hub.replica_id} presence")
            await liveness.spawn(self.elector.run(), f"{self.hub.replica_id} leader")
            loops = [("beat", self._beat_loop())]
        else:
            with contextlib.suppress(BackendError, OSError):
                await self._write_presence()
            loops = [("presence", self._presence_loop()), ("leader", self.elector.run())]
        for name, coro in [*loops, ("upkeep", self._upkeep_loop()), ("reaper", self.reaper.run())]:
            self._tasks.append(asyncio.create_task(coro, name=f"{self.hub.replica_id} {name}"))

    async def learn_presence_ttl(self) -> float:
        """On a cluster: the presence TTL that outlasts its failover (:func:`presence_ttl`), from its
        ``cluster-node-timeout``, or ``--redis-cluster-node-timeout`` if the cluster will not say."""
        if self._node_timeout is not None:
            read = None
            with contextlib.suppress(BackendError, OSError):
                read = await self._node_timeout()
            timeout = read if read is not None else self.hub.settings.redis_cluster_node_timeout
            self.presence_ttl = presence_ttl(timeout)
            self.log.info(
                "presence records live %.1fs: cluster-node-timeout %.1fs (%s)",
                self.presence_ttl,
                timeout,
                "read from the cluster" if read is not None else "--redis-cluster-node-timeout",
            )
        return self.presence_ttl

    async def stop(self) -> None:
        """Leave cleanly: give up the lease and remove only this replica's own keys."""
        self._stopping = True
        await cancel_and_wait(self._tasks)
        liveness = self._liveness
        with contextlib.suppress(BackendError, OSError, TimeoutError):
            async with asyncio.timeout(2):
                if liveness is not None:
                    await liveness.cancel_tasks()
                    await liveness.call(self.elector.resign(), timeout=2)
                else:
                    await self.elector.resign()
                await self.registry.remove_replica_state(self.hub.replica_id)
                await self.presence.remove()
        if (close := self._close) is not None:

            async def closing() -> None:
                await close()

            with contextlib.suppress(Exception):  # whatever the store raises, the shutdown goes on
                await (liveness.call(closing(), timeout=2) if liveness is not None else closing())
        if liveness is not None:
            await liveness.stop()

    # -- presence and recovery ---------------------------------------------

    async def _presence_loop(self) -> None:
        """The presence record alone, on its own deadline: the upkeep's commands share the
        command pool with the clients' and may wait seconds there, the record must not (a
        replica whose record expired counts as gone, its clients are reaped). On the liveness
        thread, it is rewritten only while the serving loop turns."""
        clock = self.hub.clock
        while not self._stopping:  # also ends the loop if redis-py swallowed its cancel
            await clock.sleep(PRESENCE_INTERVAL)
            if self._liveness is not None and not loop_alive(clock.monotonic(), self.beat.last):
                continue  # a hung loop: the record lapses, and the others count this replica gone
            if self._liveness is None:
                self._fields = self._record()
            try:
                await self._write_presence()
            except (BackendError, OSError) as exc:
                self.log.warning("presence update failed: %s", exc)

    async def _beat_loop(self) -> None:
        """On the serving loop: tick its heartbeat, and refresh what the presence record says."""
        clock = self.hub.clock
        while not self._stopping:
            self.beat.tick()
            try:
                self._fields = self._record()
            except Exception:  # a bug must not stop the heartbeat, nor the record's renewal
                self.log.exception("presence record not refreshed")
            await clock.sleep(min(BEAT_EVERY, PRESENCE_INTERVAL))

    async def _upkeep_loop(self) -> None:
        while not self._stopping:
            await self._next_round()
            try:
                await self.upkeep()
            except (BackendError, OSError) as exc:
                self.log.warning("cluster upkeep failed: %s", exc)
            except Exception:  # a bug must not end recovery for good
                self.log.exception("cluster upkeep failed")

    async def _next_round(self) -> None:
        """Wait :data:`PRESENCE_INTERVAL`, or less: until the bus is back after an outage (see :data:`BACK_WATCH`)."""
        was_down = not self.bus.health[0]
        for _ in range(int(PRESENCE_INTERVAL / BACK_WATCH)):
            await self.hub.clock.sleep(BACK_WATCH)
            healthy = self.bus.health[0]
            if was_down and healthy:
                return
            was_down = was_down or not healthy

    async def tend(self) -> None:
        """One round: presence, recovery, and the leader's chores."""
        self._fields = self._record()
        await self._write_presence()
        await self.upkeep()

    async def upkeep(self) -> None:
        """Recovery and the leader's chores (the presence record has a loop of its own)."""
        master = self._store_master() if self._store_master else None
        if await self.registry.check_reset(settle=SETTLE, expect=self._peers_seen):
            await self._reassert("Redis lost its data")
            await self.registry.settled()
        elif store_failed_over(self._seen_master, master):
            await self._reassert("the registry's shard changed master (what the old one acknowledged may be lost)")
        elif repair := await self.hub.repair_registry():
            repaired = await self.registry.reassert(repair)
            self.reasserted += repaired
            self.log.info("re-wrote %d registrations deferred by a Redis outage", repaired)
        self._seen_master = master or self._seen_master  # only once re-asserted: a failed round retries
        if self.elector.is_leader:
            await self._forget_dead_replicas()
            await self.hub.sweep_transits()
        if self.lost_deletes is not None:
            await self.lost_deletes.look()
        if self._versions is None:
            self._peers_seen = await self.live_replicas()
        else:  # one read for both: the live replicas are those with a record
            records, _ = await self.presence.read_all()
            self._peers_seen = {str(r["id"]) for r in records if "id" in r}
            self._versions(records)

    def _record(self) -> dict[str, Any]:
        """The presence record's fields, read on the serving loop (which alone changes them)."""
        stats = self.bus.stats
        healthy, reason = self.bus.health
        return {
            "id": self.hub.replica_id,
            "address": self.hub.settings.public_base_url,
            "started": f"{self.started_at:.3f}",
            "clients": len(self.hub.peers),
            "desired": stats.desired,
            "confirmed": stats.confirmed,
            "bus": "ok" if healthy else f"down: {reason}",
            # running totals, for the rates the web console draws (server/http/status_api.py)
            **dict(self.hub.metrics.totals().items()),
            # calls in flight to this replica's busiest clients, for min_load lookups (hub/routing/loads.py)
            "loads": json.dumps(self.hub.loads.published(), separators=(",", ":")),
            # the newest replica wire version it reads: what the others may send it over a link
            READS_FIELD: replica_wire.VERSION,
        }

    async def _write_presence(self) -> None:
        """Rewrite the record as the serving loop last saw it, stamped now."""
        fields = {**self._fields, "seen": f"{time.time():.3f}", "leader": int(self.elector.is_leader)}
        await self.presence.write(fields, ttl=self.presence_ttl)

    async def _reassert(self, why: str) -> None:
        peers = list(self.hub.peers.items())
        await self.hub.reclaim()  # whose client ids these are, first
        count = await self.registry.reassert([info for client, _ in peers for info in self.hub.services_of(client)])
        self.reasserted += count
        self.log.warning("%s: re-asserted %d registrations of %d clients", why, count, len(peers))
        counted = [peer for client, peer in peers if self.hub.counted(client)]
        users = Counter(peer.user.accountable for peer in counted)
        workspaces = Counter(peer.workspace for peer in counted)
        await self.counts.rebuild(users, workspaces)
        if self.lost_deletes is not None:
            self.lost_deletes.begin()  # and deletes the store lost come back: look for them

    async def _write_back(self, infos: list[ServiceInfo]) -> int:
        count = await self.registry.reassert(infos)
        self.reasserted += count
        return count

    async def peer_loads(self) -> dict[str, int]:
        """Calls in flight to the other replicas' clients, as their presence records last said."""
        records, _ = await self.presence.read_all()
        loads: dict[str, int] = {}
        for record in records:
            if record.get("id") == self.hub.replica_id:
                continue
            try:
                published = json.loads(record.get("loads") or "{}")
            except ValueError:
                continue
            if isinstance(published, dict):
                loads.update({str(k): v for k, v in published.items() if isinstance(v, int)})
        return loads

    async def live_replicas(self) -> set[str]:
        return (await self.presence.known_and_live())[1]

    async def _forget_dead_replicas(self) -> None:
        """The leader drops what replicas that died without a goodbye still count."""
        known, live = await self.presence.known_and_live()
        for dead in known - live:
            await self.counts.forget_replica(dead)
            await self.presence.forget(dead)

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

    def __repr__(self) -> str:
        return f"Cluster({self.hub.replica_id}, leader={self.elector.is_leader}, reaped={self.reaped})"

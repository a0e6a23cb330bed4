"""One round of the cluster's upkeep (``Cluster.tend``), on in-memory stores and a fake clock.

The stores are small in-memory implementations of the interfaces in
``switchboard.replicas.upkeep.stores``; the hub side is the handful of members the
cluster uses. Real replicas on a real Valkey are in ``tests/cluster``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from switchboard.backends.owned import Recorded, Stale
from switchboard.clock import SystemClock
from switchboard.errors import BackendError
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.replicas.upkeep.cluster import (
    FAILOVER_SLACK,
    PRESENCE_INTERVAL,
    PRESENCE_TTL,
    Cluster,
    lease_policy,
    presence_ttl,
    store_failed_over,
)
from switchboard.replicas.upkeep.liveness import LivenessThread
from switchboard.replicas.upkeep.stale import field_of
from switchboard.testing import FakeClock
from switchboard.testing.hub import settings_for_tests
from switchboard.testing.wait import eventually


def info(client: str, svc: str = "built-in") -> ServiceInfo:
    return {"id": f"ws-1/{client}:{svc}", "type": "built-in", "config": {}}  # type: ignore[typeddict-item]


@dataclass
class User:
    id: str = "anonymous"
    parent: str | None = None

    @property
    def accountable(self) -> str:  # the root of its token chain, as the hub's User
        return self.parent or self.id


@dataclass
class Client:
    """A connection here, with what the hub's parts keep of it (asked through the port, HubSide)."""

    services: dict[str, ServiceInfo]  # what it announced (the service directory's)
    counted: bool = True  # the hub-wide connection counts include it (the gatekeeper's)
    user: User = field(default_factory=User)
    workspace: str = "ws-1"


@dataclass
class Manager:
    async def answers_ping(self, address: str, timeout: float = 2.0) -> bool:
        return False


@dataclass
class Metrics:
    def totals(self) -> dict[str, float]:
        return {"received": 7.0}


@dataclass
class Loads:
    def published(self) -> dict[str, int]:
        return {"ws-1/a": 2}


@dataclass
class HubSide:
    """What the cluster uses of the hub: its clients, and the repairs and sweeps it asks for."""

    clock: FakeClock
    replica_id: str = "ra"
    settings: Any = field(default_factory=settings_for_tests)
    peers: dict[str, Client] = field(default_factory=dict)
    manager: Manager = field(default_factory=Manager)
    metrics: Metrics = field(default_factory=Metrics)
    loads: Loads = field(default_factory=Loads)
    to_repair: list[ServiceInfo] = field(default_factory=list)
    transit: set[str] = field(default_factory=set)  # clients away from this replica (in transit)
    announced: list[tuple[str, list[str]]] = field(default_factory=list)  # departures announced
    sweeps: int = 0
    reclaims: int = 0

    def services_of(self, client: str) -> list[ServiceInfo]:
        held = self.peers.get(client)
        return list(held.services.values()) if held is not None else []

    def counted(self, client: str) -> bool:
        held = self.peers.get(client)
        return held is not None and held.counted

    async def repair_registry(self) -> list[ServiceInfo]:
        repair, self.to_repair = self.to_repair, []
        return repair

    async def reclaim(self) -> None:
        self.reclaims += 1

    async def sweep_transits(self) -> int:
        self.sweeps += 1
        return 0

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int:
        return 0

    async def announce_gone(self, workspace: str, client_id: str, removed: list[Any]) -> int:
        self.announced.append((f"{workspace}/{client_id}", [i["id"] for i in removed]))
        return len(removed)


@dataclass
class Presence:
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    replica_id: str = "ra"
    down: bool = False

    async def write(self, fields: Mapping[str, Any], *, ttl: float) -> None:
        if self.down:
            raise BackendError("presence store unreachable")
        self.records[self.replica_id] = {**fields, "ttl": ttl}
        self.known.add(self.replica_id)

    async def remove(self) -> None:
        self.records.pop(self.replica_id, None)
        self.known.discard(self.replica_id)

    async def known_and_live(self) -> tuple[set[str], set[str]]:
        return set(self.known), set(self.records)

    async def forget(self, replica_id: str) -> None:
        self.known.discard(replica_id)

    async def read_all(self) -> tuple[list[dict[str, Any]], str | None]:
        return list(self.records.values()), None


@dataclass
class Registry:
    reset: bool = False
    written: list[ServiceInfo] = field(default_factory=list)
    removed_for: list[str] = field(default_factory=list)

    async def owners(self) -> dict[str, str]:
        return {}

    settle: float = 0.0

    expected: set[str] | None = None
    settled_after: int = 0  # how many registrations were written when the replica said it had settled

    async def check_reset(self, *, settle: float = 0.0, expect: Iterable[str] | None = None) -> bool:
        reset, self.reset, self.settle = self.reset, False, settle
        self.expected = None if expect is None else set(expect)
        return reset

    async def settled(self) -> None:
        self.settled_after = len(self.written)

    async def reassert(self, infos: Iterable[ServiceInfo]) -> int:
        infos = list(infos)
        self.written += infos
        return len(infos)

    async def remove_replica_state(self, replica_id: str) -> list[ServiceInfo]:
        self.removed_for.append(replica_id)
        return []


@dataclass
class Counts:
    forgotten: list[str] = field(default_factory=list)
    rebuilt: list[tuple[dict[str, int], dict[str, int]]] = field(default_factory=list)

    async def rebuild(self, users: Mapping[str, int], workspaces: Mapping[str, int]) -> int:
        self.rebuilt.append((dict(users), dict(workspaces)))
        return len(users) + len(workspaces)

    async def forget_replica(self, replica_id: str) -> int:
        self.forgotten.append(replica_id)
        return 1


@dataclass
class Lease:
    owner_id: str = "ra#1"
    holder_id: str | None = None

    async def try_acquire(self) -> bool:
        if self.holder_id is None:
            self.holder_id = self.owner_id
            return True
        return False

    async def renew(self) -> bool:
        return self.holder_id == self.owner_id

    async def release(self) -> bool:
        freed, self.holder_id = self.holder_id == self.owner_id, None
        return freed

    async def holder(self) -> str | None:
        return self.holder_id


class Bus:
    health = (True, "ok")

    @dataclass
    class stats:  # noqa: N801 - read like RedisBus.stats
        desired: int = 3
        confirmed: int = 2


@dataclass
class World:
    hub: HubSide
    presence: Presence
    registry: Registry
    counts: Counts
    lease: Lease
    cluster: Cluster


def world(*, held_by: str | None = None, **cluster_options: Any) -> World:
    clock = FakeClock()
    hub = HubSide(clock=clock)
    presence, registry, counts, lease = Presence(), Registry(), Counts(), Lease(holder_id=held_by)
    cluster = Cluster(
        hub,
        registry=registry,
        bus=Bus(),
        presence=presence,
        lease=lease,
        policy=lease_policy(hub.settings, "sb:leader"),
        counts=counts,
        **cluster_options,
    )
    return World(hub, presence, registry, counts, lease, cluster)


@contextlib.asynccontextmanager
async def campaigning(w: World) -> AsyncIterator[None]:
    task = asyncio.create_task(w.cluster.elector.run())
    for _ in range(3):
        await asyncio.sleep(0)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_round_writes_this_replicas_presence_with_a_short_life() -> None:
    w = world()
    w.hub.peers["ws-1/a"] = Client({"x": info("a")})
    await w.cluster.tend()
    record = w.presence.records["ra"]
    assert (record["clients"], record["desired"], record["confirmed"]) == (1, 3, 2)
    assert record["bus"] == "ok"
    assert record["received"] == 7.0
    assert record["ttl"] == PRESENCE_TTL


async def test_a_round_publishes_the_calls_in_flight_to_this_replicas_clients() -> None:
    w = world()
    await w.cluster.tend()
    assert json.loads(w.presence.records["ra"]["loads"]) == {"ws-1/a": 2}


async def test_the_other_replicas_loads_are_read_from_their_records() -> None:
    w = world()
    await w.cluster.tend()  # this replica's own record is not another's
    w.presence.records["rb"] = {"id": "rb", "loads": json.dumps({"ws-1/b": 5, "ws-1/odd": "x"})}
    w.presence.records["rc"] = {"id": "rc", "loads": "not json"}
    w.presence.records["rd"] = {"id": "rd"}  # a replica of an older version publishes none
    assert await w.cluster.peer_loads() == {"ws-1/b": 5}


async def test_a_store_that_lost_its_data_gets_every_live_registration_back() -> None:
    w = world()
    w.hub.peers = {"ws-1/a": Client({"b": info("a"), "s": info("a", "s")}), "ws-1/b": Client({"b": info("b")})}
    w.registry.reset = True
    await w.cluster.tend()
    assert sorted(i["id"] for i in w.registry.written) == ["ws-1/a:built-in", "ws-1/a:s", "ws-1/b:built-in"]
    assert w.cluster.reasserted == 3
    assert w.hub.reclaims == 1, "whose client ids they are is recorded again too"


async def test_a_store_that_lost_its_data_gets_this_replicas_connection_counts_back() -> None:
    """Absolute counts of the clients counted here (one not counted, say it was admitted while
    Redis was away, adds nothing), so the limits per user and per workspace hold again."""
    w = world()
    w.hub.peers = {
        "ws-1/a": Client({}, user=User("alice")),
        "ws-1/b": Client({}, user=User("alice")),
        "ws-2/c": Client({}, user=User("bob"), workspace="ws-2"),
        "ws-2/d": Client({}, user=User("bob"), workspace="ws-2", counted=False),
        "ws-2/e": Client({}, user=User("x1y2z3", parent="bob"), workspace="ws-2"),  # a token bob generated
    }
    await w.cluster.tend()
    assert w.counts.rebuilt == []  # nothing lost, nothing rebuilt
    w.registry.reset = True
    await w.cluster.tend()
    assert w.counts.rebuilt == [({"alice": 2, "bob": 2}, {"ws-1": 2, "ws-2": 2})]  # bob's token counts as bob


async def test_the_replica_that_notices_a_loss_marks_the_store_settling_until_every_replica_could_notice() -> None:
    w = world()
    await w.cluster.tend()
    assert w.registry.settle >= PRESENCE_INTERVAL  # every replica checks once per interval


async def test_after_a_loss_lookups_wait_for_the_replicas_seen_alive_and_this_one_says_when_it_is_done() -> None:
    """The first round knows no replica (the full settling time); the next ones name those the
    last round saw alive, and the replica says it has settled once its registrations are back."""
    w = world()
    await w.cluster.tend()
    assert w.registry.expected is None
    w.presence.records["rb"] = {}
    await w.cluster.tend()
    w.registry.reset = True
    w.hub.peers = {"ws-1/a": Client({"ws-1/a:s": info("a")})}
    await w.cluster.tend()
    assert w.registry.expected == {"ra", "rb"}
    assert w.registry.settled_after == len(w.registry.written) > 0


class BusBackAt(Bus):
    """A bus whose pub/sub connection is down until ``back`` on ``clock``."""

    def __init__(self, clock: FakeClock, back: float) -> None:
        self.clock, self.back = clock, back

    @property
    def health(self) -> tuple[bool, str]:  # type: ignore[override]
        return (self.clock.monotonic() >= self.back, "down until then")


async def test_the_next_round_comes_as_soon_as_redis_answers_again_after_an_outage() -> None:
    """So what Redis lost is written back (and lookups stop saying "retry") at once, not up to
    PRESENCE_INTERVAL later."""
    w = world()
    clock = w.hub.clock
    w.cluster.bus = BusBackAt(clock, back=clock.monotonic() + 0.3)
    started = clock.monotonic()
    await w.cluster._next_round()
    assert 0.3 <= clock.monotonic() - started < 0.4  # a look every BACK_WATCH (0.05 s)


async def test_without_an_outage_the_rounds_keep_their_interval() -> None:
    w = world()
    clock = w.hub.clock
    started = clock.monotonic()
    await w.cluster._next_round()
    assert clock.monotonic() - started == pytest.approx(PRESENCE_INTERVAL)


async def test_registrations_an_outage_left_unwritten_are_written_on_the_next_round() -> None:
    w = world()
    w.hub.to_repair = [info("a")]
    await w.cluster.tend()
    assert w.registry.written == [info("a")]
    assert w.cluster.reasserted == 1
    await w.cluster.tend()  # nothing more to repair
    assert w.registry.written == [info("a")]


async def test_the_leader_forgets_what_dead_replicas_still_count_and_ends_graces() -> None:
    w = world()
    w.presence.known |= {"rdead"}  # announced itself once, no record any more
    async with campaigning(w):
        assert w.cluster.elector.is_leader
        await w.cluster.tend()
    assert w.counts.forgotten == ["rdead"]
    assert w.presence.known == {"ra"}
    assert w.hub.sweeps == 1


async def test_a_follower_leaves_the_leaders_chores_alone() -> None:
    w = world(held_by="rb#1")
    w.presence.known |= {"rdead"}
    async with campaigning(w):
        assert not w.cluster.elector.is_leader
        await w.cluster.tend()
    assert w.counts.forgotten == []
    assert w.hub.sweeps == 0


async def test_a_store_outage_is_a_backend_error_the_loop_survives() -> None:
    w = world()
    w.presence.down = True
    with pytest.raises(BackendError):
        await w.cluster.tend()
    await w.cluster.start()  # start and its loop only log it
    await w.cluster.stop()


async def test_a_clean_stop_resigns_and_removes_only_this_replicas_state() -> None:
    w = world()
    await w.cluster.start()
    for _ in range(3):
        await asyncio.sleep(0)
    assert w.lease.holder_id == "ra#1"
    await w.cluster.stop()
    assert w.lease.holder_id is None
    assert w.registry.removed_for == ["ra"]
    assert "ra" not in w.presence.records


# -- a cluster's failover: presence outlasts it, and lost writes come back ----


def test_on_a_cluster_presence_lives_twice_the_node_timeout_and_the_rounds_around_it() -> None:
    assert presence_ttl(None) == PRESENCE_TTL  # one instance: no failover to outlast
    for node_timeout in (0.5, 2.0, 15.0, 60.0):
        ttl = presence_ttl(node_timeout)
        assert ttl >= 2 * node_timeout + FAILOVER_SLACK + 2 * PRESENCE_INTERVAL, (node_timeout, ttl)
        assert ttl >= PRESENCE_TTL
    assert presence_ttl(2.0) == 11.0  # the test cluster's 2 s: failovers measured at 3.7-4.7 s
    assert presence_ttl(15.0) == 37.0  # Redis's and Valkey's default


class TimedPresence(Presence):
    """A presence store whose record expires on the fake clock; it notes every moment one was missing."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.expires = -1.0
        self.gaps: list[float] = []

    async def write(self, fields: Mapping[str, Any], *, ttl: float) -> None:
        if self.down:
            raise BackendError("CLUSTERDOWN the registry's master is failing over")
        now = self.clock.monotonic()
        if 0 <= self.expires < now:
            self.gaps.append(now)
        self.expires = now + ttl


async def failover_gaps(ttl_world: World, clock: FakeClock, *, kill_at: float, failover: float) -> list[float]:
    """Rounds every PRESENCE_INTERVAL on the fake clock; the store refuses writes for ``failover``
    seconds from ``kill_at``; the moments the replica's record had expired."""
    presence = TimedPresence(clock)
    ttl_world.cluster.presence = presence
    for _ in range(30):  # a minute of rounds
        clock.advance(PRESENCE_INTERVAL)
        now = clock.monotonic()
        presence.down = kill_at <= now < kill_at + failover
        with contextlib.suppress(BackendError):
            await ttl_world.cluster.tend()
    return presence.gaps


@pytest.mark.parametrize("node_timeout", [0.5, 2.0, 15.0])
async def test_a_failover_as_long_as_its_bound_never_lets_presence_expire(node_timeout: float) -> None:
    """Whatever the phase of the kill against the rounds, a failover of 2 x node-timeout plus the
    election's slack leaves the record alive until the first round after it (the derivation holds);
    the one-instance TTL would not (the test fails with the TTL cut)."""

    async def read_timeout() -> float:
        return node_timeout

    failover = 2 * node_timeout + FAILOVER_SLACK
    for phase in range(8):
        w = world(node_timeout=read_timeout)
        assert await w.cluster.learn_presence_ttl() == presence_ttl(node_timeout)
        kill_at = 10.0 + phase * PRESENCE_INTERVAL / 8
        assert not await failover_gaps(w, w.hub.clock, kill_at=kill_at, failover=failover), (node_timeout, phase)
    short = world()  # no node timeout known: the one-instance TTL, which a 2 s cluster's failover outlives
    assert await short.cluster.learn_presence_ttl() == PRESENCE_TTL
    if failover > PRESENCE_TTL - PRESENCE_INTERVAL:
        assert await failover_gaps(short, short.hub.clock, kill_at=10.0, failover=failover)


async def test_a_cluster_that_refuses_config_get_takes_the_node_timeout_setting() -> None:
    async def refused() -> None:
        return None

    w = world(node_timeout=refused)
    assert await w.cluster.learn_presence_ttl() == presence_ttl(w.hub.settings.redis_cluster_node_timeout)


def test_only_a_change_of_a_known_master_is_a_failover() -> None:
    assert store_failed_over(("h", 1), ("h", 2))
    assert not store_failed_over(("h", 1), ("h", 1))
    assert not store_failed_over(None, ("h", 2))  # first seen
    assert not store_failed_over(("h", 1), None)  # the slot map not read: nothing known


async def test_when_the_registrys_shard_changes_master_every_live_registration_is_written_again() -> None:
    masters = [("127.0.0.1", 7000)]
    w = world(store_master=lambda: masters[-1])
    w.hub.peers = {"ws-1/a": Client({"b": info("a"), "s": info("a", "s")})}
    await w.cluster.start()
    try:
        await w.cluster.tend()
        assert not w.registry.written, "no failover yet"
        masters.append(("127.0.0.1", 7003))  # its replica promoted
        w.presence.down = True  # still failing over: the round fails, and the next one retries
        with pytest.raises(BackendError):
            await w.cluster.tend()
        w.presence.down = False
        await w.cluster.tend()
        assert sorted(i["id"] for i in w.registry.written) == ["ws-1/a:built-in", "ws-1/a:s"]
        assert w.counts.rebuilt, "the connection counts too"
        await w.cluster.tend()
        assert len(w.registry.written) == 2, "once per failover"
    finally:
        await w.cluster.stop()


@dataclass
class StaleStore:
    """The registry's side of undoing lost deletes: what it holds for this replica's clients, and
    what was removed (``during_removal`` runs as Redis would be running the removal)."""

    records: list[Recorded] = field(default_factory=list)
    removed: list[Stale] = field(default_factory=list)
    during_removal: Callable[[], None] = lambda: None

    async def owned(self, wanted: Callable[[str, str], bool] = lambda client, field: True) -> list[Recorded]:
        return [
            Recorded(r.client, {f: v if wanted(r.client, f) else "" for f, v in r.services.items()})
            for r in self.records
        ]

    async def remove(self, stale: Iterable[Stale]) -> list[tuple[Stale, bool, list[ServiceInfo]]]:
        self.during_removal()
        done = []
        for entry in stale:
            self.removed.append(entry)
            self.records = [r for r in self.records if r.client != entry.client or not entry.departed]
            done.append((entry, entry.departed, [json.loads(v) for v in entry.services.values()]))
        return done


def recorded(*infos: ServiceInfo) -> Recorded:
    client = infos[0]["id"].partition(":")[0]
    return Recorded(client, {field_of(i["id"]): json.dumps(i) for i in infos})


async def failed_over(w: World, masters: list[tuple[str, int]]) -> None:
    await w.cluster.start()
    await w.cluster.tend()
    masters.append(("127.0.0.1", 7003))  # its replica promoted


async def test_after_a_failover_what_this_replicas_clients_no_longer_have_is_removed_on_the_second_look() -> None:
    """A service unregistered and a client that left, both lost with the old master: the first
    round after the failover suspects them, the next removes them; then nothing more is read."""
    masters = [("127.0.0.1", 7000)]
    store = StaleStore([recorded(info("a"), info("a", "gone")), recorded(info("b")), recorded(info("c"))])
    w = world(store_master=lambda: masters[-1], stale=store)
    w.hub.peers = {"ws-1/a": Client({i["id"]: i for i in [info("a")]})}
    w.hub.transit = {"ws-1/c"}  # in transit from here: its grace decides
    try:
        await failed_over(w, masters)
        await w.cluster.tend()
        assert store.removed == [], "one look only suspects"
        await w.cluster.tend()
        assert store.removed == [
            Stale("ws-1/a", {"a:gone": json.dumps(info("a", "gone"))}),
            Stale("ws-1/b", {"b:built-in": json.dumps(info("b"))}, departed=True),
        ]
        assert w.cluster.lost_deletes is not None
        assert (w.cluster.lost_deletes.removed_services, w.cluster.lost_deletes.removed_clients) == (2, 1)
        assert w.hub.announced == [("ws-1/b", ["ws-1/b:built-in"])], "a departure never goes unannounced"
        store.records.append(recorded(info("d")))
        await w.cluster.tend()
        await w.cluster.tend()
        assert len(store.removed) == 2, "looked for until nothing was suspect, not after"
    finally:
        await w.cluster.stop()


async def test_a_service_registered_again_while_it_was_removed_is_written_back() -> None:
    masters = [("127.0.0.1", 7000)]
    store = StaleStore([recorded(info("a"), info("a", "x"))])
    w = world(store_master=lambda: masters[-1], stale=store)
    peer = Client({i["id"]: i for i in [info("a")]})
    w.hub.peers = {"ws-1/a": peer}
    store.during_removal = lambda: peer.services.update({"ws-1/a:x": info("a", "x")})
    try:
        await failed_over(w, masters)
        await w.cluster.tend()
        written = len(w.registry.written)
        await w.cluster.tend()
        assert [s.client for s in store.removed] == ["ws-1/a"]
        assert w.registry.written[written:] == [info("a", "x")], "written back at once"
    finally:
        await w.cluster.stop()


async def test_a_client_that_reconnected_while_it_was_removed_is_claimed_and_written_back() -> None:
    masters = [("127.0.0.1", 7000)]
    store = StaleStore([recorded(info("b"))])
    w = world(store_master=lambda: masters[-1], stale=store)
    store.during_removal = lambda: w.hub.peers.update({"ws-1/b": Client({"ws-1/b:built-in": info("b")})})
    try:
        await failed_over(w, masters)
        await w.cluster.tend()
        reclaims, written = w.hub.reclaims, len(w.registry.written)
        await w.cluster.tend()
        assert store.removed == [Stale("ws-1/b", {"b:built-in": json.dumps(info("b"))}, departed=True)]
        assert w.hub.reclaims == reclaims + 1
        assert w.registry.written[written:] == [info("b")]
        assert w.hub.announced == [], "it is back: no departure"
    finally:
        await w.cluster.stop()


class Timeline:
    """A fake clock for several sleeping tasks at once (the presence, upkeep, lease and reaper
    loops): time moves only when the test moves it, and each sleeper wakes at its own deadline."""

    def __init__(self) -> None:
        self._now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return 1_700_000_000.0 + self._now

    async def sleep(self, seconds: float) -> None:
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), id(wake), wake))
        await wake

    async def run_until(self, end: float) -> None:
        await self._turns()  # tasks just started reach their first sleep
        while self._sleepers and self._sleepers[0][0] <= end:  # bounded: every loop sleeps a while
            self._now, _, wake = heapq.heappop(self._sleepers)
            if not wake.done():
                wake.set_result(None)
            await self._turns()  # the sleeper's round, up to its next sleep or a stuck await
        self._now = end

    @staticmethod
    async def _turns() -> None:
        for _ in range(10):
            await asyncio.sleep(0)


@dataclass
class StuckRegistry(Registry):
    """A registry whose upkeep commands wait for a connection of a pool the clients' commands fill."""

    waiting: int = 0

    async def check_reset(self, *, settle: float = 0.0, expect: Iterable[str] | None = None) -> bool:
        if not settle:  # start() records the epoch: answered
            return await super().check_reset()
        self.waiting += 1
        await asyncio.Event().wait()  # never answered within the test
        return False


async def test_the_presence_record_keeps_its_times_while_the_upkeep_waits_on_the_store() -> None:
    """The record tells the others this replica is alive (expired: gone, its clients reaped):
    rewriting it never waits behind the upkeep's commands, which share the command pool with
    the clients' and may wait there for seconds."""
    clock = Timeline()
    hub = HubSide(clock=clock)  # type: ignore[arg-type]
    presence, registry, lease = Presence(), StuckRegistry(), Lease()
    cluster = Cluster(
        hub,
        registry=registry,
        bus=Bus(),
        presence=presence,
        lease=lease,
        policy=lease_policy(hub.settings, "sb:leader"),
        counts=Counts(),
    )
    writes: list[float] = []
    write = presence.write

    async def timed_write(fields: Mapping[str, Any], *, ttl: float) -> None:
        writes.append(clock.monotonic())
        await write(fields, ttl=ttl)

    presence.write = timed_write  # type: ignore[method-assign]
    await cluster.start()
    try:
        await clock.run_until(5 * PRESENCE_INTERVAL + 0.5)
        assert registry.waiting == 1, "the upkeep is stuck on the store from its first round"
        assert writes == [n * PRESENCE_INTERVAL for n in range(6)], f"presence written at {writes} only"
        assert cluster.elector.is_leader  # the lease's renewal never waited either
    finally:
        await cluster.stop()


async def test_a_clean_stop_closes_the_lease_and_presence_connections_last() -> None:
    w = world()
    closed: list[str | None] = []

    async def close() -> None:
        closed.append(w.lease.holder_id)  # the lease was released before its connection went

    cluster = Cluster(
        w.hub,
        registry=w.registry,
        bus=Bus(),
        presence=w.presence,
        lease=w.lease,
        policy=lease_policy(w.hub.settings, "sb:leader"),
        counts=w.counts,
        close=close,
    )
    await cluster.start()
    for _ in range(3):
        await asyncio.sleep(0)
    await cluster.stop()
    assert closed == [None]
    assert "ra" not in w.presence.records


async def test_on_the_liveness_thread_the_lease_and_the_record_are_kept_there_and_given_up_there() -> None:
    """The lease, the presence record's writes and their connections' closing all run on the
    liveness thread (their connections are only ever used there); the stop still resigns and
    removes this replica's state before the thread ends."""
    hub = HubSide(clock=SystemClock())  # type: ignore[arg-type]  # two event loops: real time
    presence, lease = Presence(), Lease()
    threads: dict[str, set[str]] = {"write": set(), "acquire": set(), "close": set()}
    write, acquire = presence.write, lease.try_acquire

    async def on_thread_write(fields: Mapping[str, Any], *, ttl: float) -> None:
        threads["write"].add(threading.current_thread().name)
        await write(fields, ttl=ttl)

    async def on_thread_acquire() -> bool:
        threads["acquire"].add(threading.current_thread().name)
        return await acquire()

    async def close() -> None:
        threads["close"].add(threading.current_thread().name)

    presence.write = on_thread_write  # type: ignore[method-assign]
    lease.try_acquire = on_thread_acquire  # type: ignore[method-assign]
    liveness = LivenessThread("ra liveness")
    cluster = Cluster(
        hub,
        registry=Registry(),
        bus=Bus(),
        presence=presence,
        lease=lease,
        policy=lease_policy(hub.settings, "sb:leader"),
        counts=Counts(),
        close=close,
        liveness=liveness,
    )
    await cluster.start()
    try:
        await eventually(lambda: cluster.elector.is_leader, "it leads", timeout=5)
        assert presence.records["ra"]["clients"] == 0
    finally:
        await cluster.stop()
    assert threads == {"write": {"ra liveness"}, "acquire": {"ra liveness"}, "close": {"ra liveness"}}
    assert lease.holder_id is None, "resigned"
    assert "ra" not in presence.records
    assert not any(t.name == "ra liveness" for t in threading.enumerate()), "the thread ended"

"""The Redis leader lease against a real Valkey: exclusivity, compare-and-renew,
failover after a crashed leader, and stepping down before the TTL can lapse."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from switchboard.backends.redis.stores.lease import RedisLease
from switchboard.clock import SystemClock
from switchboard.errors import BackendError, ConfigError
from switchboard.replicas.upkeep.lease import LeaderElector, LeaseLost, LeasePolicy
from switchboard.testing import ValkeyServer
from switchboard.testing.wait import eventually

TTL = 0.3
RENEW = 0.1
POLICY = LeasePolicy(key="switchboard:test:lease", ttl=TTL, renew_every=RENEW)


@pytest.fixture
def valkey_lease() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def make_lease(valkey_lease: ValkeyServer) -> AsyncIterator[Callable[[str], RedisLease]]:
    clients: list[aioredis.Redis] = []

    def make(owner: str) -> RedisLease:
        client = aioredis.Redis.from_url(valkey_lease.url, socket_timeout=2.0, socket_connect_timeout=2.0)
        clients.append(client)
        return RedisLease(client, key=POLICY.key, ttl_ms=POLICY.ttl_ms, owner_id=owner)

    yield make
    for client in clients:
        async with asyncio.timeout(5):
            await client.aclose()


def test_policy_validation() -> None:
    with pytest.raises(ConfigError, match="less than ttl"):
        LeasePolicy(key="k", ttl=1.0, renew_every=1.0)
    with pytest.raises(ConfigError, match="key"):
        LeasePolicy(key="", ttl=1.0, renew_every=0.5)
    with pytest.raises(ConfigError, match="ttl"):
        LeasePolicy(key="k", ttl=0, renew_every=0.5)
    policy = LeasePolicy(key="k", ttl=0.0015, renew_every=0.001)
    assert policy.ttl_ms == 2  # rounded up: Redis must never expire the key early
    assert 0 < POLICY.step_down_margin < TTL - RENEW
    assert issubclass(LeaseLost, BackendError)


async def test_acquire_is_exclusive(make_lease: Callable[[str], RedisLease]) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert await a.holder() is None
    assert await a.try_acquire() is True
    assert await b.try_acquire() is False
    assert await a.try_acquire() is False  # NX: not even the owner sets it twice
    assert await b.holder() == "a"


async def test_renew_by_non_owner_fails(make_lease: Callable[[str], RedisLease]) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert await a.try_acquire()
    assert await b.renew() is False
    assert await a.holder() == "a"
    assert await a.renew() is True
    pttl = await a.redis.pttl(POLICY.key)
    assert 0 < pttl <= POLICY.ttl_ms


async def test_release_by_non_owner_does_nothing(
    make_lease: Callable[[str], RedisLease],
) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert await a.try_acquire()
    assert await b.release() is False
    assert await b.holder() == "a"
    assert await a.release() is True
    assert await b.holder() is None
    assert await b.try_acquire() is True


@pytest.mark.alone
async def test_another_acquires_once_the_owner_stops_renewing(
    make_lease: Callable[[str], RedisLease],
) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert await a.try_acquire()
    acquired_at = time.monotonic()
    assert await b.try_acquire() is False
    await eventually(b.try_acquire, "the lease expired for b", timeout=TTL + 2.0)
    assert time.monotonic() - acquired_at >= TTL * 0.9  # not before the TTL passed
    assert await a.holder() == "b"
    assert await a.renew() is False  # the old owner cannot take it back


class Recorder:
    """Callbacks for one elector, with monotonic timestamps."""

    def __init__(self) -> None:
        self.elected: list[float] = []
        self.lost: list[tuple[float, LeaseLost]] = []
        self.elected_event = asyncio.Event()
        self.lost_event = asyncio.Event()

    def on_elected(self) -> None:
        self.elected.append(time.monotonic())
        self.elected_event.set()

    async def on_lost(self, exc: LeaseLost) -> None:
        self.lost.append((time.monotonic(), exc))
        self.lost_event.set()


def elector(lease: RedisLease) -> tuple[LeaderElector, Recorder]:
    rec = Recorder()
    return LeaderElector(lease, policy=POLICY, clock=SystemClock(), on_elected=rec.on_elected, on_lost=rec.on_lost), rec


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    async with asyncio.timeout(5):  # a loop that ignored cancel would fail here, not hang
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.alone
async def test_two_electors_exactly_one_leads_and_failover_after_crash(
    make_lease: Callable[[str], RedisLease],
) -> None:
    (e1, r1), (e2, r2) = elector(make_lease("one")), elector(make_lease("two"))
    tasks = {e1: asyncio.create_task(e1.run()), e2: asyncio.create_task(e2.run())}
    try:
        await eventually(lambda: e1.is_leader or e2.is_leader, "a leader", timeout=3.0)
        # Watch for several TTLs: one leader throughout, elected once, never lost.
        watch_until = time.monotonic() + 3 * TTL
        while time.monotonic() < watch_until:
            assert e1.is_leader != e2.is_leader
            await asyncio.sleep(0.01)
        leader, follower = (e1, e2) if e1.is_leader else (e2, e1)
        lrec, frec = (r1, r2) if leader is e1 else (r2, r1)
        assert len(lrec.elected) == 1
        assert not lrec.lost
        assert not frec.elected
        assert await leader.lease.holder() == leader.lease.owner_id

        # SIGKILL the leader: its loop stops dead, nothing is released.
        await cancel(tasks.pop(leader))
        killed_at = time.monotonic()
        assert await follower.lease.holder() == leader.lease.owner_id
        await asyncio.wait_for(frec.elected_event.wait(), TTL + RENEW + 2.0)
        assert not leader.is_leader  # the dead loop's deadline passed before the TTL
        took = frec.elected[0] - killed_at
        assert took <= TTL + RENEW + 0.1, f"failover took {took:.3f}s"
        assert took >= TTL - RENEW - 0.05, f"lease stolen after {took:.3f}s"
        assert follower.is_leader
        assert await follower.lease.holder() == follower.lease.owner_id
        assert not lrec.lost  # a crashed replica runs no callbacks
    finally:
        for task in tasks.values():
            await cancel(task)


async def test_leader_without_redis_steps_down_before_ttl_lapses(
    valkey_lease: ValkeyServer, make_lease: Callable[[str], RedisLease]
) -> None:
    lease = make_lease("solo")
    renewed_at: list[float] = []  # when each successful renew was sent
    real_renew = lease.renew

    async def spy_renew() -> bool:
        sent = time.monotonic()
        ok = await real_renew()
        if ok:
            renewed_at.append(sent)
        return ok

    lease.renew = spy_renew  # type: ignore[method-assign]
    el, rec = elector(lease)
    task = asyncio.create_task(el.run())
    try:
        await asyncio.wait_for(rec.elected_event.wait(), 3.0)
        await eventually(lambda: len(renewed_at) >= 2, "two renewals", timeout=3.0)
        valkey_lease.kill()  # SIGKILL: Redis vanishes mid-lease (blocks the loop for ms)
        await asyncio.wait_for(rec.lost_event.wait(), TTL + 2.0)
        lost_at, exc = rec.lost[0]
        last_ok = renewed_at[-1]
        assert lost_at < last_ok + TTL, (
            f"on_lost {lost_at - last_ok:.3f}s after the last renew: TTL {TTL}s may have lapsed"
        )
        assert isinstance(exc, LeaseLost)
        assert not el.is_leader
        with pytest.raises(LeaseLost):
            el.ensure_leader()
    finally:
        await cancel(task)


async def test_resign_releases_for_a_fast_handover(
    make_lease: Callable[[str], RedisLease],
) -> None:
    el, rec = elector(make_lease("a"))
    task = asyncio.create_task(el.run())
    await asyncio.wait_for(rec.elected_event.wait(), 3.0)
    await cancel(task)
    await el.resign()
    assert len(rec.lost) == 1
    assert await el.lease.holder() is None

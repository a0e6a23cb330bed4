"""The Redis side of the replica layer against a real Valkey: presence records, the lease's
operations and per-replica counts, and what they raise when Redis is gone (BackendError, never
a Redis error: nothing above the backend knows Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from switchboard.backends.redis import make_client
from switchboard.backends.redis.stores.counts import RedisConnectionCounts
from switchboard.backends.redis.stores.lease import RedisLease
from switchboard.backends.redis.stores.presence import LEADER_KEY, RedisPresence
from switchboard.errors import BackendError
from switchboard.testing import ValkeyServer


@pytest.fixture
async def valkey() -> AsyncIterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


@pytest.fixture
async def redis(valkey: ValkeyServer) -> AsyncIterator[object]:
    client = make_client(valkey.url, timeout=0.5, retries=0)
    yield client
    await client.aclose()


async def test_presence_records_live_until_removed_and_the_dead_are_known_apart(redis) -> None:
    ra, rb = RedisPresence(redis, replica_id="ra"), RedisPresence(redis, replica_id="rb")
    await ra.write({"id": "ra", "clients": 2}, ttl=5.0)
    await rb.write({"id": "rb", "clients": 0}, ttl=5.0)
    assert await ra.known_and_live() == ({"ra", "rb"}, {"ra", "rb"})
    records, leader = await ra.read_all()
    assert [(r["id"], r["clients"]) for r in records] == [("ra", "2"), ("rb", "0")]
    assert leader is None

    await redis.delete("sb:presence:rb")  # its record expired: rb died without a goodbye
    assert await ra.known_and_live() == ({"ra", "rb"}, {"ra"})
    await ra.forget("rb")
    await ra.remove()  # a clean shutdown takes only its own record
    assert await rb.known_and_live() == (set(), set())


async def test_the_leader_named_in_the_status_is_the_lease_holder(redis) -> None:
    lease = RedisLease(redis, key=LEADER_KEY, ttl_ms=5000, owner_id="ra#123")
    assert await lease.try_acquire()
    assert await lease.holder() == "ra#123"
    _, leader = await RedisPresence(redis, replica_id="ra").read_all()
    assert leader == "ra"


async def test_a_rebuild_sets_this_replicas_counts_and_drops_those_of_users_gone_since(redis) -> None:
    """After a failover, a promoted replica may hold counts whose decrements it never got: the
    rebuild writes what this replica's clients count now and drops this replica's share of every
    other counter it had touched, so a user who left is not counted against its limit forever;
    other replicas' shares stay."""
    ra, rb = RedisConnectionCounts(redis, replica_id="ra"), RedisConnectionCounts(redis, replica_id="rb")
    await ra.add("alice", "ws-1")
    await ra.add("bob", "ws-2")  # bob's departure below is the decrement the failover lost
    await rb.add("bob", "ws-2")
    await ra.rebuild({"alice": 1}, {"ws-1": 1})
    assert await ra.add("alice", "ws-1") == (2, 2)
    assert await redis.hgetall("sb:conns:u:bob") == {b"rb": b"1"}, "ra's stale share of bob kept"
    assert await redis.hgetall("sb:conns:w:ws-2") == {b"rb": b"1"}
    assert await redis.smembers("sb:conns:keys:ra") == {b"sb:conns:u:alice", b"sb:conns:w:ws-1"}


async def test_without_redis_every_store_operation_raises_a_backend_error(valkey, redis) -> None:
    presence = RedisPresence(redis, replica_id="ra")
    lease = RedisLease(redis, key=LEADER_KEY, ttl_ms=5000, owner_id="ra#1")
    counts = RedisConnectionCounts(redis, replica_id="ra")
    valkey.kill()
    for operation in (
        presence.write({"id": "ra"}, ttl=5.0),
        presence.known_and_live(),
        presence.read_all(),
        presence.forget("rb"),
        presence.remove(),
        lease.try_acquire(),
        lease.renew(),
        lease.release(),
        lease.holder(),
        counts.forget_replica("rb"),
    ):
        with pytest.raises(BackendError):
            await operation

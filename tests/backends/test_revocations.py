"""Revoked token ids are kept exactly until the token would have expired: in Redis with that TTL, in memory by
the injected clock (issue 22)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from switchboard.backends.redis import make_client
from switchboard.backends.redis.revoked import RedisRevocations, revoked_key
from switchboard.backends.revocations import MemoryRevocations
from switchboard.clock import SystemClock
from switchboard.errors import BackendError
from switchboard.testing import ValkeyServer
from switchboard.testing.clock import FakeClock


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def redis(valkey: ValkeyServer) -> AsyncIterator[object]:
    client = make_client(valkey.url)
    yield client
    await client.aclose()


async def test_redis_keeps_a_revocation_for_the_tokens_remaining_lifetime(redis) -> None:
    clock = SystemClock()
    store = RedisRevocations(redis, clock=clock)
    await store.revoke("jti-1", until=clock.time() + 120)
    assert await store.any_revoked(("other", "jti-1"))
    assert not await store.any_revoked(("other",))
    assert 110 <= await redis.ttl(revoked_key("jti-1")) <= 121, "kept past the token's expiry, or forgotten early"


async def test_redis_stores_nothing_for_a_token_already_expired(redis) -> None:
    clock = SystemClock()
    await RedisRevocations(redis, clock=clock).revoke("jti-old", until=clock.time() - 1)
    assert not await redis.exists(revoked_key("jti-old"))


async def test_a_replica_sees_another_replicas_revocation(redis, valkey: ValkeyServer) -> None:
    clock = SystemClock()
    other = make_client(valkey.url)
    try:
        await RedisRevocations(other, clock=clock).revoke("jti-2", until=clock.time() + 60)
        assert await RedisRevocations(redis, clock=clock).any_revoked(("jti-2",))
    finally:
        await other.aclose()


async def test_memory_forgets_a_revocation_when_the_token_expires() -> None:
    clock = FakeClock(wall=1_000.0)
    store = MemoryRevocations(clock)
    await store.revoke("a", until=1_010.0)
    assert await store.any_revoked(("a",))
    clock.advance(10)
    assert not await store.any_revoked(("a",))
    await store.revoke("b", until=1_100.0)  # expired entries are dropped as new ones come
    assert len(store) == 1


async def test_redis_away_refuses_the_check_rather_than_pass_a_revoked_token() -> None:
    clock = SystemClock()
    with ValkeyServer() as gone:
        client = make_client(gone.url)
        try:
            store = RedisRevocations(client, clock=clock)
            await store.revoke("jti-3", until=clock.time() + 60)
            gone.stop()
            with pytest.raises(BackendError, match="revocations cannot be checked"):
                await store.any_revoked(("jti-3",))
        finally:
            await client.aclose()

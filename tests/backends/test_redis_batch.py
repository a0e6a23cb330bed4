"""Script calls of many tasks go to a real Valkey in a few pipelines, each answered for itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import RedisError

from switchboard.backends.redis import make_client
from switchboard.backends.redis.shared.batch import Batcher
from switchboard.backends.redis.shared.cluster_setup import make_cluster_client
from switchboard.testing import ValkeyServer
from switchboard.testing.valkey_cluster import ValkeyCluster

pytestmark = pytest.mark.timeout(60)

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
FAIL_ON_ZERO = "if ARGV[1] == '0' then return redis.error_reply('zero refused') end return ARGV[1]"


@pytest.fixture
async def redis(valkey: ValkeyServer) -> AsyncIterator[Any]:
    client = make_client(valkey.url, max_connections=1)  # one connection: a pool a crowd would exhaust
    yield client
    await client.aclose()


async def test_a_crowd_of_calls_costs_a_few_pipelines_and_each_gets_its_own_reply(redis: Any) -> None:
    incr = redis.register_script(INCR)
    batcher = Batcher(redis, limit=100)
    await redis.delete("batch:n")
    replies = await asyncio.gather(*(batcher.run(incr, ["batch:n"], [1]) for _ in range(1000)))
    assert replies == list(range(1, 1001))  # every call ran once, in the order it was made
    assert int(await redis.get("batch:n")) == 1000
    assert batcher.pipelines <= 12  # a lone first call, its script loaded once, then 100 at a time
    assert batcher.waiting == 0


async def test_a_lone_call_is_sent_at_once(redis: Any) -> None:
    incr = redis.register_script(INCR)
    await redis.script_load(INCR)
    batcher = Batcher(redis)
    await redis.delete("batch:lone")
    assert await asyncio.wait_for(batcher.run(incr, ["batch:lone"], [5]), 2) == 5
    assert batcher.pipelines == 1


async def test_one_call_failing_fails_only_that_call(redis: Any) -> None:
    picky = redis.register_script(FAIL_ON_ZERO)
    batcher = Batcher(redis)
    outcomes = await asyncio.gather(*(batcher.run(picky, [], [n]) for n in (1, 0, 2)), return_exceptions=True)
    assert outcomes[0] == b"1"
    assert outcomes[2] == b"2"
    assert isinstance(outcomes[1], RedisError)
    assert "zero refused" in str(outcomes[1])


async def test_scripts_redis_forgot_are_loaded_again_and_their_calls_answered(redis: Any) -> None:
    incr = redis.register_script(INCR)
    batcher = Batcher(redis)
    await redis.delete("batch:flushed")
    assert await batcher.run(incr, ["batch:flushed"], [1]) == 1
    await redis.script_flush()  # as a Redis restarted empty
    replies = await asyncio.gather(*(batcher.run(incr, ["batch:flushed"], [1]) for _ in range(50)))
    assert sorted(replies) == list(range(2, 52))


async def test_calls_fail_with_a_redis_error_when_redis_is_unreachable() -> None:
    unreachable = make_client("redis://127.0.0.1:9/0", timeout=0.5, retries=0)
    try:
        batcher = Batcher(unreachable)
        script = unreachable.register_script(INCR)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(batcher.run(script, ["k"], [1]) for _ in range(3)), return_exceptions=True), 5
        )
        assert all(isinstance(o, RedisError) for o in outcomes), outcomes
    finally:
        await unreachable.aclose()


async def test_a_caller_that_gave_up_is_not_sent_and_the_others_still_are(redis: Any) -> None:
    incr = redis.register_script(INCR)
    batcher = Batcher(redis)
    await redis.delete("batch:gaveup")
    first = asyncio.ensure_future(batcher.run(incr, ["batch:gaveup"], [1]))  # takes the sender's first turn
    quitter = asyncio.ensure_future(batcher.run(incr, ["batch:gaveup"], [100]))
    stayer = asyncio.ensure_future(batcher.run(incr, ["batch:gaveup"], [10]))
    await asyncio.sleep(0)
    quitter.cancel()
    assert await first == 1
    assert await stayer == 11
    assert int(await redis.get("batch:gaveup")) == 11


async def test_closing_lets_what_is_queued_go_out(redis: Any) -> None:
    incr = redis.register_script(INCR)
    batcher = Batcher(redis)
    await redis.delete("batch:close")
    calls = [asyncio.ensure_future(batcher.run(incr, ["batch:close"], [1])) for _ in range(10)]
    await asyncio.sleep(0)
    await batcher.close()
    assert sorted([await c for c in calls]) == list(range(1, 11))


async def test_on_a_cluster_a_crowd_of_one_slots_calls_goes_to_its_master_in_a_few_pipelines(
    valkey_cluster: ValkeyCluster,
) -> None:
    valkey_cluster.wait_ok()
    client = make_cluster_client(valkey_cluster.url, max_connections=1)
    try:
        incr = client.register_script(INCR)
        batcher = Batcher(client)
        await client.delete("{sb}:batch")
        replies = await asyncio.gather(*(batcher.run(incr, ["{sb}:batch"], [1]) for _ in range(600)))
        assert sorted(replies) == list(range(1, 601))
        assert batcher.pipelines <= 5  # a lone call, its script loaded once, then 500 at a time
    finally:
        await client.aclose()


async def test_a_crowd_of_commands_goes_in_pipelines_each_with_its_own_reply(redis: Any) -> None:
    """As a bus's publishes: 10,000 clients leaving at once publish as many events."""
    batcher = Batcher(redis, limit=100)
    replies = await asyncio.gather(*(batcher.command("PUBLISH", f"batch:ch{n}", b"x") for n in range(500)))
    assert replies == [0] * 500  # nobody listens: each its own count
    assert batcher.pipelines <= 6
    outcome = await asyncio.gather(batcher.command("NOSUCHCOMMAND"), return_exceptions=True)
    assert isinstance(outcome[0], RedisError)


async def test_a_closed_batcher_refuses_calls_and_opens_no_connection_again(valkey: ValkeyServer) -> None:
    """A bus or registry closed its client right after its batcher: a late call (a probe whose
    cancel was swallowed) must not open a connection that nobody closes."""
    client = make_client(valkey.url, max_connections=1)
    batcher = Batcher(client)
    await batcher.close()
    await client.aclose()
    with pytest.raises(RedisError, match="closed"):
        await batcher.command("PING")


async def test_a_group_of_commands_goes_together_each_answered_in_its_place(redis: Any) -> None:
    batcher = Batcher(redis)
    await redis.set("batch:group", "x")
    alone = await batcher.commands([("GET", "batch:group"), ("HGET", "batch:group", "f"), ("EXISTS", "batch:nope")])
    assert isinstance(alone[1], RedisError)  # a string is no hash: that command failed, and only it
    assert [alone[0], alone[2]] == [b"x", 0]
    assert batcher.pipelines == 1, "a lone group is one pipeline, one round trip"
    groups = await asyncio.gather(
        *(batcher.commands([("GET", "batch:group"), ("EXISTS", "batch:group")]) for _ in range(50))
    )
    assert groups == [[b"x", 1]] * 50
    assert batcher.pipelines <= 3, "groups arriving together share pipelines"

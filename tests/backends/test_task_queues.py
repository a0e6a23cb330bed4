"""The task queues' stores (issue 38, item 5), the embedded one and Redis, held to the same rules: first in, first
out per workspace and name; every bound (workspace, principal, hub) refuses a push whole; a pop frees the task's
charges, and so does its expiry; nothing is left in Redis once the tasks are gone."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.backends.queues import MemoryQueues, QueueBounds
from switchboard.backends.redis.stores.queues import RedisQueues
from switchboard.clock import SystemClock
from switchboard.errors import LimitExceeded
from switchboard.testing.wait import eventually

BOUNDS = QueueBounds(per_workspace=3, per_principal=4, total=5)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return MemoryQueues(SystemClock(), BOUNDS)
    return RedisQueues(request.getfixturevalue("redis"), clock=SystemClock(), bounds=BOUNDS)


def later(seconds: float = 60.0) -> float:
    return SystemClock().time() + seconds


async def test_a_queue_is_first_in_first_out_and_its_own(store: Any) -> None:
    for n in range(3):
        assert await store.push("w", "q", f'{{"n":{n}}}', principal="p", until=later()) == n + 1
    assert await store.peek("w", "q", 2) == ['{"n":0}', '{"n":1}']
    assert await store.length("w", "other") == 0
    assert await store.length("v", "q") == 0
    assert await store.pop("v", "q") is None
    assert [await store.pop("w", "q") for _ in range(4)] == ['{"n":0}', '{"n":1}', '{"n":2}', None]


async def test_each_bound_refuses_a_push_whole_and_a_pop_frees_its_place(store: Any) -> None:
    for q in ("a", "b", "c"):
        await store.push("w1", q, "{}", principal="p", until=later())
    with pytest.raises(LimitExceeded, match="Queue full: workspace w1"):
        await store.push("w1", "d", "{}", principal="other", until=later())
    await store.push("w2", "q", "{}", principal="p", until=later())
    with pytest.raises(LimitExceeded, match="Too many queued tasks for p"):
        await store.push("w2", "q", "{}", principal="p", until=later())
    await store.push("w3", "q", "{}", principal="other", until=later())
    with pytest.raises(LimitExceeded, match="maximum of 5 queued tasks"):
        await store.push("w4", "q", "{}", principal="third", until=later())
    assert await store.length("w1", "d") + await store.length("w4", "q") == 0, "a refused push stored something"
    assert await store.pop("w1", "a") == "{}"
    await store.push("w4", "q", "{}", principal="third", until=later())


async def test_an_expired_task_is_gone_and_frees_its_charges(store: Any) -> None:
    await store.push("w", "q", '"old"', principal="p", until=later(0.3))
    for _ in range(2):
        await store.push("w", "q2", '"x"', principal="p", until=later(0.3))
    await eventually(lambda: _length(store), "the expired tasks gone", timeout=5)
    assert await store.pop("w", "q") is None
    for n in range(3):
        await store.push("w", "q", f'"{n}"', principal="p", until=later())
    assert await store.peek("w", "q", 5) == ['"0"', '"1"', '"2"']


async def _length(store: Any) -> bool:
    return await store.length("w", "q") == 0 and await store.length("w", "q2") == 0


async def test_redis_keeps_nothing_once_the_tasks_are_popped(redis: Any) -> None:
    store = RedisQueues(redis, clock=SystemClock(), bounds=BOUNDS)
    await store.push("w", "q", "{}", principal="p", until=later())
    await store.push("w", "q", "{}", principal="p", until=later())
    await store.pop("w", "q")
    await store.pop("w", "q")
    left = [k async for k in redis.scan_iter(match="*{queues}*", count=100)]
    assert await store.held_by("p") == 0
    assert left == [], "a key outlived the tasks it held or counted"

"""Background loops stop on shutdown even when a cancellation is swallowed on the way."""

from __future__ import annotations

import asyncio

from switchboard.backends.redis import make_client
from switchboard.tasks import cancel_and_wait
from switchboard.testing import ValkeyServer
from switchboard.testing.wait import eventually


async def test_a_loop_that_swallows_a_cancel_is_cancelled_again_until_it_stops() -> None:
    swallowed = 0

    async def stubborn() -> None:  # behaves like a loop whose Redis call ate the CancelledError
        nonlocal swallowed
        for _ in range(10_000):
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed < 3:
                    swallowed += 1
                    continue
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await cancel_and_wait([task], timeout=2.0) == set()
    assert task.cancelled()
    assert swallowed == 3


async def test_a_task_that_never_stops_is_reported_not_waited_for_forever() -> None:
    async def immortal() -> None:
        for _ in range(60):  # outlives the 0.3 s given, then ends so the test's loop can close
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    task = asyncio.create_task(immortal(), name="immortal")
    await asyncio.sleep(0)  # inside its loop, where it swallows every cancel
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await cancel_and_wait([task], timeout=0.3) == {task}
    assert loop.time() - started < 1.0
    await asyncio.wait([task], timeout=5)


async def test_loops_doing_redis_commands_stop_though_redis_py_may_swallow_the_cancel() -> None:
    """Why the helper exists: redis-py 8.1 loses a CancelledError landing inside a command
    (about two in three landing during PUBLISH, measured). The loops are shaped like ours:
    a command, then a pause. Whether a plain ``cancel()`` is lost here is up to timing; the
    stubborn loop above pins the re-cancelling down deterministically."""
    with ValkeyServer() as valkey:
        client = make_client(valkey.url)
        try:
            published = [0] * 10

            async def publisher_loop(i: int) -> None:
                for _ in range(3_000):
                    await client.publish("nobody", "x")
                    published[i] += 1
                    await asyncio.sleep(0.001)

            tasks = [asyncio.create_task(publisher_loop(i)) for i in range(10)]
            await eventually(lambda: all(published), timeout=5, what="every loop under way")
            assert await cancel_and_wait(tasks, timeout=5.0) == set()
            assert all(t.done() for t in tasks)
        finally:
            await asyncio.wait(tasks, timeout=30)  # a failed check must not leave loops running
            await client.aclose()

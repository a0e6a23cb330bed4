"""Many clients' steps run side by side, a bounded group at a time, none abandoned halfway."""

from __future__ import annotations

import asyncio

import pytest

from switchboard.hub.transit.together import together

pytestmark = pytest.mark.timeout(10)


async def test_steps_run_side_by_side_a_bounded_group_at_a_time() -> None:
    running, most, done = 0, 0, []

    async def step(n: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)  # a round trip: the group's others start meanwhile
        running -= 1
        done.append(n)

    await together(range(7), step, at_once=3)
    assert sorted(done) == list(range(7))
    assert most == 3


async def test_a_failing_step_is_raised_after_its_group_finished() -> None:
    done = []

    async def step(n: int) -> None:
        await asyncio.sleep(0)
        if n == 1:
            raise RuntimeError("bug")
        done.append(n)

    with pytest.raises(RuntimeError, match="bug"):
        await together(range(6), step, at_once=3)
    assert done == [0, 2]  # its group ran to the end; the next group never started

"""The hub's own background loops stop on shutdown even when their first cancel is lost.

redis-py can swallow a ``CancelledError`` that lands inside a command
(:mod:`switchboard.tasks`). A loop cancelled once and then awaited carries on
and its owner waits forever: a replica that stays up after SIGTERM until it
is killed (seen once in 60 SIGTERMs of ``bench/roll.py`` under CPU load, a
replica stuck after "Waiting for application shutdown"). Each loop here is
made to lose exactly one cancel, the way a Redis command would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from switchboard.hub.hub import Hub
from switchboard.server.app import build_hub
from switchboard.server.http.status_api import StatusSampler
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(20)

STOP_WITHIN = 3.0  # cancel_and_wait gives a loop 2 s


class LosesOneCancel:
    """An awaitable step that blocks until cancelled, swallows that cancel once, and returns."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.swallowed = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return []


async def stops(stop: Any) -> bool:
    """Whether ``stop()`` finishes within :data:`STOP_WITHIN`; a hung one is left to be ended by the caller."""
    task = asyncio.create_task(stop())
    done, _ = await asyncio.wait({task}, timeout=STOP_WITHIN)
    return task in done


async def test_the_transit_keeper_stops_though_a_registry_call_lost_its_cancel() -> None:
    hub: Hub = build_hub(settings_for_tests(transit_grace=5.0), clock=FakeClock())
    step = LosesOneCancel()
    hub.moves.settle_transits = step  # type: ignore[method-assign]
    await hub.moves.start()
    try:
        hub.moves.transit.left("ws-1/provider")  # a grace to end: the keeper goes to settle it
        hub.moves._wake()
        await asyncio.wait_for(step.entered.wait(), 5)
        assert await stops(hub.moves.stop), "the keeper outlived its cancel and stop() hung"
        assert step.swallowed == 1
    finally:
        if hub.moves._keeper is not None:
            hub.moves._keeper.cancel()


async def test_the_status_sampler_stops_though_a_read_lost_its_cancel() -> None:
    hub: Hub = build_hub(settings_for_tests(), clock=FakeClock())
    sampler = StatusSampler(hub, interval=0.01)
    step = LosesOneCancel()
    sampler.sample = step  # type: ignore[method-assign]
    sampler.start()
    try:
        await asyncio.wait_for(step.entered.wait(), 5)
        assert await stops(sampler.stop), "the sampler outlived its cancel and stop() hung"
        assert step.swallowed == 1
    finally:
        if sampler._task is not None:
            sampler._task.cancel()

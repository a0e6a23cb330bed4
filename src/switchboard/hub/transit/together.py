"""Many clients' Redis work at once, a bounded group at a time: a crowd costs a few pipelines.

The Redis backend sends the per-client scripts that wait together in one
pipeline (:mod:`switchboard.backends.redis.shared.batch`). That helps only if they do
wait together: a loop awaiting one client after the other pays a round trip
each (10,000 graces ending at once, 0.2 ms each on loopback: 2 s; with Redis
5 ms away: 100 s). :func:`together` starts them side by side, :data:`AT_ONCE`
at a time, so that a whole group's commands travel in the same pipelines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

# Clients handled side by side: one pipeline's worth (batch.BATCH), and few enough tasks that
# the loop still serves the connected clients between groups.
AT_ONCE = 500


async def together(items: Iterable[T], step: Callable[[T], Awaitable[None]], *, at_once: int = AT_ONCE) -> None:
    """Run ``step`` for every item, ``at_once`` at a time; a step's exception is raised once its
    group finished (the others' work is not abandoned halfway), and no later group starts."""
    pending = list(items)
    for start in range(0, len(pending), at_once):
        group = pending[start : start + at_once]
        outcomes = await asyncio.gather(*(step(item) for item in group), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

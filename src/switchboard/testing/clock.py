"""A fake clock for tests: time moves only when code sleeps."""

from __future__ import annotations

import asyncio


class FakeClock:
    """A :class:`switchboard.clock.Clock` whose time jumps forward on ``sleep``.

    ``await clock.sleep(5)`` returns at once with :meth:`monotonic` five
    seconds later, so a loop that waits minutes runs in microseconds and its
    timing can be asserted exactly. It models one sleeping task at a time,
    which is what the retry, reconcile, reaper and lease loops are: several
    tasks sleeping concurrently each add their own sleep to the shared time.
    """

    def __init__(self, start: float = 0.0, wall: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall - start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time: {seconds}")
        self.sleeps.append(seconds)
        self._now += seconds
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move time forward without sleeping (work that took ``seconds``)."""
        if seconds < 0:
            raise ValueError(f"cannot go back in time: {seconds}")
        self._now += seconds

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now:.3f}, sleeps={len(self.sleeps)})"

"""Time as a dependency.

Every retry, backoff, reconcile, reaper and lease loop takes a :class:`Clock`
instead of calling :mod:`time` or :func:`asyncio.sleep` directly, so tests can
drive it with :class:`switchboard.testing.FakeClock` and never really wait.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the time-dependent parts of Switchboard need from time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (for token expiry)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the caller for ``seconds``."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`, :func:`asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        import asyncio  # here, not above: the pure cores take a Clock and load no event loop

        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"

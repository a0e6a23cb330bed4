"""Handshakes take turns: a crowd arriving at once does not run all its admissions side by side.

A sibling's drain sends hundreds of clients in flight at once. Admitted side
by side, their steps resume together (one pipelined Redis answer wakes them
all in one turn of the loop), and the replica's established clients wait
behind each such turn: B's echo p50/p99 went from 1.9/10 ms to 22/80 ms while
1,200 clients arrived, and 6.6/40 ms with 8 admissions at a time (issue 26,
bench/storm.py). A turn that takes longer than its hold (a probe waiting up to
2 s for a ping, a slow store) stops counting then: it holds up nobody longer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

# Admissions under way at once, at most: a few Redis round trips each, so 8 still admit several
# hundred clients a second, more than one core takes in (about 4 ms of CPU each).
ADMITTING = 8
# Seconds a turn counts at most: several times a loaded admission (tens of ms), well below the 2 s
# a probe may wait for its ping.
HOLD = 0.25


class Turns:
    """At most ``size`` turns at once, first come first served, each counted ``hold`` seconds at most."""

    def __init__(self, size: int = ADMITTING, hold: float = HOLD) -> None:
        self.hold = hold
        self._places = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        await self._places.acquire()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._places.release()

        timer = asyncio.get_running_loop().call_later(self.hold, release)
        try:
            yield
        finally:
            timer.cancel()
            release()
